//! Property test: random saga shapes against random failure schedules, run by the real engine on
//! a real SQLite file, checked against a model of the specification.
//!
//! The model predicts the exact sequence of calls (every attempt of every action and
//! compensation) and the terminal status; comparing sequences checks at once that compensations
//! run in exact reverse order of the succeeded (or unknown-outcome) steps, that steps never
//! started are never compensated, that nothing after the pivot is compensated, and that retriable
//! steps are retried until they succeed.
//!
//! A second property draws stage shapes: parallel groups (a branch failing for good among them),
//! conditions, sleeps and signal waits that time out, before the pivot. Its model allows the
//! calls of a group's branches in any order among themselves, and nothing else.

#![allow(clippy::unwrap_used)]

use orchestrator::store::Audit;
use std::time::Duration;

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

/// How many attempts a step's action makes by its script, and how it ends: `Ok`, or `Err`
/// saying whether the last attempt's outcome is unknown. Retriable steps retry without end.
fn action_attempts(step: &ScriptedStep) -> (usize, Result<(), bool>) {
    let retriable = step.kind == StepKind::Retriable;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match step.action.get(attempt - 1).copied().unwrap_or(Outcome::Ok) {
            Outcome::Ok => return (attempt, Ok(())),
            Outcome::Permanent => return (attempt, Err(false)),
            o @ (Outcome::Retryable | Outcome::Hang) => {
                if !retriable && attempt >= BUDGET {
                    return (attempt, Err(o == Outcome::Hang));
                }
            }
        }
    }
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
        let (attempts, outcome) = action_attempts(step);
        calls.extend(std::iter::repeat_n(
            format!("{}:action", step.name),
            attempts,
        ));
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
                store.request_cancel(saga.id, &Audit::default()).await.unwrap();
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

/// Where the calls of a stage shape may interleave: one call in its place, or the calls of a
/// parallel group's branches, in any order among themselves.
#[derive(Debug, Clone)]
enum Seg {
    One(String),
    Any(Vec<String>),
}

/// What to undo if the saga goes back: a step, or the branches of a group that may have acted.
enum Undo<'a> {
    Step(&'a ScriptedStep),
    Branches(&'a ScriptedStep, Vec<&'a ScriptedStep>),
}

/// A stage before the point of no return: a compensatable step (maybe with a condition), a
/// parallel group of 2 or 3 branches (each succeeding or failing for good at once; a condition
/// now and then), a short sleep, or a short signal wait that nobody signals (going on with its
/// default payload, or failing without one).
fn pre_stage() -> impl Strategy<Value = ScriptedStep> {
    let comp = (
        prop::collection::vec(outcome(), 0..4),
        prop::collection::vec(comp_outcome(), 0..3),
        prop::option::weighted(0.3, any::<bool>()),
    )
        .prop_map(|(actions, comps, when)| {
            let step = ScriptedStep::new("", StepKind::Compensatable)
                .action(&actions)
                .compensation(&comps);
            match when {
                Some(holds) => step.when(holds),
                None => step,
            }
        });
    let group = (
        prop::collection::vec(
            (
                prop::bool::weighted(0.25),
                prop::collection::vec(comp_outcome(), 0..3),
            ),
            2..=3,
        ),
        prop::option::weighted(0.15, any::<bool>()),
    )
        .prop_map(|(branches, when)| {
            let branches = branches
                .iter()
                .enumerate()
                .map(|(j, (fails, comps))| {
                    let script: &[Outcome] = if *fails { &[Outcome::Permanent] } else { &[] };
                    ScriptedStep::new(&format!("b{j}"), StepKind::Compensatable)
                        .action(script)
                        .compensation(comps)
                })
                .collect();
            let group = ScriptedStep::parallel("", branches);
            match when {
                Some(holds) => group.when(holds),
                None => group,
            }
        });
    let sleep = Just(ScriptedStep::sleep("", Duration::from_millis(5)));
    let signal = any::<bool>().prop_map(|default| {
        ScriptedStep::signal("", "go").timeout(
            Duration::from_millis(30),
            default.then(|| json!({"by": "default"})),
        )
    });
    prop_oneof![4 => comp, 3 => group, 1 => sleep, 1 => signal]
}

fn staged_case() -> impl Strategy<Value = Vec<ScriptedStep>> {
    (
        prop::collection::vec(pre_stage(), 1..=5),
        prop::option::weighted(0.5, prop::collection::vec(outcome(), 0..3)),
        prop::option::weighted(
            0.4,
            prop::collection::vec(
                prop_oneof![Just(Outcome::Retryable), Just(Outcome::Hang)],
                0..3,
            ),
        ),
    )
        .prop_map(|(pre, pivot, retriable)| {
            let mut steps = pre;
            for (i, s) in steps.iter_mut().enumerate() {
                s.name = format!("s{i}");
                // Each wait needs a signal of its own.
                if let Some(signal) = &mut s.signal {
                    signal.0 = format!("go{i}");
                }
            }
            if let Some(script) = pivot {
                steps.push(ScriptedStep::new("pivot", StepKind::Pivot).action(&script));
            }
            if let Some(script) = retriable {
                steps.push(ScriptedStep::new("r", StepKind::Retriable).action(&script));
            }
            steps
        })
}

