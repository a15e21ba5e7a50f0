//! The records of the step log, as the engine, the HTTP API and the CLI see them.
//!
//! Times are integer milliseconds since the Unix epoch (UTC) everywhere inside; they become RFC 3339
//! text only at the edges (JSON, tables).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use uuid::Uuid;

/// Milliseconds since the Unix epoch, UTC.
pub type Millis = i64;

/// The priority of a saga started without one.
pub const DEFAULT_PRIORITY: u8 = 5;

fn default_priority() -> u8 {
    DEFAULT_PRIORITY
}

/// Formats milliseconds as RFC 3339 UTC with millisecond precision.
pub fn rfc3339(ms: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

fn ser_time<S: Serializer>(ms: &Millis, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*ms))
}

/// An optional time as RFC 3339 text, or `null`.
pub(crate) fn ser_opt_time<S: Serializer>(ms: &Option<Millis>, s: S) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => s.serialize_str(&rfc3339(*ms)),
        None => s.serialize_none(),
    }
}

/// Reads RFC 3339 text back into milliseconds (the inverse of [`rfc3339`]), so that a client of
/// the HTTP API can deserialize the records it serves.
fn parse_rfc3339<E: serde::de::Error>(text: &str) -> Result<Millis, E> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| E::custom(format!("invalid RFC 3339 time {text:?}: {e}")))
}

fn de_time<'de, D: Deserializer<'de>>(d: D) -> Result<Millis, D::Error> {
    parse_rfc3339(&String::deserialize(d)?)
}

fn de_opt_time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Millis>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|t| parse_rfc3339(&t))
        .transpose()
}

/// An optional time as RFC 3339 text or `null`, both ways: `#[serde(with = "opt_time")]`.
mod opt_time {
    pub(super) use super::{de_opt_time as deserialize, ser_opt_time as serialize};
}

/// Declares a string-backed enum with upper- or lower-case wire names.
macro_rules! wire_enum {
    // `$text` is a `tt`, not a `literal`: a `literal` fragment reaches derive macros wrapped in
    // an invisible group, which utoipa's `ToSchema` does not look into for `serde(rename)`.
    // A value may also be read from older texts (`| "OLD"`), never written as them.
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:tt $(| $old:tt)*),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text $(, alias = $old)*)] $variant),+
        }

        impl $name {
            /// The name stored in the log and used on the wire.
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }

            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text $(| $old)* => Ok(Self::$variant),)+
                    _ => Err(UnknownValue { kind: stringify!($name), value: s.to_owned() }),
                }
            }
        }
    };
}

mod bulk;
mod detail;
#[cfg(test)]
pub(crate) mod fixtures;
mod limits;
pub mod rules;
mod schedule;
mod shown;
mod stages;
pub mod task;
pub use bulk::{BulkAction, BulkJob, BulkJobPage, BulkRefusal, BulkStatus};
pub use detail::SagaDetail;
pub use limits::{DeclaredValue, LimitChange, LimitInfo, LimitKind};
pub use schedule::{
    NewScheduleRun, Overlap, RunOutcome, Schedule, ScheduleDetail, ScheduleRun, RUNS_KEPT,
};
pub(crate) use shown::wait_word;
pub(crate) use shown::RATE_WAIT;

/// What a `PAUSED` saga's `waiting_for` says: it waits for a person to resume it.
pub const PAUSED_WAIT: &str = "resume";
pub use stages::{stages_of, StageKind, StageRecord, WaitingCounts};

/// A stored or given text that names no known value (a corrupt row, a typo in `--status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct UnknownValue {
    /// What was being parsed.
    pub kind: &'static str,
    /// The text.
    pub value: String,
}

wire_enum!(
    /// Where a saga is in its life.
    SagaStatus {
        /// Created, not yet picked up by a worker.
        Queued = "QUEUED",
        /// Running actions forward.
        Running = "RUNNING",
        /// Running compensations backward.
        Compensating = "COMPENSATING",
        /// Stopped by an operator, or by a step whose retries ran out: nothing new starts,
        /// its timers do not fire and no lease is held until it is resumed.
        Paused = "PAUSED",
        /// Every action succeeded.
        Completed = "COMPLETED",
        /// An action failed or the saga was cancelled, and every needed compensation succeeded.
        Compensated = "COMPENSATED",
        /// A step after the pivot failed permanently; a person must `retry` or `abort`.
        Failed = "FAILED",
        /// An operator stopped the saga without compensating.
        Aborted = "ABORTED",
    }
);

