//! The invariants of SPEC §2, checked on one saga once it has ended, from its step log (steps,
//! attempts), the kit's record of the calls that began, and the ledger's books.

use std::collections::{BTreeMap, BTreeSet};

use orchestrator::model::{Saga, SagaStatus, StepStatus};
use saga_dsl::{branch_idempotency_key, idempotency_key, Phase, StepKind};
use saga_test::Ended;
use uuid::Uuid;

use crate::ledger::Ledger;
use crate::shape::{attention_after, Shape, Unit, ACTION_ATTEMPTS};

/// What the schedule did to a saga, which its end must be consistent with.
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// An abort was sent.
    pub abort_sent: bool,
    /// An abort was answered as accepted (a crash may cut an accepted one's answer off: the
    /// kit then sends it again, and the saga having ended, it is refused).
    pub abort_accepted: bool,
    /// A cancel was sent.
    pub cancel_sent: bool,
    /// A cancel was answered as accepted.
    pub cancel_accepted: bool,
    /// Operator retries sent (each may give a `FAILED` saga's failed step one more attempt).
    pub retries_sent: u32,
    /// Resumes sent (a resume gives a step whose retries ran out a fresh budget).
    pub resumes_sent: u32,
    /// Reports sent for calls completed by callback: step and attempt.
    pub reported: Vec<(String, u32)>,
    /// Reports of calls completed by callback the engine took: step and attempt.
    pub reports_taken: Vec<(String, u32)>,
}

/// Outcomes of an attempt the engine records as a failure (`abandoned` is an operator taking
/// the call over, not a failure).
const FAILED_OUTCOMES: [&str; 4] = ["retryable", "timed_out", "interrupted", "failed"];

/// Whether the lease of the saga lapsed while `step`'s `phase` was in flight and the same
/// process took the saga over: an attempt interrupted, and the next made by the same worker
/// (each process lifetime has a worker id of its own, so a crash shows a new one). This
/// happens when a clock jump outlasts the lease before a heartbeat renews it, as when a process
/// stalls that long; the first call is not stopped and runs beside the next, with the same key.
/// A scripted participant then may answer the two in an order no real one would (a permanent
/// failure for a key whose effect it applied), so the ledger's books of that unit are not held
/// to the net-zero rule; the engine's side of it (the log) still is.
pub fn lapsed(ended: &Ended, step: &str, phase: &str) -> bool {
    ended.attempts_of(step, phase).any(|a| {
        a.outcome.as_deref() == Some("interrupted")
            && ended
                .attempts_of(step, phase)
                .any(|b| b.attempt == a.attempt + 1 && b.worker == a.worker)
    })
}

/// How many (step, phase) of a saga saw a lapsed lease taken over in-process ([`lapsed`]).
pub fn takeovers(ended: &Ended) -> u64 {
    let mut seen = BTreeSet::new();
    for a in &ended.attempts {
        if lapsed(ended, &a.step, &a.phase) {
            seen.insert((a.step.clone(), a.phase.clone()));
        }
    }
    seen.len() as u64
}

/// Checked whenever the saga is seen `FAILED`: only a step at or after the point of no return
/// fails a saga, once that point has started, and nothing was compensated.
pub fn check_failed(shape: &Shape, saga: &Saga) -> Result<(), String> {
    if !saga.pivot_started {
        return Err("FAILED before its point of no return started".to_owned());
    }
    for step in &saga.steps {
        let Some(unit) = shape.unit(&step.name) else {
            continue;
        };
        let failed = matches!(step.action.status, StepStatus::Failed | StepStatus::Unknown);
        if failed && unit.kind == StepKind::Compensatable {
            return Err(format!(
                "FAILED, yet the step that failed, {}, is before the point of no return",
                step.name
            ));
        }
        if matches!(
            step.compensation.status,
            StepStatus::Succeeded | StepStatus::Running | StepStatus::Retrying
        ) {
            return Err(format!("FAILED, yet {} was compensated", step.name));
        }
    }
    Ok(())
}

