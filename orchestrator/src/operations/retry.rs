//! `retry`: a waiting retry now, or another attempt of a `FAILED` saga's failed step.

use uuid::Uuid;

use super::{Operations, Result};
use crate::model::{Saga, SagaStatus, StepStatus};

/// What a retry did.
#[derive(Debug, Clone, PartialEq)]
pub enum Retried {
    /// The `FAILED` saga's step of this name gets another attempt; the saga runs again.
    Step(String),
    /// The saga's waiting retry is due now.
    DueNow,
    /// The saga was not waiting on a retry: nothing to hurry.
    NotWaiting,
}

impl Operations<'_> {
    /// Makes saga `id`'s waiting retry happen now, or gives a `FAILED` saga's failed step
    /// another attempt; audited as `actor`'s. Returns what it did and the saga as it left it.
    pub async fn retry(&self, id: Uuid, actor: &str) -> Result<(Retried, Saga)> {
        let before = self.load(id).await?;
        let saga = self.store.retry_now(id, actor).await?;
        let retried = if before.status == SagaStatus::Failed {
            let step = before
                .steps
                .iter()
                .find(|s| matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown))
                .map_or_else(|| "the failed step".to_owned(), |s| s.name.clone());
            Retried::Step(step)
        } else if before.next_run_at.is_some() {
            Retried::DueNow
        } else {
            Retried::NotWaiting
        };
        Ok((retried, saga))
    }
}
