//! Retention: deleting finished sagas with everything that hangs off them (steps, attempts,
//! events, signals, callbacks, webhook deliveries, idempotency keys, search attributes), a
//! page at a time, written once for both databases.
//!
//! A page is found on a reader (the `sagas_status` index, one terminal status at a time, in id
//! order), then deleted in one short write transaction that checks each saga again: still
//! finished before the bound, not waiting for a person (`needs_attention`), not a child whose
//! parent is kept (a parent's page would otherwise link to nothing), and with nothing the
//! outbox still owes (an event the relay has not read, a delivery not yet delivered or given
//! up). Small pages keep each transaction short, so the engine's writes wait little.

use serde_json::json;
use uuid::Uuid;

use super::sql::{Arg, Dialect, Row, Tx};
use super::SqlBackend;
use crate::model::{Millis, SagaStatus};
use crate::store::rows::{parse_ids, LogRow};
use crate::store::{PurgeCursor, PurgePage, Result};

/// The statuses a purge goes through, in order; each is a keyset walk of `sagas_status`.
const FINISHED: [SagaStatus; 4] = [
    SagaStatus::Completed,
    SagaStatus::Compensated,
    SagaStatus::Aborted,
    SagaStatus::Failed,
];

/// The tables keyed by a saga's id, emptied of a purged saga's rows (`sagas` last).
const CHILD_TABLES: [&str; 9] = [
    "webhook_deliveries",
    "events",
    "attempts",
    "steps",
    "signals",
    "tasks",
    "saga_callbacks",
    "idempotency_keys",
    "saga_attrs",
];

/// One page of a purge from `cursor`: up to `limit` sagas finished before `before`, deleted
/// (or, with `dry_run`, only counted).
pub(crate) async fn purge_page<B: SqlBackend>(
    store: &B,
    before: Millis,
    cursor: PurgeCursor,
    limit: u32,
    dry_run: bool,
    attrs: &[(String, String)],
) -> Result<PurgePage> {
    let Some(status) = FINISHED.get(cursor.status) else {
        return Ok(PurgePage {
            purged: Vec::new(),
            next: None,
        });
    };
    let mut sql = "SELECT id::text AS id FROM sagas WHERE status = $1 AND id > $2 \
         AND updated_at < $3"
        .to_owned();
    let mut args = vec![
        Arg::Str(status.as_str()),
        Arg::Id(cursor.after.unwrap_or(Uuid::nil())),
        Arg::Int(before),
    ];
    // Only the sagas with these search attributes, as the list selects them.
    super::attrs::conditions(attrs, &mut sql, &mut args);
    args.push(Arg::Int(i64::from(limit.max(1))));
    sql.push_str(&format!(" ORDER BY id LIMIT ${}", args.len()));
    let rows = store.reader().all(&sql, &args).await?;
    let page = ids(&rows)?;
    // A short page ends this status: the next one starts from the beginning.
    let next = if page.len() < limit.max(1) as usize {
        PurgeCursor {
            status: cursor.status + 1,
            after: None,
        }
    } else {
        PurgeCursor {
            status: cursor.status,
            after: page.last().copied(),
        }
    };
    let next = (next.status < FINISHED.len()).then_some(next);
    if page.is_empty() {
        return Ok(PurgePage {
            purged: Vec::new(),
            next,
        });
    }
    let purged = if dry_run {
        let rows = store
            .reader()
            .all(
                &purgeable(store.reader().dialect()),
                &[Arg::Ids(&page), Arg::Int(before)],
            )
            .await?;
        ids(&rows)?
    } else {
        let mut tx = store.begin().await?;
        let purged = delete(&mut tx, &page, before).await?;
        store.commit(tx).await?;
        purged
    };
    Ok(PurgePage { purged, next })
}

/// The sagas of `$1` that may go: the conditions of the module's documentation.
fn purgeable(dialect: Dialect) -> String {
    let tx = dialect.event_tx();
    format!(
        "SELECT s.id::text AS id FROM sagas s \
         WHERE s.id = ANY($1) AND s.updated_at < $2 \
           AND s.status IN ('COMPLETED', 'COMPENSATED', 'ABORTED', 'FAILED') \
           AND NOT s.needs_attention \
           AND (s.parent_id IS NULL \
                OR NOT EXISTS (SELECT 1 FROM sagas p WHERE p.id = s.parent_id)) \
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.saga_id = s.id \
                           AND d.delivered_at IS NULL AND d.failed_at IS NULL) \
           AND NOT EXISTS (SELECT 1 FROM events e, relay_cursors c WHERE e.saga_id = s.id \
                           AND ({tx} > c.tx OR ({tx} = c.tx AND e.id > c.event_id)))"
    )
}

/// The `id` column of `rows`.
fn ids(rows: &[Row]) -> Result<Vec<Uuid>> {
    let texts = rows
        .iter()
        .map(|r| r.get::<String>("id"))
        .collect::<Result<Vec<_>>>()?;
    parse_ids(&texts)
}

/// Deletes what may go of `page`, checked inside the transaction; returns what went.
async fn delete(tx: &mut Tx, page: &[Uuid], before: Millis) -> Result<Vec<Uuid>> {
    let rows = tx
        .all(
            &purgeable(tx.dialect()),
            &[Arg::Ids(page), Arg::Int(before)],
        )
        .await?;
    let gone = ids(&rows)?;
    if gone.is_empty() {
        return Ok(gone);
    }
    if tx.dialect() == Dialect::Sqlite {
        // SQLite gives a new event the largest id + 1: the newest event row stays, emptied, so
        // that ids never go back below what a relay's cursor has passed.
        let data = json!({});
        tx.exec(
            "UPDATE events SET saga_id = $2, type = 'log.purged', step = NULL, data = $3 \
             WHERE id = (SELECT MAX(id) FROM events) AND saga_id = ANY($1)",
            &[Arg::Ids(&gone), Arg::Id(Uuid::nil()), Arg::Json(&data)],
        )
        .await?;
    }
    for table in CHILD_TABLES {
        tx.exec(
            &format!("DELETE FROM {table} WHERE saga_id = ANY($1)"),
            &[Arg::Ids(&gone)],
        )
        .await?;
    }
    tx.exec("DELETE FROM sagas WHERE id = ANY($1)", &[Arg::Ids(&gone)])
        .await?;
    Ok(gone)
}

/// Deletes the trigger refusals recorded before `before` (or, with `dry_run`, counts them): one
/// statement on the `trigger_refusals_at` index, since a refusal hangs off no saga.
pub(crate) async fn purge_trigger_refusals<B: SqlBackend>(
    store: &B,
    before: Millis,
    dry_run: bool,
) -> Result<u64> {
    if dry_run {
        let n: i64 = match store
            .reader()
            .opt(
                "SELECT COUNT(*) AS n FROM trigger_refusals WHERE refused_at < $1",
                &[Arg::Int(before)],
            )
            .await?
        {
            Some(row) => row.get("n")?,
            None => 0,
        };
        return Ok(u64::try_from(n).unwrap_or(0));
    }
    let mut tx = store.begin().await?;
    let deleted = tx
        .exec(
            "DELETE FROM trigger_refusals WHERE refused_at < $1",
            &[Arg::Int(before)],
        )
        .await?;
    store.commit(tx).await?;
    Ok(deleted)
}
