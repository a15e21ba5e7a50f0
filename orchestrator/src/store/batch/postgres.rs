//! The batch statements on PostgreSQL: each call is one statement (one round trip) of
//! data-modifying CTEs reading the batch's JSON arrays with `json_to_recordset`. The
//! `UPDATE sagas` is the fence; every dependent write joins its `RETURNING` list, and the
//! notifications of sagas that ended or were given back are sent from the same statement, so
//! they are delivered exactly when the transaction commits.

use sqlx::{Executor, PgConnection};

use super::{unreadable, ApplyRows, CreateRows, Item, NewItem};
use crate::model::Millis;
use crate::store::group_commit::BoxFuture;
use crate::store::rows::LogRow;
use crate::store::{Applied, Result, StoreError};

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

/// The parameters of every batch statement: $1 sagas, $2 the batch time (NULL in [`WHOLE`]:
/// the database clock), $3 steps, $4 finished attempts, $5 started attempts, $6 events, $7 the
/// batch's saga ids; $8 new sagas, $9 their steps ([`WHOLE`]). `= ANY($7)` on each table's
/// key lets the planner see how few rows are touched, where a join to `json_to_recordset`
/// (estimated at 100 rows) alone makes it scan a table that is still small, or was when the
/// plan was cached, in full.
macro_rules! apply_ctes {
    ($now:literal) => { concat!(
    "v AS (SELECT * FROM json_to_recordset($1::json) AS x(saga_id uuid, owner text, \
     epoch bigint, guard boolean, status text, next_run_at bigint, error text, output text, \
     attention boolean, pivot boolean, rel boolean)), \
     fenced AS (UPDATE sagas SET status = v.status, next_run_at = v.next_run_at, \
     error = v.error, output = COALESCE(v.output::jsonb, sagas.output), \
     needs_attention = v.attention, pivot_reached = v.pivot, updated_at = ", $now, ", \
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
     af AS (UPDATE attempts SET ended_at = ", $now, ", outcome = x.outcome, error = x.error \
     FROM json_to_recordset($4::json) AS x(saga_id uuid, epoch bigint, idx bigint, \
     phase text, attempt bigint, outcome text, error text) \
     WHERE attempts.saga_id = ANY($7::text[]::uuid[]) AND attempts.saga_id = x.saga_id \
     AND attempts.step_idx = x.idx \
     AND attempts.phase = x.phase AND attempts.attempt = x.attempt \
     AND (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced)), \
     ast AS (INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, \
     started_at) SELECT x.saga_id, x.idx, x.phase, x.attempt, x.owner, x.epoch, ", $now, " \
     FROM json_to_recordset($5::json) AS x(saga_id uuid, owner text, epoch bigint, \
     idx bigint, phase text, attempt bigint) \
     WHERE (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced)), \
     ev AS (INSERT INTO events (saga_id, at, type, step, data) \
     SELECT x.saga_id, ", $now, ", x.kind, x.step, x.data::jsonb \
     FROM ROWS FROM (json_to_recordset($6::json) AS (saga_id uuid, epoch bigint, kind text, \
     step text, data text)) WITH ORDINALITY AS x(saga_id, epoch, kind, step, data, ord) \
     WHERE (x.saga_id, x.epoch) IN (SELECT id, epoch FROM fenced) ORDER BY x.ord)",
    ) };
}

/// Each fenced lease with its notification: `saga_done` for an ended saga, `saga_due` for one
/// given back while still runnable (shutdown, a long backoff).
macro_rules! fenced_rows {
    () => {
        "SELECT f.id::text AS id, f.epoch, \
         CASE WHEN f.ended THEN pg_notify('saga_done', f.id::text || ' ' || f.status)::text \
         WHEN f.due THEN pg_notify('saga_due', '')::text END AS notified FROM fenced f"
    };
}

/// New sagas (`n`) with their steps and `saga.started` events, created at `$now`, given the
/// parameters holding the sagas and the steps.
macro_rules! create_ctes {
    ($sagas:literal, $steps:literal, $now:literal) => {
        concat!(
            "n AS (SELECT * FROM ROWS FROM (json_to_recordset(",
            $sagas,
            "::json) AS \
     (id uuid, name text, version bigint, hash text, key text, input text, owner text, \
     epoch bigint, ttl bigint)) WITH ORDINALITY AS x(id, name, version, hash, key, input, \
     owner, epoch, ttl, ord)), \
     cs AS (INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
     input, next_run_at, created_at, updated_at, lease_owner, lease_epoch, lease_expires_at) \
     SELECT id, name, version, hash, key, 'QUEUED', input::jsonb, ",
            $now,
            ", ",
            $now,
            ", ",
            $now,
            ", owner, epoch, ",
            $now,
            " + ttl FROM n), \
     cst AS (INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
     SELECT saga_id, idx, name, kind, 'PENDING', comp_status FROM json_to_recordset(",
            $steps,
            "::json) AS x(saga_id uuid, idx bigint, name text, kind text, comp_status text)), \
     cev AS (INSERT INTO events (saga_id, at, type, step, data) \
     SELECT id, ",
            $now,
            ", 'saga.started', NULL, \
     jsonb_build_object('name', name, 'version', version) FROM n ORDER BY ord)"
        )
    };
}