impl SagaStatus {
    /// Whether the saga is over: nothing will drive it again on its own.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Compensated | Self::Failed | Self::Aborted
        )
    }
}

wire_enum!(
    /// The status of one step's action or compensation.
    StepStatus {
        /// Not started. For a compensation as shown ([`Saga::shown`]): it will run, the saga
        /// going back (or able to, being before its point of no return) and the step's action
        /// having taken effect, or possibly so.
        Pending = "PENDING",
        /// An attempt was logged as started and has not been logged as ended. After a crash this
        /// is the "outcome unknown" state: the call is made again with the same key.
        Running = "RUNNING",
        /// The last attempt failed and another is scheduled (the saga's `next_run_at`, or
        /// for a branch of a parallel group its own `retry_at`).
        Retrying = "RETRYING",
        /// Done.
        Succeeded = "SUCCEEDED",
        /// Failed definitively (a permanent error, or the retry budget spent on known failures).
        Failed = "FAILED",
        /// The last attempt's outcome is unknown and nothing will try again: the retry budget
        /// was spent on it (it timed out), or an operator took the saga or the step over while
        /// the attempt was in flight (its attempt is `abandoned`).
        Unknown = "UNKNOWN",
        /// An operator vouched that the compensation was done by hand (`mark-compensated`).
        Manual = "MANUAL",
        /// A compensation that will never run: the step has none (a pivot, a retriable step, a
        /// wait), or, as people and clients are shown a saga ([`Saga::shown`]), its action never
        /// took effect, the saga completed, was aborted or is past its point of no return. Logs
        /// written before this word stored `NONE` for the first case; it reads the same.
        NotNeeded = "NOT_NEEDED" | "NONE",
        /// The step's condition was false when the saga reached it: it never ran and is never
        /// compensated.
        Skipped = "SKIPPED",
        /// A sleep in progress (it ends at the step's `wake_at`), or a wait for a signal (until
        /// its `timeout_at`, if it has one).
        Waiting = "WAITING",
    }
);

/// The kind of a stage or branch, as the log stores it and the saga's `steps` show it: the
/// definition's own name ([`saga_dsl::StepKind`]), so the two cannot drift apart.
pub use saga_dsl::StepKind;

/// One half (action or compensation) of a step in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct PhaseRecord {
    /// Its status.
    pub status: StepStatus,
    /// Attempts made so far, including one interrupted by a crash.
    pub attempts: u32,
    /// The error of the latest failed attempt.
    pub last_error: Option<String>,
    /// Whether the latest attempt's outcome is unknown (it timed out, or the process died).
    pub outcome_unknown: bool,
    /// When the first attempt started.
    #[serde(with = "opt_time", default)]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub started_at: Option<Millis>,
    /// When it reached its current status.
    #[serde(with = "opt_time", default)]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub ended_at: Option<Millis>,
}

impl PhaseRecord {
    /// A phase that has not started.
    pub fn pending() -> Self {
        Self::with_status(StepStatus::Pending)
    }

    /// A phase with no attempts in the given status.
    pub fn with_status(status: StepStatus) -> Self {
        Self {
            status,
            attempts: 0,
            last_error: None,
            outcome_unknown: false,
            started_at: None,
            ended_at: None,
        }
    }
}

