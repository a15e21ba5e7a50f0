//! Saga definitions: a name, a version, a typed input and an ordered list of steps.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::attrs::{attrs_problem, values_of, AttrError, SearchAttr};
use crate::flow::{FlowLimits, MaxRunning, PerKey, Rate, RateLimiter};
use crate::{DefinitionError, Group, SharedState, Step, StepKind};

type InputCheck = Arc<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

/// How the root of an input is named in an error message when the error is about the whole
/// input rather than one of its fields (an array where an object was expected, say).
pub const INPUT_ROOT: &str = "(root)";

/// A validated saga definition. Build one with [`SagaDefinition::builder`].
///
/// The orchestrator records the name, version and [`hash`](Self::hash) of the definition with
/// every saga it starts, and only drives a saga with a definition that matches all three.
///
/// ```
/// use saga_dsl::{JsonSchema, SagaDefinition, Step, StepContext, StepError};
///
/// #[derive(serde::Deserialize, JsonSchema)]
/// #[schemars(crate = "saga_dsl::schemars")]
/// struct Order { order_id: String, amount: i64 }
///
/// async fn reserve(ctx: StepContext) -> Result<String, StepError> {
///     let order = ctx.input::<Order>()?;
///     Ok(format!("reservation for {}", order.order_id))
/// }
/// async fn release(_ctx: StepContext) -> Result<(), StepError> { Ok(()) }
/// async fn charge(ctx: StepContext) -> Result<i64, StepError> {
///     Ok(ctx.input::<Order>()?.amount)
/// }
///
/// let saga = SagaDefinition::builder("checkout", 1)
///     .input::<Order>()
///     .step(Step::compensatable("reserve", reserve, release))
///     .step(Step::pivot("charge", charge))
///     .build()
///     .expect("a valid definition");
/// assert_eq!(saga.steps().len(), 2);
/// assert!(saga.check_input(&serde_json::json!({"order_id": "o1", "amount": 5})).is_ok());
/// assert_eq!(
///     saga.check_input(&serde_json::json!({"order_id": 1})).unwrap_err(),
///     "order_id: invalid type: integer `1`, expected a string",
/// );
/// assert_eq!(saga.input_schema().get("required"), Some(&serde_json::json!(["order_id", "amount"])));
/// ```
#[derive(Clone)]
pub struct SagaDefinition {
    name: String,
    version: u32,
    steps: Vec<Step>,
    hash: String,
    input_check: InputCheck,
    input_schema: Arc<Schema>,
    state: Option<SharedState>,
    flow: FlowLimits,
    attrs: Vec<SearchAttr>,
}

impl fmt::Debug for SagaDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SagaDefinition")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("hash", &self.hash)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl SagaDefinition {
    /// Starts a definition. `version` starts at 1; bump it whenever the step list changes, so that
    /// sagas started with the old list keep running on a process that still has it.
    pub fn builder(name: impl Into<String>, version: u32) -> SagaBuilder {
        SagaBuilder {
            name: name.into(),
            version,
            steps: Vec::new(),
            input_check: Arc::new(|_| Ok(())),
            // Without `.input::<T>()` any JSON is accepted, which is the schema `true`.
            input_schema: Arc::new(Schema::from(true)),
            state: None,
            flow: FlowLimits::default(),
            attrs: Vec::new(),
        }
    }

    /// The saga's name, as used in `POST /v1/sagas/{name}`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The definition's version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// A hash of the step list (names and kinds, in order), recorded with every saga.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The child stages: their index and the saga each starts.
    pub fn children(&self) -> impl Iterator<Item = (usize, &str)> {
        self.steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.child_saga().map(|c| (i, c)))
    }

    /// Whether one of the steps waits for the signal `name`.
    pub fn waits_for_signal(&self, name: &str) -> bool {
        self.steps.iter().any(|s| s.signal_name() == Some(name))
    }

    /// The index of the point of no return: the pivot, or else the first retriable step. Once the
    /// step at this index has started, the saga can no longer be cancelled.
    pub fn point_of_no_return(&self) -> Option<usize> {
        self.steps
            .iter()
            .position(|s| matches!(s.rank_kind(), Some(StepKind::Pivot | StepKind::Retriable)))
    }

    /// Checks a saga input against the definition's input type. The error names the field
    /// that does not fit by its path, as in `items[2].qty: invalid type: string "x", expected
    /// i64` ([`INPUT_ROOT`] when the input as a whole does not fit); a missing field is named
    /// by the message itself (`missing field `user``).
    pub fn check_input(&self, input: &Value) -> Result<(), String> {
        (self.input_check)(input)
    }

    /// The input type as a JSON Schema (draft 2020-12, nested types under `$defs`), as
    /// recorded by [`SagaBuilder::input`]; `true` (any JSON) for a definition without one.
    pub fn input_schema(&self) -> &Schema {
        &self.input_schema
    }

    /// The application's state every call of this saga shares ([`SagaBuilder::state`]).
    pub fn state(&self) -> Option<&SharedState> {
        self.state.as_ref()
    }

    /// Its flow control: the concurrency limits its sagas wait for before they start and the
    /// rate limiters its steps take from (SPEC §14).
    pub fn flow(&self) -> &FlowLimits {
        &self.flow
    }

    /// The names of its search attributes ([`SagaBuilder::attr`]), in declaration order.
    pub fn attr_names(&self) -> impl Iterator<Item = &str> {
        self.attrs.iter().map(SearchAttr::name)
    }

    /// The values of its search attributes for `input`, in declaration order, an absent one
    /// left out. An empty list, allocating nothing, for a definition without attributes.
    pub fn attrs_of(&self, input: &Value) -> Result<Vec<(String, String)>, AttrError> {
        values_of(&self.attrs, input)
    }
}

