//! The durable step log behind one trait, [`Store`], with one implementation per backend.
//!
//! Every change to a saga made by the engine is one [`Transition`], applied in one database
//! transaction that first checks the saga's lease (owner and epoch, the fencing token): if another
//! worker has claimed the saga since, nothing is written and the caller gets
//! [`StoreError::LeaseLost`]. The events a transition carries are written in the same transaction,
//! so the event table doubles as a transactional outbox.
//!
//! A transition is a value, not a closure over a connection: the store coalesces the
//! transitions of many sagas into one commit (group commit) without the engine noticing, and
//! reports each one durable only once its transaction has committed.
//!
//! The code is laid out by role:
//!
//! - this module: the contract ([`Store`], [`Transition`] and the records it writes, [`Lease`]);
//!   [`idempotency`] and [`outbox`]: the contracts of keyed starts and of the outbox; `error`:
//!   [`StoreError`], refusals apart from the opaque [`BackendError`];
//! - `write_queue`: the group-commit queue every engine write goes through, and the batch
//!   writer each backend plugs into it;
//! - `shared`: everything written once for both databases (operator commands, reads, lease
//!   release, the key sweeper, parts of the outbox), over the small dialect of `shared::sql`;
//! - `sqlite`, `postgres`: only what differs (connection setup, the batch writer, claims and
//!   due scans, keyed starts, the outbox's commit-order reads);
//! - `rows`: decoding rows of either database; `rules`: the checks of operator commands.

pub mod bulk;
mod error;
mod fence;
pub mod flow;
pub mod idempotency;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod migrations;
pub mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
mod prefix;
pub(crate) mod rows;
pub mod schedules;
mod shared;
pub mod signals;
#[cfg(feature = "sqlite")]
mod sqlite;
mod stores;
pub mod tasks;
pub mod triggers;
mod url;
mod write_queue;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use crate::model::{
    Attempt, Event, ListFilter, Millis, PhaseRecord, Saga, SagaPage, SagaStatus, StepKind,
};
pub use bulk::{Audit, BulkClaim, BulkLog, BulkTicket, NewBulkJob};
pub(crate) use error::SqlxResultExt;
pub use error::{BackendError, BackendErrorKind, StoreError};
pub use flow::{FlowLog, TokenGrant};
pub use idempotency::{Callback, IdempotencyKey, IdempotencyStore, IdempotentStart, SavedResponse};
pub use outbox::{Delivery, DeliveryState, OutboxStore};
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
pub use prefix::{match_prefix, PrefixMatch, CANDIDATES_SHOWN};
pub use schedules::{ScheduleAdvance, ScheduleCursor, ScheduleLog};
pub use signals::{ReceivedSignal, SignalOutcome, SignalRequest};
#[cfg(feature = "sqlite")]
pub use sqlite::{engine_lock_file, sqlite_file, SqliteDurability, SqliteStore};
pub use stores::{open_full, Stores};
pub use tasks::{TaskAnswer, TaskOutcome, TaskRef, TaskReport};
pub use triggers::TriggerLog;
pub use url::redact_url;

/// A saga to create.
#[derive(Debug, Clone)]
pub struct NewSaga {
    /// Its id (a UUIDv7).
    pub id: Uuid,
    /// Definition name.
    pub name: String,
    /// Definition version.
    pub version: u32,
    /// Definition step-list hash.
    pub definition_hash: String,
    /// The input, already checked against the definition's input type.
    pub input: Value,
    /// The steps: name and kind, in order.
    pub steps: Vec<(String, StepKind)>,
    /// Whether the create also records the write-ahead of the first action (saga `RUNNING`,
    /// step 0's action `RUNNING` with attempt 1 started under the new lease), saving the
    /// commit the driver would make for it. Only for a saga created leased to a worker that
    /// makes that call at once; a saga created without a lease ignores it and starts `QUEUED`.
    pub first_attempt: bool,
    /// For a scheduled start (`Saga-Start-At`): when the saga becomes due. It is created
    /// `QUEUED` and unleased, with this as its `scheduled_at`; `None` makes it due now.
    pub start_at: Option<Millis>,
    /// The W3C `traceparent` the saga's trace joins (a client's, a parent saga's), if any.
    pub traceparent: Option<String>,
    /// Its priority and the flow control it waits for ([`NewFlow`]).
    pub flow: NewFlow,
    /// Its search attributes (name, value), written with it; empty, allocating nothing, for a
    /// definition that declares none.
    pub attrs: Vec<(String, String)>,
}

