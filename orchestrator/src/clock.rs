//! Time, injected: the engine and the stores ask a [`Clock`] rather than the system, so tests can
//! control timers.

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, in milliseconds since the Unix epoch (UTC).
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }
}

/// The wait before try `n + 1` after `n` failed ones (from 1): `base`, doubling each time up to
/// `max`, its upper half jittered so that many waiters do not retry in step.
pub(crate) fn backoff(
    base: std::time::Duration,
    max: std::time::Duration,
    n: u32,
) -> std::time::Duration {
    use tokio_retry::strategy::{jitter, ExponentialBackoff};
    let base_ms = u64::try_from(base.as_millis()).unwrap_or(u64::MAX);
    // `from_millis(2).factor(b / 2)` yields b, 2b, 4b, … (see STYLE.md on tokio-retry).
    let delay = ExponentialBackoff::from_millis(2)
        .factor((base_ms / 2).max(1))
        .max_delay(max)
        .nth(n.saturating_sub(1) as usize)
        .unwrap_or(max);
    delay / 2 + jitter(delay / 2)
}
