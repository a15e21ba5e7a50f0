//! `pause`: stop a saga where it stands until a person resumes it.

use uuid::Uuid;

use super::{OperationError, Operations, Reason, Result};
use crate::model::rules::{plan_pause, Refusal};
use crate::model::Saga;

impl<'a> Operations<'a> {
    /// Pauses saga `id` for `reason`, audited as `actor`'s (`saga.paused`). A saga no worker
    /// holds (queued, or parked on a timer, a signal or a child) is `PAUSED` at once; one a
    /// worker drives is not taken over: the pause is recorded as requested
    /// (`saga.pause_requested`), its call in flight finishes and is recorded, and the worker
    /// then starts nothing new and gives it back `PAUSED`. Refused (`Conflict`) for a saga
    /// that has ended, is `FAILED` (use `retry` or `abort`), is paused or has a pause pending.
    pub async fn pause(&self, id: Uuid, reason: &'a Reason, actor: &'a str) -> Result<Saga> {
        let before = self.load(id).await?;
        let now = self.store.now().await?;
        if let Err(Refusal::Conflict(message)) = plan_pause(&before, now) {
            return Err(OperationError::Conflict(message));
        }
        let audit = self.audit(Some(actor), Some(reason.as_str()));
        Ok(self.store.pause(id, &audit).await?)
    }
}