/// A new saga's place in flow control (SPEC §14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFlow {
    /// 0 (last) to 9 (first); 5 by default.
    pub priority: u8,
    /// Whether it waits to be admitted by a claim in priority order (and, for a definition
    /// with limits, within them) rather than being due as soon as its time comes.
    pub gated: bool,
    /// The definition whose concurrency limits count it (its name), if it has any.
    pub flow: Option<String>,
    /// Its key for the definition's per-key limit.
    pub key: Option<String>,
}

impl Default for NewFlow {
    fn default() -> Self {
        Self {
            priority: DEFAULT_PRIORITY,
            gated: false,
            flow: None,
            key: None,
        }
    }
}

pub use crate::model::DEFAULT_PRIORITY;

/// A fork to record ([`OperatorLog::fork`]).
#[derive(Debug, Clone)]
pub struct NewFork<'a> {
    /// The saga forked.
    pub original: Uuid,
    /// The new saga: of the latest version of the original's definition, with its input
    /// checked.
    pub new: NewSaga,
    /// The stage the new saga starts at, taking over the original's effects before it; `None`
    /// for a fresh fork, which takes nothing over and leaves the original as it is.
    pub from_stage: Option<&'a str>,
    /// Who and why, for the audit (and the bulk job the fork is part of, if any).
    pub audit: Audit<'a>,
}

impl NewSaga {
    /// A new saga of `def` with `input` (not checked here) and a fresh UUIDv7.
    pub fn of(def: &saga_dsl::SagaDefinition, input: Value) -> Self {
        Self {
            id: Uuid::now_v7(),
            name: def.name().to_owned(),
            version: def.version(),
            definition_hash: def.hash().to_owned(),
            input,
            steps: def
                .steps()
                .iter()
                .map(|s| (s.name().to_owned(), s.kind()))
                .collect(),
            first_attempt: false,
            start_at: None,
            traceparent: None,
            flow: NewFlow::default(),
            attrs: Vec::new(),
        }
    }

    /// [`Self::of`] with the search attributes `def` computes from `input`; why not, if a
    /// value cannot be computed or is too long.
    pub fn with_attrs(
        def: &saga_dsl::SagaDefinition,
        input: Value,
    ) -> Result<Self, saga_dsl::AttrError> {
        let attrs = def.attrs_of(&input)?;
        let mut new = Self::of(def, input);
        new.attrs = attrs;
        Ok(new)
    }

    /// Whether its create records the first action's write-ahead, created leased or not.
    pub(crate) fn starts_first_action(&self, leased: bool) -> bool {
        self.first_attempt && leased && !self.steps.is_empty()
    }

    /// The status it is created with, leased or not: `RUNNING` if the create records its first
    /// action's write-ahead ([`Self::starts_first_action`]), else `QUEUED`.
    pub(crate) fn initial_status(&self, leased: bool) -> SagaStatus {
        if self.starts_first_action(leased) {
            SagaStatus::Running
        } else {
            SagaStatus::Queued
        }
    }

    /// Whether starting its first action passes the point of no return (the first step is a
    /// pivot or retriable).
    pub(crate) fn first_is_point_of_no_return(&self) -> bool {
        self.steps
            .first()
            .is_some_and(|(_, kind)| matches!(kind, StepKind::Pivot | StepKind::Retriable))
    }
}

/// The right to write to one saga: owner and epoch must both still match in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The saga.
    pub saga_id: Uuid,
    /// The worker holding it.
    pub owner: String,
    /// The fencing token: bumped by every claim and by operator commands that take a saga over.
    pub epoch: i64,
}

/// The lease a saga is created with, so the process that starts it can drive it without a
/// claim: the worker it goes to and how long it lasts without a heartbeat. What is asked for,
/// not the fencing token the store grants in return ([`Lease`], which adds the saga and its
/// epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The worker to hold it (its id, also the lease owner).
    pub owner: String,
    /// How long the lease lasts without a heartbeat, in milliseconds.
    pub ttl_ms: i64,
}

impl LeaseRequest {
    /// A lease for `owner` lasting `ttl_ms` without a heartbeat.
    pub fn new(owner: impl Into<String>, ttl_ms: i64) -> Self {
        Self {
            owner: owner.into(),
            ttl_ms,
        }
    }
}

