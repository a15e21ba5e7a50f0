//! `retry`: a waiting retry now, or another attempt of a `FAILED` saga's failed step.

use uuid::Uuid;

use super::{Operations, Result};
use crate::model::rules::{plan_retry, RetryPlan};
use crate::model::Saga;

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

impl Retried {
    /// What a retry does to `before`, the saga as it stood: the rule the store applies
    /// ([`plan_retry`]), said for a person.
    pub fn of(before: &Saga) -> Self {
        match plan_retry(before) {
            Ok(RetryPlan::Failed(step)) => Self::Step(step.name.clone()),
            _ if before.next_run_at.is_some() => Self::DueNow,
            _ => Self::NotWaiting,
        }
    }
}

impl<'a> Operations<'a> {
    /// Makes saga `id`'s waiting retry happen now, or gives a `FAILED` saga's failed step
    /// another attempt; audited as `actor`'s. Returns the saga as it left it.
    pub async fn retry(&self, id: Uuid, actor: &'a str) -> Result<Saga> {
        let audit = self.audit(Some(actor), None);
        Ok(self.store.retry_now(id, &audit).await?)
    }
}