/// One step of a saga in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct StepRecord {
    /// Position, from 0.
    pub index: u32,
    /// Name: the stage's, or for a branch of a parallel group `group/branch` (the name its
    /// idempotency keys, attempts and events have always carried).
    pub name: String,
    /// For a branch of a parallel group: the index of its group's row (absent for stages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_index: Option<u32>,
    /// For a branch of a parallel group: the branch's name within its group (absent for
    /// stages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Kind.
    pub kind: StepKind,
    /// The action.
    #[serde(flatten)]
    pub action: PhaseRecord,
    /// The action's output, once it succeeded.
    pub output: Option<Value>,
    /// A sleep's wake time, once it started (absent for other steps).
    #[serde(with = "opt_time", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub wake_at: Option<Millis>,
    /// The signal a signal step waits for, once it started waiting (absent for other steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// When a signal step stops waiting, if it waits at most some time.
    #[serde(with = "opt_time", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub timeout_at: Option<Millis>,
    /// When a branch of a parallel group that waits to retry makes its next attempt (absent
    /// for other steps).
    #[serde(with = "opt_time", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub retry_at: Option<Millis>,
    /// The compensation (`NOT_NEEDED` for pivot and retriable steps).
    pub compensation: PhaseRecord,
    /// Attempts of the action made before its current retry budget: 0 until a resume gives
    /// a step whose retries ran out a fresh budget (the attempt numbers keep counting up).
    /// Internal; not part of the saga object of the API.
    #[serde(skip)]
    pub budget_attempts: u32,
    /// When the action's current retry budget began, if a resume began it (else the first
    /// attempt's start): the time limit of its policy counts from here. Internal.
    #[serde(skip)]
    pub budget_started_at: Option<Millis>,
    /// For a row a fork took over from the saga it was forked from: that saga, whose
    /// idempotency keys the row's calls use, so that its compensation undoes the original's
    /// effect with the original's key. `None` (the saga's own keys) for every other row. Not
    /// part of the saga object of the API: `forked_from` says it for the whole saga.
    #[serde(skip)]
    pub keys_saga_id: Option<Uuid>,
}

/// A saga as stored: the body of `GET /v1/sagas/{id}` and of `saga show ID --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Saga {
    /// Id (a UUIDv7, so ids sort by creation time).
    pub id: Uuid,
    /// Definition name.
    pub name: String,
    /// Definition version.
    pub version: u32,
    /// Hash of the definition's step list.
    pub definition_hash: String,
    /// Status.
    pub status: SagaStatus,
    /// A compensation keeps failing, or the saga is stuck in a way only a person can resolve.
    pub needs_attention: bool,
    /// No running process has this saga's exact definition.
    pub blocked: bool,
    /// A cancel was requested.
    pub cancel_requested: bool,
    /// An operator asked to pause the saga while a worker drove it: the call in flight
    /// finishes and is recorded, then the worker starts nothing new and gives it back
    /// `PAUSED`. False once it is `PAUSED`.
    #[serde(default)]
    pub pause_requested: bool,
    /// While `PAUSED`: the status a resume gives it back (`QUEUED`, `RUNNING` or
    /// `COMPENSATING`), so that it goes on in the direction it was going. Internal; not part
    /// of the saga object of the API.
    #[serde(skip)]
    pub paused_from: Option<SagaStatus>,
    /// The point of no return (the pivot, or the first retriable step) has started: its action
    /// was written ahead, so the saga can no longer be cancelled (the engine's meaning, kept in
    /// the log's `pivot_reached` column; not part of the saga object of the API).
    #[serde(skip)]
    pub pivot_started: bool,
    /// The point of no return *succeeded*: the saga can no longer go back. Computed when the
    /// saga is shown ([`Saga::shown`]); false in the engine's own copies.
    #[serde(default)]
    pub pivot_reached: bool,
    /// What the saga is parked on, while it waits without a worker: `signal:<name>`, `sleep`,
    /// `child:<id>`, `retry`, `limit:<name>` (a concurrency limit it waits for to start) or
    /// `rate:<name>` (a rate limiter's token its step waits for); `null` otherwise. Computed
    /// when the saga is shown ([`Saga::shown`]).
    #[serde(default)]
    pub waiting_for: Option<String>,
    /// Its priority, 0 (last) to 9 (first): among due sagas, higher ones are claimed first
    /// (`Saga-Priority`; 5 by default).
    #[serde(default = "default_priority")]
    #[cfg_attr(feature = "server", schema(maximum = 9))]
    pub priority: u8,
    /// The concurrency limit it waits for to start, as the log reads it (full now, or its
    /// definition's), while it waits to be admitted; shown as `waiting_for: "limit:<name>"`.
    #[serde(skip)]
    pub waiting_limit: Option<String>,
    /// When the wait ends on its own (a sleep's end, a signal's timeout, the next retry);
    /// `null` for a wait without a deadline. Computed with [`Saga::waiting_for`].
    #[serde(with = "opt_time", default)]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub wake_at: Option<Millis>,
    /// Its search attributes, by name, as its definition computed them from the input at
    /// start (`{}` when it declares none).
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(required = true))]
    pub attrs: BTreeMap<String, String>,
    /// The input.
    pub input: Value,
    /// On completion: every step's output, by step name.
    pub output: Option<Value>,
    /// Why the saga went backward or stopped.
    pub error: Option<String>,
    /// When the next attempt is due, while the saga waits on a retry timer.
    #[serde(with = "opt_time", default)]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub next_run_at: Option<Millis>,
    /// The worker currently holding the saga's lease.
    pub lease_owner: Option<String>,
    /// The lease's epoch (fencing token).
    pub lease_epoch: i64,
    /// When the lease runs out unless renewed, on the store's clock (as read from the log; not
    /// part of the saga object of the API). A lease past this time may be taken over.
    #[serde(skip)]
    pub lease_expires_at: Option<Millis>,
    /// Created.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub created_at: Millis,
    /// Last changed.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub updated_at: Millis,
    /// The saga that started this one as a child saga (`GET /v1/sagas/{parent_id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<Uuid>,
    /// The parent's stage that started this saga.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_stage: Option<String>,
    /// The saga this one was forked from, and the stage it took over the effects before
    /// (`null` for a fresh fork); absent for a saga that is no fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// The saga a fork made to take over this one's effects: this one was `ABORTED` by that
    /// fork, and every effect it made belongs to that saga now; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<Uuid>,
    /// When a saga started with `Saga-Start-At` was asked to start.
    #[serde(with = "opt_time", default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub scheduled_at: Option<Millis>,
    /// The W3C trace context the start carried (`traceparent`), or a child saga's parent's:
    /// the trace the saga's spans join. Without one the saga's trace is its own.
    #[serde(skip)]
    pub traceparent: Option<String>,
    /// The rows of the step log, in order: the stages, then the branches of parallel groups
    /// (named `group/branch`, with their group's row in `stage_index`).
    pub steps: Vec<StepRecord>,
    /// The stages as the definition lists them, each with its kind and status, groups with
    /// their branches, waits with their deadlines and child stages with their child's id.
    /// Computed from `steps` when the saga is read for a person or a client
    /// ([`Saga::with_stages`]); empty in the engine's own copies.
    #[serde(default)]
    pub stages: Vec<StageRecord>,
}

