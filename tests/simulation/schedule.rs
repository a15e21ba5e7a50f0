//! One run of the simulation: the sagas its seed draws, started at times the seed draws, then a
//! schedule of faults and operator commands interleaved with running, then every saga driven
//! to its end (resumed if paused, retried or now and then aborted if `FAILED`) and checked.

use std::collections::BTreeMap;
use std::time::Duration;

use orchestrator::model::{Saga, SagaStatus};
use orchestrator::operations::{Cancelled, Report};
use orchestrator::store::SignalOutcome;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use saga_dsl::Phase;
use saga_test::{CrashPoint, SagaTest};
use serde_json::json;

use crate::invariants::{check, check_failed, takeovers, Facts};
use crate::ledger::Ledger;
use crate::shape::{registry, Shape, CALLBACK_TIMEOUT};

/// What a run did, summed over runs.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub runs: u64,
    pub sagas: u64,
    /// Faults that happened and commands the engine accepted, by kind: a crash counts once it
    /// stopped a running engine, a command once the engine took it.
    pub faults: BTreeMap<&'static str, u64>,
    /// Commands of the schedule the engine refused (or that had nothing to do), by kind.
    pub refused: BTreeMap<&'static str, u64>,
    /// Commands made at the end of a run to bring every saga to its end (resumes, retries and
    /// aborts, accepted or not): clean-up, not faults.
    pub cleanup: BTreeMap<&'static str, u64>,
    /// Crashes that stopped a running engine (planned at a write, or at once).
    pub crashes: u64,
    /// Calls whose saga's lease lapsed in flight and was taken over in-process.
    pub takeovers: u64,
    /// Times a saga was seen `FAILED` (and then retried or aborted).
    pub failed_seen: u64,
    /// Sagas flagged *needs attention* by a compensation that kept failing.
    pub attention: u64,
    /// Cancels sent once the point of no return had started (each checked not accepted).
    pub cancels_past_pivot: u64,
    /// How the sagas ended.
    pub ended: BTreeMap<String, u64>,
}

impl Tally {
    fn count(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
    }

    /// Counts a command of the schedule: a fault if the engine accepted it, else a refusal.
    fn command(&mut self, kind: &'static str, accepted: bool) {
        let map = if accepted {
            &mut self.faults
        } else {
            &mut self.refused
        };
        *map.entry(kind).or_default() += 1;
    }

    fn clean_up(&mut self, kind: &'static str) {
        *self.cleanup.entry(kind).or_default() += 1;
    }

    /// Adds another tally's counts.
    pub fn add(&mut self, other: &Tally) {
        self.runs += other.runs;
        self.sagas += other.sagas;
        self.crashes += other.crashes;
        self.failed_seen += other.failed_seen;
        self.takeovers += other.takeovers;
        self.attention += other.attention;
        self.cancels_past_pivot += other.cancels_past_pivot;
        for (mine, theirs) in [
            (&mut self.faults, &other.faults),
            (&mut self.refused, &other.refused),
            (&mut self.cleanup, &other.cleanup),
        ] {
            for (k, n) in theirs {
                *mine.entry(k).or_default() += n;
            }
        }
        for (k, n) in &other.ended {
            *self.ended.entry(k.clone()).or_default() += n;
        }
    }

    /// Faults that happened and commands accepted, in all.
    pub fn fault_total(&self) -> u64 {
        self.faults.values().sum()
    }
}

/// What a run leaves to compare with another run of its seed: each saga's status and the
/// calls that began, in order, and the writes made to the log.
pub type Trace = (Vec<(SagaStatus, Vec<String>)>, Vec<String>);

/// The longest a run may wait, in virtual time, for a saga to reach what it waits for.
const PATIENCE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many times a `FAILED` saga is retried before the run gives up on it: its scripts are
/// finite, so it completes long before.
const MAX_ROUNDS: usize = 20;

