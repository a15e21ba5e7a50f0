//! The engine against a real database (a SQLite file, or PostgreSQL with
//! `SAGA_TEST_BACKEND=postgres`): every saga invariant of the specification that can be shown in
//! one process. Crash recovery across real process kills is in `crash.rs`; the store's own
//! mechanics (fencing, group commit, claims) are in `store_contract.rs`.

#![allow(clippy::unwrap_used)]

use orchestrator::store::Audit;
use std::time::Duration;

use orchestrator::model::{SagaStatus, StepStatus};
use saga_dsl::StepKind::{Compensatable, Pivot, Retriable};
use saga_suite::{
    is, registry_of, scripted_saga, test_config, wait_for, wait_terminal, Journal,
    Outcome::{Hang, Permanent, Retryable},
    RunningEngine, ScriptedStep as S, TempDb,
};
use serde_json::json;

#[tokio::test]
async fn happy_path_runs_every_action_once_in_order() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable),
            S::new("b", Compensatable),
            S::new("c", Pivot),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let saga = eng.engine.start_saga("s", json!({"x": 1})).await.unwrap();
    // A free worker took it at once: its first action was written ahead with it.
    assert_eq!(saga.status, SagaStatus::Running);
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(j.names(), ["a:action", "b:action", "c:action"]);
    assert_eq!(done.output.unwrap()["b"]["step"], "b");
    assert!(done
        .steps
        .iter()
        .all(|s| s.action.attempts == 1 && !s.action.outcome_unknown));
    assert_eq!(done.lease_owner, None, "a terminal saga holds no lease");
    let events: Vec<_> = store
        .events(saga.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(events.first().map(String::as_str), Some("saga.started"));
    assert_eq!(events.last().map(String::as_str), Some("saga.completed"));
    eng.stop().await;
}

fn three(
    a: &[saga_suite::Outcome],
    b: &[saga_suite::Outcome],
    c: &[saga_suite::Outcome],
) -> Vec<S> {
    vec![
        S::new("a", Compensatable).action(a),
        S::new("b", Compensatable).action(b),
        S::new("c", Compensatable).action(c),
    ]
}

async fn run_one(steps: Vec<S>) -> (orchestrator::Saga, Journal, Vec<String>) {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &steps, &j);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    let events = store
        .events(saga.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            format!(
                "{}{}",
                e.kind,
                e.step.map(|s| format!(":{s}")).unwrap_or_default()
            )
        })
        .collect();
    eng.stop().await;
    (done, j, events)
}

#[tokio::test]
async fn permanent_failure_compensates_earlier_steps_in_reverse() {
    let (saga, j, events) = run_one(three(&[], &[], &[Permanent])).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(
        j.names(),
        [
            "a:action",
            "b:action",
            "c:action",
            "b:compensation",
            "a:compensation"
        ]
    );
    // The step that failed definitively is not compensated.
    assert_eq!(saga.steps[2].action.status, StepStatus::Failed);
    assert_eq!(saga.steps[2].compensation.status, StepStatus::Pending);
    assert_eq!(
        saga.steps[2].action.attempts, 1,
        "a permanent error is not retried"
    );
    assert_eq!(saga.error.as_deref(), Some("c: scripted permanent failure"));
    assert!(events.contains(&"step.compensated:a".to_owned()));
    assert_eq!(events.last().unwrap(), "saga.compensated");
}

#[tokio::test]
async fn a_step_whose_outcome_is_unknown_is_compensated_too() {
    // b times out on every attempt: its outcome is unknown, so it is compensated as well.
    let (saga, j, _) = run_one(three(&[], &[Hang, Hang, Hang], &[])).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[1].action.status, StepStatus::Unknown);
    assert!(saga.steps[1].action.outcome_unknown);
    assert_eq!(
        j.names(),
        [
            "a:action",
            "b:action",
            "b:action",
            "b:action",
            "b:compensation",
            "a:compensation"
        ]
    );
}

#[tokio::test]
async fn retryable_failures_are_retried_within_the_budget() {
    let (saga, j, _) = run_one(three(&[Retryable, Retryable], &[], &[])).await;
    assert_eq!(saga.status, SagaStatus::Completed);
    assert_eq!(saga.steps[0].action.attempts, 3);
    assert_eq!(j.names().iter().filter(|n| *n == "a:action").count(), 3);

    // Budget spent (3 attempts) on known failures: the step failed definitively, not compensated.
    let (saga, j, _) = run_one(three(&[], &[Retryable, Retryable, Retryable], &[])).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[1].action.status, StepStatus::Failed);
    assert_eq!(saga.steps[1].action.attempts, 3);
    assert_eq!(j.names().last().unwrap(), "a:compensation");
    assert!(!j.names().contains(&"b:compensation".to_owned()));
}

#[tokio::test]
async fn idempotency_keys_are_stable_per_step_and_phase() {
    let (saga, j, _) = run_one(three(&[Retryable], &[], &[Permanent])).await;
    let calls = j.calls();
    let key = |name: &str, phase: &str| -> Vec<uuid::Uuid> {
        calls
            .iter()
            .filter(|(s, p, _)| s == name && p == phase)
            .map(|c| c.2)
            .collect()
    };
    let a = key("a", "action");
    assert_eq!(a.len(), 2);
    assert_eq!(a[0], a[1], "a retry reuses the key");
    assert_eq!(
        a[0],
        saga_dsl::idempotency_key(saga.id, 0, saga_dsl::Phase::Action)
    );
    let a_comp = key("a", "compensation");
    assert_ne!(a_comp[0], a[0], "the compensation has its own key");
    assert_ne!(key("b", "action")[0], a[0]);
}

