//! The idempotent consumer, for participants' own handlers.
//!
//! # Why
//!
//! The orchestrator delivers at least once: a step's action is retried after a crash with the
//! same idempotency key, and a webhook is sent again with the same event id. A participant
//! must therefore do each message's work once, however often the message arrives. The reliable
//! way is to record "message X was processed" **in the same transaction** as the work itself:
//! either both commit or neither does, and a second arrival finds the record and does nothing.
//! Recording it before or after the work, in a separate transaction, leaves a window where the
//! work happened and the record did not (or the reverse).
//!
//! [`IdempotentConsumer::process`] does exactly that on a SQLite or PostgreSQL pool of the
//! participant's own database: it inserts the message id into `saga_processed_messages` (the
//! primary key decides between concurrent duplicates), runs the work on the same transaction,
//! and commits both. A duplicate gets [`Consumed::Duplicate`] and the work is not run; work
//! that fails rolls the record back too, so a retry processes the message again.
//!
//! # Example
//!
//! ```
//! use orchestrator::consumer::{Consumed, IdempotentConsumer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! // The participant's own database (here in memory; a file or PostgreSQL in real life).
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! sqlx::query("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
//!     .execute(&pool)
//!     .await?;
//! sqlx::query("INSERT INTO accounts VALUES (1, 100)").execute(&pool).await?;
//!
//! let payments = IdempotentConsumer::new(pool.clone(), "payments");
//! payments.migrate().await?;
//! // The step's idempotency key (`ctx.idempotency_key()`), the same on every retry.
//! let key = "0193a4f2-7c1e-7d2a-9b1f-3c5d7e9f1a2b";
//! for _ in 0..2 {
//!     let outcome = payments
//!         .process(key, |conn| {
//!             Box::pin(async move {
//!                 sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
//!                     .execute(&mut *conn)
//!                     .await?;
//!                 Ok::<_, sqlx::Error>("charged")
//!             })
//!         })
//!         .await?;
//!     match outcome {
//!         Consumed::Processed(what) => println!("{what}"),
//!         Consumed::Duplicate => println!("already done"),
//!     }
//! }
//! let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts").fetch_one(&pool).await?;
//! assert_eq!(balance, 90, "charged once");
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;

use sqlx::{Database, PgConnection, Pool, Postgres, Sqlite, SqliteConnection};

/// The future a unit of work returns: it borrows the transaction's connection.
pub type WorkFuture<'c, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

/// What [`IdempotentConsumer::process`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consumed<T> {
    /// The message was new: the work ran and committed, with the record of the message.
    Processed(T),
    /// The message was processed before: nothing ran.
    Duplicate,
}

/// Why a message could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError<E> {
    /// The database failed; nothing was committed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The work returned an error; nothing was committed (the message counts as unprocessed).
    #[error("the work failed: {0}")]
    Work(E),
}

/// Records processed message ids next to a participant's own data; see the module docs.
///
/// Implemented for SQLite (`IdempotentConsumer<Sqlite>`, whose transactions start with
/// `BEGIN IMMEDIATE`) and PostgreSQL (`IdempotentConsumer<Postgres>`).
#[derive(Debug, Clone)]
pub struct IdempotentConsumer<DB: Database> {
    pool: Pool<DB>,
    consumer: String,
}

