//! The outbox's message-broker targets: every lifecycle event, published in outbox order.
//!
//! # Why it works this way
//!
//! The events table is a transactional outbox (see [`crate::relay`]). A broker target is
//! simpler than webhooks: one destination, no per-saga callbacks, so it needs no delivery
//! rows, only a durable cursor of its own in `relay_cursors`, beside the webhooks' one. A
//! [`BrokerRelay`] reads the events after that cursor, hands a batch to its [`EventTarget`],
//! and moves the cursor past the events the broker **acknowledged**, never further: a broker
//! that is down or full leaves them in the outbox, and they go out when it is back. The loop
//! that runs it (pauses, backoff, lag gauges) is the relay's, shared with webhooks.
//!
//! Between the broker's acknowledgement and the cursor's move the relay may die; it then
//! publishes those events again. Each message therefore carries an id that is the same on
//! every attempt, `<log id>:<event id>` (the log id is a UUID made once per database,
//! [`OutboxStore::log_id`], so two deployments or a database made anew never share ids): a
//! broker with deduplication (JetStream's `Nats-Msg-Id`) drops the copy inside its window, and
//! consumers deduplicate by it beyond ([`crate::consumer`]).
//!
//! # Adding a target
//!
//! A target is one type implementing [`EventTarget`]: [`prepare`](EventTarget::prepare)
//! connects and checks what it publishes into, [`publish`](EventTarget::publish) sends a batch
//! in order and says how many of its first messages the broker confirmed. The relay does the
//! rest (cursor, retries, metrics). `nats::NatsTarget` (the `nats` feature) is the one this crate ships; a Kafka
//! target would use an idempotent producer and the message id as key, a RabbitMQ one
//! publisher confirms and the message id as `message_id` (RabbitMQ does not deduplicate, so
//! its consumers must).

#[cfg(feature = "nats")]
pub mod nats;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::relay::{self, Cursor, Destination, EventPayload, Pacing, Turn};
use crate::store::outbox::{OutboxEvent, OutboxStore};
use crate::store::StoreError;
use crate::telemetry::Sampling;

/// One event as a broker target sends it.
#[derive(Debug, Clone)]
pub struct BrokerMessage<'a> {
    /// The event.
    pub event: &'a OutboxEvent,
    /// `<log id>:<event id>`: the same on every attempt; brokers and consumers deduplicate by it.
    pub message_id: String,
    /// The JSON body, the same document a webhook delivery carries.
    pub body: Vec<u8>,
    /// The W3C `traceparent` of the event's saga span, if its saga has a trace.
    pub traceparent: Option<String>,
}

impl<'a> BrokerMessage<'a> {
    /// The message of `event` in the log `log_id`; `sampling` as in [`BrokerRelayConfig`].
    pub fn of(log_id: Uuid, event: &'a OutboxEvent, sampling: Sampling) -> Self {
        Self {
            event,
            message_id: message_id(log_id, event.id()),
            body: EventPayload::body(event),
            traceparent: event.trace_header(sampling),
        }
    }
}

/// The id of event `event_id` of log `log_id`, as brokers and consumers see it.
pub fn message_id(log_id: Uuid, event_id: i64) -> String {
    format!("{log_id}:{event_id}")
}

/// Why a target could not prepare or publish.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The broker cannot be reached, or refused for now (full, no leader, timed out): try
    /// again later.
    #[error("{0}")]
    Unavailable(String),
    /// What the target publishes into is set up in a way it cannot use (a stream that does
    /// not capture its subjects, say): retrying will not help until an operator acts.
    #[error("{0}")]
    Misconfigured(String),
}

/// How a batch went: the broker confirmed its first `acknowledged` messages; `error` says why
/// it stopped before the end, if it did.
#[derive(Debug)]
pub struct Published {
    /// How many messages, from the first, the broker confirmed.
    pub acknowledged: usize,
    /// Why the rest were not.
    pub error: Option<TargetError>,
}

/// A message broker the relay publishes the outbox to. See the module docs.
#[async_trait]
pub trait EventTarget: Send + Sync + 'static {
    /// The name of its cursor in `relay_cursors`, and its `target` label in the metrics.
    fn name(&self) -> &str;

    /// Connects if needed and checks (or creates) what it publishes into. The relay calls it
    /// before its first publish and again after a failed one.
    async fn prepare(&self) -> Result<(), TargetError>;

    /// Publishes `messages` in order and waits for the broker's confirmations.
    async fn publish(&self, messages: &[BrokerMessage<'_>]) -> Published;
}

/// Settings of a [`BrokerRelay`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRelayConfig {
    /// Events read and published per batch. Default: 256.
    pub batch: u32,
    /// How often the relay looks for new events when idle. Default: 50 ms.
    pub poll_interval: Duration,
    /// The first delay after a failure; each further one doubles, with jitter. Default: 200 ms.
    pub retry_base: Duration,
    /// The longest delay after failures. Default: 10 seconds.
    pub retry_max: Duration,
    /// Which sagas' spans are exported ([`crate::telemetry`]), so that the `traceparent` each
    /// message carries says whether its saga span is sampled. Default: none.
    pub trace_sampling: Sampling,
}

