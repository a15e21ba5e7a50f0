//! [`IdempotencyStore`] on SQLite: every write is one `BEGIN IMMEDIATE` transaction on the
//! store's single writer connection, so concurrent starts with one key are serialised and the
//! primary key of `idempotency_keys` decides which one creates the saga.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::Serialize;
use sqlx::SqliteConnection;
use uuid::Uuid;

use super::batch::sqlite::{keyed_start, undo_on_err, KEYED_SET, KEYED_WINNERS};
use super::batch::{to_json, CreateRows, NewItem};
use super::group_commit::BoxFuture;
use super::idempotency::{
    judge_row, retention_ms, Callback, IdempotencyKey, IdempotencyStore, IdempotentStart,
    KeyedItem, SavedResponse,
};
use super::rows::new_saga_record;
use super::rows::LogRow;
use super::sqlite::insert_saga_rows;
use super::{NewSaga, Result, SqliteStore, Store, StoreError};
use crate::model::{Millis, Saga};

pub(super) async fn insert_callback(
    conn: &mut SqliteConnection,
    saga_id: Uuid,
    callback: &Callback,
) -> Result<()> {
    sqlx::query("INSERT INTO saga_callbacks (saga_id, url, secret) VALUES (?1, ?2, ?3)")
        .bind(saga_id.to_string())
        .bind(&callback.url)
        .bind(&callback.secret)
        .execute(conn)
        .await?;
    Ok(())
}

/// An idempotent start on the writer's connection, inside a group-committed transaction: the
/// primary key of `idempotency_keys` decides which of several identical requests creates the
/// saga (they are serialised on the one writer connection). One round to the driver's thread
/// (see [`keyed_start`]).
async fn create_idempotent_on(
    conn: &mut SqliteConnection,
    now: Millis,
    key: &IdempotencyKey,
    new: NewSaga,
    callback: Option<&Callback>,
    response: Option<&SavedResponse>,
) -> Result<IdempotentStart> {
    let row = keyed_start(conn, now, key, &new, callback, response).await?;
    let named: String = row.get("saga_id")?;
    if named == new.id.to_string() {
        return Ok(IdempotentStart::Created(Box::new(new_saga_record(
            new, now,
        ))));
    }
    // The key existed (and cannot change: we hold the write lock); nothing was written.
    judge_row(&row, key)
}

/// A start's key as [`KEYED_SET`] reads it.
#[derive(Serialize)]
struct KeyRow<'a> {
    scope: &'a str,
    key: &'a str,
    fp: &'a str,
    id: &'a Uuid,
    code: Option<u16>,
    body: Option<&'a str>,
    exp: Millis,
}

/// A winner's callback as [`KEYED_WINNERS`] reads it.
#[derive(Serialize)]
struct CallbackRow<'a> {
    id: &'a Uuid,
    url: &'a str,
    secret: Option<&'a str>,
}

/// [`keyed_starts`] as a plain function pointer for the write queue.
pub(super) fn keyed_starts_boxed<'c>(
    conn: &'c mut SqliteConnection,
    now: Millis,
    items: &'c [KeyedItem],
) -> BoxFuture<'c, Result<Vec<Result<IdempotentStart>>>> {
    Box::pin(keyed_starts(conn, now, items))
}

/// Runs a batch of idempotent starts inside the writer's transaction: set-based in two rounds
/// whatever their number; if that fails (a saga id collision), one by one, so that the start
/// at fault fails alone. Each start's key, saga and callback are written together or not at all.
async fn keyed_starts(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[KeyedItem],
) -> Result<Vec<Result<IdempotentStart>>> {
    match keyed_set(conn, now, items).await {
        Ok(starts) => Ok(starts),
        Err(e) => {
            tracing::debug!(error = %e, "set-based idempotent starts failed; one by one");
            let mut starts = Vec::with_capacity(items.len());
            for item in items {
                let one = create_idempotent_on(
                    conn,
                    now,
                    &item.key,
                    item.new.clone(),
                    item.callback.as_ref(),
                    item.response.as_ref(),
                )
                .await;
                starts.push(one);
            }
            Ok(starts)
        }
    }
}

