//! The embedded SQLite store: one file, WAL, `synchronous=FULL` by default.
//!
//! Writes go through a pool of exactly one connection, and every write transaction starts with
//! `BEGIN IMMEDIATE`: this process never upgrades a read lock into a write lock (the source of
//! `SQLITE_BUSY` surprises), and other processes on the same file (the `saga` CLI) wait on
//! `busy_timeout` instead of failing. Reads use their own pool and, thanks to WAL, never wait for
//! the writer.
//!
//! Only one process may run the engine on a file: [`Store::register_worker`] takes an exclusive
//! lock on `PATH.lock` and then frees every lease left by a process that died, so a restart
//! resumes at once instead of waiting for leases to expire.

use std::fs::File;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, Transaction};
use uuid::Uuid;

pub(crate) mod handle;
mod idempotency;
mod keyed;
mod outbox;
mod stmt;
pub(crate) mod writer;
mod writer_rows;

use crate::clock::{Clock, SystemClock};
use crate::model::{Attempt, Event, ListFilter, Millis, Saga, SagaPage, SagaStatus};
use crate::store::rows::{
    attempt_from_row, corrupt, event_from_row, page_from_rows, parse_enum, saga_from_row,
    step_from_row, worker_from_row,
};
use crate::store::rules::{
    cancel_refusal, check_abort, check_mark_compensated, plan_retry, RetryPlan,
};
use crate::store::write_queue::{Checkpoint, Tuning, WriteQueue};
use crate::store::SqlxResultExt;
use crate::store::{
    Applied, CancelOutcome, ClaimRequest, Claimed, Lease, LeaseRequest, NewSaga, Result, Store,
    StoreError, Transition, WorkerInfo,
};

/// How hard SQLite works to keep a commit on power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteDurability {
    /// `synchronous=FULL` (the default): the WAL is fsynced at every commit, so nothing
    /// acknowledged is lost on process crash or power loss.
    #[default]
    Full,
    /// `synchronous=NORMAL` (opt-in with `?synchronous=normal`): a process crash loses nothing,
    /// but a power loss or OS crash may lose the last commits before a checkpoint.
    Normal,
}

/// The largest page a list returns.
const MAX_PAGE: u32 = 1000;

/// The SQLite implementation of [`Store`].
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    path: Option<std::path::PathBuf>,
    engine_lock: Mutex<Option<File>>,
    clock: std::sync::Arc<dyn Clock>,
    /// Engine writes (create, claim, transitions, heartbeats), group-committed.
    queue: WriteQueue<Sqlite>,
    /// Commits made outside the queue (operator commands, registration).
    commits: std::sync::atomic::AtomicU64,
    /// The background WAL checkpoint task, stopped with the store.
    checkpointer: Option<tokio::task::AbortHandle>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Some(task) = &self.checkpointer {
            task.abort();
        }
    }
}

