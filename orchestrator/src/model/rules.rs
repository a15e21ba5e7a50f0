//! The rules of the commands that change a saga from outside, as pure functions over its
//! record: the use cases ([`crate::operations`]) ask them first, so a refusal says what would
//! be accepted, and the store asks them again inside the write transaction that makes the
//! change, so a saga that changed meanwhile is refused there.

use uuid::Uuid;

use super::{needs_compensation, Saga, SagaStatus, StepRecord, StepStatus};

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
