//! The parts of the outbox both databases write the same way: a relay's cursor and its moves,
//! the callbacks of sagas, the end of a delivery attempt, a saga's deliveries and a relay's lag.
//! Reading events in commit order and enqueuing deliveries in bulk differ
//! (see each backend's `outbox.rs`).

use std::collections::HashMap;
use std::time::Duration;

use uuid::Uuid;

use super::sql::{Arg, Dialect, Reader, Row, Tx};
use super::SqlBackend;
use crate::model::Millis;
use crate::store::idempotency::Callback;
use crate::store::outbox::{
    millis, short_error, state_of, ClaimedDelivery, Delivery, DeliveryOutcome, DeliveryState,
    NewDelivery, OutboxPosition, RelayProgress, TargetKind,
};
use crate::store::rows::{corrupt, LogRow};
use crate::store::Result;

/// Where relay `name` stands (the start of the log if it never ran).
pub(crate) async fn relay_cursor(reader: Reader<'_>, name: &str) -> Result<OutboxPosition> {
    let row = reader
        .opt(
            "SELECT tx, event_id FROM relay_cursors WHERE name = $1",
            &[Arg::Str(name)],
        )
        .await?;
    match row {
        Some(row) => position_of(&row),
        None => Ok(OutboxPosition::default()),
    }
}

/// The position a `relay_cursors` row records.
fn position_of(row: &Row) -> Result<OutboxPosition> {
    Ok(OutboxPosition {
        tx: row.get("tx")?,
        event_id: row.get("event_id")?,
    })
}

/// The callbacks registered for `sagas`, by saga.
pub(crate) async fn saga_callbacks(
    reader: Reader<'_>,
    sagas: &[Uuid],
) -> Result<HashMap<Uuid, Callback>> {
    let rows = reader
        .all(
            "SELECT saga_id::text AS saga_id, url, secret FROM saga_callbacks \
             WHERE saga_id = ANY($1::uuid[])",
            &[Arg::Ids(sagas)],
        )
        .await?;
    let mut found = HashMap::with_capacity(rows.len());
    for row in &rows {
        let saga: String = row.get("saga_id")?;
        let id = Uuid::parse_str(&saga).map_err(|e| corrupt(&saga, e))?;
        let callback = Callback {
            url: row.get("url")?,
            secret: row.get("secret")?,
        };
        found.insert(id, callback);
    }
    Ok(found)
}

/// Moves relay `name`'s cursor from `from` to `to` (compare-and-set: `false`, and nothing
/// written, if another relay moved it first) and enqueues `deliveries`, in one transaction.
pub(crate) async fn advance_relay<B: SqlBackend>(
    store: &B,
    name: &str,
    from: OutboxPosition,
    to: OutboxPosition,
    deliveries: &[NewDelivery],
) -> Result<bool> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    insert_cursor(&mut tx, name, now).await?;
    let moved = tx
        .exec(
            "UPDATE relay_cursors SET tx = $1, event_id = $2, updated_at = $3 \
             WHERE name = $4 AND tx = $5 AND event_id = $6",
            &[
                Arg::Int(to.tx),
                Arg::Int(to.event_id),
                Arg::Int(now),
                Arg::Str(name),
                Arg::Int(from.tx),
                Arg::Int(from.event_id),
            ],
        )
        .await?;
    if moved == 0 {
        return Ok(false);
    }
    store.enqueue_deliveries(&mut tx, deliveries).await?;
    tx.commit().await?;
    Ok(true)
}

