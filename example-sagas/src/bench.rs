//! `example-sagas bench`: the in-process throughput and latency benchmark.
//!
//! It runs a 3-step no-op saga (`happy`), or the same saga with the last step failing
//! permanently on its first attempt and two compensations (`compensate`), against a fresh
//! database, keeping `concurrency` sagas in flight: each of `concurrency` lanes starts its next
//! saga as soon as its previous one ended, the same shape as the peer harness in
//! `shared/peers`. Latency is start → terminal status known to the caller.

use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::{Engine, EngineConfig, SagaStatus, Store};
use saga_dsl::{Registry, RetryPolicy, SagaDefinition, Step, StepContext, StepError};
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Which workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Three no-op steps.
    Happy,
    /// The third step fails permanently on its first try; two compensations run.
    Compensate,
    /// Only starts: each lane starts its next saga as soon as the start returned (the sagas run
    /// in the background meanwhile). The in-process figure to set beside HTTP starts.
    Starts,
    /// One parallel group of ten no-op branches.
    Parallel,
    /// Three no-op steps under a max running of 64 and a per-key limit of 8, over 16 keys.
    Limited,
    /// One call taking a token from a rate limiter (`--rate`, burst 1).
    Rated,
    /// `happy`'s three no-op steps, of a definition declaring two search attributes.
    Attrs,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Happy => "happy",
            Scenario::Compensate => "compensate",
            Scenario::Starts => "starts",
            Scenario::Parallel => "parallel",
            Scenario::Limited => "limited",
            Scenario::Rated => "rated",
            Scenario::Attrs => "attrs",
        }
    }
}

/// One benchmark run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The workload.
    pub scenario: Scenario,
    /// Sagas measured (after the warm-up).
    pub sagas: usize,
    /// Sagas kept in flight.
    pub concurrency: usize,
    /// Orchestrator processes sharing the database.
    pub processes: usize,
    /// Throughput.
    pub sagas_per_s: f64,
    /// Step executions per second (3 per happy saga; 5 per compensated one).
    pub steps_per_s: f64,
    /// Median latency.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// The slowest saga.
    pub max_ms: f64,
    /// Database commits per saga during the measured phase.
    pub commits_per_saga: f64,
    /// Peak resident memory of this process.
    pub peak_rss_mb: f64,
    /// Sagas that did not end as expected (must be 0).
    pub errors: usize,
    /// For `limited`: the 99th percentile of how long a saga waited to start (creation to
    /// first attempt, from the attempt log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_p99_ms: Option<f64>,
    /// For `rated`: the calls per second the participant saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_per_s: Option<f64>,
    /// For `rated`: the most calls the participant saw in any one second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_calls_in_a_second: Option<u64>,
}

impl BenchReport {
    /// The one-line text form.
    pub fn line(&self) -> String {
        format!(
            "bench backend={} scenario={} sagas={} concurrency={} processes={} sagas_per_s={:.1} \
             steps_per_s={:.1} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} commits_per_saga={:.2} peak_rss_mb={:.1} errors={}{}",
            self.backend,
            self.scenario.name(),
            self.sagas,
            self.concurrency,
            self.processes,
            self.sagas_per_s,
            self.steps_per_s,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.commits_per_saga,
            self.peak_rss_mb,
            self.errors,
            [
                self.start_p99_ms.map(|v| format!(" start_p99_ms={v:.1}")),
                self.calls_per_s.map(|v| format!(" calls_per_s={v:.1}")),
                self.max_calls_in_a_second.map(|v| format!(" max_calls_in_a_second={v}")),
            ]
            .into_iter()
            .flatten()
            .collect::<String>()
        )
    }
}

/// The benchmark saga: three no-op steps; with `fail_last`, the third fails permanently.
pub fn bench_saga() -> Result<SagaDefinition, saga_dsl::DefinitionError> {
    bench_steps(SagaDefinition::builder("bench_order", 1))
}

/// The input's fields the `attrs` workload's attributes are read from.
#[derive(serde::Deserialize)]
struct BenchAttrs {
    order: String,
    #[serde(default)]
    user: String,
}

