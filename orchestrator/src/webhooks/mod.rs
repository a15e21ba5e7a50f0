//! Webhooks: the transactional outbox relay and its signed deliveries.
//!
//! # Why it works this way
//!
//! The events table is a transactional outbox (see [`crate::relay`]): an event exists if and
//! only if the step-log change that caused it happened. A [`Relay`] turns those events into
//! HTTP deliveries, as one of the outbox's destinations:
//!
//! 1. **Enqueue.** It reads the events after its durable cursor and, in one transaction, records
//!    one delivery per (event, target) and moves the cursor. Targets are the saga's callback URL
//!    (registered by the client with `Saga-Callback-Url` when it started the saga) and the
//!    operator's global subscribers ([`WebhookConfig::subscribers`], `--webhook-url`).
//! 2. **Deliver.** It claims due deliveries (a claim is a lease: a relay that dies mid-send is
//!    replaced when the lease runs out), POSTs each one, and records the answer: delivered on
//!    `2xx`; otherwise a retry after an exponential backoff with jitter (tokio-retry), whose due
//!    time is in the database so it survives a restart; given up after
//!    [`WebhookConfig::max_attempts`].
//!
//! Delivery is **at least once**: a relay killed after the receiver answered but before the
//! answer was recorded sends the same event again, with the same `Saga-Event-Id`, which
//! receivers use to deduplicate. Deliveries are **in order per saga and target**: event N+1 of
//! a saga is not sent to a target before event N was delivered to it (or given up). Several
//! processes sharing a PostgreSQL database may each run a relay; the store makes them share
//! the work without sending anything twice beyond what at-least-once allows.
//!
//! Every delivery is signed ([`signature`]): `Saga-Signature: t=<unix>,v1=<hmac-sha256 hex>`
//! over `"<t>.<body>"`, with the saga's callback secret if the client gave one, else the
//! server's [`WebhookConfig::secret`]. Receivers check it with [`verify_signature`].
//!
//! The body is JSON: `{"id": event id, "type", "saga_id", "saga_name", "step", "at", "data"}`
//! ([`EventPayload`], the document a broker message carries too).

pub mod guard;
pub mod signature;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::relay::{self, Cursor, Destination, EventPayload, Pacing, Turn};
use crate::store::outbox::{
    ClaimedDelivery, DeliveryOutcome, NewDelivery, OutboxPosition, OutboxStore, TargetKind,
};
use crate::store::StoreError;
use guard::GuardedResolver;
pub use guard::{CallbackPolicy, CallbackRefusal};
pub use signature::{
    sign, verify_signature, verify_signature_at, SignatureError, DEFAULT_TOLERANCE,
    EVENT_ID_HEADER, SIGNATURE_HEADER,
};

/// The name of the relay's cursor in `relay_cursors`.
pub const RELAY_NAME: &str = "webhooks";

