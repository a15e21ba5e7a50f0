//! The rules of a saga, as pure functions over its log record: what the saga-level status becomes
//! after a step changed ([`settle`]) and which call comes next ([`next_call`]).
//!
//! Keeping them free of I/O lets the property tests check every shape of saga against every
//! failure schedule quickly, and the driver stays a thin loop of "decide, write ahead, call,
//! write result".

use serde_json::{json, Map, Value};

use crate::model::{needs_compensation, Millis, Saga, SagaStatus, StepKindName, StepStatus};
use crate::store::NewEvent;
use saga_dsl::Phase;

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextCall {
    /// Call this step's action or compensation now.
    Call(usize, Phase),
    /// Nothing to call before this time (a retry timer).
    Wait(Millis),
    /// The saga is terminal.
    Done,
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
                if saga.cancel_requested && !saga.pivot_reached {
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
                    .all(|s| s.action.status == StepStatus::Succeeded)
                {
                    saga.status = SagaStatus::Completed;
                    saga.next_run_at = None;
                    let mut out = Map::new();
                    for s in &saga.steps {
                        out.insert(s.name.clone(), s.output.clone().unwrap_or(Value::Null));
                    }
                    saga.output = Some(Value::Object(out));
                    events.push(NewEvent::saga("saga.completed", json!({})));
                    break;
                }
                let Some(failed) = saga
                    .steps
                    .iter()
                    .find(|s| matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown))
                else {
                    break;
                };
                let reason = format!(
                    "{}: {}",
                    failed.name,
                    failed.action.last_error.as_deref().unwrap_or("failed")
                );
                let can_go_back = match failed.kind {
                    StepKindName::Compensatable => true,
                    // A pivot that failed definitively never took effect: go back. One whose
                    // outcome is unknown may have: neither way is safe without a person.
                    StepKindName::Pivot => failed.action.status == StepStatus::Failed,
                    StepKindName::Retriable => false,
                };
                if can_go_back {
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
        && (!waiting || saga.next_run_at.is_none())
        && saga.next_run_at.is_none_or(|at| at > now)
    {
        saga.next_run_at = Some(now);
    }
    events
}

/// The next call to make, given a settled saga.
pub fn next_call(saga: &Saga, now: Millis) -> NextCall {
    let due = |saga: &Saga, index: usize, phase: Phase, status: StepStatus| match status {
        StepStatus::Retrying => match saga.next_run_at {
            Some(at) if at > now => NextCall::Wait(at),
            _ => NextCall::Call(index, phase),
        },
        _ => NextCall::Call(index, phase),
    };
    match saga.status {
        SagaStatus::Queued | SagaStatus::Running => saga
            .steps
            .iter()
            .position(|s| s.action.status != StepStatus::Succeeded)
            .map_or(NextCall::Done, |i| {
                due(saga, i, Phase::Action, saga.steps[i].action.status)
            }),
        SagaStatus::Compensating => {
            saga.steps
                .iter()
                .rposition(needs_compensation)
                .map_or(NextCall::Done, |i| {
                    due(
                        saga,
                        i,
                        Phase::Compensation,
                        saga.steps[i].compensation.status,
                    )
                })
        }
        _ => NextCall::Done,
    }
}
