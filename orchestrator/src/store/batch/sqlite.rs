//! The write queue's calls on SQLite. Creates and transitions are written row by row on the
//! writer's handle ([`sqlite_rows`]); idempotent starts are statements sent together as one
//! text (one hop to the driver's thread) reading the batch's keys as JSON arrays with
//! `json_each`.
//!
//! Parameters are written `$N`, not `?N`: SQLite numbers `?N` slots by their largest index, and
//! the driver, binding several statements of one text in turn, reads the gaps of a statement
//! that uses only `?2` and `?5` as anonymous parameters and stops binding before `?5`. Named
//! `$N` slots have no gaps.

use sqlx::{Executor, SqliteConnection};

use super::sqlite_rows::{self, from_rusqlite, in_savepoint, on_handle};
use super::{CreateRows, Item, NewItem};
use crate::model::Millis;
use crate::store::group_commit::BoxFuture;
use crate::store::idempotency::{retention_ms, Callback, IdempotencyKey, SavedResponse};
use crate::store::{Applied, NewSaga, Result, StoreError};

/// The batch's rows, materialised once from the JSON array in `$param` (`key`, `value`).
macro_rules! rows {
    ($param:literal) => {
        concat!(
            "WITH j AS MATERIALIZED (SELECT key, value FROM json_each(",
            $param,
            ")) "
        )
    };
}

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
/// savepoint: on SQLite that costs nothing measurable).
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
    on_handle(conn, |db| {
        in_savepoint(db, "apply", |db| sqlite_rows::apply(db, now, items))
    })
    .await
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
    on_handle(conn, |db| {
        in_savepoint(db, "create_sagas", |db| sqlite_rows::create(db, now, items))
    })
    .await
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

/// Creates `news` and applies `items` in one transaction of its own, in one borrowing of the
/// handle: `BEGIN`, the rows, `COMMIT`. On `Err` nothing was committed; the caller rolls back
/// and takes the long way, which isolates a write that breaks a statement.
pub(crate) async fn whole_batch(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[Item],
    news: &[NewItem],
) -> Result<(Vec<Result<Applied>>, Millis)> {
    on_handle(conn, |db| {
        db.execute_batch("BEGIN IMMEDIATE").map_err(from_rusqlite)?;
        sqlite_rows::create(db, now, news)?;
        let applied = sqlite_rows::apply(db, now, items)?;
        db.execute_batch("COMMIT").map_err(from_rusqlite)?;
        Ok((applied, now))
    })
    .await
}