/// Settings of the relay. Build one with struct-update syntax:
/// `WebhookConfig { subscribers: vec![url], ..WebhookConfig::default() }`.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Global subscribers: every event of every saga is delivered to each of these URLs. Every
    /// process sharing a database should list the same ones (the relays share one cursor).
    pub subscribers: Vec<String>,
    /// Signs deliveries (unless a saga has its own callback secret); `None` sends them
    /// unsigned. Binaries read it from `SAGA_WEBHOOK_SECRET` or `--webhook-secret`.
    pub secret: Option<String>,
    /// How long one attempt may take (connect, send, answer). Default: 10 seconds. A claimed
    /// delivery is leased for twice this plus a second, so a relay that died mid-send is
    /// replaced after that.
    pub timeout: Duration,
    /// How often the relay looks for new events and due retries when idle. Default: 250 ms.
    pub poll_interval: Duration,
    /// The first retry delay; each further one doubles, with jitter. Default: 1 second.
    pub retry_base: Duration,
    /// The longest retry delay. Default: 1 hour.
    pub retry_max: Duration,
    /// Attempts before a delivery is given up (then the saga's later events go on).
    /// Default: 20 (about 10 hours with the default delays).
    pub max_attempts: u32,
    /// Deliveries sent at once. Default: 8.
    pub concurrency: usize,
    /// Events read per batch. Default: 200.
    pub batch: u32,
    /// Which internal hosts a saga's callback URL may reach (`--allow-callback-host`). Each
    /// delivery to a callback is checked again, since a name may resolve elsewhere by then;
    /// the operator's [`subscribers`](Self::subscribers) are trusted as configured.
    pub callbacks: CallbackPolicy,
    /// A PEM file of certificates to trust besides the public roots, for receivers whose
    /// certificates a private CA signed (`--webhook-ca-file`).
    pub ca_file: Option<std::path::PathBuf>,
    /// Which sagas' spans are exported ([`crate::telemetry`]), so that the `traceparent` each
    /// delivery carries says whether its saga span is sampled. Default: none.
    pub trace_sampling: crate::telemetry::Sampling,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            subscribers: Vec::new(),
            secret: None,
            timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(250),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(3600),
            max_attempts: 20,
            concurrency: 8,
            batch: 200,
            callbacks: CallbackPolicy::default(),
            ca_file: None,
            trace_sampling: crate::telemetry::Sampling::NONE,
        }
    }
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("subscribers", &self.subscribers)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("poll_interval", &self.poll_interval)
            .field("retry_base", &self.retry_base)
            .field("retry_max", &self.retry_max)
            .field("max_attempts", &self.max_attempts)
            .field("concurrency", &self.concurrency)
            .field("batch", &self.batch)
            .field("callbacks", &self.callbacks)
            .field("ca_file", &self.ca_file)
            .field("trace_sampling", &self.trace_sampling)
            .finish()
    }
}

impl WebhookConfig {
    /// How long a claimed delivery is leased.
    pub fn claim_lease(&self) -> Duration {
        self.timeout * 2 + Duration::from_secs(1)
    }

    /// The delay before attempt `attempts + 1`, after `attempts` failed ones (exponential from
    /// [`retry_base`](Self::retry_base), capped at [`retry_max`](Self::retry_max), the upper
    /// half jittered); `None` once [`max_attempts`](Self::max_attempts) are spent.
    pub fn retry_delay(&self, attempts: u32) -> Option<Duration> {
        if attempts >= self.max_attempts {
            return None;
        }
        Some(crate::clock::backoff(
            self.retry_base,
            self.retry_max,
            attempts,
        ))
    }
}

/// Why the relay could not start or do a round.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// A subscriber URL is not an `http` URL this build can deliver to.
    #[error("webhook URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The file of trusted certificates cannot be used.
    #[error("webhook CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (the cause is in the message, so it is not also a
    /// `source()`, which would print it twice in a chain).
    #[error("cannot build the webhook HTTP client: {0}")]
    Client(reqwest::Error),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks that `url` is an absolute `http` or `https` URL with a host. Whether its host may be
/// reached is [`CallbackPolicy`]'s question, for callbacks.
pub fn check_url(url: &str) -> Result<reqwest::Url, WebhookError> {
    let invalid = |reason: String| WebhookError::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(e.to_string()))?;
    match parsed.scheme() {
        "http" => {}
        "https" => {}
        other => return Err(invalid(format!("scheme {other:?} is not http or https"))),
    }
    if parsed.host_str().is_none() {
        return Err(invalid("no host".to_owned()));
    }
    Ok(parsed)
}

/// How long the relay may read past its durable cursor over events that have no target
/// before it records how far it got (see [`Relay::relay_once`]).
const SKIP_PERSIST_EVERY: Duration = Duration::from_secs(1);

/// Events read past the durable cursor that needed no delivery, not yet recorded.
#[derive(Debug, Clone, Copy)]
struct Skipped {
    /// The durable cursor they were read after.
    durable: OutboxPosition,
    /// How far they go.
    read_to: OutboxPosition,
    /// When the first of them was read.
    since: tokio::time::Instant,
}

