//! # saga-dsl: define sagas in Rust
//!
//! A **saga** is a business action that spans several services where one database transaction is
//! impossible: reserve stock, charge a card, book a rider. It is written here as an ordered list of
//! [`Step`]s. Each step has an **action** and, usually, a **compensation** that undoes it. The
//! orchestrator (the `orchestrator` crate) runs the actions in order, writing every step's status
//! to a durable log before and after each call; when an action fails for good it runs the
//! compensations of the steps that succeeded, in reverse order, retrying them until they succeed.
//!
//! ## Quick start
//!
//! ```
//! use saga_dsl::{JsonSchema, Registry, RetryPolicy, SagaDefinition, Step, StepContext, StepError};
//! use serde::{Deserialize, Serialize};
//!
//! // The input's JSON Schema is served to clients (`GET /v1/definitions`, the OpenAPI
//! // document); the attribute points the derive at the `schemars` that saga_dsl re-exports.
//! #[derive(Deserialize, JsonSchema)]
//! #[schemars(crate = "saga_dsl::schemars")]
//! struct Order { order_id: String, amount: i64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Charge { charge_id: String }
//!
//! async fn charge(ctx: StepContext) -> Result<Charge, StepError> {
//!     let order = ctx.input::<Order>()?; // deserialised once per run of the saga
//!     // Hand the stable key to the provider: a retry after a lost reply cannot charge twice.
//!     let key = ctx.idempotency_key();
//!     Ok(Charge { charge_id: format!("ch_{key}_{}", order.amount) })
//! }
//!
//! async fn refund(ctx: StepContext) -> Result<(), StepError> {
//!     // A compensation sees its own action's output (None if that outcome is unknown).
//!     let _charge: Option<Charge> = ctx.action_output()?;
//!     Ok(())
//! }
//!
//! async fn notify(_ctx: StepContext) -> Result<(), StepError> { Ok(()) }
//!
//! let saga = SagaDefinition::builder("checkout", 1)
//!     .input::<Order>()
//!     .step(Step::compensatable("charge", charge, refund)
//!         .retry(RetryPolicy::new().with_max_attempts(3)))
//!     .step(Step::pivot("ship", notify))
//!     .step(Step::retriable("email", notify))
//!     .build()?;
//!
//! let mut registry = Registry::new();
//! registry.register(saga)?;
//! # Ok::<(), saga_dsl::DefinitionError>(())
//! ```
//!
//! ## Concepts
//!
//! - **Step kinds** ([`StepKind`]): *compensatable* steps come first, then at most one *pivot* (no
//!   compensation: the point of no return), then *retriable* steps that are retried until they
//!   succeed and never compensated. [`SagaBuilder::build`] rejects any other order.
//! - **Errors** ([`StepError`]): *retryable*, *retry after a delay*, or *permanent*. A permanent
//!   error before the pivot starts compensation at once.
//! - **Retry policies** ([`RetryPolicy`]): per action and, separately, per compensation; capped
//!   exponential backoff with jitter, an attempt budget, and a per-attempt timeout on the step.
//! - **Idempotency keys** ([`idempotency_key`]): one per (saga, step, phase), stable across
//!   attempts, crashes and workers.
//! - **Inputs** ([`SagaBuilder::input`]): a typed input is checked before a saga is created
//!   (errors name the field: `items[2].qty: …`) and published as JSON Schema
//!   ([`SagaDefinition::input_schema`]).
//! - **Versions**: a saga runs on the definition it started with (name, version and step-list
//!   hash); the [`Registry`] holds every version a process can run.

pub mod attrs;
mod context;
mod definition;
mod error;
pub mod flow;
mod registry;
mod retry;
mod shared;
mod step;
mod trace;

pub use attrs::{AttrError, MAX_ATTR_NAME, MAX_ATTR_VALUE};
pub use context::{
    branch_idempotency_key, child_saga_id, idempotency_key, Phase, StepContext, TaskHandle,
};
pub use definition::{SagaBuilder, SagaDefinition, INPUT_ROOT};
pub use error::{DefinitionError, ResultExt, StepError};
pub use flow::{DeclaredLimit, FlowLimits, Rate, RateLimiter};
pub use registry::Registry;
pub use retry::RetryPolicy;
pub use shared::{InputCache, SharedState, Stage};
pub use step::{
    Action, BranchOf, Call, ChildSaga, Compensation, Group, SignalWait, Sleep, StageBody,
    StageKind, Step, StepKind, UnknownKind, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_MAP_CONCURRENCY,
    MAX_BRANCHES,
};
pub use trace::TraceContext;

/// Re-exported so that step code can name JSON values without its own dependency.
pub use serde_json::Value;

/// The JSON Schema crate of [`SagaBuilder::input`], re-exported so that an application needs
/// no dependency of its own: derive with `#[derive(JsonSchema)]` and
/// `#[schemars(crate = "saga_dsl::schemars")]`.
pub use schemars;

/// The trait (and derive macro) an input type implements; see [`SagaBuilder::input`].
pub use schemars::JsonSchema;
