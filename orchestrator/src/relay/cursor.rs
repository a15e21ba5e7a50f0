//! A relay's durable cursor over the outbox, and the lag it reports.

use std::sync::Arc;

use crate::store::outbox::{NewDelivery, OutboxEvent, OutboxPosition, OutboxStore};
use crate::store::StoreError;

/// One relay's named cursor in `relay_cursors`: where it has read the outbox to, durably.
#[derive(Clone)]
pub(crate) struct Cursor {
    outbox: Arc<dyn OutboxStore>,
    name: String,
}

impl Cursor {
    /// The cursor `name` of `outbox`.
    pub(crate) fn new(outbox: Arc<dyn OutboxStore>, name: impl Into<String>) -> Self {
        Self {
            outbox,
            name: name.into(),
        }
    }

    /// Its name: the row in `relay_cursors` and the `target` label of its metrics.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The outbox it reads, for what a destination needs of it beyond the cursor.
    pub(crate) fn outbox(&self) -> &Arc<dyn OutboxStore> {
        &self.outbox
    }

    /// Where the cursor durably is.
    pub(crate) async fn durable(&self) -> Result<OutboxPosition, StoreError> {
        self.outbox.relay_cursor(&self.name).await
    }

    /// Up to `batch` events after `from`, in outbox order.
    pub(crate) async fn events_after(
        &self,
        from: OutboxPosition,
        batch: u32,
    ) -> Result<Vec<OutboxEvent>, StoreError> {
        self.outbox.outbox_after(from, batch).await
    }

    /// Moves the cursor from `from` to `to` and enqueues `deliveries` in the same transaction,
    /// compare-and-set: `false` when another process's relay moved it first.
    pub(crate) async fn advance(
        &self,
        from: OutboxPosition,
        to: OutboxPosition,
        deliveries: &[NewDelivery],
    ) -> Result<bool, StoreError> {
        self.outbox
            .advance_relay(&self.name, from, to, deliveries)
            .await
    }

    /// Sets the lag gauges of this relay, `outbox_lag_events` and `outbox_lag_seconds`; a store
    /// that does not answer leaves them as they were.
    pub(crate) async fn report_progress(&self) {
        let Ok(progress) = self.outbox.relay_progress(&self.name).await else {
            return;
        };
        let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
        metrics::gauge!("outbox_lag_events", "target" => self.name.clone())
            .set(progress.lag_events as f64);
        metrics::gauge!("outbox_lag_seconds", "target" => self.name.clone())
            .set(progress.lag_seconds(now));
    }
}