/// The outbox relay and webhook sender of one process. Cheap to clone.
#[derive(Clone)]
pub struct Relay {
    cursor: Cursor,
    config: Arc<WebhookConfig>,
    /// Sends to the operator's subscribers.
    client: reqwest::Client,
    /// Sends to the clients' callbacks: refuses to resolve a name to an internal address.
    callback_client: reqwest::Client,
    skipped: Arc<std::sync::Mutex<Option<Skipped>>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay over `outbox`; fails on a subscriber URL it cannot deliver to.
    pub fn new(outbox: Arc<dyn OutboxStore>, config: WebhookConfig) -> Result<Self, WebhookError> {
        for url in &config.subscribers {
            check_url(url)?;
        }
        let roots = match &config.ca_file {
            Some(path) => read_roots(path)?,
            None => Vec::new(),
        };
        let client = client_builder(&config, &roots)
            .build()
            .map_err(WebhookError::Client)?;
        let callback_client = client_builder(&config, &roots)
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::new(
                config.callbacks.clone(),
            ))))
            // A proxy would resolve the name itself, out of the resolver's sight.
            .no_proxy()
            .build()
            .map_err(WebhookError::Client)?;
        Ok(Self {
            cursor: Cursor::new(outbox, RELAY_NAME),
            config: Arc::new(config),
            client,
            callback_client,
            skipped: Arc::default(),
        })
    }

    /// Runs until `shutdown` is cancelled: relays new events and sends due deliveries. An
    /// attempt in flight at shutdown is finished and recorded (each is bounded by the timeout).
    pub async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(
            subscribers = self.config.subscribers.len(),
            "webhook relay started"
        );
        // A failed turn is not paced by a backoff: each delivery keeps its own retry time in
        // the database, and a failing half of a turn does not stop the other.
        let pacing = Pacing {
            poll_interval: self.config.poll_interval,
            retry_base: self.config.poll_interval,
            retry_max: self.config.poll_interval,
            report_every: Duration::from_secs(5),
        };
        relay::run(&mut self, pacing, shutdown).await;
        tracing::info!("webhook relay stopped");
    }

    /// Reads the events after the cursor and enqueues their deliveries; returns how many
    /// events were read.
    ///
    /// Events that need no delivery (no subscribers, and sagas without a callback: the common
    /// case of a server without webhooks) are read past without a write: the cursor is
    /// recorded with the next batch that has deliveries, once the relay is idle, or at least
    /// every second. Until then a restarted relay reads those events again and finds, again,
    /// nothing to send; a relay of another process that moves the cursor first makes this one
    /// start over from it.
    pub async fn relay_once(&self) -> Result<usize, WebhookError> {
        let durable = self.cursor.durable().await?;
        let skipped = (*self.skipped()).filter(|s| s.durable == durable);
        let from = skipped.map_or(durable, |s| s.read_to);
        let events = self.cursor.events_after(from, self.config.batch).await?;
        let Some(last) = events.last() else {
            // Idle: record how far the skipped events go.
            if skipped.is_some() {
                self.advance(durable, from, &[]).await?;
            }
            return Ok(0);
        };
        let to = last.position;
        let sagas: Vec<Uuid> = events
            .iter()
            .map(|e| e.saga_id)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let callbacks = self.cursor.outbox().saga_callbacks(&sagas).await?;
        let mut deliveries = Vec::new();
        for event in &events {
            if let Some(callback) = callbacks.get(&event.saga_id) {
                deliveries.push(NewDelivery {
                    event_id: event.id(),
                    saga_id: event.saga_id,
                    target: callback.url.clone(),
                    kind: TargetKind::Callback,
                });
            }
            for url in &self.config.subscribers {
                deliveries.push(NewDelivery {
                    event_id: event.id(),
                    saga_id: event.saga_id,
                    target: url.clone(),
                    kind: TargetKind::Subscriber,
                });
            }
        }
        if deliveries.is_empty() {
            let since = skipped.map_or_else(tokio::time::Instant::now, |s| s.since);
            if since.elapsed() < SKIP_PERSIST_EVERY {
                *self.skipped() = Some(Skipped {
                    durable,
                    read_to: to,
                    since,
                });
                return Ok(events.len());
            }
        }
        if !self.advance(durable, to, &deliveries).await? {
            // Another relay moved the cursor first and enqueued this batch itself.
            return Ok(0);
        }
        Ok(events.len())
    }

    /// The events read past the durable cursor and not yet recorded (a panic elsewhere while
    /// the lock was held leaves a value that is still whole).
    fn skipped(&self) -> std::sync::MutexGuard<'_, Option<Skipped>> {
        self.skipped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the durable cursor from `durable` to `to` with `deliveries`, compare-and-set;
    /// whatever was skipped past it is then either recorded or, if another relay moved the
    /// cursor first, to be read again from where that one left it.
    async fn advance(
        &self,
        durable: OutboxPosition,
        to: OutboxPosition,
        deliveries: &[NewDelivery],
    ) -> Result<bool, WebhookError> {
        let moved = self.cursor.advance(durable, to, deliveries).await;
        *self.skipped() = None;
        Ok(moved?)
    }

    /// Claims due deliveries, sends them concurrently and records each answer; returns how
    /// many were attempted.
    pub async fn deliver_once(&self) -> Result<usize, WebhookError> {
        let claimed = self
            .cursor
            .outbox()
            .claim_deliveries(
                u32::try_from(self.config.concurrency.max(1)).unwrap_or(u32::MAX),
                self.config.claim_lease(),
            )
            .await?;
        let count = claimed.len();
        let mut sends = JoinSet::new();
        for delivery in claimed {
            let relay = self.clone();
            sends.spawn(async move { relay.attempt(delivery).await });
        }
        while let Some(done) = sends.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "recording a webhook attempt failed"),
                Err(e) => tracing::error!(error = %e, "a webhook attempt panicked"),
            }
        }
        Ok(count)
    }

    /// One attempt of one delivery: send, then record.
    #[tracing::instrument(skip_all, fields(event.id = d.event.id(), saga.id = %d.event.saga_id, target = %d.target, attempt = d.attempt))]
    async fn attempt(&self, d: ClaimedDelivery) -> Result<(), StoreError> {
        let body = EventPayload::body(&d.event);
        let secret = match d.kind {
            TargetKind::Callback => d.callback_secret.as_ref().or(self.config.secret.as_ref()),
            TargetKind::Subscriber => self.config.secret.as_ref(),
        };
        let client = match d.kind {
            TargetKind::Callback => {
                if let Err(refusal) = self.check_callback(&d.target) {
                    let outcome = self.failed(&d, None, format!("not sent: {refusal}"));
                    return self
                        .cursor
                        .outbox()
                        .finish_delivery(d.event.id(), &d.target, d.attempt, &outcome)
                        .await;
                }
                &self.callback_client
            }
            TargetKind::Subscriber => &self.client,
        };
        let mut request = client
            .post(&d.target)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(EVENT_ID_HEADER, d.event.id().to_string());
        if let Some(traceparent) = d.event.trace_header(self.config.trace_sampling) {
            request = request.header("traceparent", traceparent);
        }
        if let Some(secret) = secret {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_secs() as i64)
                .unwrap_or(0);
            request = request.header(SIGNATURE_HEADER, sign(secret, now, &body));
        }
        let outcome = match request.body(body).send().await {
            Ok(response) if response.status().is_success() => {
                let status = response.status().as_u16();
                // The crash window of at-least-once: sent, not yet recorded.
                crate::failpoint::crash_if_armed("after_webhook_send", &d.event.kind);
                metrics::counter!("webhook_deliveries_total", "result" => "delivered").increment(1);
                DeliveryOutcome::Delivered { status }
            }
            Ok(response) => {
                let status = response.status();
                self.failed(
                    &d,
                    Some(status.as_u16()),
                    format!("receiver answered {status}"),
                )
            }
            Err(e) => self.failed(&d, None, error_chain(&e)),
        };
        self.cursor
            .outbox()
            .finish_delivery(d.event.id(), &d.target, d.attempt, &outcome)
            .await
    }

    /// The check of a callback's literal address before each send (names are checked as the
    /// callback client resolves them).
    fn check_callback(&self, target: &str) -> Result<(), String> {
        let url = reqwest::Url::parse(target).map_err(|e| format!("not a URL: {e}"))?;
        self.config
            .callbacks
            .check_literal(&url)
            .map_err(|refusal| format!("the callback URL is not allowed: {refusal}"))
    }

    fn failed(&self, d: &ClaimedDelivery, status: Option<u16>, error: String) -> DeliveryOutcome {
        let retry_in = self.config.retry_delay(d.attempt);
        metrics::counter!("webhook_failures_total").increment(1);
        match retry_in {
            Some(delay) => tracing::info!(%error, retry_in_ms = delay.as_millis() as u64,
                                          "webhook delivery failed; will retry"),
            None => {
                metrics::counter!("webhook_deliveries_total", "result" => "gave_up").increment(1);
                tracing::warn!(%error, "webhook delivery failed for the last time; giving up")
            }
        }
        DeliveryOutcome::Failed {
            status,
            error,
            retry_in,
        }
    }
}