#[tokio::test]
async fn every_attempt_is_kept_in_the_attempt_log() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &three(&[Retryable, Hang], &[], &[]), &j);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_terminal(&store, saga.id).await;
    let attempts = store.attempts(saga.id).await.unwrap();
    let a: Vec<_> = attempts
        .iter()
        .filter(|x| x.step == "a")
        .map(|x| (x.attempt, x.outcome.clone().unwrap(), x.error.is_some()))
        .collect();
    assert_eq!(
        a,
        [
            (1, "retryable".to_owned(), true),
            (2, "timed_out".to_owned(), true),
            (3, "succeeded".to_owned(), false)
        ]
    );
    assert!(attempts
        .iter()
        .all(|x| x.worker == eng.engine.config().worker_id));
    assert!(attempts.iter().all(|x| x.ended_at.is_some()));
    eng.stop().await;
}

#[tokio::test]
async fn after_the_pivot_nothing_is_compensated_and_retriable_steps_retry_to_success() {
    let steps = vec![
        S::new("a", Compensatable),
        S::new("p", Pivot),
        S::new("r", Retriable).action(&[Retryable, Hang, Retryable, Retryable, Retryable]),
    ];
    let (saga, j, _) = run_one(steps).await;
    assert_eq!(saga.status, SagaStatus::Completed);
    assert_eq!(
        saga.steps[2].action.attempts, 6,
        "beyond the 3-attempt budget of other steps"
    );
    assert!(!j.names().iter().any(|n| n.ends_with("compensation")));

    // A permanent failure after the pivot: FAILED, needs a person, nothing compensated.
    let steps = vec![
        S::new("a", Compensatable),
        S::new("p", Pivot),
        S::new("r", Retriable).action(&[Permanent]),
    ];
    let (saga, j, events) = run_one(steps).await;
    assert_eq!(saga.status, SagaStatus::Failed);
    assert!(saga.needs_attention);
    assert!(!j.names().iter().any(|n| n.ends_with("compensation")));
    assert!(events.contains(&"saga.failed".to_owned()));

    // The pivot itself failing definitively: the steps before it are compensated.
    let steps = vec![
        S::new("a", Compensatable),
        S::new("p", Pivot).action(&[Permanent]),
    ];
    let (saga, j, _) = run_one(steps).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(j.names(), ["a:action", "p:action", "a:compensation"]);
}

#[tokio::test]
async fn data_flows_from_earlier_steps_and_to_compensations() {
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let seen = Journal::default();
    let charge = |ctx: StepContext| async move {
        let amount = ctx.input::<serde_json::Value>()?["amount"]
            .as_i64()
            .unwrap_or(0);
        Ok::<_, StepError>(json!({"charge_id": format!("ch_{amount}")}))
    };
    let s2 = seen.clone();
    let refund = move |ctx: StepContext| {
        let s2 = s2.clone();
        async move {
            let own: Option<serde_json::Value> = ctx.action_output()?;
            let id = own.unwrap()["charge_id"].as_str().unwrap().to_owned();
            s2.push(&id, "refund", ctx.idempotency_key());
            Ok(())
        }
    };
    let s3 = seen.clone();
    let ship = move |ctx: StepContext| {
        let s3 = s3.clone();
        async move {
            let charge: serde_json::Value = ctx.output_of("charge")?;
            s3.push(
                charge["charge_id"].as_str().unwrap(),
                "ship",
                ctx.idempotency_key(),
            );
            Err::<(), _>(StepError::permanent("cannot ship"))
        }
    };
    let def = SagaDefinition::builder("flow", 1)
        .step(Step::compensatable("charge", charge, refund))
        .step(Step::pivot("ship", ship))
        .build()
        .unwrap();
    let db = TempDb::new();
    let store = db.store().await;
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng
        .engine
        .start_saga("flow", json!({"amount": 42}))
        .await
        .unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    let got: Vec<_> = seen
        .calls()
        .into_iter()
        .map(|(a, b, _)| format!("{b}:{a}"))
        .collect();
    assert_eq!(got, ["ship:ch_42", "refund:ch_42"]);
    eng.stop().await;
}

