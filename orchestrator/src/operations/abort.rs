//! `abort`: stop driving a saga without compensating.

use uuid::Uuid;

use super::{Operations, Reason, Result};
use crate::model::Saga;

impl<'a> Operations<'a> {
    /// Aborts saga `id` for `reason`, audited as `actor`'s. A call in flight is recorded
    /// `abandoned`. No driver ends an aborted saga, so its span is emitted here.
    pub async fn abort(&self, id: Uuid, reason: &'a Reason, actor: &'a str) -> Result<Saga> {
        let audit = self.audit(Some(actor), Some(reason.as_str()));
        let saga = self.store.abort(id, &audit).await?;
        if let Some(telemetry) = self.telemetry {
            if let Some(trace) = telemetry.saga_trace(saga.id, saga.traceparent.as_deref()) {
                telemetry.end_saga(&saga, &trace, saga.updated_at);
            }
        }
        Ok(saga)
    }
}