#[async_trait]
impl Destination for Relay {
    fn cursor(&self) -> &Cursor {
        &self.cursor
    }

    /// Relays new events, then sends due deliveries; busy while a full batch was read or
    /// something was sent.
    async fn turn(&mut self) -> Turn {
        let read = match self.relay_once().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "relaying outbox events failed; will retry");
                0
            }
        };
        let sent = match self.deliver_once().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "claiming webhook deliveries failed; will retry");
                0
            }
        };
        if read >= self.config.batch as usize || sent > 0 {
            Turn::Busy
        } else {
            Turn::Idle
        }
    }
}

/// The certificates of a PEM file, at least one.
fn read_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, WebhookError> {
    let fail = |reason: String| WebhookError::CaFile {
        path: path.display().to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| fail(e.to_string()))?;
    if roots.is_empty() {
        return Err(fail("no PEM certificate in it".to_owned()));
    }
    Ok(roots)
}

/// The settings both of the relay's HTTP clients share: timeouts, no redirects, the agent,
/// the trusted roots.
fn client_builder(
    config: &WebhookConfig,
    roots: &[reqwest::Certificate],
) -> reqwest::ClientBuilder {
    let builder = roots.iter().fold(reqwest::Client::builder(), |b, cert| {
        b.add_root_certificate(cert.clone())
    });
    builder
        .use_rustls_tls()
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(Duration::from_secs(5)))
        // A receiver cannot send the relay elsewhere, inside the network least of all.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!(
            "saga-orchestrator-webhooks/",
            env!("CARGO_PKG_VERSION")
        ))
}

/// An error with its causes on one line (reqwest's own message is only "error sending request").
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_and_stop() {
        let config = WebhookConfig {
            retry_base: Duration::from_millis(100),
            retry_max: Duration::from_millis(1000),
            max_attempts: 6,
            ..WebhookConfig::default()
        };
        let within = |attempts: u32, low: u64, high: u64| {
            let d = config.retry_delay(attempts).expect("a retry").as_millis() as u64;
            assert!((low..=high).contains(&d), "after {attempts}: {d} ms");
        };
        within(1, 50, 100);
        within(2, 100, 200);
        within(3, 200, 400);
        within(5, 500, 1000);
        assert_eq!(config.retry_delay(6), None);
    }

    #[test]
    fn only_http_and_https_urls_are_accepted() {
        assert!(check_url("http://127.0.0.1:9/hook").is_ok());
        assert!(check_url("https://example.com/hook").is_ok());
        assert!(check_url("ftp://example.com/").is_err());
        assert!(check_url("nope").is_err());
    }
}
