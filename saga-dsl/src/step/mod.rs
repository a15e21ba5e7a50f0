//! Stages: what a saga's list is made of.
//!
//! A stage is a [`Step`]: a name, an optional condition ([`Step::when`]) and what the stage
//! does, one of the variants of [`StageBody`] — a [`Call`] (an action and, usually, its
//! compensation), a [`Sleep`], a [`SignalWait`], a parallel [`Group`] or a [`ChildSaga`]. Each
//! variant carries its own data and nothing else, so a stage that makes no sense (a sleep with
//! a compensation, a pivot inside a group's branch list) cannot be expressed at all, or is
//! refused by [`SagaBuilder::build`](crate::SagaBuilder::build) with a clear error.
//!
//! The constructors ([`Step::compensatable`], [`Step::sleep`], [`Step::signal`],
//! [`Step::parallel`], [`Step::child`], …) return a `Step` typed by its variant
//! (`Step<Call>`, `Step<SignalWait>`, …), so that only the settings of that variant can be
//! adjusted ([`Step::retry`] on a call, [`Step::signal_timeout`] on a signal wait); the
//! definition's builder takes any of them.

mod call;
mod child;
mod group;
mod kind;
mod wait;

use std::sync::Arc;

use crate::{StepContext, StepError};

pub use call::{Action, Call, Compensation, DEFAULT_ATTEMPT_TIMEOUT};
pub use child::ChildSaga;
pub use group::{BranchOf, Group, DEFAULT_MAP_CONCURRENCY, MAX_BRANCHES};
pub use kind::{StageKind, StepKind, UnknownKind};
pub use wait::{SignalWait, Sleep};

/// A rule computing a `T` from the saga's input and earlier outputs, as a condition
/// ([`Step::when`]), a sleep's length or a child's input does.
pub(crate) type Rule<T> = Arc<dyn Fn(&StepContext) -> Result<T, StepError> + Send + Sync>;

/// What a stage does: one variant per kind of stage, each with its own data.
#[derive(Clone)]
#[non_exhaustive]
pub enum StageBody {
    /// An action and, for a compensatable step, its compensation.
    Call(Call),
    /// A durable sleep.
    Sleep(Sleep),
    /// A wait for a signal.
    Signal(SignalWait),
    /// A parallel group of calls.
    Parallel(Group),
    /// A child saga, started and waited for.
    Child(ChildSaga),
}

impl StageBody {
    /// The kind a stage with this body is stored and shown as.
    pub fn kind(&self) -> StepKind {
        match self {
            Self::Call(call) => call.kind(),
            Self::Sleep(_) => StepKind::Sleep,
            Self::Signal(_) => StepKind::Signal,
            Self::Parallel(_) => StepKind::Parallel,
            Self::Child(_) => StepKind::Child,
        }
    }
}

/// One stage of a saga: its name, an optional condition, and what it does (`B`: a
/// [`StageBody`] once the stage is in a definition, or one of its variants while it is being
/// built).
///
/// ```
/// use std::time::Duration;
/// use saga_dsl::{RetryPolicy, Step, StepContext, StepError, StepKind};
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
/// let stage: Step = step.into();
/// assert_eq!(stage.kind(), StepKind::Compensatable);
/// ```
#[derive(Clone)]
pub struct Step<B = StageBody> {
    name: String,
    condition: Option<Rule<bool>>,
    body: B,
}