/// Builds a [`SagaDefinition`]; see there for an example.
pub struct SagaBuilder {
    name: String,
    version: u32,
    steps: Vec<Step>,
    input_check: InputCheck,
    input_schema: Arc<Schema>,
    state: Option<SharedState>,
    flow: FlowLimits,
    attrs: Vec<SearchAttr>,
}

impl SagaBuilder {
    /// Declares the search attribute `name`, whose value `value` computes from the input read
    /// as a `T` (usually the type of [`input`](Self::input)): stored with the saga when it
    /// starts and indexed, so that sagas can be listed by it (`GET /v1/sagas?attr.user=ada`,
    /// `saga list --attr user=ada`), acted on in bulk and purged. The function gives a
    /// `String`, or an `Option<String>` whose `None` leaves the attribute out for that saga.
    ///
    /// A name is a lower-case ASCII letter, then lower-case letters, digits or `_`, at most
    /// [`MAX_ATTR_NAME`](crate::attrs::MAX_ATTR_NAME) bytes, and unique in the definition
    /// (checked by [`build`](Self::build)); a value longer than
    /// [`MAX_ATTR_VALUE`](crate::attrs::MAX_ATTR_VALUE) bytes refuses the start.
    ///
    /// ```
    /// use saga_dsl::{JsonSchema, SagaDefinition, Step, StepContext, StepError};
    ///
    /// #[derive(serde::Deserialize, JsonSchema)]
    /// #[schemars(crate = "saga_dsl::schemars")]
    /// struct Order { order_id: String, user: String, coupon: Option<String> }
    ///
    /// async fn pay(_: StepContext) -> Result<(), StepError> { Ok(()) }
    ///
    /// let saga = SagaDefinition::builder("checkout", 1)
    ///     .input::<Order>()
    ///     .attr("order_id", |o: &Order| o.order_id.clone())
    ///     .attr("user", |o: &Order| o.user.clone())
    ///     .attr("coupon", |o: &Order| o.coupon.clone())
    ///     .step(Step::pivot("pay", pay))
    ///     .build()?;
    /// let input = serde_json::json!({"order_id": "o-991", "user": "ada", "coupon": null});
    /// assert_eq!(
    ///     saga.attrs_of(&input).unwrap(),
    ///     [("order_id".to_owned(), "o-991".to_owned()), ("user".to_owned(), "ada".to_owned())],
    /// );
    /// # Ok::<(), saga_dsl::DefinitionError>(())
    /// ```
    pub fn attr<T, V, F>(mut self, name: impl Into<String>, value: F) -> Self
    where
        T: DeserializeOwned + 'static,
        V: Into<Option<String>>,
        F: Fn(&T) -> V + Send + Sync + 'static,
    {
        self.attrs.push(SearchAttr::new(name.into(), value));
        self
    }

