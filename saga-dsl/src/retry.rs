//! Retry policies: how often and how soon a failed action or compensation is tried again.
//!
//! The delays come from tokio-retry's [`ExponentialBackoff`] and [`jitter`]; the orchestrator does
//! not sleep on them in memory but writes the next run time into the step log, so that a crash
//! cannot reset a retry budget and a long backoff does not hold a worker.

use std::time::Duration;

use tokio_retry::strategy::{jitter, ExponentialBackoff};

/// Capped exponential backoff with optional full jitter and an attempt budget.
///
/// The delay after the `n`-th failed attempt is `initial_delay * 2^(n-1)`, capped at `max_delay`,
/// then (with jitter) drawn uniformly from `[0, delay)`. A [`crate::StepError::RetryAfter`] hint
/// raises the delay to at least the hint.
///
/// ```
/// use std::time::Duration;
/// use saga_dsl::RetryPolicy;
///
/// let policy = RetryPolicy::new()
///     .with_max_attempts(3)
///     .with_initial_delay(Duration::from_millis(100))
///     .with_jitter(false);
/// assert_eq!(policy.delay_after(1), Duration::from_millis(100));
/// assert_eq!(policy.delay_after(2), Duration::from_millis(200));
/// assert!(policy.allows_attempt(3));
/// assert!(!policy.allows_attempt(4));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The delay before the second attempt.
    pub initial_delay: Duration,
    /// No delay is ever longer than this.
    pub max_delay: Duration,
    /// The total number of attempts (the first included); `None` retries without end.
    pub max_attempts: Option<u32>,
    /// Full jitter, so that many sagas failing together do not retry together.
    pub jitter: bool,
    /// The longest a budget lasts, counted from its first attempt: no attempt starts after
    /// it (`None`: no limit). The budget ends at whichever of this and `max_attempts` runs
    /// out first.
    pub max_elapsed: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default for actions: 5 attempts, 100 ms doubling up to 30 s, with jitter.
    pub const fn new() -> Self {
        Self {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(30),
            max_attempts: Some(5),
            jitter: true,
            max_elapsed: None,
        }
    }

    /// Retries without end: the default for compensations and retriable steps.
    pub const fn forever() -> Self {
        Self {
            max_attempts: None,
            ..Self::new()
        }
    }

    /// A single attempt, no retry.
    pub const fn no_retry() -> Self {
        Self {
            max_attempts: Some(1),
            ..Self::new()
        }
    }

    /// Sets the total number of attempts (at least 1).
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(if attempts == 0 { 1 } else { attempts });
        self
    }

    /// Removes the attempt budget.
    pub const fn with_unlimited_attempts(mut self) -> Self {
        self.max_attempts = None;
        self
    }

    /// Sets the delay before the second attempt.
    pub const fn with_initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }

    /// Caps every delay.
    pub const fn with_max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Turns full jitter on or off.
    pub const fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// Limits the whole budget to `limit`, counted from its first attempt: once that much time
    /// has passed no further attempt starts, even with attempts left. For an action whose
    /// step pauses the saga when its retries run out, a resume starts a fresh budget: its
    /// time counts from the resume.
    ///
    /// ```
    /// use std::time::Duration;
    /// use saga_dsl::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new().with_max_attempts(5).within(Duration::from_secs(10));
    /// assert!(policy.allows_attempt_after(3, Duration::from_secs(9)));
    /// assert!(!policy.allows_attempt_after(3, Duration::from_secs(10)));
    /// assert!(!policy.allows_attempt_after(6, Duration::ZERO));
    /// ```
    pub const fn within(mut self, limit: Duration) -> Self {
        self.max_elapsed = Some(limit);
        self
    }

    /// Whether attempt number `attempt` (1-based) may be made.
    pub fn allows_attempt(&self, attempt: u32) -> bool {
        self.max_attempts.is_none_or(|max| attempt <= max)
    }

    /// Whether attempt number `attempt` of a budget (1-based, counted within the budget) may
    /// start `elapsed` after the budget's first attempt: both limits must allow it.
    pub fn allows_attempt_after(&self, attempt: u32, elapsed: Duration) -> bool {
        self.allows_attempt(attempt) && self.max_elapsed.is_none_or(|limit| elapsed < limit)
    }

    /// The delay to wait after failed attempt number `failed_attempt` (1-based).
    pub fn delay_after(&self, failed_attempt: u32) -> Duration {
        // `from_millis(2).factor(f)` yields 2f, 4f, 8f…: the first delay is `initial_delay`.
        let factor = (self.initial_delay.as_millis().max(2) / 2) as u64;
        let step = failed_attempt.saturating_sub(1) as usize;
        let delay = ExponentialBackoff::from_millis(2)
            .factor(factor)
            .max_delay(self.max_delay)
            .nth(step)
            .unwrap_or(self.max_delay)
            .min(self.max_delay);
        if self.jitter {
            jitter(delay)
        } else {
            delay
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_cap() {
        let p = RetryPolicy::new()
            .with_jitter(false)
            .with_initial_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_millis(500));
        let got: Vec<_> = (1..=5).map(|n| p.delay_after(n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
        // Far past any overflow, still capped.
        assert_eq!(p.delay_after(200), Duration::from_millis(500));
    }

    #[test]
    fn jitter_stays_below_the_cap() {
        let p = RetryPolicy::new().with_max_delay(Duration::from_millis(300));
        for n in 1..20 {
            assert!(p.delay_after(n) <= Duration::from_millis(300));
        }
    }

    #[test]
    fn budget() {
        assert!(RetryPolicy::forever().allows_attempt(u32::MAX));
        assert!(!RetryPolicy::no_retry().allows_attempt(2));
        assert_eq!(
            RetryPolicy::new().with_max_attempts(0).max_attempts,
            Some(1)
        );
    }
}
