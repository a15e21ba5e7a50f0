//! The kit against small sagas of its own: the virtual clock, scripted attempts, crashes and
//! the exploration of crash points.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orchestrator::SagaStatus;
use saga_dsl::{Registry, RetryPolicy, SagaDefinition, Step, StepContext, StepError};
use saga_test::{explore, Attempt, CrashPoint, SagaTest};
use serde_json::{json, Value};

/// A bank whose transfers are idempotent on the key they carry, as a real one's would be.
#[derive(Debug, Clone, Default)]
struct Bank {
    /// Every effect applied, by idempotency key: +amount for a hold, -amount for its release.
    applied: Arc<Mutex<BTreeMap<String, i64>>>,
    /// Every call received, duplicates included.
    calls: Arc<Mutex<Vec<String>>>,
}

impl Bank {
    fn apply(&self, key: String, amount: i64, what: &str) {
        self.calls.lock().unwrap().push(what.to_owned());
        self.applied.lock().unwrap().entry(key).or_insert(amount);
    }

    fn balance(&self) -> i64 {
        self.applied.lock().unwrap().values().sum()
    }
}

fn registry(bank: &Bank) -> Registry {
    let hold = {
        let bank = bank.clone();
        move |ctx: StepContext| {
            let bank = bank.clone();
            async move {
                bank.apply(ctx.idempotency_key().to_string(), 10, "hold");
                Ok::<_, StepError>(json!({"held": 10}))
            }
        }
    };
    let release = {
        let bank = bank.clone();
        move |ctx: StepContext| {
            let bank = bank.clone();
            async move {
                let held: Option<Value> = ctx.action_output()?;
                // Without the hold's output (its outcome unknown), the bank's own record of
                // the hold says what to release.
                let (amount, what) = match held {
                    Some(h) => (h["held"].as_i64().unwrap_or(0), "release"),
                    None => (10, "release without the hold's output"),
                };
                bank.apply(ctx.idempotency_key().to_string(), -amount, what);
                Ok::<_, StepError>(())
            }
        }
    };
    let ship = |_ctx: StepContext| async move { Ok::<_, StepError>(json!("shipped")) };
    let def = SagaDefinition::builder("transfer", 1)
        .step(Step::compensatable("hold", hold, release))
        .step(
            Step::pivot("ship", ship).retry(
                RetryPolicy::new()
                    .with_max_attempts(3)
                    .with_initial_delay(Duration::from_secs(3600))
                    .with_max_delay(Duration::from_secs(3600))
                    .with_jitter(false),
            ),
        )
        .build()
        .unwrap();
    Registry::new().with(def).unwrap()
}

#[test]
fn an_hour_of_retry_delays_passes_at_once_on_the_virtual_clock() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    t.script("ship", [Attempt::Retryable, Attempt::Retryable]);
    let began = Instant::now();
    let start = t.now_ms();
    let id = t.start("transfer", json!({}));
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Completed);
    assert_eq!(ended.attempts_of("ship", "action").count(), 3);
    // Two waits of an hour each passed on the clock...
    assert!(t.now_ms() - start >= 7_200_000, "{} ms", t.now_ms() - start);
    // ...and not on the wall.
    assert!(began.elapsed() < Duration::from_secs(20));
    assert_eq!(bank.balance(), 10);
}

#[test]
fn an_action_whose_every_outcome_is_unknown_is_compensated_without_its_output() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    // The default policy's five attempts, each applied by the bank and then timed out.
    t.script("hold", [Attempt::Unknown; 5]);
    let id = t.start("transfer", json!({}));
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Compensated);
    let mut calls = vec!["hold:action"; 5];
    calls.push("hold:compensation");
    assert_eq!(ended.calls, calls);
    assert!(ended
        .attempts_of("hold", "action")
        .all(|a| a.outcome.as_deref() == Some("timed_out")));
    // Five calls with one key: one hold, released by the compensation, which had no output.
    let bank_calls = bank.calls.lock().unwrap().clone();
    assert_eq!(bank_calls.len(), 6);
    assert_eq!(bank_calls[5], "release without the hold's output");
    assert_eq!(bank.balance(), 0);
}

#[test]
fn a_permanent_failure_compensates_the_steps_before_it() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    t.script("ship", [Attempt::Permanent]);
    let id = t.start("transfer", json!({}));
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Compensated);
    assert_eq!(
        ended.calls,
        ["hold:action", "ship:action", "hold:compensation"]
    );
    assert_eq!(bank.balance(), 0);
    assert!(ended.event_kinds().contains(&"saga.compensated"));
}

#[test]
fn a_crash_between_the_calls_resumes_on_the_same_log() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    t.script("ship", [Attempt::RetryAfter(Duration::from_secs(60))]);
    let id = t.start("transfer", json!({}));
    t.run_until(id, |s| {
        s.steps[1].action.attempts == 1 && s.next_run_at.is_some()
    });
    t.crash();
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Completed);
    assert_eq!(t.lifetimes(), 2);
    assert_eq!(bank.calls.lock().unwrap().as_slice(), ["hold"]);
}

