//! Child sagas and scheduled starts against a real database (SQLite, or PostgreSQL with
//! `SAGA_TEST_BACKEND=postgres`): a child stage starts one child whose id comes from its
//! parent, waits for it without a worker, takes its output or its failure, and undoes it when
//! the parent goes back; a saga started with a start time waits `QUEUED` until then.

#![allow(clippy::unwrap_used)]

use orchestrator::store::Audit;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::model::{SagaStatus, StageKind, StepStatus};
use orchestrator::store::{CancelOutcome, SignalRequest, Store};
use orchestrator::{StartError, StartRequest};
use saga_dsl::child_saga_id;
use saga_dsl::StepKind::{Compensatable, Pivot};
use saga_suite::{
    event_names, is, registry_of, scripted_saga, test_config, wait_for, wait_terminal, Journal,
    Outcome::Permanent, RunningEngine, ScriptedStep as S, TempDb,
};
use serde_json::json;

/// The parent `order`: `a`, the child stage `sub` (starting `child`), then `b`.
fn parent(j: &Journal, b: S) -> saga_dsl::SagaDefinition {
    scripted_saga(
        "order",
        1,
        &[S::new("a", Compensatable), S::child("sub", "child"), b],
        j,
    )
}

/// The child `child`: `c1`, then optionally a wait for the signal `go`, then `c2`.
fn child(j: &Journal, wait: bool, c2: S) -> saga_dsl::SagaDefinition {
    let mut steps = vec![S::new("c1", Compensatable)];
    if wait {
        steps.push(S::signal("hold", "go"));
    }
    steps.push(c2);
    scripted_saga("child", 1, &steps, j)
}

/// A database and an engine running `order` (its last stage `b`) and `child` (waiting for `go`
/// when `wait`, its last stage `c2`), with the journal of their calls.
struct Family {
    _db: TempDb,
    store: Arc<dyn Store>,
    j: Journal,
    eng: RunningEngine,
}

async fn family(b: S, wait: bool, c2: S) -> Family {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let defs = [parent(&j, b), child(&j, wait, c2)];
    let eng = RunningEngine::start(store.clone(), registry_of(defs), test_config());
    Family {
        _db: db,
        store,
        j,
        eng,
    }
}

#[tokio::test]
async fn a_completed_child_gives_its_output_to_its_stage_and_both_link_to_each_other() {
    let Family { _db, store, j, eng } = family(
        S::new("b", Compensatable),
        false,
        S::new("c2", Compensatable),
    )
    .await;
    let saga = eng
        .engine
        .start_saga("order", json!({"n": 1}))
        .await
        .unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed, "{:?}", done.error);
    assert_eq!(
        j.names(),
        ["a:action", "c1:action", "c2:action", "b:action"]
    );
    let child_id = child_saga_id(saga.id, "sub");
    let kid = store.get_saga(child_id).await.unwrap().unwrap();
    assert_eq!(kid.status, SagaStatus::Completed);
    assert_eq!(
        kid.input,
        json!({"n": 1}),
        "the child's input is computed by the stage"
    );
    assert_eq!(kid.parent_id, Some(saga.id));
    assert_eq!(kid.parent_stage.as_deref(), Some("sub"));
    // The stage's output is the child's output (every child step's output by name).
    assert_eq!(done.output.as_ref().unwrap()["sub"], kid.output.unwrap());
    let sub = &done.stages[1];
    assert_eq!(
        (sub.kind, sub.action.status),
        (StageKind::Child, StepStatus::Succeeded)
    );
    assert_eq!(sub.child_id, Some(child_id));
    assert_eq!(done.stages[0].kind, StageKind::Step);
    let parent_events = event_names(&store, saga.id).await;
    let started = parent_events
        .iter()
        .filter(|e| *e == "child.started:sub")
        .count();
    assert_eq!(started, 1, "{parent_events:?}");
    eng.stop().await;
}

