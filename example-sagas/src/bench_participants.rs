//! `example-sagas bench-participants`: what calling participants over HTTP costs (SPEC §16).
//!
//! Three workloads, each a 3-step saga run for a fixed time with a number of sagas kept in
//! flight (each lane starts its next saga as soon as its previous one ended), on a fresh
//! SQLite database per configuration, or all on the one database named:
//!
//! - `in-process`: three compensatable steps that are plain async functions;
//! - `http`: the same three steps as [`HttpParticipant`] `POST`s to a participant served by
//!   axum on a loopback port of this process;
//! - `callback`: the same, its middle step completed by callback: the participant answers
//!   `202` at once, then posts `{Saga-Task-Url}/complete` to the orchestrator's HTTP API,
//!   served by this process on another loopback port.
//!
//! Both sides of every call share this process and its cores, as the orchestrator and a
//! participant on one host would. The participant applies each effect once per
//! `Idempotency-Key`, in memory, and the in-process steps do the same, so that the two
//! differ only by the HTTP round trip. Every figure is checked: a saga that does not complete,
//! an effect applied other than once per step, or a callback not answered `200` is counted as
//! an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use orchestrator::http::HttpConfig;
use orchestrator::participants::{
    HttpCall, HttpParticipant, ParticipantConfig, IDEMPOTENCY_KEY_HEADER, TASK_URL_HEADER,
};
use orchestrator::{Engine, EngineConfig, SagaStatus, Store};
use saga_dsl::{Action, Registry, SagaDefinition, Step, StepContext, StepError};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The saga of the `in-process` workload.
const IN_PROCESS: &str = "bench_local_steps";
/// The saga of the `http` workload.
const HTTP: &str = "bench_http_steps";
/// The saga of the `callback` workload.
const CALLBACK: &str = "bench_callback_steps";
/// The steps of every workload's saga.
const STEPS: [&str; 3] = ["reserve_stock", "charge_payment", "assign_rider"];
/// How long each configuration runs before it is measured, to open connections and warm the
/// database's caches.
const WARM_UP: Duration = Duration::from_millis(500);
/// How long a callback step waits for its participant before the attempt's outcome is unknown.
const CALLBACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Which saga a configuration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Three in-process steps.
    InProcess,
    /// Three HTTP steps.
    Http,
    /// Three HTTP steps, the middle one completed by callback.
    Callback,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::InProcess => "in-process",
            Workload::Http => "http",
            Workload::Callback => "callback",
        }
    }

    fn saga(self) -> &'static str {
        match self {
            Workload::InProcess => IN_PROCESS,
            Workload::Http => HTTP,
            Workload::Callback => CALLBACK,
        }
    }
}

/// What the benchmark runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The database every configuration uses; `None` for a fresh SQLite file each, under
    /// `dir`.
    pub database_url: Option<String>,
    /// Where the fresh SQLite files go.
    pub dir: PathBuf,
    /// How long each configuration is measured.
    pub measure: Duration,
    /// The numbers of sagas in flight of the `in-process` and `http` workloads.
    pub concurrency: Vec<usize>,
    /// The numbers of sagas in flight of the `callback` workload.
    pub callback_concurrency: Vec<usize>,
}

/// The figures of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The workload.
    pub workload: Workload,
    /// Sagas kept in flight (and engine workers).
    pub concurrency: usize,
    /// Sagas completed in the measured phase.
    pub sagas: usize,
    /// Throughput.
    pub sagas_per_s: f64,
    /// Median latency of a saga, start to `COMPLETED`.
    pub p50_ms: f64,
    /// 99th percentile of the same.
    pub p99_ms: f64,
    /// Database commits per saga (the store's counter, this process being its only writer).
    pub commits_per_saga: f64,
    /// Effects the participants applied per saga (3 when each step took effect once).
    pub effects_per_saga: f64,
    /// Sagas that did not complete, effects applied other than once per step, and callbacks
    /// not answered `200` (must be 0).
    pub errors: usize,
    /// For `callback`: callbacks answered `200` per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callbacks_per_s: Option<f64>,
    /// For `callback`: median time from the participant sending its completion to the third
    /// step's action starting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_p50_ms: Option<f64>,
    /// For `callback`: the 99th percentile of the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_p99_ms: Option<f64>,
    /// For `callback`: median time from the participant sending its completion to the API's
    /// `200` (the part of the above the report's own write takes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_p50_ms: Option<f64>,
    /// For `callback`: the 99th percentile of the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_p99_ms: Option<f64>,
}

