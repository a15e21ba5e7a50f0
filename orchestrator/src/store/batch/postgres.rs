//! The batch statements on PostgreSQL: each call is one statement (one round trip) of
//! data-modifying CTEs reading the batch's JSON arrays with `json_to_recordset`. The
//! `UPDATE sagas` is the fence; every dependent write joins its `RETURNING` list, and the
//! notifications of sagas that ended or were given back are sent from the same statement, so
//! they are delivered exactly when the transaction commits.

use std::collections::HashMap;

use sqlx::{Executor, PgConnection};

use super::{
    fenced_leases, outcomes, refused_ids, refused_rows, ApplyRows, CreateRows, Item, NewItem,
};
use crate::model::Millis;
use crate::store::group_commit::BoxFuture;
use crate::store::{Applied, Result};

/// A phase column of a step row: the new value if the phase changed, else the stored one.
macro_rules! phase_col {
    ($p:literal, $col:literal, $key:literal, $ty:literal) => {
        concat!(
            $col,
            " = CASE WHEN x.",
            $p,
            " IS NULL THEN steps.",
            $col,
            " ELSE (x.",
            $p,
            "->>'",
            $key,
            "')::",
            $ty,
            " END"
        )
    };
}

/// $1 sagas, $2 now, $3 steps, $4 finished attempts, $5 started attempts, $6 events, $7 the
/// batch's saga ids: `= ANY($7)` on each table's key lets the planner see how few rows are
/// touched, where a join to `json_to_recordset` (estimated at 100 rows) alone makes it scan a
/// table that is still small, or was when the plan was cached, in full.
const APPLY: &str = concat!(
    "WITH v AS (SELECT * FROM json_to_recordset($1::json) AS x(saga_id uuid, owner text, \
     epoch bigint, guard boolean, status text, next_run_at bigint, error text, output text, \
     attention boolean, pivot boolean, rel boolean)), \
     fenced AS (UPDATE sagas SET status = v.status, next_run_at = v.next_run_at, \
     error = v.error, output = COALESCE(v.output::jsonb, sagas.output), \
     needs_attention = v.attention, pivot_reached = v.pivot, updated_at = $2, \
     lease_owner = CASE WHEN v.rel THEN NULL ELSE sagas.lease_owner END, \
     lease_expires_at = CASE WHEN v.rel THEN NULL ELSE sagas.lease_expires_at END \
     FROM v WHERE sagas.id = ANY($7::text[]::uuid[]) AND sagas.id = v.saga_id \
     AND sagas.lease_owner = v.owner \
     AND sagas.lease_epoch = v.epoch AND NOT (v.guard AND sagas.cancel_requested) \
     RETURNING sagas.id, sagas.lease_epoch AS epoch, \
     v.status, v.status IN ('COMPLETED', 'COMPENSATED', 'FAILED', 'ABORTED') AS ended, \
     v.rel AND v.next_run_at IS NOT NULL AS due), \
     st AS (UPDATE steps SET ",
    phase_col!("a", "status", "status", "text"),
    ", ",
    phase_col!("a", "attempts", "attempts", "bigint"),
    ", ",
    phase_col!("a", "last_error", "error", "text"),
    ", ",
    phase_col!("a", "outcome_unknown", "unknown", "boolean"),
    ", ",
    phase_col!("a", "started_at", "started", "bigint"),
    ", ",
    phase_col!("a", "ended_at", "ended", "bigint"),
    ", ",
    "output = COALESCE(x.output::jsonb, steps.output), ",
    phase_col!("c", "comp_status", "status", "text"),
    ", ",
    phase_col!("c", "comp_attempts", "attempts", "bigint"),
    ", ",
    phase_col!("c", "comp_last_error", "error", "text"),
    ", ",
    phase_col!("c", "comp_outcome_unknown", "unknown", "boolean"),
    ", ",
    phase_col!("c", "comp_started_at", "started", "bigint"),
    ", ",
    phase_col!("c", "comp_ended_at", "ended", "bigint"),
    " FROM json_to_recordset($3::json) AS x(saga_id uuid, epoch bigint, idx bigint, a json, \
     c json, output text) \
     WHERE steps.saga_id = ANY($7::text[]::uuid[]) AND steps.saga_id = x.saga_id \
     AND steps.idx = x.idx \
     AND (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced)), \
     af AS (UPDATE attempts SET ended_at = $2, outcome = x.outcome, error = x.error \
     FROM json_to_recordset($4::json) AS x(saga_id uuid, epoch bigint, idx bigint, \
     phase text, attempt bigint, outcome text, error text) \
     WHERE attempts.saga_id = ANY($7::text[]::uuid[]) AND attempts.saga_id = x.saga_id \
     AND attempts.step_idx = x.idx \
     AND attempts.phase = x.phase AND attempts.attempt = x.attempt \
     AND (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced)), \
     ast AS (INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, \
     started_at) SELECT x.saga_id, x.idx, x.phase, x.attempt, x.owner, x.epoch, $2 \
     FROM json_to_recordset($5::json) AS x(saga_id uuid, owner text, epoch bigint, \
     idx bigint, phase text, attempt bigint) \
     WHERE (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced)), \
     ev AS (INSERT INTO events (saga_id, at, type, step, data) \
     SELECT x.saga_id, $2, x.kind, x.step, x.data::jsonb \
     FROM ROWS FROM (json_to_recordset($6::json) AS (saga_id uuid, epoch bigint, kind text, \
     step text, data text)) WITH ORDINALITY AS x(saga_id, epoch, kind, step, data, ord) \
     WHERE (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced) ORDER BY x.ord) \
     SELECT f.id::text AS id, f.epoch, \
     CASE WHEN f.ended THEN pg_notify('saga_done', f.id::text || ' ' || f.status)::text \
     WHEN f.due THEN pg_notify('saga_due', '')::text END AS notified \
     FROM fenced f"
);

