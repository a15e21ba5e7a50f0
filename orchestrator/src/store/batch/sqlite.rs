//! The batch statements on SQLite: each call is one round of several statements sent together
//! (one hop to the driver's thread), reading the batch's JSON arrays with `json_each`. SQLite
//! has no data-modifying CTEs, so each dependent statement re-checks the fence itself, and the
//! `UPDATE sagas` that may give the lease up runs last.
//!
//! Parameters are written `$N`, not `?N`: SQLite numbers `?N` slots by their largest index, and
//! the driver, binding several statements of one text in turn, reads the gaps of a statement
//! that uses only `?2` and `?5` as anonymous parameters and stops binding before `?5`. Named
//! `$N` slots have no gaps.

use sqlx::{Executor, SqliteConnection};

use super::{unreadable, ApplyRows, CreateRows, Item, NewItem};
use crate::model::Millis;
use crate::store::group_commit::BoxFuture;
use crate::store::idempotency::{retention_ms, Callback, IdempotencyKey, SavedResponse};
use crate::store::{Applied, NewSaga, Result, StoreError};

/// `x` joined to its saga, where the saga still carries the row's lease.
macro_rules! rows {
    ($param:literal) => {
        concat!(
            "WITH j AS MATERIALIZED (SELECT key, value FROM json_each(",
            $param,
            ")) "
        )
    };
}

macro_rules! fenced {
    ($cols:literal, $param:literal) => {
        concat!(
            "(SELECT j.key AS ord, j.value->>'saga_id' AS saga_id, j.value->>'owner' AS owner, \
             j.value->>'epoch' AS epoch, j.value->>'guard' AS guard, ",
            $cols,
            " FROM j) AS x JOIN sagas s ON s.id = x.saga_id AND s.lease_owner = x.owner \
             AND s.lease_epoch = x.epoch AND NOT (x.guard AND s.cancel_requested)"
        )
    };
}

/// The parameters of every batch statement, one numbering for all so that the statements of
/// creates and transitions can go together: $1 sagas, $2 now, $3 steps, $4 finished attempts,
/// $5 started attempts, $6 events (transitions); $7 new sagas, $8 their steps.
macro_rules! apply_sql {
    () => { concat!(
    "SAVEPOINT apply;",
    rows!("$3"),
    "UPDATE steps SET \
     status = COALESCE(x.a_status, steps.status), \
     attempts = CASE WHEN x.a_status IS NULL THEN steps.attempts ELSE x.a_attempts END, \
     last_error = CASE WHEN x.a_status IS NULL THEN steps.last_error ELSE x.a_error END, \
     outcome_unknown = CASE WHEN x.a_status IS NULL THEN steps.outcome_unknown ELSE x.a_unknown END, \
     started_at = CASE WHEN x.a_status IS NULL THEN steps.started_at ELSE x.a_started END, \
     ended_at = CASE WHEN x.a_status IS NULL THEN steps.ended_at ELSE x.a_ended END, \
     output = COALESCE(x.output, steps.output), \
     comp_status = COALESCE(x.c_status, steps.comp_status), \
     comp_attempts = CASE WHEN x.c_status IS NULL THEN steps.comp_attempts ELSE x.c_attempts END, \
     comp_last_error = CASE WHEN x.c_status IS NULL THEN steps.comp_last_error ELSE x.c_error END, \
     comp_outcome_unknown = CASE WHEN x.c_status IS NULL THEN steps.comp_outcome_unknown ELSE x.c_unknown END, \
     comp_started_at = CASE WHEN x.c_status IS NULL THEN steps.comp_started_at ELSE x.c_started END, \
     comp_ended_at = CASE WHEN x.c_status IS NULL THEN steps.comp_ended_at ELSE x.c_ended END \
     FROM ",
    fenced!(
        "j.value->>'idx' AS idx, j.value->>'output' AS output, \
         j.value->>'$.a.status' AS a_status, j.value->>'$.a.attempts' AS a_attempts, \
         j.value->>'$.a.error' AS a_error, j.value->>'$.a.unknown' AS a_unknown, \
         j.value->>'$.a.started' AS a_started, j.value->>'$.a.ended' AS a_ended, \
         j.value->>'$.c.status' AS c_status, j.value->>'$.c.attempts' AS c_attempts, \
         j.value->>'$.c.error' AS c_error, j.value->>'$.c.unknown' AS c_unknown, \
         j.value->>'$.c.started' AS c_started, j.value->>'$.c.ended' AS c_ended",
        "$3"
    ),
    " WHERE steps.saga_id = x.saga_id AND steps.idx = x.idx;",
    // Finishes first: a transition may close attempt n and start attempt n + 1.
    rows!("$4"),
    "UPDATE attempts SET ended_at = $2, outcome = x.outcome, error = x.error FROM ",
    fenced!(
        "j.value->>'idx' AS idx, j.value->>'phase' AS phase, j.value->>'attempt' AS attempt, \
         j.value->>'outcome' AS outcome, j.value->>'error' AS error",
        "$4"
    ),
    " WHERE attempts.saga_id = x.saga_id AND attempts.step_idx = x.idx \
     AND attempts.phase = x.phase AND attempts.attempt = x.attempt;",
    rows!("$5"),
    "INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, started_at) \
     SELECT x.saga_id, x.idx, x.phase, x.attempt, x.owner, x.epoch, $2 FROM ",
    fenced!(
        "j.value->>'idx' AS idx, j.value->>'phase' AS phase, j.value->>'attempt' AS attempt",
        "$5"
    ),
    " ORDER BY x.ord;",
    rows!("$6"),
    "INSERT INTO events (saga_id, at, type, step, data) \
     SELECT x.saga_id, $2, x.kind, x.step, x.data FROM ",
    fenced!(
        "j.value->>'kind' AS kind, j.value->>'step' AS step, j.value->>'data' AS data",
        "$6"
    ),
    " ORDER BY x.ord;",
    // The fence itself, last: it may give the lease up.
    rows!("$1"),
    "UPDATE sagas SET status = x.status, next_run_at = x.next_run_at, error = x.error, \
     output = COALESCE(x.output, sagas.output), needs_attention = x.attention, \
     pivot_reached = x.pivot, updated_at = $2, \
     lease_owner = CASE WHEN x.rel THEN NULL ELSE sagas.lease_owner END, \
     lease_expires_at = CASE WHEN x.rel THEN NULL ELSE sagas.lease_expires_at END \
     FROM (SELECT j.value->>'saga_id' AS id, j.value->>'owner' AS owner, \
     j.value->>'epoch' AS epoch, j.value->>'guard' AS guard, j.value->>'status' AS status, \
     j.value->>'next_run_at' AS next_run_at, j.value->>'error' AS error, \
     j.value->>'output' AS output, j.value->>'attention' AS attention, \
     j.value->>'pivot' AS pivot, j.value->>'rel' AS rel FROM j) AS x \
     WHERE sagas.id = x.id AND sagas.lease_owner = x.owner AND sagas.lease_epoch = x.epoch \
     AND NOT (x.guard AND sagas.cancel_requested) \
     RETURNING sagas.id AS id, sagas.lease_epoch AS epoch;",
    "RELEASE apply;"
    ) };
}

