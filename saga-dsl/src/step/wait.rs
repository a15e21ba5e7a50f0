//! The stages that wait without calling anything: a durable [`Sleep`] and a [`SignalWait`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{Rule, Step};
use crate::{StepContext, StepError};

/// How a sleep computes its wake time from the saga's input and earlier outputs.
#[derive(Clone)]
enum WakeRule {
    /// After this long, counted from the moment the sleep starts.
    For(Rule<Duration>),
    /// At this instant.
    Until(Rule<SystemTime>),
}

/// A durable sleep: [`Step::sleep`], [`Step::sleep_for`], [`Step::sleep_until`].
#[derive(Clone)]
pub struct Sleep {
    wake: WakeRule,
}

impl Sleep {
    pub(super) fn lasting(
        duration: impl Fn(&StepContext) -> Result<Duration, StepError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            wake: WakeRule::For(Arc::new(duration)),
        }
    }

    pub(super) fn until(
        instant: impl Fn(&StepContext) -> Result<SystemTime, StepError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            wake: WakeRule::Until(Arc::new(instant)),
        }
    }

    /// The wake time of a sleep that starts at `now`.
    pub fn wake_time(&self, ctx: &StepContext, now: SystemTime) -> Result<SystemTime, StepError> {
        match &self.wake {
            WakeRule::For(duration) => duration(ctx).and_then(|d| {
                now.checked_add(d)
                    .ok_or_else(|| StepError::permanent(format!("a sleep of {d:?} never ends")))
            }),
            WakeRule::Until(instant) => instant(ctx),
        }
    }
}

/// Checks a signal's payload and turns it into the stage's output ([`Step::accept`]).
type Acceptor = Arc<dyn Fn(&StepContext, Value) -> Result<Value, StepError> + Send + Sync>;

/// A wait for a signal from outside: [`Step::signal`].
#[derive(Clone)]
pub struct SignalWait {
    /// The signal's name, as in `POST /v1/sagas/{id}/signals/{signal}`.
    signal: String,
    /// How long to wait, counted from the moment the saga reaches the stage; forever if `None`.
    timeout: Option<Rule<Duration>>,
    /// The output when the timeout passes without a signal; without one the stage fails.
    default: Option<Value>,
    /// Checks the payload; the identity when `None`.
    accept: Option<Acceptor>,
}

impl SignalWait {
    pub(super) fn new(signal: String) -> Self {
        Self {
            signal,
            timeout: None,
            default: None,
            accept: None,
        }
    }

    /// The name of the signal it waits for.
    pub fn signal(&self) -> &str {
        &self.signal
    }

    /// When it stops waiting, if it starts waiting at `now`; `None` when it waits forever.
    pub fn deadline(
        &self,
        ctx: &StepContext,
        now: SystemTime,
    ) -> Option<Result<SystemTime, StepError>> {
        let rule = self.timeout.as_ref()?;
        Some(rule(ctx).and_then(|d| {
            now.checked_add(d)
                .ok_or_else(|| StepError::permanent(format!("a timeout of {d:?} never ends")))
        }))
    }

    /// Its output when its timeout passes, if it has one.
    pub fn default_payload(&self) -> Option<&Value> {
        self.default.as_ref()
    }

    /// The output for `payload` (see [`Step::accept`]).
    pub fn accept(&self, ctx: &StepContext, payload: Value) -> Result<Value, StepError> {
        match &self.accept {
            Some(accept) => accept(ctx, payload),
            None => Ok(payload),
        }
    }
}

impl Step<SignalWait> {
    /// Wait at most `timeout`.
    pub fn signal_timeout(self, timeout: Duration) -> Self {
        self.signal_timeout_from(move |_| Ok(timeout))
    }

    /// Wait at most as long as `timeout` computes from the saga's input and earlier outputs
    /// when the saga reaches the stage (an order's own approval window).
    pub fn signal_timeout_from(
        self,
        timeout: impl Fn(&StepContext) -> Result<Duration, StepError> + Send + Sync + 'static,
    ) -> Self {
        self.map_body(|wait| wait.timeout = Some(Arc::new(timeout)))
    }

    /// The output to go on with when the timeout passes without a signal, instead of failing.
    pub fn default_payload(self, payload: Value) -> Self {
        self.map_body(|wait| wait.default = Some(payload))
    }

    /// Checks the payload that arrived (or the default) and returns the stage's output; an
    /// error fails the stage as an action's error would (a permanent one compensates the
    /// stages before). Without it the payload is the output as it is.
    pub fn accept(
        self,
        accept: impl Fn(&StepContext, Value) -> Result<Value, StepError> + Send + Sync + 'static,
    ) -> Self {
        self.map_body(|wait| wait.accept = Some(Arc::new(accept)))
    }
}