/// A saga claimed by a worker, with its lease.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The lease to present with every write.
    pub lease: Lease,
    /// The saga as it was when claimed.
    pub saga: Saga,
}

/// What a worker asks for when it claims work.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The worker id.
    pub owner: &'a str,
    /// Claim at most this many sagas.
    pub limit: u32,
    /// How long the lease lasts without a heartbeat.
    pub lease_ttl_ms: i64,
    /// Only sagas whose `name@version#hash` is in this list.
    pub definitions: &'a [String],
    /// The names of the definitions with concurrency limits among them: their waiting sagas
    /// are admitted within their limits (SPEC §14). Empty for an engine without any, whose
    /// claim then reads no limit.
    pub flows: &'a [String],
}

/// Which half of a step a change is about.
pub use saga_dsl::Phase;

/// A change to one step's action or compensation.
#[derive(Debug, Clone)]
pub struct StepUpdate {
    /// The step index.
    pub index: u32,
    /// Action or compensation.
    pub phase: Phase,
    /// The new state of that phase.
    pub record: PhaseRecord,
    /// For a succeeded action: its output.
    pub output: Option<Value>,
    /// For an action: a sleep's wake time, written as given, `None` included.
    pub wake_at: Option<Millis>,
    /// For an action: the signal the step waits for, written as given, `None` included.
    pub waiting_for: Option<String>,
    /// For an action: when a signal wait gives up, written as given, `None` included.
    pub timeout_at: Option<Millis>,
    /// When a branch of a parallel group is tried again (its action or its compensation),
    /// written as given, `None` included.
    pub retry_at: Option<Millis>,
}

/// A row of a branch of a parallel group, added to a running saga when its group starts.
#[derive(Debug, Clone)]
pub struct NewStep {
    /// Its position: after every row the saga has.
    pub index: u32,
    /// `group/branch`.
    pub name: String,
    /// The index of the group's row.
    pub stage_index: u32,
    /// The branch's name within its group.
    pub branch: String,
    /// The branch's kind (compensatable or retriable).
    pub kind: StepKind,
}

/// A change to the attempt log.
#[derive(Debug, Clone)]
pub enum AttemptChange {
    /// An attempt is about to run (the write-ahead record).
    Start {
        /// Step index.
        step_index: u32,
        /// Phase.
        phase: Phase,
        /// Attempt number.
        attempt: u32,
        /// Its place among the saga's attempts, from 1: the order they started in, which
        /// their start times (milliseconds, often equal) cannot always tell.
        seq: u32,
    },
    /// An attempt ended.
    Finish {
        /// Step index.
        step_index: u32,
        /// Phase.
        phase: Phase,
        /// Attempt number.
        attempt: u32,
        /// `succeeded`, `failed`, `retryable`, `timed_out`, `interrupted`.
        outcome: &'static str,
        /// The error, if any.
        error: Option<String>,
    },
}

/// An event to append to a saga's history (and the outbox).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// `saga.started`, `step.succeeded`, …
    pub kind: &'static str,
    /// The step it is about.
    pub step: Option<String>,
    /// Details.
    pub data: Value,
}

impl NewEvent {
    /// An event about the saga as a whole.
    pub fn saga(kind: &'static str, data: Value) -> Self {
        Self {
            kind,
            step: None,
            data,
        }
    }

    /// An event about one step.
    pub fn step(kind: &'static str, step: &str, data: Value) -> Self {
        Self {
            kind,
            step: Some(step.to_owned()),
            data,
        }
    }
}

/// The saga-level fields a transition sets (the engine always knows all of them).
#[derive(Debug, Clone, PartialEq)]
pub struct SagaUpdate {
    /// Status.
    pub status: SagaStatus,
    /// Next due time; `None` when terminal.
    pub next_run_at: Option<Millis>,
    /// Error text.
    pub error: Option<String>,
    /// Output, set on completion (left as stored when `None`).
    pub output: Option<Value>,
    /// Needs-attention flag.
    pub needs_attention: bool,
    /// The point of no return has started.
    pub pivot_started: bool,
    /// For a saga given back `PAUSED`: the status a resume gives it back; `None` otherwise.
    pub paused_from: Option<SagaStatus>,
}