fn phase_word(phase: Phase) -> &'static str {
    match phase {
        Phase::Action => "action",
        Phase::Compensation => "compensation",
    }
}

/// The key SPEC §2.2 gives a unit's phase.
fn expected_key(saga: Uuid, unit: &Unit, phase: Phase) -> Uuid {
    match &unit.branch {
        Some((group, branch)) => branch_idempotency_key(saga, group, branch, phase),
        None => idempotency_key(saga, unit.stage, phase),
    }
}

/// Every invariant of a saga that has ended; each broken one is a line of the error.
pub fn check(shape: &Shape, ended: &Ended, ledger: &Ledger, facts: &Facts) -> Vec<String> {
    let mut broken = Vec::new();
    let saga = &ended.saga;
    let id = saga.id;
    let status = saga.status;
    let calls = ledger.calls_of(id);
    let effects = ledger.effects_of(id);
    let units = shape.units();
    let record = |name: &str| saga.steps.iter().find(|s| s.name == name);

    // Terminal; ABORTED only when an abort was sent, and whenever one was accepted.
    if !matches!(
        status,
        SagaStatus::Completed | SagaStatus::Compensated | SagaStatus::Aborted
    ) {
        broken.push(format!(
            "ended {status}, not COMPLETED, COMPENSATED or ABORTED"
        ));
    }
    if status == SagaStatus::Aborted && !facts.abort_sent {
        broken.push("ABORTED though no abort was sent".to_owned());
    }
    if status != SagaStatus::Aborted && facts.abort_accepted {
        broken.push(format!("ended {status} though an abort was accepted"));
    }

    // Stable keys: one per (saga, step, phase), the one SPEC §2.2 derives, and distinct.
    let mut keys: BTreeMap<(String, &str), BTreeSet<Uuid>> = BTreeMap::new();
    for call in &calls {
        keys.entry((call.step.clone(), phase_word(call.phase)))
            .or_default()
            .insert(call.key);
        match shape.unit(&call.step) {
            Some(unit) if call.key != expected_key(id, unit, call.phase) => broken.push(format!(
                "{} {} attempt {} got key {}, not the derived one",
                call.step,
                phase_word(call.phase),
                call.attempt,
                call.key
            )),
            Some(_) => {}
            None => broken.push(format!(
                "the ledger saw a call of unknown step {}",
                call.step
            )),
        }
    }
    let mut all = BTreeSet::new();
    for ((step, phase), set) in &keys {
        if set.len() > 1 {
            broken.push(format!("{step} {phase} was called with {} keys", set.len()));
        }
        for key in set {
            if !all.insert(*key) {
                broken.push(format!("{step} {phase} shares its key with another call"));
            }
        }
    }

    // Write-ahead: every call the ledger saw has its attempt row, under the same number, and
    // began (the kit's record) no more often than the log has attempts of it.
    for call in &calls {
        let phase = phase_word(call.phase);
        let row = ended
            .attempts
            .iter()
            .find(|a| a.step == call.step && a.phase == phase && a.attempt == call.attempt);
        if row.is_none() {
            broken.push(format!(
                "{} {phase} attempt {} reached the ledger without an attempt row written ahead",
                call.step, call.attempt
            ));
        }
    }
    for unit in &units {
        for phase in ["action", "compensation"] {
            let began = ended
                .calls
                .iter()
                .filter(|c| **c == format!("{}:{phase}", unit.name))
                .count();
            let rows = ended.attempts_of(&unit.name, phase).count();
            if began > rows {
                broken.push(format!(
                    "{} {phase}: {began} calls began but only {rows} attempts were written ahead",
                    unit.name
                ));
            }
        }
    }

    // A call is made again only when the previous one's outcome is unknown: never after its
    // success was logged.
    for unit in &units {
        for phase in ["action", "compensation"] {
            // By attempt number: the log's order ties within a millisecond.
            let won = ended
                .attempts_of(&unit.name, phase)
                .filter(|a| a.outcome.as_deref() == Some("succeeded"))
                .map(|a| a.attempt)
                .min();
            if let Some(won) = won {
                if let Some(later) = ended
                    .attempts_of(&unit.name, phase)
                    .find(|a| a.attempt > won)
                {
                    broken.push(format!(
                        "{} {phase} was attempted again ({}) after attempt {won} succeeded",
                        unit.name, later.attempt
                    ));
                }
            }
        }
    }

    // Each effect at most once per key (the ledger dedupes; this checks it booked what the
    // units say), and compensations were given their action's output.
    for call in calls.iter().filter(|c| c.phase == Phase::Compensation) {
        let Some(step) = record(&call.step) else {
            continue;
        };
        if step.action.status == StepStatus::Succeeded && call.seen_output != step.output {
            broken.push(format!(
                "{} compensation attempt {} was given {:?}, not its action's output {:?}",
                call.step, call.attempt, call.seen_output, step.output
            ));
        }
    }
    let booked =
        |name: &str, phase: Phase| effects.values().any(|e| e.step == name && e.phase == phase);
    let comp_calls = |name: &str| {
        ended
            .calls
            .iter()
            .filter(|c| **c == format!("{name}:compensation"))
            .count()
    };

    check_budgets(shape, ended, facts, &mut broken);

    // A report the engine took ends its attempt: that attempt succeeded (the schedule only
    // completes), and a report for an attempt the engine had gone past is refused. An abort
    // that came before the engine read the report takes the call over as it stands.
    for (step, attempt) in &facts.reports_taken {
        let outcome = ended
            .attempts_of(step, "action")
            .find(|a| a.attempt == *attempt)
            .and_then(|a| a.outcome.as_deref());
        let aborted = facts.abort_accepted && outcome == Some("abandoned");
        if outcome != Some("succeeded") && !aborted {
            broken.push(format!(
                "{step}'s report for attempt {attempt} was taken, yet the attempt ended {outcome:?}"
            ));
        }
    }
    check_attention(ended, facts, &mut broken);

    // SPEC §2.7: a cancel is accepted only before the point of no return starts, and then the
    // pivot never starts.
    if facts.cancel_accepted {
        for unit in units.iter().filter(|u| u.kind == StepKind::Pivot) {
            let tries = ended.attempts_of(&unit.name, "action").count();
            if tries > 0 {
                broken.push(format!(
                    "a cancel was accepted, yet the pivot {} was attempted {tries} times",
                    unit.name
                ));
            }
        }
    }

    match status {
        SagaStatus::Completed => {
            if facts.cancel_accepted {
                broken.push("COMPLETED though a cancel was accepted".to_owned());
            }
            for unit in &units {
                let done = record(&unit.name).map(|s| s.action.status);
                if done != Some(StepStatus::Succeeded) {
                    broken.push(format!("COMPLETED with {}'s action {done:?}", unit.name));
                }
                if !booked(&unit.name, Phase::Action) {
                    broken.push(format!("COMPLETED but {} booked nothing", unit.name));
                }
                if comp_calls(&unit.name) > 0 {
                    broken.push(format!("COMPLETED yet {} was compensated", unit.name));
                }
            }
        }
        SagaStatus::Compensated => {
            check_compensated(shape, ended, &mut broken, &booked, facts);
            // Less a lapsed unit's: its late call may book after its step failed for good.
            let net: i64 = effects
                .values()
                .filter(|e| !lapsed(ended, &e.step, "action"))
                .map(|e| e.amount)
                .sum();
            if net != 0 {
                broken.push(format!("COMPENSATED but the ledger nets {net}, not zero"));
            }
        }
        _ => {}
    }
    broken
}