/// The `attrs` workload's saga: [`bench_saga`]'s steps, with two search attributes (`order`
/// and `user`), written with each start.
pub fn bench_attrs_saga() -> Result<SagaDefinition, saga_dsl::DefinitionError> {
    bench_steps(
        SagaDefinition::builder("bench_attrs", 1)
            .attr("order", |i: &BenchAttrs| i.order.clone())
            .attr("user", |i: &BenchAttrs| i.user.clone()),
    )
}

/// [`bench_saga`]'s three steps on `builder`.
fn bench_steps(
    builder: saga_dsl::SagaBuilder,
) -> Result<SagaDefinition, saga_dsl::DefinitionError> {
    async fn noop(ctx: StepContext) -> Result<serde_json::Value, StepError> {
        Ok(json!({"step": ctx.step_name(), "ok": true}))
    }
    async fn first(ctx: StepContext) -> Result<serde_json::Value, StepError> {
        if ctx.raw_input()["park"].as_bool() == Some(true) {
            // The `timers` measurement: wait an hour on a durable retry timer.
            return Err(StepError::retry_after(
                Duration::from_secs(3600),
                "parked on a retry timer",
            ));
        }
        noop(ctx).await
    }
    async fn undo(_ctx: StepContext) -> Result<(), StepError> {
        Ok(())
    }
    async fn last(ctx: StepContext) -> Result<serde_json::Value, StepError> {
        if ctx.raw_input()["fail_last"].as_bool() == Some(true) {
            return Err(StepError::permanent("no rider within 5 km"));
        }
        noop(ctx).await
    }
    builder
        .step(Step::compensatable("reserve_stock", first, undo))
        .step(Step::compensatable("charge_payment", noop, undo))
        .step(Step::compensatable("assign_rider", last, undo).retry(RetryPolicy::no_retry()))
        .build()
}

/// What one benchmark run does.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// `sqlite` or `postgres` (for the report).
    pub backend: String,
    /// The database URL (passed to helper worker processes).
    pub url: String,
    /// The workload.
    pub scenario: Scenario,
    /// Sagas to measure.
    pub sagas: usize,
    /// Sagas kept in flight.
    pub concurrency: usize,
    /// Engine workers per process.
    pub workers: usize,
    /// Orchestrator processes: this one plus `processes - 1` helper processes (PostgreSQL only).
    pub processes: usize,
    /// Where this process's engine exports its spans (`--otlp-endpoint`); disabled by default.
    pub telemetry: orchestrator::telemetry::Telemetry,
    /// The rate limiter's rate of the `rated` workload.
    pub rate: saga_dsl::Rate,
}

/// An engine over `store` that runs the benchmark saga (and the parallel one, if asked),
/// exporting no spans.
pub fn bench_engine(
    store: Arc<dyn Store>,
    workers: usize,
    parallel: bool,
) -> anyhow::Result<Engine> {
    traced_bench_engine(store, workers, parallel, Default::default(), Vec::new())
}

/// [`bench_engine`], its spans exported through `telemetry`, running `extra` definitions too.
pub fn traced_bench_engine(
    store: Arc<dyn Store>,
    workers: usize,
    parallel: bool,
    telemetry: orchestrator::telemetry::Telemetry,
    extra: Vec<SagaDefinition>,
) -> anyhow::Result<Engine> {
    let mut registry = Registry::new();
    registry.register(bench_saga()?)?;
    if parallel {
        registry.register(bench_parallel_saga()?)?;
    }
    for def in extra {
        registry.register(def)?;
    }
    Ok(Engine::new(
        store,
        Arc::new(registry),
        EngineConfig {
            workers,
            telemetry,
            ..EngineConfig::default()
        },
    ))
}

/// Helper worker processes of a multi-process run; killed when dropped.
struct Helpers(Vec<tokio::process::Child>);