    /// Gives every call of the saga the application's state (clients, pools, configuration):
    /// actions, compensations and rules read it with
    /// [`StepContext::state`](crate::StepContext::state), so no closure needs a clone of its
    /// own. One state per definition; a second call replaces the first.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    ///
    /// struct Payments { endpoint: String }
    ///
    /// async fn charge(ctx: StepContext) -> Result<String, StepError> {
    ///     let payments = ctx.state::<Payments>()?;
    ///     Ok(format!("charged through {}", payments.endpoint))
    /// }
    ///
    /// let saga = SagaDefinition::builder("pay", 1)
    ///     .state(Arc::new(Payments { endpoint: "https://psp.example".into() }))
    ///     .step(Step::pivot("charge", charge))
    ///     .build()?;
    /// assert!(saga.state().is_some());
    /// # Ok::<(), saga_dsl::DefinitionError>(())
    /// ```
    pub fn state<S: Send + Sync + 'static>(mut self, state: Arc<S>) -> Self {
        self.state = Some(state);
        self
    }

    /// Declares the input type: a start whose input does not deserialise into `T` is refused
    /// before any saga is created, and `T`'s JSON Schema becomes the definition's
    /// [`input_schema`](SagaDefinition::input_schema) (served by `GET /v1/definitions` and in
    /// the OpenAPI document of the start route).
    ///
    /// Derive [`JsonSchema`] beside `Deserialize`. `saga_dsl` re-exports the crate it comes
    /// from ([`schemars`](crate::schemars) 1.x), so no dependency of your own is needed: the
    /// derive finds the re-export through `#[schemars(crate = "saga_dsl::schemars")]` on each
    /// type it derives for, nested types included. (With `schemars = "1"` among your own
    /// dependencies the attribute can go; both name the same crate.) Serde attributes such as
    /// `#[serde(default)]`, `rename` or `deny_unknown_fields` shape the schema as they shape
    /// deserialisation, and doc comments become its descriptions.
    ///
    /// ```
    /// use saga_dsl::{JsonSchema, SagaDefinition, Step, StepContext, StepError};
    /// use serde::Deserialize;
    ///
    /// /// An order to pay for.
    /// #[derive(Deserialize, JsonSchema)]
    /// #[schemars(crate = "saga_dsl::schemars")]
    /// struct Order {
    ///     items: Vec<Item>,
    ///     #[serde(default)]
    ///     note: Option<String>,
    /// }
    ///
    /// #[derive(Deserialize, JsonSchema)]
    /// #[schemars(crate = "saga_dsl::schemars")]
    /// struct Item { sku: String, qty: u32 }
    ///
    /// async fn pay(_: StepContext) -> Result<(), StepError> { Ok(()) }
    ///
    /// let saga = SagaDefinition::builder("pay", 1).input::<Order>().step(Step::pivot("pay", pay)).build()?;
    /// let bad = serde_json::json!({"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "two"}]});
    /// assert_eq!(
    ///     saga.check_input(&bad).unwrap_err(),
    ///     r#"items[1].qty: invalid type: string "two", expected u32"#,
    /// );
    /// assert_eq!(saga.input_schema().get("required"), Some(&serde_json::json!(["items"])));
    /// # Ok::<(), saga_dsl::DefinitionError>(())
    /// ```
    pub fn input<T: DeserializeOwned + JsonSchema + 'static>(mut self) -> Self {
        self.input_check = Arc::new(|v: &Value| {
            // The plain deserialiser on the hot path; only a refused input is read again,
            // tracking the path, to say where it went wrong.
            if T::deserialize(v).is_ok() {
                return Ok(());
            }
            match serde_path_to_error::deserialize::<_, T>(v) {
                Ok(_) => Ok(()),
                Err(e) => Err(path_message(e)),
            }
        });
        // Pinned to 2020-12 (the dialect of OpenAPI 3.1) rather than schemars' default, which
        // may move to another draft in a later release.
        let schema = SchemaSettings::draft2020_12()
            .into_generator()
            .into_root_schema_for::<T>();
        self.input_schema = Arc::new(schema);
        self
    }

    /// At most `limit` sagas of this definition running at once, the limit called `name`: the
    /// others stay `QUEUED`, waiting for it, and start in priority, then start, order. A saga
    /// holds its slot from its start until it ends (while it sleeps, waits or is paused too).
    /// The orchestrator keeps the limit in its database, where an operator may change it.
    ///
    /// ```
    /// use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
    /// async fn pay(_: StepContext) -> Result<(), StepError> { Ok(()) }
    ///
    /// let saga = SagaDefinition::builder("payout", 1)
    ///     .max_running("payout_running", 50)
    ///     .per_key("payout_per_merchant", "merchant", 1)
    ///     .step(Step::pivot("pay", pay))
    ///     .build()?;
    /// assert!(saga.flow().limits_running());
    /// # Ok::<(), saga_dsl::DefinitionError>(())
    /// ```
    pub fn max_running(mut self, name: impl Into<String>, limit: u32) -> Self {
        self.flow.max_running = Some(MaxRunning {
            name: name.into(),
            limit,
        });
        self
    }

    /// At most `limit` sagas running per value of the input's field `key` (a name, or a
    /// dotted path such as `customer.id`), the limit called `name`; a start whose input has no
    /// such scalar field is refused. Fair across keys: among waiting sagas of one priority,
    /// each key's first goes before any key's second.
    pub fn per_key(mut self, name: impl Into<String>, key: impl Into<String>, limit: u32) -> Self {
        self.flow.per_key = Some(PerKey {
            name: name.into(),
            key: key.into(),
            limit,
        });
        self
    }

    /// Declares the token bucket `name` (`rate`, holding at most `burst` tokens) that steps
    /// take from with [`Step::rate_limited`](crate::Step::rate_limited). A limiter shared by
    /// several definitions is declared by each, with the same values.
    pub fn rate_limiter(mut self, name: impl Into<String>, rate: Rate, burst: u32) -> Self {
        self.flow.rate_limiters.push(RateLimiter {
            name: name.into(),
            rate,
            burst,
        });
        self
    }

    /// Appends a stage: any [`Step`], as [`Step::compensatable`], [`Step::signal`],
    /// [`Step::parallel`] and the other constructors build it.
    pub fn step(mut self, step: impl Into<Step>) -> Self {
        self.steps.push(step.into());
        self
    }

    /// Validates and returns the definition.
    pub fn build(self) -> Result<SagaDefinition, DefinitionError> {
        if !valid_ident(&self.name) {
            return Err(DefinitionError::InvalidName(self.name));
        }
        if self.version == 0 {
            return Err(DefinitionError::InvalidVersion(self.name));
        }
        if self.steps.is_empty() {
            return Err(DefinitionError::NoSteps(self.name));
        }
        let mut seen = HashSet::new();
        for step in &self.steps {
            if !valid_ident(step.name()) {
                return Err(DefinitionError::InvalidStepName {
                    saga: self.name,
                    step: step.name().to_owned(),
                });
            }
            if !seen.insert(step.name()) {
                return Err(DefinitionError::DuplicateStep {
                    saga: self.name,
                    step: step.name().to_owned(),
                });
            }
        }
        let mut signals = HashSet::new();
        for step in &self.steps {
            let Some(signal) = step.signal_name() else {
                continue;
            };
            let problem = if !valid_ident(signal) {
                "which is not a valid name: use ASCII letters, digits, '_', '-' or '.'"
            } else if !signals.insert(signal) {
                "which an earlier step waits for too; give each wait a signal of its own"
            } else {
                continue;
            };
            return Err(DefinitionError::BadSignal {
                saga: self.name,
                step: step.name().to_owned(),
                signal: signal.to_owned(),
                problem,
            });
        }
        for step in &self.steps {
            let Some(child) = step.child_saga() else {
                continue;
            };
            if !valid_ident(child) {
                return Err(DefinitionError::BadChild {
                    saga: self.name,
                    step: step.name().to_owned(),
                    problem: format!("{child:?} is not a valid saga name"),
                });
            }
        }
        for step in &self.steps {
            let Some(group) = step.group() else {
                continue;
            };
            if let Some(problem) = group_problem(group) {
                return Err(DefinitionError::BadGroup {
                    saga: self.name,
                    step: step.name().to_owned(),
                    problem,
                });
            }
        }
        // Order: compensatable*, pivot?, retriable*; waits may stand anywhere between, and a
        // group stands where its branches' kind may.
        let rank = |k: StepKind| match k {
            StepKind::Compensatable => 0,
            StepKind::Pivot => 1,
            _ => 2,
        };
        let calls: Vec<(&Step, StepKind)> = self
            .steps
            .iter()
            .filter_map(|s| s.rank_kind().map(|k| (s, k)))
            .collect();
        for pair in calls.windows(2) {
            let ((prev, prev_kind), (next, next_kind)) = (pair[0], pair[1]);
            let bad = rank(next_kind) < rank(prev_kind)
                || (next_kind == StepKind::Pivot && prev_kind == StepKind::Pivot);
            if bad {
                return Err(DefinitionError::StepOrder {
                    saga: self.name,
                    step: next.name().to_owned(),
                    kind: next_kind.as_str(),
                    after: prev.name().to_owned(),
                });
            }
        }
        if let Some(problem) = flow_problem(&self.flow, &self.steps) {
            return Err(DefinitionError::BadLimit {
                saga: self.name,
                problem,
            });
        }
        if let Some(problem) = attrs_problem(&self.attrs) {
            return Err(DefinitionError::BadAttr {
                saga: self.name,
                problem,
            });
        }
        let hash = step_list_hash(&self.name, self.version, &self.steps);
        Ok(SagaDefinition {
            name: self.name,
            version: self.version,
            steps: self.steps,
            hash,
            input_check: self.input_check,
            input_schema: self.input_schema,
            state: self.state,
            flow: self.flow,
            attrs: self.attrs,
        })
    }
}