impl Figures {
    /// The one-line text form.
    pub fn line(&self) -> String {
        let callback = match (
            self.callbacks_per_s,
            self.callback_p50_ms,
            self.callback_p99_ms,
            self.answer_p50_ms,
            self.answer_p99_ms,
        ) {
            (Some(rate), Some(p50), Some(p99), Some(a50), Some(a99)) => format!(
                " callbacks_per_s={rate:.1} callback_to_next_p50_ms={p50:.2} \
                 callback_to_next_p99_ms={p99:.2} callback_answer_p50_ms={a50:.2} \
                 callback_answer_p99_ms={a99:.2}"
            ),
            _ => String::new(),
        };
        format!(
            "participants backend={} workload={} concurrency={} sagas={} sagas_per_s={:.1} \
             p50_ms={:.2} p99_ms={:.2} commits_per_saga={:.2} effects_per_saga={:.2} errors={}{}",
            self.backend,
            self.workload.name(),
            self.concurrency,
            self.sagas,
            self.sagas_per_s,
            self.p50_ms,
            self.p99_ms,
            self.commits_per_saga,
            self.effects_per_saga,
            self.errors,
            callback,
        )
    }
}

/// The ratio of the `http` workload's figures to the `in-process` one's at one concurrency,
/// from the same run.
pub fn ratio_line(http: &Figures, local: &Figures) -> String {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    format!(
        "participants ratio http/in-process concurrency={} sagas_per_s={:.2} p50_ms={:.2} \
         p99_ms={:.2} commits_per_saga={:.2}",
        http.concurrency,
        ratio(http.sagas_per_s, local.sagas_per_s),
        ratio(http.p50_ms, local.p50_ms),
        ratio(http.p99_ms, local.p99_ms),
        ratio(http.commits_per_saga, local.commits_per_saga),
    )
}

/// Runs every configuration, interleaving `in-process` and `http` at each concurrency so that
/// a pair shares the machine's speed of the moment, and calls `report` with each one's figures
/// as soon as they are known.
pub async fn run(plan: &Plan, mut report: impl FnMut(&Figures)) -> anyhow::Result<Vec<Figures>> {
    let participant = Participant::serve().await?;
    let mut all = Vec::new();
    let mut configurations: Vec<(Workload, usize)> = plan
        .concurrency
        .iter()
        .flat_map(|&c| [(Workload::InProcess, c), (Workload::Http, c)])
        .collect();
    configurations.extend(
        plan.callback_concurrency
            .iter()
            .map(|&c| (Workload::Callback, c)),
    );
    // A named database is opened once: a store dropped does not hand its connections back at
    // once, and a fresh one per configuration would run PostgreSQL out of connections.
    let named = match &plan.database_url {
        Some(url) => Some(open(url).await?),
        None => None,
    };
    for (n, (workload, concurrency)) in configurations.into_iter().enumerate() {
        let store = match &named {
            Some(store) => store.clone(),
            None => {
                let file = plan.dir.join(format!("{n}.db"));
                open(&format!("sqlite://{}", file.display())).await?
            }
        };
        let figures = configuration(
            store,
            workload,
            concurrency.max(1),
            plan.measure,
            &participant,
        )
        .await?;
        report(&figures);
        all.push(figures);
    }
    Ok(all)
}

/// The database at `url`, with the name of its backend.
async fn open(url: &str) -> anyhow::Result<(Arc<dyn Store>, &'static str)> {
    let store = orchestrator::store::open(url).await?;
    let backend = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    Ok((store, backend))
}

/// The participant's side of the benchmark: an HTTP service on a loopback port.
struct Participant {
    base: String,
    state: Arc<Shared>,
}

