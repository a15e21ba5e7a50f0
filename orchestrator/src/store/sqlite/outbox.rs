//! [`OutboxStore`] on SQLite. Writers are serialised (`BEGIN IMMEDIATE` on the one writer
//! connection), so event ids are committed in order and the event id alone is the cursor.
//! Writes are few: one per batch of events read, one per batch of claims, one per attempt.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::SqliteStore;
use crate::store::outbox::{
    millis, ClaimedDelivery, NewDelivery, OutboxEvent, OutboxPosition, TargetKind,
};
use crate::store::rows::outbox_event_from_row;
use crate::store::shared::sql::Tx;
use crate::store::shared::SqlOutbox;
use crate::store::SqlxResultExt;
use crate::store::{Result, Store};

#[async_trait]
impl SqlOutbox for SqliteStore {
    async fn enqueue_deliveries(&self, tx: &mut Tx, deliveries: &[NewDelivery]) -> Result<()> {
        let now = tx.now();
        let conn = tx.sqlite_conn().expect("a SQLite store's transaction");
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
            "SELECT e.id AS event_id, 0 AS tx, e.saga_id, s.name AS saga_name, e.at, e.type, e.step, e.data \
             FROM events e JOIN sagas s ON s.id = e.saga_id \
             WHERE e.id > ?1 ORDER BY e.id LIMIT ?2",
        )
        .bind(after.event_id)
        .bind(i64::from(limit))
        .fetch_all(self.reader_pool())
        .await.db()?;
        rows.iter().map(outbox_event_from_row).collect()
    }

    async fn claim_deliveries(&self, limit: u32, lease: Duration) -> Result<Vec<ClaimedDelivery>> {
        let now = Store::now(self).await?;
        // Cheap check first, on the reader: most polls find nothing and need no write lock.
        let any: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM webhook_deliveries WHERE delivered_at IS NULL AND failed_at IS NULL \
             AND next_attempt_at <= ?1 LIMIT 1",
        )
        .bind(now)
        .fetch_optional(self.reader_pool())
        .await
        .db()?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let mut tx = self
            .writer_pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .db()?;
        let rows = sqlx::query(
            "SELECT d.event_id, d.target, d.kind, d.attempts, 0 AS tx, e.saga_id, s.name AS saga_name, \
             e.at, e.type, e.step, e.data, c.secret \
             FROM webhook_deliveries d \
             JOIN events e ON e.id = d.event_id \
             JOIN sagas s ON s.id = e.saga_id \
             LEFT JOIN saga_callbacks c ON c.saga_id = d.saga_id \
             WHERE d.delivered_at IS NULL AND d.failed_at IS NULL AND d.next_attempt_at <= ?1 \
               AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p \
                   WHERE p.saga_id = d.saga_id AND p.target = d.target AND p.event_id < d.event_id \
                     AND p.delivered_at IS NULL AND p.failed_at IS NULL) \
             ORDER BY d.next_attempt_at, d.event_id LIMIT ?2",
        )
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await
        .db()?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            let event = outbox_event_from_row(row)?;
            let target: String = row.try_get("target").db()?;
            let kind: String = row.try_get("kind").db()?;
            let attempts: i64 = row.try_get("attempts").db()?;
            sqlx::query(
                "UPDATE webhook_deliveries SET attempts = attempts + 1, next_attempt_at = ?1 \
                 WHERE event_id = ?2 AND target = ?3",
            )
            .bind(now.saturating_add(millis(lease)))
            .bind(event.id())
            .bind(&target)
            .execute(&mut *tx)
            .await
            .db()?;
            claimed.push(ClaimedDelivery {
                event,
                target,
                kind: TargetKind::parse(&kind),
                attempt: u32::try_from(attempts + 1).unwrap_or(u32::MAX),
                callback_secret: row.try_get("secret").db()?,
            });
        }
        tx.commit().await.db()?;
        Ok(claimed)
    }
}
