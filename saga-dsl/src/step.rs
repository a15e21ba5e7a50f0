//! Steps: an action, usually a compensation, a kind, and their retry policies.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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

/// Garcia-Molina and Salem's step kinds, and the waits that call nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// Has an action and a compensation.
    Compensatable,
    /// Has no compensation; once it succeeds the saga can no longer go back.
    Pivot,
    /// Comes after the pivot; retried forward until it succeeds, never compensated.
    Retriable,
    /// A durable sleep ([`Step::sleep`]): calls nothing, so it has nothing to compensate, and
    /// may stand anywhere in the list.
    Sleep,
    /// A wait for a signal from outside ([`Step::signal`]): calls nothing, compensates
    /// nothing, may stand anywhere in the list.
    Signal,
    /// A parallel group ([`Step::parallel`], [`Step::map`]): its branches call, each with its
    /// own compensation; the group itself calls nothing. It stands where its branches' kind
    /// (compensatable or retriable) may.
    Parallel,
    /// A child saga ([`Step::child`]): starts another registered saga and waits for its end.
    /// Compensated by cancelling the child, or by running a completed child's compensations.
    Child,
}

impl StepKind {
    /// `compensatable`, `pivot`, `retriable` or `sleep`, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Compensatable => "compensatable",
            Self::Pivot => "pivot",
            Self::Retriable => "retriable",
            Self::Sleep => "sleep",
            Self::Signal => "signal",
            Self::Parallel => "parallel",
            Self::Child => "child",
        }
    }

    /// Whether a step of this kind calls an action itself (not a wait, not a group).
    pub const fn calls(self) -> bool {
        !matches!(
            self,
            Self::Sleep | Self::Signal | Self::Parallel | Self::Child
        )
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

/// A rule computing a `T` from the saga's input and earlier outputs, as a condition
/// ([`Step::when`]) or a sleep's length or end does.
type Rule<T> = Arc<dyn Fn(&StepContext) -> Result<T, StepError> + Send + Sync>;

/// How a sleep computes its wake time from the saga's input and earlier outputs.
#[derive(Clone)]
enum WakeRule {
    /// After this long, counted from the moment the sleep starts.
    For(Rule<Duration>),
    /// At this instant.
    Until(Rule<SystemTime>),
}

/// Checks a signal's payload and turns it into the step's output ([`Step::accept`]).
type Acceptor = Arc<dyn Fn(&StepContext, Value) -> Result<Value, StepError> + Send + Sync>;

/// What a signal step waits for.
#[derive(Clone)]
struct SignalWait {
    /// The signal's name, as in `POST /v1/sagas/{id}/signals/{signal}`.
    signal: String,
    /// How long to wait, counted from the moment the saga reaches the step; forever if `None`.
    timeout: Option<Rule<Duration>>,
    /// The output when the timeout passes without a signal; without one the step fails.
    default: Option<Value>,
    /// Checks the payload; the identity when `None`.
    accept: Option<Acceptor>,
}

/// The most branches one parallel group may have: a mapped list longer than this fails the
/// group with a clear error rather than flooding the participants and the log.
pub const MAX_BRANCHES: usize = 1000;

/// How many branches of a mapped group run at once unless [`Step::max_concurrency`] says.
pub const DEFAULT_MAP_CONCURRENCY: usize = 16;

/// A branch of a parallel group as one saga has it: its name, and its element of the list for
/// a mapped group.
pub type BranchOf = (String, Option<Value>);

/// Names a mapped branch after its element.
type BranchName = Arc<dyn Fn(&Value) -> Result<String, StepError> + Send + Sync>;

/// Where a parallel group's branches come from.
#[derive(Clone)]
enum Branches {
    /// Listed in the definition.
    Static(Vec<Step>),
    /// One per element of a list computed when the saga reaches the group.
    Mapped {
        list: Rule<Vec<Value>>,
        name: BranchName,
        template: Box<Step>,
    },
}

/// What a child stage starts.
#[derive(Clone)]
struct ChildSaga {
    /// The registered saga it starts (its latest version).
    saga: String,
    /// The child's input, computed from this saga's input and earlier outputs.
    input: Rule<Value>,
}

/// A parallel group.
#[derive(Clone)]
struct Group {
    branches: Branches,
    max_concurrency: usize,
}

/// One step of a saga: build it with [`Step::compensatable`], [`Step::pivot`],
/// [`Step::retriable`] or one of the sleeps ([`Step::sleep`], [`Step::sleep_for`],
/// [`Step::sleep_until`]), then adjust its policies and, if it should not always run, give it a
/// condition ([`Step::when`]).
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
    pub(crate) action: Option<Arc<dyn Action>>,
    pub(crate) compensation: Option<Arc<dyn Compensation>>,
    wake: Option<WakeRule>,
    signal: Option<SignalWait>,
    group: Option<Arc<Group>>,
    child: Option<ChildSaga>,
    condition: Option<Rule<bool>>,
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
            .field("conditional", &self.condition.is_some())
            .finish_non_exhaustive()
    }
}

