//! `example-sagas bench-triggers`: sagas started from NATS JetStream messages under load.
//!
//! One trigger (`bench.orders=bench_order`) on a fresh `BENCH_TRIGGERS` stream (any stream of
//! that name on the server is deleted first), run in this process beside the engine, exactly
//! as `serve --nats-trigger` runs it. Two figures:
//!
//! 1. **Steady.** Messages published at `rate` a second for `seconds`: the sagas started per
//!    second, and the lag of each message from its publication (the time in its body) to its
//!    saga's creation (the saga's `created_at`, the database's clock on the same machine).
//! 2. **Maximum.** `burst` messages published as fast as the server takes them: sagas started
//!    per second from the first publication to the last start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use orchestrator::model::ListFilter;
use orchestrator::triggers::consumer::TriggerRunner;
use orchestrator::triggers::{TriggerBoard, TriggerSpec, TriggersConfig};
use orchestrator::Store;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::bench::bench_engine;

const STREAM: &str = "BENCH_TRIGGERS";
const SUBJECT: &str = "bench.orders";

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct TriggerBenchReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Messages a second asked for in the steady phase.
    pub rate: u32,
    /// Messages published in the steady phase.
    pub published: usize,
    /// Messages a second the publisher achieved.
    pub published_per_s: f64,
    /// Sagas started a second in the steady phase, from its first publication to its last
    /// start.
    pub started_per_s: f64,
    /// Lag, publication to saga creation, in milliseconds: median.
    pub lag_p50_ms: f64,
    /// 99th percentile.
    pub lag_p99_ms: f64,
    /// The slowest message.
    pub lag_max_ms: f64,
    /// Messages of the maximum-throughput phase.
    pub burst: usize,
    /// Sagas started a second in that phase.
    pub max_started_per_s: f64,
}

impl TriggerBenchReport {
    /// One line of `key=value` figures.
    pub fn line(&self) -> String {
        format!(
            "triggers backend={} rate={} published={} published_per_s={:.0} started_per_s={:.0} \
             lag_p50_ms={:.1} lag_p99_ms={:.1} lag_max_ms={:.1} burst={} max_started_per_s={:.0}",
            self.backend,
            self.rate,
            self.published,
            self.published_per_s,
            self.started_per_s,
            self.lag_p50_ms,
            self.lag_p99_ms,
            self.lag_max_ms,
            self.burst,
            self.max_started_per_s
        )
    }
}

fn now_ms() -> f64 {
    chrono::Utc::now().timestamp_micros() as f64 / 1000.0
}

/// How many sagas the trigger has started so far.
fn started(board: &TriggerBoard) -> u64 {
    board.views().first().map_or(0, |t| t.started)
}