/// What the participant's handlers and the steps that measure the callbacks share.
#[derive(Default)]
struct Shared {
    /// The answer of each applied effect, by idempotency key.
    applied: Mutex<HashMap<String, Value>>,
    /// Effects applied.
    effects: AtomicU64,
    /// Callbacks answered `200`, and the others.
    callbacks_ok: AtomicU64,
    callback_errors: AtomicU64,
    /// When the participant sent each saga's completion, and when the API answered it `200`.
    sent: Mutex<HashMap<Uuid, Instant>>,
    answered: Mutex<HashMap<Uuid, Instant>>,
    /// When each saga's third step started, in the `callback` workload.
    next_started: Mutex<HashMap<Uuid, Instant>>,
    /// The client of the callbacks.
    client: reqwest::Client,
}

impl Shared {
    /// Applies the effect of the call `key` once, and answers every call of it as the first.
    fn apply(&self, key: &str, step: &str) -> Value {
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        applied
            .entry(key.to_owned())
            .or_insert_with(|| {
                let n = self.effects.fetch_add(1, Ordering::Relaxed) + 1;
                json!({"step": step, "effect": n})
            })
            .clone()
    }
}

/// A map of instants keyed by saga, locked whatever a panicking holder left.
fn mark(map: &Mutex<HashMap<Uuid, Instant>>, saga: Uuid, at: Instant, first_only: bool) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if first_only {
        map.entry(saga).or_insert(at);
    } else {
        map.insert(saga, at);
    }
}

impl Participant {
    /// Serves the participant on a free loopback port, for the rest of the process's life.
    async fn serve() -> anyhow::Result<Self> {
        let state = Arc::new(Shared::default());
        let app = axum::Router::new()
            .route("/steps/{name}", axum::routing::post(answer_now))
            .route("/accept/{name}", axum::routing::post(answer_later))
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self {
            base: format!("http://{addr}"),
            state,
        })
    }
}

/// The call's idempotency key, which every call must carry.
fn key_of(headers: &HeaderMap) -> Result<&str, (StatusCode, Json<Value>)> {
    headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or((
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "no Idempotency-Key"})),
        ))
}

/// `POST /steps/{name}`: applies the effect once per key and answers `200` with its result.
async fn answer_now(
    State(state): State<Arc<Shared>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let key = match key_of(&headers) {
        Ok(key) => key,
        Err(refused) => return refused,
    };
    (StatusCode::OK, Json(state.apply(key, &name)))
}

/// `POST /accept/{name}`: applies the effect once per key, answers `202` at once, then
/// completes the task at the request's `Saga-Task-Url`.
async fn answer_later(
    State(state): State<Arc<Shared>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    let key = match key_of(&headers) {
        Ok(key) => key,
        Err(refused) => return refused,
    };
    let (Some(task_url), Some(saga)) = (
        headers.get(TASK_URL_HEADER).and_then(|v| v.to_str().ok()),
        body["saga"].as_str().and_then(|s| s.parse::<Uuid>().ok()),
    ) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "no Saga-Task-Url, or no saga in the body"})),
        );
    };
    let output = state.apply(key, &name);
    let complete = format!("{task_url}/complete");
    let shared = state.clone();
    tokio::spawn(async move {
        mark(&shared.sent, saga, Instant::now(), false);
        let answer = shared
            .client
            .post(complete)
            .json(&json!({ "output": output }))
            .send()
            .await;
        let counter = match answer {
            Ok(answer) if answer.status() == reqwest::StatusCode::OK => {
                mark(&shared.answered, saga, Instant::now(), false);
                &shared.callbacks_ok
            }
            _ => &shared.callback_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    });
    (StatusCode::ACCEPTED, Json(json!({"accepted": true})))
}