impl Helpers {
    async fn spawn(plan: &BenchPlan) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let exe = std::env::current_exe()?;
        let mut children = Helpers(Vec::new());
        for _ in 1..plan.processes {
            let mut child = tokio::process::Command::new(&exe)
                .args(["bench-worker", "--database-url", &plan.url])
                .args(["--workers", &plan.workers.to_string()])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()?;
            // Wait until it has registered and is claiming.
            let mut line = String::new();
            if let Some(out) = child.stdout.as_mut() {
                tokio::io::BufReader::new(out).read_line(&mut line).await?;
            }
            anyhow::ensure!(
                line.starts_with("ready"),
                "bench worker did not start: {line:?}"
            );
            children.0.push(child);
        }
        Ok(children)
    }

    /// Stops every helper (SIGTERM: they finish what they hold) and returns their commits.
    async fn stop(mut self) -> anyhow::Result<u64> {
        use tokio::io::AsyncReadExt;
        let mut commits = 0;
        for mut child in std::mem::take(&mut self.0) {
            if let Some(pid) = child.id() {
                tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await?;
            }
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                stdout.read_to_string(&mut out).await?;
            }
            child.wait().await?;
            commits += out
                .lines()
                .find_map(|l| l.strip_prefix("commits="))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        Ok(commits)
    }
}

/// Runs the benchmark on `store` and returns its figures.
pub async fn run(store: Arc<dyn Store>, plan: &BenchPlan) -> anyhow::Result<BenchReport> {
    let (scenario, sagas, concurrency) = (plan.scenario, plan.sagas, plan.concurrency);
    anyhow::ensure!(
        plan.processes <= 1 || plan.backend == "postgres",
        "several processes share a database only on PostgreSQL"
    );
    anyhow::ensure!(
        plan.processes <= 1 || !matches!(scenario, Scenario::Limited | Scenario::Rated),
        "the flow-control workloads run in one process"
    );
    let calls = crate::bench_flow::Calls::default();
    let extra = match scenario {
        Scenario::Limited => vec![crate::bench_flow::bench_limited_saga()?],
        Scenario::Rated => vec![crate::bench_flow::bench_rated_saga(
            plan.rate,
            calls.clone(),
        )?],
        Scenario::Attrs => vec![bench_attrs_saga()?],
        _ => Vec::new(),
    };
    let engine = traced_bench_engine(
        store.clone(),
        plan.workers,
        scenario == Scenario::Parallel,
        plan.telemetry.clone(),
        extra,
    )?;
    let shutdown = CancellationToken::new();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let concurrency = concurrency.max(1);
    let warmup = (sagas / 10).clamp(concurrency.min(sagas), 200.max(concurrency));
    lanes(&engine, scenario, warmup, concurrency).await?;
    // Helpers start after the warm-up, so their whole-life commit counts cover the measured
    // phase (plus a few idle polls while they are being stopped).
    let helpers = Helpers::spawn(plan).await?;

    let commits_before = store.commits();
    let started = Instant::now();
    // The warm-up's calls are not the measured run's.
    if let Ok(mut c) = calls.lock() {
        c.clear();
    }
    let (mut latencies, errors, ids) = lanes(&engine, scenario, sagas, concurrency).await?;
    let wall = started.elapsed().as_secs_f64();
    let commits = store.commits() - commits_before + helpers.stop().await?;
    shutdown.cancel();
    runner.await??;
    let start_p99_ms = match scenario {
        Scenario::Limited => Some(crate::bench_flow::start_p99_ms(&store, &ids).await?),
        _ => None,
    };
    let (calls_per_s, max_calls_in_a_second) = match scenario {
        Scenario::Rated => {
            let (rate, most) = crate::bench_flow::observed_rate(&calls);
            (Some(rate), Some(most))
        }
        _ => (None, None),
    };

    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    let steps = match scenario {
        Scenario::Happy => 3.0,
        Scenario::Compensate => 5.0,
        Scenario::Starts => 0.0,
        Scenario::Parallel => 10.0,
        Scenario::Limited => 3.0,
        Scenario::Rated => 1.0,
        Scenario::Attrs => 3.0,
    };
    Ok(BenchReport {
        backend: plan.backend.clone(),
        processes: plan.processes,
        scenario,
        sagas,
        concurrency,
        sagas_per_s: sagas as f64 / wall,
        steps_per_s: sagas as f64 * steps / wall,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        commits_per_saga: commits as f64 / sagas.max(1) as f64,
        peak_rss_mb: peak_rss_mb(),
        errors,
        start_p99_ms,
        calls_per_s,
        max_calls_in_a_second,
    })
}

