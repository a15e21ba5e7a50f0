//! Sagas started by messages on NATS JetStream (`serve --nats-trigger SUBJECT=SAGA`).
//!
//! Each trigger is a durable pull consumer on the JetStream stream that holds its subject,
//! shared by every `serve` process of the log, so that each message goes to one process at a
//! time (see `consumer`, with the `nats` feature). A message's body is its saga's input.
//!
//! # One saga per message
//!
//! A message starts its saga through [`Engine::start`](crate::engine::Engine::start) with an
//! idempotency key made of the message's stream (with the stream's creation time, so a stream
//! made anew never meets the keys of the old one) and stream sequence, in a scope of the
//! trigger's own (`trigger:SUBJECT=SAGA`). The message is acknowledged (and the
//! acknowledgement confirmed by the server) only after the start committed; a process that
//! dies in between leaves the message to be redelivered once its `ack_wait` has passed, and
//! the redelivery finds the key and so the same saga. Keys are kept for
//! [`TriggersConfig::key_retention`] (7 days by default), far beyond any redelivery: a message
//! is redelivered within `ack_wait` of a failed attempt, for as long as it stays unacknowledged.
//!
//! # Refusals
//!
//! A body that cannot start its saga (not JSON, refused by the definition's input check, larger
//! than [`TriggersConfig::max_body`]) would fail the same way on every redelivery: it is
//! recorded in the log ([`TriggerLog`](crate::store::TriggerLog), table `trigger_refusals`),
//! counted (`trigger_refused_total{trigger}`) and terminated on the broker, never redelivered.
//! A store that fails is not the message's fault: the message is given back (`nak`) with a
//! delay and tried again.
//!
//! # What is shown
//!
//! Each process keeps its triggers' state in a [`TriggerBoard`]: the stream and consumer, the
//! consumer's lag (`num_pending + num_ack_pending`, read every few seconds, also the gauge
//! `trigger_lag_messages{trigger}`), and the sagas started and messages refused since it
//! started. `GET /v1/triggers` and `saga triggers` show it with the recorded refusals.

#[cfg(feature = "nats")]
pub mod consumer;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;

/// The stream a trigger's subject is added to when no JetStream stream holds it.
pub const DEFAULT_STREAM: &str = "SAGA_TRIGGERS";

/// A trigger as `--nats-trigger SUBJECT=SAGA` names it: messages on `subject` (wildcards
/// allowed) each start a saga named `saga`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TriggerSpec {
    /// The NATS subject, e.g. `orders.created` or `orders.*`.
    pub subject: String,
    /// The saga each message starts.
    pub saga: String,
}

impl TriggerSpec {
    /// The idempotency scope of the trigger's starts: keys of two triggers never collide.
    pub fn key_scope(&self) -> String {
        format!("trigger:{self}")
    }
}

impl fmt::Display for TriggerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.subject, self.saga)
    }
}

/// Why a `--nats-trigger` value is not a trigger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a trigger: {why} (write SUBJECT=SAGA, e.g. orders.created=place_order)")]
pub struct BadTrigger {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

impl FromStr for TriggerSpec {
    type Err = BadTrigger;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| BadTrigger {
            value: value.to_owned(),
            why: why.to_owned(),
        };
        let (subject, saga) = value.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let (subject, saga) = (subject.trim(), saga.trim());
        if saga.is_empty() {
            return Err(bad("no saga name after `=`"));
        }
        check_subject(subject).map_err(|why| bad(&why))?;
        Ok(Self {
            subject: subject.to_owned(),
            saga: saga.to_owned(),
        })
    }
}

/// Checks `subject` as NATS reads one: dot-separated tokens, none empty, no white space, `*` a
/// whole token, `>` only as the whole last one.
fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("no subject before `=`".to_owned());
    }
    if subject.chars().any(char::is_whitespace) {
        return Err("a subject has no white space".to_owned());
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        if token.is_empty() {
            return Err(format!("the subject {subject:?} has an empty token"));
        }
        if token.contains('>') && (*token != ">" || i + 1 != tokens.len()) {
            return Err(format!("in {subject:?}, `>` must be the whole last token"));
        }
        if token.contains('*') && *token != "*" {
            return Err(format!("in {subject:?}, `*` must be a whole token"));
        }
    }
    Ok(())
}

