//! Stages that are not plain calls, against a real database (SQLite, or PostgreSQL with
//! `SAGA_TEST_BACKEND=postgres`): conditions (`SKIPPED` steps), durable sleeps and waits for
//! signals. The same across a `kill -9` are in `crash/stages.rs`.

#![allow(clippy::unwrap_used)]

use orchestrator::store::Audit;
use std::time::{Duration, Instant};

use orchestrator::model::{SagaStatus, StepStatus};
use orchestrator::store::{CancelOutcome, SignalOutcome, SignalRequest};
use saga_dsl::StepKind::{Compensatable, Pivot, Retriable};
use saga_suite::{
    event_names, is, registry_of, scripted_saga, test_config, wait_for, wait_terminal, Journal,
    Outcome::Permanent, RunningEngine, ScriptedStep as S, TempDb,
};
use serde_json::json;

#[tokio::test]
async fn a_false_condition_skips_its_step_and_a_true_one_runs_it() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable).when(false),
            S::new("b", Compensatable).when(true),
            S::new("p", Pivot).when(false),
            S::new("r", Retriable),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    // A conditional first step is not written ahead with the create: it may not run at all.
    assert_eq!(saga.steps[0].action.status, StepStatus::Pending);
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(j.names(), ["b:action", "r:action"]);
    let statuses: Vec<StepStatus> = done.steps.iter().map(|s| s.action.status).collect();
    use StepStatus::{Skipped, Succeeded};
    assert_eq!(statuses, [Skipped, Succeeded, Skipped, Succeeded]);
    assert_eq!(
        done.steps[0].action.attempts, 0,
        "a skipped step was never called"
    );
    assert!(
        done.pivot_started,
        "the step after a skipped pivot passes the point of no return"
    );
    assert_eq!(done.output.unwrap()["a"], json!(null));
    let events = event_names(&store, saga.id).await;
    assert!(events.contains(&"step.skipped:a".to_owned()), "{events:?}");
    assert!(events.contains(&"step.skipped:p".to_owned()), "{events:?}");
    eng.stop().await;
}

#[tokio::test]
async fn a_skipped_step_is_never_compensated() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable),
            S::new("b", Compensatable).when(false),
            S::new("c", Compensatable).action(&[Permanent]),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(j.names(), ["a:action", "c:action", "a:compensation"]);
    assert_eq!(done.steps[1].action.status, StepStatus::Skipped);
    assert_eq!(done.steps[1].compensation.status, StepStatus::Pending);
    eng.stop().await;
}

#[tokio::test]
async fn a_condition_that_cannot_be_decided_fails_its_step_and_compensates() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let a = saga_suite::scripted_saga("s", 1, &[S::new("a", Compensatable)], &j);
    let def = saga_dsl::SagaDefinition::builder("s", 1)
        .step(a.steps()[0].clone())
        .step(
            saga_dsl::Step::compensatable(
                "b",
                |_: saga_dsl::StepContext| async { Ok(()) },
                |_: saga_dsl::StepContext| async { Ok(()) },
            )
            .when(|ctx| ctx.input::<bool>().map(|b| *b)),
        )
        .build()
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng
        .engine
        .start_saga("s", json!({"not": "a bool"}))
        .await
        .unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(j.names(), ["a:action", "a:compensation"]);
    assert_eq!(done.steps[1].action.status, StepStatus::Failed);
    assert_eq!(done.steps[1].action.attempts, 0);
    let error = done.steps[1].action.last_error.clone().unwrap();
    assert!(
        error.starts_with("its condition failed: saga input does not fit"),
        "{error}"
    );
    assert!(done.error.unwrap().starts_with("b: its condition failed"));
    eng.stop().await;
}

#[tokio::test]
async fn a_sleep_holds_no_worker_and_ends_at_its_wake_time() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let nap = Duration::from_millis(1500);
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable),
            S::sleep("nap", nap),
            S::new("b", Pivot),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let begun = Instant::now();
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    let asleep = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting && s.lease_owner.is_none()
    })
    .await;
    // Given back to the log: no worker waits, and the saga is due at its wake time.
    let wake = asleep.steps[1].wake_at.unwrap();
    assert_eq!(asleep.next_run_at, Some(wake));
    assert_eq!(asleep.status, SagaStatus::Running);
    let started = asleep.steps[1].action.started_at.unwrap();
    assert_eq!(wake - started, nap.as_millis() as i64);
    assert_eq!(j.names(), ["a:action"]);
    let json = serde_json::to_value(&asleep).unwrap();
    assert_eq!(json["steps"][1]["kind"], "sleep");
    assert_eq!(json["steps"][1]["status"], "WAITING");
    assert!(json["steps"][1]["wake_at"].is_string());
    assert!(
        json["steps"][0].get("wake_at").is_none(),
        "only sleeps have one"
    );

    let done = wait_terminal(&store, saga.id).await;
    assert!(begun.elapsed() >= nap);
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(j.names(), ["a:action", "b:action"]);
    let step = &done.steps[1];
    assert_eq!(step.action.status, StepStatus::Succeeded);
    assert_eq!(step.wake_at, Some(wake), "the wake time stays in the log");
    assert!(step.action.ended_at.unwrap() >= wake);
    assert_eq!(step.action.attempts, 0, "a sleep calls nothing");
    let events = event_names(&store, saga.id).await;
    let at = |kind: &str| events.iter().position(|e| e == kind).unwrap();
    assert!(at("step.waiting:nap") < at("step.succeeded:nap"));
    eng.stop().await;
}

