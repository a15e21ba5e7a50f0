//! The embedded SQLite store: one file, WAL, `synchronous=FULL` by default.
//!
//! Writes go through a pool of exactly one connection, and every write transaction starts with
//! `BEGIN IMMEDIATE`: this process never upgrades a read lock into a write lock (the source of
//! `SQLITE_BUSY` surprises), and other processes on the same file (the `saga` CLI) wait on
//! `busy_timeout` instead of failing. Reads use their own pool and, thanks to WAL, never wait for
//! the writer.
//!
//! Only one process may run the engine on a file: [`Store::register_worker`](crate::store::EngineLog::register_worker) takes an exclusive
//! lock on `PATH.lock` and then frees every lease left by a process that died, so a restart
//! resumes at once instead of waiting for leases to expire.
//!
//! [`Store::register_worker`](crate::store::EngineLog::register_worker): crate::store::Store::register_worker

use std::fs::File;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};
use uuid::Uuid;

pub(crate) mod handle;
mod idempotency;
mod keyed;
mod outbox;
mod stmt;
pub(crate) mod writer;
mod writer_rows;

use crate::clock::{Clock, SystemClock};
use crate::model::{Millis, Saga};
use crate::store::rows::{corrupt, saga_from_row, step_from_row};
use crate::store::shared::sql::{Reader, Tx};
use crate::store::shared::SqlBackend;
use crate::store::write_queue::{Checkpoint, Tuning, WriteQueue};
use crate::store::SqlxResultExt;
use crate::store::{
    Applied, ClaimRequest, Claimed, Lease, LeaseRequest, NewSaga, Result, StoreError, Transition,
    WorkerInfo,
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

/// The SQLite implementation of [`Store`](crate::store::Store).
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
    /// Rung when such a commit made a saga due (a signal, a cancel): the engine of this
    /// process, the only one on the file, looks at once.
    due: std::sync::Arc<tokio::sync::Notify>,
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
        Self::open_inner(url, create, clock, true).await
    }

    /// Opens (creating it if missing) a store whose times come from `clock`, which may be
    /// virtual (a test kit's): the store then runs no timer of its own, since a virtual clock
    /// would fire it at every step of virtual time. The writer still checkpoints the WAL
    /// between its batches.
    pub async fn open_on_clock(url: &str, clock: std::sync::Arc<dyn Clock>) -> Result<Self> {
        Self::open_inner(url, true, clock, false).await
    }

    async fn open_inner(
        url: &str,
        create: bool,
        clock: std::sync::Arc<dyn Clock>,
        background_checkpoints: bool,
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
            // or an update of that row in the same transaction, and a saga is deleted only
            // finished, after its rows, in one transaction (retention). The
            // check was a probe of `sagas`' key per steps, attempts and events row, a cost the
            // single writer paid on every write (BENCHMARKS.md).
            .foreign_keys(false)
            .pragma("temp_store", "memory")
            .pragma("cache_size", "-16000")
            // Checkpoints run in the background (see `checkpoint_loop`), not inside a commit
            // that then stalls for the whole copy: they were the tail of the commit latency.
            .pragma("wal_autocheckpoint", "0");
        let path = opts.get_filename().to_owned();
        let in_memory = base.contains(":memory:") || path.as_os_str().is_empty();
        if !in_memory {
            check_folder(&path)?;
        }
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
            // of many write transactions, a cost that grows with the cache (BENCHMARKS.md). The
            // readers keep the large one.
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
        let checkpointer = if in_memory || !background_checkpoints {
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
            due: std::sync::Arc::default(),
        };
        SqlBackend::migrate(&store).await?;
        Ok(store)
    }

    fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    /// Waits until the writer's connection is back in its pool (no batch in flight, nor on
    /// its way back after one): a runtime dropped after this closes it cleanly, whereas one
    /// dropped meanwhile makes sqlx's thread panic at the close (see `handle`'s invariant 3).
    /// For a caller that drops runtimes while the process lives on (a test kit).
    pub async fn settled(&self) {
        while self.writer.num_idle() < self.writer.size() as usize {
            tokio::task::yield_now().await;
        }
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

    /// The group-commit queue, for writes that belong in the engine's commits.
    pub(crate) fn queue(&self) -> &WriteQueue<Sqlite> {
        &self.queue
    }

    /// The writer pool (for tests that borrow its handle).
    #[cfg(test)]
    pub(crate) fn writer_pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// The read-only pool, for the idempotency and outbox stores.
    pub(crate) fn reader_pool(&self) -> &SqlitePool {
        &self.reader
    }
}