/// Copies the WAL back into the database file every 200 ms with a `PASSIVE` checkpoint, which
/// never blocks the writer (it stops short of frames in use). With automatic checkpoints off,
/// commits only append to the WAL and fsync it.
async fn checkpoint_loop(pool: SqlitePool) {
    let mut every = tokio::time::interval(Duration::from_millis(200));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
        {
            tracing::debug!(error = %e, "WAL checkpoint failed; will retry");
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The file a `sqlite://PATH` URL names, made absolute; `None` for an in-memory database or a
/// URL that is not SQLite's.
pub fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    if !url.starts_with("sqlite:") {
        return None;
    }
    let (base, _) = split_durability(url).ok()?;
    if base.contains(":memory:") {
        return None;
    }
    let path = SqliteConnectOptions::from_str(&base)
        .ok()?
        .get_filename()
        .to_owned();
    if path.as_os_str().is_empty() {
        return None;
    }
    Some(std::path::absolute(&path).unwrap_or(path))
}

/// The file whose lock an engine holds while it runs on the SQLite database `db`
/// (`saga.db` → `saga.db.lock`).
pub fn engine_lock_file(db: &std::path::Path) -> std::path::PathBuf {
    db.with_extension(match db.extension() {
        Some(ext) => format!("{}.lock", ext.to_string_lossy()),
        None => "lock".to_owned(),
    })
}

impl SqliteStore {
    /// Opens (creating it if missing) the database a `sqlite://PATH` URL names and applies
    /// migrations. `?synchronous=normal` at the end of the URL opts into [`SqliteDurability::Normal`].
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, true, std::sync::Arc::new(SystemClock)).await
    }

    /// Opens an existing database: a missing file is an error rather than a new empty log (what
    /// the CLI wants when given a wrong path). Applies migrations.
    pub async fn open_existing(url: &str) -> Result<Self> {
        Self::open_with(url, false, std::sync::Arc::new(SystemClock)).await
    }

    /// Opens with explicit creation policy and clock.
    pub async fn open_with(
        url: &str,
        create: bool,
        clock: std::sync::Arc<dyn Clock>,
    ) -> Result<Self> {
        let (base, durability) = split_durability(url)?;
        let opts = SqliteConnectOptions::from_str(&base)
            .map_err(|_| StoreError::UnsupportedUrl(crate::store::redact_url(url)))?
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                SqliteDurability::Full => SqliteSynchronous::Full,
                SqliteDurability::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(Duration::from_secs(10))
            // The step log's REFERENCES are declared, not enforced (as on PostgreSQL, migration
            // 0004 there): every child row is written with its saga's row, or after the fence
            // or an update of that row in the same transaction, and no saga is deleted. The
            // check was a probe of `sagas`' key per steps, attempts and events row: about 5 %
            // of the single writer's instructions (BENCHMARKS.md).
            .foreign_keys(false)
            .pragma("temp_store", "memory")
            .pragma("cache_size", "-16000")
            // Checkpoints run in the background (see `checkpoint_loop`), not inside a commit
            // that then stalls for the whole copy: they were the tail of the commit latency.
            .pragma("wal_autocheckpoint", "0");
        let path = opts.get_filename().to_owned();
        let in_memory = base.contains(":memory:") || path.as_os_str().is_empty();
        if !create && !in_memory && !path.exists() {
            // The absolute path: a relative one is relative to a working directory the reader
            // of the message may not know.
            let shown = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
            return Err(StoreError::io(format!(
                "database {} does not exist (start the server or run `saga migrate` to create it)",
                shown.display()
            )));
        }
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(if in_memory { 1 } else { 0 })
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(30))
            // A connection to a local file does not go stale: the test would cost a round trip
            // to the connection's thread on every batch.
            .test_before_acquire(false)
            .after_connect(|conn, _| Box::pin(handle::widen_lookaside(conn)))
            // A small page cache for the writer: SQLite sweeps the cache's hash table at the end
            // of many write transactions, a cost that grows with the cache (measured: 16 MB
            // cost ~10 % of throughput under group commit). The readers keep the large one.
            .connect_with(opts.clone().pragma("cache_size", "-2000"))
            .await
            .db()?;
        let store_path = (!in_memory).then_some(path);
        let reader = if in_memory {
            // An in-memory database exists only on its one connection.
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(30))
                .test_before_acquire(false)
                .connect_with(opts.clone().read_only(true))
                .await
                .db()?
        };
        let checkpointer = if in_memory {
            None
        } else {
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(opts.clone())
                .await
                .db()?;
            Some(tokio::spawn(checkpoint_loop(pool)).abort_handle())
        };
        let store = Self {
            checkpointer,
            queue: WriteQueue::start(
                writer.clone(),
                Tuning {
                    // One writer connection: SQLite serialises writers anyway.
                    writers: 1,
                    // (With one writer there is nobody to commit beside.)
                    parallel_from: usize::MAX,
                    keep_connection: false,
                    // The background checkpoints copy most of the WAL, but while commits keep
                    // coming they never finish it, so the WAL never starts over: it grows without
                    // bound and every commit appends to new file space. A checkpoint by the
                    // writer itself, between batches, copies the few frames left; the next
                    // commit then rewrites the WAL from its start.
                    checkpoint: Some(Checkpoint {
                        sql: "PRAGMA wal_checkpoint(PASSIVE)",
                        every: 64,
                    }),
                },
                writer::SqliteWriter::new,
                clock.clone(),
            ),
            writer,
            reader,
            path: store_path,
            engine_lock: Mutex::new(None),
            clock,
            commits: std::sync::atomic::AtomicU64::new(0),
        };
        store.migrate().await?;
        Ok(store)
    }

    fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>> {
        self.writer.begin_with("BEGIN IMMEDIATE").await.db()
    }

    async fn commit(&self, tx: Transaction<'static, Sqlite>) -> Result<()> {
        tx.commit().await.db()?;
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads a saga and its steps from one snapshot (in a read transaction of its own: two
    /// separate reads could straddle a commit and pair the saga of one write with the steps
    /// of the next).
    async fn load_saga(pool: &SqlitePool, id: Uuid) -> Result<Option<Saga>> {
        let mut tx = pool.begin().await.db()?;
        let saga = match Self::require_saga(&mut tx, id).await {
            Ok(saga) => Some(saga),
            Err(StoreError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        tx.commit().await.db()?;
        Ok(saga)
    }

    /// Reads a saga and its steps on `conn`, whose transaction gives them one snapshot.
    async fn require_saga(conn: &mut sqlx::SqliteConnection, id: Uuid) -> Result<Saga> {
        let row = sqlx::query(SELECT_SAGA)
            .bind(id.to_string())
            .fetch_optional(&mut *conn)
            .await
            .db()?
            .ok_or(StoreError::NotFound(id))?;
        let steps = sqlx::query(SELECT_STEPS)
            .bind(id.to_string())
            .fetch_all(&mut *conn)
            .await
            .db()?;
        let steps = steps
            .iter()
            .map(step_from_row)
            .collect::<Result<Vec<_>>>()?;
        saga_from_row(&row, steps)
    }

    async fn reload(&self, id: Uuid) -> Result<Saga> {
        Self::load_saga(&self.writer, id)
            .await?
            .ok_or(StoreError::NotFound(id))
    }

    /// The writer pool, for the idempotency and outbox stores (`BEGIN IMMEDIATE` writes).
    /// The group-commit queue, for writes that belong in the engine's commits.
    pub(crate) fn queue(&self) -> &WriteQueue<Sqlite> {
        &self.queue
    }

    pub(crate) fn writer_pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// The read-only pool, for the idempotency and outbox stores.
    pub(crate) fn reader_pool(&self) -> &SqlitePool {
        &self.reader
    }
}

fn split_durability(url: &str) -> Result<(String, SqliteDurability)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SqliteDurability::Full));
    };
    let mut durability = SqliteDurability::Full;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.to_ascii_lowercase().as_str() {
            "synchronous=full" => durability = SqliteDurability::Full,
            "synchronous=normal" => durability = SqliteDurability::Normal,
            p if p.starts_with("synchronous=") => {
                return Err(StoreError::UnsupportedUrl(crate::store::redact_url(url)))
            }
            _ => rest.push(pair),
        }
    }
    let base = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((base, durability))
}