/// Claims up to `limit` due deliveries for `lease`: each one's attempt count goes up (the
/// attempt's fencing token) and it is not due again before the lease runs out, so a sender
/// that dies mid-send is replaced then. Never the next event of a saga for a target while an
/// earlier one is pending.
pub(crate) async fn claim_deliveries<B: SqlBackend>(
    store: &B,
    limit: u32,
    lease: Duration,
) -> Result<Vec<ClaimedDelivery>> {
    // A cheap look first, on a reader: most polls find nothing and need no write transaction.
    let now = crate::store::LogReads::now(store).await?;
    let any = store
        .reader()
        .opt(
            "SELECT 1 AS due FROM webhook_deliveries \
             WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= $1 LIMIT 1",
            &[Arg::Int(now)],
        )
        .await?;
    if any.is_none() {
        return Ok(Vec::new());
    }
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let dialect = tx.dialect();
    let rows = tx
        .all(
            &format!(
                "SELECT d.event_id, d.target, d.kind, d.attempts::bigint AS attempts, \
                 {} AS tx, e.saga_id::text AS saga_id, s.name AS saga_name, e.at, e.type, \
                 e.step, e.data::text AS data, s.traceparent, c.secret \
                 FROM webhook_deliveries d \
                 JOIN events e ON e.id = d.event_id \
                 JOIN sagas s ON s.id = e.saga_id \
                 LEFT JOIN saga_callbacks c ON c.saga_id = d.saga_id \
                 WHERE d.delivered_at IS NULL AND d.failed_at IS NULL AND d.next_attempt_at <= $1 \
                   AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p \
                       WHERE p.saga_id = d.saga_id AND p.target = d.target \
                         AND p.event_id < d.event_id \
                         AND p.delivered_at IS NULL AND p.failed_at IS NULL) \
                 ORDER BY d.next_attempt_at, d.event_id LIMIT $2{}",
                dialect.event_tx(),
                dialect.skip_locked("d"),
            ),
            &[Arg::Int(now), Arg::Int(i64::from(limit))],
        )
        .await?;
    let due_again = now.saturating_add(millis(lease));
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let event = outbox_event_from_row(row)?;
        let target: String = row.get("target")?;
        let attempts: i64 = row.get("attempts")?;
        tx.exec(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, next_attempt_at = $1 \
             WHERE event_id = $2 AND target = $3",
            &[Arg::Int(due_again), Arg::Int(event.id()), Arg::Str(&target)],
        )
        .await?;
        claimed.push(ClaimedDelivery {
            event,
            target,
            kind: TargetKind::parse(&row.get::<String>("kind")?),
            attempt: u32::try_from(attempts.saturating_add(1)).unwrap_or(u32::MAX),
            callback_secret: row.get("secret")?,
        });
    }
    tx.commit().await?;
    Ok(claimed)
}

/// Records how an attempt went, if it is still the delivery's latest (fenced on the attempt
/// number, so a sender whose claim ran out cannot overwrite its successor's outcome).
pub(crate) async fn finish_delivery<B: SqlBackend>(
    store: &B,
    event_id: i64,
    target: &str,
    attempt: u32,
    outcome: &DeliveryOutcome,
) -> Result<()> {
    const FENCE: &str = " WHERE event_id = $1 AND target = $2 AND attempts = $3 \
                         AND delivered_at IS NULL AND failed_at IS NULL";
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let fence = [
        Arg::Int(event_id),
        Arg::Str(target),
        Arg::Int(i64::from(attempt)),
    ];
    match outcome {
        DeliveryOutcome::Delivered { status } => {
            let [a, b, c] = fence;
            tx.exec(
                &format!(
                    "UPDATE webhook_deliveries SET delivered_at = $4, last_status = $5, \
                     last_error = NULL{FENCE}"
                ),
                &[a, b, c, Arg::Int(now), Arg::Int(i64::from(*status))],
            )
            .await?;
        }
        DeliveryOutcome::Failed {
            status,
            error,
            retry_in,
        } => {
            let (next, failed) = match retry_in {
                Some(d) => (now.saturating_add(millis(*d)), None),
                None => (now, Some(now)),
            };
            let error = short_error(error);
            let [a, b, c] = fence;
            tx.exec(
                &format!(
                    "UPDATE webhook_deliveries SET next_attempt_at = $4, failed_at = $5, \
                     last_status = $6, last_error = $7{FENCE}"
                ),
                &[
                    a,
                    b,
                    c,
                    Arg::Int(next),
                    Arg::OptInt(failed),
                    Arg::OptInt(status.map(i64::from)),
                    Arg::Str(&error),
                ],
            )
            .await?;
        }
    }
    tx.commit().await.map(|_| ())
}