#[tokio::test]
async fn compensations_never_give_up_and_flag_needs_attention() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let steps = vec![
        S::new("a", Compensatable).compensation(&[Retryable; 200]),
        S::new("b", Compensatable).action(&[Permanent]),
    ];
    let def = scripted_saga("s", 1, &steps, &j);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    // test_config flags after 3 attempts; the saga stays COMPENSATING and keeps retrying.
    let flagged = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.needs_attention && s.steps[0].compensation.attempts >= 5
    })
    .await;
    assert_eq!(flagged.status, SagaStatus::Compensating);
    // Still retrying: waiting for the next attempt, or making it right now.
    assert!(matches!(
        flagged.steps[0].compensation.status,
        StepStatus::Retrying | StepStatus::Running
    ));
    let events = store.events(saga.id).await.unwrap();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.kind == "saga.needs_attention")
            .count(),
        1,
        "flagged once, not on every attempt"
    );
    let page = store
        .list_sagas(&orchestrator::model::ListFilter {
            needs_attention: true,
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.sagas.len(), 1);

    // Only an operator ends it otherwise, audited.
    let done = store
        .mark_compensated(saga.id, "a", "refunded by hand, ticket 7", "ops@test")
        .await
        .unwrap();
    assert_eq!(done.steps[0].compensation.status, StepStatus::Manual);
    let done = wait_for(
        &store,
        saga.id,
        Duration::from_secs(5),
        is(SagaStatus::Compensated),
    )
    .await;
    assert!(!done.needs_attention);
    let audit = store.events(saga.id).await.unwrap();
    let marked = audit
        .iter()
        .find(|e| e.kind == "step.marked_compensated")
        .unwrap();
    assert_eq!(marked.data["reason"], "refunded by hand, ticket 7");
    eng.stop().await;
}

#[tokio::test]
async fn compensations_that_fail_a_few_times_still_complete() {
    let steps = vec![
        S::new("a", Compensatable).compensation(&[Retryable, Hang, Permanent]),
        S::new("b", Compensatable).action(&[Permanent]),
    ];
    let (saga, j, _) = run_one(steps).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[0].compensation.attempts, 4);
    assert_eq!(
        j.names().iter().filter(|n| *n == "a:compensation").count(),
        4
    );
}

/// A saga whose step `b` takes `b_ms` milliseconds; journal records calls.
fn slow_saga(
    name: &str,
    b_kind: saga_dsl::StepKind,
    b_ms: u64,
    j: &Journal,
) -> saga_dsl::SagaDefinition {
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let rec = |j: &Journal, ms: u64| {
        let j = j.clone();
        move |ctx: StepContext| {
            let j = j.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                j.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
                Ok::<_, StepError>(json!(null))
            }
        }
    };
    let comp = |j: &Journal| {
        let j = j.clone();
        move |ctx: StepContext| {
            let j = j.clone();
            async move {
                j.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
                Ok::<_, StepError>(())
            }
        }
    };
    let b = match b_kind {
        saga_dsl::StepKind::Pivot => Step::pivot("b", rec(j, b_ms)),
        _ => Step::compensatable("b", rec(j, b_ms), comp(j)),
    };
    let c = match b_kind {
        saga_dsl::StepKind::Pivot => Step::retriable("c", rec(j, 0)),
        _ => Step::compensatable("c", rec(j, 0), comp(j)),
    };
    SagaDefinition::builder(name, 1)
        .step(Step::compensatable("a", rec(j, 0), comp(j)))
        .step(b)
        .step(c)
        .build()
        .unwrap()
}

#[tokio::test]
async fn cancel_finishes_the_step_in_flight_then_compensates() {
    use orchestrator::store::CancelOutcome;
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([slow_saga("s", Compensatable, 400, &j)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(5), |s| {
        s.steps[1].action.status == StepStatus::Running
    })
    .await;
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted
    );
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(
        j.names(),
        ["a:action", "b:action", "b:compensation", "a:compensation"],
        "b finished, c never started, then reverse compensation"
    );
    assert_eq!(done.steps[2].action.status, StepStatus::Pending);
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Terminal(SagaStatus::Compensated)
    );
    eng.stop().await;
}

/// A saga of one compensatable step, the last, whose action takes 400 ms: a command sent
/// while it runs meets the saga's completion. Its calls go to `j`.
fn slow_last_step(j: &Journal) -> saga_dsl::SagaDefinition {
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let (act, undo) = (j.clone(), j.clone());
    SagaDefinition::builder("last", 1)
        .step(Step::compensatable(
            "only",
            move |ctx: StepContext| {
                let j = act.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    j.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
                    Ok::<_, StepError>(json!(null))
                }
            },
            move |ctx: StepContext| {
                let j = undo.clone();
                async move {
                    j.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
                    Ok::<_, StepError>(())
                }
            },
        ))
        .build()
        .unwrap()
}

/// Starts [`slow_last_step`] and has a cancel accepted while its step runs; returns the
/// running engine and the saga.
async fn cancelled_during_slow_last_step(
    store: &std::sync::Arc<dyn orchestrator::Store>,
    j: &Journal,
) -> (RunningEngine, orchestrator::model::Saga) {
    use orchestrator::store::CancelOutcome;
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([slow_last_step(j)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("last", json!({})).await.unwrap();
    wait_for(store, saga.id, Duration::from_secs(5), |s| {
        s.steps[0].action.status == StepStatus::Running
    })
    .await;
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted
    );
    (eng, saga)
}

#[tokio::test]
async fn a_cancel_while_the_last_step_is_in_flight_compensates_rather_than_completes() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let (eng, saga) = cancelled_during_slow_last_step(&store, &j).await;
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated, "{:?}", done.error);
    assert_eq!(j.names(), ["only:action", "only:compensation"]);
    eng.stop().await;
}