/// What is wrong with a definition's flow control, if anything: names must be valid and
/// distinct, limits at least 1, and every limiter a step takes from declared.
fn flow_problem(flow: &FlowLimits, steps: &[Step]) -> Option<String> {
    let mut names = HashSet::new();
    let limits = flow
        .max_running
        .iter()
        .map(|m| (m.name.as_str(), m.limit))
        .chain(flow.per_key.iter().map(|p| (p.name.as_str(), p.limit)))
        .chain(
            flow.rate_limiters
                .iter()
                .map(|r| (r.name.as_str(), r.burst)),
        );
    for (name, limit) in limits {
        if !valid_ident(name) {
            return Some(format!("{name:?} is not a valid limit name"));
        }
        if !names.insert(name) {
            return Some(format!("two limits are named {name:?}"));
        }
        if limit == 0 {
            return Some(format!(
                "limit {name:?} is 0: declare at least 1 (an operator may set 0 at run time)"
            ));
        }
    }
    if let Some(per_key) = &flow.per_key {
        if per_key.key.is_empty() || per_key.key.split('.').any(str::is_empty) {
            return Some(format!(
                "limit {:?} has no key: name a field of the input",
                per_key.name
            ));
        }
    }
    if let Some(r) = flow.rate_limiters.iter().find(|r| r.rate.count() == 0) {
        return Some(format!("rate limiter {:?} has a rate of 0", r.name));
    }
    let calls = steps.iter().flat_map(|step| {
        let own = step.call().map(|call| (step.name(), call));
        let branches = step.group().into_iter().flat_map(|g| g.calls());
        own.into_iter()
            .chain(branches.map(|b| (b.name(), b.body())))
            .collect::<Vec<_>>()
    });
    for (name, call) in calls {
        let Some(limiter) = call.rate_limiter() else {
            continue;
        };
        if !flow.rate_limiters.iter().any(|r| r.name == limiter) {
            return Some(format!(
                "step {name:?} takes from the rate limiter {limiter:?}, which the definition \
                 does not declare (SagaBuilder::rate_limiter)"
            ));
        }
    }
    None
}