/// Where a forked saga comes from: the saga it was forked from, and the stage it starts at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ForkedFrom {
    /// The original saga (`GET /v1/sagas/{saga_id}`).
    pub saga_id: Uuid,
    /// The stage the fork starts at: the stages before it were taken over from the original
    /// with their outputs, and are not run again. `null` for a fresh fork, which runs every
    /// stage with keys of its own.
    pub stage: Option<String>,
}

impl StepRecord {
    /// The attempt of the action that waits for its participant's callback (SPEC §16), if it
    /// does.
    pub fn awaited_task(&self) -> Option<u32> {
        (self.action.status == StepStatus::Waiting
            && self.waiting_for.as_deref() == Some(task::TASK_WAIT))
        .then_some(self.action.attempts)
    }

    /// The number of the next attempt of the action within its current budget, and when the
    /// budget began (`None` before any attempt).
    pub fn budget(&self) -> (u32, Option<Millis>) {
        (
            self.action.attempts.saturating_sub(self.budget_attempts),
            self.budget_started_at.or(self.action.started_at),
        )
    }

    /// When the wait of this step ends: a sleep's wake time, a signal wait's timeout, or when a
    /// branch of a parallel group is retried (each in a field of its own; a row has at most
    /// one of them).
    pub fn wait_until(&self) -> Option<Millis> {
        self.wake_at.or(self.timeout_at).or(self.retry_at)
    }

