//! Completion by callback (SPEC §16): what a participant reports for a task token's attempt
//! (`POST /v1/tasks/{token}/complete`, `…/fail`, `…/heartbeat`), and what the log answers.

use serde_json::Value;

pub use crate::model::task::TaskRef;
use crate::model::Millis;

/// What a participant reports for an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskReport {
    /// The call succeeded with this output.
    Complete(Value),
    /// The call failed: retried (with the same idempotency key) if `retryable` and the step's
    /// budget allows, else for good.
    Fail {
        /// What went wrong, for the attempt log.
        error: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// The participant still works on it: the wait's deadline moves to now plus this many
    /// milliseconds (the step's timeout).
    Heartbeat {
        /// How far the deadline moves from now.
        extend_ms: i64,
    },
}

/// How an attempt waiting for its callback ended, as the log holds it: the first of a
/// participant's report and its driver's closing of the wait is the one that stands (one row
/// per attempt), so a callback racing the deadline or a cancel has exactly one outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// Completed with this output.
    Completed(Value),
    /// Failed.
    Failed {
        /// What went wrong.
        error: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// Its deadline passed first: the outcome is unknown.
    Expired,
    /// The saga went back (or an operator took the step over) first: the outcome is unknown.
    Abandoned,
}

impl TaskOutcome {
    /// The `outcome` column's word for it.
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Self::Completed(_) => "completed",
            Self::Failed { .. } => "failed",
            Self::Expired => "expired",
            Self::Abandoned => "abandoned",
        }
    }
}

/// What the log answered a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskAnswer {
    /// Recorded now; the saga goes on from it (at once if it was parked on the wait).
    Recorded {
        /// The step's name.
        step: String,
    },
    /// The same completion or failure was recorded before: nothing changed.
    Repeated {
        /// The step's name.
        step: String,
    },
    /// A heartbeat: the wait now ends at `timeout_at` unless the participant reports first.
    Extended {
        /// The step's name.
        step: String,
        /// The new deadline.
        timeout_at: Millis,
    },
    /// The attempt is no longer the step's current one (it timed out and was retried, the saga
    /// ended or went back, an operator took it over), or another outcome was reported for it.
    NotCurrent,
    /// No such saga or step (purged, or never made).
    NotFound,
}
