//! The calls of a driver in flight: each action or compensation runs as a task of its own (so
//! a panic or a timeout is an outcome, not a crash of the driver), and several run at once
//! for the branches of a parallel group.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use saga_dsl::{Phase, StepError};
use serde_json::Value;
use tokio::task::{Id, JoinError, JoinSet};

/// Every outcome a call can have, as [`CallResult::outcome`] names them.
#[cfg(feature = "server")]
pub(crate) const CALL_OUTCOMES: &[&str] = &["succeeded", "retryable", "failed", "timed_out"];

/// The outcome of one call.
pub(super) enum CallResult {
    Ok(Value),
    Err { error: StepError, unknown: bool },
}

impl CallResult {
    /// The result of a call that waited for its participant's callback, as the log holds its
    /// end: the report, or an unknown outcome for a wait that expired or was abandoned.
    pub(super) fn of_task(outcome: crate::store::TaskOutcome) -> Self {
        use crate::store::TaskOutcome;
        match outcome {
            TaskOutcome::Completed(output) => Self::Ok(output),
            TaskOutcome::Failed { error, retryable } => Self::Err {
                error: if retryable {
                    StepError::retryable(error)
                } else {
                    StepError::permanent(error)
                },
                unknown: false,
            },
            TaskOutcome::Expired | TaskOutcome::Abandoned => Self::Err {
                error: StepError::retryable(
                    "the participant did not call back before the step's timeout; outcome unknown",
                ),
                unknown: true,
            },
        }
    }

    /// The outcome as the attempt log names it, for metric labels: one of [`CALL_OUTCOMES`].
    pub(super) fn outcome(&self) -> &'static str {
        match self {
            Self::Ok(_) => "succeeded",
            Self::Err { unknown: true, .. } => "timed_out",
            Self::Err { error, .. } if error.is_retryable() => "retryable",
            Self::Err { .. } => "failed",
        }
    }
}

/// A call to make: an action or a compensation with its context.
pub type CallFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, StepError>> + Send>>;

/// What a task returns: the call's own result, or the timeout that cut it short.
type TaskResult = Result<Result<Value, StepError>, tokio::time::error::Elapsed>;

/// One call in flight.
pub(super) struct Call {
    /// The row of its step.
    pub(super) index: usize,
    /// Action or compensation.
    pub(super) phase: Phase,
    /// Its attempt number.
    pub(super) attempt: u32,
    /// When it started, for the duration metric.
    pub(super) started: Instant,
    /// Its span's context, when spans are exported.
    pub(super) span: Option<crate::telemetry::Context>,
    timeout: Duration,
}

impl Drop for Call {
    /// A call dropped unfinished (its driver stopped: a lease lost, an operator's abort) ends
    /// its span as the log records it, abandoned, rather than as the SDK would, without any.
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            crate::telemetry::end_attempt(
                &mut span,
                "abandoned",
                Some("the driver stopped before the call ended"),
            );
        }
    }
}

/// A finished call.
pub(super) struct Finished {
    /// Which call.
    pub(super) call: Call,
    /// How it went.
    pub(super) result: CallResult,
}

/// The calls in flight of one driver.
#[derive(Default)]
pub(super) struct InFlight {
    tasks: JoinSet<TaskResult>,
    calls: HashMap<Id, Call>,
}

impl InFlight {
    /// Whether no call is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Starts `run` for the call of row `index` in `phase`, cut short after `timeout`, in the
    /// OpenTelemetry context `run_in` if there is one; its attempt's `span`, if any, ends with
    /// it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        &mut self,
        index: usize,
        phase: Phase,
        attempt: u32,
        timeout: Duration,
        span: Option<crate::telemetry::Context>,
        run_in: Option<crate::telemetry::Context>,
        run: CallFuture,
    ) {
        let handle = match run_in {
            // The call sees its attempt's span as the current OpenTelemetry context.
            Some(cx) => {
                let run = crate::telemetry::within(run, cx);
                self.tasks
                    .spawn(async move { tokio::time::timeout(timeout, run).await })
            }
            None => self
                .tasks
                .spawn(async move { tokio::time::timeout(timeout, run).await }),
        };
        let call = Call {
            index,
            phase,
            attempt,
            started: Instant::now(),
            span,
            timeout,
        };
        self.calls.insert(handle.id(), call);
    }

    /// Waits for the next call to end, then takes every other one that has ended meanwhile,
    /// so that their results are written together.
    pub(super) async fn next_batch(&mut self) -> Vec<Finished> {
        let mut done = Vec::new();
        if let Some(first) = self.tasks.join_next_with_id().await {
            done.extend(self.finish(first));
        }
        while let Some(next) = self.tasks.try_join_next_with_id() {
            done.extend(self.finish(next));
        }
        done
    }

    fn finish(&mut self, joined: Result<(Id, TaskResult), JoinError>) -> Option<Finished> {
        let (id, result) = match joined {
            Ok((id, result)) => (id, Ok(result)),
            Err(e) => (e.id(), Err(e)),
        };
        let call = self.calls.remove(&id)?;
        let result = match result {
            Ok(Ok(Ok(value))) => CallResult::Ok(value),
            Ok(Ok(Err(error))) => CallResult::Err {
                error,
                unknown: false,
            },
            Ok(Err(_elapsed)) => CallResult::Err {
                error: StepError::retryable(format!(
                    "timed out after {} ms; outcome unknown",
                    call.timeout.as_millis()
                )),
                unknown: true,
            },
            Err(join) => CallResult::Err {
                error: StepError::retryable(format!("the {} panicked: {join}", call.phase)),
                unknown: true,
            },
        };
        Some(Finished { call, result })
    }
}