/// Found by the simulation (seed 2047): a pause requested after a cancel, both while the last
/// step ran, made the store answer the guarded completion with the pause, and the saga completed
/// paused with its cancel lost. A completion is guarded by the cancel alone, so it is the cancel
/// that refuses it.
#[tokio::test]
async fn a_cancel_then_a_pause_while_the_last_step_is_in_flight_still_compensates() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let (eng, saga) = cancelled_during_slow_last_step(&store, &j).await;
    store.pause(saga.id, &Audit::by("ops")).await.unwrap();
    let parked = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.status == SagaStatus::Paused || s.status.is_terminal()
    })
    .await;
    assert_ne!(parked.status, SagaStatus::Completed, "the cancel was lost");
    if parked.status == SagaStatus::Paused {
        store.resume(saga.id, &Audit::by("ops")).await.unwrap();
    }
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated, "{:?}", done.error);
    assert_eq!(j.names(), ["only:action", "only:compensation"]);
    eng.stop().await;
}

#[tokio::test]
async fn a_cancel_during_a_call_that_then_backs_off_long_compensates_at_once() {
    use orchestrator::store::CancelOutcome;
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let record = |j: &Journal, slow: bool| {
        let j = j.clone();
        move |ctx: StepContext| {
            let j = j.clone();
            async move {
                j.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
                if slow {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    // A backoff far longer than the engine holds a lease for.
                    return Err(StepError::retry_after(Duration::from_secs(3600), "busy"));
                }
                Ok::<_, StepError>(json!(null))
            }
        }
    };
    let undo = |j: &Journal| {
        let j = j.clone();
        move |ctx: StepContext| {
            let j = j.clone();
            async move {
                j.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
                Ok::<_, StepError>(())
            }
        }
    };
    let def = SagaDefinition::builder("s", 1)
        .step(Step::compensatable("a", record(&j, false), undo(&j)))
        .step(Step::compensatable("b", record(&j, true), undo(&j)))
        .build()
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(5), |s| {
        s.steps[1].action.status == StepStatus::Running
    })
    .await;
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted
    );
    // The call ends in a retry an hour away, written with the lease given up: the cancel must
    // not wait that hour.
    let done = wait_for(
        &store,
        saga.id,
        Duration::from_secs(10),
        is(SagaStatus::Compensated),
    )
    .await;
    assert_eq!(
        j.names(),
        ["a:action", "b:action", "a:compensation"],
        "b failed with a known outcome: only a is compensated"
    );
    assert_eq!(
        done.steps[1].compensation.status,
        StepStatus::Pending,
        "b's compensation never ran"
    );
    eng.stop().await;
}

#[tokio::test]
async fn cancel_before_any_step_runs_nothing() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let registry = registry_of([slow_saga("s", Compensatable, 0, &j)]);
    // Started while no engine runs: it stays QUEUED.
    let idle = orchestrator::Engine::new(
        store.clone(),
        std::sync::Arc::new(registry.clone()),
        test_config(),
    );
    let saga = idle.start_saga("s", json!({})).await.unwrap();
    store
        .request_cancel(saga.id, &Audit::default())
        .await
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry, test_config());
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert!(j.names().is_empty(), "{:?}", j.names());
    eng.stop().await;
}

#[tokio::test]
async fn cancel_after_the_pivot_started_is_refused() {
    use orchestrator::store::CancelOutcome;
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([slow_saga("s", Pivot, 300, &j)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(5), |s| {
        s.steps[1].action.status == StepStatus::Running
    })
    .await;
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::PastPivot
    );
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert!(!done.cancel_requested);
    eng.stop().await;
}

#[tokio::test]
async fn a_saga_without_its_exact_definition_is_blocked_not_skipped() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let v1 = scripted_saga("s", 1, &three(&[], &[], &[]), &j);
    let creator = orchestrator::Engine::new(
        store.clone(),
        std::sync::Arc::new(registry_of([v1])),
        test_config(),
    );
    let saga = creator.start_saga("s", json!({})).await.unwrap();

    // Same name and version, different step list: a different hash.
    let changed = scripted_saga(
        "s",
        1,
        &[S::new("a", Compensatable), S::new("z", Pivot)],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([changed]), test_config());
    let blocked = wait_for(&store, saga.id, Duration::from_secs(5), |s| s.blocked).await;
    assert_eq!(blocked.status, SagaStatus::Queued);
    eng.stop().await;
    assert!(j.names().is_empty(), "a blocked saga is never touched");
    let events = store.events(saga.id).await.unwrap();
    let ev = events.iter().find(|e| e.kind == "saga.blocked").unwrap();
    assert!(ev.data["definition"].as_str().unwrap().starts_with("s@1#"));

    // A process that has the definition picks it up.
    let v1 = scripted_saga("s", 1, &three(&[], &[], &[]), &j);
    let eng = RunningEngine::start(store.clone(), registry_of([v1]), test_config());
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert!(!done.blocked);
    eng.stop().await;
}