#[tokio::test]
async fn a_waiting_parent_holds_no_worker_and_a_child_that_compensates_fails_its_stage() {
    let Family { _db, store, j, eng } = family(
        S::new("b", Compensatable),
        true,
        S::new("c2", Compensatable).action(&[Permanent]),
    )
    .await;
    let saga = eng.engine.start_saga("order", json!({})).await.unwrap();
    let child_id = child_saga_id(saga.id, "sub");
    // The child waits for its signal; the parent waits for the child, leased by nobody.
    child_waits(&store, &saga).await;
    let waiting = wait_for(&store, saga.id, Duration::from_secs(10), |s| {
        s.lease_owner.is_none()
    })
    .await;
    assert_eq!(waiting.status, SagaStatus::Running);
    assert_eq!(waiting.steps[1].action.status, StepStatus::Waiting);
    assert_eq!(waiting.next_run_at, None, "parked until its child ends");
    let counts = store.waiting().await.unwrap();
    assert_eq!(
        (counts.child, counts.signal, counts.sleep, counts.scheduled),
        (1, 1, 0, 0),
        "the parent waits for its child, the child for its signal"
    );
    let payload = json!({});
    let request = SignalRequest {
        saga: child_id,
        name: "go",
        payload: &payload,
        key: None,
    };
    store.send_signal(request).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    let kid = store.get_saga(child_id).await.unwrap().unwrap();
    assert_eq!(kid.status, SagaStatus::Compensated);
    assert_eq!(done.steps[1].action.status, StepStatus::Failed);
    let error = done.steps[1].action.last_error.clone().unwrap();
    assert!(
        error.contains(&child_id.to_string()) && error.contains("COMPENSATED"),
        "{error}"
    );
    // The child undid its own work; the parent undid only what is its own.
    assert_eq!(
        j.names(),
        [
            "a:action",
            "c1:action",
            "c2:action",
            "c1:compensation",
            "a:compensation"
        ]
    );
    eng.stop().await;
}

#[tokio::test]
async fn a_parent_that_goes_back_after_its_child_completed_runs_the_childs_compensations() {
    let Family { _db, store, j, eng } = family(
        S::new("b", Compensatable).action(&[Permanent]),
        false,
        S::new("c2", Compensatable),
    )
    .await;
    let saga = eng.engine.start_saga("order", json!({})).await.unwrap();
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated, "{:?}", done.error);
    let kid = store.get_saga(child_id(&saga)).await.unwrap().unwrap();
    assert_eq!(kid.status, SagaStatus::Compensated);
    assert!(kid.error.unwrap().contains(&saga.id.to_string()));
    assert_eq!(
        j.names(),
        [
            "a:action",
            "c1:action",
            "c2:action",
            "b:action",
            "c2:compensation",
            "c1:compensation",
            "a:compensation"
        ]
    );
    assert_eq!(done.steps[1].compensation.status, StepStatus::Succeeded);
    eng.stop().await;
}

fn child_id(saga: &orchestrator::Saga) -> uuid::Uuid {
    child_saga_id(saga.id, "sub")
}

/// Waits until the parent's child stage waits and its child waits for its signal.
async fn child_waits(store: &Arc<dyn Store>, saga: &orchestrator::Saga) {
    // The stage is recorded as waiting before its child is created.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.get_saga(child_id(saga)).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "no child saga was started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(store, child_id(saga), Duration::from_secs(10), |s| {
        s.steps[1].action.status == StepStatus::Waiting
    })
    .await;
}

