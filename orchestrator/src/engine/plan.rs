//! The rules of a saga, as pure functions over its log record: what the saga-level status becomes
//! after a step changed ([`settle`]) and which call comes next ([`next_call`]).
//!
//! Keeping them free of I/O lets the property tests check every shape of saga against every
//! failure schedule quickly, and the driver stays a thin loop of "decide, write ahead, call,
//! write result".

use serde_json::{json, Map, Value};

use crate::model::{
    needs_compensation, Millis, Saga, SagaStatus, StepKind, StepRecord, StepStatus,
};
use crate::store::NewEvent;
use saga_dsl::Phase;

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextCall {
    /// Call this step's action or compensation now (or, for a step that calls nothing, decide
    /// it: a condition, a wait, a parallel group that starts or ends).
    Call(usize, Phase),
    /// Call these branches of a parallel group now, concurrently (rows, by index).
    Branches(Vec<(usize, Phase)>),
    /// Nothing more to start until a call in flight ends.
    Busy,
    /// Nothing to call before this time (a retry timer).
    Wait(Millis),
    /// The saga is terminal.
    Done,
}

/// Whether a row is a stage of the definition (not a branch of a parallel group).
fn is_stage(step: &StepRecord) -> bool {
    step.stage_index.is_none()
}

/// The rows of the branches of the group in row `group`, in row order.
pub fn branches<'a>(saga: &'a Saga, group: usize) -> impl Iterator<Item = &'a StepRecord> + 'a {
    // By the group's row, which a branch's row names: the planner asks this at every turn.
    let group = Some(group as u32);
    saga.steps.iter().filter(move |s| s.stage_index == group)
}

/// How a running parallel group stands, from its branches' rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupState {
    /// Every branch succeeded.
    Succeeded,
    /// A branch failed for good and none is in flight any more: the first such one.
    Failed(String),
    /// Still going.
    Running,
}

/// How the running group in row `group` stands.
pub fn group_state(saga: &Saga, group: usize) -> GroupState {
    let mut failed = None;
    let (mut all_succeeded, mut in_flight) = (true, false);
    for b in branches(saga, group) {
        match b.action.status {
            StepStatus::Succeeded => continue,
            StepStatus::Running => in_flight = true,
            StepStatus::Failed | StepStatus::Unknown if failed.is_none() => {
                let (_, name) = b.branch_of().unwrap_or_default();
                let error = b.action.last_error.as_deref().unwrap_or("failed");
                failed = Some(format!("branch {name}: {error}"));
            }
            _ => {}
        }
        all_succeeded = false;
    }
    match failed {
        _ if all_succeeded => GroupState::Succeeded,
        Some(error) if !in_flight => GroupState::Failed(error),
        _ => GroupState::Running,
    }
}