/// Runs `total` sagas in `concurrency` lanes; returns each saga's latency, the error count and
/// the sagas' ids.
pub(crate) async fn lanes(
    engine: &Engine,
    scenario: Scenario,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<(Vec<Duration>, usize, Vec<uuid::Uuid>)> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (engine, next) = (engine.clone(), next.clone());
        set.spawn(async move {
            let mut lat = Vec::new();
            let mut ids = Vec::new();
            let mut errors = 0;
            let want = match scenario {
                Scenario::Compensate => SagaStatus::Compensated,
                Scenario::Starts => SagaStatus::Queued,
                _ => SagaStatus::Completed,
            };
            let name = match scenario {
                Scenario::Parallel => "bench_parallel",
                Scenario::Limited => "bench_limited",
                Scenario::Rated => "bench_rated",
                Scenario::Attrs => "bench_attrs",
                _ => "bench_order",
            };
            let mut input =
                json!({"order": "bench", "fail_last": scenario == Scenario::Compensate});
            if scenario == Scenario::Attrs {
                input["user"] = json!("ada");
            }
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= total {
                    break;
                }
                if scenario == Scenario::Limited {
                    input["key"] = json!(format!("k{}", n % crate::bench_flow::KEYS));
                }
                let t = Instant::now();
                let saga = engine.start_saga(name, input.clone()).await?;
                ids.push(saga.id);
                if scenario == Scenario::Starts {
                    lat.push(t.elapsed());
                    continue;
                }
                let status = engine
                    .wait_terminal(saga.id, Duration::from_secs(60))
                    .await?;
                lat.push(t.elapsed());
                if status != Some(want) {
                    errors += 1;
                }
            }
            anyhow::Ok((lat, errors, ids))
        });
    }
    let mut all = Vec::with_capacity(total);
    let mut all_ids = Vec::with_capacity(total);
    let mut errors = 0;
    while let Some(res) = set.join_next().await {
        let (lat, e, ids) = res??;
        all.extend(lat);
        all_ids.extend(ids);
        errors += e;
    }
    Ok((all, errors, all_ids))
}

/// Peak resident set size of this process (VmHWM), in MiB.
pub fn peak_rss_mb() -> f64 {
    proc_status_kb("VmHWM:") / 1024.0
}

/// What `bench-timers` measured: memory with many sagas waiting on durable retry timers.
#[derive(Debug, Clone, Serialize)]
pub struct TimersReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Sagas parked on a one-hour retry timer.
    pub sagas: usize,
    /// Resident memory once all were parked.
    pub rss_mb: f64,
    /// Peak resident memory during the run.
    pub peak_rss_mb: f64,
    /// Seconds it took to start and park them all.
    pub seconds: f64,
}

