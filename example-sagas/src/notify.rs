//! `notify-consumer`: an idempotent consumer of the orchestrator's events on NATS JetStream.
//!
//! It stands for a service that tells customers how their order went: for every event it
//! records a notification, in a database of its own. JetStream delivers at least once (a
//! message whose ack was lost is delivered again, and the relay may publish an event twice
//! past the stream's duplicate window), so the notification is written through the library's
//! [`IdempotentConsumer`]: the event's message id (`Nats-Msg-Id`, `<log id>:<event id>`) is
//! recorded in the same transaction as the notification, and a message seen before writes
//! nothing. The ack is sent after that commit; a consumer killed in between gets the message
//! again and skips it.
//!
//! The `notifications` table deliberately has no unique key of its own: it counts what was
//! really done, so the ledger ([`NotifyStore::ledger`]) shows any event handled twice.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, stream};
use futures_util::StreamExt;
use orchestrator::consumer::{ConsumerError, IdempotentConsumer};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
#[cfg(feature = "postgres")]
use sqlx::Postgres;
use sqlx::{Row, Sqlite};
use tokio_util::sync::CancellationToken;

/// The consumer name of the processed message ids.
const CONSUMER: &str = "notify";

/// Event types that end a saga.
pub const TERMINAL: &[&str] = &[
    "saga.completed",
    "saga.compensated",
    "saga.failed",
    "saga.aborted",
];

/// Why the consumer stopped or its ledger could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// The URL is neither `sqlite:…` nor `postgres://…`.
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// The consumer's database failed.
    #[error("notify database: {0}")]
    Database(sqlx::Error),
    /// A stored result cannot be read back.
    #[error("notify database: {0}")]
    Stored(String),
    /// NATS failed (connection, stream, consumer).
    #[error("NATS: {0}")]
    Nats(String),
}

// Said in the message, not also as the `source()`: a chain printed whole would say it twice.
impl From<sqlx::Error> for NotifyError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

impl From<ConsumerError<sqlx::Error>> for NotifyError {
    fn from(e: ConsumerError<sqlx::Error>) -> Self {
        match e {
            ConsumerError::Database(e) | ConsumerError::Work(e) => Self::Database(e),
            e @ ConsumerError::StoredResult { .. } => Self::Stored(e.to_string()),
        }
    }
}

/// The event document the orchestrator publishes (the webhook payload).
#[derive(Debug, Clone, Deserialize)]
pub struct EventMessage {
    /// The event id.
    pub id: i64,
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The saga.
    pub saga_id: String,
    /// Its definition name.
    pub saga_name: String,
}

/// What the ledger says of one saga.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SagaNotifications {
    /// The saga's definition name.
    pub name: String,
    /// Notifications recorded for it, all event types.
    pub events: u64,
    /// Notifications of its terminal events, by type: exactly one, of one type, once it ended.
    pub terminal: BTreeMap<String, u64>,
}

/// What `notify-consumer --ledger` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Ledger {
    /// Per saga id.
    pub sagas: BTreeMap<String, SagaNotifications>,
    /// Notifications recorded, in all.
    pub handled: u64,
    /// Messages that arrived again and were skipped.
    pub duplicates: u64,
}

#[derive(Debug, Clone)]
enum Backend {
    Sqlite(IdempotentConsumer<Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(IdempotentConsumer<Postgres>),
}

/// The consumer's own database: SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub struct NotifyStore {
    backend: Backend,
}

/// The tables, the same on both backends but for the key column.
fn create(auto_id: &str) -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS notifications (id {auto_id}, message_id TEXT NOT NULL, \
             saga_id TEXT NOT NULL, saga_name TEXT NOT NULL, type TEXT NOT NULL, \
             event_id BIGINT NOT NULL)"
        ),
        "CREATE TABLE IF NOT EXISTS notify_duplicates (message_id TEXT NOT NULL, \
         seen_at BIGINT NOT NULL)"
            .to_owned(),
    ]
}

const INSERT_SQLITE: &str = "INSERT INTO notifications (message_id, saga_id, saga_name, type, \
     event_id) VALUES (?1, ?2, ?3, ?4, ?5)";
#[cfg(feature = "postgres")]
const INSERT_PG: &str = "INSERT INTO notifications (message_id, saga_id, saga_name, type, \
     event_id) VALUES ($1, $2, $3, $4, $5)";
const DUPLICATE_SQLITE: &str =
    "INSERT INTO notify_duplicates (message_id, seen_at) VALUES (?1, ?2)";
#[cfg(feature = "postgres")]
const DUPLICATE_PG: &str = "INSERT INTO notify_duplicates (message_id, seen_at) VALUES ($1, $2)";
const COUNTS: &str = "SELECT saga_id, saga_name, type, COUNT(*) AS n FROM notifications \
     GROUP BY saga_id, saga_name, type";