/// The table, the same on both backends.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS saga_processed_messages (\
     consumer TEXT NOT NULL, message_id TEXT NOT NULL, processed_at BIGINT NOT NULL, \
     PRIMARY KEY (consumer, message_id))";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl<DB: Database> IdempotentConsumer<DB> {
    /// A consumer named `consumer` (message ids are unique per consumer) over `pool`.
    pub fn new(pool: Pool<DB>, consumer: impl Into<String>) -> Self {
        Self {
            pool,
            consumer: consumer.into(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }
}

impl IdempotentConsumer<Sqlite> {
    /// Creates the `saga_processed_messages` table if it does not exist.
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        sqlx::query(CREATE_TABLE).execute(&self.pool).await?;
        Ok(())
    }

    /// Runs `work` once per `message_id`, in one transaction with the record of the message.
    pub async fn process<T, E, F>(
        &self,
        message_id: &str,
        work: F,
    ) -> Result<Consumed<T>, ConsumerError<E>>
    where
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> WorkFuture<'c, T, E>,
    {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let inserted = sqlx::query(
            "INSERT INTO saga_processed_messages (consumer, message_id, processed_at) \
             VALUES (?1, ?2, ?3) ON CONFLICT (consumer, message_id) DO NOTHING",
        )
        .bind(&self.consumer)
        .bind(message_id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            tx.rollback().await?;
            return Ok(Consumed::Duplicate);
        }
        let result = work(&mut tx).await;
        finish(tx, result).await
    }
}

impl IdempotentConsumer<Postgres> {
    /// Creates the `saga_processed_messages` table if it does not exist.
    pub async fn migrate(&self) -> Result<(), sqlx::Error> {
        sqlx::query(CREATE_TABLE).execute(&self.pool).await?;
        Ok(())
    }

    /// Runs `work` once per `message_id`, in one transaction with the record of the message. A
    /// concurrent duplicate waits on the primary key until this one commits (then it is a
    /// duplicate) or rolls back (then it does the work itself).
    pub async fn process<T, E, F>(
        &self,
        message_id: &str,
        work: F,
    ) -> Result<Consumed<T>, ConsumerError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> WorkFuture<'c, T, E>,
    {
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO saga_processed_messages (consumer, message_id, processed_at) \
             VALUES ($1, $2, $3) ON CONFLICT (consumer, message_id) DO NOTHING",
        )
        .bind(&self.consumer)
        .bind(message_id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            tx.rollback().await?;
            return Ok(Consumed::Duplicate);
        }
        let result = work(&mut tx).await;
        finish(tx, result).await
    }
}

/// Commits when the work succeeded, rolls back (record included) when it failed.
async fn finish<DB: Database, T, E>(
    tx: sqlx::Transaction<'static, DB>,
    result: Result<T, E>,
) -> Result<Consumed<T>, ConsumerError<E>> {
    match result {
        Ok(value) => {
            tx.commit().await?;
            Ok(Consumed::Processed(value))
        }
        Err(e) => {
            tx.rollback().await?;
            Err(ConsumerError::Work(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_duplicate_message_does_no_work() {
        // One connection: each connection to `:memory:` is its own database.
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .expect("in-memory database");
        sqlx::query("CREATE TABLE counter (n INTEGER NOT NULL)")
            .execute(&pool)
            .await
            .expect("table");
        sqlx::query("INSERT INTO counter (n) VALUES (0)")
            .execute(&pool)
            .await
            .expect("row");
        let consumer = IdempotentConsumer::new(pool.clone(), "test");
        consumer.migrate().await.expect("migrate");
        fn bump(conn: &mut SqliteConnection) -> WorkFuture<'_, i64, sqlx::Error> {
            Box::pin(async move {
                sqlx::query("UPDATE counter SET n = n + 1")
                    .execute(&mut *conn)
                    .await?;
                sqlx::query_scalar("SELECT n FROM counter")
                    .fetch_one(&mut *conn)
                    .await
            })
        }
        assert!(matches!(
            consumer.process("m1", bump).await,
            Ok(Consumed::Processed(1))
        ));
        assert!(matches!(
            consumer.process("m1", bump).await,
            Ok(Consumed::Duplicate)
        ));
        // Failed work commits nothing, so the message is processed on the next delivery.
        fn fail(_: &mut SqliteConnection) -> WorkFuture<'_, i64, &'static str> {
            Box::pin(async { Err("boom") })
        }
        assert!(matches!(
            consumer.process("m2", fail).await,
            Err(ConsumerError::Work("boom"))
        ));
        assert!(matches!(
            consumer.process("m2", bump).await,
            Ok(Consumed::Processed(2))
        ));
        let n: i64 = sqlx::query_scalar("SELECT n FROM counter")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(n, 2);
    }
}
