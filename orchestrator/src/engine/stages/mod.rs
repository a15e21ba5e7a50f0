//! The stage kinds as the engine decides them: one module per kind, each implementing
//! [`StageRules`] — the facts from the store it needs, how the stage advances when the saga
//! reaches it going forward, and how it is undone going back. The rules are pure: they read an
//! immutable [`Turn`] (the saga's record, the stage, the clock reading, the step context, the
//! registry) and the [`Facts`] the runner read for them, and return a [`Decision`]; the
//! driver's effect runner ([`super::effects`]) applies it. [`needs`], [`advance`], [`undo`] and
//! [`needs_back`] dispatch on the definition's [`StageBody`] in one place; a new kind of stage
//! is a module here, a variant of `StageBody` in the DSL, an arm in the dispatch, and its
//! rendering.
//!
//! What a stage decides without a call is kept in the driver's memory and written with
//! whatever comes next: nothing outside the log happened. A stage that calls ([`call`]) is
//! written ahead by the runner and run as an attempt.

mod call;
mod child;
mod group;
mod signal;
mod sleep;

use std::time::Duration;

use saga_dsl::{Registry, StageBody, Step, StepContext, StepError};

use super::decision::{Decision, Facts, Need};
use crate::model::{Millis, Saga, StepRecord, StepStatus};

pub(super) use call::{after_failure, AfterFailure};
pub(super) use child::{after_cancel, after_compensate};

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

/// What a stage's rules see of its turn: an immutable view of the saga, read, never changed.
#[derive(Clone, Copy)]
pub(super) struct Turn<'a> {
    /// The stage's name.
    pub(super) stage: &'a str,
    /// Its row in the log.
    pub(super) index: usize,
    /// Now, on the engine's clock.
    pub(super) now: Millis,
    /// The saga's record as the driver holds it.
    pub(super) saga: &'a Saga,
    /// The definitions this process runs (a child stage's child is the latest of its name).
    pub(super) registry: &'a Registry,
    /// Builds what the stage's rules (its condition, its wait, its group's list, its child's
    /// input) are told: made only when asked, since a plain call needs none.
    pub(super) context: &'a dyn Fn() -> StepContext,
}

impl Turn<'_> {
    /// The stage's row.
    pub(super) fn row(&self) -> &StepRecord {
        &self.saga.steps[self.index]
    }

    /// Whether the saga reaches the stage on this turn (its action has not begun).
    pub(super) fn reached(&self) -> bool {
        self.row().action.status == StepStatus::Pending
    }

    /// What the stage's rules are told.
    pub(super) fn context(&self) -> StepContext {
        (self.context)()
    }
}

/// What one kind of stage decides in the engine. Every method is pure: what it needs from the
/// store it names in `needs` (or `needs_back`), and the runner reads it before asking.
pub(super) trait StageRules {
    /// The fact its forward turn needs from the store.
    fn needs(&self, _turn: &Turn<'_>) -> Need {
        Need::Nothing
    }

    /// Its turn going forward: the saga reached it, or it waits and was looked at again.
    fn advance(&self, turn: &Turn<'_>, facts: Facts) -> Decision;

    /// The fact its turn going back needs from the store.
    fn needs_back(&self, _turn: &Turn<'_>) -> Need {
        Need::Nothing
    }

    /// Its turn going back, once every stage after it is undone: by default its compensation
    /// is called, as a call's is.
    fn undo(&self, _turn: &Turn<'_>, _facts: Facts) -> Decision {
        Decision::Call
    }
}

/// The first half of a forward turn: what comes before the stage's kind decides.
#[derive(Debug)]
pub(super) enum Ahead {
    /// Its condition decided the turn: false skips the stage, an error refuses it.
    Decided(Decision),
    /// Its kind decides, once the runner read this fact.
    Needs(Need),
}

/// The first half of a forward turn: a condition that is false skips the stage, one that
/// fails refuses it; otherwise the fact its kind needs. A condition depends only on the saga's
/// data, so asking again cannot change it.
pub(super) fn needs(step: &Step, turn: &Turn<'_>) -> Ahead {
    if turn.reached() && step.is_conditional() {
        match step.applies(&turn.context()) {
            Ok(true) => {}
            Ok(false) => return Ahead::Decided(Decision::skip(turn.stage)),
            Err(e) => {
                let error = format!("its condition failed: {}", e.message());
                return Ahead::Decided(Decision::refuse(turn.stage, error));
            }
        }
    }
    Ahead::Needs(by_kind!(step.body(), rules => rules.needs(turn)).unwrap_or(Need::Nothing))
}

/// The second half of a forward turn, with the facts [`needs`] asked for: its kind decides. A
/// kind this engine does not know fails the stage rather than skip it.
pub(super) fn advance(step: &Step, turn: &Turn<'_>, facts: Facts) -> Decision {
    by_kind!(step.body(), rules => rules.advance(turn, facts))
        .unwrap_or_else(|| Decision::refuse(turn.stage, "a stage of a kind this engine cannot run"))
}

/// The fact a stage's turn going back needs.
pub(super) fn needs_back(step: &Step, turn: &Turn<'_>) -> Need {
    by_kind!(step.body(), rules => rules.needs_back(turn)).unwrap_or(Need::Nothing)
}

/// A stage's turn going back, with the facts [`needs_back`] asked for.
pub(super) fn undo(step: &Step, turn: &Turn<'_>, facts: Facts) -> Decision {
    by_kind!(step.body(), rules => rules.undo(turn, facts)).unwrap_or(Decision::Call)
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

/// What the rules' unit tests share: a turn over a hand-built record, no store.
#[cfg(test)]
pub(super) mod testing {
    use std::sync::Arc;

    use saga_dsl::{Phase, Registry, StepContext};
    use serde_json::{json, Value};

    use super::Turn;
    use crate::model::fixtures::NOW;
    use crate::model::Saga;

    /// What the stage in row `index` of `saga` is told: the saga's input, no outputs.
    pub(crate) fn context(saga: &Saga, index: usize) -> StepContext {
        StepContext::new(
            saga.id,
            index,
            saga.steps[index].name.as_str(),
            Phase::Action,
            0,
            Arc::new(json!({"order": 7})),
            Arc::new(std::collections::BTreeMap::<String, Value>::new()),
        )
    }

    /// Runs `f` with the turn of row `index` of `saga` at `now`, over `registry`.
    pub(crate) fn with_turn<R>(
        saga: &Saga,
        index: usize,
        now: crate::model::Millis,
        registry: &Registry,
        f: impl FnOnce(&Turn<'_>) -> R,
    ) -> R {
        let make = || context(saga, index);
        let turn = Turn {
            stage: &saga.steps[index].name,
            index,
            now,
            saga,
            registry,
            context: &make,
        };
        f(&turn)
    }

    /// The same at [`NOW`] with no definition registered.
    pub(crate) fn turn<R>(saga: &Saga, index: usize, f: impl FnOnce(&Turn<'_>) -> R) -> R {
        with_turn(saga, index, NOW, &Registry::new(), f)
    }
}