/// Starts `sagas` sagas whose first step asks to be retried in an hour, waits until every one
/// is parked (its lease released, its next run time in the log), and reports this process's
/// memory: a saga waiting on a timer must cost the database a row, not the process a task.
pub async fn timers(
    store: Arc<dyn Store>,
    backend: &str,
    sagas: usize,
    concurrency: usize,
) -> anyhow::Result<TimersReport> {
    let engine = bench_engine(store.clone(), concurrency, false)?;
    let shutdown = CancellationToken::new();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let started = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (engine, store, next) = (engine.clone(), store.clone(), next.clone());
        set.spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < sagas {
                let saga = engine
                    .start_saga("bench_order", json!({"park": true}))
                    .await?;
                loop {
                    let s = store
                        .get_saga(saga.id)
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("saga vanished"))?;
                    if s.steps[0].action.status == orchestrator::StepStatus::Retrying
                        && s.lease_owner.is_none()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(res) = set.join_next().await {
        res??;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Let the allocator settle, then read the resident size with every saga parked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_mb = current_rss_mb();
    shutdown.cancel();
    runner.await??;
    Ok(TimersReport {
        backend: backend.to_owned(),
        sagas,
        rss_mb,
        peak_rss_mb: peak_rss_mb(),
        seconds,
    })
}

/// Current resident set size of this process (VmRSS), in MiB.
pub fn current_rss_mb() -> f64 {
    proc_status_kb("VmRSS:") / 1024.0
}

fn proc_status_kb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

/// The parallel benchmark saga: one group of ten no-op branches.
pub fn bench_parallel_saga() -> Result<SagaDefinition, saga_dsl::DefinitionError> {
    async fn noop(ctx: StepContext) -> Result<serde_json::Value, StepError> {
        Ok(json!({"step": ctx.step_name(), "ok": true}))
    }
    async fn undo(_ctx: StepContext) -> Result<(), StepError> {
        Ok(())
    }
    let branches = (0..10).map(|n| Step::compensatable(format!("b{n}"), noop, undo));
    SagaDefinition::builder("bench_parallel", 1)
        .step(Step::parallel("reserve", branches))
        .build()
}

/// The sagas of `bench-waits`: `bench_signal` (a no-op, a wait for the signal `go`, a no-op)
/// and `bench_sleep` (a sleep until the input's `wake_at_ms`, then a no-op).
pub fn bench_wait_sagas() -> Result<[SagaDefinition; 2], saga_dsl::DefinitionError> {
    async fn noop(ctx: StepContext) -> Result<serde_json::Value, StepError> {
        Ok(json!({"step": ctx.step_name(), "ok": true}))
    }
    async fn undo(_ctx: StepContext) -> Result<(), StepError> {
        Ok(())
    }
    let signal = SagaDefinition::builder("bench_signal", 1)
        .step(Step::compensatable("a", noop, undo))
        .step(Step::signal("wait", "go"))
        .step(Step::pivot("b", noop))
        .build()?;
    let sleep = SagaDefinition::builder("bench_sleep", 1)
        .step(Step::sleep_until("nap", |ctx| {
            let ms = ctx.raw_input()["wake_at_ms"].as_u64().unwrap_or(0);
            Ok(std::time::UNIX_EPOCH + Duration::from_millis(ms))
        }))
        .step(Step::pivot("b", noop))
        .build()?;
    Ok([signal, sleep])
}

/// What `bench-waits` measured.
#[derive(Debug, Clone, Serialize)]
pub struct WaitsReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Sagas parked on a signal wait.
    pub parked: usize,
    /// Seconds it took to start and park them all.
    pub park_seconds: f64,
    /// Resident memory with all of them parked.
    pub rss_mb: f64,
    /// Counting the waiting sagas by kind (what a scrape of `saga_waiting` reads) with all of
    /// them parked, median of 5 reads, in milliseconds.
    pub waiting_read_ms: f64,
    /// Signals sent, one at a time, each to a parked saga.
    pub signals: usize,
    /// Signal sent → its saga ended (the next stage called and the end written), median.
    pub signal_p50_ms: f64,
    /// The same, 99th percentile.
    pub signal_p99_ms: f64,
    /// Sagas asleep until one common instant.
    pub sleepers: usize,
    /// From that instant until the last of them ended, in seconds.
    pub sleepers_resumed_s: f64,
}

/// Starts `total` sagas of `name` with `input` in `concurrency` lanes and waits until each is
/// parked (`parked` says so of its record).
async fn start_parked(
    engine: &Engine,
    store: &Arc<dyn Store>,
    name: &'static str,
    input: serde_json::Value,
    total: usize,
    concurrency: usize,
    parked: fn(&orchestrator::Saga) -> bool,
) -> anyhow::Result<Vec<uuid::Uuid>> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (engine, store, next, input) =
            (engine.clone(), store.clone(), next.clone(), input.clone());
        set.spawn(async move {
            let mut ids = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                let saga = engine.start_saga(name, input.clone()).await?;
                loop {
                    let s = store
                        .get_saga(saga.id)
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("saga vanished"))?;
                    if parked(&s) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                ids.push(saga.id);
            }
            anyhow::Ok(ids)
        });
    }
    let mut ids = Vec::with_capacity(total);
    while let Some(res) = set.join_next().await {
        ids.extend(res??);
    }
    Ok(ids)
}

