//! The JetStream side of triggers: finding or making the stream, the durable pull consumer, and
//! the loop that starts one saga per message (see the [parent module](super)).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::{Context, GetStreamByNameErrorKind};
use async_nats::jetstream::{self, stream, AckKind};
use futures_util::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::{TriggerBoard, TriggerError, TriggerSpec, TriggerState, TriggersConfig};
use crate::engine::{Engine, StartError, StartKey, StartOutcome, StartRequest};
use crate::store::triggers::NewRefusal;

/// The durable consumer of `spec` in the log `log_id`: readable, and unique per trigger and
/// log, so that every process of one log shares it and two logs on one NATS server do not.
pub fn consumer_name(spec: &TriggerSpec, log_id: uuid::Uuid) -> String {
    // NATS names may not hold `.`, `*`, `>`, white space or path separators.
    let clean = |text: &str| -> String {
        text.chars()
            .map(|c| match c {
                '*' => '+',
                '>' => '^',
                c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => c,
                _ => '_',
            })
            .collect()
    };
    let log = log_id.simple().to_string();
    format!(
        "saga-trigger-{}-{}-{}",
        clean(&spec.subject),
        clean(&spec.saga),
        &log[..12]
    )
}

/// What became of one message.
enum Handled {
    /// Its saga was started (or found, for a redelivery): acknowledge.
    Started,
    /// Its body can never start the saga: record and terminate.
    Refused(String),
    /// The store failed: give it back for later.
    Retry(String),
}

/// The triggers of a process, ready to [`run`](Self::run).
pub struct TriggerRunner {
    engine: Engine,
    config: Arc<TriggersConfig>,
    triggers: Vec<Arc<TriggerState>>,
    nats: Arc<Connection>,
    /// Consumers set up at start, taken by their loops.
    ready: Vec<Option<Ready>>,
}

impl std::fmt::Debug for TriggerRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriggerRunner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The NATS connection, made on first use (the client reconnects by itself after that).
struct Connection {
    config: Arc<TriggersConfig>,
    context: Mutex<Option<Context>>,
}

impl Connection {
    async fn context(&self) -> Result<Context, String> {
        let mut slot = self.context.lock().await;
        if let Some(context) = slot.as_ref() {
            return Ok(context.clone());
        }
        let client = async_nats::ConnectOptions::new()
            .name("saga-orchestrator-triggers")
            .connection_timeout(self.config.timeout)
            .connect(self.config.url.as_str())
            .await
            .map_err(|e| format!("NATS at {}: {e}", self.config.url))?;
        let context = jetstream::ContextBuilder::new()
            .timeout(self.config.timeout)
            .build(client);
        *slot = Some(context.clone());
        Ok(context)
    }
}

impl TriggerRunner {
    /// Checks the triggers against `engine`'s registry, adds them to `board`, and sets up each
    /// one's stream and consumer if NATS answers within its timeout (a trigger that cannot be
    /// set up now is tried again by its loop).
    pub async fn prepare(
        engine: Engine,
        config: TriggersConfig,
        board: &TriggerBoard,
    ) -> Result<Self, TriggerError> {
        config.check(engine.registry())?;
        let config = Arc::new(config);
        let nats = Arc::new(Connection {
            config: config.clone(),
            context: Mutex::new(None),
        });
        let triggers: Vec<Arc<TriggerState>> = config
            .triggers
            .iter()
            .map(|spec| Arc::new(TriggerState::new(spec.clone())))
            .collect();
        let mut runner = Self {
            engine,
            config,
            triggers,
            nats,
            ready: Vec::new(),
        };
        for state in &runner.triggers {
            state.zero_series();
            board.add(state.clone());
            let set_up = tokio::time::timeout(
                runner.config.timeout * 2,
                set_up(&runner.engine, &runner.nats, &runner.config, state),
            )
            .await;
            let consumer = match set_up {
                Ok(Ok(consumer)) => Some(consumer),
                Ok(Err(e)) => {
                    tracing::warn!(trigger = %state.name, error = %e,
                                   "cannot set the trigger up yet; will retry");
                    state.set_error(Some(e));
                    None
                }
                Err(_) => {
                    tracing::warn!(trigger = %state.name,
                                   "NATS did not answer in time; will retry");
                    state.set_error(Some("NATS did not answer in time".to_owned()));
                    None
                }
            };
            runner.ready.push(consumer);
        }
        Ok(runner)
    }

