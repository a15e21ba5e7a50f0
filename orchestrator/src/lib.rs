//! # orchestrator: a saga orchestrator with a durable step log
//!
//! Runs sagas defined with [`saga_dsl`]: ordered steps, each an action and usually a
//! compensation. The [`Engine`] writes every step's status to the [`store`] before and after each
//! call, so after a crash it resumes forward, or runs the compensations in reverse, retrying them
//! with the same idempotency keys until they succeed.
//!
//! ## Modules
//!
//! - [`model`]: the records of the step log (sagas, steps, attempts, events).
//! - [`store`]: the [`Store`](store::Store) trait and its SQLite implementation.
//! - [`engine`]: claiming, leasing and driving sagas; [`engine::plan`] holds the rules.
//! - [`http`]: the HTTP API (axum).
//! - [`cli`]: the operator commands shared by `saga` and application binaries.
//! - [`webhooks`]: the outbox relay and its signed webhook deliveries.
//! - [`consumer`]: the idempotent-consumer helper for participants' own handlers.

pub mod cli;
pub mod client;
pub mod clock;
pub mod consumer;
pub mod engine;
pub mod failpoint;
pub mod http;
pub mod model;
pub mod server;
pub mod store;
pub mod webhooks;

pub use engine::{Engine, EngineConfig, StartError, StartKey, StartOutcome, StartRequest, Started};
pub use model::{Saga, SagaStatus, StepStatus};
pub use server::{Orchestrator, OrchestratorBuilder, ServeArgs, ServeError, Server};
pub use store::{Store, StoreError};