const DUPLICATES: &str = "SELECT COUNT(*) AS n FROM notify_duplicates";

/// Runs `$body` with `$consumer` the backend's consumer, `$insert` and `$dup` its statements.
macro_rules! on_backend {
    ($store:expr, |$consumer:ident, $insert:ident, $dup:ident| $body:expr) => {
        match &$store.backend {
            Backend::Sqlite($consumer) => {
                let ($insert, $dup) = (INSERT_SQLITE, DUPLICATE_SQLITE);
                $body
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres($consumer) => {
                let ($insert, $dup) = (INSERT_PG, DUPLICATE_PG);
                $body
            }
        }
    };
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Connects, retrying while another process holds a lock the busy timeout does not wait for
/// (switching a new file to WAL while a reader looks at it).
async fn connect_sqlite(options: SqliteConnectOptions) -> Result<sqlx::SqlitePool, NotifyError> {
    let mut tries = 0;
    loop {
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await;
        match pool {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("5") && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            pool => return Ok(pool?),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl NotifyStore {
    /// Opens the consumer's database at `url`, creating it and its tables if missing.
    pub async fn open(url: &str) -> Result<Self, NotifyError> {
        let backend = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10));
            let pool = connect_sqlite(options).await?;
            // Taking the write lock first, the busy timeout applies: a reader may hold the file.
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            for sql in create("INTEGER PRIMARY KEY AUTOINCREMENT") {
                sqlx::query(&sql).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            let consumer = IdempotentConsumer::new(pool, CONSUMER);
            consumer.migrate().await?;
            Backend::Sqlite(consumer)
        } else if is_postgres(url) {
            #[cfg(not(feature = "postgres"))]
            return Err(NotifyError::UnsupportedUrl(format!(
                "{url} (PostgreSQL: build example-sagas with --features postgres)"
            )));
            #[cfg(feature = "postgres")]
            {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .connect(url)
                    .await?;
                for sql in create("BIGSERIAL PRIMARY KEY") {
                    sqlx::query(&sql).execute(&pool).await?;
                }
                let consumer = IdempotentConsumer::new(pool, CONSUMER);
                consumer.migrate().await?;
                Backend::Postgres(consumer)
            }
        } else {
            return Err(NotifyError::UnsupportedUrl(url.to_owned()));
        };
        Ok(Self { backend })
    }

    /// Reads the ledger of the database at `url` without creating or changing anything, so a
    /// reader never takes a lock a running consumer would wait for. A database the consumer
    /// has not made yet is an empty ledger.
    pub async fn read_ledger(url: &str) -> Result<Ledger, NotifyError> {
        let backend = if url.starts_with("sqlite:") {
            let options =
                SqliteConnectOptions::from_str(url)?.busy_timeout(Duration::from_secs(10));
            if !options.get_filename().exists() {
                return Ok(Ledger::default());
            }
            let pool = connect_sqlite(options).await?;
            let made: Option<String> = sqlx::query_scalar(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'notify_duplicates'",
            )
            .fetch_optional(&pool)
            .await?;
            if made.is_none() {
                return Ok(Ledger::default());
            }
            Backend::Sqlite(IdempotentConsumer::new(pool, CONSUMER))
        } else if is_postgres(url) {
            #[cfg(not(feature = "postgres"))]
            return Err(NotifyError::UnsupportedUrl(format!(
                "{url} (PostgreSQL: build example-sagas with --features postgres)"
            )));
            #[cfg(feature = "postgres")]
            {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(url)
                    .await?;
                let made: Option<String> =
                    sqlx::query_scalar("SELECT to_regclass('notify_duplicates')::text")
                        .fetch_one(&pool)
                        .await?;
                if made.is_none() {
                    return Ok(Ledger::default());
                }
                Backend::Postgres(IdempotentConsumer::new(pool, CONSUMER))
            }
        } else {
            return Err(NotifyError::UnsupportedUrl(url.to_owned()));
        };
        Self { backend }.ledger().await
    }

    /// Handles one event once per `message_id`: records its notification, in one transaction
    /// with the message id. Returns whether it was new.
    pub async fn handle(
        &self,
        message_id: &str,
        event: &EventMessage,
    ) -> Result<bool, NotifyError> {
        let (id, saga, name, kind) = (
            message_id.to_owned(),
            event.saga_id.clone(),
            event.saga_name.clone(),
            event.kind.clone(),
        );
        let event_id = event.id;
        let consumed = on_backend!(self, |consumer, insert, dup| {
            let consumed = consumer
                .process(message_id, move |conn| {
                    Box::pin(async move {
                        sqlx::query(insert)
                            .bind(&id)
                            .bind(&saga)
                            .bind(&name)
                            .bind(&kind)
                            .bind(event_id)
                            .execute(&mut *conn)
                            .await?;
                        Ok::<_, sqlx::Error>(true)
                    })
                })
                .await?;
            if consumed.is_duplicate() {
                sqlx::query(dup)
                    .bind(message_id)
                    .bind(now_ms())
                    .execute(consumer.pool())
                    .await?;
            }
            consumed
        });
        Ok(!consumed.is_duplicate())
    }

    /// What was recorded: notifications per saga and type, and duplicates skipped.
    pub async fn ledger(&self) -> Result<Ledger, NotifyError> {
        let (rows, duplicates): (Vec<(String, String, String, i64)>, i64) =
            on_backend!(self, |consumer, _i, _d| {
                let pool = consumer.pool();
                let mut out = Vec::new();
                for row in sqlx::query(COUNTS).fetch_all(pool).await? {
                    out.push((
                        row.try_get("saga_id")?,
                        row.try_get("saga_name")?,
                        row.try_get("type")?,
                        row.try_get("n")?,
                    ));
                }
                let dups: i64 = sqlx::query(DUPLICATES)
                    .fetch_one(pool)
                    .await?
                    .try_get("n")?;
                (out, dups)
            });
        let mut ledger = Ledger {
            duplicates: u64::try_from(duplicates).unwrap_or(0),
            ..Ledger::default()
        };
        for (saga, name, kind, n) in rows {
            let n = u64::try_from(n).unwrap_or(0);
            let entry = ledger.sagas.entry(saga).or_default();
            entry.name = name;
            entry.events += n;
            if TERMINAL.contains(&kind.as_str()) {
                *entry.terminal.entry(kind).or_default() += n;
            }
            ledger.handled += n;
        }
        Ok(ledger)
    }
}

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct ConsumeConfig {
    /// The NATS server.
    pub nats_url: String,
    /// The stream the orchestrator publishes to.
    pub stream: String,
    /// The durable consumer's name: its progress survives this process.
    pub durable: String,
    /// How long JetStream waits for an ack before delivering a message again.
    pub ack_wait: Duration,
}

/// Consumes until `shutdown`: each message handled once ([`NotifyStore::handle`]), then
/// acked. Trouble with NATS or with the database is retried with backoff: a message whose
/// work did not commit is not acked, so it comes again, and the durable consumer resumes
/// where it was.
pub async fn consume(
    store: &NotifyStore,
    config: &ConsumeConfig,
    shutdown: CancellationToken,
) -> Result<(), NotifyError> {
    let mut pause = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        match consume_once(store, config, &shutdown).await {
            Ok(()) => return Ok(()),
            Err(e @ (NotifyError::Nats(_) | NotifyError::Database(_))) => {
                tracing::warn!(error = %e, "consuming failed; will retry");
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn nats(e: impl std::fmt::Display) -> NotifyError {
    NotifyError::Nats(e.to_string())
}

/// One connection's worth of consuming; returns at shutdown, or with the error that ended it.
async fn consume_once(
    store: &NotifyStore,
    config: &ConsumeConfig,
    shutdown: &CancellationToken,
) -> Result<(), NotifyError> {
    let client = async_nats::ConnectOptions::new()
        .name("notify-consumer")
        .connection_timeout(Duration::from_secs(5))
        .connect(config.nats_url.as_str())
        .await
        .map_err(nats)?;
    let context = jetstream::new(client);
    // The same stream the orchestrator makes, whichever of the two starts first.
    let stream = context
        .get_or_create_stream(stream::Config {
            name: config.stream.clone(),
            subjects: vec![orchestrator::broker::nats::SUBJECTS.to_owned()],
            ..Default::default()
        })
        .await
        .map_err(nats)?;
    let consumer: jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            &config.durable,
            pull::Config {
                durable_name: Some(config.durable.clone()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                filter_subject: orchestrator::broker::nats::SUBJECTS.to_owned(),
                ..Default::default()
            },
        )
        .await
        .map_err(nats)?;
    let mut messages = consumer.messages().await.map_err(nats)?;
    tracing::info!(stream = %config.stream, durable = %config.durable, "consuming");
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            next = messages.next() => next,
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(nats(e)),
            None => return Err(nats("the message stream ended")),
        };
        let message_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned());
        let event: Option<EventMessage> = serde_json::from_slice(&message.payload).ok();
        match (message_id, event) {
            (Some(id), Some(event)) => {
                store.handle(&id, &event).await?;
                // The crash window: the notification committed, the ack not sent.
                orchestrator::failpoint::crash_if_armed("after_consume_commit", &event.kind);
            }
            _ => tracing::warn!(subject = %message.subject,
                                "a message without a Nats-Msg-Id or an event body; skipped"),
        }
        message.ack().await.map_err(nats)?;
    }
}