    /// Runs every trigger until `shutdown`; messages in hand at shutdown are finished
    /// (started and acknowledged, or given back).
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tasks = Vec::new();
        for (state, consumer) in self.triggers.iter().zip(self.ready) {
            let trigger = Trigger {
                engine: self.engine.clone(),
                config: self.config.clone(),
                nats: self.nats.clone(),
                state: state.clone(),
            };
            tasks.push(tokio::spawn(trigger.run(consumer, shutdown.clone())));
        }
        for task in tasks {
            if task.await.is_err() {
                tracing::error!("a trigger's loop panicked");
            }
        }
    }
}

/// A trigger's consumer, set up.
struct Ready {
    consumer: PullConsumer,
    /// A digest of the stream's creation time: a stream deleted and made again under the same
    /// name numbers its messages from 1 again, and its messages must not find the keys of the
    /// old one's.
    epoch: String,
}

/// Finds (or makes) the stream that holds the trigger's subject and its durable consumer.
async fn set_up(
    engine: &Engine,
    nats: &Connection,
    config: &TriggersConfig,
    state: &TriggerState,
) -> Result<Ready, String> {
    let js = nats.context().await?;
    let subject = &state.spec.subject;
    let stream = match js.stream_by_subject(subject.as_str()).await {
        Ok(name) => js
            .get_stream(&name)
            .await
            .map_err(|e| format!("JetStream stream {name}: {e}"))?,
        Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {
            add_to_stream(&js, &config.stream, subject).await?
        }
        Err(e) => return Err(format!("finding the stream of {subject}: {e}")),
    };
    let info = stream.cached_info();
    let stream_name = info.config.name.clone();
    let created = Sha256::digest(info.created.to_string().as_bytes());
    let epoch: String = created[..4].iter().map(|b| format!("{b:02x}")).collect();
    let log_id = engine
        .store()
        .log_id()
        .await
        .map_err(|e| format!("the log's id: {e}"))?;
    let name = consumer_name(&state.spec, log_id);
    // A consumer made on an empty stream reads it from its start; on a stream that already
    // holds messages, from those published after it is made: a trigger added to a stream
    // with a history does not start a saga for each old message.
    let deliver_policy = if info.state.last_sequence == 0 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::New
    };
    let consumer: PullConsumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                description: Some(format!(
                    "starts a saga {} per message on {subject}",
                    state.spec.saga
                )),
                filter_subject: subject.clone(),
                ack_policy: AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                max_ack_pending: i64::try_from(config.max_in_flight).unwrap_or(i64::MAX),
                deliver_policy,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("JetStream consumer {name} on {stream_name}: {e}"))?;
    tracing::info!(trigger = %state.name, stream = %stream_name, consumer = %name,
                   "trigger set up");
    state.set_place(&stream_name, &name);
    Ok(Ready { consumer, epoch })
}

/// The stream `name` with `subject` among its subjects: created with it if missing, or the
/// subject added to it.
async fn add_to_stream(js: &Context, name: &str, subject: &str) -> Result<stream::Stream, String> {
    let failed = |e: &dyn std::fmt::Display| format!("JetStream stream {name}: {e}");
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            ..Default::default()
        })
        .await
        .map_err(|e| failed(&e))?;
    let info = stream.info().await.map_err(|e| failed(&e))?.clone();
    if info.config.subjects.iter().any(|s| s == subject) {
        return Ok(stream);
    }
    let mut config = info.config;
    config.subjects.push(subject.to_owned());
    js.update_stream(&config).await.map_err(|e| failed(&e))?;
    tracing::info!(stream = %name, %subject, "added the trigger's subject to the stream");
    js.get_stream(name).await.map_err(|e| failed(&e))
}

