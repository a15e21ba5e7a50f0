//! Bulk actions (SPEC §13): one operator command applied to every saga a filter matched, as a
//! durable job with its progress and the refusals of the sagas the command did not apply to.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{de_time, ser_time, Millis, UnknownValue};
use std::fmt;
use std::str::FromStr;

wire_enum!(
    /// The command a bulk job applies to each saga it matched.
    BulkAction {
        /// Cancel: finish the step in flight, then compensate.
        Cancel = "cancel",
        /// Pause: nothing new starts until the saga is resumed.
        Pause = "pause",
        /// Resume a paused saga.
        Resume = "resume",
        /// Make a waiting retry happen now, or retry a `FAILED` saga's failed step.
        Retry = "retry",
        /// Stop driving the saga without compensating.
        Abort = "abort",
        /// Start a new saga from the original's input.
        Fork = "fork",
    }
);

wire_enum!(
    /// Where a bulk job is.
    BulkStatus {
        /// Some matched sagas are still to be acted on.
        Running = "RUNNING",
        /// Every matched saga was acted on or refused the command.
        Done = "DONE",
    }
);

/// A saga a bulk job's command did not apply to, with the error the command answered (the
/// `code` and `message` its own route would have answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct BulkRefusal {
    /// The saga.
    pub saga_id: Uuid,
    /// The command's error code (`conflict`, `not_found`, `bad_request`, …).
    pub code: String,
    /// Why, for a person.
    pub message: String,
}

/// A bulk job as `GET /v1/bulk/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct BulkJob {
    /// The job's id (a UUIDv7: jobs sort by creation).
    pub id: Uuid,
    /// The command applied to each matched saga.
    pub action: BulkAction,
    /// `RUNNING` until every matched saga was acted on or refused, then `DONE`.
    pub status: BulkStatus,
    /// How many sagas the filter matched when the job was created: exactly the sagas it acts on.
    pub matched: u64,
    /// How many of them were acted on or refused so far.
    pub done: u64,
    /// The sagas that refused the command, in id order (included in `done`).
    pub refused: Vec<BulkRefusal>,
    /// The filter, as given.
    #[cfg_attr(feature = "server", schema(value_type = Object))]
    pub filter: serde_json::Value,
    /// Why, as the audit of each saga's command keeps it.
    pub reason: String,
    /// Who asked (the token's name), the actor of each saga's command.
    pub actor: String,
    /// When the job was created (RFC 3339).
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub created_at: Millis,
    /// Its last progress (RFC 3339).
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub updated_at: Millis,
}

/// A page of bulk jobs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct BulkJobPage {
    /// The jobs, without their refusals (`refused` is empty: read a job for them).
    pub jobs: Vec<BulkJob>,
    /// Pass as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<Uuid>,
}