#[tokio::test]
async fn a_sleep_first_and_a_sleep_until_a_past_instant_end_at_once() {
    let db = TempDb::new();
    let store = db.store().await;
    let def = saga_dsl::SagaDefinition::builder("s", 1)
        .step(saga_dsl::Step::sleep_until("past", |_| {
            Ok(std::time::SystemTime::now() - Duration::from_secs(3600))
        }))
        .step(saga_dsl::Step::pivot(
            "p",
            |_: saga_dsl::StepContext| async { Ok("done") },
        ))
        .build()
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    let sleep = &done.steps[0];
    assert_eq!(sleep.action.status, StepStatus::Succeeded);
    assert!(sleep.wake_at.unwrap() < sleep.action.started_at.unwrap());
    eng.stop().await;
}

#[tokio::test]
async fn a_cancel_during_a_long_sleep_compensates_at_once() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable),
            S::sleep("nap", Duration::from_secs(3600)),
            S::new("b", Pivot),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting && s.lease_owner.is_none()
    })
    .await;
    let asked = Instant::now();
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted
    );
    let done = wait_for(
        &store,
        saga.id,
        Duration::from_secs(10),
        is(SagaStatus::Compensated),
    )
    .await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "not at the wake time"
    );
    assert_eq!(j.names(), ["a:action", "a:compensation"]);
    assert_eq!(done.error.as_deref(), Some("cancelled on request"));
    eng.stop().await;
}

#[tokio::test]
async fn a_sleep_after_the_pivot_cannot_be_cancelled_and_still_ends() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("p", Pivot),
            S::sleep("nap", Duration::from_millis(400)),
            S::new("r", Retriable),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting
    })
    .await;
    assert!(matches!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::PastPivot
    ));
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(j.names(), ["p:action", "r:action"]);
    eng.stop().await;
}

/// Sends `payload` as the signal `name` to saga `id`, without an idempotency key.
async fn signal(
    store: &std::sync::Arc<dyn orchestrator::store::Store>,
    id: uuid::Uuid,
    name: &str,
    payload: serde_json::Value,
) -> SignalOutcome {
    let request = SignalRequest {
        saga: id,
        name,
        payload: &payload,
        key: None,
    };
    store.send_signal(request).await.unwrap()
}

fn approval_saga(
    j: &Journal,
    timeout: Option<(Duration, Option<serde_json::Value>)>,
) -> saga_dsl::SagaDefinition {
    let wait = S::signal("await_approval", "approval");
    let wait = match timeout {
        Some((t, default)) => wait.timeout(t, default),
        None => wait,
    };
    scripted_saga(
        "s",
        1,
        &[S::new("a", Compensatable), wait, S::new("p", Pivot)],
        j,
    )
}

#[tokio::test]
async fn a_signal_wait_parks_the_saga_until_the_signal_comes_and_its_payload_is_the_output() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([approval_saga(&j, None)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    // Given back due a lease's time from now, then parked: due only when something happens.
    let parked = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting
            && s.lease_owner.is_none()
            && s.next_run_at.is_none()
    })
    .await;
    assert_eq!(parked.steps[1].waiting_for.as_deref(), Some("approval"));
    assert_eq!(parked.steps[1].timeout_at, None);
    let json = serde_json::to_value(&parked).unwrap();
    assert_eq!(json["steps"][1]["kind"], "signal");
    assert_eq!(json["steps"][1]["waiting_for"], "approval");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(j.names(), ["a:action"], "nothing runs while it waits");

    let payload = json!({"approved": true, "by": "grace"});
    assert_eq!(
        signal(&store, saga.id, "approval", payload.clone()).await,
        SignalOutcome::Received
    );
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(j.names(), ["a:action", "p:action"]);
    assert_eq!(done.steps[1].output, Some(payload.clone()));
    assert_eq!(done.output.unwrap()["await_approval"], payload);
    let events = event_names(&store, saga.id).await;
    let at = |kind: &str| events.iter().position(|e| e == kind).unwrap();
    assert!(at("step.waiting:await_approval") < at("signal.received"));
    assert!(at("signal.received") < at("step.succeeded:await_approval"));
    // The first signal of a name wins; the same one again changes nothing.
    assert_eq!(
        signal(&store, saga.id, "approval", payload).await,
        SignalOutcome::AlreadyReceived
    );
    assert_eq!(
        signal(&store, saga.id, "approval", json!({"approved": false})).await,
        SignalOutcome::Conflict
    );
    assert_eq!(
        signal(&store, saga.id, "other", json!(1)).await,
        SignalOutcome::Refused(SagaStatus::Completed)
    );
    eng.stop().await;
}