const WORKERS_SQL: &str =
    "SELECT w.id, w.host, w.pid, w.started_at, w.heartbeat_at, w.stopped_at, \
     (SELECT COUNT(*) FROM sagas s WHERE s.lease_owner = w.id) AS leases \
     FROM workers w ORDER BY w.started_at DESC LIMIT 100";

const SAGA_COLUMNS: &str = "id, name, version, definition_hash, status, needs_attention, blocked, \
     cancel_requested, pivot_reached, input, output, error, next_run_at, lease_owner, lease_epoch, created_at, updated_at";

const SELECT_SAGA: &str = "SELECT id, name, version, definition_hash, status, needs_attention, blocked, \
     cancel_requested, pivot_reached, input, output, error, next_run_at, lease_owner, lease_epoch, lease_expires_at, \
     created_at, updated_at \
     FROM sagas WHERE id = ?1";

const SELECT_STEPS: &str =
    "SELECT saga_id, idx, name, kind, status, attempts, last_error, outcome_unknown, output, \
     started_at, ended_at, comp_status, comp_attempts, comp_last_error, comp_outcome_unknown, \
     comp_started_at, comp_ended_at FROM steps WHERE saga_id = ?1 ORDER BY idx";

fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

async fn insert_event(
    conn: &mut sqlx::SqliteConnection,
    saga_id: &str,
    at: Millis,
    kind: &str,
    step: Option<&str>,
    data: &Value,
) -> Result<()> {
    sqlx::query("INSERT INTO events (saga_id, at, type, step, data) VALUES (?1, ?2, ?3, ?4, ?5)")
        .bind(saga_id)
        .bind(at)
        .bind(kind)
        .bind(step)
        .bind(data.to_string())
        .execute(conn)
        .await
        .db()?;
    Ok(())
}

