//! The engine: claims due sagas, drives each one through its steps, and writes every transition
//! to the step log before acting on it.
//!
//! One [`Engine`] runs in each orchestrator process. Its loop claims up to `workers` due sagas at
//! a time (each claim takes a lease and bumps the saga's epoch), hands each to a driver task, and
//! sleeps until the next saga is due, a new saga is started in this process, or a driver frees a
//! slot. A heartbeat task extends the leases the process holds. On shutdown it stops claiming,
//! lets every driver finish the call in flight and record its result, and releases the leases.
//!
//! The per-saga logic lives in `driver`; the rules that decide what comes next are pure
//! functions, tested without a database: [`plan`] picks the next call or wait from the saga's
//! record, `stages` decides a stage's turn as a `decision::Decision`, and `effects` applies it
//! (the record, the events, the writes, the waits and children).

mod calls;
mod decision;
mod driver;
mod effects;
mod hook;
pub mod plan;
mod rates;
mod reports;
mod stages;
mod start;
mod waiters;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use saga_dsl::Registry;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

// Read by the HTTP API's `/metrics`.
#[cfg(feature = "server")]
pub(crate) use calls::CALL_OUTCOMES;
pub use hook::{CallFuture, CallHook, CallSite};
pub use start::{
    canonical_json, fingerprint, PendingAnswer, StartKey, StartOutcome, StartRequest, Started,
};

use crate::clock::{Clock, SystemClock};
use crate::model::{definition_key, Millis, Saga, SagaStatus};
use crate::store::{ClaimRequest, Claimed, LeaseRequest, Store, StoreError, WorkerInfo};

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How many sagas this process drives at once. As many more started in this process may
    /// wait for a free worker here, already leased to it (so nobody claims them meanwhile);
    /// a start beyond both is left to the claim of whichever process is free first.
    pub workers: usize,
    /// How long a lease lasts without a heartbeat; another process takes a saga over after it.
    pub lease_ttl: Duration,
    /// How often to look for due sagas when nothing wakes the engine sooner (sagas started by
    /// other processes, operator commands).
    pub poll_interval: Duration,
    /// After this many failed attempts of a compensation the saga is flagged *needs attention*
    /// (it keeps retrying).
    pub needs_attention_after: u32,
    /// A retry due sooner than this is waited for in the driver, holding the lease; a longer one
    /// releases the saga and frees the worker.
    pub hold_backoff_below: Duration,
    /// This process's worker id (also the lease owner).
    pub worker_id: String,
    /// Where the spans of sagas and their attempts go (see [`crate::telemetry`]); disabled by
    /// default.
    pub telemetry: crate::telemetry::Telemetry,
    /// Wraps every call of an action or compensation (a test kit's scripted outcomes); `None`
    /// runs them as they are.
    pub call_hook: Option<Arc<dyn CallHook>>,
    /// Where participants reach this log's API, for the task URLs of calls completed by
    /// callback (`{task_url}/v1/tasks/{token}`): the server's public address.
    pub task_url: String,
}

impl EngineConfig {
    /// The lease's time to live in milliseconds, as leases and due times count it.
    pub fn lease_ttl_ms(&self) -> crate::model::Millis {
        i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX / 4)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            workers: 32,
            lease_ttl: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            needs_attention_after: 5,
            hold_backoff_below: Duration::from_millis(250),
            worker_id: default_worker_id(),
            telemetry: crate::telemetry::Telemetry::disabled(),
            call_hook: None,
            task_url: "http://127.0.0.1:8080".to_owned(),
        }
    }
}