/// One atomic change of a saga by the engine.
#[derive(Debug, Clone)]
pub struct Transition {
    /// The saga row.
    pub saga: SagaUpdate,
    /// Rows of branches of a parallel group that starts, inserted `PENDING` before `steps`
    /// apply (which may write the first branches ahead in the same transition).
    pub new_steps: Vec<NewStep>,
    /// Step rows that changed (a result and the next write-ahead may share one transition).
    pub steps: Vec<StepUpdate>,
    /// Attempt-log changes.
    pub attempts: Vec<AttemptChange>,
    /// Events.
    pub events: Vec<NewEvent>,
    /// Refuse the write if a cancel was requested (used when starting a new action, so that a
    /// cancel and the start of the pivot are ordered by the database).
    pub unless_cancelled: bool,
    /// Refuse the write if a pause was requested (used when starting a call or giving a saga
    /// that has not ended back, so that its driver gives it back `PAUSED` instead).
    pub unless_paused: bool,
    /// Give the lease up in the same write (terminal, or waiting on a long retry timer).
    pub release: bool,
    /// Another saga to make due in the same write, unless it has ended: the parent of a child
    /// saga that ends here.
    pub wake: Option<Uuid>,
}

/// How [`Store::apply`](crate::store::EngineLog::apply) went when the lease still held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Written and committed.
    Written,
    /// Not written: `unless_cancelled` was set and a cancel had been requested.
    CancelRequested,
    /// Not written: `unless_paused` was set and an operator asked for a pause; the request's
    /// audit data (`{"actor", "reason"}`, as JSON text).
    PauseRequested(String),
}

/// Where a purge has got to: the finished status it walks and the last id it saw. Start
/// from `PurgeCursor::default()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeCursor {
    pub(crate) status: usize,
    pub(crate) after: Option<Uuid>,
}

/// What one page of a purge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgePage {
    /// The sagas deleted (or, in a dry run, that would be).
    pub purged: Vec<Uuid>,
    /// Where the next page starts; `None` when the walk is over.
    pub next: Option<PurgeCursor>,
}

/// The answer to a cancel request (a rule of the model, which the store applies).
pub use crate::model::rules::CancelOutcome;

/// An orchestrator process, as recorded in the workers table.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// The worker id (also the lease owner).
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// The definition keys (`name@version#hash`) this worker can run.
    pub definitions: Vec<String>,
}

/// Shorthand for store results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The durable step log, by role: its reads ([`LogReads`]), the engine's fenced writes
/// ([`EngineLog`]), the commands from outside ([`OperatorLog`]), its upkeep ([`Maintenance`]),
/// and the idempotency keys and the outbox kept in the same database ([`IdempotencyStore`],
/// [`OutboxStore`]), so that one `Arc<dyn Store>` reaches them all and a start can record its
/// key in the saga's own transaction. Implemented once for every backend (`store::shared`);
/// a caller imports the roles it uses.
pub trait Store:
    LogReads
    + EngineLog
    + OperatorLog
    + BulkLog
    + FlowLog
    + ScheduleLog
    + Maintenance
    + IdempotencyStore
    + OutboxStore
    + TriggerLog
{
}

impl<T> Store for T where
    T: LogReads
        + EngineLog
        + OperatorLog
        + BulkLog
        + FlowLog
        + ScheduleLog
        + Maintenance
        + IdempotencyStore
        + OutboxStore
        + TriggerLog
{
}