/// The set-based starts: record the keys and read each start's key row ([`KEYED_SET`]), then
/// create the sagas of the starts that recorded theirs ([`KEYED_WINNERS`]). Atomic.
async fn keyed_set(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[KeyedItem],
) -> Result<Vec<Result<IdempotentStart>>> {
    let keys: Vec<KeyRow> = items
        .iter()
        .map(|i| KeyRow {
            scope: &i.key.scope,
            key: &i.key.key,
            fp: &i.key.fingerprint,
            id: &i.new.id,
            code: i.response.as_ref().map(|r| r.status_code),
            body: i.response.as_ref().map(|r| r.body.as_str()),
            exp: now.saturating_add(retention_ms(&i.key)),
        })
        .collect();
    let rows = sqlx::query(KEYED_SET)
        .bind(to_json(&keys)?)
        .bind(now)
        .fetch_all(&mut *conn)
        .await;
    let rows = undo_on_err(conn, "keyed_set", rows).await?;
    let judged = judge_all(&rows, items, now);
    let (starts, winners) = undo_on_err(conn, "keyed_set", judged).await?;
    create_winners(conn, now, items, &winners).await?;
    Ok(starts)
}

/// Each start's answer from its key row (the ones that recorded their key create their saga at
/// `now`), and the indexes of those.
fn judge_all(
    rows: &[sqlx::sqlite::SqliteRow],
    items: &[KeyedItem],
    now: Millis,
) -> Result<(Vec<Result<IdempotentStart>>, Vec<usize>)> {
    let mut by_ord = HashMap::with_capacity(rows.len());
    for row in rows {
        let ord: i64 = row.get("ord")?;
        by_ord.insert(ord, row);
    }
    let mut starts = Vec::with_capacity(items.len());
    let mut winners = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let row = i64::try_from(i).ok().and_then(|ord| by_ord.get(&ord));
        let Some(row) = row else {
            return Err(StoreError::Io(format!(
                "the key {:?} was not recorded",
                item.key.key
            )));
        };
        let named: String = row.get("saga_id")?;
        if named == item.new.id.to_string() {
            winners.push(i);
            starts.push(Ok(IdempotentStart::Created(Box::new(new_saga_record(
                item.new.clone(),
                now,
            )))));
        } else {
            starts.push(judge_row(*row, &item.key));
        }
    }
    Ok((starts, winners))
}

/// Creates the sagas and callbacks of the starts at `winners` and releases `keyed_set`; on
/// `Err` everything since the savepoint is undone.
async fn create_winners(
    conn: &mut SqliteConnection,
    now: Millis,
    items: &[KeyedItem],
    winners: &[usize],
) -> Result<()> {
    let news: Vec<NewItem> = winners
        .iter()
        .map(|&i| NewItem {
            new: items[i].new.clone(),
            lease: None,
        })
        .collect();
    let callbacks: Vec<CallbackRow> = winners
        .iter()
        .filter_map(|&i| {
            let cb = items[i].callback.as_ref()?;
            Some(CallbackRow {
                id: &items[i].new.id,
                url: &cb.url,
                secret: cb.secret.as_deref(),
            })
        })
        .collect();
    // Even a failure to encode must undo the keys already recorded.
    let encoded = CreateRows::of(&news).and_then(|rows| Ok((rows, to_json(&callbacks)?)));
    let (rows, callbacks) = undo_on_err(conn, "keyed_set", encoded).await?;
    let done = sqlx::query(KEYED_WINNERS)
        .bind(rows.sagas)
        .bind(rows.steps)
        .bind(now)
        .bind(callbacks)
        .execute(&mut *conn)
        .await;
    undo_on_err(conn, "keyed_set", done).await.map(drop)
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    async fn create_saga_idempotent(
        &self,
        key: &IdempotencyKey,
        new: NewSaga,
        callback: Option<&Callback>,
        response: Option<&SavedResponse>,
    ) -> Result<IdempotentStart> {
        self.queue()
            .keyed(KeyedItem {
                key: key.clone(),
                new,
                callback: callback.cloned(),
                response: response.cloned(),
            })
            .await
    }

    async fn create_saga_with_callback(&self, new: NewSaga, callback: &Callback) -> Result<Saga> {
        let now = Store::now(self).await?;
        let mut tx = self.writer_pool().begin_with("BEGIN IMMEDIATE").await?;
        insert_saga_rows(&mut tx, &new, now).await?;
        insert_callback(&mut tx, new.id, callback).await?;
        tx.commit().await?;
        Ok(new_saga_record(new, now))
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
                    .await?;
                    Ok(())
                })
            })
            .await
    }

    async fn sweep_idempotency(&self, now: Millis) -> Result<u64> {
        let mut tx = self.writer_pool().begin_with("BEGIN IMMEDIATE").await?;
        let deleted = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= ?1")
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }
}
