//! `mark-compensated`: an operator vouches that a stuck compensation was done by hand.

use uuid::Uuid;

use super::{step_refused, Operations, Reason, Result};
use crate::model::rules::check_mark_compensated;
use crate::model::Saga;

impl Operations<'_> {
    /// Records that step `step` of saga `id` was compensated by hand (`MANUAL`), audited as
    /// `actor`'s with `reason`; only while the saga is `COMPENSATING` and the step still needs
    /// it. A compensation in flight is recorded `abandoned`.
    pub async fn mark_compensated(
        &self,
        id: Uuid,
        step: &str,
        reason: &Reason,
        actor: &str,
    ) -> Result<Saga> {
        let before = self.load(id).await?;
        if let Err(refusal) = check_mark_compensated(&before, step) {
            return Err(step_refused(&before, step, refusal));
        }
        Ok(self
            .store
            .mark_compensated(id, step, reason.as_str(), actor)
            .await?)
    }
}