/// Reads of the log: sagas, their pages and counts, events, attempts, signals and workers, each
/// from one consistent snapshot.
#[async_trait]
pub trait LogReads: Send + Sync + 'static {
    /// Reads one saga with its steps.
    async fn get_saga(&self, id: Uuid) -> Result<Option<Saga>>;

    /// Only the status of a saga (one key lookup: what a caller waiting for a result polls).
    async fn saga_status(&self, id: Uuid) -> Result<Option<SagaStatus>> {
        Ok(self.get_saga(id).await?.map(|s| s.status))
    }

    /// A page of sagas, newest first.
    async fn list_sagas(&self, filter: &ListFilter) -> Result<SagaPage>;

    /// The ids of up to `limit` sagas whose id starts with `prefix`, in id order: a range scan
    /// of the primary key between [`IdPrefix::low`](crate::model::IdPrefix::low) and
    /// [`IdPrefix::high`](crate::model::IdPrefix::high). Lets people type the start of an id.
    async fn saga_ids_with_prefix(
        &self,
        prefix: &crate::model::IdPrefix,
        limit: u32,
    ) -> Result<Vec<Uuid>>;

    /// How many sagas wait without a worker, by what they wait for.
    async fn waiting(&self) -> Result<crate::model::WaitingCounts>;

    /// How many sagas the log holds in each status (every status, 0 for those with none).
    async fn count_by_status(&self) -> Result<Vec<(crate::model::SagaStatus, u64)>>;

    /// How many sagas need attention, and how many unfinished ones are blocked (no running
    /// process has their definition): each counted on an index, never the whole log.
    async fn count_flagged(&self) -> Result<(u64, u64)>;

    /// How many unfinished sagas (queued, running or compensating) each definition key
    /// (`name@version#hash`, [`definition_key`](crate::model::definition_key)) has, counted on
    /// the `sagas_status` index: what a process compares with the definitions it registers,
    /// to say which sagas it cannot drive.
    async fn unfinished_by_definition(&self) -> Result<Vec<UnfinishedOf>>;

    /// A saga's event history, oldest first.
    async fn events(&self, id: Uuid) -> Result<Vec<Event>>;

    /// A saga's attempt log, in the order attempts started.
    async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>>;

    /// The signal `name` of saga `id`, if it has come.
    async fn received_signal(&self, id: Uuid, name: &str) -> Result<Option<ReceivedSignal>>;

    /// What a participant reported for `task` by callback, if it has.
    async fn reported_task(&self, task: &TaskRef) -> Result<Option<TaskOutcome>>;

    /// The orchestrator processes recorded in this database, newest first, with the number of
    /// leases each holds.
    async fn workers(&self) -> Result<Vec<crate::model::Worker>>;

    /// The database clock, in milliseconds since the epoch. Leases and due times use it so that
    /// skewed worker clocks cannot break them.
    async fn now(&self) -> Result<Millis>;
}