/// Applies the saga-level consequences of the step records to the saga: starting compensation,
/// completing, finishing compensation, failing. Returns the events those changes produce.
///
/// `now` is used for `next_run_at`: a non-terminal saga without a pending retry is due now
/// (or since earlier).
pub fn settle(saga: &mut Saga, now: Millis) -> Vec<NewEvent> {
    let mut events = Vec::new();
    loop {
        match saga.status {
            SagaStatus::Queued | SagaStatus::Running => {
                if saga.cancel_requested && !saga.pivot_started {
                    saga.status = SagaStatus::Compensating;
                    saga.error = Some("cancelled on request".to_owned());
                    events.push(NewEvent::saga(
                        "saga.compensating",
                        json!({"reason": "cancelled on request"}),
                    ));
                    continue;
                }
                if saga
                    .steps
                    .iter()
                    .filter(|s| is_stage(s))
                    .all(|s| done_forward(s.action.status))
                {
                    saga.status = SagaStatus::Completed;
                    saga.next_run_at = None;
                    let mut out = Map::new();
                    for s in saga.steps.iter().filter(|s| is_stage(s)) {
                        out.insert(s.name.clone(), s.output.clone().unwrap_or(Value::Null));
                    }
                    saga.output = Some(Value::Object(out));
                    events.push(NewEvent::saga("saga.completed", json!({})));
                    break;
                }
                let Some(failed) = saga.steps.iter().find(|s| {
                    is_stage(s)
                        && matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown)
                }) else {
                    break;
                };
                let reason = format!(
                    "{}: {}",
                    failed.name,
                    failed.action.last_error.as_deref().unwrap_or("failed")
                );
                if can_go_back(failed, saga) {
                    saga.status = SagaStatus::Compensating;
                    events.push(NewEvent::saga(
                        "saga.compensating",
                        json!({"reason": reason}),
                    ));
                    saga.error = Some(reason);
                    continue;
                }
                saga.status = SagaStatus::Failed;
                saga.next_run_at = None;
                saga.needs_attention = true;
                events.push(NewEvent::saga("saga.failed", json!({"reason": reason})));
                saga.error = Some(reason);
                break;
            }
            SagaStatus::Compensating => {
                if saga.steps.iter().any(needs_compensation) {
                    break;
                }
                saga.status = SagaStatus::Compensated;
                saga.next_run_at = None;
                saga.needs_attention = false;
                events.push(NewEvent::saga("saga.compensated", json!({})));
                break;
            }
            _ => {
                saga.next_run_at = None;
                break;
            }
        }
    }
    // A saga going forward and waiting is due when its wait ends (never, for a signal wait
    // without a timeout), whatever else was written: a signal or a cancel makes it due.
    if matches!(saga.status, SagaStatus::Queued | SagaStatus::Running) {
        if let Some(step) = saga
            .steps
            .iter()
            .find(|s| s.action.status == StepStatus::Waiting)
        {
            saga.next_run_at = step.wait_until();
            return events;
        }
    }
    // Branches of a group retry each on a timer of its own: the saga is due at the first.
    let branch_retry = |phase: Phase| {
        saga.steps
            .iter()
            .filter(|s| !is_stage(s) && record_of(s, phase).status == StepStatus::Retrying)
            .filter_map(StepRecord::wait_until)
            .min()
    };
    let branch_due = match saga.status {
        SagaStatus::Queued | SagaStatus::Running => branch_retry(Phase::Action),
        SagaStatus::Compensating => branch_retry(Phase::Compensation),
        _ => None,
    };
    if let Some(at) = branch_due {
        saga.next_run_at = Some(at);
        return events;
    }
    // A saga waits only on a retry timer of the phase it is in; otherwise it is due now.
    let waiting = match saga.status {
        SagaStatus::Queued | SagaStatus::Running => saga
            .steps
            .iter()
            .any(|s| s.action.status == StepStatus::Retrying),
        SagaStatus::Compensating => saga
            .steps
            .iter()
            .any(|s| s.compensation.status == StepStatus::Retrying),
        _ => false,
    };
    // Due now; a saga already due since earlier keeps that time (it means the same to a claim,
    // and leaving the column alone lets the database update the row in place).
    if !saga.status.is_terminal()
        && saga.status != SagaStatus::Paused
        && (!waiting || saga.next_run_at.is_none())
        && saga.next_run_at.is_none_or(|at| at > now)
    {
        saga.next_run_at = Some(now);
    }
    events
}

/// Pauses a saga whose step `step` ran out of retries (it declares that it pauses the saga
/// rather than give up): `PAUSED`, needing attention, its error naming the step, its spent
/// budget and `last_error`; not due until a resume. Returns the `saga.paused` event. A saga
/// already paused is left as it is (no event).
pub fn pause_exhausted(
    saga: &mut Saga,
    step: &str,
    attempts: u32,
    last_error: &str,
) -> Option<NewEvent> {
    if saga.status == SagaStatus::Paused {
        return None;
    }
    let reason = format!("its retries ran out after {attempts} attempts");
    let data = json!({"actor": "engine", "reason": reason, "step": step,
                      "last_error": last_error});
    pause(saga, format!("{step}: {reason}; last error: {last_error}"));
    saga.needs_attention = true;
    Some(NewEvent::step("saga.paused", step, data))
}