    /// For a branch of a parallel group: the group's name and the branch's. Read from the
    /// row's branch field; the group's name is the part of the row's name before it
    /// (`group/branch`, written so when the row was created).
    pub fn branch_of(&self) -> Option<(&str, &str)> {
        let branch = self.branch.as_deref()?;
        // Cut at a known length rather than compare the name's end: the planner asks this of
        // rows at every turn.
        let cut = self.name.len().checked_sub(branch.len() + 1)?;
        (self.name.as_bytes().get(cut) == Some(&b'/')).then(|| (&self.name[..cut], branch))
    }
}

impl Saga {
    /// The definition key `name@version#hash` the engine matches against its registry.
    pub fn definition_key(&self) -> String {
        definition_key(&self.name, self.version, &self.definition_hash)
    }
}

/// `name@version#hash`: what a process must have registered to drive a saga.
pub fn definition_key(name: &str, version: u32, hash: &str) -> String {
    format!("{name}@{version}#{hash}")
}

/// A row of `saga list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct SagaSummary {
    /// Id.
    pub id: Uuid,
    /// Definition name.
    pub name: String,
    /// Definition version.
    pub version: u32,
    /// Status.
    pub status: SagaStatus,
    /// See [`Saga::needs_attention`].
    pub needs_attention: bool,
    /// See [`Saga::blocked`].
    pub blocked: bool,
    /// See [`Saga::error`].
    pub error: Option<String>,
    /// See [`Saga::waiting_for`].
    #[serde(default)]
    pub waiting_for: Option<String>,
    /// See [`Saga::wake_at`].
    #[serde(with = "opt_time", default)]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub wake_at: Option<Millis>,
    /// See [`Saga::attrs`].
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(required = true))]
    pub attrs: BTreeMap<String, String>,
    /// Created.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub created_at: Millis,
    /// Last changed.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub updated_at: Millis,
}

/// Filters and page of `list`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Only sagas in this status.
    pub status: Option<SagaStatus>,
    /// Only sagas of this definition name.
    pub name: Option<String>,
    /// Only sagas flagged as needing attention.
    pub needs_attention: bool,
    /// Only unfinished sagas whose definition no running process has.
    pub blocked: bool,
    /// Only sagas created at or after this time.
    pub created_after: Option<Millis>,
    /// Only sagas created before this time.
    pub created_before: Option<Millis>,
    /// Only sagas whose id starts so.
    pub id_prefix: Option<IdPrefix>,
    /// Only these sagas (a bulk action over sagas picked one by one); empty: no condition.
    pub ids: Vec<Uuid>,
    /// Only sagas with every one of these search attributes (name, value), each equal;
    /// empty: no condition.
    pub attrs: Vec<(String, String)>,
    /// Page size (the store caps it).
    pub limit: u32,
    /// Start after this id (keyset pagination, newest first).
    pub cursor: Option<Uuid>,
}

/// A page of sagas, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct SagaPage {
    /// The sagas.
    pub sagas: Vec<SagaSummary>,
    /// Pass as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<Uuid>,
}

/// One entry of a saga's event history (also the transactional outbox).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Event {
    /// Position in the saga's history, from 1.
    pub seq: i64,
    /// Globally unique, increasing id (for deduplication by consumers).
    pub id: i64,
    /// When.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub at: Millis,
    /// `saga.started`, `step.succeeded`, `step.compensated`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The step the event is about, if any.
    pub step: Option<String>,
    /// Details.
    pub data: Value,
}

/// One attempt of an action or compensation, as kept in the attempt log.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Attempt {
    /// Step index.
    pub step_index: u32,
    /// Step name.
    pub step: String,
    /// `action` or `compensation`.
    pub phase: String,
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The worker that made it.
    pub worker: String,
    /// The lease epoch it was made under.
    pub lease_epoch: i64,
    /// Started.
    #[serde(serialize_with = "ser_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub started_at: Millis,
    /// Ended (`None` while running, or forever if its process died).
    #[serde(serialize_with = "ser_opt_time")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub ended_at: Option<Millis>,
    /// `succeeded`, `failed`, `retryable`, `timed_out`, `interrupted`, `abandoned` (an
    /// operator's abort or mark-compensated took it over in flight), or `None` while running.
    pub outcome: Option<String>,
    /// The error, if it failed.
    pub error: Option<String>,
}

