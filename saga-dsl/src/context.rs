//! What a running action or compensation knows about itself: [`StepContext`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use crate::shared::{InputCache, SharedState, Stage};
use crate::trace::TraceContext;
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

/// The stable idempotency key of one branch of a parallel group: a UUIDv5 in the saga id's
/// namespace of `stage/branch` and the phase, the same whatever order the branches were
/// started or mapped in.
///
/// ```
/// use saga_dsl::{branch_idempotency_key, Phase};
/// let saga = uuid::Uuid::nil();
/// let a = branch_idempotency_key(saga, "reserve_items", "sku-1", Phase::Action);
/// assert_eq!(a, branch_idempotency_key(saga, "reserve_items", "sku-1", Phase::Action));
/// assert_ne!(a, branch_idempotency_key(saga, "reserve_items", "sku-2", Phase::Action));
/// ```
pub fn branch_idempotency_key(saga_id: Uuid, stage: &str, branch: &str, phase: Phase) -> Uuid {
    Uuid::new_v5(&saga_id, format!("{stage}/{branch}:{phase}").as_bytes())
}

/// The id of the child saga that the child stage `stage` of saga `saga_id` starts: a UUIDv5 in
/// the parent's namespace, so that a parent resumed after a crash finds the child it started
/// instead of starting another.
///
/// ```
/// use saga_dsl::child_saga_id;
/// let parent = uuid::Uuid::nil();
/// assert_eq!(child_saga_id(parent, "delivery"), child_saga_id(parent, "delivery"));
/// assert_ne!(child_saga_id(parent, "delivery"), child_saga_id(parent, "invoice"));
/// ```
pub fn child_saga_id(saga_id: Uuid, stage: &str) -> Uuid {
    Uuid::new_v5(&saga_id, format!("child:{stage}").as_bytes())
}

/// The branch a call belongs to: its name and, for a mapped group, its element.
#[derive(Debug, Clone)]
struct BranchOf {
    stage: Arc<str>,
    name: Arc<str>,
    element: Option<Arc<Value>>,
}

/// Everything an action or a compensation is given when it runs.
///
/// Cheap to clone: the saga input, its typed forms, earlier outputs and the application's state
/// are shared.
#[derive(Debug, Clone)]
pub struct StepContext {
    saga_id: Uuid,
    step_index: usize,
    step_name: Arc<str>,
    phase: Phase,
    attempt: u32,
    input: Arc<Value>,
    /// Shared by the calls of one run; without one (a context built by hand) each read parses.
    typed_input: Option<InputCache>,
    outputs: Arc<BTreeMap<String, Value>>,
    branch: Option<BranchOf>,
    state: Option<SharedState>,
    trace: Option<TraceContext>,
    /// The saga whose keys this call uses, when it is not `saga_id` (a row a fork took over).
    keys_saga: Option<Uuid>,
    /// The task token of a call completed by callback.
    task: Option<Arc<TaskHandle>>,
}

/// What a call completed by callback
/// ([`Step::completed_by_callback`](crate::Step::completed_by_callback)) hands its participant:
/// the attempt's task token and the URL under which the participant completes, fails or keeps
/// alive the step (`POST {url}/complete`, `{url}/fail`, `{url}/heartbeat`).
///
/// The token is a secret: it names one attempt of one step, and anyone who holds it can end
/// that attempt. Send it to the participant only, and never log it.
#[derive(Clone, PartialEq, Eq)]
pub struct TaskHandle {
    token: String,
    url: String,
}

