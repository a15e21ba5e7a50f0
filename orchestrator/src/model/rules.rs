//! The rules of the commands that change a saga from outside, as pure functions over its
//! record: the use cases ([`crate::operations`]) ask them first, so a refusal says what would
//! be accepted, and the store asks them again inside the write transaction that makes the
//! change, so a saga that changed meanwhile is refused there.

use uuid::Uuid;

use super::{needs_compensation, Millis, Saga, SagaStatus, StepRecord, StepStatus};

/// Why a command does not apply to a saga as it stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The saga has no step of this name.
    #[error("saga {saga} has no step {step:?}")]
    UnknownStep {
        /// The saga.
        saga: Uuid,
        /// The name given.
        step: String,
    },
    /// The saga's state does not allow the command; the message says why.
    #[error("{0}")]
    Conflict(String),
}

/// The answer to a cancel request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Accepted: the step in flight finishes, then the saga compensates.
    Accepted,
    /// The saga is already compensating; nothing to do.
    AlreadyCompensating,
    /// Refused: the saga is terminal.
    Terminal(SagaStatus),
    /// Refused: the saga has passed its point of no return.
    PastPivot,
}

/// `None` when a cancel may be recorded; otherwise the answer to give.
pub fn cancel_refusal(status: SagaStatus, pivot_started: bool) -> Option<CancelOutcome> {
    if status.is_terminal() {
        Some(CancelOutcome::Terminal(status))
    } else if status == SagaStatus::Compensating {
        Some(CancelOutcome::AlreadyCompensating)
    } else if pivot_started {
        Some(CancelOutcome::PastPivot)
    } else {
        None
    }
}

/// Whether `abort` applies: anything not finished, and `FAILED` (which waits for a person).
pub fn check_abort(saga: &Saga) -> Result<(), Refusal> {
    if saga.status.is_terminal() && saga.status != SagaStatus::Failed {
        return Err(Refusal::Conflict(format!(
            "saga {} is {}; only a saga that is not finished can be aborted",
            saga.id, saga.status
        )));
    }
    Ok(())
}

/// What `retry` does to a saga.
pub enum RetryPlan<'a> {
    /// A `FAILED` saga: this step gets another attempt and the saga runs again.
    Failed(&'a StepRecord),
    /// A saga still running: its waiting retry (if any) becomes due now.
    DueNow,
}

/// Decides what `retry` does, or why it cannot.
pub fn plan_retry(saga: &Saga) -> Result<RetryPlan<'_>, Refusal> {
    match saga.status {
        SagaStatus::Failed => saga
            .steps
            .iter()
            .find(|s| matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown))
            .map(RetryPlan::Failed)
            .ok_or_else(|| {
                Refusal::Conflict(format!("saga {} is FAILED but no step failed", saga.id))
            }),
        s if s.is_terminal() => Err(Refusal::Conflict(format!(
            "saga {} is {s}; there is nothing to retry",
            saga.id
        ))),
        SagaStatus::Paused => Err(Refusal::Conflict(format!(
            "saga {} is PAUSED; use `resume` to run it again (a step whose retries ran out \
             gets a fresh budget)",
            saga.id
        ))),
        _ => Ok(RetryPlan::DueNow),
    }
}

/// The step `mark-compensated` applies to, or why it cannot.
pub fn check_mark_compensated<'a>(saga: &'a Saga, step: &str) -> Result<&'a StepRecord, Refusal> {
    let id = saga.id;
    let record =
        saga.steps
            .iter()
            .find(|s| s.name == step)
            .ok_or_else(|| Refusal::UnknownStep {
                saga: id,
                step: step.to_owned(),
            })?;
    if saga.status != SagaStatus::Compensating {
        return Err(Refusal::Conflict(format!(
            "saga {id} is {}; a step can be marked compensated only while the saga is \
             COMPENSATING",
            saga.status
        )));
    }
    if !needs_compensation(record) {
        return Err(Refusal::Conflict(format!(
            "step {step} of saga {id} has no compensation pending (action {}, compensation {})",
            record.action.status, record.compensation.status
        )));
    }
    Ok(record)
}

/// What `pause` does to a saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausePlan {
    /// No worker holds it (it is queued, or parked on a timer, a signal or a child, or its
    /// worker's lease ran out): it becomes `PAUSED` now.
    Now,
    /// A worker drives it: the pause is recorded as requested; the call in flight finishes
    /// and is recorded, then the worker starts nothing new and gives the saga back `PAUSED`.
    Requested,
}

