//! Steps: an action, usually a compensation, a kind, and their retry policies.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

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

/// Garcia-Molina and Salem's step kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// Has an action and a compensation.
    Compensatable,
    /// Has no compensation; once it succeeds the saga can no longer go back.
    Pivot,
    /// Comes after the pivot; retried forward until it succeeds, never compensated.
    Retriable,
}

impl StepKind {
    /// `compensatable`, `pivot` or `retriable`, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Compensatable => "compensatable",
            Self::Pivot => "pivot",
            Self::Retriable => "retriable",
        }
    }
}

impl std::fmt::Display for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The default time one attempt of an action or compensation may take before its outcome is
/// recorded as unknown.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// One step of a saga: build it with [`Step::compensatable`], [`Step::pivot`] or
/// [`Step::retriable`], then adjust its policies.
///
/// ```
/// use std::time::Duration;
/// use saga_dsl::{RetryPolicy, Step, StepContext, StepError};
///
/// async fn charge(ctx: StepContext) -> Result<String, StepError> {
///     Ok(format!("ch_{}", ctx.idempotency_key()))
/// }
/// async fn refund(_ctx: StepContext) -> Result<(), StepError> {
///     Ok(())
/// }
///
/// let step = Step::compensatable("charge_payment", charge, refund)
///     .retry(RetryPolicy::new().with_max_attempts(3))
///     .timeout(Duration::from_secs(10));
/// assert_eq!(step.name(), "charge_payment");
/// ```
#[derive(Clone)]
pub struct Step {
    pub(crate) name: String,
    pub(crate) kind: StepKind,
    pub(crate) action: Arc<dyn Action>,
    pub(crate) compensation: Option<Arc<dyn Compensation>>,
    pub(crate) retry: RetryPolicy,
    pub(crate) compensation_retry: RetryPolicy,
    pub(crate) timeout: Duration,
    pub(crate) compensation_timeout: Duration,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("retry", &self.retry)
            .field("compensation_retry", &self.compensation_retry)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Step {
    fn with_kind(
        name: impl Into<String>,
        kind: StepKind,
        action: Arc<dyn Action>,
        compensation: Option<Arc<dyn Compensation>>,
        retry: RetryPolicy,
    ) -> Self {
        Self {
            name: name.into(),
            kind,
            action,
            compensation,
            retry,
            compensation_retry: RetryPolicy::forever(),
            timeout: DEFAULT_ATTEMPT_TIMEOUT,
            compensation_timeout: DEFAULT_ATTEMPT_TIMEOUT,
        }
    }

    /// A step with an action and the compensation that undoes it.
    pub fn compensatable(
        name: impl Into<String>,
        action: impl Action,
        compensation: impl Compensation,
    ) -> Self {
        Self::with_kind(
            name,
            StepKind::Compensatable,
            Arc::new(action),
            Some(Arc::new(compensation)),
            RetryPolicy::new(),
        )
    }

    /// The point of no return: an action without compensation. Steps before it are compensated
    /// if it fails; steps after it must be retriable.
    pub fn pivot(name: impl Into<String>, action: impl Action) -> Self {
        Self::with_kind(
            name,
            StepKind::Pivot,
            Arc::new(action),
            None,
            RetryPolicy::new(),
        )
    }

    /// A step after the pivot: retried until it succeeds (its default policy has no attempt
    /// budget), never compensated. A permanent error makes the saga `FAILED`.
    pub fn retriable(name: impl Into<String>, action: impl Action) -> Self {
        Self::with_kind(
            name,
            StepKind::Retriable,
            Arc::new(action),
            None,
            RetryPolicy::forever(),
        )
    }

    /// The retry policy of the action.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The backoff of the compensation. Compensations never give up, so the policy's
    /// `max_attempts` is not a budget here: they are retried until they succeed, and the
    /// orchestrator flags the saga as needing attention after a configured number of attempts.
    pub fn compensation_retry(mut self, policy: RetryPolicy) -> Self {
        self.compensation_retry = policy;
        self
    }

    /// How long one attempt of the action may take; past it, the outcome is unknown.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long one attempt of the compensation may take.
    pub fn compensation_timeout(mut self, timeout: Duration) -> Self {
        self.compensation_timeout = timeout;
        self
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The step's kind.
    pub fn kind(&self) -> StepKind {
        self.kind
    }

    /// The action.
    pub fn action(&self) -> &Arc<dyn Action> {
        &self.action
    }

    /// The compensation, for compensatable steps.
    pub fn compensation(&self) -> Option<&Arc<dyn Compensation>> {
        self.compensation.as_ref()
    }

    /// The action's retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The compensation's backoff.
    pub fn compensation_retry_policy(&self) -> &RetryPolicy {
        &self.compensation_retry
    }

    /// The action's per-attempt timeout.
    pub fn attempt_timeout(&self) -> Duration {
        self.timeout
    }

    /// The compensation's per-attempt timeout.
    pub fn compensation_attempt_timeout(&self) -> Duration {
        self.compensation_timeout
    }
}