#[tokio::test]
async fn a_signal_sent_before_the_saga_waits_is_kept_and_taken_when_it_does() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable),
            S::sleep("nap", Duration::from_millis(600)),
            S::signal("await_approval", "approval"),
            S::new("p", Pivot),
        ],
        &j,
    );
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    assert_eq!(
        signal(&store, saga.id, "approval", json!({"early": true})).await,
        SignalOutcome::Received
    );
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(done.steps[2].output, Some(json!({"early": true})));
    eng.stop().await;
}

#[tokio::test]
async fn a_signal_wait_that_times_out_compensates_or_takes_its_default() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let short = Some((Duration::from_millis(500), None));
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([approval_saga(&j, short)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    let parked = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting && s.lease_owner.is_none()
    })
    .await;
    // Given back due at the first of its timeout and a lease's time to live: the timeout.
    let timeout = parked.steps[1].timeout_at.unwrap();
    assert_eq!(parked.next_run_at, Some(timeout));
    assert_eq!(timeout - parked.steps[1].action.started_at.unwrap(), 500);
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(j.names(), ["a:action", "a:compensation"]);
    assert_eq!(
        done.error.as_deref(),
        Some("await_approval: no signal \"approval\" came before the timeout")
    );
    eng.stop().await;

    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let default = Some((
        Duration::from_millis(300),
        Some(json!({"approved": true, "by": "default"})),
    ));
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([approval_saga(&j, default)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(
        done.steps[1].output,
        Some(json!({"approved": true, "by": "default"}))
    );
    eng.stop().await;
}

#[tokio::test]
async fn a_refused_payload_fails_the_wait_and_compensates() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([approval_saga(&j, None)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting
    })
    .await;
    signal(&store, saga.id, "approval", json!({"refuse": true})).await;
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(
        done.error.as_deref(),
        Some("await_approval: refused by its payload")
    );
    assert_eq!(j.names(), ["a:action", "a:compensation"]);
    eng.stop().await;
}

#[tokio::test]
async fn a_cancel_while_waiting_for_a_signal_without_timeout_compensates_at_once() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([approval_saga(&j, None)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting && s.lease_owner.is_none()
    })
    .await;
    assert_eq!(
        store
            .request_cancel(saga.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted
    );
    let done = wait_for(
        &store,
        saga.id,
        Duration::from_secs(5),
        is(SagaStatus::Compensated),
    )
    .await;
    assert_eq!(j.names(), ["a:action", "a:compensation"]);
    assert_eq!(
        signal(&store, saga.id, "approval", json!({})).await,
        SignalOutcome::Refused(SagaStatus::Compensated)
    );
    assert_eq!(done.error.as_deref(), Some("cancelled on request"));
    eng.stop().await;
}

#[tokio::test]
async fn many_signals_racing_their_waits_are_never_lost() {
    // Each signal is sent while its saga may be writing its wait: whichever comes first, the
    // saga ends.
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([approval_saga(&j, None)]),
        test_config(),
    );
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(eng.engine.start_saga("s", json!({})).await.unwrap().id);
    }
    for (n, id) in ids.iter().enumerate() {
        if n % 3 == 0 {
            tokio::task::yield_now().await;
        }
        signal(&store, *id, "approval", json!({"n": n})).await;
    }
    for (n, id) in ids.iter().enumerate() {
        let done = wait_for(&store, *id, Duration::from_secs(20), |s| {
            s.status.is_terminal()
        })
        .await;
        assert_eq!(done.status, SagaStatus::Completed, "saga {n}");
        assert_eq!(done.steps[1].output, Some(json!({"n": n})));
    }
    eng.stop().await;
}

