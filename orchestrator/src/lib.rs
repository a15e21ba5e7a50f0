//! # orchestrator: a saga orchestrator with a durable step log
//!
//! Runs sagas defined with [`saga_dsl`]: ordered steps, each an action and usually a
//! compensation. The [`Engine`] writes every step's status to the [`store`] before and after each
//! call, so after a crash it resumes forward, or runs the compensations in reverse, retrying them
//! with the same idempotency keys until they succeed.
//!
//! ## Modules
//!
//! The layers run one way: [`saga_dsl`] ← [`model`] ← [`store`] ← [`engine`] ← [`operations`] ← `http` /
//! `cli` / `server` (the last three behind the `server` and `cli` features).
//!
//! - [`model`]: the records of the step log (sagas, steps, attempts, events).
//! - [`store`]: the [`Store`] trait and its two implementations, `store::SqliteStore` and
//!   `store::PgStore` (the `sqlite` and `postgres` features).
//! - [`engine`]: starting, claiming, leasing and driving sagas; [`engine::plan`] holds the rules.
//! - [`operations`]: the commands that change a saga from outside (cancel, abort, retry,
//!   mark-compensated, signal), each with its rules, audit and span, called by the HTTP API
//!   and both paths of the CLI.
//! - `http`: the HTTP API (axum); `server`: the library entry point that runs it all
//!   (`Orchestrator`).
//! - `cli`: the operator commands shared by `saga` and application binaries.
//! - [`relay`]: the outbox relay every destination shares (the event's document, the cursor,
//!   the loop and its lag gauges); its destinations: `webhooks`, the signed webhook
//!   deliveries, and [`broker`], the message-broker targets (NATS JetStream).
//! - [`consumer`]: the idempotent-consumer helper for participants' own handlers.
//! - `participants`: an action or compensation declared as an HTTP request to a participant
//!   (keys, trace, signature, the answer mapped to success, retry or failure; callback safety
//!   for URLs built from a saga's data).
//! - [`telemetry`]: traces of sagas over OpenTelemetry (OTLP/HTTP).
//!
//! ## Cargo features
//!
//! `sqlite` and `postgres` (the stores), `server` (the HTTP API, console, webhooks and
//! `Orchestrator`), `cli` (the operator commands and `saga`), `nats` (the JetStream target),
//! `otel` (the OTLP exporter), and `full` for all; the defaults are `sqlite`, `server` and
//! `cli`. The engine alone on SQLite is `default-features = false, features = ["sqlite"]`.
//!
//! ## Where to look
//!
//! - **Where a step's status is written.** The engine's driver (`engine::driver`) turns each
//!   decision into a [`store::Transition`] (the write-ahead before a call, the result after it)
//!   and hands it to [`Store::apply`](crate::store::EngineLog::apply). Both stores queue it in the write queue
//!   (`store::write_queue`), which commits the waiting writes of many sagas in one transaction
//!   through the backend's batch writer: `store::sqlite::writer_rows` (prepared statements, row
//!   by row) or `store::postgres::writer` (one statement over column arrays).
//! - **Where a lease is checked.** In those writers, by the saga row's update: `WHERE id = …
//!   AND lease_owner = … AND lease_epoch = …`, a condition written once (`store::fence`) and
//!   composed into `FENCE` in `store::sqlite::writer_rows` and the `fenced` CTE in
//!   `store::postgres::writer`; a saga's other rows are written only if it matched. A claim bumps the epoch (each backend's `claim`), and so do the operator commands
//!   that take a saga over (`store::shared::operator`).
//! - **Where a compensation is scheduled.** [`engine::plan::settle`] turns the saga to
//!   `COMPENSATING` after a permanent failure or an accepted cancel, and
//!   [`engine::plan::next_call`] then picks the highest step still needing compensation; the
//!   driver writes it ahead and runs it like an action.
//! - **How each stage kind advances.** The definition's stage is a `saga_dsl::StageBody`
//!   (a call, a sleep, a signal wait, a group, a child saga); the engine's `engine::stages`
//!   has one module per kind implementing `StageRules` (`needs` the fact it reads from the
//!   store, `advance` going forward, `undo` going back), matched to the body in one place
//!   (`by_kind!`). The rules are pure: they return an `engine::decision::Decision`, which
//!   `engine::effects` applies. A call is written ahead and run by the driver; the others
//!   decide without a call and are written with the next write.
//! - **Where a command from outside changes a saga.** [`operations`]: cancel, abort, retry,
//!   mark-compensated and signal, each one file, with their rules in `model::rules`; the HTTP
//!   handlers and the CLI only parse and render.
//! - **What differs between SQLite and PostgreSQL.** Only what is in `store::sqlite` and
//!   `store::postgres`: connecting, the batch writer, claims and due scans, keyed starts,
//!   reading the outbox in commit order. Everything else is written once in `store::shared`.

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!(
    "the orchestrator needs a store: enable the \"sqlite\" or the \"postgres\" feature \
     (e.g. `features = [\"sqlite\"]`)"
);

pub mod broker;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod client;
pub mod clock;
pub mod consumer;
#[cfg(any(feature = "server", feature = "cli"))]
pub mod discovery;
pub mod engine;
pub mod failpoint;
#[cfg(feature = "server")]
pub mod http;
#[cfg(any(feature = "server", feature = "cli"))]
pub mod logs;
pub mod model;
pub mod operations;
#[cfg(feature = "server")]
pub mod participants;
pub mod relay;
pub mod retention;
pub mod schedules;
#[cfg(feature = "server")]
pub mod server;
pub mod store;
pub mod telemetry;
#[cfg(feature = "server")]
pub mod webhooks;

pub use engine::{Engine, EngineConfig, StartError, StartKey, StartOutcome, StartRequest, Started};
pub use model::{Saga, SagaStatus, StepStatus};
#[cfg(feature = "server")]
pub use server::{Orchestrator, OrchestratorBuilder, ServeArgs, ServeError, Server};
pub use store::{Store, StoreError};