/// $1 the refused ids.
const REFUSED: &str = "SELECT id::text AS id, lease_owner, lease_epoch, cancel_requested \
     FROM sagas WHERE id IN (SELECT value::uuid FROM json_array_elements_text($1::json))";

/// $1 sagas, $2 now, $3 steps. A saga created without a lease wakes the workers on commit.
const CREATE: &str = "WITH n AS (SELECT * FROM ROWS FROM (json_to_recordset($1::json) AS \
     (id uuid, name text, version bigint, hash text, key text, input text, owner text, \
     epoch bigint, expires bigint)) WITH ORDINALITY AS x(id, name, version, hash, key, input, \
     owner, epoch, expires, ord)), \
     s AS (INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
     input, next_run_at, created_at, updated_at, lease_owner, lease_epoch, lease_expires_at) \
     SELECT id, name, version, hash, key, 'QUEUED', input::jsonb, $2, $2, $2, owner, epoch, \
     expires FROM n), \
     st AS (INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
     SELECT saga_id, idx, name, kind, 'PENDING', comp_status FROM json_to_recordset($3::json) \
     AS x(saga_id uuid, idx bigint, name text, kind text, comp_status text)), \
     ev AS (INSERT INTO events (saga_id, at, type, step, data) \
     SELECT id, $2, 'saga.started', NULL, jsonb_build_object('name', name, 'version', version) \
     FROM n ORDER BY ord) \
     SELECT pg_notify('saga_due', '')::text AS notified FROM n WHERE owner IS NULL LIMIT 1";

/// Opens the savepoint that makes a call atomic, unless the call is alone in its transaction
/// (whose rollback then undoes it).
async fn open(conn: &mut PgConnection, guarded: bool) -> Result<()> {
    if guarded {
        conn.execute("SAVEPOINT batch").await?;
    }
    Ok(())
}

/// Closes what [`open`] opened: kept if `result` is `Ok`, undone if not.
async fn close<T>(conn: &mut PgConnection, guarded: bool, result: Result<T>) -> Result<T> {
    if guarded {
        let sql = match result {
            Ok(_) => "RELEASE SAVEPOINT batch",
            Err(_) => "ROLLBACK TO SAVEPOINT batch; RELEASE SAVEPOINT batch",
        };
        conn.execute(sql).await?;
    }
    result
}

/// [`apply_batch`] as a plain function pointer for the write queue.
pub(crate) fn apply_batch_boxed<'c>(
    conn: &'c mut PgConnection,
    now: Millis,
    items: &'c [Item],
    guarded: bool,
) -> BoxFuture<'c, Result<Vec<Result<Applied>>>> {
    Box::pin(apply_batch(conn, now, items, guarded))
}

/// Applies `items` inside the caller's transaction, atomically; one result per item, in order.
pub(crate) async fn apply_batch(
    conn: &mut PgConnection,
    now: Millis,
    items: &[Item],
    guarded: bool,
) -> Result<Vec<Result<Applied>>> {
    let rows = ApplyRows::of(items)?;
    open(conn, guarded).await?;
    let fenced = sqlx::query(APPLY)
        .bind(rows.sagas)
        .bind(now)
        .bind(rows.steps)
        .bind(rows.finishes)
        .bind(rows.starts)
        .bind(rows.events)
        .bind(rows.ids)
        .fetch_all(&mut *conn)
        .await
        .map_err(Into::into);
    let fenced = close(conn, guarded, fenced).await?;
    let written = fenced_leases(&fenced)?;
    let mut refused = HashMap::new();
    if let Some(ids) = refused_ids(items, &written) {
        refused = refused_rows(&sqlx::query(REFUSED).bind(ids).fetch_all(&mut *conn).await?)?;
    }
    Ok(outcomes(items, &written, &refused))
}

/// [`insert_sagas`] as a plain function pointer for the write queue.
pub(crate) fn insert_sagas_boxed<'c>(
    conn: &'c mut PgConnection,
    now: Millis,
    items: &'c [NewItem],
    guarded: bool,
) -> BoxFuture<'c, Result<()>> {
    Box::pin(insert_sagas(conn, now, items, guarded))
}

/// Creates sagas, their steps and their `saga.started` events, atomically.
pub(crate) async fn insert_sagas(
    conn: &mut PgConnection,
    now: Millis,
    items: &[NewItem],
    guarded: bool,
) -> Result<()> {
    let rows = CreateRows::of(items, now)?;
    open(conn, guarded).await?;
    let done = sqlx::query(CREATE)
        .bind(rows.sagas)
        .bind(now)
        .bind(rows.steps)
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(Into::into);
    close(conn, guarded, done).await
}