impl Step {
    fn with_kind(
        name: impl Into<String>,
        kind: StepKind,
        action: Option<Arc<dyn Action>>,
        compensation: Option<Arc<dyn Compensation>>,
        retry: RetryPolicy,
    ) -> Self {
        Self {
            name: name.into(),
            kind,
            action,
            compensation,
            wake: None,
            signal: None,
            group: None,
            child: None,
            condition: None,
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
            Some(Arc::new(action)),
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
            Some(Arc::new(action)),
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
            Some(Arc::new(action)),
            None,
            RetryPolicy::forever(),
        )
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
    /// let pause = Step::sleep("cooling_off", Duration::from_secs(600));
    /// assert_eq!(pause.kind(), StepKind::Sleep);
    /// ```
    pub fn sleep(name: impl Into<String>, duration: Duration) -> Self {
        Self::sleep_for(name, move |_: &StepContext| Ok(duration))
    }

    /// A durable sleep whose length is computed from the saga's input and earlier outputs when
    /// the saga reaches it (say, a cooling-off period the order carries). An error fails the
    /// step as an action's error would.
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
        duration: impl Fn(&StepContext) -> Result<Duration, StepError> + Send + Sync + 'static,
    ) -> Self {
        let mut step = Self::with_kind(name, StepKind::Sleep, None, None, RetryPolicy::new());
        step.wake = Some(WakeRule::For(Arc::new(duration)));
        step
    }

    /// A durable sleep until an instant computed from the saga's input and earlier outputs
    /// (the start of the next business day, a booking's check-in time). An instant already
    /// past ends the sleep at once.
    pub fn sleep_until(
        name: impl Into<String>,
        instant: impl Fn(&StepContext) -> Result<SystemTime, StepError> + Send + Sync + 'static,
    ) -> Self {
        let mut step = Self::with_kind(name, StepKind::Sleep, None, None, RetryPolicy::new());
        step.wake = Some(WakeRule::Until(Arc::new(instant)));
        step
    }

    /// A wait for the signal `signal`, sent with `POST /v1/sagas/{id}/signals/{signal}` and a
    /// JSON payload (a payment provider's webhook, a person's approval). The payload is the
    /// step's output. A signal sent before the saga reaches the step is kept and taken when it
    /// does; the first signal of a name wins. No worker waits meanwhile.
    ///
    /// Without [`signal_timeout`](Self::signal_timeout) the saga waits as long as it takes (a
    /// cancel before the point of no return still compensates it at once). When the timeout
    /// passes, the step takes its [`default_payload`](Self::default_payload) if it has one, and
    /// otherwise fails permanently (so the steps before are compensated).
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
    /// assert_eq!(approval.signal_name(), Some("approval"));
    /// ```
    pub fn signal(name: impl Into<String>, signal: impl Into<String>) -> Self {
        let mut step = Self::with_kind(name, StepKind::Signal, None, None, RetryPolicy::new());
        step.signal = Some(SignalWait {
            signal: signal.into(),
            timeout: None,
            default: None,
            accept: None,
        });
        step
    }