/// The engine's side of the log: workers and their leases, creating and claiming sagas, and the
/// fenced writes of a saga's transitions (every one checked against its lease), with the
/// wake-ups that tell the engine what became due.
#[async_trait]
pub trait EngineLog: Send + Sync + 'static {
    /// Prepares this process to run the engine as `worker`: registers it, and on an embedded
    /// database makes sure no other process runs an engine on the same file.
    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()>;

    /// Records a heartbeat and extends every lease `worker` holds.
    async fn heartbeat(&self, worker: &str, lease_ttl_ms: i64) -> Result<()>;

    /// Releases every lease `worker` holds and marks it stopped (graceful shutdown).
    async fn deregister_worker(&self, worker: &str) -> Result<()>;

    /// Creates a saga in status `QUEUED`, due now, with all its steps pending and a
    /// `saga.started` event, in one transaction.
    async fn create_saga(&self, new: NewSaga) -> Result<Saga>;

    /// Creates a saga already leased as `lease` asks (epoch 1), so the process that starts it
    /// can drive it at once without a claim; otherwise as [`Store::create_saga`](crate::store::EngineLog::create_saga), except that
    /// with [`NewSaga::first_attempt`] it is created `RUNNING`, its first action written ahead.
    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed>;

    /// Claims up to `limit` due sagas whose definition is known, bumping each one's lease epoch.
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>>;

    /// Applies one transition if `lease` still holds.
    async fn apply(&self, lease: &Lease, transition: &Transition) -> Result<Applied>;

    /// Gives a lease up without changing the saga (its driver could not finish writing): the
    /// saga becomes claimable at once, and whoever claims it resumes from the log.
    /// [`StoreError::LeaseLost`] if the lease was not held any more.
    async fn release_lease(&self, lease: &Lease) -> Result<()>;

    /// Flags due sagas whose definition is not in `definitions` as blocked (with an event, once)
    /// and returns how many were newly flagged.
    async fn mark_blocked(&self, definitions: &[String]) -> Result<u64>;

    /// The earliest due time of an unleased, runnable saga with a known definition.
    async fn next_due(&self, definitions: &[String]) -> Result<Option<Millis>>;

    /// Whether an unleased saga with a known definition is due now. Cheaper than
    /// [`Store::next_due`](crate::store::EngineLog::next_due) on a large log: it reads only the sagas due by now, not every
    /// waiting one until a match.
    async fn due_now(&self, definitions: &[String]) -> Result<bool>;

    /// Creates `child`, the child saga of the stage `stage` of the saga `lease` is for, with
    /// its steps and a `saga.started` event (and `child.started` on the parent), only while
    /// `lease` holds ([`StoreError::LeaseLost`] otherwise). A child of that id already there
    /// is left alone. Returns whether this call created it.
    async fn start_child(&self, lease: &Lease, stage: &str, child: &NewSaga) -> Result<bool>;

    /// Parks saga `id`, given back (no lease) due at `written` while it waits for its child
    /// `child`, last seen in `seen`, to end: due now if the child has ended in another status
    /// since, else only when something happens to it (the child's end makes it due). Changes
    /// nothing if the saga's due time is no longer `written` or it is leased. Returns whether
    /// it made the saga due now.
    async fn park_child_wait(
        &self,
        id: Uuid,
        child: Uuid,
        seen: SagaStatus,
        written: Millis,
    ) -> Result<bool>;

    /// Parks saga `id`, given back (no lease) due at `written` while a step of it waits for the
    /// signal `name`: due now if that signal has come, else at `deadline` (`None`: only when
    /// something happens to it). Changes nothing if the saga's due time is no longer `written`
    /// or it is leased (a signal, a cancel or a claim came first). Returns whether it made the
    /// saga due now.
    async fn park_signal_wait(
        &self,
        id: Uuid,
        name: &str,
        written: Millis,
        deadline: Option<Millis>,
    ) -> Result<bool>;

    /// Parks a saga given back (no lease) due at `written` while its step waits for `task`'s
    /// callback: due now if the participant has reported, else at `deadline`. Changes nothing
    /// if the saga's due time is no longer `written` or it is leased. Returns whether it made
    /// the saga due now.
    async fn park_task_wait(
        &self,
        task: &TaskRef,
        written: Millis,
        deadline: Millis,
    ) -> Result<bool>;

    /// Closes the wait for `task`'s callback as `closing` ([`TaskOutcome::Expired`] or
    /// [`TaskOutcome::Abandoned`]) unless its participant reported first, and returns the
    /// outcome that stands: a report that comes later is refused.
    async fn close_task(&self, task: &TaskRef, closing: &TaskOutcome) -> Result<TaskOutcome>;

    /// The key task tokens are signed with, made once per log by the first process that asks.
    async fn task_key(&self) -> Result<Vec<u8>>;

    /// A signal raised when another process makes a saga due (a new saga, a released lease), so
    /// the engine need not wait for its next poll. `None` when the backend has no such channel
    /// (the embedded store has a single engine, woken in-process).
    fn due_signal(&self) -> Option<std::sync::Arc<tokio::sync::Notify>> {
        None
    }

    /// A channel announcing sagas that reached a terminal status in any process sharing the
    /// database, so a caller waiting for a result (`Prefer: wait`, the benchmark) need not poll.
    /// `None` when the backend has none (then only sagas ended in this process wake waiters).
    fn finished_signal(&self) -> Option<tokio::sync::broadcast::Receiver<(Uuid, SagaStatus)>> {
        None
    }

    /// How many write transactions this store has committed since it was opened (for
    /// benchmarks: commits per saga is the figure that bounds throughput).
    fn commits(&self) -> u64 {
        0
    }
}

