//! [`IdempotencyStore`] on SQLite: every write is one `BEGIN IMMEDIATE` transaction on the
//! store's single writer connection, so concurrent starts with one key are serialised and the
//! primary key of `idempotency_keys` decides which one creates the saga.

use async_trait::async_trait;
use sqlx::SqliteConnection;
use uuid::Uuid;

use super::idempotency::{
    judge_row, retention_ms, Callback, IdempotencyKey, IdempotencyStore, IdempotentStart,
    SavedResponse,
};
use super::rows::new_saga_record;
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
/// saga (they are serialised on the one writer connection).
async fn create_idempotent_on(
    conn: &mut SqliteConnection,
    now: Millis,
    key: &IdempotencyKey,
    new: NewSaga,
    callback: Option<&Callback>,
    response: Option<&SavedResponse>,
) -> Result<IdempotentStart> {
    // An expired key that the sweeper has not removed yet is as good as gone.
    sqlx::query("DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND expires_at <= ?3")
        .bind(&key.scope)
        .bind(&key.key)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (scope, key, fingerprint, saga_id, status_code, \
         response_body, created_at, expires_at, completed_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, CASE WHEN ?5 IS NULL THEN NULL ELSE ?7 END) \
         ON CONFLICT (scope, key) DO NOTHING",
    )
    .bind(&key.scope)
    .bind(&key.key)
    .bind(&key.fingerprint)
    .bind(new.id.to_string())
    .bind(response.map(|r| i64::from(r.status_code)))
    .bind(response.map(|r| r.body.as_str()))
    .bind(now)
    .bind(now.saturating_add(retention_ms(key)))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        insert_saga_rows(&mut *conn, &new, now).await?;
        if let Some(callback) = callback {
            insert_callback(&mut *conn, new.id, callback).await?;
        }
        return Ok(IdempotentStart::Created(Box::new(new_saga_record(
            new, now,
        ))));
    }
    // The key exists (and cannot change: we hold the write lock). Read it, write nothing.
    let row = sqlx::query(
        "SELECT fingerprint, saga_id, status_code, response_body, created_at, completed_at \
         FROM idempotency_keys WHERE scope = ?1 AND key = ?2",
    )
    .bind(&key.scope)
    .bind(&key.key)
    .fetch_one(&mut *conn)
    .await?;
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