/// Decides what `pause` does at `now`, or why it cannot: only a saga that is queued, running
/// or compensating, not paused and with no pause pending. A `FAILED` saga already waits for a
/// person: it is refused with a pointer to `retry` and `abort`.
pub fn plan_pause(saga: &Saga, now: Millis) -> Result<PausePlan, Refusal> {
    let id = saga.id;
    match saga.status {
        SagaStatus::Paused => Err(Refusal::Conflict(format!("saga {id} is already PAUSED"))),
        SagaStatus::Failed => Err(Refusal::Conflict(format!(
            "saga {id} is FAILED: it already waits for a person; use `retry` to run its \
             failed step again or `abort` to stop it"
        ))),
        s if s.is_terminal() => Err(Refusal::Conflict(format!(
            "saga {id} is {s}; only a saga that is queued, running or compensating can be paused"
        ))),
        _ if saga.pause_requested => Err(Refusal::Conflict(format!(
            "a pause of saga {id} is already requested: its worker gives it back PAUSED once \
             its call in flight ends"
        ))),
        _ if saga.lease_owner.is_some() && saga.lease_expires_at.is_none_or(|at| at > now) => {
            Ok(PausePlan::Requested)
        }
        _ => Ok(PausePlan::Now),
    }
}

/// What `resume` does to a saga.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumePlan<'a> {
    /// A pause was requested and not yet applied: the request is withdrawn.
    Withdraw,
    /// The `PAUSED` saga goes back to `status`, due now; `exhausted` is the step whose retries
    /// ran out, which gets a fresh budget.
    Resume {
        /// The status it goes on in.
        status: SagaStatus,
        /// The step whose retries ran out, if the saga paused for that.
        exhausted: Option<&'a StepRecord>,
    },
}

/// Decides what `resume` does, or why it cannot: only a `PAUSED` saga, or one with a pause
/// requested.
pub fn plan_resume(saga: &Saga) -> Result<ResumePlan<'_>, Refusal> {
    if saga.status != SagaStatus::Paused {
        if saga.pause_requested && !saga.status.is_terminal() {
            return Ok(ResumePlan::Withdraw);
        }
        return Err(Refusal::Conflict(format!(
            "saga {} is {}; only a PAUSED saga can be resumed",
            saga.id, saga.status
        )));
    }
    let started = saga
        .steps
        .iter()
        .any(|s| s.action.status != StepStatus::Pending);
    let status = saga.paused_from.unwrap_or(if started {
        SagaStatus::Running
    } else {
        SagaStatus::Queued
    });
    let exhausted = (status != SagaStatus::Compensating)
        .then(|| {
            saga.steps.iter().find(|s| {
                s.stage_index.is_none()
                    && matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown)
            })
        })
        .flatten();
    Ok(ResumePlan::Resume { status, exhausted })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fixtures::{saga, step, NOW};
    use crate::model::StepKind;

    #[test]
    fn pause_applies_to_sagas_that_go_on_and_says_how() {
        let mut s = saga(
            SagaStatus::Running,
            vec![step(0, "a", StepKind::Compensatable, StepStatus::Running)],
        );
        s.lease_expires_at = Some(NOW + 1_000);
        assert_eq!(plan_pause(&s, NOW), Ok(PausePlan::Requested));
        // A lease that ran out is held by nobody.
        assert_eq!(plan_pause(&s, NOW + 1_000), Ok(PausePlan::Now));
        s.lease_owner = None;
        assert_eq!(plan_pause(&s, NOW), Ok(PausePlan::Now));
        s.pause_requested = true;
        assert!(plan_pause(&s, NOW).is_err(), "requested already");
        for status in [
            SagaStatus::Paused,
            SagaStatus::Failed,
            SagaStatus::Completed,
            SagaStatus::Compensated,
            SagaStatus::Aborted,
        ] {
            let s = saga(status, vec![]);
            let Err(Refusal::Conflict(message)) = plan_pause(&s, NOW) else {
                panic!("{status} paused");
            };
            if status == SagaStatus::Failed {
                assert!(
                    message.contains("retry") && message.contains("abort"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn resume_goes_on_in_the_direction_it_was_going_with_a_fresh_budget() {
        let mut s = saga(
            SagaStatus::Paused,
            vec![
                step(0, "a", StepKind::Compensatable, StepStatus::Succeeded),
                step(1, "charge", StepKind::Compensatable, StepStatus::Failed),
            ],
        );
        s.paused_from = Some(SagaStatus::Running);
        let Ok(ResumePlan::Resume { status, exhausted }) = plan_resume(&s) else {
            panic!("not resumed");
        };
        assert_eq!(status, SagaStatus::Running);
        assert_eq!(exhausted.map(|e| e.name.as_str()), Some("charge"));

        s.paused_from = Some(SagaStatus::Compensating);
        assert_eq!(
            plan_resume(&s),
            Ok(ResumePlan::Resume {
                status: SagaStatus::Compensating,
                exhausted: None
            })
        );

        let mut running = saga(SagaStatus::Running, vec![]);
        assert!(plan_resume(&running).is_err(), "not paused");
        running.pause_requested = true;
        assert_eq!(plan_resume(&running), Ok(ResumePlan::Withdraw));
        assert!(
            plan_retry(&s).is_err(),
            "a paused saga is resumed, not retried"
        );
    }
}