/// `a` (compensatable), the group `g` of `branches`, then `p` (pivot).
fn group_saga(j: &Journal, group: S) -> saga_dsl::SagaDefinition {
    scripted_saga(
        "s",
        1,
        &[S::new("a", Compensatable), group, S::new("p", Pivot)],
        j,
    )
}

/// The rows of a saga's branches, by name.
fn branch<'a>(saga: &'a orchestrator::Saga, name: &str) -> &'a orchestrator::model::StepRecord {
    saga.steps.iter().find(|s| s.name == name).unwrap()
}

async fn run_group(
    group: S,
    input: serde_json::Value,
) -> (orchestrator::Saga, Journal, Vec<String>) {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([group_saga(&j, group)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", input).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    let events = event_names(&store, saga.id).await;
    eng.stop().await;
    (done, j, events)
}

#[tokio::test]
async fn a_parallel_group_runs_every_branch_and_its_output_is_keyed_by_branch() {
    let group = S::parallel(
        "g",
        vec![
            S::new("x", Compensatable),
            S::new("y", Compensatable),
            S::new("z", Compensatable),
        ],
    );
    let (done, j, events) = run_group(group, json!({})).await;
    assert_eq!(done.status, SagaStatus::Completed);
    let mut calls = j.names();
    calls.sort();
    assert_eq!(
        calls,
        [
            "a:action",
            "g/x:action",
            "g/y:action",
            "g/z:action",
            "p:action"
        ]
    );
    assert_eq!(
        done.steps.len(),
        6,
        "a stage row per stage, a row per branch"
    );
    assert_eq!(done.steps[1].kind, orchestrator::model::StepKind::Parallel);
    let output = done.output.unwrap();
    assert_eq!(output["g"]["y"], json!({"step": "g/y", "attempt": 1}));
    assert!(
        output.get("g/y").is_none(),
        "the saga's output has stages only"
    );
    // Each branch has a key of its own, stable per saga, group, branch and phase.
    let keys: std::collections::HashSet<_> = j.calls().into_iter().map(|(_, _, key)| key).collect();
    assert_eq!(keys.len(), 5);
    let x = j
        .calls()
        .into_iter()
        .find(|(s, _, _)| s == "g/x")
        .unwrap()
        .2;
    assert_eq!(
        x,
        saga_dsl::branch_idempotency_key(done.id, "g", "x", saga_dsl::Phase::Action)
    );
    assert!(events.contains(&"group.started:g".to_owned()), "{events:?}");
    assert!(events.contains(&"step.succeeded:g/z".to_owned()));
    assert!(events.contains(&"step.succeeded:g".to_owned()));
}

#[tokio::test]
async fn a_branch_that_fails_compensates_the_others_then_the_stages_before() {
    let group = S::parallel(
        "g",
        vec![
            S::new("x", Compensatable),
            S::new("y", Compensatable).action(&[Permanent]),
            S::new("z", Compensatable).action(&[saga_suite::Outcome::Retryable]),
        ],
    );
    let (done, j, _) = run_group(group, json!({})).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(
        done.error.as_deref(),
        Some("g: branch y: scripted permanent failure")
    );
    let names = j.names();
    let at = |call: &str| {
        names
            .iter()
            .position(|n| n == call)
            .unwrap_or_else(|| panic!("{call} in {names:?}"))
    };
    assert!(
        !names.contains(&"g/y:compensation".to_owned()),
        "the failed branch had no effect"
    );
    assert!(at("g/x:compensation") < at("a:compensation"), "{names:?}");
    assert!(!names.contains(&"p:action".to_owned()));
    assert_eq!(branch(&done, "g/y").action.status, StepStatus::Failed);
    assert_eq!(branch(&done, "g").action.status, StepStatus::Failed);
    // z either finished (and was compensated) or never retried after y failed.
    let z = branch(&done, "g/z");
    if z.action.status == StepStatus::Succeeded {
        assert!(names.contains(&"g/z:compensation".to_owned()));
    } else {
        assert!(!names.contains(&"g/z:compensation".to_owned()), "{z:?}");
    }
}

#[tokio::test]
async fn a_branch_whose_outcome_is_unknown_is_compensated_too() {
    use saga_suite::Outcome::Hang;
    let group = S::parallel(
        "g",
        vec![
            S::new("x", Compensatable).action(&[Hang, Hang, Hang]),
            S::new("y", Compensatable).action(&[Permanent]),
        ],
    );
    let (done, j, _) = run_group(group, json!({})).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    let names = j.names();
    assert!(names.contains(&"g/x:compensation".to_owned()), "{names:?}");
    assert!(!names.contains(&"g/y:compensation".to_owned()));
    assert!(branch(&done, "g/x").action.outcome_unknown);
}

#[tokio::test]
async fn a_mapped_group_has_a_branch_per_element_at_most_max_concurrency_at_once() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let group = S::map("g", "items", S::new("reserve", Compensatable)).max_concurrency(2);
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([group_saga(&j, group)]),
        test_config(),
    );
    let items: Vec<_> = (1..=5)
        .map(|n| json!({"name": format!("sku-{n}")}))
        .collect();
    let saga = eng
        .engine
        .start_saga("s", json!({ "items": items }))
        .await
        .unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    let output = &done.output.clone().unwrap()["g"];
    assert_eq!(output.as_object().unwrap().len(), 5);
    assert_eq!(output["sku-3"]["step"], "g/sku-3");
    // Never more than two branches' calls at once, by the attempt log.
    let attempts = store.attempts(saga.id).await.unwrap();
    let spans: Vec<(i64, i64)> = attempts
        .iter()
        .filter(|a| a.step.starts_with("g/"))
        .map(|a| (a.started_at, a.ended_at.unwrap()))
        .collect();
    assert_eq!(spans.len(), 5);
    for &(start, _) in &spans {
        let overlapping = spans
            .iter()
            .filter(|&&(s, e)| s <= start && start < e)
            .count();
        assert!(overlapping <= 2, "{spans:?}");
    }
    eng.stop().await;
}