#[tokio::test]
async fn a_long_backoff_frees_the_worker_and_lives_in_the_log() {
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let slow_retry = |ctx: StepContext| async move {
        if ctx.attempt() == 1 {
            Err(StepError::retry_after(
                Duration::from_millis(1500),
                "rate limited",
            ))
        } else {
            Ok(json!("ok"))
        }
    };
    let noop = |_ctx: StepContext| async { Ok::<_, StepError>(()) };
    let waiting = SagaDefinition::builder("waiting", 1)
        .step(Step::compensatable("w", slow_retry, noop))
        .build()
        .unwrap();
    let quick = SagaDefinition::builder("quick", 1)
        .step(Step::compensatable("q", noop, noop))
        .build()
        .unwrap();
    let db = TempDb::new();
    let store = db.store().await;
    let eng = one_worker(&store, [waiting, quick]);
    let wall_ms = || {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        i64::try_from(since.unwrap().as_millis()).unwrap()
    };
    let before = wall_ms();
    let w = eng.engine.start_saga("waiting", json!({})).await.unwrap();
    let waiting_row = wait_for(&store, w.id, Duration::from_secs(5), |s| {
        s.steps[0].action.status == StepStatus::Retrying
    })
    .await;
    let seen = wall_ms();
    // The next run time in the log is the failed attempt's time plus the asked-for 1.5 s, and
    // that attempt ran between the start and the moment the retry was seen.
    let due = waiting_row.next_run_at.unwrap();
    assert!(
        (before + 1500..=seen + 1500).contains(&due),
        "next run time recorded in the log: {due}, attempt between {before} and {seen}"
    );
    assert_eq!(
        waiting_row.lease_owner, None,
        "a long backoff releases the saga"
    );
    // With a single worker, another saga runs to completion during the backoff.
    let q = eng.engine.start_saga("quick", json!({})).await.unwrap();
    let q_done = wait_terminal(&store, q.id).await;
    let w_now = store.get_saga(w.id).await.unwrap().unwrap();
    assert_eq!(
        w_now.status,
        SagaStatus::Running,
        "still waiting when the other finished"
    );
    assert!(q_done.updated_at < waiting_row.next_run_at.unwrap());
    let w_done = wait_terminal(&store, w.id).await;
    assert_eq!(w_done.status, SagaStatus::Completed);
    assert_eq!(w_done.steps[0].action.attempts, 2);
    eng.stop().await;
}

#[tokio::test]
async fn a_restart_does_not_reset_the_retry_budget() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let steps = vec![
        S::new("a", Compensatable),
        S::new("b", Compensatable).action(&[Retryable, Retryable, Retryable, Retryable]),
    ];
    let registry = registry_of([scripted_saga("s", 1, &steps, &j)]);
    let eng = RunningEngine::start(store.clone(), registry.clone(), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(5), |s| {
        s.steps[1].action.attempts >= 2
    })
    .await;
    eng.stop().await;
    let eng = RunningEngine::start(store.clone(), registry, test_config());
    let done = wait_terminal(&store, saga.id).await;
    eng.stop().await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(
        done.steps[1].action.attempts, 3,
        "the budget of 3 spans both processes"
    );
    assert_eq!(j.names().iter().filter(|n| *n == "b:action").count(), 3);
}

#[tokio::test]
async fn an_interrupted_attempt_is_made_again_with_the_same_key() {
    use orchestrator::model::PhaseRecord;
    use orchestrator::store::{AttemptChange, ClaimRequest, SagaUpdate, StepUpdate, Transition};
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &three(&[], &[], &[]), &j);
    let key = orchestrator::model::definition_key("s", 1, def.hash());
    let registry = registry_of([def]);
    let idle = orchestrator::Engine::new(
        store.clone(),
        std::sync::Arc::new(registry.clone()),
        test_config(),
    );
    let saga = idle.start_saga("s", json!({})).await.unwrap();

    // A process claims the saga, writes ahead attempt 1 of step a, and dies before calling it.
    let claimed = store
        .claim(ClaimRequest {
            owner: "ghost",
            limit: 1,
            lease_ttl_ms: 300,
            definitions: &[key],
            flows: &[],
        })
        .await
        .unwrap()
        .remove(0);
    let mut rec = PhaseRecord::pending();
    rec.status = StepStatus::Running;
    rec.attempts = 1;
    rec.outcome_unknown = true;
    store
        .apply(
            &claimed.lease,
            &Transition {
                saga: SagaUpdate {
                    status: SagaStatus::Running,
                    next_run_at: Some(0),
                    error: None,
                    output: None,
                    needs_attention: false,
                    pivot_started: false,
                    paused_from: None,
                },
                new_steps: Vec::new(),
                steps: vec![StepUpdate {
                    index: 0,
                    phase: saga_dsl::Phase::Action,
                    record: rec,
                    output: None,
                    wake_at: None,
                    waiting_for: None,
                    timeout_at: None,
                    retry_at: None,
                }],
                attempts: vec![AttemptChange::Start {
                    step_index: 0,
                    phase: saga_dsl::Phase::Action,
                    attempt: 1,
                    seq: 1,
                }],
                events: vec![],
                unless_cancelled: true,
                unless_paused: false,
                release: false,
                wake: None,
            },
        )
        .await
        .unwrap();

    // A new process takes over at once (the embedded store frees dead processes' leases).
    let eng = RunningEngine::start(store.clone(), registry, test_config());
    let done = wait_terminal(&store, saga.id).await;
    eng.stop().await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(done.steps[0].action.attempts, 2);
    let attempts = store.attempts(saga.id).await.unwrap();
    assert_eq!(attempts[0].outcome.as_deref(), Some("interrupted"));
    assert_eq!(attempts[0].worker, "ghost");
    assert_eq!(attempts[1].outcome.as_deref(), Some("succeeded"));
    assert_eq!(j.names()[0], "a:action");
    assert_eq!(
        j.calls()[0].2,
        saga_dsl::idempotency_key(saga.id, 0, saga_dsl::Phase::Action)
    );

    // The ghost's lease is gone: its writes are refused (fencing).
    let stale = Transition {
        saga: SagaUpdate {
            status: SagaStatus::Running,
            next_run_at: Some(0),
            error: None,
            output: None,
            needs_attention: false,
            pivot_started: false,
            paused_from: None,
        },
        new_steps: Vec::new(),
        steps: vec![],
        attempts: vec![],
        events: vec![],
        unless_cancelled: false,
        unless_paused: false,
        release: false,
        wake: None,
    };
    let stale = store.apply(&claimed.lease, &stale).await;
    assert!(matches!(stale, Err(orchestrator::StoreError::LeaseLost(_))));
}