/// `COMPENSATED`: a cause, every unit that acted (or may have) compensated, in reverse order of
/// stages, and nothing at or after the point of no return compensated.
fn check_compensated(
    shape: &Shape,
    ended: &Ended,
    broken: &mut Vec<String>,
    booked: &dyn Fn(&str, Phase) -> bool,
    facts: &Facts,
) {
    let saga = &ended.saga;
    let record = |name: &str| saga.steps.iter().find(|s| s.name == name);
    let caused = facts.cancel_sent
        || saga
            .steps
            .iter()
            .any(|s| matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown));
    if !caused {
        broken.push("COMPENSATED with no step failed and no cancel accepted".to_owned());
    }
    for unit in shape.units() {
        // A group's branches have rows once the group starts.
        let Some(step) = record(&unit.name) else {
            continue;
        };
        if unit.kind != StepKind::Compensatable {
            if step.action.status == StepStatus::Succeeded {
                broken.push(format!(
                    "COMPENSATED after {}, at or past the point of no return, succeeded",
                    unit.name
                ));
            }
            continue;
        }
        let engine_acted = step.action.status == StepStatus::Succeeded
            || step.action.outcome_unknown
            || step.action.status == StepStatus::Unknown;
        let lapsed = lapsed(ended, &unit.name, "action");
        let acted = engine_acted || (booked(&unit.name, Phase::Action) && !lapsed);
        let undone = step.compensation.status == StepStatus::Succeeded;
        if acted && !undone {
            broken.push(format!(
                "{}'s action {} (booked: {}) but its compensation is {}",
                unit.name,
                step.action.status,
                booked(&unit.name, Phase::Action),
                step.compensation.status
            ));
        }
        if acted
            && !lapsed
            && booked(&unit.name, Phase::Action)
            && !booked(&unit.name, Phase::Compensation)
        {
            broken.push(format!("{} booked its action but not its undo", unit.name));
        }
        if !engine_acted && step.action.status == StepStatus::Failed && undone {
            broken.push(format!(
                "{} failed definitively, yet it was compensated",
                unit.name
            ));
        }
    }
    // Reverse order, stage by stage (a group's branches together, in any order among them),
    // from the kit's record of the calls: the log's order ties within a millisecond.
    let stage_of = |call: &str| -> Option<usize> {
        let name = call.strip_suffix(":compensation")?;
        shape.unit(name).map(|u| u.stage)
    };
    let order: Vec<usize> = ended.calls.iter().filter_map(|c| stage_of(c)).collect();
    let mut finished: BTreeSet<usize> = BTreeSet::new();
    let mut current: Option<usize> = None;
    for stage in order {
        if current != Some(stage) {
            if let Some(done) = current {
                finished.insert(done);
            }
            if finished.contains(&stage) {
                broken.push(format!(
                    "stage {stage} was compensated again after a later stage's compensation"
                ));
            }
            if let Some(done) = current {
                if stage > done {
                    broken.push(format!(
                        "stage {stage} was compensated after stage {done}, not in reverse order"
                    ));
                }
            }
            current = Some(stage);
        }
    }
}

