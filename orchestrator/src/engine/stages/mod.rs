//! The stage kinds as the engine runs them: one module per kind, each implementing
//! [`StageRules`] — how the stage advances when the saga reaches it going forward, and how it
//! is undone going back. The driver asks [`Driver::decide`] and [`Driver::undo_stage`], which dispatch
//! on the definition's [`StageBody`] in one place; a new kind of stage is a module here, a
//! variant of `StageBody` in the DSL, an arm in each dispatch, and its rendering.
//!
//! What a stage decides without a call is kept in the driver's memory and written with
//! whatever comes next: nothing outside the log happened. A stage that calls ([`call`]) is
//! written ahead by the driver and run as an attempt.

mod call;
mod child;
mod group;
mod signal;
mod sleep;

use std::time::Duration;

use saga_dsl::{Phase, StageBody, StepError};
use serde_json::{json, Value};

pub(super) use super::decision::Decision;
use super::driver::Driver;
use crate::model::{Millis, SagaStatus, StepStatus};
use crate::store::{NewEvent, StoreError};

/// `Some($call)` with `$rules` bound to the [`StageRules`] of `$body`'s kind, or `None` for a
/// kind this engine does not know: the one place where a kind of stage is matched to its
/// module.
macro_rules! by_kind {
    ($body:expr, $rules:ident => $call:expr) => {
        match $body {
            StageBody::Call($rules) => Some($call),
            StageBody::Sleep($rules) => Some($call),
            StageBody::Signal($rules) => Some($call),
            StageBody::Parallel($rules) => Some($call),
            StageBody::Child($rules) => Some($call),
            _ => None,
        }
    };
}

/// Where a stage's turn is: its name, its row and the engine's clock reading.
#[derive(Debug, Clone, Copy)]
pub(super) struct Turn<'a> {
    /// The stage's name.
    pub(super) stage: &'a str,
    /// Its row in the log.
    pub(super) index: usize,
    /// Now, on the engine's clock.
    pub(super) now: Millis,
}

/// What a turn comes to, or the store's error.
pub(super) type Outcome = Result<Decision, StoreError>;

/// What one kind of stage does in the engine.
pub(super) trait StageRules {
    /// Its turn going forward: the saga reached it, or it waits and was looked at again.
    async fn advance(&self, driver: &mut Driver, turn: Turn<'_>) -> Outcome;

    /// Its turn going back, once every stage after it is undone: by default its compensation
    /// is called, as a call's is.
    async fn undo(&self, _driver: &mut Driver, _turn: Turn<'_>) -> Outcome {
        Ok(Decision::Call)
    }
}

impl Driver {
    /// The turn of stage `index` going forward. A condition that is false marks it `SKIPPED`;
    /// otherwise its kind decides. A condition, wake time or timeout that cannot be computed
    /// fails the stage permanently: it depends only on the saga's data, so asking again
    /// cannot change it.
    pub(super) async fn decide(
        &mut self,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let def = self.definition();
        let step = &def.steps()[index];
        let status = self.saga.steps[index].action.status;
        if status == StepStatus::Pending && step.is_conditional() {
            match step.applies(&self.context(index, Phase::Action, 0)) {
                Ok(true) => {}
                Ok(false) => {
                    self.settle_without_call(index, StepStatus::Skipped, None, now);
                    let event = NewEvent::step("step.skipped", step.name(), json!({}));
                    self.pending.events.push(event);
                    return Ok(Decision::Decided);
                }
                Err(e) => {
                    self.refuse(
                        index,
                        &format!("its condition failed: {}", e.message()),
                        now,
                    );
                    return Ok(Decision::Decided);
                }
            }
        }
        let turn = Turn {
            stage: step.name(),
            index,
            now,
        };
        match by_kind!(step.body(), rules => rules.advance(self, turn).await) {
            Some(outcome) => outcome,
            // A kind this engine does not know: fail the stage rather than skip it.
            None => {
                self.refuse(index, "a stage of a kind this engine cannot run", now);
                Ok(Decision::Decided)
            }
        }
    }

    /// The turn of row `index` going back. A branch's row is undone as a call.
    pub(super) async fn undo_stage(
        &mut self,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let def = self.definition();
        let Some(step) = def.steps().get(index) else {
            return Ok(Decision::Call);
        };
        let turn = Turn {
            stage: step.name(),
            index,
            now,
        };
        by_kind!(step.body(), rules => rules.undo(self, turn).await).unwrap_or(Ok(Decision::Call))
    }

    /// Marks a wait that starts now as `WAITING` and queues its record.
    pub(super) fn start_waiting(&mut self, index: usize, now: Millis) {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let action = &mut self.saga.steps[index].action;
        action.status = StepStatus::Waiting;
        action.started_at = Some(now);
        action.outcome_unknown = false;
        self.push_update(index, Phase::Action, None);
    }

    /// Gives the saga back due at `recheck`, then parks it with `park` (retried while the
    /// database is away for a moment; the first write stands meanwhile, so the saga is looked
    /// at again at `recheck` whatever happens).
    async fn give_back_and_park<F, Fut>(
        &mut self,
        recheck: Millis,
        park: F,
    ) -> Result<(), StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        self.saga.next_run_at = Some(recheck);
        self.write(false, true).await?;
        self.slot.take();
        self.inner.wake.notify_one();
        let mut delay = Duration::from_millis(50);
        loop {
            match park().await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_transient() && !self.stop.is_cancelled() => {
                    tracing::warn!(error = %e, "parking a wait failed; retrying");
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Ends a step's action in `status` at `now` without a call, with `output` if given, and
    /// queues its update.
    pub(super) fn settle_without_call(
        &mut self,
        index: usize,
        status: StepStatus,
        output: Option<Value>,
        now: Millis,
    ) {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let step = &mut self.saga.steps[index];
        step.action.status = status;
        step.action.outcome_unknown = false;
        step.action.ended_at = Some(now);
        if output.is_some() {
            step.output.clone_from(&output);
        }
        self.push_update(index, Phase::Action, output);
    }

    /// Fails a step that was never called: permanently, with `error`.
    pub(super) fn refuse(&mut self, index: usize, error: &str, now: Millis) {
        self.saga.steps[index].action.last_error = Some(error.to_owned());
        self.settle_without_call(index, StepStatus::Failed, None, now);
        let data = json!({"attempt": 0, "error": error, "outcome": "failed"});
        let name = self.saga.steps[index].name.clone();
        self.pending
            .events
            .push(NewEvent::step("step.failed", &name, data));
    }
}

/// The engine's clock reading as a `SystemTime`, for a sleep's wake time rule.
fn system_time(now: Millis) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(now.max(0) as u64)
}

/// A wake time in milliseconds since the epoch; an instant before the epoch, or too far to
/// count, is a permanent error.
fn millis(at: std::time::SystemTime) -> Result<Millis, StepError> {
    at.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| Millis::try_from(d.as_millis()).ok())
        .ok_or_else(|| StepError::permanent(format!("{at:?} is not a time to wake at")))
}