/// Refuses a database path whose folder is missing (or is not a folder), naming that folder:
/// SQLite would only say "unable to open database file", which does not say which part of the
/// path is wrong. Nothing is created: a folder is the operator's to make, in the right place.
fn check_folder(path: &std::path::Path) -> Result<()> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let Some(folder) = absolute.parent() else {
        return Ok(());
    };
    if folder.as_os_str().is_empty() || folder.is_dir() {
        return Ok(());
    }
    let what = if folder.exists() {
        "is not a folder"
    } else {
        "does not exist"
    };
    Err(StoreError::io(format!(
        "the folder {} {what}, so database {} cannot be opened there: create it (mkdir -p {}) \
         or point --database-url (DATABASE_URL) at a folder that exists",
        folder.display(),
        absolute
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        folder.display()
    )))
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
                return Err(StoreError::InvalidUrl(format!(
                    "database URL {:?}: {pair:?} is not a setting this store knows: use \
                     synchronous=full (the default: every commit is on disk when it returns) or \
                     synchronous=normal (faster; a power loss may undo the last commits)",
                    crate::store::redact_url(url)
                )))
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

const SELECT_SAGA: &str = "SELECT id, name, version, definition_hash, status, needs_attention, blocked, \
     cancel_requested, pause_requested, paused_from, pivot_reached, input, output, error, next_run_at, lease_owner, lease_epoch, lease_expires_at, \
     created_at, updated_at, parent_id, parent_stage, scheduled_at, traceparent, forked_from, \
     forked_from_stage, superseded_by, priority FROM sagas WHERE id = ?1";

const SELECT_STEPS: &str =
    "SELECT saga_id, idx, name, kind, status, attempts, last_error, outcome_unknown, output, \
     started_at, ended_at, comp_status, comp_attempts, comp_last_error, comp_outcome_unknown, \
     comp_started_at, comp_ended_at, wake_at, waiting_for, timeout_at, retry_at, stage_index, \
     branch, budget_attempts, budget_started_at, keys_saga_id FROM steps WHERE saga_id = ?1 ORDER BY idx";

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

/// The claim's statement: due sagas, and waiting ones it admits (by priority, and with
/// `limited`, within the limits of the definitions `?6`), the first `?5` of them by priority.
fn claim_text(limited: bool) -> String {
    use crate::store::shared::admission;
    let defs = "IN (SELECT value FROM json_each(?4))";
    let lim = if limited {
        let flows = "IN (SELECT value FROM json_each(?6))";
        format!(
            " UNION ALL SELECT * FROM ({})",
            admission::limited("?3", defs, flows)
        )
    } else {
        String::new()
    };
    format!(
        "UPDATE sagas SET lease_owner = ?1, lease_epoch = lease_epoch + 1, lease_expires_at = ?2, \
         blocked = 0, gate = 0 \
         WHERE id IN (SELECT id FROM ( \
             SELECT * FROM (SELECT id, priority, 0 AS rnk, next_run_at FROM sagas \
             WHERE next_run_at IS NOT NULL AND gate = 0 AND next_run_at <= ?3 \
               AND (lease_owner IS NULL OR lease_expires_at < ?3) \
               AND definition_key {defs} \
             ORDER BY next_run_at LIMIT ?5) \
             UNION ALL SELECT * FROM ({prio}){lim}) \
           ORDER BY priority DESC, rnk, next_run_at LIMIT ?5) \
         RETURNING id, lease_epoch",
        prio = admission::by_priority("?3", defs, "?5", ""),
    )
}

static CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| claim_text(false));
static SWEEP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    crate::store::shared::admission::sweep("IN (SELECT value FROM json_each(?1))")
});
static CLAIM_LIMITED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| claim_text(true));