/// Runs seed `seed`; panics with every broken invariant.
pub fn simulate(seed: u64) -> (Tally, Trace) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally {
        runs: 1,
        ..Tally::default()
    };
    let shapes: Vec<Shape> = (0..rng.gen_range(3..=8))
        .map(|i| Shape::draw(&mut rng, i))
        .collect();
    tally.sagas = shapes.len() as u64;
    let ledger = Ledger::default();
    let mut t = SagaTest::new(registry(&shapes, &ledger))
        .seeded(seed)
        .waiting_at_most(PATIENCE);
    for shape in &shapes {
        for unit in shape.units() {
            t.script(&unit.name, unit.action.clone());
            t.script_compensation(&unit.name, unit.compensation.clone());
        }
    }
    let mut ids = Vec::new();
    for shape in &shapes {
        let input = json!({"seed": seed});
        let id = match shape.start_delay {
            Some(delay) => t.start_after(&shape.name, input, delay),
            None => t.start(&shape.name, input),
        };
        ids.push(id);
        if rng.gen_bool(0.3) {
            t.advance(Duration::from_millis(rng.gen_range(1..=5_000)));
        }
    }
    let mut facts = vec![Facts::default(); shapes.len()];
    let mut failures = Vec::new();
    let mut plans = 0u64;

    for _ in 0..rng.gen_range(4..=14) {
        let j = rng.gen_range(0..shapes.len());
        let id = ids[j];
        let roll = rng.gen_range(0..108);
        if std::env::var_os("SAGA_SIM_TRACE").is_some() {
            eprintln!(
                "simulation: at {} ({} writes), command {roll} on {}",
                t.now_ms(),
                t.writes().len(),
                shapes[j].name
            );
        }
        match roll {
            0..=29 => {
                // Runs saga j a few calls further (or until it rests).
                let target = attempts(&t.read(id).saga) + rng.gen_range(1..=4);
                let seen = t.run_until(id, move |s| {
                    s.status.is_terminal()
                        || s.status == SagaStatus::Paused
                        || attempts(s) >= target
                });
                if seen.status == SagaStatus::Failed {
                    tally.failed_seen += 1;
                    if let Err(e) = check_failed(&shapes[j], &seen) {
                        failures.push(format!("{} ({id}): {e}", shapes[j].name));
                    }
                }
            }
            30..=44 => {
                let ahead = rng.gen_range(1..=25);
                let at = t.writes().len() + ahead;
                let point = if rng.gen_bool(0.5) {
                    CrashPoint::Before(at)
                } else {
                    CrashPoint::After(at)
                };
                // Counted at the end of the run, if reached: a later plan replaces this one.
                plans += 1;
                t = t.crash_at(point);
            }
            45..=52 => {
                let before = t.crashes();
                t.crash();
                if t.crashes() > before {
                    tally.count("crash now");
                } else {
                    // No engine ran (the last one crashed and nothing has run since).
                    *tally.refused.entry("crash now").or_default() += 1;
                }
            }
            53..=66 => {
                let by = match rng.gen_range(0..10) {
                    0..=2 => Duration::from_millis(rng.gen_range(1..=1_000)),
                    3..=5 => Duration::from_secs(rng.gen_range(1..=120)),
                    6..=8 => Duration::from_secs(rng.gen_range(120..=7_200)),
                    // Past the kit's lease: the leases of sagas in flight lapse.
                    _ => Duration::from_secs(rng.gen_range(4 * 86_400..=5 * 86_400)),
                };
                t.advance(by);
                tally.count("clock jump");
            }
            67..=75 => {
                // Now and then past the point of no return, where a cancel must be refused.
                let past = if shapes[j].has_pivot() && rng.gen_bool(0.7) {
                    let seen = t.run_until(id, |s| {
                        s.pivot_started || s.status.is_terminal() || s.status == SagaStatus::Paused
                    });
                    seen.pivot_started
                        .then_some((seen.status, seen.pivot_reached))
                } else {
                    None
                };
                facts[j].cancel_sent = true;
                let answer = t.cancel(id);
                if let Some((status, reached)) = past {
                    tally.cancels_past_pivot += 1;
                    // Once the pivot started a cancel is refused; if the pivot then failed, a
                    // saga going back may answer that it already compensates.
                    let fine = match &answer {
                        Err(e) => e.code() == "conflict",
                        Ok(Cancelled::AlreadyCompensating) => !reached,
                        Ok(Cancelled::Accepted) => false,
                    };
                    if !fine {
                        failures.push(format!(
                            "{} ({id}): a cancel once the point of no return started (the \
                             saga {status}, the pivot succeeded: {reached}) was answered \
                             {answer:?}",
                            shapes[j].name
                        ));
                    }
                }
                let accepted = matches!(answer, Ok(Cancelled::Accepted));
                facts[j].cancel_accepted |= accepted;
                // Already compensating: nothing injected, counted with the refusals.
                tally.command("cancel", accepted);
            }
            76..=81 => {
                if shapes[j].waits_for_signal() {
                    let answer = t.signal(id, "go", json!({"by": "simulation"}));
                    // Only a signal recorded now is new to the saga.
                    let received = matches!(answer, Ok(SignalOutcome::Received));
                    tally.command("signal", received);
                }
            }
            82..=89 => {
                let answer = t.pause(id, "simulated pause");
                tally.command("pause", answer.is_ok());
                if answer.is_ok() && rng.gen_bool(0.5) {
                    // A paused saga starts nothing, whatever time passes.
                    let seen = t.run_until(id, |s| {
                        s.status.is_terminal() || s.status == SagaStatus::Paused
                    });
                    if seen.status == SagaStatus::Paused {
                        let before = t.read(id);
                        t.advance(Duration::from_secs(rng.gen_range(1..=7_200)));
                        let after = t.read(id);
                        // A call written ahead before the pause was in flight, as the log
                        // sees it: a process whose lease lapsed (a clock jump) may make it
                        // late, as a stalled process would.
                        let in_flight = before
                            .attempts
                            .iter()
                            .filter(|a| a.outcome.is_none())
                            .count();
                        let calls = after.calls.len() - before.calls.len();
                        if after.attempts.len() != before.attempts.len()
                            || calls > in_flight
                            || after.status() != SagaStatus::Paused
                        {
                            failures.push(format!(
                                "{} ({id}): paused, it went on to {} with {} more attempts \
                                 and {calls} more calls ({in_flight} in flight)",
                                shapes[j].name,
                                after.status(),
                                after.attempts.len() - before.attempts.len(),
                            ));
                        }
                    }
                }
            }
            90..=93 => {
                facts[j].resumes_sent += 1;
                let answer = t.resume(id, "simulated resume");
                tally.command("resume", answer.is_ok());
            }
            94..=97 => {
                facts[j].retries_sent += 1;
                let answer = t.retry(id);
                tally.command("retry", answer.is_ok());
            }
            100..=107 => {
                if shapes[j].callbacks().next().is_some() {
                    // Waits for the call first, now and then.
                    if rng.gen_bool(0.5) {
                        let reported = facts[j].reported.clone();
                        t.run_until(id, move |s| {
                            s.status.is_terminal()
                                || s.status == SagaStatus::Paused
                                || awaits_task(s, &reported)
                        });
                    }
                    let late = rng.gen_bool(0.3);
                    if let Some(taken) =
                        answer(&mut t, &ledger, &shapes[j], (id, None), late, &mut facts[j])
                    {
                        let kind = if late {
                            "late task report"
                        } else {
                            "task report"
                        };
                        tally.command(kind, taken);
                    }
                }
            }
            _ => {
                facts[j].abort_sent = true;
                let answer = t.abort(id, "simulated abort");
                facts[j].abort_accepted |= answer.is_ok();
                tally.command("abort", answer.is_ok());
            }
        }
    }

    // Every saga to its end.
    let mut trace = Vec::new();
    for (j, &id) in ids.iter().enumerate() {
        let shape = &shapes[j];
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(
                rounds <= MAX_ROUNDS,
                "{} ({id}) did not end after {MAX_ROUNDS} rounds of resume and retry",
                shape.name
            );
            let reported = facts[j].reported.clone();
            let seen = t.run_until(id, move |s| {
                s.status.is_terminal()
                    || s.status == SagaStatus::Paused
                    || awaits_task(s, &reported)
            });
            if let Some(waiting) = awaited_task(&seen, &facts[j].reported) {
                answer(
                    &mut t,
                    &ledger,
                    shape,
                    (id, Some(waiting)),
                    false,
                    &mut facts[j],
                );
                tally.clean_up("task report");
                continue;
            }
            match seen.status {
                SagaStatus::Paused => {
                    facts[j].resumes_sent += 1;
                    if let Err(e) = t.resume(id, "the run ends") {
                        refused_unless_done(&mut t, id, SagaStatus::Paused, &e, shape);
                    }
                    tally.clean_up("resume");
                }
                SagaStatus::Failed => {
                    tally.failed_seen += 1;
                    if let Err(e) = check_failed(shape, &seen) {
                        failures.push(format!("{} ({id}): {e}", shape.name));
                    }
                    if rng.gen_bool(0.2) {
                        facts[j].abort_sent = true;
                        match t.abort(id, "the run ends") {
                            Ok(_) => facts[j].abort_accepted = true,
                            Err(e) => {
                                refused_unless_done(&mut t, id, SagaStatus::Failed, &e, shape)
                            }
                        }
                        tally.clean_up("abort");
                    } else {
                        facts[j].retries_sent += 1;
                        if let Err(e) = t.retry(id) {
                            refused_unless_done(&mut t, id, SagaStatus::Failed, &e, shape);
                        }
                        tally.clean_up("retry");
                    }
                }
                _ => break,
            }
        }
        let ended = t.read(id);
        *tally.ended.entry(ended.status().to_string()).or_default() += 1;
        tally.takeovers += takeovers(&ended);
        tally.attention += u64::from(ended.event_kinds().contains(&"saga.needs_attention"));
        for broken in check(shape, &ended, &ledger, &facts[j]) {
            failures.push(format!("{} ({id}): {broken}", shape.name));
        }
        trace.push((ended.status(), ended.calls.clone()));
        if !failures.is_empty() {
            failures.push(format!(
                "{} ({id}) calls: {:?}\nledger: {:?}\nattempts: {:?}\nevents: {:?}",
                shape.name,
                ended.calls,
                ledger
                    .calls_of(id)
                    .iter()
                    .map(|c| format!(
                        "{}:{}#{}",
                        c.step,
                        if c.phase == Phase::Action {
                            "action"
                        } else {
                            "compensation"
                        },
                        c.attempt
                    ))
                    .collect::<Vec<_>>(),
                ended
                    .attempts
                    .iter()
                    .map(|a| format!(
                        "{}:{}#{}={:?} {:?} by {} at {}..{:?}",
                        a.step,
                        a.phase,
                        a.attempt,
                        a.outcome,
                        a.error,
                        a.worker,
                        a.started_at,
                        a.ended_at
                    ))
                    .collect::<Vec<_>>(),
                ended
                    .events
                    .iter()
                    .map(|e| format!("{} {:?} at {}", e.kind, e.step, e.at))
                    .collect::<Vec<_>>()
            ));
            break;
        }
    }
    tally.crashes = t.crashes() as u64;
    // Every crash the kit counts is a planned one that was reached, or one made at once.
    let now = tally.faults.get("crash now").copied().unwrap_or(0);
    let planned = tally.crashes - now;
    if planned > 0 {
        tally.faults.insert("crash at a planned write", planned);
    }
    if plans > planned {
        tally.refused.insert(
            "crash at a planned write (replaced or not reached)",
            plans - planned,
        );
    }
    assert!(
        failures.is_empty(),
        "broken invariants:\n{}\nshapes: {shapes:?}",
        failures.join("\n")
    );
    let writes = t.writes();
    (tally, (trace, writes))
}

