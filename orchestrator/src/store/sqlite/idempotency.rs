//! [`IdempotencyStore`] on SQLite: every write goes through the store's write queue, on its
//! single writer connection, so concurrent starts with one key are serialised and the primary
//! key of `idempotency_keys` decides which one creates the saga. The rows of a queued start
//! are written by the writer ([`super::keyed`]).
//!
//! [`IdempotencyStore`]: crate::store::IdempotencyStore

use async_trait::async_trait;

use super::handle::on_handle;
use super::writer_rows::{create_callback, create_saga};
use super::SqliteStore;
use crate::model::{Millis, Saga};
use crate::store::idempotency::{
    Callback, IdempotencyKey, IdempotencyStore, IdempotentStart, KeyedItem, SavedResponse,
};
use crate::store::rows::new_saga_record;
use crate::store::shared;
use crate::store::SqlxResultExt;
use crate::store::{LeaseRequest, NewSaga, Result};

#[async_trait]
impl IdempotencyStore for SqliteStore {
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

    async fn sweep_idempotency(&self, now: Millis) -> Result<u64> {
        shared::sweep_idempotency(self, now).await
    }
}
