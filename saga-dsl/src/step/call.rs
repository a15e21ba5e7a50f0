//! A call: an action, its retry policy and timeout, and what undoes it (a compensation with
//! its own policies, or nothing for a pivot or a retriable step).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use super::{Step, StepKind};
use crate::{RetryPolicy, StepContext, StepError};

/// The forward half of a step. Any `Fn(StepContext) -> impl Future<Output = Result<T, StepError>>`
/// with a serialisable `T` is one; implement the trait by hand for a struct holding clients.
#[async_trait]
pub trait Action: Send + Sync + 'static {
    /// Runs the action once. Its output is stored in the log and given to later steps and to
    /// this step's compensation.
    async fn run(&self, ctx: StepContext) -> Result<Value, StepError>;
}

/// The undo half of a step. Any `Fn(StepContext) -> impl Future<Output = Result<(), StepError>>` is
/// one. It must be idempotent: it may run again after a crash, with the same idempotency key.
#[async_trait]
pub trait Compensation: Send + Sync + 'static {
    /// Runs the compensation once.
    async fn run(&self, ctx: StepContext) -> Result<(), StepError>;
}

#[async_trait]
impl<F, Fut, T> Action for F
where
    F: Fn(StepContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, StepError>> + Send + 'static,
    T: Serialize + Send + 'static,
{
    async fn run(&self, ctx: StepContext) -> Result<Value, StepError> {
        let out = (self)(ctx).await?;
        serde_json::to_value(out)
            .map_err(|e| StepError::permanent(format!("step output is not serialisable: {e}")))
    }
}

#[async_trait]
impl<F, Fut> Compensation for F
where
    F: Fn(StepContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), StepError>> + Send + 'static,
{
    async fn run(&self, ctx: StepContext) -> Result<(), StepError> {
        (self)(ctx).await
    }
}

/// The default time one attempt of an action or compensation may take before its outcome is
/// recorded as unknown.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// The compensation of a compensatable call, with its own backoff and timeout.
#[derive(Clone)]
struct Undo {
    run: Arc<dyn Compensation>,
    retry: RetryPolicy,
    timeout: Duration,
}

/// A call's place in Garcia-Molina and Salem's order, with the compensation only where there
/// is one.
#[derive(Clone)]
enum Role {
    Compensatable(Undo),
    Pivot,
    Retriable,
}

/// An action with its retry policy and timeout, and its compensation if it has one: the body
/// of a compensatable, pivot or retriable step, and of each branch of a parallel group.
#[derive(Clone)]
pub struct Call {
    action: Arc<dyn Action>,
    retry: RetryPolicy,
    timeout: Duration,
    role: Role,
    pause_when_exhausted: bool,
    rate_limiter: Option<String>,
    by_callback: bool,
}

impl Call {
    fn with_role(action: impl Action, retry: RetryPolicy, role: Role) -> Self {
        Self {
            action: Arc::new(action),
            retry,
            timeout: DEFAULT_ATTEMPT_TIMEOUT,
            role,
            pause_when_exhausted: false,
            rate_limiter: None,
            by_callback: false,
        }
    }

    pub(super) fn compensatable(action: impl Action, compensation: impl Compensation) -> Self {
        let undo = Undo {
            run: Arc::new(compensation),
            retry: RetryPolicy::forever(),
            timeout: DEFAULT_ATTEMPT_TIMEOUT,
        };
        Self::with_role(action, RetryPolicy::new(), Role::Compensatable(undo))
    }

    pub(super) fn pivot(action: impl Action) -> Self {
        Self::with_role(action, RetryPolicy::new(), Role::Pivot)
    }

    pub(super) fn retriable(action: impl Action) -> Self {
        Self::with_role(action, RetryPolicy::forever(), Role::Retriable)
    }

    /// `compensatable`, `pivot` or `retriable`.
    pub fn kind(&self) -> StepKind {
        match self.role {
            Role::Compensatable(_) => StepKind::Compensatable,
            Role::Pivot => StepKind::Pivot,
            Role::Retriable => StepKind::Retriable,
        }
    }

    /// The action.
    pub fn action(&self) -> &Arc<dyn Action> {
        &self.action
    }

    /// The action's retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Whether the saga pauses (`PAUSED`, flagged as needing attention) when this action's
    /// retry budget runs out, instead of compensating (or, past the point of no return,
    /// failing). See [`Step::pause_when_exhausted`].
    pub fn pauses_when_exhausted(&self) -> bool {
        self.pause_when_exhausted
    }

    /// The rate limiter each attempt of the action takes a token from, if any
    /// ([`Step::rate_limited`]).
    pub fn rate_limiter(&self) -> Option<&str> {
        self.rate_limiter.as_deref()
    }

    /// The action's per-attempt timeout.
    pub fn attempt_timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether the action's answer only acknowledges the request, its outcome coming later by
    /// callback with the attempt's task token.
    pub fn completed_by_callback(&self) -> bool {
        self.by_callback
    }

    fn undo(&self) -> Option<&Undo> {
        match &self.role {
            Role::Compensatable(undo) => Some(undo),
            Role::Pivot | Role::Retriable => None,
        }
    }

    /// The compensation, for a compensatable call.
    pub fn compensation(&self) -> Option<&Arc<dyn Compensation>> {
        self.undo().map(|u| &u.run)
    }

    /// The compensation's backoff, for a compensatable call.
    pub fn compensation_retry_policy(&self) -> Option<&RetryPolicy> {
        self.undo().map(|u| &u.retry)
    }

    /// The compensation's per-attempt timeout, for a compensatable call.
    pub fn compensation_attempt_timeout(&self) -> Option<Duration> {
        self.undo().map(|u| u.timeout)
    }
}

impl Step<Call> {
    /// The kind of the call: `compensatable`, `pivot` or `retriable`.
    pub fn kind(&self) -> StepKind {
        self.body().kind()
    }

    /// The retry policy of the action.
    pub fn retry(self, policy: RetryPolicy) -> Self {
        self.map_body(|call| call.retry = policy)
    }

    /// When the action's retry budget runs out (its attempts, or the time its policy allows
    /// with [`RetryPolicy::within`]), the saga is paused (`PAUSED`, flagged as needing
    /// attention, its error naming the step and the last error) instead of compensating or,
    /// past the point of no return, failing: a person resumes it once the cause is fixed
    /// (the step then gets a fresh budget), or cancels or aborts it. A permanent error
    /// ([`crate::StepError::Permanent`]) is no exhausted budget: it compensates (or fails) as
    /// usual.
    ///
    /// This changes what the engine does, not the shape of the log (the same steps, names and
    /// kinds), so it is not part of the definition's step-list hash: sagas started before the
    /// setting was added or removed are driven by the new definition. Not allowed on a branch
    /// of a parallel group (the definition is refused): a group's branches fail together.
    pub fn pause_when_exhausted(self) -> Self {
        self.map_body(|call| call.pause_when_exhausted = true)
    }

    /// Takes a token from the rate limiter `name` (declared on the definition with
    /// [`SagaBuilder::rate_limiter`](crate::SagaBuilder::rate_limiter)) before each attempt of
    /// the action; while none is left the step waits (`waiting_for: "rate:<name>"`), holding
    /// no worker. Compensations take none: undoing is never held back. Like
    /// [`pause_when_exhausted`](Self::pause_when_exhausted), not part of the step-list hash.
    pub fn rate_limited(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.map_body(|call| call.rate_limiter = Some(name))
    }

    /// The action is completed by its participant calling back: each attempt is given a task
    /// token ([`StepContext::task`]), the action's own answer (typically a participant's
    /// `202 Accepted`) only acknowledges the request, and the step then waits, holding no
    /// worker, until the participant calls `POST /v1/tasks/{token}/complete` (its output is
    /// the step's), `…/fail` or `…/heartbeat`. The step's [`timeout`](Self::timeout) bounds
    /// the wait from the acknowledgement, each heartbeat extends it, and a wait that runs out
    /// is an unknown outcome, retried with the same idempotency key as any call's.
    pub fn completed_by_callback(self) -> Self {
        self.map_body(|call| call.by_callback = true)
    }

    /// How long one attempt of the action may take; past it, the outcome is unknown.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.map_body(|call| call.timeout = timeout)
    }

    /// The backoff of the compensation (of a compensatable step; a pivot or retriable step has
    /// none to set). Compensations never give up, so the policy's `max_attempts` is not a
    /// budget here: they are retried until they succeed, and the orchestrator flags the saga as
    /// needing attention after a configured number of attempts.
    pub fn compensation_retry(self, policy: RetryPolicy) -> Self {
        self.map_body(|call| {
            if let Role::Compensatable(undo) = &mut call.role {
                undo.retry = policy;
            }
        })
    }

    /// How long one attempt of the compensation may take (of a compensatable step).
    pub fn compensation_timeout(self, timeout: Duration) -> Self {
        self.map_body(|call| {
            if let Role::Compensatable(undo) = &mut call.role {
                undo.timeout = timeout;
            }
        })
    }
}
