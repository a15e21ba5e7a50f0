//! `cancel`: finish the step in flight, then compensate.

use uuid::Uuid;

use super::{OperationError, Operations, Result};
use crate::store::CancelOutcome;

/// What a cancel that was not refused did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// Recorded: the step in flight finishes, then the saga compensates.
    Accepted,
    /// The saga was already compensating: nothing to do.
    AlreadyCompensating,
}

impl<'a> Operations<'a> {
    /// Requests the cancellation of saga `id`. Refused (`Conflict`) once the saga has ended or
    /// its point of no return has started. In a bulk job, its event carries the job's actor,
    /// reason and id.
    pub async fn cancel(&self, id: Uuid) -> Result<Cancelled> {
        self.cancel_audited(id, None, None).await
    }

    /// [`Operations::cancel`], its event naming `actor` and `reason` (a schedule cancelling
    /// its previous run).
    pub async fn cancel_audited(
        &self,
        id: Uuid,
        actor: Option<&'a str>,
        reason: Option<&'a str>,
    ) -> Result<Cancelled> {
        match self
            .store
            .request_cancel(id, &self.audit(actor, reason))
            .await?
        {
            CancelOutcome::Accepted => Ok(Cancelled::Accepted),
            CancelOutcome::AlreadyCompensating => Ok(Cancelled::AlreadyCompensating),
            CancelOutcome::Terminal(status) => Err(OperationError::Conflict(format!(
                "saga {id} is {status}: a finished saga cannot be cancelled"
            ))),
            CancelOutcome::PastPivot => Err(OperationError::Conflict(format!(
                "saga {id} is past its pivot; it can no longer be cancelled: its point of no \
                 return (its pivot step) has started and it runs forward to the end (use \
                 `retry` or `abort` if it is stuck)"
            ))),
        }
    }
}