/// $1 the refused ids.
const REFUSED: &str = "SELECT id, lease_owner, lease_epoch, cancel_requested FROM sagas \
     WHERE id IN (SELECT value FROM json_each($1))";

/// New sagas, their steps and `saga.started` events: the parameters holding the sagas, the
/// steps and the time, and a condition (`WHERE …`, or empty) every row must meet.
macro_rules! create_sql {
    ($sagas:literal, $steps:literal, $now:literal, $only_if:literal) => { concat!(
    "SAVEPOINT create_sagas;",
    rows!($sagas),
    "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, input, \
     next_run_at, created_at, updated_at, lease_owner, lease_epoch, lease_expires_at) \
     SELECT j.value->>'id', j.value->>'name', j.value->>'version', j.value->>'hash', \
     j.value->>'key', 'QUEUED', j.value->>'input', ", $now, ", ", $now, ", ", $now, ", \
     j.value->>'owner', j.value->>'epoch', ", $now, " + (j.value->>'ttl') FROM j ", $only_if, ";",
    rows!($steps),
    "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
     SELECT j.value->>'saga_id', j.value->>'idx', j.value->>'name', j.value->>'kind', \
     'PENDING', j.value->>'comp_status' FROM j ", $only_if, ";",
    rows!($sagas),
    "INSERT INTO events (saga_id, at, type, step, data) \
     SELECT j.value->>'id', ", $now, ", 'saga.started', NULL, \
     json_object('name', j.value->>'name', 'version', j.value->>'version') \
     FROM j ", $only_if, " ORDER BY j.key;",
    "RELEASE create_sagas;"
    ) };
}

/// Applies transitions.
const APPLY: &str = apply_sql!();

/// Creates sagas.
const CREATE: &str = create_sql!("$7", "$8", "$2", "");

/// A whole batch of creates and transitions as one transaction, in one round.
const WHOLE: &str = concat!(
    "BEGIN IMMEDIATE;",
    create_sql!("$7", "$8", "$2", ""),
    apply_sql!(),
    "COMMIT;"
);

