//! The use cases that change a saga from outside the engine: cancel, abort, retry,
//! mark-compensated, pause, resume, signal, complete-step, fork and bulk. The HTTP API, the CLI
//! through a server and the CLI straight on
//! the database all call these, so each command's rules, its audit (actor and reason), its
//! events and its span are written once.
//!
//! The rules that must hold at the moment of the change (a saga not finished, a step still
//! needing compensation) are checked again by the store inside the write transaction that
//! makes it; the checks here come first so that a refusal says what would be accepted.

mod abort;
pub mod bulk;
mod cancel;
mod complete_step;
mod fork;
pub mod limits;
mod mark_compensated;
mod pause;
mod reason;
mod resume;
mod retry;
mod signal;
mod task;

use saga_dsl::Registry;
use uuid::Uuid;

use crate::engine::{Engine, StartError};
use crate::model::rules::Refusal;
use crate::model::Saga;
use crate::store::{Audit, BulkTicket, Store, StoreError};
use crate::telemetry::Telemetry;

pub use cancel::Cancelled;
pub use complete_step::MAX_OUTPUT;
pub use fork::{ForkRequest, Forked};
pub use reason::{Reason, MAX_REASON};
pub use retry::Retried;
pub use task::Report;

/// Why a command was refused. The saga is left as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperationError {
    /// The command itself is malformed (a blank reason).
    #[error("{0}")]
    BadRequest(String),
    /// The command names something the saga does not have (a step, a signal).
    #[error("{0}")]
    NotFound(String),
    /// The saga's state does not allow the command now.
    #[error("{0}")]
    Conflict(String),
    /// The command is well-formed but does not fit what it names: a fork from a stage the
    /// saga's definition does not have, or whose earlier stages differ; an output over the
    /// limit.
    #[error("{0}")]
    Invalid(String),
    /// The command needs the saga definitions, which only a server running them has (a fork
    /// on a bare database).
    #[error("{0}")]
    NeedsServer(String),
    /// A new saga was refused as a start refuses it (its input does not fit the definition).
    #[error(transparent)]
    Start(#[from] StartError),
    /// The store refused or failed (no such saga, a lost race, the database).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OperationError {
    /// The error's code, as the HTTP API answers it (`bad_request`, `not_found`, `conflict`,
    /// …): what a bulk job records for a saga that refused its command.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::NotFound(_) | Self::Store(StoreError::NotFound(_)) => "not_found",
            Self::Store(StoreError::UnknownStep { .. }) => "not_found",
            Self::Store(StoreError::UnknownLimit(_)) => "unknown_limit",
            Self::Conflict(_) | Self::Store(StoreError::Conflict(_)) => "conflict",
            Self::Store(StoreError::InvalidValue(_)) => "bad_request",
            Self::Invalid(_) => "unprocessable",
            Self::Start(StartError::UnknownDefinition(_)) => "not_found",
            Self::Start(StartError::InvalidInput { .. }) => "invalid_input",
            Self::Start(StartError::KeyInProgress { .. }) => "request_in_progress",
            Self::Start(StartError::KeyReused { .. }) => "idempotency_key_reused",
            Self::Start(StartError::StartInPast { .. }) => "start_in_past",
            Self::Start(StartError::InvalidPriority(_)) => "invalid_priority",
            Self::NeedsServer(_) | Self::Start(_) | Self::Store(_) => "internal",
        }
    }
}

/// The result of a command.
pub type Result<T> = std::result::Result<T, OperationError>;

/// The commands, over one store. Cheap to make: it borrows what it uses.
#[derive(Clone, Copy)]
pub struct Operations<'a> {
    store: &'a dyn Store,
    registry: Option<&'a Registry>,
    telemetry: Option<&'a Telemetry>,
    /// The bulk job the commands are part of: its ticket, actor and reason.
    bulk: Option<(BulkTicket, &'a str, &'a str)>,
    /// The engine whose sagas these are, when a server runs the commands: a fork's new saga
    /// goes to it like any start.
    engine: Option<&'a Engine>,
}

impl<'a> Operations<'a> {
    /// The commands over `store`, as a process without the saga definitions runs them (the
    /// `saga` CLI on a database): no definition is asked, and no span is exported.
    pub fn new(store: &'a dyn Store) -> Self {
        Self {
            store,
            registry: None,
            telemetry: None,
            bulk: None,
            engine: None,
        }
    }

    /// The commands as a server runs them: its definitions say which signals a saga waits
    /// for, and its exporter (if any) receives the spans of sagas the commands end.
    pub fn with_definitions(mut self, registry: &'a Registry, telemetry: &'a Telemetry) -> Self {
        self.registry = Some(registry);
        self.telemetry = Some(telemetry);
        self
    }

    /// The commands as `engine`'s server runs them, with its definitions and exporter.
    pub fn of(engine: &'a Engine) -> Self {
        Self {
            engine: Some(engine),
            ..Self::new(engine.store().as_ref())
                .with_definitions(engine.registry(), &engine.config().telemetry)
        }
    }

    /// The commands as the worker of a bulk job runs them: each settles the job's item for its
    /// saga in its own transaction (see [`crate::store::bulk`]), and its audit event carries
    /// the job's id as `bulk_id`, with the job's `actor` and `reason`.
    pub fn in_bulk_job(mut self, ticket: BulkTicket, actor: &'a str, reason: &'a str) -> Self {
        self.bulk = Some((ticket, actor, reason));
        self
    }

    /// The audit of a command: the actor and reason given, else the bulk job's, and the job.
    fn audit(&self, actor: Option<&'a str>, reason: Option<&'a str>) -> Audit<'a> {
        let (ticket, job_actor, job_reason) = match self.bulk {
            Some((ticket, actor, reason)) => (Some(ticket), Some(actor), Some(reason)),
            None => (None, None, None),
        };
        Audit {
            actor: actor.or(job_actor),
            reason: reason.or(job_reason),
            bulk: ticket,
        }
    }

    /// The saga `id`, or `NotFound`.
    async fn load(&self, id: Uuid) -> Result<Saga> {
        self.store
            .get_saga(id)
            .await?
            .ok_or(OperationError::Store(StoreError::NotFound(id)))
    }
}

/// A command on step `step` of `saga` refused by its rule: an unknown step is `NotFound`,
/// naming the saga's steps; any other refusal a `Conflict`.
fn step_refused(saga: &Saga, step: &str, refusal: Refusal) -> OperationError {
    match refusal {
        Refusal::UnknownStep { .. } => {
            let names: Vec<&str> = saga.steps.iter().map(|s| s.name.as_str()).collect();
            OperationError::NotFound(format!(
                "saga {} has no step {} (its steps: {})",
                saga.id,
                quote(step),
                names.join(", ")
            ))
        }
        refusal => OperationError::Conflict(refusal.to_string()),
    }
}

/// The longest piece of client-supplied text an error message quotes.
const MAX_QUOTE: usize = 80;

/// Quotes client-supplied text for an error message, shortened so that a huge name cannot
/// blow up the answer or the log.
pub(crate) fn quote(text: &str) -> String {
    if text.chars().count() <= MAX_QUOTE {
        format!("{text:?}")
    } else {
        let head: String = text.chars().take(MAX_QUOTE).collect();
        format!("{head:?}…")
    }
}
