//! `resume`: let a paused saga go on.

use uuid::Uuid;

use super::{OperationError, Operations, Reason, Result};
use crate::model::rules::{plan_resume, Refusal};
use crate::model::Saga;

impl<'a> Operations<'a> {
    /// Resumes saga `id`, `PAUSED`, in the direction it was going, due now; audited as
    /// `actor`'s with `reason` (`saga.resumed`). A step whose retries ran out gets a fresh
    /// budget (its attempts and its time counted from now; attempt numbers keep counting up),
    /// and the needs-attention flag its pause set is cleared. On a saga whose pause was
    /// requested but not yet applied, withdraws the request. Refused (`Conflict`) otherwise.
    pub async fn resume(&self, id: Uuid, reason: &'a Reason, actor: &'a str) -> Result<Saga> {
        let before = self.load(id).await?;
        if let Err(Refusal::Conflict(message)) = plan_resume(&before) {
            return Err(OperationError::Conflict(message));
        }
        let audit = self.audit(Some(actor), Some(reason.as_str()));
        Ok(self.store.resume(id, &audit).await?)
    }
}
