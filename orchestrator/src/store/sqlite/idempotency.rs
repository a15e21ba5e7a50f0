//! [`IdempotencyStore`] on SQLite: every write goes through the store's write queue, on its
//! single writer connection, so concurrent starts with one key are serialised and the primary
//! key of `idempotency_keys` decides which one creates the saga.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use sqlx::SqliteConnection;

use super::handle::{exec, from_rusqlite, in_savepoint, on_handle, with_statements, Statements};
use super::writer_rows::{create_callback, create_saga};
use super::SqliteStore;
use crate::model::{Millis, Saga};
use crate::store::idempotency::{
    retention_ms, Callback, IdempotencyKey, IdempotentStart, KeyedItem, SavedResponse, StoredKey,
};
use crate::store::rows::new_saga_record;
use crate::store::shared::SqlStarts;
use crate::store::write_queue::BoxFuture;
use crate::store::SqlxResultExt;
use crate::store::{LeaseRequest, NewSaga, Result};

/// An expired key the sweeper has not removed yet is as good as gone.
const DROP_EXPIRED: &str =
    "DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND expires_at <= ?3";

/// Records a key unless it exists; a change count of one says this request recorded it.
const RECORD: &str = "INSERT INTO idempotency_keys (scope, key, fingerprint, saga_id, \
     status_code, response_body, created_at, expires_at, completed_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, CASE WHEN ?5 IS NULL THEN NULL ELSE ?7 END) \
     ON CONFLICT (scope, key) DO NOTHING";

const STORED: &str = "SELECT fingerprint, saga_id, status_code, response_body, created_at, \
     completed_at FROM idempotency_keys WHERE scope = ?1 AND key = ?2";

/// [`keyed_starts`] as a plain function pointer for the write queue.
pub(super) fn keyed_starts_boxed<'c>(
    conn: &'c mut SqliteConnection,
    statements: &'c mut Statements,
    now: Millis,
    items: &'c [KeyedItem],
) -> BoxFuture<'c, Result<Vec<Result<IdempotentStart>>>> {
    Box::pin(keyed_starts(conn, statements, now, items))
}

/// Runs a batch of idempotent starts inside the writer's transaction, in batch order (of two
/// starts with one key the first wins), each in a savepoint of its own: its key, saga and
/// callback are written together or not at all, and a start that fails (a saga id collision)
/// fails alone.
async fn keyed_starts(
    conn: &mut SqliteConnection,
    statements: &mut Statements,
    now: Millis,
    items: &[KeyedItem],
) -> Result<Vec<Result<IdempotentStart>>> {
    with_statements(conn, statements, |db| Ok(keyed_rows(db, now, items))).await
}

/// The rows of idempotent starts, in batch order, each in a savepoint of its own (see
/// [`keyed_starts`]); inside the caller's transaction.
pub(crate) fn keyed_rows(
    db: &Connection,
    now: Millis,
    items: &[KeyedItem],
) -> Vec<Result<IdempotentStart>> {
    items
        .iter()
        .map(|item| in_savepoint(db, "keyed", |db| keyed_start(db, now, item)))
        .collect()
}

/// One idempotent start: records the key if it is new and then creates the saga (unleased) and
/// its callback; else judges the request against the key's row. Not atomic by itself.
fn keyed_start(db: &Connection, now: Millis, item: &KeyedItem) -> Result<IdempotentStart> {
    let (key, response) = (&item.key, item.response.as_ref());
    exec(db, DROP_EXPIRED, params![key.scope, key.key, now])?;
    let recorded = exec(
        db,
        RECORD,
        params![
            key.scope,
            key.key,
            key.fingerprint,
            item.new.id.to_string(),
            response.map(|r| r.status_code),
            response.map(|r| r.body.as_str()),
            now,
            now.saturating_add(retention_ms(key)),
        ],
    )?;
    if recorded == 1 {
        create_saga(db, now, &item.new, item.lease.as_ref())?;
        if let Some(callback) = &item.callback {
            create_callback(db, &item.new.id, callback)?;
        }
        return Ok(IdempotentStart::Created(Box::new(new_saga_record(
            item.new.clone(),
            now,
            item.lease.as_ref().map(|l| l.owner.clone()),
        ))));
    }
    // The key existed (and cannot change: we hold the write lock); nothing was written.
    let stored = db
        .prepare_cached(STORED)
        .and_then(|mut st| {
            st.query_row(params![key.scope, key.key], |r| {
                Ok(StoredKey {
                    fingerprint: r.get(0)?,
                    saga_id: r.get(1)?,
                    status_code: r.get(2)?,
                    response_body: r.get(3)?,
                    created_at: r.get(4)?,
                    completed_at: r.get(5)?,
                })
            })
            .optional()
        })
        .map_err(from_rusqlite)?;
    match stored {
        Some(stored) => stored.judge(key),
        None => Err(crate::store::StoreError::io(format!(
            "the key {:?} was neither recorded nor found",
            key.key
        ))),
    }
}

#[async_trait]
impl SqlStarts for SqliteStore {
    async fn create_saga_idempotent(
        &self,
        key: &IdempotencyKey,
        new: NewSaga,
        callback: Option<&Callback>,
        response: Option<&SavedResponse>,
        lease: Option<&LeaseRequest>,
    ) -> Result<IdempotentStart> {
        self.queue()
            .keyed(KeyedItem {
                key: key.clone(),
                new,
                callback: callback.cloned(),
                response: response.cloned(),
                lease: lease.cloned(),
            })
            .await
    }

    async fn create_saga_with_callback(
        &self,
        new: NewSaga,
        callback: &Callback,
        lease: Option<&LeaseRequest>,
    ) -> Result<Saga> {
        let callback = callback.clone();
        let lease = lease.cloned();
        self.queue()
            .run(move |conn, now| {
                Box::pin(async move {
                    on_handle(conn, |db| {
                        create_saga(db, now, &new, lease.as_ref())?;
                        create_callback(db, &new.id, &callback)
                    })
                    .await?;
                    Ok(new_saga_record(new, now, lease.map(|l| l.owner)))
                })
            })
            .await
    }

    async fn complete_idempotent(
        &self,
        scope: &str,
        key: &str,
        response: &SavedResponse,
    ) -> Result<()> {
        let (scope, key, response) = (scope.to_owned(), key.to_owned(), response.clone());
        self.queue()
            .run(move |conn, now| {
                Box::pin(async move {
                    sqlx::query(
                        "UPDATE idempotency_keys SET status_code = ?1, response_body = ?2, \
                         completed_at = ?3 WHERE scope = ?4 AND key = ?5 AND completed_at IS NULL",
                    )
                    .bind(i64::from(response.status_code))
                    .bind(&response.body)
                    .bind(now)
                    .bind(&scope)
                    .bind(&key)
                    .execute(&mut *conn)
                    .await
                    .db()?;
                    Ok(())
                })
            })
            .await
    }
}
