//! The engine against a real SQLite file: every saga invariant of the specification that can be
//! shown in one process. Crash recovery across real process kills is in `crash.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use orchestrator::model::{SagaStatus, StepStatus};
use saga_dsl::StepKind::{Compensatable, Pivot, Retriable};
use saga_suite::{
    is, registry_of, scripted_saga, test_config, wait_for, wait_terminal, Journal, Outcome::*,
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
    let saga = eng.engine.start("s", json!({"x": 1})).await.unwrap();
    assert_eq!(saga.status, SagaStatus::Queued);
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