impl<B> std::fmt::Debug for Step<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("conditional", &self.condition.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Step<B> {
    fn new(name: impl Into<String>, body: B) -> Self {
        Self {
            name: name.into(),
            condition: None,
            body,
        }
    }

    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the stage does.
    pub fn body(&self) -> &B {
        &self.body
    }

    fn map_body(mut self, f: impl FnOnce(&mut B)) -> Self {
        f(&mut self.body);
        self
    }

    /// Runs the stage only when `condition` holds. The orchestrator asks it when the saga
    /// reaches the stage, with the input and the outputs of the stages before; when it is false
    /// the stage is recorded as `SKIPPED` and is never compensated. An error fails the stage as
    /// an action's error would (a permanent one compensates the stages before).
    ///
    /// ```
    /// use saga_dsl::{Step, StepContext, StepError};
    /// #[derive(serde::Deserialize)]
    /// struct Order { amount: i64 }
    /// async fn review(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// async fn withdraw(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// let step = Step::compensatable("fraud_review", review, withdraw)
    ///     .when(|ctx| Ok(ctx.input::<Order>()?.amount >= 10_000));
    /// assert!(step.is_conditional());
    /// ```
    pub fn when(
        mut self,
        condition: impl Fn(&StepContext) -> Result<bool, StepError> + Send + Sync + 'static,
    ) -> Self {
        self.condition = Some(Arc::new(condition));
        self
    }

    /// Whether the stage carries a condition ([`Step::when`]).
    pub fn is_conditional(&self) -> bool {
        self.condition.is_some()
    }

    /// Whether the stage runs for the saga `ctx` describes: its condition, or `true` without
    /// one.
    pub fn applies(&self, ctx: &StepContext) -> Result<bool, StepError> {
        self.condition.as_ref().map_or(Ok(true), |c| c(ctx))
    }
}

macro_rules! into_stage {
    ($($variant:ident($body:ty)),+ $(,)?) => {$(
        impl From<Step<$body>> for Step {
            fn from(step: Step<$body>) -> Self {
                Step {
                    name: step.name,
                    condition: step.condition,
                    body: StageBody::$variant(step.body),
                }
            }
        }
    )+};
}

into_stage!(
    Call(Call),
    Sleep(Sleep),
    Signal(SignalWait),
    Parallel(Group),
    Child(ChildSaga),
);

impl Step {
    /// The stage's kind.
    pub fn kind(&self) -> StepKind {
        self.body.kind()
    }

    /// The call of a `Call` stage; `None` for the stages that call nothing themselves.
    pub fn call(&self) -> Option<&Call> {
        match &self.body {
            StageBody::Call(call) => Some(call),
            _ => None,
        }
    }

    /// The group of a parallel stage.
    pub fn group(&self) -> Option<&Group> {
        match &self.body {
            StageBody::Parallel(group) => Some(group),
            _ => None,
        }
    }

    /// For a signal wait: the name of the signal it waits for.
    pub fn signal_name(&self) -> Option<&str> {
        match &self.body {
            StageBody::Signal(wait) => Some(wait.signal()),
            _ => None,
        }
    }

    /// For a child stage: the name of the saga it starts.
    pub fn child_saga(&self) -> Option<&str> {
        match &self.body {
            StageBody::Child(child) => Some(child.saga()),
            _ => None,
        }
    }

    /// The kind this stage ranks as in the order of a definition (compensatable steps, at
    /// most one pivot, retriable steps): a call's own, or a group's branches'. `None` for a
    /// wait or a child, which may stand anywhere.
    pub fn rank_kind(&self) -> Option<StepKind> {
        match &self.body {
            StageBody::Call(call) => Some(call.kind()),
            StageBody::Parallel(group) => group.branch_kind(),
            _ => None,
        }
    }
}

// The constructors of every kind of stage, on `Step` so that a definition reads as a list of
// `Step::…` whatever each stage is.
impl Step {
    /// A step with an action and the compensation that undoes it.
    pub fn compensatable(
        name: impl Into<String>,
        action: impl Action,
        compensation: impl Compensation,
    ) -> Step<Call> {
        Step::new(name, Call::compensatable(action, compensation))
    }

    /// The point of no return: an action without compensation. Steps before it are compensated
    /// if it fails; steps after it must be retriable.
    pub fn pivot(name: impl Into<String>, action: impl Action) -> Step<Call> {
        Step::new(name, Call::pivot(action))
    }

    /// A step after the pivot: retried until it succeeds (its default policy has no attempt
    /// budget), never compensated. A permanent error makes the saga `FAILED`.
    pub fn retriable(name: impl Into<String>, action: impl Action) -> Step<Call> {
        Step::new(name, Call::retriable(action))
    }

    /// A durable sleep of a fixed `duration`, counted from the moment the saga reaches it.
    ///
    /// The wake time is written to the log when the sleep starts; no worker waits meanwhile,
    /// and a restart neither restarts nor loses the sleep. A cancel of a saga asleep before its
    /// point of no return compensates it at once. Its output is `null`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use saga_dsl::{Step, StepKind};
    /// let pause: Step = Step::sleep("cooling_off", Duration::from_secs(600)).into();
    /// assert_eq!(pause.kind(), StepKind::Sleep);
    /// ```
    pub fn sleep(name: impl Into<String>, duration: std::time::Duration) -> Step<Sleep> {
        Step::new(name, Sleep::lasting(move |_: &StepContext| Ok(duration)))
    }

    /// A durable sleep whose length is computed from the saga's input and earlier outputs when
    /// the saga reaches it (say, a cooling-off period the order carries). An error fails the
    /// stage as an action's error would.
    ///
    /// ```
    /// use std::time::Duration;
    /// use saga_dsl::Step;
    /// #[derive(serde::Deserialize)]
    /// struct Order { cooling_off_ms: u64 }
    /// let pause = Step::sleep_for("cooling_off", |ctx| {
    ///     Ok(Duration::from_millis(ctx.input::<Order>()?.cooling_off_ms))
    /// });
    /// assert_eq!(pause.name(), "cooling_off");
    /// ```
    pub fn sleep_for(
        name: impl Into<String>,
        duration: impl Fn(&StepContext) -> Result<std::time::Duration, StepError>
            + Send
            + Sync
            + 'static,
    ) -> Step<Sleep> {
        Step::new(name, Sleep::lasting(duration))
    }

    /// A durable sleep until an instant computed from the saga's input and earlier outputs
    /// (the start of the next business day, a booking's check-in time). An instant already
    /// past ends the sleep at once.
    pub fn sleep_until(
        name: impl Into<String>,
        instant: impl Fn(&StepContext) -> Result<std::time::SystemTime, StepError>
            + Send
            + Sync
            + 'static,
    ) -> Step<Sleep> {
        Step::new(name, Sleep::until(instant))
    }

    /// A wait for the signal `signal`, sent with `POST /v1/sagas/{id}/signals/{signal}` and a
    /// JSON payload (a payment provider's webhook, a person's approval). The payload is the
    /// stage's output. A signal sent before the saga reaches the stage is kept and taken when
    /// it does; the first signal of a name wins. No worker waits meanwhile.
    ///
    /// Without [`signal_timeout`](Step::signal_timeout) the saga waits as long as it takes (a
    /// cancel before the point of no return still compensates it at once). When the timeout
    /// passes, the stage takes its [`default_payload`](Step::default_payload) if it has one,
    /// and otherwise fails permanently (so the stages before are compensated).
    ///
    /// ```
    /// use std::time::Duration;
    /// use saga_dsl::{Step, StepError};
    /// let approval = Step::signal("await_approval", "approval")
    ///     .signal_timeout(Duration::from_secs(3600))
    ///     .accept(|_ctx, payload| {
    ///         if payload["approved"] == true {
    ///             Ok(payload)
    ///         } else {
    ///             Err(StepError::permanent(format!("not approved by {}", payload["by"])))
    ///         }
    ///     });
    /// assert_eq!(approval.body().signal(), "approval");
    /// ```
    pub fn signal(name: impl Into<String>, signal: impl Into<String>) -> Step<SignalWait> {
        Step::new(name, SignalWait::new(signal.into()))
    }

    /// A child saga: starts the registered saga `saga` (its latest version) with the input
    /// `input` computes from this saga's input and earlier outputs, and waits, holding no
    /// worker, until the child ends. The child's id is derived from this saga's id and the
    /// stage's name ([`crate::child_saga_id`]), so a crash never starts two.
    ///
    /// A child that completes makes the stage succeed with the child's output; one that ends
    /// otherwise (compensated, failed, aborted) fails the stage permanently. When this saga
    /// goes back, a running child is cancelled and a completed one has its compensations run;
    /// so a child stage before the point of no return may start only sagas without a pivot.
    ///
    /// ```
    /// use saga_dsl::{Step, StepKind};
    /// use serde_json::json;
    /// let ship: Step = Step::child("arrange_delivery", "book_rider", |ctx| {
    ///     Ok(json!({"order": ctx.raw_input()["order_id"]}))
    /// })
    /// .into();
    /// assert_eq!(ship.kind(), StepKind::Child);
    /// assert_eq!(ship.child_saga(), Some("book_rider"));
    /// ```
    pub fn child(
        name: impl Into<String>,
        saga: impl Into<String>,
        input: impl Fn(&StepContext) -> Result<serde_json::Value, StepError> + Send + Sync + 'static,
    ) -> Step<ChildSaga> {
        Step::new(name, ChildSaga::new(saga.into(), Arc::new(input)))
    }

    /// A parallel group of the given branches, started together. Each branch is a call built
    /// with [`Step::compensatable`] (or, after the pivot, [`Step::retriable`]) whose name names
    /// the branch; each has its own retry policies, timeout and idempotency key (stable per
    /// saga, group, branch and phase: [`branch_idempotency_key`](crate::branch_idempotency_key)).
    ///
    /// The group succeeds when every branch has; its output is an object keyed by branch name.
    /// When a branch fails permanently, no branch starts any more, the branches in flight
    /// finish their call, and then every branch that succeeded or whose outcome is unknown is
    /// compensated (concurrently), then the stages before in reverse. A group holds no pivot.
    ///
    /// ```
    /// use saga_dsl::{Step, StepContext, StepError, StepKind};
    /// async fn hold(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// async fn release(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// let rooms: Step = Step::parallel("book", [
    ///     Step::compensatable("hotel", hold, release),
    ///     Step::compensatable("flight", hold, release),
    /// ])
    /// .into();
    /// assert_eq!(rooms.kind(), StepKind::Parallel);
    /// ```
    pub fn parallel(
        name: impl Into<String>,
        branches: impl IntoIterator<Item = Step<Call>>,
    ) -> Step<Group> {
        Step::new(name, Group::listed(branches.into_iter().collect()))
    }

    /// A parallel group with one branch per element of the list `list` computes from the saga's
    /// input and earlier outputs when the saga reaches the group, each branch named by
    /// `branch_name` from its element and running `branch` (a compensatable or retriable call
    /// whose own name is not used). The branch's call finds its element with
    /// [`StepContext::element`]. At most [`DEFAULT_MAP_CONCURRENCY`] branches run at once
    /// unless [`Step::max_concurrency`] says otherwise; a list of more than [`MAX_BRANCHES`]
    /// elements, two elements with one name, or a name that is not a plain name
    /// (ASCII letters, digits, `_`, `-`, `.`) fails the group permanently. An empty list
    /// succeeds at once. Otherwise as [`Step::parallel`].
    ///
    /// ```
    /// use saga_dsl::{Step, StepContext, StepError};
    /// #[derive(serde::Deserialize)]
    /// struct Item { sku: String, qty: u32 }
    /// async fn reserve(ctx: StepContext) -> Result<(), StepError> {
    ///     let item: Item = ctx.element()?;
    ///     Ok(())
    /// }
    /// async fn release(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// let reserve_items = Step::map(
    ///     "reserve_items",
    ///     |ctx| Ok(ctx.raw_input()["items"].as_array().cloned().unwrap_or_default()),
    ///     |item| Ok(item["sku"].as_str().unwrap_or_default().to_owned()),
    ///     Step::compensatable("reserve", reserve, release),
    /// )
    /// .max_concurrency(8);
    /// assert_eq!(reserve_items.body().max_concurrency(), 8);
    /// ```
    pub fn map(
        name: impl Into<String>,
        list: impl Fn(&StepContext) -> Result<Vec<serde_json::Value>, StepError> + Send + Sync + 'static,
        branch_name: impl Fn(&serde_json::Value) -> Result<String, StepError> + Send + Sync + 'static,
        branch: Step<Call>,
    ) -> Step<Group> {
        Step::new(
            name,
            Group::mapped(Arc::new(list), Arc::new(branch_name), branch),
        )
    }
}
