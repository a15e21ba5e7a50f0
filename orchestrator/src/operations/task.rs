//! `report_task`: a participant completes, fails or keeps alive the call it was handed a task
//! token for (SPEC §16). The token is checked against the log's key before anything is read,
//! and never appears in an error or a log line.

use super::{OperationError, Operations, Result};
use crate::model::task::TaskToken;
use crate::store::{TaskAnswer, TaskRef, TaskReport};

/// What a participant reports, before its token is read.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The call succeeded with this output.
    Complete(serde_json::Value),
    /// The call failed, for good unless `retryable`.
    Fail {
        /// What went wrong.
        error: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// The participant still works on it: the wait's deadline moves a step's timeout ahead.
    Heartbeat,
}

impl Operations<'_> {
    /// Records `report` for the attempt `token` names. An unknown or altered token is
    /// `NotFound`; a token whose attempt is no longer its step's current one, or for which
    /// another outcome was reported, is `Conflict`; a repeat of the same completion or failure
    /// answers as the first did.
    /// Returns the attempt the token names with the log's answer.
    pub async fn report_task(&self, token: &str, report: Report) -> Result<(TaskRef, TaskAnswer)> {
        // A server's engine keeps the key; a bare store reads it.
        let key: std::sync::Arc<[u8]> = match self.engine {
            Some(engine) => engine.task_key().await?,
            None => self.store.task_key().await?.into(),
        };
        let token =
            TaskToken::decode(&key, token).map_err(|e| OperationError::NotFound(e.to_string()))?;
        let report = match report {
            Report::Complete(output) => TaskReport::Complete(output),
            Report::Fail { error, retryable } => TaskReport::Fail { error, retryable },
            Report::Heartbeat => TaskReport::Heartbeat {
                extend_ms: i64::try_from(token.extend_ms).unwrap_or(i64::MAX / 4),
            },
        };
        match self.store.report_task(&token.task, &report).await? {
            TaskAnswer::NotFound => Err(OperationError::NotFound(
                "no task has this token (its saga may have been purged)".to_owned(),
            )),
            TaskAnswer::NotCurrent => Err(OperationError::Conflict(
                "this token's attempt is no longer current: its step went on (it timed out \
                 and was tried again, the saga ended or went back, or another outcome was \
                 reported for it)"
                    .to_owned(),
            )),
            answer => {
                if let (TaskAnswer::Recorded { .. }, Some(engine)) = (&answer, self.engine) {
                    engine.task_reported(token.task.saga);
                }
                Ok((token.task, answer))
            }
        }
    }
}