/// What is wrong with a parallel group's branches, if anything.
fn group_problem(group: &Group) -> Option<String> {
    let branches = group.calls();
    let Some(first) = branches.first() else {
        return Some("it has no branches".to_owned());
    };
    if !matches!(first.kind(), StepKind::Compensatable | StepKind::Retriable) {
        return Some(format!(
            "its branch {:?} is {}; branches are compensatable or retriable steps (a group \
             holds no pivot)",
            first.name(),
            first.kind()
        ));
    }
    let mut seen = HashSet::new();
    for branch in &branches {
        if branch.body().completed_by_callback() {
            return Some(format!(
                "its branch {:?} is completed by callback; a branch of a parallel group cannot \
                 be (make the callback a stage of its own)",
                branch.name()
            ));
        }
        if branch.body().pauses_when_exhausted() {
            return Some(format!(
                "its branch {:?} pauses the saga when its retries run out; a branch of a \
                 parallel group cannot (its group fails as one): give it an unlimited budget or \
                 let the group fail",
                branch.name()
            ));
        }
        if branch.kind() != first.kind() {
            return Some(format!(
                "its branches {:?} and {:?} are of different kinds",
                first.name(),
                branch.name()
            ));
        }
        if group.is_mapped() {
            continue;
        }
        if !valid_ident(branch.name()) {
            return Some(format!("its branch name {:?} is not valid", branch.name()));
        }
        if !seen.insert(branch.name()) {
            return Some(format!("two of its branches are named {:?}", branch.name()));
        }
    }
    None
}

