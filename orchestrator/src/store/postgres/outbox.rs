//! [`OutboxStore`] on PostgreSQL, for any number of processes sharing the database.
//!
//! - The relay reads events in `(tx, id)` order below `pg_snapshot_xmin(pg_current_snapshot())`:
//!   every transaction that could still commit an event there has ended, so the cursor never
//!   jumps over an event that becomes visible later.
//! - Cursor moves are a compare-and-set, so two relays never enqueue the same batch twice (and
//!   `ON CONFLICT DO NOTHING` would absorb it if they did).
//! - Senders claim with `FOR UPDATE SKIP LOCKED`; a claim pushes the delivery's due time past a
//!   lease, so a sender that dies mid-send is replaced once the lease runs out.
//!
//! [`OutboxStore`]: crate::store::OutboxStore

use async_trait::async_trait;
use uuid::Uuid;

use super::PgStore;
use crate::store::outbox::{NewDelivery, OutboxEvent, OutboxPosition};
use crate::store::shared::outbox::outbox_event_from_row;
use crate::store::shared::sql::Tx;
use crate::store::shared::SqlOutbox;
use crate::store::SqlxResultExt;
use crate::store::{Result, StoreError};

#[async_trait]
impl SqlOutbox for PgStore {
    async fn enqueue_deliveries(&self, tx: &mut Tx, deliveries: &[NewDelivery]) -> Result<()> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let now = tx.now().await?;
        let conn = tx.postgres_conn().ok_or_else(|| {
            StoreError::io("a PostgreSQL store was given another database's transaction")
        })?;
        let events: Vec<i64> = deliveries.iter().map(|d| d.event_id).collect();
        let targets: Vec<&str> = deliveries.iter().map(|d| d.target.as_str()).collect();
        let sagas: Vec<Uuid> = deliveries.iter().map(|d| d.saga_id).collect();
        let kinds: Vec<&str> = deliveries.iter().map(|d| d.kind.as_str()).collect();
        // One statement for the whole batch: its rows unnested from one array per column.
        sqlx::query(
            "INSERT INTO webhook_deliveries (event_id, target, saga_id, kind, next_attempt_at) \
             SELECT t.event_id, t.target, t.saga_id, t.kind, $5 \
             FROM UNNEST($1::bigint[], $2::text[], $3::uuid[], $4::text[]) \
                  AS t(event_id, target, saga_id, kind) \
             ON CONFLICT (event_id, target) DO NOTHING",
        )
        .bind(&events)
        .bind(&targets)
        .bind(&sagas)
        .bind(&kinds)
        .bind(now)
        .execute(&mut *conn)
        .await
        .db()?;
        Ok(())
    }

    async fn outbox_after(&self, after: OutboxPosition, limit: u32) -> Result<Vec<OutboxEvent>> {
        let rows = sqlx::query(
            "SELECT e.id AS event_id, e.tx::text::bigint AS tx, e.saga_id::text AS saga_id, \
             s.name AS saga_name, e.at, e.type, e.step, e.data::text AS data, s.traceparent \
             FROM events e JOIN sagas s ON s.id = e.saga_id \
             WHERE (e.tx, e.id) > ($1::bigint::text::xid8, $2) \
               AND e.tx < pg_snapshot_xmin(pg_current_snapshot()) \
             ORDER BY e.tx, e.id LIMIT $3",
        )
        .bind(after.tx)
        .bind(after.event_id)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .db()?;
        rows.iter().map(outbox_event_from_row).collect()
    }
}