#[tokio::test]
async fn many_sagas_run_concurrently_and_each_step_runs_once() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &three(&[], &[Retryable], &[]), &j);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let mut ids = Vec::new();
    for _ in 0..150 {
        ids.push(eng.engine.start_saga("s", json!({})).await.unwrap().id);
    }
    for id in &ids {
        assert_eq!(
            wait_terminal(&store, *id).await.status,
            SagaStatus::Completed
        );
    }
    eng.stop().await;
    let calls = j.calls();
    assert_eq!(calls.len(), 150 * 4);
    // No attempt of one saga overlaps another attempt of the same saga.
    for id in &ids {
        let mut attempts = store.attempts(*id).await.unwrap();
        attempts.sort_by_key(|a| a.started_at);
        for w in attempts.windows(2) {
            assert!(w[0].ended_at.unwrap() <= w[1].started_at, "{w:?}");
        }
    }
}

/// Awaits every future concurrently (a small `join_all`).
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futs: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn more_sagas_than_workers_all_run_when_slots_free_up() {
    // Direct starts and claims compete for the same worker slots; a saga claimed must always
    // get a slot (a regression: a claim racing a direct start once left a saga leased and
    // never driven).
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &three(&[], &[], &[]), &j);
    let config = orchestrator::EngineConfig {
        workers: 2,
        ..test_config()
    };
    let eng = RunningEngine::start(store.clone(), registry_of([def]), config);
    let starts = (0..40).map(|_| {
        let engine = eng.engine.clone();
        async move {
            let saga = engine.start_saga("s", json!({})).await.unwrap();
            engine
                .wait_terminal(saga.id, Duration::from_secs(20))
                .await
                .unwrap()
        }
    });
    let ended = futures_join_all(starts).await;
    assert!(
        ended.iter().all(|s| *s == Some(SagaStatus::Completed)),
        "{ended:?}"
    );
    eng.stop().await;
}

/// An action that counts its calls and then waits, each call, for a permit added to the gate
/// before it succeeds: `(gate, calls, action)`.
fn held_until_released() -> (
    std::sync::Arc<tokio::sync::Semaphore>,
    std::sync::Arc<std::sync::atomic::AtomicU32>,
    impl saga_dsl::Action,
) {
    use saga_dsl::{StepContext, StepError};
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (held, counted) = (gate.clone(), calls.clone());
    let action = move |_ctx: StepContext| {
        let (held, counted) = (held.clone(), counted.clone());
        async move {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = held
                .acquire()
                .await
                .map_err(|e| StepError::permanent(e.to_string()))?;
            Ok(json!("released"))
        }
    };
    (gate, calls, action)
}