/// A saga created without a lease wakes the workers on commit.
macro_rules! wake_for_unleased {
    () => {
        "(SELECT pg_notify('saga_due', '')::text FROM n WHERE owner IS NULL LIMIT 1)"
    };
}

/// Applies transitions.
const APPLY: &str = concat!("WITH ", apply_ctes!("$2"), " ", fenced_rows!());

/// $1 the refused ids.
const REFUSED: &str = "SELECT id::text AS id, lease_owner, lease_epoch, cancel_requested \
     FROM sagas WHERE id IN (SELECT value::uuid FROM json_array_elements_text($1::json))";

/// Creates sagas: $1 sagas, $2 now, $3 steps.
const CREATE: &str = concat!(
    "WITH ",
    create_ctes!("$1", "$3", "$2"),
    " SELECT ",
    wake_for_unleased!(),
    " AS notified"
);

/// Creates sagas and applies transitions in one statement outside any transaction block (one
/// round trip, its own transaction), on the database clock, which every row returns as `now`;
/// the last row has no lease, only the time.
const WHOLE: &str = concat!(
    "WITH t AS (SELECT COALESCE($2::bigint, saga_now_ms()) AS now), ",
    create_ctes!("$8", "$9", "(SELECT now FROM t)"),
    ", ",
    apply_ctes!("(SELECT now FROM t)"),
    " SELECT fr.*, (SELECT now FROM t) AS now FROM (",
    fenced_rows!(),
    ") AS fr UNION ALL SELECT NULL, NULL, ",
    wake_for_unleased!(),
    ", (SELECT now FROM t)"
);

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
    results(conn, items, &fenced).await
}

/// Each item's result from the rows the fence returned.
async fn results(
    conn: &mut PgConnection,
    items: &[Item],
    fenced: &[sqlx::postgres::PgRow],
) -> Result<Vec<Result<Applied>>> {
    super::results::<sqlx::Postgres>(conn, REFUSED, items, fenced).await
}

/// [`whole_batch`] as a plain function pointer for the write queue.
pub(crate) fn whole_batch_boxed<'c>(
    conn: &'c mut PgConnection,
    _now: Millis,
    items: &'c [Item],
    news: &'c [NewItem],
) -> BoxFuture<'c, Result<(Vec<Result<Applied>>, Millis)>> {
    Box::pin(whole_batch(conn, items, news))
}

/// Creates `news` and applies `items` as one statement outside any transaction block: its own
/// transaction, one round trip, on the database clock. On `Err` nothing was committed and the
/// caller takes the long way, which isolates a write that breaks a statement.
pub(crate) async fn whole_batch(
    conn: &mut PgConnection,
    items: &[Item],
    news: &[NewItem],
) -> Result<(Vec<Result<Applied>>, Millis)> {
    let none = || "[]".to_owned();
    let apply = ApplyRows::of(items)?;
    let (new_sagas, new_steps) = if news.is_empty() {
        (none(), none())
    } else {
        let c = CreateRows::of(news)?;
        (c.sagas, c.steps)
    };
    let rows = sqlx::query(WHOLE)
        .bind(apply.sagas)
        .bind(None::<i64>)
        .bind(apply.steps)
        .bind(apply.finishes)
        .bind(apply.starts)
        .bind(apply.events)
        .bind(apply.ids)
        .bind(new_sagas)
        .bind(new_steps)
        .fetch_all(&mut *conn)
        .await?;
    // Committed: from here on an error must not send the caller the long way (it would write
    // the batch twice).
    let now = rows
        .last()
        .map(|row| row.get::<Millis>("now"))
        .transpose()
        .ok()
        .flatten();
    let Some(now) = now else {
        let e = StoreError::Io("the batch statement returned no time".to_owned());
        return Ok((unreadable(items, &e), 0));
    };
    let applied = results(conn, items, &rows)
        .await
        .unwrap_or_else(|e| unreadable(items, &e));
    Ok((applied, now))
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
    let rows = CreateRows::of(items)?;
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
