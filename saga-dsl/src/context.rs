//! What a running action or compensation knows about itself: [`StepContext`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use crate::StepError;

/// Whether a call is a step's action or its compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// The forward action.
    Action,
    /// The compensation that undoes the action.
    Compensation,
}

impl Phase {
    /// `action` or `compensation`, as stored in the log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Action => "action",
            Self::Compensation => "compensation",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stable idempotency key of one (saga, step, phase): a UUIDv5 in the saga id's namespace.
///
/// It is the same on every attempt, after every crash and on every worker, so an action can pass it
/// straight to a payment provider and a participant can dedupe on it.
///
/// ```
/// use saga_dsl::{idempotency_key, Phase};
/// let saga = uuid::Uuid::nil();
/// assert_eq!(idempotency_key(saga, 0, Phase::Action), idempotency_key(saga, 0, Phase::Action));
/// assert_ne!(idempotency_key(saga, 0, Phase::Action), idempotency_key(saga, 0, Phase::Compensation));
/// ```
pub fn idempotency_key(saga_id: Uuid, step_index: usize, phase: Phase) -> Uuid {
    Uuid::new_v5(&saga_id, format!("{step_index}:{phase}").as_bytes())
}

/// Everything an action or a compensation is given when it runs.
///
/// Cheap to clone: the saga input and earlier outputs are shared.
#[derive(Debug, Clone)]
pub struct StepContext {
    saga_id: Uuid,
    step_index: usize,
    step_name: Arc<str>,
    phase: Phase,
    attempt: u32,
    input: Arc<Value>,
    outputs: Arc<BTreeMap<String, Value>>,
}

impl StepContext {
    /// Builds a context. The orchestrator does this; tests of step code may too.
    ///
    /// `outputs` holds the outputs of the steps that succeeded before this one (for an action) or
    /// of every succeeded step (for a compensation), by step name.
    pub fn new(
        saga_id: Uuid,
        step_index: usize,
        step_name: impl Into<Arc<str>>,
        phase: Phase,
        attempt: u32,
        input: Arc<Value>,
        outputs: Arc<BTreeMap<String, Value>>,
    ) -> Self {
        Self {
            saga_id,
            step_index,
            step_name: step_name.into(),
            phase,
            attempt,
            input,
            outputs,
        }
    }

    /// The saga's id.
    pub fn saga_id(&self) -> Uuid {
        self.saga_id
    }

    /// This step's position, from 0.
    pub fn step_index(&self) -> usize {
        self.step_index
    }

    /// This step's name.
    pub fn step_name(&self) -> &str {
        &self.step_name
    }

    /// Action or compensation.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The attempt number of this call, from 1. Attempts interrupted by a crash count.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The stable idempotency key of this (saga, step, phase); see [`idempotency_key`].
    pub fn idempotency_key(&self) -> Uuid {
        idempotency_key(self.saga_id, self.step_index, self.phase)
    }

    /// The saga input as JSON.
    pub fn raw_input(&self) -> &Value {
        &self.input
    }

    /// The saga input, typed. A mismatch is a permanent error: retrying cannot fix it.
    pub fn input<T: DeserializeOwned>(&self) -> Result<T, StepError> {
        T::deserialize(&*self.input)
            .map_err(|e| StepError::permanent(format!("saga input does not fit: {e}")))
    }

    /// The JSON output of an earlier step, if it succeeded.
    pub fn raw_output_of(&self, step: &str) -> Option<&Value> {
        self.outputs.get(step)
    }

    /// The output of an earlier step, typed. Missing or mismatched is a permanent error.
    pub fn output_of<T: DeserializeOwned>(&self, step: &str) -> Result<T, StepError> {
        let value = self
            .outputs
            .get(step)
            .ok_or_else(|| StepError::permanent(format!("no output recorded for step {step}")))?;
        T::deserialize(value)
            .map_err(|e| StepError::permanent(format!("output of step {step} does not fit: {e}")))
    }

    /// In a compensation: the output of this step's own action (a refund needs the charge id).
    ///
    /// `None` when the action's outcome is unknown (it timed out or the process died while it ran):
    /// the compensation must then undo whatever the action may have done, by its idempotency key.
    pub fn action_output<T: DeserializeOwned>(&self) -> Result<Option<T>, StepError> {
        match self.outputs.get(&*self.step_name) {
            None => Ok(None),
            Some(v) => T::deserialize(v).map(Some).map_err(|e| {
                StepError::permanent(format!(
                    "output of step {} does not fit: {e}",
                    self.step_name
                ))
            }),
        }
    }

    /// The idempotency key the action of this step used; handy in a compensation that must find
    /// what the action did (for example when the action's outcome is unknown).
    pub fn action_key(&self) -> Uuid {
        idempotency_key(self.saga_id, self.step_index, Phase::Action)
    }
}