impl TaskHandle {
    /// A handle for `token`, completed under `url`. The orchestrator does this.
    pub fn new(token: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            token: token.into(),
            url: url.into(),
        }
    }

    /// The opaque token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `<the orchestrator's public URL>/v1/tasks/<token>`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl std::fmt::Debug for TaskHandle {
    /// Never prints the token, so that a context in a log line does not leak it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").finish_non_exhaustive()
    }
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
            typed_input: None,
            outputs,
            branch: None,
            state: None,
            trace: None,
            keys_saga: None,
            task: None,
        }
    }

    /// This context, with the task token of its attempt. The orchestrator does this for a
    /// call completed by callback.
    pub fn with_task(mut self, task: TaskHandle) -> Self {
        self.task = Some(Arc::new(task));
        self
    }

    /// The task token of this attempt, for a call completed by callback; `None` otherwise.
    pub fn task(&self) -> Option<&TaskHandle> {
        self.task.as_deref()
    }

    /// This context, with the idempotency keys of saga `saga` instead of its own: for a step a
    /// fork took over from the saga it was forked from, whose effect is that saga's and is
    /// undone with that saga's key. The orchestrator does this.
    pub fn with_keys_of(mut self, saga: Uuid) -> Self {
        self.keys_saga = Some(saga);
        self
    }

    /// This context, with the trace context of the call. The orchestrator does this.
    pub fn with_trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The W3C trace context of this call: its attempt's span when the orchestrator records
    /// the saga's trace, else its saga's. Hand [`TraceContext::traceparent`] to the participant
    /// as the `traceparent` header so that its spans join the saga's trace. `None` when the
    /// saga has no trace (nothing exports traces and it joined no caller's) and for a context
    /// built by hand.
    pub fn trace(&self) -> Option<TraceContext> {
        self.trace
    }

    /// This context, with the state of the saga's definition
    /// ([`SagaDefinition::state`](crate::SagaDefinition::state)). The orchestrator does this.
    pub fn with_state(mut self, state: Option<SharedState>) -> Self {
        self.state = state;
        self
    }

    /// This context, sharing `cache`'s typed input with the other calls of the same run. The
    /// orchestrator does this.
    pub fn with_input_cache(mut self, cache: InputCache) -> Self {
        self.typed_input = Some(cache);
        self
    }

    /// The application's state given to the definition with
    /// [`SagaBuilder::state`](crate::SagaBuilder::state): the one `Arc` every call shares,
    /// instead of a clone moved into each closure. A definition without a state of type `S`
    /// is a permanent error.
    pub fn state<S: Send + Sync + 'static>(&self) -> Result<&S, StepError> {
        self.state
            .as_deref()
            .and_then(|s| s.downcast_ref::<S>())
            .ok_or_else(|| {
                StepError::permanent(format!(
                    "the saga's definition has no state of type {}: give it with \
                     SagaDefinition::builder(..).state(..)",
                    std::any::type_name::<S>()
                ))
            })
    }

    /// This context, for the branch `branch` of the parallel group `stage` (with its element,
    /// for a mapped group). The orchestrator does this; the step name of a branch's call is
    /// `stage/branch`.
    pub fn for_branch(
        mut self,
        stage: impl Into<Arc<str>>,
        branch: impl Into<Arc<str>>,
        element: Option<Arc<Value>>,
    ) -> Self {
        self.branch = Some(BranchOf {
            stage: stage.into(),
            name: branch.into(),
            element,
        });
        self
    }

    /// In a branch of a parallel group: the branch's name (the element's, in a mapped group).
    pub fn branch(&self) -> Option<&str> {
        self.branch.as_ref().map(|b| &*b.name)
    }

    /// In a branch of a mapped group: its element of the list, as JSON.
    pub fn raw_element(&self) -> Option<&Value> {
        self.branch.as_ref()?.element.as_deref()
    }

    /// In a branch of a mapped group: its element, typed. Missing or mismatched is a permanent
    /// error.
    pub fn element<T: DeserializeOwned>(&self) -> Result<T, StepError> {
        let value = self.raw_element().ok_or_else(|| {
            StepError::permanent(format!("{} is no mapped branch", self.step_name))
        })?;
        T::deserialize(value).map_err(|e| {
            StepError::permanent(format!(
                "the element of {} does not fit: {e}",
                self.step_name
            ))
        })
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

    /// The stable idempotency key of this (saga, step, phase), see [`idempotency_key`]; in a
    /// branch of a parallel group, of (saga, stage, branch, phase), see
    /// [`branch_idempotency_key`].
    pub fn idempotency_key(&self) -> Uuid {
        self.key_of(self.phase)
    }

    fn key_of(&self, phase: Phase) -> Uuid {
        let saga = self.keys_saga.unwrap_or(self.saga_id);
        match &self.branch {
            Some(b) => branch_idempotency_key(saga, &b.stage, &b.name, phase),
            None => idempotency_key(saga, self.step_index, phase),
        }
    }

    /// The saga input as JSON.
    pub fn raw_input(&self) -> &Value {
        &self.input
    }

    /// The saga input, typed. It is deserialised once per type for all the calls of a run of
    /// the saga, and shared. A mismatch is a permanent error: retrying cannot fix it.
    pub fn input<T>(&self) -> Result<Arc<T>, StepError>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        match &self.typed_input {
            Some(cache) => cache.get_or_parse::<T>(&self.input),
            None => T::deserialize(&*self.input).map(Arc::new),
        }
        .map_err(|e| StepError::permanent(format!("saga input does not fit: {e}")))
    }

    /// The output of the earlier stage `stage`, typed by the stage's declaration; see
    /// [`Stage`]. Missing or mismatched is a permanent error.
    pub fn output<T: DeserializeOwned>(&self, stage: Stage<T>) -> Result<T, StepError> {
        self.output_of(stage.name())
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
        self.key_of(Phase::Action)
    }
}