/// `host:pid:random`, unique per process start.
pub fn default_worker_id() -> String {
    format!(
        "{}:{}:{}",
        hostname(),
        std::process::id(),
        &Uuid::new_v4().simple().to_string()[..8]
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Why a saga could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No definition with this name is registered.
    #[error("no saga definition named {0:?} is registered")]
    UnknownDefinition(String),
    /// The input does not fit the definition's input type.
    #[error("input does not fit saga {name}: {message}")]
    InvalidInput {
        /// The saga name.
        name: String,
        /// What serde said.
        message: String,
    },
    /// The idempotency key's first request has not answered yet: retry shortly.
    #[error("a request with this idempotency key (saga {saga_id}) is still in progress")]
    KeyInProgress {
        /// The saga that request started.
        saga_id: Uuid,
    },
    /// The idempotency key was used before for a different request (another saga name,
    /// callback or input).
    #[error("this idempotency key was already used (saga {saga_id}) for a different request")]
    KeyReused {
        /// The saga the first request started.
        saga_id: Uuid,
    },
    /// A scheduled start (`Saga-Start-At`) names an instant already past.
    #[error("the start time {} is in the past (it is {} now)", crate::model::rfc3339(*at), crate::model::rfc3339(*now))]
    StartInPast {
        /// The instant asked for, in milliseconds since the epoch.
        at: Millis,
        /// The engine's clock when the start was refused.
        now: Millis,
    },
    /// A priority above 9 (`Saga-Priority` is one digit, 0 to 9).
    #[error("priority {0} is out of range: 0 (last) to 9 (first)")]
    InvalidPriority(u8),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why the engine stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The store failed at start or shutdown.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// [`Engine::run`] was called while this engine already runs (it runs once at a time).
    #[error("this engine is already running")]
    AlreadyRunning,
    /// A definition cannot run with the others registered (a child stage names a saga that
    /// is not registered, or one it could not undo).
    #[error(transparent)]
    Definition(#[from] saga_dsl::DefinitionError),
}

/// A worker slot of this process taken for a saga about to be created: see
/// [`Engine::reserve_slot`].
#[derive(Debug)]
struct StartSlot {
    permit: SlotPermit,
    lease: LeaseRequest,
}

/// What a start holds: a worker slot, or a place in the line for the next one.
#[derive(Debug)]
enum SlotPermit {
    /// A free worker: the saga is driven at once.
    Worker(tokio::sync::OwnedSemaphorePermit),
    /// Every worker is busy: the saga waits, leased, for the next to free (ahead of claims,
    /// which take only slots nobody waits for).
    Queued(tokio::sync::OwnedSemaphorePermit),
}

impl StartSlot {
    /// The lease to create the saga with: this process's worker, for the engine's lease TTL.
    fn lease(&self) -> &LeaseRequest {
        &self.lease
    }

    /// Whether the saga is driven the moment it is created (a free worker, not a place in
    /// line): its create may then record its first action's write-ahead too
    /// ([`NewSaga::first_attempt`](crate::store::NewSaga::first_attempt)), and the saga starts `RUNNING`.
    fn runs_at_once(&self) -> bool {
        matches!(self.permit, SlotPermit::Worker(_))
    }
}

/// Whether due sagas wait for a free worker slot, as far as the run loop knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backlog {
    /// None known.
    None,
    /// The last claim filled every free slot: more are likely due.
    Seen,
    /// A wake-up found no free slot to claim with: some may be due.
    Suspected,
}

/// A saga started and leased in this process, with the worker slot it occupies or waits for.
type Direct = (Claimed, SlotPermit);

/// Whether a saga fresh from its create had its first action written ahead by it: such a saga
/// is created `RUNNING`, any other `QUEUED`.
fn written_ahead(created: &Saga) -> bool {
    created.status == SagaStatus::Running
}

/// How often an engine with limited definitions looks for room to admit their waiting sagas
/// when nothing else wakes it.
const ADMISSION_POLL: Duration = Duration::from_millis(200);

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: EngineConfig,
    pub(crate) clock: Arc<dyn Clock>,
    definitions: Vec<String>,
    /// The names of the definitions with concurrency limits: their sagas wait to be admitted
    /// by a claim, which polls for room at least every [`ADMISSION_POLL`].
    flows: Vec<String>,
    wake: Notify,
    /// One permit per worker slot: held by every driver, whether its saga was claimed or
    /// started here directly.
    slots: Arc<tokio::sync::Semaphore>,
    /// One permit per place in the line of sagas started here while every worker was busy.
    queued: Arc<tokio::sync::Semaphore>,
    /// Sagas started in this process and already leased to it, handed to the run loop.
    direct: tokio::sync::mpsc::UnboundedSender<Direct>,
    direct_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Direct>>>,
    /// Whether `run` is accepting work.
    running: std::sync::atomic::AtomicBool,
    /// In-process waiters for sagas to end (see [`Engine::wait_terminal`]), and the sagas
    /// this process drives.
    pub(crate) waiters: waiters::Waiters,
    /// Set once the task relaying other processes' "saga ended" announcements runs.
    finished_dispatch: std::sync::OnceLock<()>,
    /// Whether this process is registered as a worker (holds the engine lock on SQLite).
    registered: std::sync::atomic::AtomicBool,
    /// Serialises registering and deregistering.
    registering: tokio::sync::Mutex<()>,
    /// The log's task key, read once when a saga with a call completed by callback first runs.
    task_key: tokio::sync::OnceCell<Arc<[u8]>>,
    /// Drivers holding a saga for a moment while its call waits for its callback.
    pub(crate) reports: reports::Reports,
}