/// Every attempt a saga's record counts, of actions and compensations.
fn attempts(saga: &Saga) -> u32 {
    saga.steps
        .iter()
        .map(|s| s.action.attempts + s.compensation.attempts)
        .sum()
}

/// A command the run needs refused: fine only if the saga has left `from` (the kit makes a
/// command again when a crash cut off its answer, and the first may have taken effect).
fn refused_unless_done(
    t: &mut SagaTest,
    id: uuid::Uuid,
    from: SagaStatus,
    error: &dyn std::fmt::Display,
    shape: &Shape,
) {
    let now = t.read(id).status();
    assert!(
        now != from,
        "{} ({id}) is still {from}, the command refused: {error}",
        shape.name
    );
}

/// Whether a call of saga `saga` waits for its participant's callback, and its participant
/// has not reported for it yet (`reported`: step and attempt): the engine takes a report in
/// its own time, and the call shows as waiting until then.
fn awaits_task(saga: &Saga, reported: &[(String, u32)]) -> bool {
    awaited_task(saga, reported).is_some()
}

/// The step and attempt of saga `saga`'s call that waits for its participant's callback, if
/// its participant has not reported for it yet.
fn awaited_task(saga: &Saga, reported: &[(String, u32)]) -> Option<(String, u32)> {
    if saga.status != SagaStatus::Running {
        return None;
    }
    saga.steps
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.awaited_task()?)))
        .find(|waiting| !reported.contains(waiting))
}