/// One trigger's loop.
struct Trigger {
    engine: Engine,
    config: Arc<TriggersConfig>,
    nats: Arc<Connection>,
    state: Arc<TriggerState>,
}

impl Trigger {
    async fn run(self, mut consumer: Option<Ready>, shutdown: CancellationToken) {
        let mut delay = Duration::from_millis(500);
        while !shutdown.is_cancelled() {
            let ready = match consumer.take() {
                Some(ready) => Ok(ready),
                None => set_up(&self.engine, &self.nats, &self.config, &self.state).await,
            };
            match ready {
                Ok(ready) => {
                    delay = Duration::from_millis(500);
                    self.consume(&ready, &shutdown).await;
                }
                Err(e) => {
                    tracing::warn!(trigger = %self.state.name, error = %e,
                                   "cannot set the trigger up; will retry");
                    self.state.set_error(Some(e));
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Handles messages until shutdown, or until the consumer's stream of messages fails (the
    /// consumer deleted, say): then the trigger is set up again.
    async fn consume(&self, ready: &Ready, shutdown: &CancellationToken) {
        let consumer = &ready.consumer;
        let epoch = ready.epoch.as_str();
        let lag = self.watch_lag(consumer.clone(), shutdown.child_token());
        let messages = consumer
            .stream()
            .max_messages_per_batch(self.config.max_in_flight.max(1))
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await;
        let messages = match messages {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(trigger = %self.state.name, error = %e, "cannot pull messages");
                self.state.set_error(Some(format!("pulling messages: {e}")));
                lag.cancel();
                tokio::time::sleep(Duration::from_secs(1)).await;
                return;
            }
        };
        // Stops taking messages at shutdown; those already taken are finished.
        let handled = messages
            .take_until(shutdown.cancelled())
            .map(|message| async move {
                match message {
                    Ok(message) => {
                        self.handle(message, epoch).await;
                        true
                    }
                    Err(e) => {
                        tracing::warn!(trigger = %self.state.name, error = %e,
                                       "pulling messages failed");
                        self.state.set_error(Some(format!("pulling messages: {e}")));
                        false
                    }
                }
            })
            .buffer_unordered(self.config.max_in_flight.max(1));
        futures_util::pin_mut!(handled);
        while handled.next().await.is_some() {}
        lag.cancel();
    }

    /// Reads the consumer's lag every [`TriggersConfig::lag_every`] until `stop`.
    fn watch_lag(&self, consumer: PullConsumer, stop: CancellationToken) -> CancellationToken {
        let state = self.state.clone();
        let every = self.config.lag_every;
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                match consumer.get_info().await {
                    Ok(info) => {
                        state.set_lag(info.num_pending + info.num_ack_pending as u64);
                    }
                    Err(e) => {
                        tracing::debug!(trigger = %state.name, error = %e, "reading the lag failed")
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        });
        token
    }

    /// Starts the saga of one message, then acknowledges, terminates or gives it back.
    async fn handle(&self, message: jetstream::Message, epoch: &str) {
        let (stream, seq) = match message.info() {
            Ok(info) => (info.stream.to_owned(), info.stream_sequence),
            Err(e) => {
                tracing::warn!(trigger = %self.state.name, error = %e,
                               "a message without JetStream metadata; ignored");
                return;
            }
        };
        let subject = message.subject.to_string();
        let key = message_key(&stream, epoch, seq);
        match self.start(&message.payload, key).await {
            Handled::Started => {
                // The crash window: the start committed, the message not acknowledged.
                crate::failpoint::crash_if_armed("after_trigger_start", &self.state.spec.saga);
                if let Err(e) = message.double_ack().await {
                    // Redelivered after `ack_wait`, when it finds the same saga.
                    tracing::warn!(trigger = %self.state.name, %stream, seq, error = %e,
                                   "acknowledging a message failed; it will come again");
                }
            }
            Handled::Refused(error) => {
                let refusal = NewRefusal {
                    trigger: &self.state.name,
                    stream: &stream,
                    stream_seq: seq,
                    subject: &subject,
                    error: &error,
                    body: &message.payload,
                };
                match self.engine.store().record_trigger_refusal(&refusal).await {
                    Ok(new) => {
                        if new {
                            self.state.count_refused();
                        }
                        tracing::warn!(trigger = %self.state.name, %stream, seq, %error,
                                       "message refused and terminated");
                        if let Err(e) = message.double_ack_with(AckKind::Term).await {
                            tracing::warn!(trigger = %self.state.name, error = %e,
                                           "terminating a refused message failed");
                        }
                    }
                    Err(e) => {
                        self.give_back(&message, &format!("recording its refusal: {e}"))
                            .await
                    }
                }
            }
            Handled::Retry(error) => self.give_back(&message, &error).await,
        }
    }

    /// Gives `message` back to be redelivered after the retry delay.
    async fn give_back(&self, message: &jetstream::Message, error: &str) {
        tracing::warn!(trigger = %self.state.name, %error,
                       "a message could not be handled; it will come again");
        let nak = AckKind::Nak(Some(self.config.retry_delay));
        if let Err(e) = message.ack_with(nak).await {
            tracing::warn!(trigger = %self.state.name, error = %e,
                           "giving a message back failed; it comes again after ack_wait");
        }
    }

    /// Starts the saga of the message whose key is `key` with `body` as its input.
    async fn start(&self, body: &[u8], key: String) -> Handled {
        if body.len() > self.config.max_body {
            return Handled::Refused(format!(
                "the body is {} bytes, more than the {} a trigger accepts",
                body.len(),
                self.config.max_body
            ));
        }
        let input: Value = match serde_json::from_slice(body) {
            Ok(input) => input,
            Err(e) => return Handled::Refused(format!("the body is not JSON: {e}")),
        };
        let key = StartKey::new(self.state.spec.key_scope(), key)
            .with_retention(self.config.key_retention);
        let request = StartRequest::new(self.state.spec.saga.clone(), input).with_key(key);
        match self.engine.start(request).await {
            Ok(StartOutcome::Created { .. }) => {
                self.state.count_started();
                Handled::Started
            }
            Ok(StartOutcome::Replayed { .. }) => {
                self.state.count_replayed();
                Handled::Started
            }
            Err(StartError::Store(e)) => Handled::Retry(format!("the store failed: {e}")),
            // Only a start answered later stays in progress; should one, it ends soon.
            Err(e @ StartError::KeyInProgress { .. }) => Handled::Retry(e.to_string()),
            Err(e) => Handled::Refused(e.to_string()),
        }
    }
}

/// The idempotency key of message `seq` of `stream`: the stream's name, its epoch (see
/// [`Ready::epoch`]) and the sequence number.
fn message_key(stream: &str, epoch: &str, seq: u64) -> String {
    format!("{stream}@{epoch}:{seq}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_names_hold_no_separator_and_differ_by_log() {
        let spec: TriggerSpec = "orders.*.created=place_order".parse().unwrap();
        let a = consumer_name(&spec, uuid::Uuid::from_u128(1));
        let b = consumer_name(&spec, uuid::Uuid::from_u128(2 << 80));
        assert_ne!(a, b);
        for name in [&a, &b] {
            assert!(!name.contains(['.', '*', '>', ' ', '/', '\\']), "{name}");
            assert!(name.starts_with("saga-trigger-orders_+_created-place_order-"));
        }
    }

    #[test]
    fn a_message_key_names_its_stream_and_sequence() {
        assert_eq!(message_key("ORDERS", "0a1b2c3d", 42), "ORDERS@0a1b2c3d:42");
    }
}