/// An engine with a single worker over `store`, running `defs`.
fn one_worker(
    store: &std::sync::Arc<dyn orchestrator::Store>,
    defs: impl IntoIterator<Item = saga_dsl::SagaDefinition>,
) -> RunningEngine {
    let config = orchestrator::EngineConfig {
        workers: 1,
        ..test_config()
    };
    RunningEngine::start(store.clone(), registry_of(defs), config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_every_worker_busy_waits_leased_and_is_never_claimed() {
    // The one worker is held by a saga whose step waits for a signal; a second saga started
    // meanwhile is created leased to this process (epoch 1) and runs once the worker frees,
    // without a claim (a claim would bump its epoch).
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let (gate, _, hold) = held_until_released();
    let noop = |_ctx: StepContext| async { Ok::<_, StepError>(json!("ok")) };
    let holding = SagaDefinition::builder("holding", 1)
        .step(Step::retriable("hold", hold))
        .build()
        .unwrap();
    let quick = SagaDefinition::builder("quick", 1)
        .step(Step::retriable("q", noop))
        .build()
        .unwrap();
    let db = TempDb::new();
    let store = db.store().await;
    let eng = one_worker(&store, [holding, quick]);
    eng.ready().await;
    let first = eng.engine.start_saga("holding", json!({})).await.unwrap();
    assert_eq!(first.lease_epoch, 1, "driven directly: {first:?}");
    assert_eq!(first.status, SagaStatus::Running, "{first:?}");
    wait_for(&store, first.id, Duration::from_secs(5), |s| {
        s.steps[0].action.status == StepStatus::Running
    })
    .await;
    let second = eng.engine.start_saga("quick", json!({})).await.unwrap();
    assert_eq!(
        second.lease_owner, first.lease_owner,
        "leased here while waiting"
    );
    assert_eq!(second.lease_epoch, 1);
    // Not written ahead: its first call waits for a worker, and may wait long.
    assert_eq!(second.status, SagaStatus::Queued, "{second:?}");
    // It waits: the only worker is busy.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = store.get_saga(second.id).await.unwrap().unwrap();
    assert_eq!(waiting.steps[0].action.attempts, 0, "{waiting:?}");
    assert_eq!(waiting.status, SagaStatus::Queued, "{waiting:?}");
    assert_eq!(waiting.lease_epoch, 1);
    gate.add_permits(1);
    let done = wait_terminal(&store, second.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(done.lease_epoch, 1, "never claimed: {done:?}");
    assert_eq!(
        wait_terminal(&store, first.id).await.status,
        SagaStatus::Completed
    );
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_with_a_free_worker_writes_its_first_action_ahead_in_the_same_commit() {
    // The create's commit already says the first action is about to run (saga RUNNING, step 0
    // attempt 1 started under the new lease, in the attempt log): the call that follows needs
    // no commit of its own, and a crash right after it is an interrupted attempt, as after any
    // write-ahead.
    use saga_dsl::{SagaDefinition, Step};
    use std::sync::atomic::Ordering::SeqCst;
    let (gate, calls, hold) = held_until_released();
    let def = SagaDefinition::builder("held", 1)
        .step(Step::pivot("hold", hold))
        .build()
        .unwrap();
    let db = TempDb::new();
    let store = db.store().await;
    // No poll and no heartbeat within the test, so that every commit counted is the saga's.
    let config = orchestrator::EngineConfig {
        workers: 1,
        poll_interval: Duration::from_secs(3600),
        lease_ttl: Duration::from_secs(600),
        ..test_config()
    };
    let eng = RunningEngine::start(store.clone(), registry_of([def]), config);
    eng.ready().await;
    // The run loop's first look (a claim, the blocked check) commits too: let it end.
    let mut before = store.commits();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = store.commits();
        if now == before {
            break;
        }
        before = now;
    }
    let saga = eng.engine.start_saga("held", json!({})).await.unwrap();
    assert_eq!(store.commits() - before, 1, "one commit for the create");
    assert_eq!(saga.status, SagaStatus::Running, "{saga:?}");
    assert!(saga.pivot_started, "the first step is the pivot: {saga:?}");
    // What the log says while the call runs, before anything else is written.
    wait_for(&store, saga.id, Duration::from_secs(5), |_| {
        calls.load(SeqCst) == 1
    })
    .await;
    assert_eq!(store.commits() - before, 1, "the call itself wrote nothing");
    let running = store.get_saga(saga.id).await.unwrap().unwrap();
    assert_eq!(running.status, SagaStatus::Running);
    assert!(running.pivot_started);
    assert_eq!(running.lease_epoch, 1);
    let action = &running.steps[0].action;
    assert_eq!(
        (action.status, action.attempts, action.outcome_unknown),
        (StepStatus::Running, 1, true),
        "{running:?}"
    );
    assert!(action.started_at.is_some());
    let attempts = store.attempts(saga.id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(
        (
            attempts[0].attempt,
            attempts[0].lease_epoch,
            attempts[0].ended_at
        ),
        (1, 1, None)
    );
    assert_eq!(
        Some(attempts[0].worker.as_str()),
        running.lease_owner.as_deref()
    );
    // A cancel now is refused: the pivot has started.
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        orchestrator::store::CancelOutcome::PastPivot
    );
    let before = store.commits();
    gate.add_permits(1);
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(
        store.commits() - before,
        1,
        "the result, with the end, is the saga's only other commit"
    );
    assert_eq!(calls.load(SeqCst), 1);
    let attempts = store.attempts(saga.id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].outcome.as_deref(), Some("succeeded"));
    eng.stop().await;
}

/// A one-step saga `later` whose first attempt asks to be retried in 300 ms (each attempt
/// recorded in `journal`), and engine settings under which that gives the saga back with a
/// timer: the driver holds a lease only for waits under 20 ms, and the engine polls every 30 s.
fn parked_on_a_timer(journal: &Journal) -> (saga_dsl::SagaDefinition, orchestrator::EngineConfig) {
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let j = journal.clone();
    let flaky = move |ctx: StepContext| {
        let j = j.clone();
        async move {
            j.push(ctx.step_name(), "action", ctx.idempotency_key());
            if ctx.attempt() == 1 {
                return Err(StepError::retry_after(
                    Duration::from_millis(300),
                    "come back later",
                ));
            }
            Ok(json!("done"))
        }
    };
    let def = SagaDefinition::builder("later", 1)
        .step(Step::retriable("flaky", flaky))
        .build()
        .unwrap();
    let config = orchestrator::EngineConfig {
        poll_interval: Duration::from_secs(30),
        hold_backoff_below: Duration::from_millis(20),
        ..test_config()
    };
    (def, config)
}

#[tokio::test]
async fn a_caller_waiting_on_a_saga_parked_on_a_timer_hears_its_end() {
    // The driver gives the saga back with a timer and stops. The engine must take it up again
    // when the timer is due (not at its next poll, 30 s away), and the caller waiting on it
    // here must hear the end.
    let calls = Journal::default();
    let (def, config) = parked_on_a_timer(&calls);
    let db = TempDb::new();
    let store = db.store().await;
    let eng = RunningEngine::start(store.clone(), registry_of([def]), config);
    let saga = eng.engine.start_saga("later", json!({})).await.unwrap();
    let status = eng
        .engine
        .wait_terminal(saga.id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(status, Some(SagaStatus::Completed));
    assert_eq!(calls.names(), ["flaky:action", "flaky:action"]);
    let attempts = store.attempts(saga.id).await.unwrap();
    assert_eq!(attempts[0].outcome.as_deref(), Some("retryable"));
    eng.stop().await;
}

#[tokio::test]
async fn a_saga_parked_on_a_timer_is_taken_up_while_other_sagas_keep_ending() {
    // The run loop's next look is a deadline: sagas ending one after another (each wakes the
    // loop) must not keep putting off the look that takes up a saga whose timer came due.
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    let calls = Journal::default();
    let (later, config) = parked_on_a_timer(&calls);
    let quick = SagaDefinition::builder("quick", 1)
        .step(Step::retriable("noop", |_ctx: StepContext| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, StepError>(json!(null))
        }))
        .build()
        .unwrap();
    let db = TempDb::new();
    let store = db.store().await;
    let eng = RunningEngine::start(store.clone(), registry_of([later, quick]), config);
    let saga = eng.engine.start_saga("later", json!({})).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let churn = {
        let (engine, stop) = (eng.engine.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let s = engine.start_saga("quick", json!({})).await.unwrap();
                engine
                    .wait_terminal(s.id, Duration::from_secs(10))
                    .await
                    .unwrap();
            }
        })
    };
    let status = eng
        .engine
        .wait_terminal(saga.id, Duration::from_secs(10))
        .await
        .unwrap();
    stop.cancel();
    churn.await.unwrap();
    assert_eq!(status, Some(SagaStatus::Completed));
    eng.stop().await;
}