impl Inner {
    /// The log's task key, read (or made) once.
    pub(crate) async fn task_key(&self) -> Result<Arc<[u8]>, StoreError> {
        self.task_key
            .get_or_try_init(|| async { self.store.task_key().await.map(Arc::from) })
            .await
            .cloned()
    }

    /// Tells in-process waiters that a saga reached a terminal status.
    pub(crate) fn notify_terminal(&self, id: Uuid, status: SagaStatus) {
        self.waiters.ended(id, status);
    }
}

/// The saga engine of one process. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("worker_id", &self.inner.config.worker_id)
            .field("definitions", &self.inner.definitions)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine over `store` that can run the sagas of `registry`.
    pub fn new(store: Arc<dyn Store>, registry: Arc<Registry>, config: EngineConfig) -> Self {
        Self::with_clock(store, registry, config, Arc::new(SystemClock))
    }

    /// Like [`Engine::new`] with an explicit clock.
    pub fn with_clock(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        config: EngineConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (direct_tx, direct_rx) = tokio::sync::mpsc::unbounded_channel();
        let workers = config.workers.max(1);
        let definitions = registry
            .iter()
            .map(|d| definition_key(d.name(), d.version(), d.hash()))
            .collect();
        let mut flows: Vec<String> = registry
            .iter()
            .filter(|d| d.flow().limits_running())
            .map(|d| d.name().to_owned())
            .collect();
        flows.dedup();
        Self {
            inner: Arc::new(Inner {
                store,
                registry,
                config,
                clock,
                definitions,
                flows,
                wake: Notify::new(),
                slots: Arc::new(tokio::sync::Semaphore::new(workers)),
                queued: Arc::new(tokio::sync::Semaphore::new(workers)),
                direct: direct_tx,
                direct_rx: Mutex::new(Some(direct_rx)),
                running: std::sync::atomic::AtomicBool::new(false),
                waiters: waiters::Waiters::default(),
                finished_dispatch: std::sync::OnceLock::new(),
                registered: std::sync::atomic::AtomicBool::new(false),
                task_key: tokio::sync::OnceCell::new(),
                reports: reports::Reports::default(),
                registering: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The step log.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The clock it runs on (virtual in tests).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The definitions this engine can run.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    /// The log's task key, which signs the tokens of calls completed by callback.
    pub(crate) async fn task_key(&self) -> Result<Arc<[u8]>, StoreError> {
        self.inner.task_key().await
    }

    /// A participant's report for a call of saga `saga` was recorded: its driver, if one of
    /// this process holds the saga waiting for it, goes on at once.
    pub(crate) fn task_reported(&self, saga: Uuid) {
        self.inner.reports.reported(saga);
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Takes a worker slot of this process for a saga about to be created, if the engine runs
    /// and has one free, or a place in the line for the next (see [`EngineConfig::workers`]):
    /// the saga is created leased with [`StartSlot::lease`], then handed to a driver. Dropping
    /// the slot unused frees it.
    fn reserve_slot(&self) -> Option<StartSlot> {
        let inner = &self.inner;
        if !inner.running.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let permit = match inner.slots.clone().try_acquire_owned() {
            Ok(permit) => SlotPermit::Worker(permit),
            // Busy: wait in line here rather than leave the saga to a claim (a write and a
            // read more, and under steady load a start that misses makes the next one miss:
            // each slot that frees goes to the claimed saga, and its lane's next start misses).
            Err(_) => SlotPermit::Queued(inner.queued.clone().try_acquire_owned().ok()?),
        };
        Some(StartSlot {
            permit,
            lease: LeaseRequest::new(inner.config.worker_id.clone(), inner.config.lease_ttl_ms()),
        })
    }

    /// Gives a saga leased in `slot` to the run loop's drivers.
    fn hand_over(&self, claimed: Claimed, slot: StartSlot) {
        let id = claimed.saga.id;
        // Marked before the driver starts: a caller waiting for it from now on is told.
        self.inner.waiters.driving(id);
        if self.inner.direct.send((claimed, slot.permit)).is_err() {
            self.inner.waiters.released(id);
            // The run loop has stopped: the saga stays leased to this worker until
            // deregistration (or, after a crash, a restart) frees it.
            tracing::warn!(saga.id = %id, "engine stopped; saga left for the next start");
        }
    }

    /// Tells the engine that a saga became due outside [`Engine::start`] (an idempotent start
    /// written by the HTTP layer, say), so it looks now rather than at its next poll.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// Waits until the saga reaches a terminal status, for at most `timeout`; returns the status,
    /// or `None` on timeout. Sagas driven by this process, and on PostgreSQL by any process (its
    /// `saga_done` notification), end the wait at once; otherwise the saga's status is read
    /// again every `poll_interval`.
    pub async fn wait_terminal(
        &self,
        id: Uuid,
        timeout: Duration,
    ) -> Result<Option<SagaStatus>, StoreError> {
        let result = self.wait_terminal_inner(id, timeout).await;
        // Drop the waiters this call left behind (their receivers are gone), so a saga that
        // ends in another process, or never, leaves nothing in the map.
        self.inner.waiters.prune(id);
        result
    }

    async fn wait_terminal_inner(
        &self,
        id: Uuid,
        timeout: Duration,
    ) -> Result<Option<SagaStatus>, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Sagas driven by other processes announce their end through the store, if it can.
        self.ensure_finished_dispatch();
        // A saga driven here needs no read: its driver tells the waiters when it ends, or
        // wakes them to read if it stops short of an end. The timer's wake-ups always read.
        let mut timer_fired = false;
        loop {
            let (rx, driven_here) = self.inner.waiters.register(id);
            // Registered first, read second: a saga ending in between still wakes us.
            if !driven_here || timer_fired {
                match self.inner.store.saga_status(id).await? {
                    None => return Err(StoreError::NotFound(id)),
                    Some(status) if status.is_terminal() => return Ok(Some(status)),
                    Some(_) => {}
                }
            }
            let poll = tokio::time::Instant::now() + self.inner.config.poll_interval;
            tokio::select! {
                got = rx => match got {
                    Ok(status) => return Ok(Some(status)),
                    Err(_) => timer_fired = false,
                },
                _ = tokio::time::sleep_until(poll.min(deadline)) => timer_fired = true,
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Starts, once, the task that hands the store's "saga ended" announcements (sagas driven by
    /// other processes) to this process's waiters: one listener for all of them, rather than
    /// every waiter reading every announcement.
    fn ensure_finished_dispatch(&self) {
        self.inner.finished_dispatch.get_or_init(|| {
            let Some(mut ended) = self.inner.store.finished_signal() else {
                return;
            };
            let inner = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match ended.recv().await {
                        Ok((id, status)) => match inner.upgrade() {
                            Some(inner) => inner.waiters.announced(id, status),
                            None => return,
                        },
                        // Missed announcements: their waiters find out at their next poll.
                        Err(RecvError::Lagged(missed)) => {
                            tracing::debug!(missed, "saga-ended announcements missed")
                        }
                        Err(RecvError::Closed) => return,
                    }
                }
            });
        });
    }

    /// Registers this process as a worker of the store, so that it may run the engine: on the
    /// embedded SQLite store this takes the file's engine lock, and fails with
    /// [`StoreError::InUse`] while another process holds it. [`Engine::run`] registers by
    /// itself; call this first to know that the engine can start before telling anyone it
    /// serves (a server that cannot run its sagas should not accept them). Registering twice
    /// is a no-op.
    pub async fn register(&self) -> Result<(), EngineError> {
        let inner = &self.inner;
        let _once = inner.registering.lock().await;
        if inner.registered.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        inner
            .store
            .register_worker(&WorkerInfo {
                id: inner.config.worker_id.clone(),
                host: hostname(),
                pid: std::process::id(),
                definitions: inner.definitions.clone(),
            })
            .await?;
        inner
            .registered
            .store(true, std::sync::atomic::Ordering::Release);
        self.warn_of_changed_step_lists().await;
        Ok(())
    }

    /// Warns, once at registration, of unfinished sagas started under one of this process's
    /// names and versions with another step list: no process that registers this list may
    /// drive them, so they stay blocked (rightly: their steps are not these), and without a
    /// word they would wait until someone looked. A failed read only loses the warning.
    async fn warn_of_changed_step_lists(&self) {
        let unfinished = match self.inner.store.unfinished_by_definition().await {
            Ok(unfinished) => unfinished,
            Err(e) => {
                tracing::debug!(error = %e, "cannot count unfinished sagas by definition");
                return;
            }
        };
        for def in self.inner.registry.iter() {
            for old in unfinished.iter().filter(|u| {
                u.name == def.name() && u.version == def.version() && u.hash != def.hash()
            }) {
                let short = |hash: &str| hash.chars().take(12).collect::<String>();
                tracing::warn!(
                    saga = def.name(),
                    version = def.version(),
                    "{} unfinished {} saga(s) of version {} were started with another step list \
                     (definition {}) than the one this process registers under the same name \
                     and version ({}): they stay blocked, since no process here can drive them. \
                     Give the changed step list a new version (register version {} beside the \
                     old steps as version {}), or restore the old steps",
                    old.sagas,
                    def.name(),
                    def.version(),
                    short(&old.hash),
                    short(def.hash()),
                    def.version() + 1,
                    def.version(),
                );
            }
        }
    }

    /// Gives up a registration made by [`Engine::register`] without running the engine (the
    /// server could not start after all): frees the engine lock and any lease. A no-op when
    /// not registered.
    pub async fn deregister(&self) -> Result<(), EngineError> {
        let inner = &self.inner;
        let _once = inner.registering.lock().await;
        if inner
            .registered
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            inner
                .store
                .deregister_worker(&inner.config.worker_id)
                .await?;
        }
        Ok(())
    }

    /// Runs the engine until `shutdown` is cancelled: registers this worker, claims and drives
    /// due sagas, then finishes the calls in flight and releases every lease.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), EngineError> {
        let inner = &self.inner;
        let cfg = &inner.config;
        inner.registry.check_children()?;
        // Every process writes the limits it knows; an operator's change is kept.
        let mut sagas: Vec<String> = inner.registry.iter().map(|d| d.name().to_owned()).collect();
        sagas.dedup();
        inner
            .store
            .declare_limits(&inner.registry.limits()?, &sagas)
            .await?;
        self.register().await?;
        tracing::info!(worker = %cfg.worker_id, workers = cfg.workers, "engine started");
        let heartbeat = tokio::spawn(heartbeat_loop(self.inner.clone(), shutdown.child_token()));
        let due_signal = inner.store.due_signal();
        let mut direct = inner
            .direct_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(EngineError::AlreadyRunning)?;
        inner
            .running
            .store(true, std::sync::atomic::Ordering::Release);
        let mut drivers = JoinSet::new();
        let mut last_blocked_check = None::<tokio::time::Instant>;
        // Whether due sagas may be waiting: at start, when woken, after a poll interval, and
        // when the last claim was cut short by a lack of free slots.
        let mut look = true;
        let mut backlog = Backlog::None;
        let mut look_at = tokio::time::Instant::now();
        while !shutdown.is_cancelled() {
            // Claim as many as there are free slots. The slots are not held while the claim
            // runs: a start made meanwhile takes a free one as usual (and writes its first
            // action ahead), and a claimed saga that finds its slot gone waits, leased, for
            // the next one to free.
            let free = if look {
                inner.slots.available_permits()
            } else {
                0
            };
            if look && free > 0 {
                match inner
                    .store
                    .claim(ClaimRequest {
                        owner: &cfg.worker_id,
                        limit: free as u32,
                        lease_ttl_ms: cfg.lease_ttl_ms(),
                        definitions: &inner.definitions,
                        flows: &inner.flows,
                    })
                    .await
                {
                    Ok(list) => {
                        backlog = if list.len() == free {
                            Backlog::Seen
                        } else {
                            Backlog::None
                        };
                        for c in list {
                            drivers.spawn(drive_claimed(
                                self.inner.clone(),
                                c,
                                shutdown.child_token(),
                            ));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "claiming sagas failed; will retry");
                    }
                }
            } else if look {
                backlog = Backlog::Suspected;
            }
            if last_blocked_check.is_none_or(|t| t.elapsed() >= cfg.poll_interval) {
                last_blocked_check = Some(tokio::time::Instant::now());
                match inner.store.mark_blocked(&inner.definitions).await {
                    Ok(0) => {}
                    Ok(n) => tracing::error!(
                        count = n,
                        "sagas are blocked: this process lacks their exact definition \
                         (name, version and step-list hash); they will not be touched"
                    ),
                    Err(e) => tracing::warn!(error = %e, "checking for blocked sagas failed"),
                }
            }
            if look {
                // The next look without a wake-up: at the poll interval, or sooner if a saga's
                // timer is due sooner. A deadline, not a sleep restarted on every turn of the
                // loop: drivers ending one after another must not put it off.
                let wait = if backlog == Backlog::None {
                    self.time_to_next_due().await
                } else {
                    cfg.poll_interval
                };
                // Room in a limit frees when a saga ends in any process, or an operator
                // raises it: a claim looks for it this often.
                let wait = if inner.flows.is_empty() {
                    wait
                } else {
                    wait.min(ADMISSION_POLL)
                };
                look_at = tokio::time::Instant::now() + wait;
            }
            look = false;
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = inner.wake.notified() => look = true,
                _ = async { match &due_signal { Some(s) => s.notified().await, None => std::future::pending().await } } => look = true,
                Some((c, permit)) = direct.recv() => {
                    drivers.spawn(drive_when_free(self.inner.clone(), c, permit, shutdown.child_token()));
                }
                Some(res) = drivers.join_next(), if !drivers.is_empty() => {
                    if let Err(e) = res {
                        tracing::error!(error = %e, "saga driver task failed");
                    }
                    // A slot freed: take more if sagas were left waiting for one. A claim that
                    // filled every slot says more are likely due; a wake-up that found no free
                    // slot says nothing, so look first (a read, cheaper than a claim that
                    // finds nothing).
                    look = match backlog {
                        Backlog::None => false,
                        Backlog::Seen => true,
                        Backlog::Suspected => self.due_now().await,
                    };
                    if !look {
                        // Nothing due: nothing waits for a slot until a wake-up says so.
                        backlog = Backlog::None;
                    }
                }
                _ = tokio::time::sleep_until(look_at) => look = true,
            }
        }
        inner
            .running
            .store(false, std::sync::atomic::Ordering::Release);
        // Sagas started directly while we were stopping: drive them like the others.
        while let Ok((c, permit)) = direct.try_recv() {
            drivers.spawn(drive_when_free(
                self.inner.clone(),
                c,
                permit,
                shutdown.child_token(),
            ));
        }
        tracing::info!(
            in_flight = drivers.len(),
            "engine stopping: finishing calls in flight"
        );
        while let Some(res) = drivers.join_next().await {
            if let Err(e) = res {
                tracing::error!(error = %e, "saga driver task failed");
            }
        }
        heartbeat.abort();
        self.deregister().await?;
        // A saga started directly in the last instant is released by the deregistration above
        // and claimable by anyone; the channel is kept for the next `run`.
        *inner.direct_rx.lock().unwrap_or_else(|p| p.into_inner()) = Some(direct);
        tracing::info!(worker = %cfg.worker_id, "engine stopped; leases released");
        Ok(())
    }

    /// Whether a saga nobody holds is due now (`true` if that cannot be read).
    async fn due_now(&self) -> bool {
        let inner = &self.inner;
        inner
            .store
            .due_now(&inner.definitions)
            .await
            .unwrap_or(true)
    }

    async fn time_to_next_due(&self) -> Duration {
        let inner = &self.inner;
        let poll = inner.config.poll_interval;
        match inner.store.next_due(&inner.definitions).await {
            Ok(Some(due)) => {
                let wait = due - inner.clock.now_ms();
                if wait <= 0 {
                    // Due now but not claimed: we have no free slot, or its lease has not
                    // expired yet. Check again soon rather than spin.
                    Duration::from_millis(20).min(poll)
                } else {
                    Duration::from_millis(wait as u64).min(poll)
                }
            }
            Ok(None) => poll,
            Err(e) => {
                tracing::warn!(error = %e, "reading the next due time failed");
                poll
            }
        }
    }
}

