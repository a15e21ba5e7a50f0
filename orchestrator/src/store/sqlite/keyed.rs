//! Idempotent starts on SQLite as the write queue runs them: each start's key row, saga and
//! callback, written on the writer's borrowed handle inside the batch's transaction, beside the
//! other rows of [`super::writer_rows`].

use rusqlite::{params, Connection, OptionalExtension};

use super::stmt::{exec, from_rusqlite, in_savepoint};
use super::writer_rows::{create_callback, create_saga};
use crate::model::Millis;
use crate::store::idempotency::{retention_ms, IdempotentStart, KeyedItem, StoredKey};
use crate::store::rows::new_saga_record;
use crate::store::Result;

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

/// The rows of idempotent starts, inside the caller's transaction, in batch order (of two
/// starts with one key the first wins), each in a savepoint of its own: its key, saga and
/// callback are written together or not at all, and a start that fails (a saga id collision)
/// fails alone. One result per start.
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

/// One idempotent start: records the key if it is new and then creates the saga (leased as the
/// start asks) and its callback; else judges the request against the key's row. Not atomic by itself.
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