/// An idempotent start: $1 scope, $2 key, $3 request fingerprint, $4 the new saga's id, $5 and
/// $6 the saved answer (or NULL), $7 now, $8 when the key expires, $9 and $10 the saga and its
/// steps, $11 and $12 a completion callback (or NULL). The saga is written only if the key
/// now names it, that is, if this request recorded the key; then the key's row is returned.
const KEYED_START: &str = concat!(
    "SAVEPOINT keyed;",
    // An expired key the sweeper has not removed yet is as good as gone.
    "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND expires_at <= $7;",
    "INSERT INTO idempotency_keys (scope, key, fingerprint, saga_id, status_code, \
     response_body, created_at, expires_at, completed_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $5 IS NULL THEN NULL ELSE $7 END) \
     ON CONFLICT (scope, key) DO NOTHING;",
    create_sql!(
        "$9",
        "$10",
        "$7",
        "WHERE EXISTS (SELECT 1 FROM idempotency_keys k \
     WHERE k.scope = $1 AND k.key = $2 AND k.saga_id = $4)"
    ),
    "INSERT INTO saga_callbacks (saga_id, url, secret) SELECT $4, $11, $12 \
     WHERE $11 IS NOT NULL AND EXISTS (SELECT 1 FROM idempotency_keys k \
     WHERE k.scope = $1 AND k.key = $2 AND k.saga_id = $4);",
    "RELEASE keyed;",
    "SELECT fingerprint, saga_id, status_code, response_body, created_at, completed_at \
     FROM idempotency_keys WHERE scope = $1 AND key = $2"
);

/// The first round of a batch of idempotent starts: $1 the keys as a JSON array (`scope`,
/// `key`, `fp` fingerprint, `id` of the saga to create, `code` and `body` of the saved answer or
/// null, `exp` expiry), $2 now. Opens the savepoint `keyed_set`, drops expired keys, records the
/// new ones (in batch order, so of two starts with one key the first wins) and returns each
/// start's key row (`ord`, its index): a start whose row names its own saga recorded the key and
/// must create the saga, in [`KEYED_WINNERS`].
pub(crate) const KEYED_SET: &str = concat!(
    "SAVEPOINT keyed_set;",
    rows!("$1"),
    "DELETE FROM idempotency_keys WHERE expires_at <= $2 AND (scope, key) IN      (SELECT j.value->>'scope', j.value->>'key' FROM j);",
    rows!("$1"),
    "INSERT INTO idempotency_keys (scope, key, fingerprint, saga_id, status_code,      response_body, created_at, expires_at, completed_at)      SELECT j.value->>'scope', j.value->>'key', j.value->>'fp', j.value->>'id',      j.value->>'code', j.value->>'body', $2, j.value->>'exp',      CASE WHEN j.value->>'code' IS NULL THEN NULL ELSE $2 END      FROM j WHERE true ORDER BY j.key ON CONFLICT (scope, key) DO NOTHING;",
    rows!("$1"),
    "SELECT j.key AS ord, k.fingerprint, k.saga_id, k.status_code, k.response_body,      k.created_at, k.completed_at FROM j JOIN idempotency_keys k      ON k.scope = j.value->>'scope' AND k.key = j.value->>'key'"
);

/// The second round: the sagas of the starts that recorded their key ($1 sagas, $2 steps, as
/// [`CreateRows`]; $3 now), their callbacks ($4: `id`, `url`, `secret`), and the release of
/// `keyed_set`.
pub(crate) const KEYED_WINNERS: &str = concat!(
    create_sql!("$1", "$2", "$3", ""),
    "INSERT INTO saga_callbacks (saga_id, url, secret)      SELECT value->>'id', value->>'url', value->>'secret' FROM json_each($4);",
    "RELEASE keyed_set;"
);

/// Records an idempotency key and, if this request is the first with it, creates its saga
/// (unleased) and callback, in one round; returns the key's row (naming `new.id` if this
/// request created the saga). Atomic: on `Err` nothing of it remains.
pub(crate) async fn keyed_start(
    conn: &mut SqliteConnection,
    now: Millis,
    key: &IdempotencyKey,
    new: &NewSaga,
    callback: Option<&Callback>,
    response: Option<&SavedResponse>,
) -> Result<sqlx::sqlite::SqliteRow> {
    let item = NewItem {
        new: new.clone(),
        lease: None,
    };
    let rows = CreateRows::of(std::slice::from_ref(&item))?;
    let row = sqlx::query(KEYED_START)
        .bind(&key.scope)
        .bind(&key.key)
        .bind(&key.fingerprint)
        .bind(new.id.to_string())
        .bind(response.map(|r| i64::from(r.status_code)))
        .bind(response.map(|r| r.body.clone()))
        .bind(now)
        .bind(now.saturating_add(retention_ms(key)))
        .bind(rows.sagas)
        .bind(rows.steps)
        .bind(callback.map(|c| c.url.clone()))
        .bind(callback.and_then(|c| c.secret.clone()))
        .fetch_one(&mut *conn)
        .await;
    undo_on_err(conn, "keyed", row).await
}