/// Settings of the triggers of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TriggersConfig {
    /// The NATS server (`--nats-url`).
    pub url: String,
    /// The triggers (`--nats-trigger`).
    pub triggers: Vec<TriggerSpec>,
    /// The stream a subject no stream holds is added to, created if missing
    /// (`--nats-trigger-stream`). Default: [`DEFAULT_STREAM`].
    pub stream: String,
    /// How long a message handed to a process may stay unacknowledged before it is
    /// redelivered: the `ack_wait` of a consumer it creates (`--nats-trigger-ack-wait`; one
    /// that exists keeps its own). Default: 30 seconds.
    pub ack_wait: Duration,
    /// The most messages handed out and not yet acknowledged, over every process sharing the
    /// consumer (its `max_ack_pending`), and the most a process handles at once. Default: 256.
    pub max_in_flight: usize,
    /// How long the idempotency key of a message's start is kept. Default: 7 days.
    pub key_retention: Duration,
    /// The largest body accepted, in bytes; a larger one is refused. Default: 1 MiB, as an
    /// HTTP start.
    pub max_body: usize,
    /// How often the consumer's lag is read. Default: 2 seconds.
    pub lag_every: Duration,
    /// How long a message whose start failed on the store waits before it is redelivered.
    /// Default: 5 seconds.
    pub retry_delay: Duration,
    /// How long a connection or a JetStream request may take. Default: 5 seconds.
    pub timeout: Duration,
}

impl TriggersConfig {
    /// The triggers `triggers` on the server at `url`, the rest by default.
    pub fn new(url: impl Into<String>, triggers: Vec<TriggerSpec>) -> Self {
        Self {
            url: url.into(),
            triggers,
            stream: DEFAULT_STREAM.to_owned(),
            ack_wait: Duration::from_secs(30),
            max_in_flight: 256,
            key_retention: Duration::from_secs(7 * 24 * 60 * 60),
            max_body: 1024 * 1024,
            lag_every: Duration::from_secs(2),
            retry_delay: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
        }
    }

    /// Checks what can be checked before connecting: a server to read from, each trigger's
    /// saga registered in `registry`, no trigger given twice.
    pub fn check(&self, registry: &saga_dsl::Registry) -> Result<(), TriggerError> {
        if self.url.trim().is_empty() {
            return Err(TriggerError::NoNatsUrl);
        }
        let mut seen = std::collections::HashSet::new();
        for spec in &self.triggers {
            if !seen.insert(spec) {
                return Err(TriggerError::Repeated(spec.to_string()));
            }
            if registry.latest(&spec.saga).is_none() {
                return Err(TriggerError::UnknownSaga {
                    trigger: spec.to_string(),
                    saga: spec.saga.clone(),
                });
            }
        }
        Ok(())
    }

    /// With `ack_wait` as the `ack_wait` of the consumers it creates.
    pub fn with_ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// With `stream` as the stream for subjects no stream holds.
    pub fn with_stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = stream.into();
        self
    }
}

/// Why the triggers cannot run.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TriggerError {
    /// `--nats-trigger` without a server to read from.
    #[error("--nats-trigger needs --nats-url (or SAGA_NATS_URL): the NATS server to read from")]
    NoNatsUrl,
    /// A trigger names a saga this process does not register.
    #[error("--nats-trigger {trigger}: no saga definition named {saga:?} is registered")]
    UnknownSaga {
        /// The trigger.
        trigger: String,
        /// The name it gives.
        saga: String,
    },
    /// The same trigger given twice.
    #[error("--nats-trigger {0} is given twice")]
    Repeated(String),
    /// JetStream refused to set the trigger up in a way retrying will not mend.
    #[error("--nats-trigger {trigger}: {message}")]
    Misconfigured {
        /// The trigger.
        trigger: String,
        /// What JetStream said.
        message: String,
    },
}

/// The live state of one trigger in this process.
#[derive(Debug)]
pub struct TriggerState {
    /// The trigger.
    pub spec: TriggerSpec,
    /// Its metrics label and name: `SUBJECT=SAGA`.
    pub name: String,
    /// The stream and consumer, once set up.
    place: Mutex<Option<(String, String)>>,
    /// The consumer's lag at its last reading; -1 before the first.
    lag: AtomicI64,
    started: AtomicU64,
    replayed: AtomicU64,
    refused: AtomicU64,
    /// The last broker error, cleared by the next success.
    error: Mutex<Option<String>>,
}

impl TriggerState {
    /// The state of `spec`, before it is set up.
    pub fn new(spec: TriggerSpec) -> Self {
        Self {
            name: spec.to_string(),
            spec,
            place: Mutex::new(None),
            lag: AtomicI64::new(-1),
            started: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            error: Mutex::new(None),
        }
    }

    /// Records where the trigger reads from, and that it could.
    pub fn set_place(&self, stream: &str, consumer: &str) {
        *lock(&self.place) = Some((stream.to_owned(), consumer.to_owned()));
        self.set_error(None);
    }

    /// Records the consumer's lag.
    pub fn set_lag(&self, lag: u64) {
        self.lag
            .store(i64::try_from(lag).unwrap_or(i64::MAX), Ordering::Relaxed);
        metrics::gauge!("trigger_lag_messages", "trigger" => self.name.clone()).set(lag as f64);
    }

    /// Records the last broker error (`None`: it works again).
    pub fn set_error(&self, error: Option<String>) {
        *lock(&self.error) = error;
    }