/// SPEC §2.5: attempt counts live in the log, so a crash loop cannot reset a retry budget.
/// An action before the point of no return (and the pivot) makes at most its budget of
/// attempts, counting those a crash or a lapsed lease interrupted (the engine records each as
/// a failed attempt of unknown outcome, within the budget: `PhaseRecord::attempts` includes
/// it), plus the attempts a resume's fresh budget allows (`budget_attempts`, set only by a
/// resume) and, for the pivot, one per operator retry of the `FAILED` saga.
fn check_budgets(shape: &Shape, ended: &Ended, facts: &Facts, broken: &mut Vec<String>) {
    for unit in shape.units() {
        if unit.kind == StepKind::Retriable {
            continue;
        }
        let Some(step) = ended.saga.steps.iter().find(|s| s.name == unit.name) else {
            continue;
        };
        let rows = ended.attempts_of(&unit.name, "action").count() as u32;
        if rows != step.action.attempts {
            broken.push(format!(
                "{}'s action has {rows} attempts in the attempt log but its record counts {}",
                unit.name, step.action.attempts
            ));
        }
        if step.budget_attempts > 0 && facts.resumes_sent == 0 {
            broken.push(format!(
                "{} got a fresh retry budget (after {} attempts) though no resume was sent",
                unit.name, step.budget_attempts
            ));
        }
        let operator = if unit.kind == StepKind::Pivot {
            facts.retries_sent
        } else {
            0
        };
        let allowed = ACTION_ATTEMPTS + step.budget_attempts + operator;
        if rows > allowed {
            let interrupted = ended
                .attempts_of(&unit.name, "action")
                .filter(|a| a.outcome.as_deref() == Some("interrupted"))
                .count();
            broken.push(format!(
                "{}'s action was attempted {rows} times ({interrupted} interrupted), over its \
                 budget of {ACTION_ATTEMPTS} (+{} from a resume, +{operator} operator retries)",
                unit.name, step.budget_attempts
            ));
        }
    }
}

