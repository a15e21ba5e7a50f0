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
//! and commits both with the work's result. A duplicate gets [`Consumed::Duplicate`] with the
//! result stored the first time (so a retried call answers what the first one answered) and
//! the work is not run; work that fails rolls the record back too, so a retry processes the
//! message again.
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
//!                 Ok::<_, sqlx::Error>("charged".to_owned())
//!             })
//!         })
//!         .await?;
//!     match outcome {
//!         Consumed::Processed(what) => println!("{what}"),
//!         Consumed::Duplicate(what) => println!("already done: {what}"),
//!     }
//! }
//! let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts").fetch_one(&pool).await?;
//! assert_eq!(balance, 90, "charged once");
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::{Database, Pool};
#[cfg(feature = "postgres")]
use sqlx::{PgConnection, Postgres};
#[cfg(feature = "sqlite")]
use sqlx::{Sqlite, SqliteConnection};

/// The future a unit of work returns: it borrows the transaction's connection.
pub type WorkFuture<'c, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

/// What [`IdempotentConsumer::process`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consumed<T> {
    /// The message was new: the work ran and committed, with the record of the message and
    /// this result.
    Processed(T),
    /// The message was processed before: nothing ran; this is the result stored then.
    Duplicate(T),
}

impl<T> Consumed<T> {
    /// The result, whether of this processing or of the first one.
    pub fn into_inner(self) -> T {
        match self {
            Self::Processed(t) | Self::Duplicate(t) => t,
        }
    }

    /// Whether the message had been processed before.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate(_))
    }
}

/// Why a message could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError<E> {
    // The variants say their cause in their message, so none also gives it as its `source()`:
    // an error printed with its chain (anyhow's `{:#}`, the `Error: … Caused by: …` of a `main`
    // that returns it) would say the cause twice.
    /// The database failed; nothing was committed.
    #[error("database error: {0}")]
    Database(sqlx::Error),
    /// The work returned an error; nothing was committed (the message counts as unprocessed).
    #[error("the work failed: {0}")]
    Work(E),
    /// The result stored for the message cannot be read back as the type asked for (the
    /// consumer's result type changed, or the row was written by hand).
    #[error("the result stored for message {message_id} cannot be read: {cause}")]
    StoredResult {
        /// The message.
        message_id: String,
        /// What failed.
        cause: serde_json::Error,
    },
}

impl<E> From<sqlx::Error> for ConsumerError<E> {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

/// Records processed message ids, with the result of each, next to a participant's own data;
/// see the module docs.
///
/// Implemented for SQLite (`IdempotentConsumer<Sqlite>`, whose transactions start with
/// `BEGIN IMMEDIATE`) and PostgreSQL (`IdempotentConsumer<Postgres>`).
#[derive(Debug)]
pub struct IdempotentConsumer<DB: Database> {
    pool: Pool<DB>,
    consumer: String,
}

// Not derived: that would ask `DB: Clone`, which the database markers are not.
impl<DB: Database> Clone for IdempotentConsumer<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            consumer: self.consumer.clone(),
        }
    }
}

/// The table, the same on both backends. `result` is the JSON of what the first processing
/// returned, answered to every duplicate.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS saga_processed_messages (\
     consumer TEXT NOT NULL, message_id TEXT NOT NULL, processed_at BIGINT NOT NULL, \
     result TEXT, PRIMARY KEY (consumer, message_id))";

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

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.consumer
    }
}

/// The JSON of a result to store.
fn to_json<T: Serialize, E>(message_id: &str, value: &T) -> Result<String, ConsumerError<E>> {
    serde_json::to_string(value).map_err(|cause| ConsumerError::StoredResult {
        message_id: message_id.to_owned(),
        cause,
    })
}

/// A stored result read back (`NULL`, from a table made before results were kept, reads as
/// JSON `null`).
fn from_json<T: DeserializeOwned, E>(
    message_id: &str,
    text: Option<String>,
) -> Result<T, ConsumerError<E>> {
    serde_json::from_str(text.as_deref().unwrap_or("null")).map_err(|cause| {
        ConsumerError::StoredResult {
            message_id: message_id.to_owned(),
            cause,
        }
    })
}

/// One backend's statements, with its placeholders.
struct Sql {
    claim: &'static str,
    stored: &'static str,
    keep: &'static str,
}

#[cfg(feature = "sqlite")]
const SQLITE: Sql = Sql {
    claim: "INSERT INTO saga_processed_messages (consumer, message_id, processed_at, result) \
            VALUES (?1, ?2, ?3, ?4) ON CONFLICT (consumer, message_id) DO NOTHING",
    stored: "SELECT result FROM saga_processed_messages WHERE consumer = ?1 AND message_id = ?2",
    keep: "UPDATE saga_processed_messages SET result = ?3 WHERE consumer = ?1 AND message_id = ?2",
};