impl Default for BrokerRelayConfig {
    fn default() -> Self {
        Self {
            batch: 256,
            poll_interval: Duration::from_millis(50),
            retry_base: Duration::from_millis(200),
            retry_max: Duration::from_secs(10),
            trace_sampling: Sampling::NONE,
        }
    }
}

/// Why a relay round failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Publishes the outbox to one [`EventTarget`], from its own durable cursor. Several processes
/// sharing a PostgreSQL database may each run one: they may publish the same batch, which the
/// message ids make harmless, and the cursor's compare-and-set lets one of them record it.
pub struct BrokerRelay {
    cursor: Cursor,
    target: Arc<dyn EventTarget>,
    config: BrokerRelayConfig,
    /// Whether the target was prepared since it last failed.
    prepared: bool,
}

impl std::fmt::Debug for BrokerRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerRelay")
            .field("target", &self.target.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl BrokerRelay {
    /// A relay of `outbox` to `target`.
    pub fn new(
        outbox: Arc<dyn OutboxStore>,
        target: Arc<dyn EventTarget>,
        config: BrokerRelayConfig,
    ) -> Self {
        Self {
            cursor: Cursor::new(outbox, target.name()),
            target,
            config,
            prepared: false,
        }
    }

    /// Runs until `shutdown` is cancelled. A batch in flight at shutdown is finished (its
    /// confirmations waited for, each bounded by the target's timeout) and recorded.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let name = self.target.name().to_owned();
        tracing::info!(target_name = %name, "broker relay started");
        metrics::counter!("outbox_published_total", "target" => name.clone()).increment(0);
        metrics::counter!("outbox_publish_failures_total", "target" => name.clone()).increment(0);
        let pacing = Pacing {
            poll_interval: self.config.poll_interval,
            retry_base: self.config.retry_base,
            retry_max: self.config.retry_max,
            report_every: Duration::from_secs(1),
        };
        relay::run(&mut self, pacing, shutdown).await;
        tracing::info!(target_name = %name, "broker relay stopped");
    }

    /// One round: publishes the events after the cursor (one batch) and records how far the
    /// broker confirmed them. Returns how many were read.
    async fn round(&mut self) -> Result<usize, RoundError> {
        let durable = self.cursor.durable().await?;
        let events = self.cursor.events_after(durable, self.config.batch).await?;
        if events.is_empty() {
            return Ok(0);
        }
        if !self.prepared {
            self.target.prepare().await?;
            self.prepared = true;
        }
        let log_id = self.cursor.outbox().log_id().await?;
        let messages: Vec<BrokerMessage<'_>> = events
            .iter()
            .map(|e| BrokerMessage::of(log_id, e, self.config.trace_sampling))
            .collect();
        let published = self.target.publish(&messages).await;
        if let Some(last) = published
            .acknowledged
            .checked_sub(1)
            .and_then(|i| events.get(i))
        {
            // The crash window of at-least-once: confirmed by the broker, not yet recorded.
            crate::failpoint::crash_if_armed("after_broker_ack", &last.kind);
            // Compare-and-set: another process's relay that recorded the same batch first
            // leaves nothing to do.
            self.cursor.advance(durable, last.position, &[]).await?;
            metrics::counter!("outbox_published_total", "target" => self.cursor.name().to_owned())
                .increment(published.acknowledged as u64);
        }
        match published.error {
            Some(e) => Err(e.into()),
            None => Ok(events.len()),
        }
    }
}

#[async_trait]
impl Destination for BrokerRelay {
    fn cursor(&self) -> &Cursor {
        &self.cursor
    }

    async fn turn(&mut self) -> Turn {
        match self.round().await {
            Ok(n) if n < self.config.batch as usize => Turn::Idle,
            Ok(_) => Turn::Busy,
            Err(e) => {
                // Connected again and its stream checked before the next publish.
                self.prepared = false;
                let name = self.cursor.name().to_owned();
                metrics::counter!("outbox_publish_failures_total", "target" => name.clone())
                    .increment(1);
                tracing::warn!(target_name = %name, error = %e,
                               "publishing outbox events failed; will retry");
                Turn::Failed
            }
        }
    }
}