/// The commands from outside that change a saga, each in one transaction that checks its rule
/// ([`crate::model::rules`]) again, takes the saga over where it must (its epoch bumped) and
/// records its audit event.
#[async_trait]
pub trait OperatorLog: Send + Sync + 'static {
    /// Requests cancellation; the first request's event records `audit`.
    async fn request_cancel(&self, id: Uuid, audit: &Audit<'_>) -> Result<CancelOutcome>;

    /// Stops driving a saga without compensating (operator command, audited; `audit` carries
    /// the reason).
    async fn abort(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga>;

    /// Pauses a saga (operator command, audited): at once if no worker holds it, else as a
    /// request its worker applies once its call in flight is recorded
    /// ([`crate::model::rules::plan_pause`]).
    async fn pause(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga>;

    /// Resumes a `PAUSED` saga, or withdraws a pause not yet applied (operator command,
    /// audited); a step whose retries ran out gets a fresh budget
    /// ([`crate::model::rules::plan_resume`]).
    async fn resume(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga>;

    /// Makes a waiting retry happen now; on a `FAILED` saga, retries the failed step.
    async fn retry_now(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga>;

    /// Records that an operator did a stuck compensation by hand (audited).
    async fn mark_compensated(
        &self,
        id: Uuid,
        step: &str,
        reason: &str,
        actor: &str,
    ) -> Result<Saga>;

    /// Turns the completed saga `child` to `COMPENSATING` because its parent `parent` goes
    /// back. Returns the child's status after the call: unchanged if it had not completed;
    /// [`StoreError::Conflict`] if it passed its point of no return.
    async fn compensate_child(&self, child: Uuid, parent: Uuid) -> Result<SagaStatus>;

    /// Records `output` as the result of step `step` done by hand (operator command,
    /// audited): the action `SUCCEEDED` with it, the saga due now going forward. Refused as
    /// [`crate::model::rules::check_complete_step`] says, asked inside the transaction.
    async fn complete_step(
        &self,
        id: Uuid,
        step: &str,
        output: &Value,
        audit: &Audit<'_>,
    ) -> Result<Saga>;

    /// Creates the fork `fork.new` of `fork.original` in one transaction (operator command,
    /// audited): with a `from_stage`, the new saga takes over the original's rows before it,
    /// and the original becomes `ABORTED` with `superseded_by`. Refused as
    /// [`crate::model::rules::check_fork`] says, asked inside the transaction. Returns the new
    /// saga.
    async fn fork(&self, fork: &NewFork<'_>) -> Result<Saga>;

    /// Records a signal for a saga (the first of a name wins), with a `signal.received`
    /// event, and makes the saga due if a step of it waits for that signal.
    /// [`StoreError::NotFound`] for an unknown saga.
    async fn send_signal(&self, request: SignalRequest<'_>) -> Result<SignalOutcome>;

    /// Records what a participant reported by callback for the attempt `task` names (its
    /// token was checked by the caller): the first completion or failure of the step's current
    /// attempt, with a `task.completed` or `task.failed` event, making the saga due if it is
    /// parked on the wait; a heartbeat moves the wait's deadline.
    async fn report_task(&self, task: &TaskRef, report: &TaskReport) -> Result<TaskAnswer>;
}

/// Keeping the log: its migrations, and deleting finished sagas past a retention.
#[async_trait]
pub trait Maintenance: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;

    /// One page of a purge (see [`crate::retention`]): from `cursor`, up to `limit` finished
    /// sagas whose last change is before `before`, deleted with their steps, attempts, events,
    /// signals, callbacks, deliveries and keys in one short transaction, each checked again
    /// inside it; with `dry_run`, only found. With `attrs`, only the sagas with every one of
    /// these search attributes, as a list selects them. [`PurgePage::next`] is where the next
    /// page starts, `None` once every finished status was walked.
    async fn purge_page(
        &self,
        before: Millis,
        cursor: PurgeCursor,
        limit: u32,
        dry_run: bool,
        attrs: &[(String, String)],
    ) -> Result<PurgePage>;

    /// Deletes the refusals of NATS triggers recorded before `before`, in one statement on
    /// their time index, and says how many went (with `dry_run`, how many would).
    async fn purge_trigger_refusals(&self, before: Millis, dry_run: bool) -> Result<u64>;
}

/// The unfinished sagas of one definition key: see [`LogReads::unfinished_by_definition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfinishedOf {
    /// The definition's name.
    pub name: String,
    /// Its version.
    pub version: u32,
    /// The hash of the step list the sagas were started with.
    pub hash: String,
    /// How many of them are queued, running or compensating.
    pub sagas: u64,
}

/// Opens the store a URL names: `sqlite://PATH` (created if missing) or `postgres://…`. A
/// database whose store this build leaves out (a Cargo feature) is
/// [`StoreError::NotBuilt`], which names the feature.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        #[cfg(feature = "sqlite")]
        return Ok(std::sync::Arc::new(SqliteStore::open(url).await?));
        #[cfg(not(feature = "sqlite"))]
        return Err(StoreError::NotBuilt {
            url: redact_url(url),
            feature: "sqlite",
        });
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return Ok(std::sync::Arc::new(PgStore::open(url).await?));
        #[cfg(not(feature = "postgres"))]
        return Err(StoreError::NotBuilt {
            url: redact_url(url),
            feature: "postgres",
        });
    }
    Err(StoreError::UnsupportedUrl(redact_url(url)))
}
