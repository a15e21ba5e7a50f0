//! The PostgreSQL store: how users scale out to many orchestrator processes on one database.
//!
//! Workers claim due sagas in batches with `FOR UPDATE SKIP LOCKED` over a materialised candidate
//! set (so `LIMIT` applies before the locks, not after a late filter), hold them with heartbeats,
//! and lose them when the lease expires on the **database clock** (`saga_now_ms()`), so a worker
//! with a skewed clock cannot keep or steal a lease. Every write of the engine checks owner and
//! epoch in its `WHERE` clause, in the same transaction as the change (fencing).
//!
//! New and released sagas raise `NOTIFY saga_due`; every engine listens, so a saga started
//! through one process is picked up by an idle one without waiting for a poll. Polling stays as
//! the fallback (a notification lost while the listener reconnects costs one poll interval).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Executor, Postgres, Row, Transaction};
use tokio::sync::Notify;
use uuid::Uuid;

mod cols;
mod idempotency;
mod outbox;
pub(crate) mod writer;

use crate::model::{Millis, Saga, SagaStatus, StepRecord};
use crate::store::rows::{corrupt, saga_from_row, step_from_row};
use crate::store::shared::sql::{Reader, Tx, DONE_CHANNEL, DUE_CHANNEL};
use crate::store::shared::SqlBackend;
use crate::store::write_queue::{Tuning, WriteQueue};
use crate::store::SqlxResultExt;
use crate::store::{
    Applied, ClaimRequest, Claimed, Lease, LeaseRequest, NewSaga, Result, StoreError, Transition,
    WorkerInfo,
};

/// Writer connections of the group commit. Under load the writer's backend is the limit (one
/// process, one core), so a second one, committing beside it, adds a core's worth of work; at
/// moderate load it would only halve the batches (BENCHMARKS.md), so it starts a batch beside
/// the other only once [`PARALLEL_FROM`] writes wait.
const WRITERS: usize = 2;

/// See [`WRITERS`]. A saga has one write in flight at a time, so with up to 32 sagas in
/// flight the second writer only takes turns: two writers that never wait for each other
/// split moderate load into twice the commits (BENCHMARKS.md).
const PARALLEL_FROM: usize = 32;

/// The writer connections' own pool, apart from the readers'.
///
/// The batch statements are prepared once per connection and then run with a generic plan,
/// costed when the plan was first cached — often while the log was still small, when a
/// sequential scan of `sagas` looks cheaper than its primary key. Such a plan stays cached
/// while the table grows, until the next `ANALYZE` replaces it; meanwhile every batch scans
/// the whole table. Every statement the writers run finds its rows by key, so their sessions
/// rule sequential scans out (`enable_seqscan = off` only makes them the last resort; a
/// statement with no index to use still runs). Readers keep the planner's defaults.
fn writer_pool(opts: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(WRITERS as u32)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(true)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET enable_seqscan = off").await?;
                Ok(())
            })
        })
        .connect_lazy_with(opts)
}