/// `path: message`, with the path of the value that failed (`items[2].qty`), or
/// [`INPUT_ROOT`] when it is the input itself. A missing field is reported on the object that
/// lacks it, so its message names the field: `missing field `user`` at the root,
/// `simulate: missing field `x`` inside.
fn path_message(e: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let message = e.into_inner().to_string();
    if path == "." || path.is_empty() {
        if message.starts_with("missing field") {
            return message;
        }
        return format!("{INPUT_ROOT}: {message}");
    }
    format!("{path}: {message}")
}

pub(crate) fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn step_list_hash(name: &str, version: u32, steps: &[Step]) -> String {
    let mut h = Sha256::new();
    h.update(format!("{name}\n{version}\n"));
    for (i, s) in steps.iter().enumerate() {
        // A condition changes what the log may hold (a `SKIPPED` step); it is marked so that
        // definitions without one keep the hash they always had.
        let when = if s.is_conditional() { ":when" } else { "" };
        let signal = s.signal_name().map(|n| format!(":{n}")).unwrap_or_default();
        let child = s.child_saga().map(|n| format!(":{n}")).unwrap_or_default();
        let branches = if let Some(group) = s.group() {
            let branches: Vec<String> = group
                .calls()
                .iter()
                .map(|b| format!("{}:{}", b.name(), b.kind()))
                .collect();
            let mapped = if group.is_mapped() { "*" } else { "" };
            format!("[{mapped}{}]", branches.join(","))
        } else {
            String::new()
        };
        h.update(format!(
            "{i}:{}:{}{signal}{child}{branches}{when}\n",
            s.name(),
            s.kind()
        ));
    }
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StepContext, StepError};

    async fn ok(_: StepContext) -> Result<(), StepError> {
        Ok(())
    }

    fn c(name: &str) -> Step<crate::Call> {
        Step::compensatable(name, ok, ok)
    }

    #[test]
    fn rejects_invalid_definitions() {
        let err = SagaDefinition::builder("s", 1).build().unwrap_err();
        assert_eq!(err, DefinitionError::NoSteps("s".into()));

        let err = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(c("a"))
            .build()
            .unwrap_err();
        assert!(
            matches!(err, DefinitionError::DuplicateStep { .. }),
            "{err}"
        );

        let err = SagaDefinition::builder("s", 1)
            .step(Step::pivot("p", ok))
            .step(c("a"))
            .build()
            .unwrap_err();
        assert!(matches!(err, DefinitionError::StepOrder { .. }), "{err}");

        let err = SagaDefinition::builder("s", 1)
            .step(Step::pivot("p", ok))
            .step(Step::pivot("q", ok))
            .build()
            .unwrap_err();
        assert!(matches!(err, DefinitionError::StepOrder { .. }), "{err}");

        let err = SagaDefinition::builder("s", 1)
            .step(Step::retriable("r", ok))
            .step(Step::pivot("p", ok))
            .build()
            .unwrap_err();
        assert!(matches!(err, DefinitionError::StepOrder { .. }), "{err}");

        assert!(matches!(
            SagaDefinition::builder("s", 0).step(c("a")).build(),
            Err(DefinitionError::InvalidVersion(_))
        ));
        assert!(matches!(
            SagaDefinition::builder("bad name", 1).step(c("a")).build(),
            Err(DefinitionError::InvalidName(_))
        ));
    }

    #[test]
    fn a_branch_completed_by_callback_is_refused() {
        let err = SagaDefinition::builder("s", 1)
            .step(Step::parallel("book", [c("hotel").completed_by_callback()]))
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, DefinitionError::BadGroup { problem, .. } if problem.contains("completed by callback")),
            "{err}"
        );
    }

    #[test]
    fn a_branch_may_not_pause_its_saga_and_pausing_leaves_the_hash_alone() {
        let err = SagaDefinition::builder("s", 1)
            .step(Step::parallel(
                "book",
                [c("a"), c("b").pause_when_exhausted()],
            ))
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, DefinitionError::BadGroup { problem, .. }
                if problem.contains("pauses the saga when its retries run out")),
            "{err}"
        );
        let plain = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        let pausing = SagaDefinition::builder("s", 1)
            .step(c("a").pause_when_exhausted())
            .build()
            .unwrap();
        assert_eq!(
            plain.hash(),
            pausing.hash(),
            "behaviour, not the log's shape"
        );
    }

    #[test]
    fn hash_follows_the_step_list() {
        let a = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        let a2 = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        let b = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(c("b"))
            .build()
            .unwrap();
        assert_eq!(a.hash(), a2.hash());
        assert_ne!(a.hash(), b.hash());
    }

    /// A nested input, as the example sagas have.
    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)] // Only deserialised, to check inputs.
    struct Order {
        user: String,
        amount: i64,
        items: Vec<Item>,
        #[serde(default)]
        simulate: Simulate,
    }

    #[derive(serde::Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Item {
        sku: String,
        qty: u32,
    }

    #[derive(Default, serde::Deserialize, serde::Serialize, JsonSchema)]
    #[serde(default, deny_unknown_fields)]
    struct Simulate {
        delay_ms: u64,
    }

    fn order_saga() -> SagaDefinition {
        SagaDefinition::builder("s", 1)
            .input::<Order>()
            .step(c("a"))
            .build()
            .unwrap()
    }

    #[test]
    fn input_errors_name_the_field_path() {
        let s = order_saga();
        let good = serde_json::json!({
            "user": "ada", "amount": 5, "items": [{"sku": "a", "qty": 1}]
        });
        assert_eq!(s.check_input(&good), Ok(()));
        let mut bad = good.clone();
        bad["amount"] = "x".into();
        assert_eq!(
            s.check_input(&bad).unwrap_err(),
            r#"amount: invalid type: string "x", expected i64"#
        );
        let mut bad = good.clone();
        bad["items"] = serde_json::json!([{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}, {"sku": "c", "qty": 1.5}]);
        assert_eq!(
            s.check_input(&bad).unwrap_err(),
            "items[2].qty: invalid type: floating point `1.5`, expected u32"
        );
        let mut bad = good.clone();
        bad["simulate"] = serde_json::json!({"delay_ms": "slow"});
        assert_eq!(
            s.check_input(&bad).unwrap_err(),
            r#"simulate.delay_ms: invalid type: string "slow", expected u64"#
        );
        let mut bad = good.clone();
        bad.as_object_mut().unwrap().remove("user");
        assert_eq!(s.check_input(&bad).unwrap_err(), "missing field `user`");
        let mut bad = good.clone();
        bad["items"] = serde_json::json!([{"sku": "a"}]);
        assert_eq!(
            s.check_input(&bad).unwrap_err(),
            "items[0]: missing field `qty`"
        );
        assert_eq!(
            s.check_input(&serde_json::json!("order")).unwrap_err(),
            r#"(root): invalid type: string "order", expected struct Order"#
        );
    }

    #[test]
    fn input_schema_describes_the_input_type() {
        let s = order_saga();
        let schema = s.input_schema().as_value();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert_eq!(schema["type"], "object");
        assert_eq!(
            schema["required"],
            serde_json::json!(["user", "amount", "items"])
        );
        assert_eq!(schema["properties"]["user"]["type"], "string");
        assert_eq!(schema["properties"]["amount"]["type"], "integer");
        assert_eq!(schema["properties"]["items"]["type"], "array");
        // Nested types are definitions of the root schema, referenced from where they are used.
        assert_eq!(
            schema["properties"]["items"]["items"]["$ref"],
            "#/$defs/Item"
        );
        assert_eq!(
            schema["$defs"]["Item"]["required"],
            serde_json::json!(["sku", "qty"])
        );
        assert_eq!(
            schema["$defs"]["Simulate"]["additionalProperties"],
            serde_json::json!(false)
        );
    }

    #[test]
    fn a_definition_without_an_input_type_accepts_any_json() {
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        assert_eq!(s.input_schema().as_value(), &serde_json::json!(true));
        assert_eq!(s.check_input(&serde_json::json!([1, "x"])), Ok(()));
    }

    #[test]
    fn point_of_no_return() {
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(Step::pivot("p", ok))
            .step(Step::retriable("r", ok))
            .build()
            .unwrap();
        assert_eq!(s.point_of_no_return(), Some(1));
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(Step::retriable("r", ok))
            .build()
            .unwrap();
        assert_eq!(s.point_of_no_return(), Some(1));
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        assert_eq!(s.point_of_no_return(), None);
    }
}