/// The calls a stage shape must make, in order up to the interleaving of a group's branches,
/// and its terminal status.
fn expected_stages(steps: &[ScriptedStep]) -> (Vec<Seg>, SagaStatus) {
    let mut segs = Vec::new();
    let mut undo: Vec<Undo> = Vec::new();
    let go_back = |segs: &mut Vec<Seg>, undo: &[Undo]| {
        for u in undo.iter().rev() {
            // Compensations never give up: every scripted failure, then success.
            match u {
                Undo::Step(s) => {
                    for _ in 0..=s.compensation.len() {
                        segs.push(Seg::One(format!("{}:compensation", s.name)));
                    }
                }
                Undo::Branches(group, branches) => {
                    let calls = branches
                        .iter()
                        .flat_map(|b| {
                            let call = format!("{}/{}:compensation", group.name, b.name);
                            std::iter::repeat_n(call, b.compensation.len() + 1)
                        })
                        .collect();
                    segs.push(Seg::Any(calls));
                }
            }
        }
    };
    for step in steps {
        if step.when == Some(false) {
            continue;
        }
        match step.kind {
            StepKind::Sleep => {}
            StepKind::Signal => {
                if step.signal.as_ref().is_some_and(|s| s.2.is_none()) {
                    go_back(&mut segs, &undo);
                    return (segs, SagaStatus::Compensated);
                }
            }
            StepKind::Parallel => {
                let calls = step
                    .branches
                    .iter()
                    .map(|b| format!("{}/{}:action", step.name, b.name))
                    .collect();
                segs.push(Seg::Any(calls));
                let acted = step
                    .branches
                    .iter()
                    .filter(|b| b.action.is_empty())
                    .collect::<Vec<_>>();
                let failed = acted.len() < step.branches.len();
                undo.push(Undo::Branches(step, acted));
                if failed {
                    go_back(&mut segs, &undo);
                    return (segs, SagaStatus::Compensated);
                }
            }
            _ => {
                let (attempts, outcome) = action_attempts(step);
                let call = format!("{}:action", step.name);
                segs.extend(std::iter::repeat_n(Seg::One(call), attempts));
                match outcome {
                    Ok(()) => {
                        if step.kind == StepKind::Compensatable {
                            undo.push(Undo::Step(step));
                        }
                    }
                    Err(unknown) => {
                        match step.kind {
                            StepKind::Compensatable if unknown => undo.push(Undo::Step(step)),
                            StepKind::Compensatable => {}
                            StepKind::Pivot if !unknown => {}
                            // A pivot with unknown outcome, or a retriable step: no way back.
                            _ => return (segs, SagaStatus::Failed),
                        }
                        go_back(&mut segs, &undo);
                        return (segs, SagaStatus::Compensated);
                    }
                }
            }
        }
    }
    (segs, SagaStatus::Completed)
}

/// The model's calls and the engine's, each group's calls sorted in its place, so that the two
/// compare equal exactly when the engine made the calls the model says, in an allowed order.
fn canonical(segs: &[Seg], calls: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut want, mut got) = (Vec::new(), Vec::new());
    let mut at = 0;
    for seg in segs {
        let n = match seg {
            Seg::One(call) => {
                want.push(call.clone());
                1
            }
            Seg::Any(group) => {
                let mut sorted = group.clone();
                sorted.sort();
                want.extend(sorted);
                group.len()
            }
        };
        let mut part = calls[at.min(calls.len())..(at + n).min(calls.len())].to_vec();
        if matches!(seg, Seg::Any(_)) {
            part.sort();
        }
        got.extend(part);
        at += n;
    }
    got.extend(calls[at.min(calls.len())..].iter().cloned());
    (want, got)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, max_shrink_iters: 50, .. ProptestConfig::default() })]

    #[test]
    fn stage_shapes_match_the_model(steps in staged_case()) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (calls, status) = rt.block_on(async {
            let db = TempDb::new();
            let store = db.store().await;
            let journal = Journal::default();
            let registry = registry_of([scripted_saga("p", 1, &steps, &journal)]);
            let eng = RunningEngine::start(store.clone(), registry, test_config());
            let saga = eng.engine.start_saga("p", json!({})).await.unwrap();
            let done = wait_terminal(&store, saga.id).await;
            eng.stop().await;
            (journal.names(), done.status)
        });
        let (segs, want_status) = expected_stages(&steps);
        let (want, got) = canonical(&segs, &calls);
        prop_assert_eq!(status, want_status);
        prop_assert_eq!(got, want);
    }
}
