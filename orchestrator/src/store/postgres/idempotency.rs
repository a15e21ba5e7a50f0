//! [`IdempotencyStore`] on PostgreSQL: `INSERT … ON CONFLICT DO NOTHING RETURNING` on the key,
//! then the saga, in one transaction. A concurrent transaction inserting the same key waits on
//! the primary key until the first one commits (then it conflicts, rolls back and reads the
//! winner's row) or rolls back (then it inserts and creates the saga itself).
//!
//! [`IdempotencyStore`]: crate::store::IdempotencyStore

use async_trait::async_trait;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::insert_saga_rows;
use super::PgStore;
use crate::model::Millis;
use crate::model::Saga;
use crate::store::idempotency::{
    judge_row, retention_ms, Callback, IdempotencyKey, IdempotencyStore, IdempotentStart,
    SavedResponse,
};
use crate::store::rows::new_saga_record;
use crate::store::shared;
use crate::store::SqlxResultExt;
use crate::store::{LeaseRequest, NewSaga, Result, StoreError};

/// How often a start retries when the key it conflicted with vanished before it could read it
/// (expired and deleted in between): each retry either inserts or finds a live row.
const MAX_ROUNDS: usize = 3;

async fn insert_callback(
    tx: &mut Transaction<'static, Postgres>,
    saga_id: Uuid,
    callback: &Callback,
) -> Result<()> {
    sqlx::query("INSERT INTO saga_callbacks (saga_id, url, secret) VALUES ($1::uuid, $2, $3)")
        .bind(saga_id.to_string())
        .bind(&callback.url)
        .bind(&callback.secret)
        .execute(&mut **tx)
        .await
        .db()?;
    Ok(())
}

#[async_trait]
impl IdempotencyStore for PgStore {
    async fn create_saga_idempotent(
        &self,
        key: &IdempotencyKey,
        new: NewSaga,
        callback: Option<&Callback>,
        response: Option<&SavedResponse>,
        lease: Option<&LeaseRequest>,
    ) -> Result<IdempotentStart> {
        for _ in 0..MAX_ROUNDS {
            let mut tx = self.pool().begin().await.db()?;
            sqlx::query(
                "DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 \
                 AND expires_at <= saga_now_ms()",
            )
            .bind(&key.scope)
            .bind(&key.key)
            .execute(&mut *tx)
            .await
            .db()?;
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (scope, key, fingerprint, saga_id, status_code, \
                 response_body, created_at, expires_at, completed_at) \
                 VALUES ($1, $2, $3, $4::uuid, $5, $6, saga_now_ms(), saga_now_ms() + $7, \
                         CASE WHEN $5::integer IS NULL THEN NULL ELSE saga_now_ms() END) \
                 ON CONFLICT (scope, key) DO NOTHING RETURNING created_at",
            )
            .bind(&key.scope)
            .bind(&key.key)
            .bind(&key.fingerprint)
            .bind(new.id.to_string())
            .bind(response.map(|r| i32::from(r.status_code)))
            .bind(response.map(|r| r.body.as_str()))
            .bind(retention_ms(key))
            .fetch_optional(&mut *tx)
            .await
            .db()?;
            if inserted.is_some() {
                let now = insert_saga_rows(&mut tx, &new, lease).await?;
                if let Some(callback) = callback {
                    insert_callback(&mut tx, new.id, callback).await?;
                }
                tx.commit().await.db()?;
                return Ok(IdempotentStart::Created(Box::new(new_saga_record(
                    new,
                    now,
                    lease.map(|l| l.owner.clone()),
                ))));
            }
            tx.rollback().await.db()?;
            // The conflicting row was committed (ON CONFLICT waited for its transaction).
            let row = sqlx::query(
                "SELECT fingerprint, saga_id::text AS saga_id, status_code::bigint AS status_code, \
                 response_body, created_at, completed_at FROM idempotency_keys WHERE scope = $1 AND key = $2",
            )
            .bind(&key.scope)
            .bind(&key.key)
            .fetch_optional(self.pool())
            .await.db()?;
            let Some(row) = row else { continue };
            return judge_row(&row, key);
        }
        Err(StoreError::Conflict(format!(
            "idempotency key {:?} kept changing; retry the request",
            key.key
        )))
    }

    async fn create_saga_with_callback(
        &self,
        new: NewSaga,
        callback: &Callback,
        lease: Option<&LeaseRequest>,
    ) -> Result<Saga> {
        let mut tx = self.pool().begin().await.db()?;
        let now = insert_saga_rows(&mut tx, &new, lease).await?;
        insert_callback(&mut tx, new.id, callback).await?;
        tx.commit().await.db()?;
        Ok(new_saga_record(new, now, lease.map(|l| l.owner.clone())))
    }

    async fn complete_idempotent(
        &self,
        scope: &str,
        key: &str,
        response: &SavedResponse,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE idempotency_keys SET status_code = $1, response_body = $2, \
             completed_at = saga_now_ms() \
             WHERE scope = $3 AND key = $4 AND completed_at IS NULL",
        )
        .bind(i32::from(response.status_code))
        .bind(&response.body)
        .bind(scope)
        .bind(key)
        .execute(self.pool())
        .await
        .db()?;
        Ok(())
    }

    async fn sweep_idempotency(&self, now: Millis) -> Result<u64> {
        shared::sweep_idempotency(self, now).await
    }
}