#[tokio::test]
async fn cancelling_a_parent_cancels_its_running_child_and_waits_for_it() {
    let Family { _db, store, j, eng } = family(
        S::new("b", Compensatable),
        true,
        S::new("c2", Compensatable),
    )
    .await;
    let saga = eng.engine.start_saga("order", json!({})).await.unwrap();
    child_waits(&store, &saga).await;
    let cancel = store
        .request_cancel(saga.id, &Audit::default())
        .await
        .unwrap();
    assert_eq!(cancel, CancelOutcome::Accepted);
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    let kid = store.get_saga(child_id(&saga)).await.unwrap().unwrap();
    assert_eq!(kid.status, SagaStatus::Compensated);
    assert!(kid.cancel_requested);
    assert_eq!(
        j.names(),
        ["a:action", "c1:action", "c1:compensation", "a:compensation"]
    );
    let parent_events = event_names(&store, saga.id).await;
    assert!(
        parent_events.contains(&"step.compensated:sub".to_owned()),
        "{parent_events:?}"
    );
    eng.stop().await;
}

#[tokio::test]
async fn a_child_stage_needs_a_registered_child_it_can_undo() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    // Not registered: the engine refuses to run.
    let registry = registry_of([parent(&j, S::new("b", Compensatable))]);
    let engine = orchestrator::Engine::new(store.clone(), Arc::new(registry), test_config());
    let err = engine.run(Default::default()).await.unwrap_err();
    assert!(
        err.to_string().contains("no saga \"child\" is registered"),
        "{err}"
    );
    // A child with a pivot, started before the parent's point of no return.
    let with_pivot = child(&j, false, S::new("c2", Pivot));
    let registry = registry_of([parent(&j, S::new("b", Compensatable)), with_pivot]);
    let err = registry.check_children().unwrap_err();
    assert!(err.to_string().contains("point of no return"), "{err}");
    // After the parent's own pivot it may.
    let late = scripted_saga(
        "order",
        1,
        &[S::new("p", Pivot), S::child("sub", "child")],
        &j,
    );
    let registry = registry_of([late, child(&j, false, S::new("c2", Pivot))]);
    registry.check_children().unwrap();
}

#[tokio::test]
async fn a_scheduled_start_waits_queued_until_its_time_and_a_past_one_is_refused() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &[S::new("a", Compensatable)], &j);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let now = store.now().await.unwrap();
    let at = now + 800;
    let t0 = Instant::now();
    let started = eng
        .engine
        .start(StartRequest::new("s", json!({})).at(at))
        .await
        .unwrap();
    let orchestrator::StartOutcome::Created { saga, .. } = started else {
        panic!("a scheduled start creates its saga");
    };
    assert_eq!(saga.status, SagaStatus::Queued);
    let read = store.get_saga(saga.id).await.unwrap().unwrap();
    assert_eq!((read.scheduled_at, read.next_run_at), (Some(at), Some(at)));
    assert_eq!(read.lease_owner, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(j.names().is_empty(), "nothing runs before its time");
    let done = wait_terminal(&store, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert!(
        t0.elapsed() >= Duration::from_millis(700),
        "{:?}",
        t0.elapsed()
    );
    let first = store.attempts(saga.id).await.unwrap()[0].started_at;
    assert!(first >= at, "started at {first}, scheduled at {at}");

    let past = eng
        .engine
        .start(StartRequest::new("s", json!({})).at(now - 1_000))
        .await;
    assert!(
        matches!(past, Err(StartError::StartInPast { .. })),
        "{past:?}"
    );
    let all = orchestrator::model::ListFilter {
        limit: 100,
        ..Default::default()
    };
    let page = store.list_sagas(&all).await.unwrap();
    assert_eq!(page.sagas.len(), 1, "a refused start records nothing");
    eng.stop().await;
}

#[tokio::test]
async fn a_scheduled_saga_cancelled_before_its_time_ends_compensated_with_nothing_run() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let def = scripted_saga("s", 1, &[S::new("a", Compensatable)], &j);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let at = store.now().await.unwrap() + 3_600_000;
    let request = StartRequest::new("s", json!({})).at(at);
    let orchestrator::StartOutcome::Created { saga, .. } = eng.engine.start(request).await.unwrap()
    else {
        panic!("created");
    };
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
    assert_eq!(done.steps[0].action.status, StepStatus::Pending);
    assert!(j.names().is_empty());
    eng.stop().await;
}