/// Claims due sagas for `owner` on the writer's connection, admitting waiting ones of the
/// definitions `flows` (a JSON list, `None` for none) within their limits.
async fn claim_on(
    conn: &mut sqlx::SqliteConnection,
    now: Millis,
    owner: &str,
    limit: u32,
    lease_ttl_ms: i64,
    definitions: &str,
    flows: Option<&str>,
) -> Result<Vec<Claimed>> {
    let text = if flows.is_some() {
        &CLAIM_LIMITED
    } else {
        &CLAIM
    };
    let mut query = sqlx::query(text.as_str())
        .bind(owner)
        .bind(now + lease_ttl_ms)
        .bind(now)
        .bind(definitions)
        .bind(i64::from(limit));
    if let Some(flows) = flows {
        sqlx::query(&SWEEP)
            .bind(flows)
            .execute(&mut *conn)
            .await
            .db()?;
        query = query.bind(flows);
    }
    let rows = query.fetch_all(&mut *conn).await.db()?;
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
impl SqlBackend for SqliteStore {
    // One engine runs on the file: blocked means this one lacks the definition.
    const MARK_BLOCKED: &'static str = "UPDATE sagas SET blocked = TRUE, updated_at = $2 \
         WHERE next_run_at IS NOT NULL AND gate = 0 AND next_run_at <= $2 AND blocked = FALSE \
           AND lease_owner IS NULL AND definition_key NOT IN (SELECT value FROM json_each($1)) \
         RETURNING id, definition_key";

    fn reader(&self) -> Reader<'_> {
        Reader::Sqlite(&self.reader)
    }

    async fn begin(&self) -> Result<Tx> {
        let tx = self.begin_write().await?;
        Ok(Tx::sqlite(tx, Some(self.now_ms())))
    }

    async fn commit(&self, tx: Tx) -> Result<()> {
        let due = tx.commit().await?;
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if due {
            self.due.notify_one();
        }
        Ok(())
    }

    fn due_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        Some(self.due.clone())
    }

    async fn migrate(&self) -> Result<()> {
        crate::store::migrations::Embedded(crate::store::migrations::SQLITE)
            .migrator()
            .await
            .map_err(StoreError::from_migrate)?
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

    async fn create_saga(&self, new: NewSaga) -> Result<Saga> {
        self.queue.create(new, None).await
    }

    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed> {
        self.queue.create_leased(new, lease).await
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>> {
        if req.limit == 0 || req.definitions.is_empty() {
            return Ok(Vec::new());
        }
        let owner = req.owner.to_owned();
        let (limit, ttl) = (req.limit, req.lease_ttl_ms);
        let definitions = json_list(req.definitions);
        let flows = (!req.flows.is_empty()).then(|| json_list(req.flows));
        self.queue
            .run(move |conn, now| {
                Box::pin(async move {
                    claim_on(
                        conn,
                        now,
                        &owner,
                        limit,
                        ttl,
                        &definitions,
                        flows.as_deref(),
                    )
                    .await
                })
            })
            .await
    }

    async fn apply(&self, lease: &Lease, t: &Transition) -> Result<Applied> {
        self.queue.apply(lease.clone(), t.clone()).await
    }

    async fn due_now(&self, definitions: &[String]) -> Result<bool> {
        let due: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sagas \
             WHERE next_run_at IS NOT NULL AND gate = 0 AND next_run_at <= ?1 AND lease_owner IS NULL \
               AND definition_key IN (SELECT value FROM json_each(?2))) \
             OR EXISTS (SELECT 1 FROM sagas WHERE gate = 1 AND flow IS NULL \
               AND next_run_at IS NOT NULL AND next_run_at <= ?1 \
               AND definition_key IN (SELECT value FROM json_each(?2)))",
        )
        .bind(self.now_ms())
        .bind(json_list(definitions))
        .fetch_one(&self.reader)
        .await
        .db()?;
        Ok(due)
    }

    fn deregistered(&self) {
        if let Some(file) = self
            .engine_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = file.unlock();
        }
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
