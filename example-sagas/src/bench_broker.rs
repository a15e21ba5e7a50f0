//! `example-sagas bench-broker`: the outbox relay to NATS JetStream under load.
//!
//! Two figures, on a fresh database and a fresh `SAGAS` stream (any stream of that name on
//! the server is deleted first):
//!
//! 1. **Live.** `sagas` happy sagas at `concurrency` in flight, with the NATS relay running and
//!    a JetStream pull consumer in the same process: end-to-end lag per event, from the
//!    event's commit time (`at`) to its arrival at the consumer, and the saga rate beside it.
//! 2. **Backlog.** `backlog` more sagas run with the relay stopped; then a relay starts and the
//!    time until it has published them all gives its throughput in events per second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy};
use futures_util::StreamExt;
use orchestrator::broker::nats::{NatsConfig, NatsTarget, TARGET_NAME};
use orchestrator::broker::{BrokerRelay, BrokerRelayConfig, EventTarget};
use orchestrator::Store;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::bench::{bench_engine, lanes, Scenario};

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerBenchReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Sagas of the live phase.
    pub sagas: usize,
    /// Sagas in flight.
    pub concurrency: usize,
    /// Sagas per second in the live phase (with the relay and consumer running).
    pub sagas_per_s: f64,
    /// Events of the live phase.
    pub events: usize,
    /// End-to-end lag, commit to consumer, in milliseconds.
    pub lag_p50_ms: f64,
    /// 99th percentile.
    pub lag_p99_ms: f64,
    /// The slowest event.
    pub lag_max_ms: f64,
    /// Events published from the backlog.
    pub backlog_events: i64,
    /// The relay's throughput on the backlog, in events per second.
    pub backlog_events_per_s: f64,
}

impl BrokerBenchReport {
    /// One line of `key=value` figures.
    pub fn line(&self) -> String {
        format!(
            "broker backend={} sagas={} concurrency={} sagas_per_s={:.0} events={} \
             lag_p50_ms={:.1} lag_p99_ms={:.1} lag_max_ms={:.1} backlog_events={} \
             backlog_events_per_s={:.0}",
            self.backend,
            self.sagas,
            self.concurrency,
            self.sagas_per_s,
            self.events,
            self.lag_p50_ms,
            self.lag_p99_ms,
            self.lag_max_ms,
            self.backlog_events,
            self.backlog_events_per_s
        )
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Runs both phases; see the module docs.
pub async fn run(
    store: Arc<dyn Store>,
    backend: &str,
    nats_url: &str,
    sagas: usize,
    concurrency: usize,
    backlog: usize,
) -> anyhow::Result<BrokerBenchReport> {
    let client = async_nats::connect(nats_url).await?;
    let js = jetstream::new(client);
    let config = NatsConfig::new(nats_url);
    // A fresh stream: the figures must not count an earlier run's messages.
    let _ = js.delete_stream(&config.stream).await;
    let relay_of = || {
        BrokerRelay::new(
            store.clone(),
            Arc::new(NatsTarget::new(config.clone())),
            BrokerRelayConfig::default(),
        )
    };
    // The relay makes the stream only once it has events to publish: make it first, so the
    // consumer can attach before any saga runs.
    NatsTarget::new(config.clone())
        .prepare()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let stream = js.get_stream(&config.stream).await?;
    let relaying = CancellationToken::new();
    let relay = tokio::spawn(relay_of().run(relaying.clone()));
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(pull::Config {
            ack_policy: AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;

    let engine = bench_engine(store.clone(), concurrency, false)?;
    let shutdown = CancellationToken::new();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let started = Instant::now();
    let ran = tokio::spawn({
        let engine = engine.clone();
        async move { lanes(&engine, Scenario::Happy, sagas, concurrency).await }
    });
    let mut lags = Vec::new();
    let mut wall = None;
    let mut quiet = false;
    loop {
        if wall.is_none() && ran.is_finished() {
            wall = Some(started.elapsed().as_secs_f64());
        }
        // Whether the relay is done is asked of the store only now and then: a query for each
        // message received would slow down the consumer being measured.
        if wall.is_some() && (quiet || lags.len() % 1000 == 0) {
            let p = store.relay_progress(TARGET_NAME).await?;
            let total = usize::try_from(p.event_id).unwrap_or(0);
            // Ids are dense on SQLite; on PostgreSQL a quiet consumer says the rest.
            if p.lag_events == 0 && (lags.len() >= total || quiet) {
                break;
            }
        }
        let next = tokio::time::timeout(Duration::from_millis(200), messages.next()).await;
        quiet = next.is_err();
        if let Ok(Some(message)) = next {
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            let body: serde_json::Value = serde_json::from_slice(&message.payload)?;
            let at = body["at"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.timestamp_millis())
                .unwrap_or_else(now_ms);
            lags.push((now_ms() - at).max(0) as f64);
        }
    }
    let (_, errors, _) = ran.await??;
    anyhow::ensure!(errors == 0, "{errors} sagas did not complete");
    let wall = wall.unwrap_or_else(|| started.elapsed().as_secs_f64());
    let events = lags.len();
    lags.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if lags.is_empty() {
            return 0.0;
        }
        let i = ((lags.len() as f64 * p).ceil() as usize).clamp(1, lags.len()) - 1;
        lags[i]
    };

    relaying.cancel();
    relay.await?;
    lanes(&engine, Scenario::Happy, backlog, concurrency).await?;
    let waiting = store.relay_progress(TARGET_NAME).await?;
    // Where the relay's cursor will stand once it has published the backlog: watching for it
    // is one row's read, where counting what is left would compete with the relay.
    let from = store.relay_cursor(TARGET_NAME).await?;
    let end = store
        .outbox_after(from, u32::MAX)
        .await?
        .last()
        .map_or(from, |e| e.position);
    let relaying = CancellationToken::new();
    let drain_start = Instant::now();
    let relay = tokio::spawn(relay_of().run(relaying.clone()));
    while store.relay_cursor(TARGET_NAME).await? != end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drained = drain_start.elapsed().as_secs_f64();
    relaying.cancel();
    relay.await?;
    shutdown.cancel();
    runner.await??;
    Ok(BrokerBenchReport {
        backend: backend.to_owned(),
        sagas,
        concurrency,
        sagas_per_s: sagas as f64 / wall,
        events,
        lag_p50_ms: pct(0.50),
        lag_p99_ms: pct(0.99),
        lag_max_ms: pct(1.0),
        backlog_events: waiting.lag_events,
        backlog_events_per_s: waiting.lag_events as f64 / drained,
    })
}