/// A saga's webhook deliveries, by event and target.
pub(crate) async fn deliveries(reader: Reader<'_>, saga: Uuid) -> Result<Vec<Delivery>> {
    let rows = reader
        .all(
            "SELECT d.event_id, e.type, d.target, d.kind, d.attempts::bigint AS attempts, \
             d.next_attempt_at, d.delivered_at, d.failed_at, \
             d.last_status::bigint AS last_status, d.last_error \
             FROM webhook_deliveries d JOIN events e ON e.id = d.event_id \
             WHERE d.saga_id = $1 ORDER BY d.event_id, d.target",
            &[Arg::Id(saga)],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let delivered_at: Option<Millis> = row.get("delivered_at")?;
            let state = state_of(delivered_at, row.get("failed_at")?);
            let attempts: i64 = row.get("attempts")?;
            let status: Option<i64> = row.get("last_status")?;
            Ok(Delivery {
                event_id: row.get("event_id")?,
                kind: row.get("type")?,
                target: row.get("target")?,
                target_kind: TargetKind::parse(&row.get::<String>("kind")?),
                state,
                attempts: u32::try_from(attempts).unwrap_or(0),
                next_attempt_at: if state == DeliveryState::Pending {
                    row.get("next_attempt_at")?
                } else {
                    None
                },
                delivered_at,
                last_status: status.and_then(|s| u16::try_from(s).ok()),
                last_error: row.get("last_error")?,
            })
        })
        .collect()
}

/// Where relay `name` stands and what it has not read yet.
pub(crate) async fn relay_progress(reader: Reader<'_>, name: &str) -> Result<RelayProgress> {
    let row = reader
        .opt(
            "SELECT tx, event_id, updated_at FROM relay_cursors WHERE name = $1",
            &[Arg::Str(name)],
        )
        .await?;
    let (cursor, updated_at) = match row {
        Some(row) => (position_of(&row)?, Some(row.get("updated_at")?)),
        None => (OutboxPosition::default(), None),
    };
    progress_after(reader, name, cursor, updated_at).await
}

/// The progress of every relay with a cursor.
pub(crate) async fn relays(reader: Reader<'_>) -> Result<Vec<RelayProgress>> {
    let rows = reader
        .all(
            "SELECT name, tx, event_id, updated_at FROM relay_cursors ORDER BY name",
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = row.get("name")?;
        let cursor = position_of(row)?;
        let progress = progress_after(reader, &name, cursor, Some(row.get("updated_at")?)).await?;
        out.push(progress);
    }
    Ok(out)
}

/// How many unread events are counted at most for a relay's lag on PostgreSQL; a longer
/// backlog reads as this many, and its age (the oldest event's) still tells how bad it is.
pub(crate) const LAG_COUNT_CAP: i64 = 100_000;

/// A relay's progress given its cursor: the events after it in the order the relay reads
/// them, the oldest found through an index, so this stays cheap however long the outbox.
///
/// SQLite's one writer commits ids in order and leaves no gaps, so the lag is the distance to
/// the last id. PostgreSQL's ids commit out of order and skip values: the relay reads by
/// (transaction, id), and the events after that position are counted, up to
/// [`LAG_COUNT_CAP`].
async fn progress_after(
    reader: Reader<'_>,
    name: &str,
    cursor: OutboxPosition,
    updated_at: Option<Millis>,
) -> Result<RelayProgress> {
    let nil = Arg::Id(Uuid::nil());
    let row = match reader.dialect() {
        Dialect::Sqlite => {
            reader
                .opt(
                    "SELECT (SELECT COALESCE(MAX(id), 0) FROM events) - $1 AS lag, \
                     (SELECT at FROM events WHERE id > $1 AND saga_id <> $2::uuid \
                      ORDER BY id LIMIT 1) AS oldest",
                    &[Arg::Int(cursor.event_id), nil],
                )
                .await?
        }
        Dialect::Postgres => {
            reader
                .opt(
                    "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM events \
                             WHERE (tx, id) > ($1::bigint::text::xid8, $2) LIMIT $4) AS after) \
                     AS lag, \
                     (SELECT at FROM events WHERE (tx, id) > ($1::bigint::text::xid8, $2) \
                      AND saga_id <> $3::uuid ORDER BY tx, id LIMIT 1) AS oldest",
                    &[
                        Arg::Int(cursor.tx),
                        Arg::Int(cursor.event_id),
                        nil,
                        Arg::Int(LAG_COUNT_CAP),
                    ],
                )
                .await?
        }
    };
    let (lag, oldest): (i64, Option<Millis>) = match row {
        Some(row) => (row.get("lag")?, row.get("oldest")?),
        None => (0, None),
    };
    Ok(RelayProgress {
        name: name.to_owned(),
        event_id: cursor.event_id,
        updated_at,
        lag_events: if oldest.is_some() { lag.max(0) } else { 0 },
        oldest_unread_at: oldest,
    })
}

