//! The checks behind operator commands, shared by every backend: each store loads the saga inside
//! its write transaction, asks these functions whether the command applies, and writes.

use uuid::Uuid;

use super::{CancelOutcome, Result, StoreError};
use crate::model::{needs_compensation, Saga, SagaStatus, StepRecord, StepStatus};

/// `None` when a cancel may be recorded; otherwise the answer to give.
pub(super) fn cancel_refusal(status: SagaStatus, pivot_reached: bool) -> Option<CancelOutcome> {
    if status.is_terminal() {
        Some(CancelOutcome::Terminal(status))
    } else if status == SagaStatus::Compensating {
        Some(CancelOutcome::AlreadyCompensating)
    } else if pivot_reached {
        Some(CancelOutcome::PastPivot)
    } else {
        None
    }
}

/// Whether `abort` applies: anything not finished, and `FAILED` (which waits for a person).
pub(super) fn check_abort(saga: &Saga) -> Result<()> {
    if saga.status.is_terminal() && saga.status != SagaStatus::Failed {
        return Err(StoreError::Conflict(format!(
            "saga {} is {}; only a saga that is not finished can be aborted",
            saga.id, saga.status
        )));
    }
    Ok(())
}

/// What `retry` does to a saga.
pub(super) enum RetryPlan<'a> {
    /// A `FAILED` saga: this step gets another attempt and the saga runs again.
    Failed(&'a StepRecord),
    /// A saga still running: its waiting retry (if any) becomes due now.
    DueNow,
}

/// Decides what `retry` does, or why it cannot.
pub(super) fn plan_retry(saga: &Saga) -> Result<RetryPlan<'_>> {
    match saga.status {
        SagaStatus::Failed => saga
            .steps
            .iter()
            .find(|s| matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown))
            .map(RetryPlan::Failed)
            .ok_or_else(|| {
                StoreError::Conflict(format!("saga {} is FAILED but no step failed", saga.id))
            }),
        s if s.is_terminal() => Err(StoreError::Conflict(format!(
            "saga {} is {s}; there is nothing to retry",
            saga.id
        ))),
        _ => Ok(RetryPlan::DueNow),
    }
}

/// The step `mark-compensated` applies to, or why it cannot.
pub(super) fn check_mark_compensated<'a>(
    saga: &'a Saga,
    id: Uuid,
    step: &str,
) -> Result<&'a StepRecord> {
    let record =
        saga.steps
            .iter()
            .find(|s| s.name == step)
            .ok_or_else(|| StoreError::UnknownStep {
                saga: id,
                step: step.to_owned(),
            })?;
    if saga.status != SagaStatus::Compensating {
        return Err(StoreError::Conflict(format!(
            "saga {id} is {}; steps can be marked compensated only while it is COMPENSATING",
            saga.status
        )));
    }
    if !needs_compensation(record) {
        return Err(StoreError::Conflict(format!(
            "step {step} of saga {id} has no compensation pending (compensation {})",
            record.compensation.status
        )));
    }
    Ok(record)
}
