//! Property test: random saga shapes against random failure schedules, run by the real engine on
//! a real SQLite file, checked against a model of the specification.
//!
//! The model predicts the exact sequence of calls (every attempt of every action and
//! compensation) and the terminal status; comparing sequences checks at once that compensations
//! run in exact reverse order of the succeeded (or unknown-outcome) steps, that steps never
//! started are never compensated, that nothing after the pivot is compensated, and that retriable
//! steps are retried until they succeed.

#![allow(clippy::unwrap_used)]

use orchestrator::model::SagaStatus;
use proptest::prelude::*;
use saga_dsl::StepKind;
use saga_suite::{
    registry_of, scripted_saga, test_config, wait_terminal, Journal, Outcome, RunningEngine,
    ScriptedStep, TempDb,
};
use serde_json::json;

/// Attempts allowed to compensatable and pivot actions in scripted sagas.
const BUDGET: usize = 3;

#[derive(Debug, Clone)]
struct Case {
    steps: Vec<ScriptedStep>,
    cancel_before_start: bool,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Ok),
        3 => Just(Outcome::Retryable),
        2 => Just(Outcome::Permanent),
        1 => Just(Outcome::Hang),
    ]
}

fn comp_outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => Just(Outcome::Retryable),
        1 => Just(Outcome::Permanent),
        1 => Just(Outcome::Hang),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=4,
        any::<bool>(),
        0usize..=2,
        prop::collection::vec(prop::collection::vec(outcome(), 0..4), 7),
        prop::collection::vec(prop::collection::vec(comp_outcome(), 0..3), 7),
        prop::collection::vec(
            prop::collection::vec(
                prop_oneof![Just(Outcome::Retryable), Just(Outcome::Hang)],
                0..5,
            ),
            2,
        ),
        prop::bool::weighted(0.1),
        any::<bool>(),
    )
        .prop_map(
            |(
                n_comp,
                pivot,
                n_retriable,
                actions,
                comps,
                retriable_scripts,
                cancel,
                fail_retriable,
            )| {
                let mut steps = Vec::new();
                for i in 0..n_comp {
                    steps.push(
                        ScriptedStep::new(&format!("c{i}"), StepKind::Compensatable)
                            .action(&actions[i])
                            .compensation(&comps[i]),
                    );
                }
                if pivot {
                    steps.push(ScriptedStep::new("pivot", StepKind::Pivot).action(&actions[5]));
                }
                for (i, script) in retriable_scripts.iter().enumerate().take(n_retriable) {
                    let mut script = script.clone();
                    // Now and then a retriable step fails for good: the saga must end FAILED.
                    if fail_retriable && i == 0 && actions[6].first() == Some(&Outcome::Permanent) {
                        script.push(Outcome::Permanent);
                    }
                    steps.push(
                        ScriptedStep::new(&format!("r{i}"), StepKind::Retriable).action(&script),
                    );
                }
                Case {
                    steps,
                    cancel_before_start: cancel,
                }
            },
        )
}

/// What the specification says must happen: the calls in order, and the terminal status.
fn expected(case: &Case) -> (Vec<String>, SagaStatus) {
    let mut calls = Vec::new();
    if case.cancel_before_start {
        return (calls, SagaStatus::Compensated);
    }
    // Steps whose effect may exist: succeeded, or last attempt's outcome unknown.
    let mut to_compensate = Vec::new();
    for step in &case.steps {
        let retriable = step.kind == StepKind::Retriable;
        let mut attempt = 0;
        let outcome = loop {
            attempt += 1;
            calls.push(format!("{}:action", step.name));
            let o = step.action.get(attempt - 1).copied().unwrap_or(Outcome::Ok);
            match o {
                Outcome::Ok => break Ok(()),
                Outcome::Permanent => break Err(false),
                Outcome::Retryable | Outcome::Hang => {
                    if !retriable && attempt >= BUDGET {
                        break Err(o == Outcome::Hang);
                    }
                }
            }
        };
        match outcome {
            Ok(()) => {
                if step.kind == StepKind::Compensatable {
                    to_compensate.push(step);
                }
            }
            Err(unknown) => {
                match step.kind {
                    StepKind::Compensatable => {
                        if unknown {
                            to_compensate.push(step);
                        }
                    }
                    StepKind::Pivot if !unknown => {}
                    // A pivot with unknown outcome, or a retriable step: no way back.
                    _ => return (calls, SagaStatus::Failed),
                }
                for s in to_compensate.iter().rev() {
                    // Compensations never give up: every scripted failure, then success.
                    for _ in 0..=s.compensation.len() {
                        calls.push(format!("{}:compensation", s.name));
                    }
                }
                return (calls, SagaStatus::Compensated);
            }
        }
    }
    (calls, SagaStatus::Completed)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, max_shrink_iters: 50, .. ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_model(case in case()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (calls, status) = rt.block_on(async {
            let db = TempDb::new();
            let store = db.store().await;
            let journal = Journal::default();
            let registry = registry_of([scripted_saga("p", 1, &case.steps, &journal)]);
            let idle = orchestrator::Engine::new(store.clone(), std::sync::Arc::new(registry.clone()), test_config());
            let saga = idle.start_saga("p", json!({})).await.unwrap();
            if case.cancel_before_start {
                store.request_cancel(saga.id).await.unwrap();
            }
            let eng = RunningEngine::start(store.clone(), registry, test_config());
            let done = wait_terminal(&store, saga.id).await;
            eng.stop().await;
            (journal.names(), done.status)
        });
        let (want_calls, want_status) = expected(&case);
        prop_assert_eq!(status, want_status);
        prop_assert_eq!(calls, want_calls);
    }
}