#[tokio::test]
async fn a_branch_retries_on_its_own_timer_and_the_group_waits_for_it() {
    let group = S::map("g", "items", S::new("reserve", Compensatable));
    let input = json!({"items": [
        {"name": "a1"},
        {"name": "b2", "script": ["Retryable", "Retryable"]},
    ]});
    let (done, _, events) = run_group(group, input).await;
    assert_eq!(done.status, SagaStatus::Completed);
    let b2 = branch(&done, "g/b2");
    assert_eq!(b2.action.attempts, 3);
    assert_eq!(b2.retry_at, None, "no timer left once it succeeded");
    assert_eq!(
        events.iter().filter(|e| *e == "step.retrying:g/b2").count(),
        2
    );
}

#[tokio::test]
async fn bad_lists_fail_the_group_with_a_clear_error_and_compensate() {
    let group = || S::map("g", "items", S::new("reserve", Compensatable));
    let (done, j, _) = run_group(group(), json!({"items": {"not": "a list"}})).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(
        done.error.as_deref(),
        Some("g: its branches failed: items is not a list")
    );
    assert_eq!(j.names(), ["a:action", "a:compensation"]);

    let many: Vec<_> = (0..10_000)
        .map(|n| json!({"name": format!("n{n}")}))
        .collect();
    let (done, _, _) = run_group(group(), json!({ "items": many })).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    assert_eq!(
        done.error.as_deref(),
        Some(
            "g: its branches failed: g maps over 10000 elements; a group has at most 1000 branches"
        )
    );
    assert_eq!(done.steps.len(), 3, "no branch row was written");

    let (done, _, _) = run_group(group(), json!({"items": [{"name": "x"}, {"name": "x"}]})).await;
    assert!(done
        .error
        .unwrap()
        .ends_with("two elements are both named \"x\""));

    let (done, _, _) = run_group(group(), json!({"items": [{"name": "a/b"}]})).await;
    assert!(done.error.unwrap().contains("is not a plain name"));

    // An empty list has nothing to do.
    let (done, j, _) = run_group(group(), json!({"items": []})).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(done.output.unwrap()["g"], json!({}));
    assert_eq!(j.names(), ["a:action", "p:action"]);
}

#[tokio::test]
async fn a_cancel_during_a_group_lets_branches_in_flight_finish_then_compensates_them() {
    use saga_suite::Outcome::Hang;
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    // x hangs once (its first call runs into its timeout) and succeeds on its retry.
    let group = S::parallel(
        "g",
        vec![
            S::new("x", Compensatable).action(&[Hang]),
            S::new("y", Compensatable),
        ],
    );
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([group_saga(&j, group)]),
        test_config(),
    );
    let saga = eng.engine.start_saga("s", json!({})).await.unwrap();
    wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.steps
            .iter()
            .any(|b| b.name == "g/x" && b.action.status == StepStatus::Running)
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
    let names = j.names();
    assert!(names.contains(&"g/y:compensation".to_owned()), "{names:?}");
    assert!(
        names.contains(&"g/x:compensation".to_owned()),
        "its outcome was unknown: {names:?}"
    );
    assert!(names.contains(&"a:compensation".to_owned()));
    assert!(!names.contains(&"p:action".to_owned()));
    eng.stop().await;
}
