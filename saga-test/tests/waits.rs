//! The virtual clock against the waits of a saga: durable sleeps, signals and their timeouts,
//! scheduled starts; and the seeds that order parallel branches' results.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use orchestrator::operations::{OperationError, Report};
use orchestrator::SagaStatus;
use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};
use saga_test::{explore, SagaTest};
use serde_json::json;

async fn ok(_: StepContext) -> Result<(), StepError> {
    Ok(())
}

fn waits() -> Registry {
    let def = SagaDefinition::builder("waits", 1)
        .step(Step::compensatable("reserve", ok, ok))
        .step(Step::sleep("cool_off", Duration::from_secs(7 * 24 * 3600)))
        .step(Step::signal("approval", "approved").signal_timeout(Duration::from_secs(3600)))
        .step(Step::pivot("ship", ok))
        .build()
        .unwrap();
    Registry::new().with(def).unwrap()
}

#[test]
fn a_week_of_sleep_and_an_hour_of_waiting_for_a_signal_pass_at_once() {
    let mut t = SagaTest::new(waits()).waiting_at_most(Duration::from_secs(30 * 24 * 3600));
    let began = Instant::now();
    let start = t.now_ms();
    let id = t.start("waits", json!({}));
    let ended = t.run(id);
    // Nobody approved: the wait timed out and the saga went back.
    assert_eq!(ended.status(), SagaStatus::Compensated);
    assert_eq!(ended.calls, ["reserve:action", "reserve:compensation"]);
    let waited = t.now_ms() - start;
    assert!(waited >= (7 * 24 + 1) * 3_600_000, "{waited} ms");
    assert!(began.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_signal_sent_while_the_saga_waits_lets_it_go_on() {
    let mut t = SagaTest::new(waits()).waiting_at_most(Duration::from_secs(8 * 24 * 3600));
    let id = t.start("waits", json!({}));
    let waiting = t.run_until(id, |s| s.waiting_for.as_deref() == Some("signal:approved"));
    assert_eq!(waiting.status, SagaStatus::Running);
    t.signal(id, "approved", json!({"by": "ada"})).unwrap();
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Completed);
    assert_eq!(ended.step_output("approval"), Some(&json!({"by": "ada"})));
}

#[test]
fn a_scheduled_start_runs_at_its_time_on_the_virtual_clock() {
    let mut t = SagaTest::new(waits()).waiting_at_most(Duration::from_secs(9 * 24 * 3600));
    let start = t.now_ms();
    let id = t.start_after("waits", json!({}), Duration::from_secs(24 * 3600));
    let ended = t.run(id);
    let first = ended.attempts.first().unwrap().started_at;
    assert!(
        first >= start + 24 * 3_600_000,
        "started {} ms in",
        first - start
    );
}

fn fan_out() -> Registry {
    let def = SagaDefinition::builder("fan_out", 1)
        .step(Step::parallel(
            "book",
            ["hotel", "flight", "car", "train"].map(|b| Step::compensatable(b, ok, ok)),
        ))
        .build()
        .unwrap();
    Registry::new().with(def).unwrap()
}

#[test]
fn seeds_change_the_order_of_parallel_branches_and_a_seed_repeats_its_own() {
    let order = |seed: u64| {
        let mut t = SagaTest::new(fan_out()).seeded(seed);
        let id = t.start("fan_out", json!({}));
        t.run(id).calls
    };
    let orders: BTreeSet<Vec<String>> = (0..8).map(order).collect();
    assert!(orders.len() > 1, "eight seeds gave one order: {orders:?}");
    assert_eq!(order(3), order(3));
}

#[test]
fn every_crash_point_of_a_parallel_group_under_several_seeds() {
    let report = explore(|| (fan_out(), ()))
        .start("fan_out", json!({}))
        .seeds(0..3)
        .check(|ended, ()| assert_eq!(ended.status(), SagaStatus::Completed))
        .run();
    assert_eq!(report.seeds, 3);
    assert_eq!(report.runs, 3 + 2 * report.writes);
}

/// `callback`: `charge` completed by its participant's callback within an hour, then `ship`.
/// The fake participant keeps every token it is handed.
fn callback(tokens: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> Registry {
    let charge = move |ctx: StepContext| {
        let tokens = tokens.clone();
        async move {
            let task = ctx.task().expect("a token");
            tokens.lock().unwrap().push(task.token().to_owned());
            Ok::<_, StepError>(json!({"accepted": true}))
        }
    };
    let def = SagaDefinition::builder("callback", 1)
        .step(
            Step::compensatable("charge", charge, ok)
                .completed_by_callback()
                .timeout(Duration::from_secs(3600)),
        )
        .step(Step::pivot("ship", ok))
        .build()
        .unwrap();
    Registry::new().with(def).unwrap()
}

#[test]
fn a_step_completed_by_callback_waits_for_its_report_and_times_out_on_the_virtual_clock() {
    let tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut t =
        SagaTest::new(callback(tokens.clone())).waiting_at_most(Duration::from_secs(4 * 3600));
    let id = t.start("callback", json!({}));
    let waiting = t.run_until(id, |s| s.waiting_for.as_deref() == Some("task"));
    assert_eq!(waiting.status, SagaStatus::Running);
    // Nobody reports for an hour: the outcome is unknown, and the call is made again.
    t.advance(Duration::from_secs(3601));
    t.run_until(id, |s| {
        s.steps[0].action.attempts == 2 && s.waiting_for.as_deref() == Some("task")
    });
    let first = tokens.lock().unwrap()[0].clone();
    let stale = t.report_task(&first, Report::Complete(json!("late")));
    assert!(
        matches!(stale, Err(OperationError::Conflict(_))),
        "{stale:?}"
    );
    let second = tokens.lock().unwrap()[1].clone();
    t.report_task(&second, Report::Complete(json!({"charge": "c-1"})))
        .unwrap();
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Completed);
    assert_eq!(ended.step_output("charge"), Some(&json!({"charge": "c-1"})));
    // And by step name, without the token.
    let id = t.start("callback", json!({}));
    t.run_until(id, |s| s.waiting_for.as_deref() == Some("task"));
    t.complete_task(id, "charge", json!(2)).unwrap();
    assert_eq!(t.run(id).status(), SagaStatus::Completed);
    // A report is a write to the log, with crash points of its own.
    assert!(
        t.writes()
            .iter()
            .any(|w| w.starts_with("report for the callback of row 0")),
        "{:?}",
        t.writes()
    );
}

/// A card service that charges once its caller's call is answered by callback: `charge` hands
/// it the call's key and returns at once; the service charges when it reports back.
#[derive(Default)]
struct CardService {
    /// The keys handed to it, in order (one per attempt).
    handed: std::sync::Mutex<Vec<String>>,
    /// What it did, each effect with its key: `charge KEY`, `refund KEY`.
    done: std::sync::Mutex<BTreeSet<String>>,
}

impl CardService {
    /// Charges for the last call it was handed, once per key, and answers with the charge.
    fn settle(&self) -> Result<serde_json::Value, StepError> {
        let key = self.handed.lock().unwrap().last().cloned().expect("a call");
        self.done.lock().unwrap().insert(format!("charge {key}"));
        Ok(json!({ "charge": key }))
    }

    fn done(&self) -> Vec<String> {
        self.done.lock().unwrap().iter().cloned().collect()
    }
}

/// `pay_then_book`: `charge` completed by the card service's callback, then `book`, refused
/// when the input says so, then the pivot `confirm`.
fn pay_then_book(card: std::sync::Arc<CardService>) -> Registry {
    let handed = card.clone();
    let charge = move |ctx: StepContext| {
        let card = handed.clone();
        async move {
            assert!(
                ctx.task().is_some(),
                "a call completed by callback has a token"
            );
            card.handed
                .lock()
                .unwrap()
                .push(ctx.idempotency_key().to_string());
            Ok::<_, StepError>(json!({"accepted": true}))
        }
    };
    let refund = move |ctx: StepContext| {
        let card = card.clone();
        async move {
            // What the callback answered, handed to the compensation.
            let charged: serde_json::Value = ctx.action_output()?.expect("the charge's output");
            let key = charged["charge"].as_str().expect("a charge key").to_owned();
            card.done.lock().unwrap().insert(format!("refund {key}"));
            Ok::<_, StepError>(())
        }
    };
    let book = |ctx: StepContext| async move {
        if ctx.raw_input()["full"] == json!(true) {
            return Err(StepError::permanent("no seat left"));
        }
        Ok(())
    };
    let def = SagaDefinition::builder("pay_then_book", 1)
        .step(
            Step::compensatable("charge", charge, refund)
                .completed_by_callback()
                .timeout(Duration::from_secs(3600)),
        )
        .step(Step::compensatable("book", book, ok))
        .step(Step::pivot("confirm", ok))
        .build()
        .unwrap();
    Registry::new().with(def).unwrap()
}

fn card_world() -> (Registry, std::sync::Arc<CardService>) {
    let card = std::sync::Arc::new(CardService::default());
    (pay_then_book(card.clone()), card)
}

#[test]
fn every_crash_point_of_a_call_completed_by_callback_charges_once() {
    let report = explore(card_world)
        .start("pay_then_book", json!({}))
        .answer_task("charge", |card: &std::sync::Arc<CardService>| card.settle())
        .check(|ended, card| {
            assert_eq!(ended.status(), SagaStatus::Completed);
            // One key for every attempt of the call, and one charge for it.
            let keys: BTreeSet<_> = card.handed.lock().unwrap().iter().cloned().collect();
            assert_eq!(keys.len(), 1, "{keys:?}");
            let key = keys.first().unwrap();
            assert_eq!(card.done(), [format!("charge {key}")]);
            assert_eq!(ended.step_output("charge"), Some(&json!({"charge": key})));
        })
        .run();
    // The report is a write of its own, explored like the engine's.
    assert!(report.writes >= 4, "{report:?}");
    assert_eq!(report.runs, 1 + 2 * report.writes);
}

#[test]
fn every_crash_point_of_a_refused_booking_refunds_what_the_callback_charged() {
    explore(card_world)
        .start("pay_then_book", json!({"full": true}))
        .answer_task("charge", |card: &std::sync::Arc<CardService>| card.settle())
        .check(|ended, card| {
            assert_eq!(ended.status(), SagaStatus::Compensated);
            let key = card.handed.lock().unwrap()[0].clone();
            // Net zero, the refund handed the callback's output.
            assert_eq!(
                card.done(),
                [format!("charge {key}"), format!("refund {key}")]
            );
        })
        .run();
}

#[test]
fn a_participant_that_fails_the_call_by_callback_is_retried_then_compensated() {
    explore(card_world)
        .start("pay_then_book", json!({}))
        // The first call's report says a retry may succeed; a later one refuses the card.
        .answer_task("charge", |card: &std::sync::Arc<CardService>| {
            match card.handed.lock().unwrap().len() {
                1 => Err(StepError::retryable("the issuer is busy")),
                _ => Err(StepError::permanent("card declined")),
            }
        })
        .check(|ended, card| {
            assert_eq!(ended.status(), SagaStatus::Compensated);
            assert!(card.done().is_empty(), "{:?}", card.done());
            let errors: Vec<_> = ended
                .attempts
                .iter()
                .filter_map(|a| a.error.as_deref())
                .collect();
            // The busy answer's attempt may have been cut off by the crash instead.
            assert_eq!(errors.last(), Some(&"card declined"), "{errors:?}");
        })
        .run();
}

#[test]
#[should_panic(expected = "which this exploration does not answer")]
fn an_exploration_that_does_not_answer_a_callback_says_so() {
    explore(card_world).start("pay_then_book", json!({})).run();
}