/// Pauses a saga whose driver met an operator's pause request (`request`: its audit data,
/// `{"actor", "reason"}`), the call in flight recorded. Returns the `saga.paused` event. A saga
/// already paused is left as it is (no event).
pub fn pause_requested(saga: &mut Saga, request: &Value) -> Option<NewEvent> {
    if saga.status == SagaStatus::Paused || saga.status.is_terminal() {
        return None;
    }
    let mut data = match request {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    data.insert("previous_status".to_owned(), json!(saga.status));
    saga.paused_from = Some(saga.status);
    saga.status = SagaStatus::Paused;
    saga.next_run_at = None;
    Some(NewEvent::saga("saga.paused", Value::Object(data)))
}

/// `PAUSED`, with `error`, remembering the direction it was going; not due.
fn pause(saga: &mut Saga, error: String) {
    saga.paused_from = Some(match saga.status {
        SagaStatus::Queued => SagaStatus::Running,
        s => s,
    });
    saga.status = SagaStatus::Paused;
    saga.next_run_at = None;
    saga.error = Some(error);
}

/// Whether a saga whose stage `failed` failed for good may go back (compensate) rather than
/// stop `FAILED` for a person.
fn can_go_back(failed: &StepRecord, saga: &Saga) -> bool {
    match failed.kind {
        StepKind::Compensatable => true,
        // A pivot that failed definitively never took effect: go back. One whose outcome is
        // unknown may have: neither way is safe without a person.
        StepKind::Pivot => failed.action.status == StepStatus::Failed,
        StepKind::Retriable => false,
        // A stage that calls nothing itself changed nothing the saga cannot undo (a wait that
        // failed, a group whose branch failed, a child that ended otherwise and was undone by
        // its own saga): back, unless the point of no return is behind.
        _ => !saga.pivot_started,
    }
}

/// Whether an action in `status` lets the saga go past its step: it succeeded, or its
/// condition was false.
pub fn done_forward(status: StepStatus) -> bool {
    matches!(status, StepStatus::Succeeded | StepStatus::Skipped)
}

/// The record of `phase` of a row.
fn record_of(step: &StepRecord, phase: Phase) -> &crate::model::PhaseRecord {
    match phase {
        Phase::Action => &step.action,
        Phase::Compensation => &step.compensation,
    }
}

/// The next call to make, given a settled saga, with no limit on how many branches of a group
/// run at once. See [`next_call_limited`].
pub fn next_call(saga: &Saga, now: Millis) -> NextCall {
    next_call_limited(saga, now, &|_| usize::MAX)
}

/// The next call to make, given a settled saga; `limit` says how many branches of the group
/// in a row may run at once. For a step that calls nothing, `Call` means "decide it now":
/// check its condition, start or end its wait, start or end its parallel group.
pub fn next_call_limited(saga: &Saga, now: Millis, limit: &dyn Fn(usize) -> usize) -> NextCall {
    let due = |saga: &Saga, index: usize, phase: Phase, status: StepStatus| match status {
        StepStatus::Retrying => match saga.next_run_at {
            Some(at) if at > now => NextCall::Wait(at),
            _ => NextCall::Call(index, phase),
        },
        // A signal wait, and a call waiting for its participant's callback, are decided by
        // the driver, which asks the log whether the signal or the report came.
        StepStatus::Waiting
            if saga.steps[index].kind == StepKind::Signal || saga.steps[index].kind.calls() =>
        {
            NextCall::Call(index, phase)
        }
        StepStatus::Waiting => match saga.steps[index].wake_at {
            Some(at) if at > now => NextCall::Wait(at),
            _ => NextCall::Call(index, phase),
        },
        _ => NextCall::Call(index, phase),
    };
    match saga.status {
        SagaStatus::Queued | SagaStatus::Running => {
            let Some(i) = saga
                .steps
                .iter()
                .position(|s| is_stage(s) && !done_forward(s.action.status))
            else {
                return NextCall::Done;
            };
            let stage = &saga.steps[i];
            if stage.kind == StepKind::Parallel && stage.action.status == StepStatus::Running {
                return match group_state(saga, i) {
                    GroupState::Running => group_calls(saga, i, Phase::Action, now, limit(i)),
                    // Its end is decided by the driver, which writes the group's row.
                    _ => NextCall::Call(i, Phase::Action),
                };
            }
            due(saga, i, Phase::Action, stage.action.status)
        }
        SagaStatus::Compensating => {
            // Stages in reverse; a group's branches together.
            for i in (0..saga.steps.len()).rev() {
                let stage = &saga.steps[i];
                if !is_stage(stage) {
                    continue;
                }
                if stage.kind == StepKind::Parallel {
                    match group_calls(saga, i, Phase::Compensation, now, limit(i)) {
                        NextCall::Done => continue,
                        next => return next,
                    }
                }
                if needs_compensation(stage) {
                    return due(saga, i, Phase::Compensation, stage.compensation.status);
                }
            }
            NextCall::Done
        }
        _ => NextCall::Done,
    }
}

/// The calls of `phase` of the branches of the group in row `group` that may start now: up to
/// `limit` in flight; forward, none once a branch failed for good. `Busy` when only calls in
/// flight remain, `Wait` for the first retry timer, `Done` when no branch needs `phase`.
fn group_calls(saga: &Saga, group: usize, phase: Phase, now: Millis, limit: usize) -> NextCall {
    let mut running = 0;
    let mut ready = Vec::new();
    let mut later: Option<Millis> = None;
    let mut failed = false;
    for b in branches(saga, group) {
        // A branch whose action is in flight finishes its call before anything else.
        if b.action.status == StepStatus::Running {
            running += 1;
            continue;
        }
        let needed = match phase {
            Phase::Action => !matches!(b.action.status, StepStatus::Succeeded),
            Phase::Compensation => needs_compensation(b),
        };
        if !needed {
            continue;
        }
        let rec = record_of(b, phase);
        failed |= phase == Phase::Action
            && matches!(rec.status, StepStatus::Failed | StepStatus::Unknown);
        match rec.status {
            StepStatus::Running => running += 1,
            StepStatus::Retrying => match b.wait_until() {
                Some(at) if at > now => later = Some(later.map_or(at, |l| l.min(at))),
                _ => ready.push(b.index as usize),
            },
            StepStatus::Pending => ready.push(b.index as usize),
            _ => {}
        }
    }
    if failed {
        // No branch starts after a permanent failure; those in flight finish.
        return if running > 0 {
            NextCall::Busy
        } else {
            NextCall::Done
        };
    }
    let room = limit.saturating_sub(running);
    if room > 0 && !ready.is_empty() {
        ready.truncate(room);
        return NextCall::Branches(ready.into_iter().map(|i| (i, phase)).collect());
    }
    match (running, later) {
        (0, Some(at)) => NextCall::Wait(at),
        (0, None) => NextCall::Done,
        _ => NextCall::Busy,
    }
}

#[cfg(test)]
mod tests {
    //! The rules on hand-built saga records: no store, no engine, no clock but `NOW`.

    use super::*;
    use crate::model::fixtures::{saga, step, NOW};
    use crate::model::{PhaseRecord, StepRecord};
    use StepKind::{Compensatable, Pivot, Retriable};

    /// Steps `a`, `b` (compensatable), `p` (pivot), `r` (retriable) with these action states.
    fn four(a: StepStatus, b: StepStatus, p: StepStatus, r: StepStatus) -> Vec<StepRecord> {
        vec![
            step(0, "a", Compensatable, a),
            step(1, "b", Compensatable, b),
            step(2, "p", Pivot, p),
            step(3, "r", Retriable, r),
        ]
    }

    fn kinds(events: &[NewEvent]) -> Vec<&'static str> {
        events.iter().map(|e| e.kind).collect()
    }

    /// Drives a compensating saga as the driver would, each compensation succeeding at its first
    /// attempt: the steps compensated, in order, and the events of the settles along the way.
    fn compensate_all(saga: &mut Saga) -> (Vec<usize>, Vec<&'static str>) {
        let (mut order, mut events) = (Vec::new(), Vec::new());
        loop {
            match next_call(saga, NOW) {
                NextCall::Call(i, Phase::Compensation) => {
                    order.push(i);
                    let comp = &mut saga.steps[i].compensation;
                    comp.status = StepStatus::Succeeded;
                    comp.attempts += 1;
                    events.extend(kinds(&settle(saga, NOW)));
                }
                NextCall::Done => return (order, events),
                other => panic!("unexpected {other:?} while compensating: {saga:#?}"),
            }
            assert!(order.len() <= saga.steps.len(), "compensations never end");
        }
    }

    #[test]
    fn a_queued_saga_calls_its_first_action_now() {
        let mut s = saga(
            SagaStatus::Queued,
            four(
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.next_run_at = None;
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(s.status, SagaStatus::Queued);
        assert_eq!(s.next_run_at, Some(NOW), "due now");
        assert_eq!(next_call(&s, NOW), NextCall::Call(0, Phase::Action));
    }

    #[test]
    fn forward_progress_calls_the_first_action_not_yet_succeeded() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(s.status, SagaStatus::Running);
        assert_eq!(
            s.next_run_at,
            Some(NOW - 10),
            "due since earlier keeps its time"
        );
        assert_eq!(next_call(&s, NOW), NextCall::Call(1, Phase::Action));

        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Pending,
            ),
        );
        s.pivot_started = true;
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(next_call(&s, NOW), NextCall::Call(3, Phase::Action));
    }

    #[test]
    fn every_action_succeeded_completes_the_saga_with_every_output() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Succeeded,
            ),
        );
        s.steps[1].output = None;
        let events = settle(&mut s, NOW);
        assert_eq!(events, [NewEvent::saga("saga.completed", json!({}))]);
        assert_eq!(s.status, SagaStatus::Completed);
        assert_eq!(s.next_run_at, None, "a terminal saga is never due");
        assert_eq!(
            s.output,
            Some(json!({"a": {"from": "a"}, "b": null, "p": {"from": "p"}, "r": {"from": "r"}}))
        );
        assert_eq!(next_call(&s, NOW), NextCall::Done);
    }

    #[test]
    fn a_permanent_failure_before_the_pivot_compensates_earlier_steps_in_reverse() {
        let mut s = saga(
            SagaStatus::Running,
            vec![
                step(0, "a", Compensatable, StepStatus::Succeeded),
                step(1, "b", Compensatable, StepStatus::Succeeded),
                step(2, "c", Compensatable, StepStatus::Failed),
                step(3, "p", Pivot, StepStatus::Pending),
            ],
        );
        let events = settle(&mut s, NOW);
        assert_eq!(
            events,
            [NewEvent::saga(
                "saga.compensating",
                json!({"reason": "c: boom"})
            )]
        );
        assert_eq!(s.status, SagaStatus::Compensating);
        assert_eq!(s.error.as_deref(), Some("c: boom"));
        let (order, events) = compensate_all(&mut s);
        assert_eq!(
            order,
            [1, 0],
            "the failed step is not compensated: it had no effect"
        );
        assert_eq!(events, ["saga.compensated"]);
        assert_eq!(s.status, SagaStatus::Compensated);
        assert_eq!(s.next_run_at, None);
        assert_eq!(s.steps[2].compensation.status, StepStatus::Pending);
        assert_eq!(
            s.steps[3].action.status,
            StepStatus::Pending,
            "never started"
        );
    }

    #[test]
    fn a_failed_step_whose_outcome_is_unknown_is_compensated_first() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Unknown,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.compensating"]);
        assert_eq!(s.error.as_deref(), Some("b: boom"));
        let (order, _) = compensate_all(&mut s);
        assert_eq!(
            order,
            [1, 0],
            "it may have had an effect: undone too, before a"
        );
        assert_eq!(s.status, SagaStatus::Compensated);
    }

    #[test]
    fn a_failure_without_an_error_text_still_names_its_step() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Failed,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.steps[0].action.last_error = None;
        settle(&mut s, NOW);
        assert_eq!(s.error.as_deref(), Some("a: failed"));
        // Nothing succeeded before it: compensated at once.
        assert_eq!(s.status, SagaStatus::Compensated);
        assert_eq!(next_call(&s, NOW), NextCall::Done);
    }

    #[test]
    fn a_pivot_that_failed_definitively_compensates_the_steps_before_it() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Failed,
                StepStatus::Pending,
            ),
        );
        s.pivot_started = true;
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.compensating"]);
        assert_eq!(s.error.as_deref(), Some("p: boom"));
        let (order, _) = compensate_all(&mut s);
        assert_eq!(order, [1, 0]);
        assert_eq!(s.status, SagaStatus::Compensated);
    }

    #[test]
    fn a_pivot_whose_outcome_is_unknown_fails_and_needs_a_person() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Unknown,
                StepStatus::Pending,
            ),
        );
        s.pivot_started = true;
        let events = settle(&mut s, NOW);
        assert_eq!(
            events,
            [NewEvent::saga("saga.failed", json!({"reason": "p: boom"}))]
        );
        assert_eq!(s.status, SagaStatus::Failed);
        assert!(s.needs_attention);
        assert_eq!(s.next_run_at, None);
        assert_eq!(
            next_call(&s, NOW),
            NextCall::Done,
            "neither way is safe alone"
        );
        assert!(s
            .steps
            .iter()
            .all(|st| st.compensation.status != StepStatus::Succeeded));
    }

    #[test]
    fn after_the_pivot_a_retriable_step_waits_for_its_timer_then_retries() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Retrying,
            ),
        );
        s.pivot_started = true;
        s.next_run_at = Some(NOW + 500);
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(s.status, SagaStatus::Running);
        assert_eq!(s.next_run_at, Some(NOW + 500), "the timer is kept");
        assert_eq!(next_call(&s, NOW), NextCall::Wait(NOW + 500));
        assert_eq!(next_call(&s, NOW + 499), NextCall::Wait(NOW + 500));
        assert_eq!(next_call(&s, NOW + 500), NextCall::Call(3, Phase::Action));
    }

    #[test]
    fn after_the_pivot_a_permanent_failure_is_failed_and_nothing_is_compensated() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Failed,
            ),
        );
        s.pivot_started = true;
        let events = settle(&mut s, NOW);
        assert_eq!(
            events,
            [NewEvent::saga("saga.failed", json!({"reason": "r: boom"}))]
        );
        assert_eq!(s.status, SagaStatus::Failed);
        assert!(s.needs_attention);
        assert_eq!(s.error.as_deref(), Some("r: boom"));
        assert_eq!(s.next_run_at, None);
        assert_eq!(next_call(&s, NOW), NextCall::Done);
        assert!(s.steps[..2]
            .iter()
            .all(|st| st.compensation.status == StepStatus::Pending));
    }

    #[test]
    fn retry_timers_of_actions_and_compensations() {
        // An action's retry with no time recorded yet is due now.
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Retrying,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.next_run_at = None;
        settle(&mut s, NOW);
        assert_eq!(s.next_run_at, Some(NOW));
        assert_eq!(next_call(&s, NOW), NextCall::Call(0, Phase::Action));

        // A compensation's retry waits for its timer, in the compensating phase.
        let mut s = saga(
            SagaStatus::Compensating,
            four(
                StepStatus::Succeeded,
                StepStatus::Failed,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.steps[0].compensation.status = StepStatus::Retrying;
        s.next_run_at = Some(NOW + 2_000);
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(s.status, SagaStatus::Compensating);
        assert_eq!(s.next_run_at, Some(NOW + 2_000));
        assert_eq!(next_call(&s, NOW), NextCall::Wait(NOW + 2_000));
        assert_eq!(
            next_call(&s, NOW + 2_000),
            NextCall::Call(0, Phase::Compensation)
        );

        // A time in the future with nothing waiting on it is not a timer: due now.
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.next_run_at = Some(NOW + 5_000);
        settle(&mut s, NOW);
        assert_eq!(s.next_run_at, Some(NOW));
        assert_eq!(next_call(&s, NOW), NextCall::Call(1, Phase::Action));

        // An action's timer does not hold a saga that went backward.
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Retrying,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.next_run_at = Some(NOW + 5_000);
        s.cancel_requested = true;
        settle(&mut s, NOW);
        assert_eq!(s.status, SagaStatus::Compensating);
        assert_eq!(s.next_run_at, Some(NOW));
    }

    #[test]
    fn a_cancel_before_the_pivot_compensates_what_succeeded() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.cancel_requested = true;
        let events = settle(&mut s, NOW);
        assert_eq!(
            events,
            [NewEvent::saga(
                "saga.compensating",
                json!({"reason": "cancelled on request"})
            )]
        );
        assert_eq!(s.error.as_deref(), Some("cancelled on request"));
        assert_eq!(next_call(&s, NOW), NextCall::Call(0, Phase::Compensation));
        let (order, events) = compensate_all(&mut s);
        assert_eq!((order, events), (vec![0], vec!["saga.compensated"]));
    }

    #[test]
    fn a_cancel_takes_precedence_over_a_failure_in_the_same_settle() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Failed,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.cancel_requested = true;
        settle(&mut s, NOW);
        assert_eq!(s.status, SagaStatus::Compensating);
        assert_eq!(s.error.as_deref(), Some("cancelled on request"));
        assert_eq!(next_call(&s, NOW), NextCall::Call(0, Phase::Compensation));
    }

    #[test]
    fn a_cancel_before_anything_ran_ends_compensated_at_once() {
        let mut s = saga(
            SagaStatus::Queued,
            four(
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.cancel_requested = true;
        assert_eq!(
            kinds(&settle(&mut s, NOW)),
            ["saga.compensating", "saga.compensated"]
        );
        assert_eq!(s.status, SagaStatus::Compensated);
        assert_eq!(s.next_run_at, None);
        assert_eq!(next_call(&s, NOW), NextCall::Done);
    }

    #[test]
    fn a_cancel_after_the_pivot_started_changes_nothing() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Pending,
            ),
        );
        s.pivot_started = true;
        s.cancel_requested = true;
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(s.status, SagaStatus::Running);
        assert_eq!(s.error, None);
        assert_eq!(next_call(&s, NOW), NextCall::Call(3, Phase::Action));
    }

    #[test]
    fn compensation_runs_from_the_last_step_needing_it_and_skips_the_rest() {
        // a, c and d succeeded, b never ran, e failed definitively, and c's compensation is
        // already done: d, then a, then the end (b and e are never compensated).
        let mut s = saga(
            SagaStatus::Compensating,
            vec![
                step(0, "a", Compensatable, StepStatus::Succeeded),
                step(1, "b", Compensatable, StepStatus::Pending),
                step(2, "c", Compensatable, StepStatus::Succeeded),
                step(3, "d", Compensatable, StepStatus::Succeeded),
                step(4, "e", Compensatable, StepStatus::Failed),
            ],
        );
        s.steps[2].compensation.status = StepStatus::Succeeded;
        assert!(settle(&mut s, NOW).is_empty());
        let (order, events) = compensate_all(&mut s);
        assert_eq!(order, [3, 0]);
        assert_eq!(events, ["saga.compensated"]);
        assert_eq!(s.steps[1].compensation.status, StepStatus::Pending);
        assert_eq!(s.steps[4].compensation.status, StepStatus::Pending);
    }

    #[test]
    fn a_compensation_in_flight_or_retrying_is_the_one_called_next() {
        // A compensation written ahead and interrupted (running, outcome unknown) is made again
        // before any earlier step's.
        let mut s = saga(
            SagaStatus::Compensating,
            four(
                StepStatus::Succeeded,
                StepStatus::Succeeded,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.steps[1].compensation.status = StepStatus::Running;
        s.steps[1].compensation.outcome_unknown = true;
        settle(&mut s, NOW);
        assert_eq!(next_call(&s, NOW), NextCall::Call(1, Phase::Compensation));
    }

    #[test]
    fn needs_attention_stays_while_compensating_and_clears_once_compensated() {
        let mut s = saga(
            SagaStatus::Compensating,
            four(
                StepStatus::Succeeded,
                StepStatus::Failed,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        s.needs_attention = true;
        s.steps[0].compensation.status = StepStatus::Retrying;
        s.steps[0].compensation.attempts = 7;
        s.next_run_at = Some(NOW + 100);
        assert!(settle(&mut s, NOW).is_empty());
        assert!(s.needs_attention, "still stuck");
        assert_eq!(s.status, SagaStatus::Compensating);

        // An operator marks it compensated by hand: the saga ends, the flag goes.
        s.steps[0].compensation.status = StepStatus::Manual;
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.compensated"]);
        assert_eq!(s.status, SagaStatus::Compensated);
        assert!(!s.needs_attention);
        assert_eq!(s.next_run_at, None);
        assert_eq!(next_call(&s, NOW), NextCall::Done);
    }

    #[test]
    fn a_terminal_saga_has_nothing_to_do_and_is_never_due() {
        for status in [
            SagaStatus::Completed,
            SagaStatus::Compensated,
            SagaStatus::Failed,
            SagaStatus::Aborted,
        ] {
            let mut s = saga(
                status,
                four(
                    StepStatus::Succeeded,
                    StepStatus::Pending,
                    StepStatus::Pending,
                    StepStatus::Pending,
                ),
            );
            s.needs_attention = status == SagaStatus::Failed;
            assert!(settle(&mut s, NOW).is_empty(), "{status}");
            assert_eq!(s.status, status);
            assert_eq!(s.next_run_at, None, "{status}");
            assert_eq!(s.needs_attention, status == SagaStatus::Failed, "{status}");
            assert_eq!(next_call(&s, NOW), NextCall::Done, "{status}");
        }
    }

    #[test]
    fn settling_twice_changes_nothing_more() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Failed,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        settle(&mut s, NOW);
        let once = s.clone();
        assert!(settle(&mut s, NOW).is_empty(), "no event twice");
        assert_eq!(s, once);
    }

    #[test]
    fn skipped_steps_count_as_done_and_are_never_compensated() {
        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Succeeded,
                StepStatus::Skipped,
                StepStatus::Pending,
                StepStatus::Pending,
            ),
        );
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(next_call(&s, NOW), NextCall::Call(2, Phase::Action));
        s.steps[2].action.status = StepStatus::Failed;
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.compensating"]);
        let (order, _) = compensate_all(&mut s);
        assert_eq!(order, [0], "the skipped step is left alone");

        let mut s = saga(
            SagaStatus::Running,
            four(
                StepStatus::Skipped,
                StepStatus::Succeeded,
                StepStatus::Skipped,
                StepStatus::Succeeded,
            ),
        );
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.completed"]);
    }

    /// Steps `a` (compensatable, succeeded), a sleep `nap` in `status`, and a pivot `p`.
    fn napping(status: StepStatus, wake_at: Millis) -> Saga {
        let mut nap = step(1, "nap", StepKind::Sleep, status);
        nap.compensation = PhaseRecord::with_status(StepStatus::NotNeeded);
        nap.action.outcome_unknown = false;
        nap.wake_at = Some(wake_at);
        saga(
            SagaStatus::Running,
            vec![
                step(0, "a", Compensatable, StepStatus::Succeeded),
                nap,
                step(2, "p", Pivot, StepStatus::Pending),
            ],
        )
    }

    #[test]
    fn a_sleeping_saga_is_due_at_its_wake_time_and_then_ends_the_sleep() {
        let mut s = napping(StepStatus::Waiting, NOW + 5_000);
        assert!(settle(&mut s, NOW).is_empty());
        assert_eq!(s.next_run_at, Some(NOW + 5_000), "due when the sleep ends");
        assert_eq!(next_call(&s, NOW), NextCall::Wait(NOW + 5_000));
        assert_eq!(
            next_call(&s, NOW + 5_000),
            NextCall::Call(1, Phase::Action),
            "the sleep is ended by its own call"
        );
        // Whatever due time was written, the wake time in the log wins.
        s.next_run_at = Some(NOW);
        settle(&mut s, NOW);
        assert_eq!(s.next_run_at, Some(NOW + 5_000));
    }

    #[test]
    fn a_cancelled_sleeping_saga_compensates_now_and_leaves_the_sleep_alone() {
        let mut s = napping(StepStatus::Waiting, NOW + 3_600_000);
        s.cancel_requested = true;
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.compensating"]);
        assert_eq!(
            s.next_run_at,
            Some(NOW - 10),
            "due now, not at the wake time"
        );
        let (order, events) = compensate_all(&mut s);
        assert_eq!(order, [0]);
        assert_eq!(events, ["saga.compensated"]);
    }

    #[test]
    fn a_sleep_that_could_not_start_goes_back_before_the_pivot_and_fails_after_it() {
        let mut s = napping(StepStatus::Failed, NOW);
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.compensating"]);
        let mut s = napping(StepStatus::Failed, NOW);
        s.pivot_started = true;
        assert_eq!(kinds(&settle(&mut s, NOW)), ["saga.failed"]);
    }
}
