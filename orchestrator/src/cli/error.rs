//! Why an operator command failed, in words an operator can act on.
//!
//! Every variant displays as one line: binaries print it after `error: ` and exit non-zero.

use uuid::Uuid;

use crate::client::ClientError;
use crate::operations::OperationError;
use crate::store::StoreError;

/// Why an operator command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// No saga with this id.
    #[error("saga {0} not found")]
    NotFound(Uuid),
    /// No saga's id starts with this prefix.
    #[error("no saga has an id starting with {0}")]
    NoMatch(String),
    /// Several sagas' ids start with this prefix.
    #[error("saga id prefix {prefix} is ambiguous: it matches {candidates}; give more of the id")]
    Ambiguous {
        /// The prefix given.
        prefix: String,
        /// Some of the ids it matches, comma-separated.
        candidates: String,
    },
    /// The command does not apply to the saga in its current state (cancel after the pivot,
    /// abort of a finished saga, …).
    #[error("{0}")]
    Conflict(String),
    /// An argument is malformed or names nothing (a bad id, an unknown step, an empty reason).
    #[error("{0}")]
    BadArgument(String),
    /// The database could not be opened or read, or refused the change.
    #[error(transparent)]
    Store(StoreError),
    /// The output could not be written (the cause is in the message, so it is not also a
    /// `source()`, which a chain printed on one line would repeat).
    #[error("cannot write output: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => Self::NotFound(id),
            StoreError::Conflict(msg) => Self::Conflict(msg),
            StoreError::UnknownStep { saga, step } => {
                Self::BadArgument(format!("saga {saga} has no step {step:?}"))
            }
            StoreError::UnknownLimit(name) => {
                Self::BadArgument(format!("no limit named {name:?}; `limits` lists them"))
            }
            other => Self::Store(other),
        }
    }
}

impl From<OperationError> for CliError {
    fn from(e: OperationError) -> Self {
        match e {
            OperationError::BadRequest(msg) | OperationError::NotFound(msg) => {
                Self::BadArgument(msg)
            }
            OperationError::Conflict(msg) => Self::Conflict(msg),
            OperationError::Invalid(msg) | OperationError::NeedsServer(msg) => {
                Self::BadArgument(msg)
            }
            OperationError::Start(e) => Self::BadArgument(e.to_string()),
            OperationError::Store(e) => e.into(),
        }
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        // Serializing our own records cannot fail on its own: what remains is the writer's error.
        Self::Io(e.into())
    }
}

impl CliError {
    /// Whether the error is only that the reader of the output went away (`saga list | head`):
    /// binaries exit quietly then.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// A client failure as a one-line command error. A `409` is a conflict with the saga's state;
/// everything else (unreachable server, refused input, unknown definition) is reported as what
/// the server or the network said.
pub(super) fn client_error(e: ClientError) -> CliError {
    match e {
        ClientError::Api {
            status: 409,
            message,
            ..
        } => CliError::Conflict(message),
        e => CliError::BadArgument(e.to_string()),
    }
}