/// Drives a claimed saga in the next free worker slot: at once, unless a start took the slot
/// while the claim ran (the semaphore hands freed slots out in the order they were asked for).
async fn drive_claimed(inner: Arc<Inner>, claimed: Claimed, stop: CancellationToken) {
    // The semaphore is never closed.
    let Ok(slot) = inner.slots.clone().acquire_owned().await else {
        return;
    };
    driver::drive(inner, claimed, slot, stop, false).await;
}

/// Drives a saga started here: at once in its worker slot, or, if it holds a place in line,
/// once a slot frees (the semaphore hands freed slots to those waiting in the order they
/// asked, before any claim can take one). Its lease is kept meanwhile by the heartbeat.
async fn drive_when_free(
    inner: Arc<Inner>,
    claimed: Claimed,
    permit: SlotPermit,
    stop: CancellationToken,
) {
    // Only a saga created while a worker was free has its first action written ahead.
    let ahead = written_ahead(&claimed.saga);
    let slot = match permit {
        SlotPermit::Worker(slot) => slot,
        SlotPermit::Queued(place) => match inner.slots.clone().acquire_owned().await {
            Ok(slot) => {
                drop(place);
                slot
            }
            // The semaphore is never closed.
            Err(_) => return,
        },
    };
    driver::drive(inner, claimed, slot, stop, ahead).await;
}

async fn heartbeat_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let every = inner.config.lease_ttl / 3;
    let ttl = inner.config.lease_ttl_ms();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = inner.store.heartbeat(&inner.config.worker_id, ttl).await {
            tracing::warn!(error = %e, "heartbeat failed; leases may expire");
        }
    }
}