/// SPEC §2.4: the saga is flagged *needs attention* (its event `saga.needs_attention`, once)
/// exactly when a compensation's failed attempt reached the engine's threshold, or failed for
/// good (a compensation has no way to give up, so a permanent error needs a person too); the
/// compensation still goes on, and the saga ends `COMPENSATED` (which clears the flag) unless
/// an abort stopped it.
fn check_attention(ended: &Ended, facts: &Facts, broken: &mut Vec<String>) {
    let threshold = attention_after();
    let qualifying: Vec<_> = ended
        .attempts
        .iter()
        .filter(|a| a.phase == "compensation")
        .filter(|a| {
            a.outcome
                .as_deref()
                .is_some_and(|o| FAILED_OUTCOMES.contains(&o))
        })
        .filter(|a| a.attempt >= threshold || a.outcome.as_deref() == Some("failed"))
        .collect();
    let raised: Vec<_> = ended
        .events
        .iter()
        .filter(|e| e.kind == "saga.needs_attention")
        .collect();
    match (qualifying.is_empty(), raised.as_slice()) {
        (true, []) => {}
        (true, _) => broken.push(format!(
            "flagged needs attention ({} times) though no compensation failed {threshold} \
             times or for good",
            raised.len()
        )),
        (false, []) => broken.push(format!(
            "{} compensation attempt {} failed ({:?}), at or past the threshold of {threshold} \
             or for good, yet the saga was never flagged needs attention",
            qualifying[0].step, qualifying[0].attempt, qualifying[0].outcome
        )),
        (false, [event]) => {
            let attempts = event.data.get("attempts").and_then(|v| v.as_u64());
            let matches = qualifying.iter().any(|a| {
                Some(&a.step) == event.step.as_ref() && attempts == Some(u64::from(a.attempt))
            });
            if !matches {
                broken.push(format!(
                    "flagged needs attention for {:?} after {attempts:?} attempts, which is not \
                     a compensation attempt that failed at the threshold or for good",
                    event.step
                ));
            }
            let status = ended.status();
            let compensated = ended
                .events
                .iter()
                .find(|e| e.kind == "saga.compensated")
                .map(|e| e.seq);
            match status {
                SagaStatus::Compensated if compensated > Some(event.seq) => {
                    if ended.saga.needs_attention {
                        broken.push("COMPENSATED but still flagged needs attention".to_owned());
                    }
                }
                SagaStatus::Aborted if facts.abort_sent => {}
                _ => broken.push(format!(
                    "flagged needs attention, then ended {status} rather than compensating"
                )),
            }
        }
        (false, many) => broken.push(format!(
            "flagged needs attention {} times, not once",
            many.len()
        )),
    }
}
