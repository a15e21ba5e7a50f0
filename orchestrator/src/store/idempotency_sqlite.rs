//! [`IdempotencyStore`] on SQLite: every write is one `BEGIN IMMEDIATE` transaction on the
//! store's single writer connection, so concurrent starts with one key are serialised and the
//! primary key of `idempotency_keys` decides which one creates the saga.

use async_trait::async_trait;
use sqlx::SqliteConnection;
use uuid::Uuid;

use super::batch::sqlite::keyed_start;
use super::idempotency::{
    judge_row, Callback, IdempotencyKey, IdempotencyStore, IdempotentStart, SavedResponse,
};
use super::rows::new_saga_record;
use super::rows::LogRow;
use super::sqlite::insert_saga_rows;
use super::{NewSaga, Result, SqliteStore, Store};
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

#[async_trait]
impl IdempotencyStore for SqliteStore {
    async fn create_saga_idempotent(
        &self,
        key: &IdempotencyKey,
        new: NewSaga,
        callback: Option<&Callback>,
        response: Option<&SavedResponse>,
    ) -> Result<IdempotentStart> {
        let (key, callback, response) = (key.clone(), callback.cloned(), response.cloned());
        self.queue()
            .run(move |conn, now| {
                Box::pin(async move {
                    create_idempotent_on(conn, now, &key, new, callback.as_ref(), response.as_ref())
                        .await
                })
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
