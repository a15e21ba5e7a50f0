//! Operator commands that take a saga over while one of its calls is in flight, on the backend
//! `SAGA_TEST_BACKEND` selects: the attempt is recorded `abandoned` (its outcome unknown) and the
//! step `UNKNOWN`, never left `RUNNING`, and the call's late result changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use orchestrator::store::Audit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orchestrator::model::{Saga, SagaStatus, StepStatus};
use orchestrator::store::Store;
use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
use saga_suite::{event_names, registry_of, test_config, wait_for, RunningEngine, TempDb};
use serde_json::{json, Value};

/// How long the slow calls take: long enough to act while they run.
const CALL: Duration = Duration::from_millis(1500);

/// `slow_reserve`: `reserve` (compensatable; its action takes [`CALL`] and counts its
/// effects in `done`), then `finish` (pivot).
fn slow_reserve(done: Arc<AtomicUsize>) -> SagaDefinition {
    SagaDefinition::builder("slow_reserve", 1)
        .step(Step::compensatable(
            "reserve",
            move |_ctx: StepContext| {
                let done = done.clone();
                async move {
                    tokio::time::sleep(CALL).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, StepError>(json!("reserved"))
                }
            },
            |_ctx: StepContext| async { Ok::<_, StepError>(()) },
        ))
        .step(Step::pivot("finish", |_ctx: StepContext| async {
            Ok::<_, StepError>(Value::Null)
        }))
        .build()
        .unwrap()
}

/// `slow_undo`: `reserve` (compensatable; its compensation takes [`CALL`] and counts in
/// `undone`), then `charge` (pivot, always refused): the saga compensates `reserve` slowly.
fn slow_undo(undone: Arc<AtomicUsize>) -> SagaDefinition {
    SagaDefinition::builder("slow_undo", 1)
        .step(Step::compensatable(
            "reserve",
            |_ctx: StepContext| async { Ok::<_, StepError>(json!("reserved")) },
            move |_ctx: StepContext| {
                let undone = undone.clone();
                async move {
                    tokio::time::sleep(CALL).await;
                    undone.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, StepError>(())
                }
            },
        ))
        .step(Step::pivot("charge", |_ctx: StepContext| async {
            Err::<Value, _>(StepError::permanent("card declined"))
        }))
        .build()
        .unwrap()
}

/// The saga once `step`'s `phase` is running.
async fn when_running(store: &Arc<dyn Store>, id: uuid::Uuid, compensation: bool) -> Saga {
    wait_for(store, id, Duration::from_secs(10), |s| {
        let rec = if compensation {
            &s.steps[0].compensation
        } else {
            &s.steps[0].action
        };
        rec.status == StepStatus::Running
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_during_a_call_records_the_attempt_abandoned_and_the_late_result_is_refused() {
    let db = TempDb::new();
    let store = db.store().await;
    let done = Arc::new(AtomicUsize::new(0));
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([slow_reserve(done.clone())]),
        test_config(),
    );
    let saga = eng
        .engine
        .start_saga("slow_reserve", json!({}))
        .await
        .unwrap();
    when_running(&store, saga.id, false).await;

    let aborted = store
        .abort(saga.id, &Audit::by("ops@test").because("stuck"))
        .await
        .unwrap();
    let check = |s: &Saga| {
        assert_eq!(s.status, SagaStatus::Aborted);
        let reserve = &s.steps[0];
        assert_eq!(reserve.action.status, StepStatus::Unknown, "{reserve:?}");
        assert!(reserve.action.outcome_unknown);
        assert!(reserve.action.ended_at.is_some());
        assert!(reserve
            .action
            .last_error
            .as_deref()
            .unwrap()
            .contains("abandoned"));
        assert_eq!(s.steps[1].action.status, StepStatus::Pending);
    };
    check(&aborted);
    let attempts = store.attempts(saga.id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].outcome.as_deref(), Some("abandoned"));
    assert!(attempts[0].ended_at.is_some());
    let events = store.events(saga.id).await.unwrap();
    let abort = events.iter().find(|e| e.kind == "saga.aborted").unwrap();
    assert_eq!(abort.data["actor"], "ops@test");
    assert_eq!(
        abort.data["abandoned"],
        json!([{"step": "reserve", "phase": "action", "attempt": 1}])
    );

    // The call ends and had its effect; its result is refused: the log still tells the truth.
    tokio::time::sleep(CALL + Duration::from_millis(500)).await;
    assert_eq!(done.load(Ordering::SeqCst), 1);
    let after = store.get_saga(saga.id).await.unwrap().unwrap();
    check(&after);
    assert_eq!(store.attempts(saga.id).await.unwrap(), attempts);
    let names = event_names(&store, saga.id).await;
    assert_eq!(
        names.last().map(String::as_str),
        Some("saga.aborted"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n == "step.succeeded:reserve"),
        "{names:?}"
    );
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marking_a_compensation_in_flight_done_abandons_its_attempt() {
    let db = TempDb::new();
    let store = db.store().await;
    let undone = Arc::new(AtomicUsize::new(0));
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([slow_undo(undone.clone())]),
        test_config(),
    );
    let saga = eng.engine.start_saga("slow_undo", json!({})).await.unwrap();
    when_running(&store, saga.id, true).await;

    let marked = store
        .mark_compensated(saga.id, "reserve", "released by hand", "ops@test")
        .await
        .unwrap();
    assert_eq!(marked.steps[0].compensation.status, StepStatus::Manual);
    let attempts = store.attempts(saga.id).await.unwrap();
    let comp: Vec<_> = attempts
        .iter()
        .filter(|a| a.phase == "compensation")
        .collect();
    assert_eq!(comp.len(), 1, "{attempts:?}");
    assert_eq!(comp[0].outcome.as_deref(), Some("abandoned"));
    assert!(comp[0].ended_at.is_some());

    // The saga ends compensated by the operator's word, and the late result changes nothing.
    let ended = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.status.is_terminal()
    })
    .await;
    assert_eq!(ended.status, SagaStatus::Compensated);
    tokio::time::sleep(CALL + Duration::from_millis(500)).await;
    assert_eq!(undone.load(Ordering::SeqCst), 1);
    let after = store.get_saga(saga.id).await.unwrap().unwrap();
    assert_eq!(after.status, SagaStatus::Compensated);
    assert_eq!(after.steps[0].compensation.status, StepStatus::Manual);
    let names = event_names(&store, saga.id).await;
    assert!(
        !names.iter().any(|n| n == "step.compensated:reserve"),
        "{names:?}"
    );
    eng.stop().await;
}