/// Parks `parked` sagas on a wait for a signal and reads this process's memory; sends
/// `signals` of them their signal one at a time, timing each until its saga ended; then puts
/// `sleepers` sagas to sleep until one common instant and times how long after it the last one
/// ended. A waiting saga must cost the database a row, not the process a task.
pub async fn waits(
    store: Arc<dyn Store>,
    backend: &str,
    parked: usize,
    signals: usize,
    sleepers: usize,
    concurrency: usize,
) -> anyhow::Result<WaitsReport> {
    let mut registry = Registry::new();
    for def in bench_wait_sagas()? {
        registry.register(def)?;
    }
    let engine = Engine::new(
        store.clone(),
        Arc::new(registry),
        EngineConfig {
            workers: concurrency.max(1),
            ..EngineConfig::default()
        },
    );
    let shutdown = CancellationToken::new();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let started = Instant::now();
    let waiting = |s: &orchestrator::Saga| {
        s.steps[1].action.status == orchestrator::StepStatus::Waiting
            && s.lease_owner.is_none()
            && s.next_run_at.is_none()
    };
    let ids = start_parked(
        &engine,
        &store,
        "bench_signal",
        json!({}),
        parked,
        concurrency,
        waiting,
    )
    .await?;
    let park_seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_mb = current_rss_mb();
    let mut reads = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let counts = store.waiting().await?;
        reads.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            counts.signal as usize == parked,
            "saga_waiting counts {} signal waits of {parked}",
            counts.signal
        );
    }
    reads.sort_by(f64::total_cmp);
    let waiting_read_ms = reads[reads.len() / 2];

    let mut latencies = Vec::with_capacity(signals);
    let payload = json!({"go": true});
    for id in ids.iter().take(signals) {
        let t = Instant::now();
        store
            .send_signal(orchestrator::store::SignalRequest {
                saga: *id,
                name: "go",
                payload: &payload,
                key: None,
            })
            .await?;
        let status = engine.wait_terminal(*id, Duration::from_secs(60)).await?;
        anyhow::ensure!(
            status == Some(SagaStatus::Completed),
            "saga {id} ended {status:?}"
        );
        latencies.push(t.elapsed());
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    let (signal_p50_ms, signal_p99_ms) = (pct(0.50), pct(0.99));

    // Every sleeper wakes at the same instant, once all of them are asleep.
    let now_ms = store.now().await?;
    let wake_at = now_ms + 5_000 + (sleepers as i64) * 2;
    let asleep = |s: &orchestrator::Saga| {
        s.steps[0].action.status == orchestrator::StepStatus::Waiting && s.lease_owner.is_none()
    };
    let input = json!({ "wake_at_ms": wake_at });
    let sleeping = start_parked(
        &engine,
        &store,
        "bench_sleep",
        input,
        sleepers,
        concurrency,
        asleep,
    )
    .await?;
    anyhow::ensure!(
        store.now().await? < wake_at,
        "the sleepers took too long to park"
    );
    let mut last = wake_at;
    for id in &sleeping {
        let status = engine.wait_terminal(*id, Duration::from_secs(120)).await?;
        anyhow::ensure!(
            status == Some(SagaStatus::Completed),
            "saga {id} ended {status:?}"
        );
        let saga = store
            .get_saga(*id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("saga vanished"))?;
        last = last.max(saga.updated_at);
    }
    shutdown.cancel();
    runner.await??;
    Ok(WaitsReport {
        backend: backend.to_owned(),
        parked,
        park_seconds,
        rss_mb,
        waiting_read_ms,
        signals,
        signal_p50_ms,
        signal_p99_ms,
        sleepers,
        sleepers_resumed_s: (last - wake_at) as f64 / 1000.0,
    })
}