/// Whether a step's compensation still has to run: the step is compensatable, its action
/// succeeded or may have had an effect (its outcome is unknown), and its compensation has not
/// succeeded or been done by hand.
pub fn needs_compensation(step: &StepRecord) -> bool {
    let started = match step.kind {
        StepKind::Compensatable => step.action.outcome_unknown,
        // A child stage waiting for its child may have started it.
        StepKind::Child => step.action.status == StepStatus::Waiting,
        _ => return false,
    };
    (step.action.status == StepStatus::Succeeded
        || (started && step.action.status != StepStatus::Pending))
        && !matches!(
            step.compensation.status,
            StepStatus::Succeeded | StepStatus::Manual
        )
}

/// An orchestrator process, as recorded in the workers table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worker {
    /// Worker id (also the lease owner): `host:pid:random`.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: i64,
    /// Started.
    #[serde(serialize_with = "ser_time")]
    pub started_at: Millis,
    /// Last heartbeat.
    #[serde(serialize_with = "ser_time")]
    pub heartbeat_at: Millis,
    /// When it stopped gracefully (or was found dead by a successor on the embedded store).
    #[serde(serialize_with = "ser_opt_time")]
    pub stopped_at: Option<Millis>,
    /// Leases it holds now.
    pub leases: i64,
}

/// A step of a definition as discovery shows it: its name and kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Stage {
    /// The step's name.
    pub name: String,
    /// Its kind, as in the saga object's steps.
    pub kind: StepKind,
}

/// A saga definition as `GET /v1/definitions` and `saga definitions` show it: what a client
/// can start, with which steps, and what input it takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Definition {
    /// The name, as in `POST /v1/sagas/{name}`.
    #[cfg_attr(feature = "server", schema(example = "place_order"))]
    pub name: String,
    /// The version; a start uses the highest one of its name.
    pub version: u32,
    /// The hash of the step list, recorded with every saga started on this version.
    pub hash: String,
    /// The steps, in order.
    pub stages: Vec<Stage>,
    /// The input as JSON Schema (draft 2020-12, nested types under `$defs`); `true` when the
    /// definition takes any JSON.
    pub input_schema: Value,
    /// The names of its search attributes, which a list filters by (`attr.<name>=…`).
    #[serde(default)]
    pub attrs: Vec<String>,
}

impl Definition {
    /// The discovery view of `def`.
    pub fn of(def: &saga_dsl::SagaDefinition) -> Self {
        Self {
            name: def.name().to_owned(),
            version: def.version(),
            hash: def.hash().to_owned(),
            stages: def
                .steps()
                .iter()
                .map(|s| Stage {
                    name: s.name().to_owned(),
                    kind: s.kind(),
                })
                .collect(),
            input_schema: def.input_schema().as_value().clone(),
            attrs: def.attr_names().map(str::to_owned).collect(),
        }
    }

    /// The fields the input must have: the `required` list of its schema's root object (none
    /// for an input that is not an object, or takes any JSON).
    pub fn required_fields(&self) -> Vec<&str> {
        self.input_schema
            .get("required")
            .and_then(Value::as_array)
            .map(|fields| fields.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }
}

/// The body of `GET /v1/definitions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct DefinitionList {
    /// Every registered version of every definition, by name, then version.
    pub definitions: Vec<Definition>,
}

impl DefinitionList {
    /// Every definition of `registry`, in its order (name, then version).
    pub fn of(registry: &saga_dsl::Registry) -> Self {
        Self {
            definitions: registry.iter().map(|d| Definition::of(d)).collect(),
        }
    }
}

/// The start of a saga id, as people type it (`01a233a9`, `01a233a9-765f`): at least
/// [`IdPrefix::MIN_LEN`] hexadecimal digits, dashes anywhere ignored, any case.
///
/// Every id with this prefix lies between [`IdPrefix::low`] and [`IdPrefix::high`] (the prefix
/// padded with `0`s and with `f`s), so a store finds them with a range scan of its primary key:
/// an id's text sorts like its hexadecimal digits, dashes being at fixed places.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPrefix {
    /// The digits, lower case, without dashes.
    hex: String,
}