#[cfg(feature = "postgres")]
const POSTGRES: Sql = Sql {
    claim: "INSERT INTO saga_processed_messages (consumer, message_id, processed_at, result) \
            VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, message_id) DO NOTHING",
    stored: "SELECT result FROM saga_processed_messages WHERE consumer = $1 AND message_id = $2",
    keep: "UPDATE saga_processed_messages SET result = $3 WHERE consumer = $1 AND message_id = $2",
};

/// The same methods for each backend: only the connection type and the SQL differ, and a
/// macro keeps one copy without sqlx's heavy generic bounds.
macro_rules! consumer_impl {
    ($db:ty, $conn:ty, $sql:expr, $begin:expr, |$pool:ident| $add_result:block) => {
        impl IdempotentConsumer<$db> {
            /// Creates the `saga_processed_messages` table if it does not exist (and adds the
            /// `result` column to one made by an earlier version).
            pub async fn migrate(&self) -> Result<(), sqlx::Error> {
                sqlx::query(CREATE_TABLE).execute(&self.pool).await?;
                let $pool = &self.pool;
                $add_result
                Ok(())
            }

            /// Runs `work` once per `message_id`, in one transaction with the record of the
            /// message and its result. A duplicate gets the result of the first processing.
            /// A concurrent duplicate waits until this one commits (then it is a duplicate) or
            /// rolls back (then it does the work itself).
            pub async fn process<T, E, F>(
                &self,
                message_id: &str,
                work: F,
            ) -> Result<Consumed<T>, ConsumerError<E>>
            where
                T: Serialize + DeserializeOwned,
                F: for<'c> FnOnce(&'c mut $conn) -> WorkFuture<'c, T, E>,
            {
                let mut tx = self.pool.begin_with($begin).await?;
                if let Some(stored) = self.record(&mut tx, message_id, None::<&()>).await? {
                    tx.rollback().await?;
                    return Ok(Consumed::Duplicate(stored));
                }
                let value = match work(&mut tx).await {
                    Ok(value) => value,
                    Err(e) => {
                        tx.rollback().await?;
                        return Err(ConsumerError::Work(e));
                    }
                };
                sqlx::query($sql.keep)
                    .bind(&self.consumer)
                    .bind(message_id)
                    .bind(to_json::<T, E>(message_id, &value)?)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(Consumed::Processed(value))
            }

            /// Inside the caller's transaction: records `message_id` as processed with
            /// `result`, unless it already is. Returns `None` when this call recorded it, or
            /// the stored result when it was there. For work that must mark *another*
            /// message as done (a compensation that voids an action that never came).
            pub async fn record<T, R, E>(
                &self,
                conn: &mut $conn,
                message_id: &str,
                result: Option<&R>,
            ) -> Result<Option<T>, ConsumerError<E>>
            where
                T: DeserializeOwned,
                R: Serialize,
            {
                let text = result.map(|r| to_json::<R, E>(message_id, r)).transpose()?;
                let inserted = sqlx::query($sql.claim)
                    .bind(&self.consumer)
                    .bind(message_id)
                    .bind(now_ms())
                    .bind(text)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                if inserted == 1 {
                    return Ok(None);
                }
                let stored: Option<String> = sqlx::query_scalar($sql.stored)
                    .bind(&self.consumer)
                    .bind(message_id)
                    .fetch_one(&mut *conn)
                    .await?;
                from_json(message_id, stored).map(Some)
            }
        }
    };
}

#[cfg(feature = "sqlite")]
consumer_impl!(
    Sqlite,
    SqliteConnection,
    SQLITE,
    "BEGIN IMMEDIATE",
    |pool| {
        let has: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pragma_table_info('saga_processed_messages') \
             WHERE name = 'result'",
        )
        .fetch_one(pool)
        .await?;
        if has == 0 {
            sqlx::query("ALTER TABLE saga_processed_messages ADD COLUMN result TEXT")
                .execute(pool)
                .await?;
        }
    }
);
#[cfg(feature = "postgres")]
consumer_impl!(Postgres, PgConnection, POSTGRES, "BEGIN", |pool| {
    sqlx::query("ALTER TABLE saga_processed_messages ADD COLUMN IF NOT EXISTS result TEXT")
        .execute(pool)
        .await?;
});

#[cfg(all(test, feature = "sqlite"))]
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
            Ok(Consumed::Duplicate(1))
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
