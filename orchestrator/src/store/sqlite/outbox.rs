//! [`OutboxStore`] on SQLite. Writers are serialised (`BEGIN IMMEDIATE` on the one writer
//! connection), so event ids are committed in order and the event id alone is the cursor.
//! Writes are few: one per batch of events read, one per batch of claims, one per attempt.
//!
//! [`OutboxStore`]: crate::store::OutboxStore

use async_trait::async_trait;

use super::SqliteStore;
use crate::store::outbox::{NewDelivery, OutboxEvent, OutboxPosition};
use crate::store::shared::outbox::outbox_event_from_row;
use crate::store::shared::sql::Tx;
use crate::store::shared::SqlOutbox;
use crate::store::SqlxResultExt;
use crate::store::{Result, StoreError};

#[async_trait]
impl SqlOutbox for SqliteStore {
    async fn enqueue_deliveries(&self, tx: &mut Tx, deliveries: &[NewDelivery]) -> Result<()> {
        let now = tx.now().await?;
        let conn = tx.sqlite_conn().ok_or_else(|| {
            StoreError::io("a SQLite store was given another database's transaction")
        })?;
        for d in deliveries {
            sqlx::query(
                "INSERT INTO webhook_deliveries (event_id, target, saga_id, kind, next_attempt_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (event_id, target) DO NOTHING",
            )
            .bind(d.event_id)
            .bind(&d.target)
            .bind(d.saga_id.to_string())
            .bind(d.kind.as_str())
            .bind(now)
            .execute(&mut *conn)
            .await
            .db()?;
        }
        Ok(())
    }

    async fn outbox_after(&self, after: OutboxPosition, limit: u32) -> Result<Vec<OutboxEvent>> {
        let rows = sqlx::query(
            "SELECT e.id AS event_id, 0 AS tx, e.saga_id, s.name AS saga_name, e.at, e.type, e.step, e.data, \
             s.traceparent \
             FROM events e JOIN sagas s ON s.id = e.saga_id \
             WHERE e.id > ?1 ORDER BY e.id LIMIT ?2",
        )
        .bind(after.event_id)
        .bind(i64::from(limit))
        .fetch_all(self.reader_pool())
        .await.db()?;
        rows.iter().map(outbox_event_from_row).collect()
    }
}