/// Claims due sagas for `owner` on the writer's connection.
async fn claim_on(
    conn: &mut sqlx::SqliteConnection,
    now: Millis,
    owner: &str,
    limit: u32,
    lease_ttl_ms: i64,
    definitions: &str,
) -> Result<Vec<Claimed>> {
    let rows = sqlx::query(
        "UPDATE sagas SET lease_owner = ?1, lease_epoch = lease_epoch + 1, lease_expires_at = ?2, \
         blocked = 0 \
         WHERE id IN (SELECT id FROM sagas \
             WHERE next_run_at IS NOT NULL AND next_run_at <= ?3 \
               AND (lease_owner IS NULL OR lease_expires_at < ?3) \
               AND definition_key IN (SELECT value FROM json_each(?4)) \
             ORDER BY next_run_at LIMIT ?5) \
         RETURNING id, lease_epoch",
    )
    .bind(owner)
    .bind(now + lease_ttl_ms)
    .bind(now)
    .bind(definitions)
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await
    .db()?;
    let mut claimed = Vec::with_capacity(rows.len());
    for row in &rows {
        let id_text: String = row.try_get("id").db()?;
        let id = Uuid::parse_str(&id_text).map_err(|e| corrupt(&id_text, e))?;
        let epoch: i64 = row.try_get("lease_epoch").db()?;
        let saga = match SqliteStore::require_saga(&mut *conn, id).await {
            Ok(saga) => saga,
            Err(StoreError::Corrupt { detail, .. }) => {
                // One unreadable row must not stop the engine from claiming the others:
                // park it, flagged and with an event, until a person repairs it and runs
                // `saga retry`.
                tracing::error!(saga.id = %id, %detail, "corrupt saga row parked; needs attention");
                sqlx::query(
                    "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL, \
                     next_run_at = NULL, needs_attention = 1, updated_at = ?2 WHERE id = ?1",
                )
                .bind(&id_text)
                .bind(now)
                .execute(&mut *conn)
                .await
                .db()?;
                let data = serde_json::json!({"detail": detail});
                insert_event(&mut *conn, &id_text, now, "saga.corrupt", None, &data).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        claimed.push(Claimed {
            lease: Lease {
                saga_id: id,
                owner: owner.to_owned(),
                epoch,
            },
            saga,
        });
    }
    Ok(claimed)
}

#[async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<()> {
        sqlx::migrate!("../migrations/sqlite")
            .run(&self.writer)
            .await
            .map_err(StoreError::from_migrate)?;
        Ok(())
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()> {
        if let Some(path) = &self.path {
            let lock_path = engine_lock_file(path);
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| StoreError::io(format!("cannot open {}: {e}", lock_path.display())))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::InUse(format!(
                        "another orchestrator process is running on {}; the embedded SQLite store \
                         allows one (use PostgreSQL to run several)",
                        path.display()
                    )))
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(StoreError::io(format!(
                        "cannot lock {}: {e}",
                        lock_path.display()
                    )))
                }
            }
            *self.engine_lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(file);
        }
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        // We hold the engine lock: every lease still recorded belongs to a dead process. Free
        // them (bumping the epoch, so that nothing of that process could still write).
        sqlx::query(
            "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1 \
             WHERE lease_owner IS NOT NULL",
        )
        .execute(&mut *tx)
        .await.db()?;
        sqlx::query("UPDATE workers SET stopped_at = ?1 WHERE stopped_at IS NULL")
            .bind(now)
            .execute(&mut *tx)
            .await
            .db()?;
        sqlx::query(
            "INSERT INTO workers (id, host, pid, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?4) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = ?4, stopped_at = NULL",
        )
        .bind(&worker.id)
        .bind(&worker.host)
        .bind(i64::from(worker.pid))
        .bind(now)
        .execute(&mut *tx)
        .await.db()?;
        self.commit(tx).await?;
        Ok(())
    }

    async fn heartbeat(&self, worker: &str, lease_ttl_ms: i64) -> Result<()> {
        let worker = worker.to_owned();
        self.queue
            .run(move |conn, now| {
                Box::pin(async move {
                    sqlx::query("UPDATE workers SET heartbeat_at = ?2 WHERE id = ?1")
                        .bind(&worker)
                        .bind(now)
                        .execute(&mut *conn)
                        .await
                        .db()?;
                    sqlx::query("UPDATE sagas SET lease_expires_at = ?2 WHERE lease_owner = ?1")
                        .bind(&worker)
                        .bind(now + lease_ttl_ms)
                        .execute(&mut *conn)
                        .await
                        .db()?;
                    Ok(())
                })
            })
            .await
    }

    async fn deregister_worker(&self, worker: &str) -> Result<()> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner = ?1",
        )
        .bind(worker)
        .execute(&mut *tx)
        .await
        .db()?;
        sqlx::query("UPDATE workers SET stopped_at = ?2, heartbeat_at = ?2 WHERE id = ?1")
            .bind(worker)
            .bind(now)
            .execute(&mut *tx)
            .await
            .db()?;
        self.commit(tx).await?;
        if let Some(file) = self
            .engine_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = file.unlock();
        }
        Ok(())
    }

    async fn create_saga(&self, new: NewSaga) -> Result<Saga> {
        self.queue.create(new, None).await
    }

    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed> {
        self.queue.create_leased(new, lease).await
    }

    async fn get_saga(&self, id: Uuid) -> Result<Option<Saga>> {
        Self::load_saga(&self.reader, id).await
    }

    async fn saga_status(&self, id: Uuid) -> Result<Option<SagaStatus>> {
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM sagas WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(&self.reader)
            .await
            .db()?;
        status.map(|s| parse_enum(&id.to_string(), &s)).transpose()
    }

    async fn saga_ids_with_prefix(
        &self,
        prefix: &crate::model::IdPrefix,
        limit: u32,
    ) -> Result<Vec<Uuid>> {
        // Ids are stored as lower-case hyphenated text, which sorts like the id's digits.
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM sagas WHERE id >= ?1 AND id <= ?2 ORDER BY id LIMIT ?3",
        )
        .bind(prefix.low().to_string())
        .bind(prefix.high().to_string())
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await
        .db()?;
        crate::store::rows::parse_ids(&ids)
    }

    async fn list_sagas(&self, filter: &ListFilter) -> Result<SagaPage> {
        let limit = filter.limit.clamp(1, MAX_PAGE);
        let mut q =
            QueryBuilder::<Sqlite>::new(format!("SELECT {SAGA_COLUMNS} FROM sagas WHERE 1=1"));
        if let Some(status) = filter.status {
            q.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(name) = &filter.name {
            q.push(" AND name = ").push_bind(name.clone());
        }
        if filter.needs_attention {
            q.push(" AND needs_attention = 1");
        }
        if let Some(cursor) = filter.cursor {
            q.push(" AND id < ").push_bind(cursor.to_string());
        }
        q.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(limit) + 1);
        let rows = q.build().fetch_all(&self.reader).await.db()?;
        page_from_rows(&rows, limit)
    }

    async fn events(&self, id: Uuid) -> Result<Vec<Event>> {
        let rows = sqlx::query(
            "SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS seq, at, type, step, data \
             FROM events WHERE saga_id = ?1 ORDER BY id",
        )
        .bind(id.to_string())
        .fetch_all(&self.reader)
        .await
        .db()?;
        let saga = id.to_string();
        rows.iter().map(|row| event_from_row(row, &saga)).collect()
    }

    async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>> {
        let rows = sqlx::query(
            "SELECT a.step_idx, s.name, a.phase, a.attempt, a.worker, a.lease_epoch, a.started_at, \
             a.ended_at, a.outcome, a.error FROM attempts a \
             JOIN steps s ON s.saga_id = a.saga_id AND s.idx = a.step_idx \
             WHERE a.saga_id = ?1 ORDER BY a.started_at, a.step_idx, a.phase, a.attempt",
        )
        .bind(id.to_string())
        .fetch_all(&self.reader)
        .await.db()?;
        rows.iter().map(attempt_from_row).collect()
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>> {
        if req.limit == 0 || req.definitions.is_empty() {
            return Ok(Vec::new());
        }
        let owner = req.owner.to_owned();
        let (limit, ttl) = (req.limit, req.lease_ttl_ms);
        let definitions = json_list(req.definitions);
        self.queue
            .run(move |conn, now| {
                Box::pin(async move { claim_on(conn, now, &owner, limit, ttl, &definitions).await })
            })
            .await
    }

    async fn apply(&self, lease: &Lease, t: &Transition) -> Result<Applied> {
        self.queue.apply(lease.clone(), t.clone()).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let released = sqlx::query(
            "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL \
             WHERE id = ?1 AND lease_owner = ?2 AND lease_epoch = ?3",
        )
        .bind(lease.saga_id.to_string())
        .bind(&lease.owner)
        .bind(lease.epoch)
        .execute(&self.writer)
        .await
        .db()?
        .rows_affected();
        if released == 0 {
            return Err(StoreError::LeaseLost(lease.saga_id));
        }
        Ok(())
    }

    async fn mark_blocked(&self, definitions: &[String]) -> Result<u64> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let rows = sqlx::query(
            "UPDATE sagas SET blocked = 1, updated_at = ?2 \
             WHERE next_run_at IS NOT NULL AND next_run_at <= ?2 AND blocked = 0 AND lease_owner IS NULL \
               AND definition_key NOT IN (SELECT value FROM json_each(?1)) \
             RETURNING id, definition_key",
        )
        .bind(json_list(definitions))
        .bind(now)
        .fetch_all(&mut *tx)
        .await.db()?;
        for row in &rows {
            let id: String = row.try_get("id").db()?;
            let key: String = row.try_get("definition_key").db()?;
            let data = serde_json::json!({
                "definition": key,
                "reason": "no running orchestrator process has this exact saga definition"
            });
            insert_event(&mut tx, &id, now, "saga.blocked", None, &data).await?;
        }
        self.commit(tx).await?;
        Ok(rows.len() as u64)
    }

    async fn next_due(&self, definitions: &[String]) -> Result<Option<Millis>> {
        let row = sqlx::query(
            "SELECT MIN(next_run_at) AS due FROM sagas \
             WHERE next_run_at IS NOT NULL AND lease_owner IS NULL \
               AND definition_key IN (SELECT value FROM json_each(?1))",
        )
        .bind(json_list(definitions))
        .fetch_one(&self.reader)
        .await
        .db()?;
        row.try_get("due").db()
    }

    async fn due_now(&self, definitions: &[String]) -> Result<bool> {
        let due: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sagas \
             WHERE next_run_at IS NOT NULL AND next_run_at <= ?1 AND lease_owner IS NULL \
               AND definition_key IN (SELECT value FROM json_each(?2)))",
        )
        .bind(self.now_ms())
        .bind(json_list(definitions))
        .fetch_one(&self.reader)
        .await
        .db()?;
        Ok(due)
    }

    async fn request_cancel(&self, id: Uuid) -> Result<CancelOutcome> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let row = sqlx::query("SELECT status, pivot_reached FROM sagas WHERE id = ?1")
            .bind(id.to_string())
            .fetch_optional(&mut *tx)
            .await
            .db()?
            .ok_or(StoreError::NotFound(id))?;
        let status: SagaStatus =
            parse_enum(&id.to_string(), &row.try_get::<String, _>("status").db()?)?;
        let pivot_reached: bool = row.try_get("pivot_reached").db()?;
        let outcome = if let Some(refusal) = cancel_refusal(status, pivot_reached) {
            refusal
        } else {
            sqlx::query(
                "UPDATE sagas SET cancel_requested = 1, updated_at = ?2, \
                 next_run_at = MIN(COALESCE(next_run_at, ?2), ?2) WHERE id = ?1",
            )
            .bind(id.to_string())
            .bind(now)
            .execute(&mut *tx)
            .await
            .db()?;
            insert_event(
                &mut tx,
                &id.to_string(),
                now,
                "saga.cancel_requested",
                None,
                &serde_json::json!({}),
            )
            .await?;
            CancelOutcome::Accepted
        };
        self.commit(tx).await?;
        Ok(outcome)
    }

    async fn abort(&self, id: Uuid, reason: &str, actor: &str) -> Result<Saga> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let saga = Self::require_saga(&mut tx, id).await?;
        check_abort(&saga)?;
        sqlx::query(
            "UPDATE sagas SET status = 'ABORTED', next_run_at = NULL, lease_owner = NULL, \
             lease_expires_at = NULL, lease_epoch = lease_epoch + 1, updated_at = ?2, \
             error = COALESCE(error, ?3) WHERE id = ?1",
        )
        .bind(id.to_string())
        .bind(now)
        .bind(format!("aborted: {reason}"))
        .execute(&mut *tx)
        .await
        .db()?;
        let data =
            serde_json::json!({"reason": reason, "actor": actor, "previous_status": saga.status});
        insert_event(&mut tx, &id.to_string(), now, "saga.aborted", None, &data).await?;
        self.commit(tx).await?;
        self.reload(id).await
    }

    async fn retry_now(&self, id: Uuid, actor: &str) -> Result<Saga> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let saga = Self::require_saga(&mut tx, id).await?;
        match plan_retry(&saga)? {
            RetryPlan::Failed(failed) => {
                sqlx::query("UPDATE steps SET status = 'RETRYING' WHERE saga_id = ?1 AND idx = ?2")
                    .bind(id.to_string())
                    .bind(i64::from(failed.index))
                    .execute(&mut *tx)
                    .await
                    .db()?;
                sqlx::query(
                    "UPDATE sagas SET status = 'RUNNING', next_run_at = ?2, needs_attention = 0, \
                     lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1, \
                     updated_at = ?2 WHERE id = ?1",
                )
                .bind(id.to_string())
                .bind(now)
                .execute(&mut *tx)
                .await
                .db()?;
                let data = serde_json::json!({"actor": actor, "step": failed.name});
                insert_event(
                    &mut tx,
                    &id.to_string(),
                    now,
                    "saga.retried",
                    Some(&failed.name),
                    &data,
                )
                .await?;
            }
            RetryPlan::DueNow => {
                sqlx::query(
                    "UPDATE sagas SET next_run_at = ?2, updated_at = ?2 \
                     WHERE id = ?1 AND (next_run_at IS NULL OR next_run_at > ?2)",
                )
                .bind(id.to_string())
                .bind(now)
                .execute(&mut *tx)
                .await
                .db()?;
                let data = serde_json::json!({"actor": actor});
                insert_event(
                    &mut tx,
                    &id.to_string(),
                    now,
                    "saga.retry_requested",
                    None,
                    &data,
                )
                .await?;
            }
        }
        self.commit(tx).await?;
        self.reload(id).await
    }

    async fn mark_compensated(
        &self,
        id: Uuid,
        step: &str,
        reason: &str,
        actor: &str,
    ) -> Result<Saga> {
        let now = self.now_ms();
        let mut tx = self.begin_write().await?;
        let saga = Self::require_saga(&mut tx, id).await?;
        let record = check_mark_compensated(&saga, id, step)?;
        sqlx::query(
            "UPDATE steps SET comp_status = 'MANUAL', comp_ended_at = ?3 WHERE saga_id = ?1 AND idx = ?2",
        )
        .bind(id.to_string())
        .bind(i64::from(record.index))
        .bind(now)
        .execute(&mut *tx)
        .await.db()?;
        // Take the saga from whichever worker holds it (its next write fails on the epoch) and
        // make it due, so the engine carries on with the remaining compensations.
        sqlx::query(
            "UPDATE sagas SET needs_attention = 0, next_run_at = ?2, lease_owner = NULL, \
             lease_expires_at = NULL, lease_epoch = lease_epoch + 1, updated_at = ?2 WHERE id = ?1",
        )
        .bind(id.to_string())
        .bind(now)
        .execute(&mut *tx)
        .await
        .db()?;
        let data = serde_json::json!({"reason": reason, "actor": actor});
        insert_event(
            &mut tx,
            &id.to_string(),
            now,
            "step.marked_compensated",
            Some(step),
            &data,
        )
        .await?;
        self.commit(tx).await?;
        self.reload(id).await
    }

    async fn workers(&self) -> Result<Vec<crate::model::Worker>> {
        let rows = sqlx::query(WORKERS_SQL)
            .fetch_all(&self.reader)
            .await
            .db()?;
        rows.iter().map(worker_from_row).collect()
    }

    fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed) + self.queue.commits()
    }

    async fn now(&self) -> Result<Millis> {
        Ok(self.now_ms())
    }
}

#[cfg(test)]
mod upgrade_tests;
