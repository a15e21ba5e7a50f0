//! NATS JetStream as an outbox target (`serve --nats-url`).
//!
//! Each event is published to `sagas.<saga name>.<event type>` (for example
//! `sagas.place_order.saga.completed`) with `Nats-Msg-Id: <log id>:<event id>`, and counts as
//! sent once JetStream has acknowledged it, that is once the stream has stored it. The stream
//! ([`NatsConfig::stream`], `SAGAS` by default, capturing `sagas.>`) is created at the first
//! connection if it does not exist, with [`NatsConfig::duplicate_window`]; an existing one is
//! checked to capture those subjects and to deduplicate, and its window lengthened to that one
//! if it is shorter.
//!
//! Why JetStream: it stores messages durably, acknowledges a publish once stored, and
//! deduplicates by `Nats-Msg-Id` within a window, which turns the relay's at-least-once into
//! exactly-once in the stream for every republish short of the window; consumers pull with
//! explicit acks from a durable consumer. Plain NATS publishing would lose events while a
//! consumer is away.

use std::time::Duration;

use async_nats::jetstream::{self, context::Context, message::PublishMessage, stream};
use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{BrokerMessage, EventTarget, Published, TargetError};

/// The cursor name (and `target` label) of the NATS relay.
pub const TARGET_NAME: &str = "nats";

/// The subjects the orchestrator publishes to, as a stream filter.
pub const SUBJECTS: &str = "sagas.>";

/// Settings of the NATS target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// The server, e.g. `nats://127.0.0.1:4222` (`--nats-url`).
    pub url: String,
    /// The JetStream stream that stores the events (`--nats-stream`). Default: `SAGAS`.
    pub stream: String,
    /// How long the stream remembers message ids to drop republished copies
    /// (`--nats-dedup-window`): the window of a stream this target creates, and the least it
    /// accepts of one that exists (a shorter one is lengthened). Default: 2 minutes,
    /// JetStream's own.
    pub duplicate_window: Duration,
    /// How long a connection, a stream request or a publish acknowledgement may take.
    /// Default: 5 seconds.
    pub timeout: Duration,
}

impl NatsConfig {
    /// The settings for the server at `url`, the rest by default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            stream: "SAGAS".to_owned(),
            duplicate_window: Duration::from_secs(120),
            timeout: Duration::from_secs(5),
        }
    }
}

/// The subject of an event: `sagas.<saga name>.<event type>`. A saga name may hold `.`, which
/// NATS reads as a level separator: it becomes `_`, so every subject has the same shape.
pub fn subject(saga_name: &str, event_type: &str) -> String {
    let name: String = saga_name
        .chars()
        .map(|c| if c == '.' { '_' } else { c })
        .collect();
    format!("sagas.{name}.{event_type}")
}

/// Publishes the outbox to a JetStream stream; see the module docs.
pub struct NatsTarget {
    config: NatsConfig,
    /// The JetStream context once connected (the client reconnects by itself after that).
    context: Mutex<Option<Context>>,
}

