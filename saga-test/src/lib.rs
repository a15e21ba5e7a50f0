//! A test kit for sagas.
//!
//! [`SagaTest`] runs a registry in-process on a temporary SQLite log with a virtual clock:
//! sleeps, retry delays, timeouts, signal timeouts and scheduled starts pass at once, in order.
//! A test scripts what each attempt of a step does ([`Attempt`]), sends signals and operator
//! commands, reports for calls completed by callback as their participant would, crashes the
//! engine and reads the saga's outcome, attempt log and events ([`Ended`]).
//!
//! [`explore`] runs a saga once per write the engine makes to its step log, stopping the engine
//! just before and just after that write (as a kill -9 there would), resuming it on the same
//! log, and checking the test's invariants each time; a step completed by callback is answered
//! in every run by [`Explorer::answer_task`]:
//!
//! ```no_run
//! # fn registry(_: &()) -> saga_dsl::Registry { saga_dsl::Registry::new() }
//! use orchestrator::SagaStatus;
//! use serde_json::json;
//!
//! let report = saga_test::explore(|| {
//!     let bank = (); // the saga's participants: fakes that outlive a crash
//!     (registry(&bank), bank)
//! })
//! .start("transfer", json!({"amount": 10}))
//! .check(|ended, _bank| {
//!     assert!(matches!(ended.status(), SagaStatus::Completed | SagaStatus::Compensated));
//! })
//! .run();
//! assert!(report.runs > 1);
//! ```
//!
//! A failing case names its crash point and seed; `SAGA_TEST_CRASH=before:7` (with
//! `SAGA_TEST_SEED=N` when the exploration has several seeds) runs that case alone.

mod clock;
mod ended;
mod explore;
mod script;
mod tap;
mod world;

pub use clock::{real_io, VirtualClock, DEFAULT_START_MS};
pub use ended::Ended;
pub use explore::{explore, Explorer, Report, CRASH_ENV, SEED_ENV};
pub use script::Attempt;
pub use tap::CrashPoint;
pub use world::SagaTest;
