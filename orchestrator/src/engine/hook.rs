//! A hook around every call of an action or compensation, for test kits: `saga-test` scripts
//! each attempt's outcome with it (fail, time out, succeed late) without touching the saga's
//! own code. The engine's write-ahead, timeout and recording are the same with or without it.

use std::time::Duration;

use saga_dsl::Phase;
use uuid::Uuid;

pub use super::calls::CallFuture;

/// The call a [`CallHook`] wraps.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CallSite<'a> {
    /// The saga.
    pub saga: Uuid,
    /// Its definition's name.
    pub saga_name: &'a str,
    /// The step (or branch) whose action or compensation this is.
    pub step: &'a str,
    /// Action or compensation.
    pub phase: Phase,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// How long the engine lets the call run before its outcome is unknown.
    pub timeout: Duration,
}

/// Wraps the calls an engine makes: given the call's site and the future that would run it,
/// returns the future the engine runs instead (which may run the original, or not, and take
/// its time). Set with [`EngineConfig::call_hook`](super::EngineConfig::call_hook).
pub trait CallHook: Send + Sync + 'static {
    /// The future to run for the call at `site` in place of `run`.
    fn wrap(&self, site: &CallSite<'_>, run: CallFuture) -> CallFuture;
}

impl std::fmt::Debug for dyn CallHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallHook")
    }
}