    /// For a signal step: wait at most `timeout` (no effect on other steps).
    pub fn signal_timeout(self, timeout: Duration) -> Self {
        self.signal_timeout_from(move |_| Ok(timeout))
    }

    /// For a signal step: wait at most as long as `timeout` computes from the saga's input and
    /// earlier outputs when the saga reaches the step (an order's own approval window).
    pub fn signal_timeout_from(
        mut self,
        timeout: impl Fn(&StepContext) -> Result<Duration, StepError> + Send + Sync + 'static,
    ) -> Self {
        if let Some(wait) = &mut self.signal {
            wait.timeout = Some(Arc::new(timeout));
        }
        self
    }

    /// For a signal step: the output to go on with when the timeout passes without a signal,
    /// instead of failing.
    pub fn default_payload(mut self, payload: Value) -> Self {
        if let Some(wait) = &mut self.signal {
            wait.default = Some(payload);
        }
        self
    }

    /// For a signal step: checks the payload that arrived (or the default) and returns the
    /// step's output; an error fails the step as an action's error would (a permanent one
    /// compensates the steps before). Without it the payload is the output as it is.
    pub fn accept(
        mut self,
        accept: impl Fn(&StepContext, Value) -> Result<Value, StepError> + Send + Sync + 'static,
    ) -> Self {
        if let Some(wait) = &mut self.signal {
            wait.accept = Some(Arc::new(accept));
        }
        self
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
    /// let ship = Step::child("arrange_delivery", "book_rider", |ctx| {
    ///     Ok(json!({"order": ctx.raw_input()["order_id"]}))
    /// });
    /// assert_eq!(ship.kind(), StepKind::Child);
    /// assert_eq!(ship.child_saga(), Some("book_rider"));
    /// ```
    pub fn child(
        name: impl Into<String>,
        saga: impl Into<String>,
        input: impl Fn(&StepContext) -> Result<Value, StepError> + Send + Sync + 'static,
    ) -> Self {
        let mut step = Self::with_kind(name, StepKind::Child, None, None, RetryPolicy::new());
        step.child = Some(ChildSaga {
            saga: saga.into(),
            input: Arc::new(input),
        });
        step
    }

    /// For a child stage: the name of the saga it starts.
    pub fn child_saga(&self) -> Option<&str> {
        self.child.as_ref().map(|c| c.saga.as_str())
    }

    /// For a child stage: the child's input, computed for the saga `ctx` describes.
    pub fn child_input(&self, ctx: &StepContext) -> Option<Result<Value, StepError>> {
        self.child.as_ref().map(|c| (c.input)(ctx))
    }

    /// For a signal step: the name of the signal it waits for.
    pub fn signal_name(&self) -> Option<&str> {
        self.signal.as_ref().map(|w| w.signal.as_str())
    }

    /// For a signal step that waits at most some time: when it stops waiting, if it starts
    /// waiting at `now`. `None` for a step that waits forever or is no signal step.
    pub fn signal_deadline(
        &self,
        ctx: &StepContext,
        now: SystemTime,
    ) -> Option<Result<SystemTime, StepError>> {
        let rule = self.signal.as_ref()?.timeout.as_ref()?;
        Some(rule(ctx).and_then(|d| {
            now.checked_add(d)
                .ok_or_else(|| StepError::permanent(format!("a timeout of {d:?} never ends")))
        }))
    }

    /// For a signal step: its output when its timeout passes, if it has one.
    pub fn signal_default(&self) -> Option<&Value> {
        self.signal.as_ref()?.default.as_ref()
    }

    /// For a signal step: the output for `payload` (see [`Step::accept`]).
    pub fn accept_signal(&self, ctx: &StepContext, payload: Value) -> Result<Value, StepError> {
        match self.signal.as_ref().and_then(|w| w.accept.as_ref()) {
            Some(accept) => accept(ctx, payload),
            None => Ok(payload),
        }
    }

    /// A parallel group of the given branches, started together. Each branch is a step built
    /// with [`Step::compensatable`] (or, after the pivot, [`Step::retriable`]) whose name names
    /// the branch; each has its own retry policies, timeout and idempotency key (stable per
    /// saga, group, branch and phase: [`branch_idempotency_key`](crate::branch_idempotency_key)).
    ///
    /// The group succeeds when every branch has; its output is an object keyed by branch name.
    /// When a branch fails permanently, no branch starts any more, the branches in flight
    /// finish their call, and then every branch that succeeded or whose outcome is unknown is
    /// compensated (concurrently), then the steps before in reverse. A group holds no pivot.
    ///
    /// ```
    /// use saga_dsl::{Step, StepContext, StepError, StepKind};
    /// async fn hold(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// async fn release(_: StepContext) -> Result<(), StepError> { Ok(()) }
    /// let rooms = Step::parallel("book", [
    ///     Step::compensatable("hotel", hold, release),
    ///     Step::compensatable("flight", hold, release),
    /// ]);
    /// assert_eq!(rooms.kind(), StepKind::Parallel);
    /// ```
    pub fn parallel(name: impl Into<String>, branches: impl IntoIterator<Item = Step>) -> Self {
        let branches: Vec<Step> = branches.into_iter().collect();
        let mut step = Self::with_kind(name, StepKind::Parallel, None, None, RetryPolicy::new());
        let max_concurrency = branches.len().max(1);
        step.group = Some(Arc::new(Group {
            branches: Branches::Static(branches),
            max_concurrency,
        }));
        step
    }

    /// A parallel group with one branch per element of the list `list` computes from the saga's
    /// input and earlier outputs when the saga reaches the group, each branch named by
    /// `branch_name` from its element and running `branch` (a compensatable or retriable step
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
    /// assert_eq!(reserve_items.max_concurrency_of_group(), Some(8));
    /// ```
    pub fn map(
        name: impl Into<String>,
        list: impl Fn(&StepContext) -> Result<Vec<Value>, StepError> + Send + Sync + 'static,
        branch_name: impl Fn(&Value) -> Result<String, StepError> + Send + Sync + 'static,
        branch: Step,
    ) -> Self {
        let mut step = Self::with_kind(name, StepKind::Parallel, None, None, RetryPolicy::new());
        step.group = Some(Arc::new(Group {
            branches: Branches::Mapped {
                list: Arc::new(list),
                name: Arc::new(branch_name),
                template: Box::new(branch),
            },
            max_concurrency: DEFAULT_MAP_CONCURRENCY,
        }));
        step
    }

    /// For a parallel group: how many of its branches run at once (at least 1).
    pub fn max_concurrency(mut self, n: usize) -> Self {
        if let Some(group) = &mut self.group {
            Arc::make_mut(group).max_concurrency = n.max(1);
        }
        self
    }

    /// For a parallel group: how many of its branches run at once; `None` for other steps.
    pub fn max_concurrency_of_group(&self) -> Option<usize> {
        self.group.as_ref().map(|g| g.max_concurrency)
    }

    /// For a parallel group: its branches' names in order (with each one's element, for a
    /// mapped group), as they are for the saga `ctx` describes. `None` for other steps.
    pub fn branches(&self, ctx: &StepContext) -> Option<Result<Vec<BranchOf>, StepError>> {
        let group = self.group.as_ref()?;
        Some(match &group.branches {
            Branches::Static(steps) => Ok(steps.iter().map(|s| (s.name.clone(), None)).collect()),
            Branches::Mapped { list, name, .. } => list(ctx).and_then(|elements| {
                if elements.len() > MAX_BRANCHES {
                    return Err(StepError::permanent(format!(
                        "{} maps over {} elements; a group has at most {MAX_BRANCHES} branches",
                        self.name,
                        elements.len()
                    )));
                }
                let mut seen = std::collections::HashSet::new();
                elements
                    .into_iter()
                    .map(|element| {
                        let branch = name(&element)?;
                        if !crate::definition::valid_ident(&branch) {
                            return Err(StepError::permanent(format!(
                                "{}: the branch name {branch:?} of element {element} is not a \
                                 plain name (ASCII letters, digits, '_', '-', '.')",
                                self.name
                            )));
                        }
                        if !seen.insert(branch.clone()) {
                            return Err(StepError::permanent(format!(
                                "{}: two elements are both named {branch:?}",
                                self.name
                            )));
                        }
                        Ok((branch, Some(element)))
                    })
                    .collect()
            }),
        })
    }

    /// For a parallel group: the step the branch `branch` runs (for a mapped group, the same
    /// for every branch). `None` for other steps and unknown branches.
    pub fn branch(&self, branch: &str) -> Option<&Step> {
        match &self.group.as_ref()?.branches {
            Branches::Static(steps) => steps.iter().find(|s| s.name == branch),
            Branches::Mapped { template, .. } => Some(template),
        }
    }

    /// The kind this step ranks as in the order of a definition (compensatable steps, at most
    /// one pivot, retriable steps): its own, or a group's branches'. `None` for a wait, which
    /// may stand anywhere.
    pub fn rank_kind(&self) -> Option<StepKind> {
        match self.kind {
            StepKind::Sleep | StepKind::Signal | StepKind::Child => None,
            StepKind::Parallel => self.group_steps().first().map(|s| s.kind),
            kind => Some(kind),
        }
    }

    /// A group's branch steps (the template of a mapped one); empty for other steps.
    pub(crate) fn group_steps(&self) -> Vec<&Step> {
        match self.group.as_ref().map(|g| &g.branches) {
            Some(Branches::Static(steps)) => steps.iter().collect(),
            Some(Branches::Mapped { template, .. }) => vec![template],
            None => Vec::new(),
        }
    }

    /// Whether this group's branches are mapped from a list (rather than listed).
    pub fn is_mapped(&self) -> bool {
        matches!(
            self.group.as_ref().map(|g| &g.branches),
            Some(Branches::Mapped { .. })
        )
    }

    /// Runs the step only when `condition` holds. The orchestrator asks it when the saga
    /// reaches the step, with the input and the outputs of the steps before; when it is false
    /// the step is recorded as `SKIPPED` and is never compensated. An error fails the step as
    /// an action's error would (a permanent one compensates the steps before).
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

    /// Whether the step carries a condition ([`Step::when`]).
    pub fn is_conditional(&self) -> bool {
        self.condition.is_some()
    }

    /// Whether the step runs for the saga `ctx` describes: its condition, or `true` without one.
    pub fn applies(&self, ctx: &StepContext) -> Result<bool, StepError> {
        self.condition.as_ref().map_or(Ok(true), |c| c(ctx))
    }

    /// For a sleep, its wake time when it starts at `now`; `None` for a step that calls.
    pub fn wake_time(
        &self,
        ctx: &StepContext,
        now: SystemTime,
    ) -> Option<Result<SystemTime, StepError>> {
        self.wake.as_ref().map(|rule| match rule {
            WakeRule::For(duration) => duration(ctx).and_then(|d| {
                now.checked_add(d)
                    .ok_or_else(|| StepError::permanent(format!("a sleep of {d:?} never ends")))
            }),
            WakeRule::Until(instant) => instant(ctx),
        })
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

    /// The action; `None` for a sleep, which calls nothing.
    pub fn action(&self) -> Option<&Arc<dyn Action>> {
        self.action.as_ref()
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