/// The PostgreSQL implementation of [`Store`](crate::store::Store).
pub struct PgStore {
    pool: PgPool,
    commits: AtomicU64,
    /// Engine writes (create, transitions), group-committed.
    queue: WriteQueue<Postgres>,
    due: Arc<Notify>,
    done: tokio::sync::broadcast::Sender<(Uuid, SagaStatus)>,
    listener: OnceLock<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

/// The claim's statement: due sagas, and waiting ones it admits (by priority, and with
/// `limited`, within the limits of the definitions `$5`), the first `$4` by priority. The
/// candidates taken by the time they are due are materialised and locked first (SKIP LOCKED:
/// other workers claiming at the same moment get other sagas), then updated; those admitted
/// within limits are not locked (the advisory lock keeps other admissions out), so the update
/// checks again that each still waits. The time is read once (`(SELECT saga_now_ms())`), so
/// that it bounds the walk of the due-time index instead of filtering every saga waiting on a
/// later timer.
fn claim_text(limited: bool) -> String {
    use crate::store::shared::admission;
    let now = "(SELECT saga_now_ms())";
    let defs = "= ANY($3)";
    let lim = if limited {
        format!(
            ", lim AS MATERIALIZED ({})",
            admission::limited(now, defs, "= ANY($5)")
        )
    } else {
        String::new()
    };
    format!(
        "WITH due AS MATERIALIZED ( \
             SELECT id, priority, 0 AS rnk, next_run_at FROM sagas \
             WHERE next_run_at IS NOT NULL AND gate = 0 AND next_run_at <= {now} \
               AND (lease_owner IS NULL OR lease_expires_at < {now}) \
               AND definition_key {defs} \
             ORDER BY next_run_at LIMIT $4 \
             FOR UPDATE SKIP LOCKED), \
         prio AS MATERIALIZED ({prio}){lim}, \
         picked AS (SELECT id FROM (SELECT * FROM due UNION ALL SELECT * FROM prio{more}) u \
             ORDER BY priority DESC, rnk, next_run_at LIMIT $4) \
         UPDATE sagas s SET lease_owner = $1, lease_epoch = s.lease_epoch + 1, \
             lease_expires_at = saga_now_ms() + $2, blocked = FALSE, gate = 0 \
         FROM picked c WHERE s.id = c.id \
           AND (s.gate = 0 OR (s.next_run_at IS NOT NULL AND s.lease_owner IS NULL)) \
         RETURNING s.id::text AS id, s.lease_epoch",
        prio = admission::by_priority(now, defs, "$4", " FOR UPDATE SKIP LOCKED"),
        more = if limited {
            " UNION ALL SELECT * FROM lim"
        } else {
            ""
        },
    )
}

static CLAIM: LazyLock<String> = LazyLock::new(|| claim_text(false));
static SWEEP: LazyLock<String> =
    LazyLock::new(|| crate::store::shared::admission::sweep("= ANY($1)"));
static CLAIM_LIMITED: LazyLock<String> = LazyLock::new(|| claim_text(true));

const SAGA_SELECT: &str = "SELECT id::text AS id, name, version, definition_hash, status, needs_attention, \
     blocked, cancel_requested, pause_requested, paused_from, pivot_reached, input::text AS input, output::text AS output, error, \
     next_run_at, lease_owner, lease_epoch, lease_expires_at, created_at, updated_at, \
     parent_id::text AS parent_id, parent_stage, scheduled_at, traceparent, \
     forked_from::text AS forked_from, forked_from_stage, superseded_by::text AS superseded_by, \
     priority::bigint AS priority FROM sagas";

const STEPS_SELECT: &str =
    "SELECT saga_id::text AS saga_id, idx, name, kind, status, attempts, last_error, \
     outcome_unknown, output::text AS output, started_at, ended_at, comp_status, comp_attempts, \
     comp_last_error, comp_outcome_unknown, comp_started_at, comp_ended_at, wake_at, waiting_for, \
     timeout_at, retry_at, stage_index, branch, budget_attempts, budget_started_at, \
     keys_saga_id::text AS keys_saga_id FROM steps";

/// How long the first connection of [`PgStore::open`] may take before the server is reported as
/// unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What `opts` dials, for people: `PostgreSQL at host:port (database NAME)`; never a password.
fn describe_target(opts: &PgConnectOptions) -> String {
    let host = opts.get_host();
    let at = if host.starts_with('/') {
        // A Unix socket directory.
        format!("{host}/.s.PGSQL.{}", opts.get_port())
    } else if host.contains(':') {
        format!("[{host}]:{}", opts.get_port())
    } else {
        format!("{host}:{}", opts.get_port())
    };
    match opts.get_database() {
        Some(db) => format!("PostgreSQL at {at} (database {db})"),
        None => format!("PostgreSQL at {at}"),
    }
}

/// Opens and closes one connection, so that a server that is down, unreachable or refusing us
/// is reported at once with its address and the cause.
async fn probe_connection(opts: &PgConnectOptions) -> Result<()> {
    use sqlx::{ConnectOptions, Connection};

    let target = describe_target(opts);
    match tokio::time::timeout(CONNECT_TIMEOUT, opts.connect()).await {
        Err(_) => Err(StoreError::connect(
            &target,
            &format!(
                "no answer within {}s (is the host reachable?)",
                CONNECT_TIMEOUT.as_secs()
            ),
            true,
        )),
        Ok(Ok(conn)) => {
            // Closing politely is a courtesy to the server; failing to is no reason to stop.
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(connect_error(target, e)),
    }
}

/// A failed first connection as a store error that says why in plain words.
fn connect_error(target: String, e: sqlx::Error) -> StoreError {
    use std::io::ErrorKind;

    let (cause, transient) = match &e {
        sqlx::Error::Io(io) => {
            let cause = match io.kind() {
                ErrorKind::ConnectionRefused => "connection refused (is PostgreSQL running \
                     and listening there?)"
                    .to_owned(),
                ErrorKind::TimedOut => "connection timed out".to_owned(),
                ErrorKind::NotFound => "no such socket (is PostgreSQL running?)".to_owned(),
                _ => io.to_string(),
            };
            (cause, true)
        }
        sqlx::Error::Tls(t) => (format!("TLS failed: {t}"), false),
        sqlx::Error::Database(d) => (d.message().to_owned(), false),
        other => (other.to_string(), false),
    };
    StoreError::connect(&target, &cause, transient)
}

impl PgStore {
    /// Connects to the database a `postgres://` URL names and applies migrations.
    pub async fn open(url: &str) -> Result<Self> {
        let opts: PgConnectOptions = url
            .parse()
            .map_err(|_| StoreError::UnsupportedUrl(crate::store::redact_url(url)))?;
        // One direct connection first: the pool would retry a refused connection until its
        // acquire timeout and then report only "pool timed out", hiding the cause.
        probe_connection(&opts).await?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            // A connection that died with a server restart is noticed before use.
            .test_before_acquire(true)
            .connect_with(opts.clone())
            .await
            .db()?;
        let store = Self {
            queue: WriteQueue::start(
                writer_pool(opts),
                Tuning {
                    keep_connection: true,
                    checkpoint: None,
                    writers: WRITERS,
                    parallel_from: PARALLEL_FROM,
                },
                |_| writer::PgWriter,
                Arc::new(crate::clock::SystemClock),
            ),
            pool,
            commits: AtomicU64::new(0),
            due: Arc::new(Notify::new()),
            done: tokio::sync::broadcast::channel(4096).0,
            listener: OnceLock::new(),
        };
        SqlBackend::migrate(&store).await?;
        Ok(store)
    }

    /// The connection pool (for tests and tools that need raw access).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn commit(&self, tx: Transaction<'static, Postgres>) -> Result<()> {
        tx.commit().await.db()?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts the LISTEN task once, on first use.
    fn ensure_listener(&self) {
        self.listener.get_or_init(|| {
            tokio::spawn(listen_loop(
                self.pool.clone(),
                self.due.clone(),
                self.done.clone(),
            ));
        });
    }

    /// Loads sagas with their steps, in the order of `ids`; a row that does not parse comes
    /// back as its own `Err` so one corrupt saga does not hide the others.
    async fn load_many(
        conn: &mut sqlx::PgConnection,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, Result<Saga>)>> {
        let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let saga_rows = sqlx::query(&format!("{SAGA_SELECT} WHERE id = ANY($1::uuid[])"))
            .bind(&texts)
            .fetch_all(&mut *conn)
            .await
            .db()?;
        let step_rows = sqlx::query(&format!(
            "{STEPS_SELECT} WHERE saga_id = ANY($1::uuid[]) ORDER BY saga_id, idx"
        ))
        .bind(&texts)
        .fetch_all(&mut *conn)
        .await
        .db()?;
        let mut steps: HashMap<String, Vec<Result<StepRecord>>> = HashMap::new();
        for row in &step_rows {
            let saga: String = row.try_get("saga_id").db()?;
            steps.entry(saga).or_default().push(step_from_row(row));
        }
        let mut by_id: HashMap<String, Result<Saga>> = HashMap::new();
        for row in &saga_rows {
            let id: String = row.try_get("id").db()?;
            let own = steps
                .remove(&id)
                .unwrap_or_default()
                .into_iter()
                .collect::<Result<Vec<_>>>();
            let saga = own.and_then(|s| saga_from_row(row, s));
            by_id.insert(id, saga);
        }
        Ok(ids
            .iter()
            .filter_map(|id| by_id.remove(&id.to_string()).map(|s| (*id, s)))
            .collect())
    }
}

async fn insert_event(
    tx: &mut Transaction<'static, Postgres>,
    saga_id: &str,
    kind: &str,
    step: Option<&str>,
    data: &Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO events (saga_id, at, type, step, data) \
         VALUES ($1::uuid, saga_now_ms(), $2, $3, $4::jsonb)",
    )
    .bind(saga_id)
    .bind(kind)
    .bind(step)
    .bind(data.to_string())
    .execute(&mut **tx)
    .await
    .db()?;
    Ok(())
}

/// A `saga_done` payload: `ID STATUS`.
fn parse_done(payload: &str) -> Option<(Uuid, SagaStatus)> {
    let (id, status) = payload.split_once(' ')?;
    Some((Uuid::parse_str(id).ok()?, status.parse().ok()?))
}

async fn listen_loop(
    pool: PgPool,
    due: Arc<Notify>,
    done: tokio::sync::broadcast::Sender<(Uuid, SagaStatus)>,
) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => {
                if let Err(e) = listener.listen_all([DUE_CHANNEL, DONE_CHANNEL]).await {
                    tracing::warn!(error = %e, "LISTEN failed; polling until it works");
                } else {
                    loop {
                        // `recv` reconnects by itself after a lost connection; notifications sent
                        // meanwhile are lost, which the poll covers.
                        match listener.recv().await {
                            Ok(n) if n.channel() == DONE_CHANNEL => {
                                if let Some(ended) = parse_done(n.payload()) {
                                    let _ = done.send(ended);
                                }
                            }
                            Ok(_) => due.notify_one(),
                            Err(e) => {
                                tracing::warn!(error = %e, "LISTEN connection failed");
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot connect for LISTEN; polling meanwhile"),
        }
        // Whatever was missed while disconnected: let the engine look now.
        due.notify_one();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Writes a new saga (due now on the database clock), its steps and its `saga.started` event
/// inside the caller's transaction, with the statement of a batch of creates
/// ([`writer::insert_saga`]): leased as `lease` asks if given, with its first action written ahead if [`NewSaga::first_attempt`] asks, and waking
/// the workers on commit if unleased. Returns the creation time. Shared by the starts that
/// record more in the same transaction (a key, a callback).
pub(crate) async fn insert_saga_rows(
    tx: &mut Transaction<'static, Postgres>,
    new: &NewSaga,
    lease: Option<&LeaseRequest>,
) -> Result<Millis> {
    let now: i64 = sqlx::query_scalar("SELECT saga_now_ms()")
        .fetch_one(&mut **tx)
        .await
        .db()?;
    writer::insert_saga(tx, now, new, lease).await?;
    Ok(now)
}

#[async_trait]
impl SqlBackend for PgStore {
    // Blocked means no live worker has the definition, not only this one: workers of
    // different versions may share a database during a rolling deploy.
    const MARK_BLOCKED: &'static str = "UPDATE sagas SET blocked = TRUE, updated_at = $2 \
         WHERE next_run_at IS NOT NULL AND gate = 0 AND next_run_at <= $2 AND NOT blocked \
           AND (lease_owner IS NULL OR lease_expires_at < $2) \
           AND definition_key <> ALL($1) \
           AND definition_key NOT IN ( \
               SELECT unnest(definitions) FROM workers \
               WHERE stopped_at IS NULL AND heartbeat_at > $2 - 60000) \
         RETURNING id::text AS id, definition_key";

    fn reader(&self) -> Reader<'_> {
        Reader::Postgres(&self.pool)
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(Tx::postgres(self.pool.begin().await.db()?))
    }

    async fn commit(&self, tx: Tx) -> Result<()> {
        tx.commit().await?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn migrate(&self) -> Result<()> {
        crate::store::migrations::Embedded(crate::store::migrations::POSTGRES)
            .migrator()
            .await
            .map_err(StoreError::from_migrate)?
            .run(&self.pool)
            .await
            .map_err(StoreError::from_migrate)?;
        Ok(())
    }

    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()> {
        sqlx::query(
            "INSERT INTO workers (id, host, pid, definitions, started_at, heartbeat_at) \
             VALUES ($1, $2, $3, $4, saga_now_ms(), saga_now_ms()) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = saga_now_ms(), stopped_at = NULL, \
             definitions = EXCLUDED.definitions",
        )
        .bind(&worker.id)
        .bind(&worker.host)
        .bind(i64::from(worker.pid))
        .bind(&worker.definitions)
        .execute(&self.pool)
        .await
        .db()?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn heartbeat(&self, worker: &str, lease_ttl_ms: i64) -> Result<()> {
        let mut tx = self.pool.begin().await.db()?;
        sqlx::query("UPDATE workers SET heartbeat_at = saga_now_ms() WHERE id = $1")
            .bind(worker)
            .execute(&mut *tx)
            .await
            .db()?;
        sqlx::query(
            "UPDATE sagas SET lease_expires_at = saga_now_ms() + $2 WHERE lease_owner = $1",
        )
        .bind(worker)
        .bind(lease_ttl_ms)
        .execute(&mut *tx)
        .await
        .db()?;
        self.commit(tx).await
    }

    async fn create_saga(&self, new: NewSaga) -> Result<Saga> {
        // The insert notifies `saga_due`, delivered on commit.
        self.queue.create(new, None).await
    }

    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed> {
        self.queue.create_leased(new, lease).await
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>> {
        if req.limit == 0 || req.definitions.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await.db()?;
        let limited = !req.flows.is_empty();
        if limited {
            // Admissions count the sagas holding slots: no other claim may admit meanwhile.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(crate::store::shared::admission::ADMISSION_LOCK)
                .execute(&mut *tx)
                .await
                .db()?;
            sqlx::query(&SWEEP)
                .bind(req.flows)
                .execute(&mut *tx)
                .await
                .db()?;
        }
        let text = if limited { &CLAIM_LIMITED } else { &CLAIM };
        let mut query = sqlx::query(text.as_str())
            .bind(req.owner)
            .bind(req.lease_ttl_ms)
            .bind(req.definitions)
            .bind(i64::from(req.limit));
        if limited {
            query = query.bind(req.flows);
        }
        let rows = query.fetch_all(&mut *tx).await.db()?;
        let mut epochs = Vec::with_capacity(rows.len());
        for row in &rows {
            let id_text: String = row.try_get("id").db()?;
            let id = Uuid::parse_str(&id_text).map_err(|e| corrupt(&id_text, e))?;
            epochs.push((id, row.try_get::<i64, _>("lease_epoch").db()?));
        }
        let ids: Vec<Uuid> = epochs.iter().map(|(id, _)| *id).collect();
        let conn: &mut sqlx::PgConnection = &mut tx;
        let loaded = Self::load_many(&mut *conn, &ids).await?;
        let mut claimed = Vec::with_capacity(loaded.len());
        for ((id, saga), (_, epoch)) in loaded.into_iter().zip(epochs) {
            match saga {
                Ok(saga) => claimed.push(Claimed {
                    lease: Lease {
                        saga_id: id,
                        owner: req.owner.to_owned(),
                        epoch,
                    },
                    saga,
                }),
                Err(StoreError::Corrupt { detail, .. }) => {
                    tracing::error!(saga.id = %id, %detail, "corrupt saga row parked; needs attention");
                    sqlx::query(
                        "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL, next_run_at = NULL, \
                         needs_attention = TRUE, updated_at = saga_now_ms() WHERE id = $1::uuid",
                    )
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await.db()?;
                    let data = serde_json::json!({"detail": detail});
                    insert_event(&mut tx, &id.to_string(), "saga.corrupt", None, &data).await?;
                }
                Err(e) => return Err(e),
            }
        }
        self.commit(tx).await?;
        Ok(claimed)
    }

    async fn apply(&self, lease: &Lease, t: &Transition) -> Result<Applied> {
        // The batch statement itself notifies `saga_done` for an ended saga and `saga_due` for
        // one given back while still runnable (shutdown, a long backoff); PostgreSQL delivers
        // them when the transaction commits, so whoever hears one finds the change.
        self.queue.apply(lease.clone(), t.clone()).await
    }

    async fn due_now(&self, definitions: &[String]) -> Result<bool> {
        Ok(sqlx::query_scalar(
            // The earliest unleased due time, compared with now: a walk of the due-time
            // index that stops at the first unleased saga, however many wait on later timers
            // (a filter `next_run_at <= saga_now_ms()` is no index condition: the function is
            // volatile).
            "SELECT COALESCE((SELECT next_run_at <= saga_now_ms() FROM sagas \
             WHERE next_run_at IS NOT NULL AND gate = 0 AND lease_owner IS NULL AND definition_key = ANY($1) \
             ORDER BY next_run_at LIMIT 1), FALSE) \
             OR EXISTS (SELECT 1 FROM sagas WHERE gate = 1 AND flow IS NULL \
               AND next_run_at IS NOT NULL AND next_run_at <= saga_now_ms() \
               AND definition_key = ANY($1))",
        )
        .bind(definitions)
        .fetch_one(&self.pool)
        .await
        .db()?)
    }

    fn due_signal(&self) -> Option<Arc<Notify>> {
        self.ensure_listener();
        Some(self.due.clone())
    }

    fn finished_signal(&self) -> Option<tokio::sync::broadcast::Receiver<(Uuid, SagaStatus)>> {
        let rx = self.done.subscribe();
        self.ensure_listener();
        Some(rx)
    }

    fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed) + self.queue.commits()
    }

    async fn now(&self) -> Result<Millis> {
        Ok(sqlx::query_scalar("SELECT saga_now_ms()")
            .fetch_one(&self.pool)
            .await
            .db()?)
    }
}
