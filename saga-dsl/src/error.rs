//! Errors: the ones a step returns ([`StepError`]) and the ones a definition is rejected with
//! ([`DefinitionError`]).

use std::time::Duration;

/// What an action or a compensation reports when it did not succeed.
///
/// The variant decides what the orchestrator does next, so pick it from the participant's point of
/// view: could the same call, made again with the same idempotency key, succeed?
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// A transient failure (a timeout, a 503, a lost connection): retry with the step's policy.
    #[error("{message}")]
    Retryable {
        /// A one-line description kept in the attempt log.
        message: String,
    },
    /// A transient failure whose retry should not come before `delay` (a `Retry-After` header,
    /// a rate limit). The step's retry budget still applies.
    #[error("{message} (retry after {delay:?})")]
    RetryAfter {
        /// The earliest time, from now, at which to try again.
        delay: Duration,
        /// A one-line description kept in the attempt log.
        message: String,
    },
    /// A definitive failure (card declined, no rider within 5 km): retrying cannot help. Before
    /// the pivot this starts compensation at once; after it, the saga becomes `FAILED`.
    #[error("{message}")]
    Permanent {
        /// A one-line description kept in the attempt log and shown as the saga's error.
        message: String,
    },
}

impl StepError {
    /// A transient failure; the step's retry policy decides when to try again.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::Retryable {
            message: message.into(),
        }
    }

    /// A transient failure that must not be retried before `delay` has passed.
    pub fn retry_after(delay: Duration, message: impl Into<String>) -> Self {
        Self::RetryAfter {
            delay,
            message: message.into(),
        }
    }

    /// A definitive failure: no retry.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent {
            message: message.into(),
        }
    }

    /// Whether the same call may succeed if made again.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Permanent { .. })
    }

    /// The message without the retry hint.
    pub fn message(&self) -> &str {
        match self {
            Self::Retryable { message }
            | Self::RetryAfter { message, .. }
            | Self::Permanent { message } => message,
        }
    }
}

/// Turns any error into a [`StepError`] of the chosen kind, as in `client.call().await.retryable()?`.
pub trait ResultExt<T> {
    /// Maps the error to [`StepError::Retryable`].
    fn retryable(self) -> Result<T, StepError>;
    /// Maps the error to [`StepError::Permanent`].
    fn permanent(self) -> Result<T, StepError>;
}

impl<T, E: std::fmt::Display> ResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, StepError> {
        self.map_err(|e| StepError::retryable(e.to_string()))
    }

    fn permanent(self) -> Result<T, StepError> {
        self.map_err(|e| StepError::permanent(e.to_string()))
    }
}

/// Why a saga definition was rejected by [`crate::SagaBuilder::build`] or [`crate::Registry`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The saga name is empty or has characters other than ASCII letters, digits, `_`, `-`, `.`.
    #[error("invalid saga name {0:?}: use ASCII letters, digits, '_', '-' or '.'")]
    InvalidName(String),
    /// The version is 0; versions start at 1.
    #[error("saga {0}: version must be at least 1")]
    InvalidVersion(String),
    /// A saga needs at least one step.
    #[error("saga {0}: a saga needs at least one step")]
    NoSteps(String),
    /// Two steps share a name; names identify steps in the log and in keys.
    #[error("saga {saga}: duplicate step name {step:?}")]
    DuplicateStep {
        /// The saga.
        saga: String,
        /// The repeated step name.
        step: String,
    },
    /// A step name is empty or has characters other than ASCII letters, digits, `_`, `-`, `.`.
    #[error("saga {saga}: invalid step name {step:?}")]
    InvalidStepName {
        /// The saga.
        saga: String,
        /// The offending name.
        step: String,
    },
    /// Steps must come as compensatable steps, then at most one pivot, then retriable steps.
    #[error("saga {saga}: step {step:?} is {kind} but comes after {after:?}; order must be compensatable steps, at most one pivot, then retriable steps")]
    StepOrder {
        /// The saga.
        saga: String,
        /// The misplaced step.
        step: String,
        /// Its kind.
        kind: &'static str,
        /// The step it may not follow.
        after: String,
    },
    /// A signal name is not a valid identifier, or two signal steps wait for the same signal
    /// (the first signal of a name is the only one a saga takes).
    #[error("saga {saga}: step {step:?} waits for signal {signal:?}, {problem}")]
    BadSignal {
        /// The saga.
        saga: String,
        /// The signal step.
        step: String,
        /// The signal's name.
        signal: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A parallel group without branches, with a pivot among them, with branches of
    /// different kinds or with two branches of one name.
    #[error("saga {saga}: parallel group {step:?}: {problem}")]
    BadGroup {
        /// The saga.
        saga: String,
        /// The group.
        step: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A child stage names no valid saga, or a saga that cannot be its child: one with a
    /// point of no return, started before this saga's own (its compensations could not undo
    /// it), or one the registry does not hold.
    #[error("saga {saga}: child stage {step:?}: {problem}")]
    BadChild {
        /// The saga.
        saga: String,
        /// The child stage.
        step: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A limit or rate limiter is misdeclared: a bad or repeated name, a limit of 0, a key
    /// naming no field, or a step taking from a limiter the definition does not declare.
    #[error("saga {saga}: {problem}")]
    BadLimit {
        /// The saga.
        saga: String,
        /// What is wrong.
        problem: String,
    },
    /// A search attribute's name is not valid, or two attributes share one.
    #[error("saga {saga}: {problem}")]
    BadAttr {
        /// The saga.
        saga: String,
        /// What is wrong.
        problem: String,
    },
    /// Two definitions declare one limit name differently (of other kinds, values or
    /// definitions).
    #[error("limit {name:?} is declared differently by {first} and {second}")]
    LimitConflict {
        /// The limit.
        name: String,
        /// The first definition declaring it.
        first: String,
        /// The other.
        second: String,
    },
    /// The registry already has this name and version.
    #[error("saga {name} version {version} is already registered")]
    AlreadyRegistered {
        /// The saga name.
        name: String,
        /// The version.
        version: u32,
    },
}