/// An input that counts how often it is deserialised.
#[derive(Debug)]
struct Counted {
    amount: i64,
}

static PARSES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl<'de> serde::Deserialize<'de> for Counted {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Raw {
            amount: i64,
        }
        PARSES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Raw::deserialize(d).map(|r| Counted { amount: r.amount })
    }
}

#[tokio::test]
async fn steps_share_the_state_the_input_parsed_once_and_typed_outputs() {
    use saga_dsl::{SagaDefinition, Stage, Step, StepContext, StepError};
    /// The application's state: a journal of what the participants did.
    struct Shop {
        calls: Journal,
    }
    const CHARGE: Stage<i64> = Stage::named("charge");
    async fn charge(ctx: StepContext) -> Result<i64, StepError> {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<Counted>()?);
        shop.calls.push("charge", "action", ctx.idempotency_key());
        Ok(input.amount * 100)
    }
    async fn refund(ctx: StepContext) -> Result<(), StepError> {
        ctx.state::<Shop>()?
            .calls
            .push("charge", "compensation", ctx.idempotency_key());
        Ok(())
    }
    async fn ship(ctx: StepContext) -> Result<String, StepError> {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<Counted>()?);
        let charged = ctx.output(CHARGE)?;
        shop.calls.push("ship", "action", ctx.idempotency_key());
        Ok(format!("{} for {charged}", input.amount))
    }
    async fn stateless(ctx: StepContext) -> Result<(), StepError> {
        ctx.state::<String>().map(|_| ())
    }
    let shop = std::sync::Arc::new(Shop {
        calls: Journal::default(),
    });
    let def = SagaDefinition::builder("typed", 1)
        .state(shop.clone())
        .step(Step::compensatable(CHARGE, charge, refund))
        .step(Step::pivot("ship", ship))
        .build()
        .unwrap();
    let wrong = SagaDefinition::builder("wrong_state", 1)
        .state(shop.clone())
        .step(Step::pivot("p", stateless))
        .build()
        .unwrap();
    let db = TempDb::new();
    let store = db.store().await;
    let eng = RunningEngine::start(store.clone(), registry_of([def, wrong]), test_config());
    let saga = eng
        .engine
        .start_saga("typed", json!({"amount": 7}))
        .await
        .unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed, "{done:#?}");
    assert_eq!(done.steps[1].output, Some(json!("7 for 700")));
    assert_eq!(shop.calls.names(), ["charge:action", "ship:action"]);
    assert_eq!(
        PARSES.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "two steps of one run read the input; it was parsed once"
    );

    let other = eng
        .engine
        .start_saga("wrong_state", json!({}))
        .await
        .unwrap();
    let failed = wait_terminal(&store, other.id).await;
    eng.stop().await;
    assert_eq!(failed.status, SagaStatus::Compensated);
    let error = failed.steps[0].action.last_error.clone().unwrap();
    assert!(
        error.contains("no state of type alloc::string::String"),
        "{error}"
    );
}