/// Why text is not an [`IdPrefix`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdPrefixError {
    /// Fewer digits than [`IdPrefix::MIN_LEN`]: such a prefix matches too much to be safe.
    #[error("saga id prefix {0:?} is too short: give at least 8 characters of the id")]
    TooShort(String),
    /// A character that is neither a hexadecimal digit nor a dash, or more than 32 digits.
    #[error("invalid saga id {0:?}: expected a UUID such as 0193a4f2-7c1e-7b3a-9d2e-5f6a7b8c9d0e, or its first 8 or more characters")]
    Invalid(String),
}

impl IdPrefix {
    /// The fewest digits accepted.
    pub const MIN_LEN: usize = 8;

    /// Reads a prefix; surrounding white space is ignored.
    pub fn parse(text: &str) -> Result<Self, IdPrefixError> {
        let trimmed = text.trim();
        let hex: String = trimmed
            .chars()
            .filter(|c| *c != '-')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if hex.len() > 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(IdPrefixError::Invalid(trimmed.to_owned()));
        }
        if hex.len() < Self::MIN_LEN {
            return Err(IdPrefixError::TooShort(trimmed.to_owned()));
        }
        Ok(Self { hex })
    }

    /// The prefix as typed, normalised: lower case, no dashes.
    pub fn as_str(&self) -> &str {
        &self.hex
    }

    /// The prefix as the start of an id in its hyphenated form (`01a233a9-765f`), the form
    /// the HTTP API takes in its paths.
    pub fn hyphenated(&self) -> String {
        let mut text = String::with_capacity(36);
        for (i, c) in self.hex.chars().enumerate() {
            if matches!(i, 8 | 12 | 16 | 20) {
                text.push('-');
            }
            text.push(c);
        }
        text
    }

    /// The smallest id with this prefix.
    pub fn low(&self) -> Uuid {
        self.padded('0')
    }

    /// The largest id with this prefix.
    pub fn high(&self) -> Uuid {
        self.padded('f')
    }

    fn padded(&self, fill: char) -> Uuid {
        let mut full = self.hex.clone();
        full.extend(std::iter::repeat_n(fill, 32 - self.hex.len()));
        // Thirty-two hexadecimal digits always parse.
        Uuid::try_parse(&full).unwrap_or_default()
    }
}

#[cfg(test)]
mod id_prefix_tests {
    use super::*;

    #[test]
    fn a_prefix_is_written_back_hyphenated() {
        for (typed, hyphenated) in [
            ("01A233A9", "01a233a9"),
            ("01a233a9765f7", "01a233a9-765f-7"),
            (
                "01a233a9765f71da882706dc00558ba1",
                "01a233a9-765f-71da-8827-06dc00558ba1",
            ),
        ] {
            assert_eq!(
                IdPrefix::parse(typed).map(|p| p.hyphenated()),
                Ok(hyphenated.to_owned())
            );
        }
    }

    #[test]
    fn prefixes_are_checked_and_bound_their_ids() {
        let id = Uuid::parse_str("01a233a9-765f-71da-8827-06dc00558ba1").unwrap_or_default();
        for text in [
            "01a233a9",
            "01A233A9-765",
            " 01a233a9-765f-71da-8827-06dc00558ba1 ",
        ] {
            let p = IdPrefix::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(p.low() <= id && id <= p.high(), "{text}");
            assert!(p.low().to_string() <= id.to_string(), "text sorts too");
            assert!(id.to_string() <= p.high().to_string());
        }
        let p = IdPrefix::parse("01a233a9-7").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.low().to_string(), "01a233a9-7000-0000-0000-000000000000");
        assert_eq!(p.high().to_string(), "01a233a9-7fff-ffff-ffff-ffffffffffff");
        assert!(matches!(
            IdPrefix::parse("01a233a"),
            Err(IdPrefixError::TooShort(_))
        ));
        assert!(matches!(
            IdPrefix::parse("01a2-33a"),
            Err(IdPrefixError::TooShort(_))
        ));
        assert!(matches!(
            IdPrefix::parse("not-a-uuid"),
            Err(IdPrefixError::Invalid(_))
        ));
        assert!(matches!(
            IdPrefix::parse(&format!("{id}0")),
            Err(IdPrefixError::Invalid(_))
        ));
    }
}