#[test]
fn only_crashes_that_stopped_an_engine_are_counted() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    t.crash();
    assert_eq!(t.crashes(), 0, "no engine ran yet");
    let id = t.start("transfer", json!({}));
    let next = t.writes().len() + 1;
    // The first plan is replaced before it is reached.
    t = t
        .crash_at(CrashPoint::After(next + 1_000))
        .crash_at(CrashPoint::After(next));
    assert_eq!(t.planned_crash(), Some(CrashPoint::After(next)));
    assert_eq!(t.run(id).status(), SagaStatus::Completed);
    assert_eq!((t.crashes(), t.planned_crash()), (1, None));
    // Planned beyond the run's writes: never reached, never counted.
    let beyond = t.writes().len() + 1_000;
    t = t.crash_at(CrashPoint::After(beyond));
    t.crash();
    t.crash();
    assert_eq!(t.crashes(), 2, "only the first stopped a running engine");
    assert_eq!(t.planned_crash(), Some(CrashPoint::After(beyond)));
}

#[test]
fn every_crash_point_keeps_the_bank_straight() {
    let report = explore(|| {
        let bank = Bank::default();
        (registry(&bank), bank)
    })
    .start("transfer", json!({}))
    .script("ship", [Attempt::Permanent; 3])
    .check(|ended, bank| {
        assert_eq!(ended.status(), SagaStatus::Compensated);
        assert_eq!(bank.balance(), 0, "net zero once compensated");
    })
    .run();
    assert!(report.writes >= 3, "{report:?}");
    assert_eq!(report.runs, 1 + 2 * report.writes);
    eprintln!("{report:?}");
}

/// Found by the kit: on the virtual clock every call of a fast saga starts in the same
/// millisecond, and the attempt log, sorted by start time, put a compensation before the
/// action that failed after it (ties went by step and phase). It now keeps the order attempts
/// started in.
#[test]
fn attempts_started_in_the_same_millisecond_keep_their_order_in_the_log() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    t.script("ship", [Attempt::Retryable, Attempt::Permanent]);
    let id = t.start("transfer", json!({}));
    let ended = t.run(id);
    let logged: Vec<String> = ended
        .attempts
        .iter()
        .map(|a| format!("{}:{}", a.step, a.phase))
        .collect();
    assert_eq!(
        logged,
        [
            "hold:action",
            "ship:action",
            "ship:action",
            "hold:compensation"
        ]
    );
    assert_eq!(logged, ended.calls);
    // The tie that used to misorder them: the failed action and the compensation after it
    // started in the same millisecond of the virtual clock.
    assert_eq!(ended.attempts[2].started_at, ended.attempts[3].started_at);
}

/// A bank that applies every call, duplicates included: what the exploration must catch.
fn forgetful_registry(calls: &Arc<Mutex<i64>>) -> Registry {
    let hold = {
        let calls = calls.clone();
        move |_ctx: StepContext| {
            let calls = calls.clone();
            async move {
                *calls.lock().unwrap() += 10;
                Ok::<_, StepError>(())
            }
        }
    };
    let def = SagaDefinition::builder("transfer", 1)
        .step(Step::pivot("hold", hold))
        .build()
        .unwrap();
    Registry::new().with(def).unwrap()
}

#[test]
fn a_participant_that_does_not_dedupe_is_caught_and_its_crash_point_replays() {
    let explore_it = || {
        explore(|| {
            let held = Arc::new(Mutex::new(0));
            (forgetful_registry(&held), held)
        })
        .start("transfer", json!({}))
        .check(|_ended, held| assert_eq!(*held.lock().unwrap(), 10, "held twice"))
    };
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| explore_it().run()))
        .expect_err("a crash between the hold and its result holds twice");
    let message = failure.downcast_ref::<String>().unwrap().clone();
    assert!(message.contains("just before write"), "{message}");
    assert!(message.contains("held twice"), "{message}");
    // The case it names fails again, alone.
    let point: saga_test::CrashPoint = message
        .split("SAGA_TEST_CRASH=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        explore_it().only(0, point).run()
    }));
    assert!(again.is_err(), "the case at {point} passed when replayed");
}

#[test]
fn a_hung_call_stays_unknown_when_a_clock_jump_passes_its_timeout() {
    let bank = Bank::default();
    let mut t = SagaTest::new(registry(&bank));
    t.script("ship", [Attempt::Hang]);
    let id = t.start("transfer", json!({}));
    t.run_until(id, |s| s.steps[1].action.attempts == 1);
    // The call begins (its timers are set), then the clock jumps past its timeout at once
    // (and not past the lease, which would hand the saga over).
    t.advance(Duration::from_millis(1));
    t.advance(saga_dsl::DEFAULT_ATTEMPT_TIMEOUT * 2);
    let ended = t.run(id);
    let first = ended.attempts_of("ship", "action").next().unwrap();
    assert_eq!(first.outcome.as_deref(), Some("timed_out"), "{first:?}");
    assert_eq!(ended.status(), SagaStatus::Completed);
}