/// In `tx`: relay `name`'s cursor at the start of the log, if it has none.
async fn insert_cursor(tx: &mut Tx, name: &str, now: Millis) -> Result<()> {
    tx.exec(
        "INSERT INTO relay_cursors (name, tx, event_id, updated_at) VALUES ($1, 0, 0, $2) \
         ON CONFLICT (name) DO NOTHING",
        &[Arg::Str(name), Arg::Int(now)],
    )
    .await?;
    Ok(())
}

/// Creates relay `name`'s cursor, at the start of the log, if it has none.
pub(crate) async fn open_relay<B: SqlBackend>(store: &B, name: &str) -> Result<()> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    insert_cursor(&mut tx, name, now).await?;
    tx.commit().await?;
    Ok(())
}

/// The log's identity, made on first use (concurrent first uses agree: one insert wins).
pub(crate) async fn log_id<B: SqlBackend>(store: &B) -> Result<Uuid> {
    let read = "SELECT log_id FROM log_identity WHERE singleton = 1";
    if let Some(row) = store.reader().opt(read, &[]).await? {
        return parse_log_id(row.get("log_id")?);
    }
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let made = Uuid::new_v4().to_string();
    tx.exec(
        "INSERT INTO log_identity (singleton, log_id, created_at) VALUES (1, $1, $2) \
         ON CONFLICT (singleton) DO NOTHING",
        &[Arg::Str(&made), Arg::Int(now)],
    )
    .await?;
    let row = tx.opt(read, &[]).await?;
    tx.commit().await?;
    match row {
        Some(row) => parse_log_id(row.get("log_id")?),
        None => Err(corrupt("log_identity", "no row after its insert")),
    }
}

fn parse_log_id(text: String) -> Result<Uuid> {
    Uuid::parse_str(&text).map_err(|e| corrupt(&text, e))
}

/// An outbox event from a row with columns `event_id`, `tx` (the committing transaction on
/// PostgreSQL, `0` on SQLite), `saga_id` as text, `saga_name`, `at`, `type`, `step`, `data`
/// as text and the saga's `traceparent`.
pub(crate) fn outbox_event_from_row<R: LogRow>(
    row: &R,
) -> Result<crate::store::outbox::OutboxEvent> {
    let saga: String = row.get("saga_id")?;
    let data: Option<String> = row.get("data")?;
    Ok(crate::store::outbox::OutboxEvent {
        position: crate::store::outbox::OutboxPosition {
            tx: row.get("tx")?,
            event_id: row.get("event_id")?,
        },
        saga_id: Uuid::parse_str(&saga).map_err(|e| corrupt(&saga, e))?,
        saga_name: row.get("saga_name")?,
        kind: row.get("type")?,
        step: row.get("step")?,
        at: row.get("at")?,
        data: data
            .and_then(|d| serde_json::from_str(&d).ok())
            .unwrap_or(serde_json::Value::Null),
        traceparent: row.get("traceparent")?,
    })
}