/// Reports for a task handed over by saga `id`'s step completed by callback, as its
/// participant would: it books its effect, then completes the task with the token it was
/// handed. The task is `waiting`'s (a step and attempt), or else the last one handed over,
/// which may be a call the engine has gone past. `late`: the report arrives only once the
/// call's timeout has passed, when the engine has counted the attempt's outcome unknown and
/// may have made the call again. Returns whether the engine took the report, or `None` if no
/// task was handed over.
fn answer(
    t: &mut SagaTest,
    ledger: &Ledger,
    shape: &Shape,
    (id, waiting): (uuid::Uuid, Option<(String, u32)>),
    late: bool,
    facts: &mut Facts,
) -> Option<bool> {
    let attempt = waiting.as_ref().map(|(_, attempt)| *attempt);
    let unit = shape
        .callbacks()
        .filter(|u| waiting.as_ref().is_none_or(|(step, _)| *step == u.name))
        .find(|u| ledger.handed(id, &u.name, attempt).is_some())?;
    let (attempt, token) = ledger.handed(id, &unit.name, attempt)?;
    let report = match ledger.settle(id, &unit.name, unit.amount) {
        Some(output) => Report::Complete(output),
        None => Report::Fail {
            error: "undone before it was done".to_owned(),
            retryable: false,
        },
    };
    if late {
        t.advance(CALLBACK_TIMEOUT + Duration::from_secs(1));
    }
    facts.reported.push((unit.name.clone(), attempt));
    let taken = t.report_task(&token, report).is_ok();
    if taken {
        facts.reports_taken.push((unit.name.clone(), attempt));
    }
    Some(taken)
}