/// Waits until the trigger has started `n` sagas; the instant it saw it.
async fn wait_started(board: &TriggerBoard, n: u64, limit: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if started(board) >= n {
            return Ok(Instant::now());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} sagas started in {limit:?}",
            started(board)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Publishes one message whose body carries its publication time; the acknowledgement is
/// awaited by the caller.
async fn publish(
    js: &jetstream::Context,
    i: usize,
) -> anyhow::Result<jetstream::context::PublishAckFuture> {
    let body = serde_json::json!({"i": i, "sent_ms": now_ms()}).to_string();
    Ok(js.publish(SUBJECT, body.into()).await?)
}

/// Runs both phases; see the module docs.
pub async fn run(
    store: Arc<dyn Store>,
    backend: &str,
    nats_url: &str,
    rate: u32,
    seconds: u32,
    burst: usize,
    workers: usize,
) -> anyhow::Result<TriggerBenchReport> {
    let client = async_nats::connect(nats_url).await?;
    let js = jetstream::new(client);
    // A fresh stream: the figures must not count an earlier run's messages.
    let _ = js.delete_stream(STREAM).await;
    let engine = bench_engine(store.clone(), workers, false)?;
    let shutdown = CancellationToken::new();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let spec: TriggerSpec = format!("{SUBJECT}=bench_order").parse()?;
    let board = TriggerBoard::default();
    let triggers = TriggerRunner::prepare(
        engine.clone(),
        TriggersConfig::new(nats_url, vec![spec]).with_stream(STREAM),
        &board,
    )
    .await?;
    anyhow::ensure!(
        board.views()[0].stream.as_deref() == Some(STREAM),
        "the trigger was not set up: {:?}",
        board.views()
    );
    let triggering = tokio::spawn(triggers.run(shutdown.clone()));

    // Steady: one message every 1/rate second, late ticks caught up at once.
    let total = rate as usize * seconds as usize;
    let (ack_tx, confirming) = confirmer();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let first = Instant::now();
    for i in 0..total {
        tick.tick().await;
        ack_tx.send(publish(&js, i).await?).ok();
    }
    let published_in = first.elapsed().as_secs_f64();
    drop(ack_tx);
    anyhow::ensure!(
        confirming.await? == 0,
        "JetStream refused some publications"
    );
    let last = wait_started(&board, total as u64, Duration::from_secs(600)).await?;
    let steady = last.duration_since(first).as_secs_f64();

    let mut lags = lags_of(store.as_ref()).await?;
    anyhow::ensure!(
        lags.len() == total,
        "{} sagas for {total} messages",
        lags.len()
    );
    lags.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if lags.is_empty() {
            return 0.0;
        }
        let i = ((lags.len() as f64 * p).ceil() as usize).clamp(1, lags.len()) - 1;
        lags[i]
    };

    // Maximum: every message sent as fast as the client lets it (it holds a publication back
    // while too many wait for their acknowledgement), the acknowledgements awaited beside.
    let before = started(&board);
    let first = Instant::now();
    let (ack_tx, confirming) = confirmer();
    for i in 0..burst {
        ack_tx.send(publish(&js, total + i).await?).ok();
    }
    drop(ack_tx);
    anyhow::ensure!(
        confirming.await? == 0,
        "JetStream refused some publications"
    );
    let last = wait_started(&board, before + burst as u64, Duration::from_secs(600)).await?;
    let max = burst as f64 / last.duration_since(first).as_secs_f64();

    shutdown.cancel();
    triggering.await?;
    runner.await??;
    Ok(TriggerBenchReport {
        backend: backend.to_owned(),
        rate,
        published: total,
        published_per_s: total as f64 / published_in,
        started_per_s: total as f64 / steady,
        lag_p50_ms: pct(0.50),
        lag_p99_ms: pct(0.99),
        lag_max_ms: pct(1.0),
        burst,
        max_started_per_s: max,
    })
}

/// A task awaiting the acknowledgements sent to it, in order; it ends with how many failed
/// once the sender is dropped.
fn confirmer() -> (
    tokio::sync::mpsc::UnboundedSender<jetstream::context::PublishAckFuture>,
    tokio::task::JoinHandle<usize>,
) {
    let (ack_tx, mut ack_rx) =
        tokio::sync::mpsc::unbounded_channel::<jetstream::context::PublishAckFuture>();
    let confirming = tokio::spawn(async move {
        let mut failed = 0usize;
        while let Some(ack) = ack_rx.recv().await {
            if ack.await.is_err() {
                failed += 1;
            }
        }
        failed
    });
    (ack_tx, confirming)
}

/// Each saga's lag, its creation minus the publication time in its input.
async fn lags_of(store: &dyn Store) -> anyhow::Result<Vec<f64>> {
    let mut lags = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_sagas(&ListFilter {
                name: Some("bench_order".to_owned()),
                limit: 1000,
                cursor,
                ..ListFilter::default()
            })
            .await?;
        for summary in &page.sagas {
            let saga = store
                .get_saga(summary.id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("saga {} vanished", summary.id))?;
            let sent = saga.input["sent_ms"].as_f64().unwrap_or(0.0);
            lags.push((summary.created_at as f64 - sent).max(0.0));
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(lags),
        }
    }
}