/// The batch statements with their parameters; an empty array for the part not given.
fn batch_query(
    sql: &'static str,
    now: Millis,
    apply: Option<ApplyRows>,
    create: Option<CreateRows>,
) -> sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'static>> {
    let none = || "[]".to_owned();
    let (sagas, steps, finishes, starts, events) = match apply {
        Some(a) => (a.sagas, a.steps, a.finishes, a.starts, a.events),
        None => (none(), none(), none(), none(), none()),
    };
    let (new_sagas, new_steps) = match create {
        Some(c) => (c.sagas, c.steps),
        None => (none(), none()),
    };
    sqlx::query(sql)
        .bind(sagas)
        .bind(now)
        .bind(steps)
        .bind(finishes)
        .bind(starts)
        .bind(events)
        .bind(new_sagas)
        .bind(new_steps)
}

/// Passes `result` on; if it is an error, first undoes everything since `savepoint`, so the
/// transaction goes on without the failed call.
pub(crate) async fn undo_on_err<T, E: Into<StoreError>>(
    conn: &mut SqliteConnection,
    savepoint: &str,
    result: std::result::Result<T, E>,
) -> Result<T> {
    if result.is_err() {
        let sql = format!("ROLLBACK TO {savepoint}; RELEASE {savepoint}");
        conn.execute(sql.as_str()).await?;
    }
    result.map_err(Into::into)
}

/// [`apply_batch`] as a plain function pointer for the write queue (always in its own
/// savepoint: on SQLite that costs nothing measurable, it is part of the same round).
pub(crate) fn apply_batch_boxed<'c>(
    conn: &'c mut SqliteConnection,
    now: Millis,
    items: &'c [Item],
    _guarded: bool,
) -> BoxFuture<'c, Result<Vec<Result<Applied>>>> {
    Box::pin(apply_batch(conn, now, items))
}

/// Applies `items` inside the caller's transaction, atomically; one result per item, in order.
pub(crate) async fn apply_batch(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[Item],
) -> Result<Vec<Result<Applied>>> {
    let rows = ApplyRows::of(items)?;
    let fenced = batch_query(APPLY, now, Some(rows), None)
        .fetch_all(&mut *conn)
        .await;
    let fenced = undo_on_err(conn, "apply", fenced).await?;
    results(conn, items, &fenced).await
}

/// Each item's result from the rows the fence returned.
async fn results(
    conn: &mut SqliteConnection,
    items: &[Item],
    fenced: &[sqlx::sqlite::SqliteRow],
) -> Result<Vec<Result<Applied>>> {
    super::results::<sqlx::Sqlite>(conn, REFUSED, items, fenced).await
}

/// [`insert_sagas`] as a plain function pointer for the write queue (always in its own
/// savepoint, as [`apply_batch_boxed`]).
pub(crate) fn insert_sagas_boxed<'c>(
    conn: &'c mut SqliteConnection,
    now: Millis,
    items: &'c [NewItem],
    _guarded: bool,
) -> BoxFuture<'c, Result<()>> {
    Box::pin(insert_sagas(conn, now, items))
}

/// Creates sagas, their steps and their `saga.started` events, atomically.
pub(crate) async fn insert_sagas(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[NewItem],
) -> Result<()> {
    let rows = CreateRows::of(items)?;
    let done = batch_query(CREATE, now, None, Some(rows))
        .execute(&mut *conn)
        .await;
    undo_on_err(conn, "create_sagas", done).await.map(drop)
}

/// [`whole_batch`] as a plain function pointer for the write queue.
pub(crate) fn whole_batch_boxed<'c>(
    conn: &'c mut SqliteConnection,
    now: Millis,
    items: &'c [Item],
    news: &'c [NewItem],
) -> BoxFuture<'c, Result<(Vec<Result<Applied>>, Millis)>> {
    Box::pin(whole_batch(conn, now, items, news))
}

/// Creates `news` and applies `items` in one transaction of its own, sent as one round:
/// `BEGIN`, the statements, `COMMIT`. On `Err` the caller rolls back and takes the long way,
/// which isolates a write that breaks a statement.
pub(crate) async fn whole_batch(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[Item],
    news: &[NewItem],
) -> Result<(Vec<Result<Applied>>, Millis)> {
    let apply = (!items.is_empty())
        .then(|| ApplyRows::of(items))
        .transpose()?;
    let create = (!news.is_empty())
        .then(|| CreateRows::of(news))
        .transpose()?;
    let fenced = batch_query(WHOLE, now, apply, create)
        .fetch_all(&mut *conn)
        .await?;
    // Committed: from here on an error must not send the caller the long way (it would write
    // the batch twice).
    let applied = results(conn, items, &fenced)
        .await
        .unwrap_or_else(|e| unreadable(items, &e));
    Ok((applied, now))
}