    /// Counts a saga started by a message.
    pub fn count_started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("trigger_started_total", "trigger" => self.name.clone()).increment(1);
    }

    /// Counts a redelivered message that found its saga.
    pub fn count_replayed(&self) {
        self.replayed.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("trigger_replayed_total", "trigger" => self.name.clone()).increment(1);
    }

    /// Counts a refused message.
    pub fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("trigger_refused_total", "trigger" => self.name.clone()).increment(1);
    }

    /// Registers its series at zero, so that they exist before the first message.
    pub fn zero_series(&self) {
        let name = self.name.clone();
        metrics::counter!("trigger_started_total", "trigger" => name.clone()).increment(0);
        metrics::counter!("trigger_replayed_total", "trigger" => name.clone()).increment(0);
        metrics::counter!("trigger_refused_total", "trigger" => name).increment(0);
    }

    /// What `GET /v1/triggers` shows of it.
    pub fn view(&self) -> TriggerView {
        let place = lock(&self.place).clone();
        let lag = self.lag.load(Ordering::Relaxed);
        TriggerView {
            trigger: self.name.clone(),
            subject: self.spec.subject.clone(),
            saga: self.spec.saga.clone(),
            stream: place.as_ref().map(|(s, _)| s.clone()),
            consumer: place.map(|(_, c)| c),
            lag: u64::try_from(lag).ok(),
            started: self.started.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            error: lock(&self.error).clone(),
        }
    }
}

/// A lock that a panic elsewhere does not poison for good: the data are plain values.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A trigger of this process as `GET /v1/triggers` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct TriggerView {
    /// `SUBJECT=SAGA`, its name in the metrics and the refusals.
    pub trigger: String,
    /// The NATS subject.
    pub subject: String,
    /// The saga each message starts.
    pub saga: String,
    /// The JetStream stream it reads, once set up.
    pub stream: Option<String>,
    /// Its durable consumer, shared by every process of the log, once set up.
    pub consumer: Option<String>,
    /// Messages not yet handled: pending in the consumer plus handed out and not yet
    /// acknowledged, at the last reading (every few seconds); `null` before the first.
    pub lag: Option<u64>,
    /// Sagas this process started from messages since it started.
    pub started: u64,
    /// Redelivered messages that found the saga started before, since this process started.
    pub replayed: u64,
    /// Messages this process refused since it started.
    pub refused: u64,
    /// The last error reaching NATS, until it works again.
    pub error: Option<String>,
}

/// The body of `GET /v1/triggers`: the triggers of the process that answers, and the
/// refusals recorded in the log by every process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct TriggerList {
    /// The triggers of the process that answers, in the order given.
    pub triggers: Vec<TriggerView>,
    /// How many refusals each trigger has recorded in the log, by any process.
    pub refused: Vec<crate::store::triggers::RefusalCount>,
    /// The latest refusals recorded in the log, newest first.
    pub refusals: Vec<crate::store::triggers::TriggerRefusal>,
}

/// The triggers of a process, shared with the HTTP API. Cheap to clone; two boards are equal
/// only if they are the same board.
#[derive(Clone, Default)]
pub struct TriggerBoard {
    triggers: Arc<RwLock<Vec<Arc<TriggerState>>>>,
}

impl TriggerBoard {
    /// Adds a trigger.
    pub fn add(&self, state: Arc<TriggerState>) {
        self.triggers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(state);
    }

    /// Every trigger as shown, in the order given.
    pub fn views(&self) -> Vec<TriggerView> {
        self.triggers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|t| t.view())
            .collect()
    }
}

impl PartialEq for TriggerBoard {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.triggers, &other.triggers)
    }
}

impl Eq for TriggerBoard {}

impl fmt::Debug for TriggerBoard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.views()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_is_subject_equals_saga() {
        let t: TriggerSpec = "orders.created=place_order".parse().unwrap();
        assert_eq!(t.subject, "orders.created");
        assert_eq!(t.saga, "place_order");
        assert_eq!(t.to_string(), "orders.created=place_order");
        assert_eq!(t.key_scope(), "trigger:orders.created=place_order");
        let t: TriggerSpec = " orders.* = fulfil_order ".parse().unwrap();
        assert_eq!(
            (t.subject.as_str(), t.saga.as_str()),
            ("orders.*", "fulfil_order")
        );
        assert!("orders.>=x".parse::<TriggerSpec>().is_ok());
    }

    #[test]
    fn malformed_triggers_say_what_is_wrong() {
        for (bad, why) in [
            ("orders.created", "no `=`"),
            ("=place_order", "no subject"),
            ("orders.created=", "no saga name"),
            ("orders..created=x", "empty token"),
            ("orders.>.x=x", "`>` must be"),
            ("orders.a*=x", "`*` must be"),
            ("or ders=x", "white space"),
        ] {
            let e = bad.parse::<TriggerSpec>().unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("SUBJECT=SAGA"), "{bad}: {e}");
        }
    }
}