/// The sagas of the three workloads, their HTTP steps calling the participant at `base`.
fn definitions(base: &str, shared: &Arc<Shared>) -> anyhow::Result<Vec<SagaDefinition>> {
    let client = HttpParticipant::new(ParticipantConfig {
        // Signed, as a deployment's calls would be.
        secret: Some("whsec_bench_participants".to_owned()),
        ..ParticipantConfig::default()
    })?;
    let call = |path: String| -> anyhow::Result<HttpCall> {
        Ok(client
            .post(&format!("{base}{path}"))?
            .body(|ctx| Ok(json!({"saga": ctx.saga_id(), "step": ctx.step_name()}))))
    };

    let local = {
        let mut saga = SagaDefinition::builder(IN_PROCESS, 1);
        for name in STEPS {
            let shared = shared.clone();
            let action = move |ctx: StepContext| {
                let shared = shared.clone();
                async move {
                    Ok::<_, StepError>(
                        shared.apply(&ctx.idempotency_key().to_string(), ctx.step_name()),
                    )
                }
            };
            saga = saga.step(Step::compensatable(name, action, undo));
        }
        saga.build()?
    };

    let http = {
        let mut saga = SagaDefinition::builder(HTTP, 1);
        for name in STEPS {
            saga = saga.step(Step::compensatable(
                name,
                call(format!("/steps/{name}"))?,
                call(format!("/steps/undo_{name}"))?,
            ));
        }
        saga.build()?
    };

    let [first, middle, last] = STEPS;
    let next = {
        let (shared, call) = (shared.clone(), call(format!("/steps/{last}"))?);
        move |ctx: StepContext| {
            let (shared, call) = (shared.clone(), call.clone());
            async move {
                mark(&shared.next_started, ctx.saga_id(), Instant::now(), true);
                Action::run(&call, ctx).await
            }
        }
    };
    let callback = SagaDefinition::builder(CALLBACK, 1)
        .step(Step::compensatable(
            first,
            call(format!("/steps/{first}"))?,
            call(format!("/steps/undo_{first}"))?,
        ))
        .step(
            Step::compensatable(
                middle,
                call(format!("/accept/{middle}"))?,
                call(format!("/steps/undo_{middle}"))?,
            )
            .completed_by_callback()
            .timeout(CALLBACK_TIMEOUT),
        )
        .step(Step::compensatable(
            last,
            next,
            call(format!("/steps/undo_{last}"))?,
        ))
        .build()?;
    Ok(vec![local, http, callback])
}

async fn undo(_ctx: StepContext) -> Result<(), StepError> {
    Ok(())
}