impl std::fmt::Debug for NatsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsTarget")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NatsTarget {
    /// A target for `config`; it connects on [`EventTarget::prepare`].
    pub fn new(config: NatsConfig) -> Self {
        Self {
            config,
            context: Mutex::new(None),
        }
    }

    async fn context(&self) -> Result<Context, TargetError> {
        let mut slot = self.context.lock().await;
        if let Some(context) = slot.as_ref() {
            return Ok(context.clone());
        }
        let client = async_nats::ConnectOptions::new()
            .name("saga-orchestrator")
            .connection_timeout(self.config.timeout)
            .connect(self.config.url.as_str())
            .await
            .map_err(|e| TargetError::Unavailable(format!("NATS at {}: {e}", self.config.url)))?;
        let context = jetstream::ContextBuilder::new()
            .timeout(self.config.timeout)
            .build(client);
        *slot = Some(context.clone());
        Ok(context)
    }

    /// Creates the stream, or checks the one that exists.
    async fn ensure_stream(&self, context: &Context) -> Result<(), TargetError> {
        let name = &self.config.stream;
        let wanted = stream::Config {
            name: name.clone(),
            subjects: vec![SUBJECTS.to_owned()],
            duplicate_window: self.config.duplicate_window,
            ..Default::default()
        };
        let mut created = context.get_or_create_stream(wanted).await.map_err(|e| {
            use async_nats::jetstream::context::CreateStreamErrorKind as Kind;
            let text = format!("JetStream stream {name}: {e}");
            match e.kind() {
                Kind::EmptyStreamName | Kind::InvalidStreamName => TargetError::Misconfigured(text),
                _ => TargetError::Unavailable(text),
            }
        })?;
        let info = created
            .info()
            .await
            .map_err(|e| TargetError::Unavailable(format!("JetStream stream {name}: {e}")))?;
        let subjects = &info.config.subjects;
        if !subjects.iter().any(|s| s == SUBJECTS) {
            return Err(TargetError::Misconfigured(format!(
                "JetStream stream {name} captures {subjects:?}, not {SUBJECTS:?}: the \
                 orchestrator's events would not be stored"
            )));
        }
        if info.config.duplicate_window.is_zero() {
            return Err(TargetError::Misconfigured(format!(
                "JetStream stream {name} has no duplicate window: republished events would be \
                 stored twice"
            )));
        }
        // A stream made by someone else (a consumer that started first) may remember ids for
        // less time than asked: lengthened, never shortened, since a longer window only costs
        // the server memory.
        let had = info.config.duplicate_window;
        if had < self.config.duplicate_window {
            let mut longer = info.config.clone();
            longer.duplicate_window = self.config.duplicate_window;
            context
                .update_stream(&longer)
                .await
                .map_err(|e| TargetError::Unavailable(format!("JetStream stream {name}: {e}")))?;
            tracing::info!(stream = %name, from = ?had, to = ?self.config.duplicate_window,
                           "lengthened the stream's duplicate window");
        }
        Ok(())
    }
}

#[async_trait]
impl EventTarget for NatsTarget {
    fn name(&self) -> &str {
        TARGET_NAME
    }

    async fn prepare(&self) -> Result<(), TargetError> {
        let context = self.context().await?;
        self.ensure_stream(&context).await
    }

    async fn publish(&self, messages: &[BrokerMessage<'_>]) -> Published {
        let context = match self.context().await {
            Ok(context) => context,
            Err(e) => {
                return Published {
                    acknowledged: 0,
                    error: Some(e),
                }
            }
        };
        // All sent first, then the acknowledgements awaited in order: one round trip per batch.
        let mut pending = Vec::with_capacity(messages.len());
        let mut error = None;
        for m in messages {
            let mut publish = PublishMessage::build()
                .payload(m.body.clone().into())
                .message_id(&m.message_id)
                .header("Saga-Event-Id", m.event.id().to_string().as_str());
            if let Some(traceparent) = &m.traceparent {
                publish = publish.header("traceparent", traceparent.as_str());
            }
            let subject = subject(&m.event.saga_name, &m.event.kind);
            match context.send_publish(subject, publish).await {
                Ok(ack) => pending.push(ack),
                Err(e) => {
                    error = Some(TargetError::Unavailable(format!("NATS publish: {e}")));
                    break;
                }
            }
        }
        // Awaited together, so that each one's timeout runs at once: a broker gone while the
        // batch was queued costs one timeout, not one per message. Only an unbroken run of
        // confirmations from the first counts.
        let mut acknowledged = 0;
        let mut unbroken = true;
        let acks = pending
            .into_iter()
            .map(std::future::IntoFuture::into_future);
        for ack in futures_util::future::join_all(acks).await {
            match ack {
                Ok(_) if unbroken => acknowledged += 1,
                Ok(_) => {}
                Err(e) => {
                    unbroken = false;
                    let ack_error = TargetError::Unavailable(format!("JetStream ack: {e}"));
                    error = Some(error.unwrap_or(ack_error));
                }
            }
        }
        Published {
            acknowledged,
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_have_three_levels_after_sagas() {
        assert_eq!(
            subject("place_order", "saga.completed"),
            "sagas.place_order.saga.completed"
        );
        assert_eq!(
            subject("shop.checkout", "step.failed"),
            "sagas.shop_checkout.step.failed"
        );
    }
}