/// Runs one configuration on `store` (of the database `backend`) and measures it.
async fn configuration(
    (store, backend): (Arc<dyn Store>, &'static str),
    workload: Workload,
    concurrency: usize,
    measure: Duration,
    participant: &Participant,
) -> anyhow::Result<Figures> {
    let shared = &participant.state;
    let mut registry = Registry::new();
    for def in definitions(&participant.base, shared)? {
        registry.register(def)?;
    }
    // Bound before the engine is made: the task URLs it hands out name this address.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let api = listener.local_addr()?;
    let engine = Engine::new(
        store.clone(),
        Arc::new(registry),
        EngineConfig {
            workers: concurrency,
            task_url: format!("http://{api}"),
            ..EngineConfig::default()
        },
    );
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    let server = tokio::spawn({
        let router = orchestrator::http::router_with_shutdown(
            engine.clone(),
            HttpConfig::default(),
            shutdown.clone(),
        );
        orchestrator::http::serve(listener, router, shutdown.clone())
    });

    // A warm-up saga that failed is as much an error as a measured one.
    let (_, warm_up_errors, _) = lanes(&engine, workload, concurrency, WARM_UP).await?;
    let commits = store.commits();
    let effects = shared.effects.load(Ordering::Relaxed);
    let (ok, failed) = (
        shared.callbacks_ok.load(Ordering::Relaxed),
        shared.callback_errors.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let (mut latencies, mut errors, ids) = lanes(&engine, workload, concurrency, measure).await?;
    let wall = started.elapsed().as_secs_f64();
    let commits = store.commits() - commits;
    let effects = shared.effects.load(Ordering::Relaxed) - effects;
    let callbacks = shared.callbacks_ok.load(Ordering::Relaxed) - ok;
    let callback_errors = shared.callback_errors.load(Ordering::Relaxed) - failed;
    shutdown.cancel();
    runner.await??;
    server.await??;

    errors += warm_up_errors;
    let sagas = latencies.len();
    let per_saga = |n: u64| n as f64 / sagas.max(1) as f64;
    errors += usize::try_from(effects.abs_diff(3 * sagas as u64))?;
    let mut figures = Figures {
        backend: backend.to_owned(),
        workload,
        concurrency,
        sagas,
        sagas_per_s: sagas as f64 / wall,
        p50_ms: 0.0,
        p99_ms: 0.0,
        commits_per_saga: per_saga(commits),
        effects_per_saga: per_saga(effects),
        errors,
        callbacks_per_s: None,
        callback_p50_ms: None,
        callback_p99_ms: None,
        answer_p50_ms: None,
        answer_p99_ms: None,
    };
    latencies.sort_unstable();
    figures.p50_ms = percentile_ms(&latencies, 0.50);
    figures.p99_ms = percentile_ms(&latencies, 0.99);
    if workload == Workload::Callback {
        let mut next = gaps(&shared.sent, &shared.next_started, &ids);
        let mut answers = gaps(&shared.sent, &shared.answered, &ids);
        figures.errors += usize::try_from(callback_errors)? + (ids.len() - next.len());
        next.sort_unstable();
        answers.sort_unstable();
        figures.callbacks_per_s = Some(callbacks as f64 / wall);
        figures.callback_p50_ms = Some(percentile_ms(&next, 0.50));
        figures.callback_p99_ms = Some(percentile_ms(&next, 0.99));
        figures.answer_p50_ms = Some(percentile_ms(&answers, 0.50));
        figures.answer_p99_ms = Some(percentile_ms(&answers, 0.99));
    }
    Ok(figures)
}

/// For each of the sagas `ids` with both instants, the time from its instant in `from` to its
/// instant in `to`.
fn gaps(
    from: &Mutex<HashMap<Uuid, Instant>>,
    to: &Mutex<HashMap<Uuid, Instant>>,
    ids: &[Uuid],
) -> Vec<Duration> {
    let from = from.lock().unwrap_or_else(|e| e.into_inner());
    let to = to.lock().unwrap_or_else(|e| e.into_inner());
    ids.iter()
        .filter_map(|id| Some(to.get(id)?.saturating_duration_since(*from.get(id)?)))
        .collect()
}

/// The `p` quantile of the sorted `sorted`, in milliseconds (nearest rank).
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// Keeps `concurrency` sagas of `workload` in flight for `length` (each lane starts no new saga
/// after it); returns the latency of each saga that completed, the count of those that did not,
/// and the ids of the completed ones.
async fn lanes(
    engine: &Engine,
    workload: Workload,
    concurrency: usize,
    length: Duration,
) -> anyhow::Result<(Vec<Duration>, usize, Vec<Uuid>)> {
    let until = Instant::now() + length;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let engine = engine.clone();
        set.spawn(async move {
            let (mut latencies, mut errors, mut ids) = (Vec::new(), 0, Vec::new());
            while Instant::now() < until {
                let t = Instant::now();
                // A failed start or wait is counted and said once per lane, not fatal: the
                // figures of the sagas that ran still tell where the limit is.
                let saga = match engine
                    .start_saga(workload.saga(), json!({"order": "bench"}))
                    .await
                {
                    Ok(saga) => saga,
                    Err(e) => {
                        if errors == 0 {
                            eprintln!("a saga did not start: {e}");
                        }
                        errors += 1;
                        continue;
                    }
                };
                let status = engine.wait_terminal(saga.id, Duration::from_secs(60)).await;
                match status {
                    Ok(Some(SagaStatus::Completed)) => {
                        latencies.push(t.elapsed());
                        ids.push(saga.id);
                    }
                    other => {
                        if errors == 0 {
                            eprintln!("saga {} did not complete: {other:?}", saga.id);
                        }
                        errors += 1;
                    }
                }
            }
            anyhow::Ok((latencies, errors, ids))
        });
    }
    let (mut latencies, mut errors, mut ids) = (Vec::new(), 0, Vec::new());
    while let Some(lane) = set.join_next().await {
        let (l, e, i) = lane??;
        latencies.extend(l);
        errors += e;
        ids.extend(i);
    }
    Ok((latencies, errors, ids))
}
