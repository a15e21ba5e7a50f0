//! Helpers shared by the integration tests: temporary databases, an engine running in the
//! background, participants that record what was called, waiting for sagas to settle, real
//! processes, and the HTTP harness ([`api`]).

#![allow(clippy::unwrap_used)]

pub mod api;
pub mod fixtures;
pub mod nats;
pub mod otlp;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::model::{Saga, SagaStatus};
use orchestrator::store::{SqliteStore, Store};
use orchestrator::{Engine, EngineConfig};
use saga_dsl::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The backend the storage tests run on: `SAGA_TEST_BACKEND=postgres` selects PostgreSQL (a fresh
/// database per test on the server named by `SAGA_TEST_PG_URL`, default
/// `postgres://postgres@127.0.0.1:5432/postgres`); anything else, a fresh SQLite file.
pub fn backend_is_postgres() -> bool {
    std::env::var("SAGA_TEST_BACKEND").is_ok_and(|b| b == "postgres")
}

fn pg_admin_url() -> String {
    std::env::var("SAGA_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Runs a future to completion on a private runtime in another thread, so that sync code (a
/// constructor, a `Drop`) can do async work even when called from inside a test's runtime.
fn block_on_side<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
    .join()
    .unwrap()
}

/// A fresh, empty saga database for one test: a SQLite file in a temporary directory, or a new
/// PostgreSQL database (dropped again when this value is dropped).
pub struct TempDb {
    /// A temporary directory, removed with this value: the SQLite file's, and free for the
    /// test's own files (a participant's database, a working directory).
    pub dir: tempfile::TempDir,
    /// The database's URL (`sqlite://…` or `postgres://…`).
    pub url: String,
    pg_name: Option<String>,
}

impl TempDb {
    /// A fresh database on the backend `SAGA_TEST_BACKEND` selects.
    pub fn new() -> Self {
        if backend_is_postgres() {
            Self::postgres()
        } else {
            Self::sqlite()
        }
    }

    /// A fresh SQLite file.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("saga.db").display());
        Self {
            dir,
            url,
            pg_name: None,
        }
    }

    /// A fresh PostgreSQL database; panics if the server cannot be reached.
    pub fn postgres() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("saga_test_{}", Uuid::new_v4().simple());
        let admin = pg_admin_url();
        let create = format!("CREATE DATABASE {name}");
        block_on_side(async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&admin)
                .await
                .unwrap_or_else(|e| {
                    panic!("PostgreSQL at {admin} (SAGA_TEST_PG_URL) is unreachable: {e}")
                });
            sqlx::Executor::execute(&mut conn, create.as_str())
                .await
                .unwrap();
        });
        let base = pg_admin_url();
        let url = match base.rfind('/') {
            Some(i) if base[..i].len() > "postgres://".len() => format!("{}/{name}", &base[..i]),
            _ => format!("{base}/{name}"),
        };
        Self {
            dir,
            url,
            pg_name: Some(name),
        }
    }

    /// The step log of the database, opened as the engine opens it.
    pub async fn store(&self) -> Arc<dyn Store> {
        if self.pg_name.is_some() {
            orchestrator::store::open(&self.url).await.unwrap()
        } else {
            Arc::new(SqliteStore::open(&self.url).await.unwrap())
        }
    }

    /// The store with all its views (step log, idempotency keys, outbox), as `serve` opens it.
    pub async fn stores(&self) -> orchestrator::store::Stores {
        orchestrator::store::open_full(&self.url).await.unwrap()
    }

    /// Has the database removed once this process has exited, however it exits, for a database
    /// that lives in a `static` (whose `Drop` never runs): a `saga-suite-reaper` process waits
    /// for its stdin, which this process holds open to the end, then removes the directory and
    /// drops the PostgreSQL database, if any.
    // Never waited for: it ends after this process, never leaving a zombie of it behind.
    #[allow(clippy::zombie_processes)]
    pub fn remove_after_exit(&self) {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(bin_path("saga-suite-reaper"));
        cmd.arg(self.dir.path());
        if let Some(name) = &self.pg_name {
            cmd.arg(pg_admin_url()).arg(name);
        }
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            // A process group of its own: a Ctrl-C at the terminal stops the tests, not it.
            .process_group(0)
            .spawn()
            .unwrap();
        // Never closed by hand: the end of this process closes it, which is the signal.
        std::mem::forget(child.stdin.take());
    }

    /// Runs one SQL statement directly against the database (to corrupt a row on purpose).
    pub async fn execute(&self, sql: &str) {
        if self.pg_name.is_some() {
            let pool = sqlx::PgPool::connect(&self.url).await.unwrap();
            sqlx::query(sql).execute(&pool).await.unwrap();
            pool.close().await;
        } else {
            let pool = sqlx::SqlitePool::connect(&self.url).await.unwrap();
            sqlx::query(sql).execute(&pool).await.unwrap();
            pool.close().await;
        }
    }
}

impl Default for TempDb {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            drop_pg_database(&pg_admin_url(), &name);
        }
    }
}

/// Drops the PostgreSQL database `name` on the server `admin_url` names, closing its
/// connections first; a database that is gone already, or a server that is down, is no error.
pub fn drop_pg_database(admin_url: &str, name: &str) {
    let (admin, name) = (admin_url.to_owned(), name.to_owned());
    block_on_side(async move {
        use sqlx::Connection;
        if let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await {
            let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            let _ = sqlx::Executor::execute(&mut conn, drop.as_str()).await;
        }
    });
}

/// Engine settings for tests: short leases and polls so nothing waits long.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        workers: 16,
        lease_ttl: Duration::from_secs(5),
        poll_interval: Duration::from_millis(50),
        needs_attention_after: 3,
        hold_backoff_below: Duration::from_millis(100),
        ..EngineConfig::default()
    }
}

/// An engine running in a background task.
pub struct RunningEngine {
    /// The engine (a handle: clones share it).
    pub engine: Engine,
    /// Cancelled to stop the run loop.
    pub shutdown: CancellationToken,
    /// The run loop's task.
    pub task: JoinHandle<()>,
}

impl RunningEngine {
    /// Starts an engine running `registry` over `store` in a task of the current runtime.
    pub fn start(store: Arc<dyn Store>, registry: Registry, config: EngineConfig) -> Self {
        let engine = Engine::new(store, Arc::new(registry), config);
        let shutdown = CancellationToken::new();
        let task = {
            let engine = engine.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { engine.run(shutdown).await.unwrap() })
        };
        Self {
            engine,
            shutdown,
            task,
        }
    }

    /// Waits until the run loop accepts direct starts with a free worker (a start made earlier
    /// is created `QUEUED`, unleased, and left to a claim).
    pub async fn ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !self.engine.has_free_worker() {
            assert!(std::time::Instant::now() < deadline, "the engine never ran");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the run loop and waits for it to end (it lets the steps in flight finish).
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

/// Polls until the saga is terminal (or flagged, when `until` says so); panics after `timeout`.
pub async fn wait_for(
    store: &Arc<dyn Store>,
    id: Uuid,
    timeout: Duration,
    until: impl Fn(&Saga) -> bool,
) -> Saga {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let saga = store.get_saga(id).await.unwrap().unwrap();
        if until(&saga) {
            return saga;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("saga {id} did not settle in {timeout:?}: {saga:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The event types of saga `id`, each with its step: `step.skipped:b`.
pub async fn event_names(store: &Arc<dyn Store>, id: Uuid) -> Vec<String> {
    store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            let step = e.step.map(|s| format!(":{s}")).unwrap_or_default();
            format!("{}{step}", e.kind)
        })
        .collect()
}

/// Waits until the saga is terminal.
pub async fn wait_terminal(store: &Arc<dyn Store>, id: Uuid) -> Saga {
    wait_for(store, id, Duration::from_secs(20), |s| {
        s.status.is_terminal()
    })
    .await
}

/// True when a saga is in `status`.
pub fn is(status: SagaStatus) -> impl Fn(&Saga) -> bool {
    move |s| s.status == status
}

/// A journal of calls made by fake participants: `(step, phase, idempotency key)`.
#[derive(Debug, Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<(String, String, Uuid)>>>);

impl Journal {
    /// Records one call.
    pub fn push(&self, step: &str, phase: &str, key: Uuid) {
        self.0
            .lock()
            .unwrap()
            .push((step.to_owned(), phase.to_owned(), key));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<(String, String, Uuid)> {
        self.0.lock().unwrap().clone()
    }

    /// `step:phase` of every call, in order.
    pub fn names(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .map(|(s, p, _)| format!("{s}:{p}"))
            .collect()
    }
}

/// What one attempt of a scripted action or compensation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub enum Outcome {
    /// Succeeds.
    Ok,
    /// Fails with a retryable error.
    Retryable,
    /// Fails with a permanent error.
    Permanent,
    /// Sleeps past the step's timeout: the outcome is unknown to the engine.
    Hang,
}

/// A step whose attempts follow a script: attempt `n` does `script[n - 1]`, and `Ok` past its end.
#[derive(Debug, Clone)]
pub struct ScriptedStep {
    /// The step's name.
    pub name: String,
    /// Compensatable, pivot or retriable.
    pub kind: saga_dsl::StepKind,
    /// What the action's attempts do, in order.
    pub action: Vec<Outcome>,
    /// What the compensation's attempts do, in order.
    pub compensation: Vec<Outcome>,
    /// For a sleep: how long it sleeps.
    pub sleep: Duration,
    /// A condition that is always this value (`None`: no condition).
    pub when: Option<bool>,
    /// For a signal wait: the signal, how long it waits at most, and its default payload. A
    /// payload `{"refuse": true}` fails the step permanently.
    pub signal: Option<(String, Option<Duration>, Option<serde_json::Value>)>,
    /// For a parallel group: its branches (for a mapped group, the one every branch runs).
    pub branches: Vec<ScriptedStep>,
    /// For a mapped group: the input field holding its list; each element names its branch
    /// by its `name` and may give its action's script as `script`.
    pub mapped_from: Option<String>,
    /// For a parallel group: how many branches run at once.
    pub max_concurrency: Option<usize>,
    /// For a child stage: the saga it starts, with this saga's input as the child's.
    pub child: Option<String>,
}

impl ScriptedStep {
    /// A step of `kind` whose every attempt succeeds.
    pub fn new(name: &str, kind: saga_dsl::StepKind) -> Self {
        Self {
            name: name.to_owned(),
            kind,
            action: Vec::new(),
            compensation: Vec::new(),
            sleep: Duration::ZERO,
            when: None,
            signal: None,
            branches: Vec::new(),
            mapped_from: None,
            max_concurrency: None,
            child: None,
        }
    }

    /// A child stage starting `saga` with this saga's input.
    pub fn child(name: &str, saga: &str) -> Self {
        let mut step = Self::new(name, saga_dsl::StepKind::Child);
        step.child = Some(saga.to_owned());
        step
    }

    /// A parallel group of `branches`.
    pub fn parallel(name: &str, branches: Vec<ScriptedStep>) -> Self {
        let mut step = Self::new(name, saga_dsl::StepKind::Parallel);
        step.branches = branches;
        step
    }

    /// A parallel group with one branch per element of the input's list `field`, each running
    /// `branch`.
    pub fn map(name: &str, field: &str, branch: ScriptedStep) -> Self {
        let mut step = Self::parallel(name, vec![branch]);
        step.mapped_from = Some(field.to_owned());
        step
    }

    /// For a parallel group: at most `n` branches at once.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = Some(n);
        self
    }

    /// A wait for `signal`, without a timeout.
    pub fn signal(name: &str, signal: &str) -> Self {
        let mut step = Self::new(name, saga_dsl::StepKind::Signal);
        step.signal = Some((signal.to_owned(), None, None));
        step
    }

    /// For a signal wait: waits at most `timeout`, then goes on with `default` if given.
    pub fn timeout(mut self, timeout: Duration, default: Option<serde_json::Value>) -> Self {
        if let Some(signal) = &mut self.signal {
            signal.1 = Some(timeout);
            signal.2 = default;
        }
        self
    }

    /// A durable sleep of `duration`.
    pub fn sleep(name: &str, duration: Duration) -> Self {
        let mut step = Self::new(name, saga_dsl::StepKind::Sleep);
        step.sleep = duration;
        step
    }

    /// Gives the step a condition that always says `holds`.
    pub fn when(mut self, holds: bool) -> Self {
        self.when = Some(holds);
        self
    }

    /// The script of the action's attempts.
    pub fn action(mut self, script: &[Outcome]) -> Self {
        self.action = script.to_vec();
        self
    }

    /// The script of the compensation's attempts.
    pub fn compensation(mut self, script: &[Outcome]) -> Self {
        self.compensation = script.to_vec();
        self
    }
}

/// The per-attempt timeout of scripted steps; `Hang` sleeps longer.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_millis(150);

async fn play(
    journal: &Journal,
    script: &[Outcome],
    ctx: &saga_dsl::StepContext,
) -> Result<serde_json::Value, saga_dsl::StepError> {
    journal.push(ctx.step_name(), ctx.phase().as_str(), ctx.idempotency_key());
    let outcome = script
        .get(ctx.attempt() as usize - 1)
        .copied()
        .unwrap_or(Outcome::Ok);
    match outcome {
        Outcome::Ok => Ok(serde_json::json!({"step": ctx.step_name(), "attempt": ctx.attempt()})),
        Outcome::Retryable => Err(saga_dsl::StepError::retryable("scripted transient failure")),
        Outcome::Permanent => Err(saga_dsl::StepError::permanent("scripted permanent failure")),
        Outcome::Hang => {
            tokio::time::sleep(SCRIPT_TIMEOUT * 4).await;
            Ok(serde_json::json!("too late"))
        }
    }
}

/// Builds a saga from scripted steps. Actions allow 3 attempts (retriable steps: unlimited);
/// every backoff is a few milliseconds.
pub fn scripted_saga(
    name: &str,
    version: u32,
    steps: &[ScriptedStep],
    journal: &Journal,
) -> saga_dsl::SagaDefinition {
    let mut builder = saga_dsl::SagaDefinition::builder(name, version);
    for s in steps {
        builder = builder.step(scripted_step(s, journal));
    }
    builder.build().unwrap()
}

/// One scripted step as a stage of a definition.
fn scripted_step(s: &ScriptedStep, journal: &Journal) -> saga_dsl::Step {
    use saga_dsl::{Step, StepKind};
    let step: Step = match s.kind {
        StepKind::Compensatable | StepKind::Pivot | StepKind::Retriable => {
            scripted_call(s, journal).into()
        }
        StepKind::Sleep => Step::sleep(&s.name, s.sleep).into(),
        StepKind::Child => Step::child(&s.name, s.child.clone().unwrap_or_default(), |ctx| {
            Ok(ctx.raw_input().clone())
        })
        .into(),
        StepKind::Signal => {
            let (signal, timeout, default) = s.signal.clone().unwrap_or_default();
            let mut step = Step::signal(&s.name, signal).accept(|_, payload| {
                if payload["refuse"] == true {
                    Err(saga_dsl::StepError::permanent("refused by its payload"))
                } else {
                    Ok(payload)
                }
            });
            if let Some(timeout) = timeout {
                step = step.signal_timeout(timeout);
            }
            match default {
                Some(default) => step.default_payload(default),
                None => step,
            }
            .into()
        }
        StepKind::Parallel => {
            let branches: Vec<Step<saga_dsl::Call>> = s
                .branches
                .iter()
                .map(|b| scripted_call(b, journal))
                .collect();
            let step = match &s.mapped_from {
                // One branch per element of the input's list, named by its `name`.
                Some(field) => {
                    let field = field.clone();
                    Step::map(
                        &s.name,
                        move |ctx| {
                            ctx.raw_input()[&field].as_array().cloned().ok_or_else(|| {
                                saga_dsl::StepError::permanent(format!("{field} is not a list"))
                            })
                        },
                        |element| Ok(element["name"].as_str().unwrap_or_default().to_owned()),
                        branches.into_iter().next().unwrap(),
                    )
                }
                None => Step::parallel(&s.name, branches),
            };
            match s.max_concurrency {
                Some(n) => step.max_concurrency(n),
                None => step,
            }
            .into()
        }
    };
    match s.when {
        Some(holds) => step.when(move |_| Ok(holds)),
        None => step,
    }
}

/// One scripted call (a compensatable, pivot or retriable step, or a branch): actions allow 3
/// attempts (retriable ones: unlimited), every backoff a few milliseconds.
fn scripted_call(s: &ScriptedStep, journal: &Journal) -> saga_dsl::Step<saga_dsl::Call> {
    use saga_dsl::{RetryPolicy, Step, StepKind};
    let fast = RetryPolicy::new()
        .with_initial_delay(Duration::from_millis(4))
        .with_max_delay(Duration::from_millis(20))
        .with_max_attempts(3);
    let (j, script) = (journal.clone(), Arc::new(s.action.clone()));
    let action = move |ctx: saga_dsl::StepContext| {
        let (j, script) = (j.clone(), script.clone());
        async move {
            // A mapped branch may carry its own script in its element.
            let own: Option<Vec<Outcome>> = ctx
                .raw_element()
                .and_then(|e| e.get("script"))
                .and_then(|s| serde_json::from_value(s.clone()).ok());
            play(&j, own.as_deref().unwrap_or(&script), &ctx).await
        }
    };
    let (j, script) = (journal.clone(), Arc::new(s.compensation.clone()));
    let compensation = move |ctx: saga_dsl::StepContext| {
        let (j, script) = (j.clone(), script.clone());
        async move { play(&j, &script, &ctx).await.map(|_| ()) }
    };
    let step = match s.kind {
        StepKind::Pivot => Step::pivot(&s.name, action).retry(fast),
        StepKind::Retriable => {
            Step::retriable(&s.name, action).retry(fast.with_unlimited_attempts())
        }
        _ => Step::compensatable(&s.name, action, compensation).retry(fast),
    };
    step.compensation_retry(fast.with_unlimited_attempts())
        .timeout(SCRIPT_TIMEOUT)
        .compensation_timeout(SCRIPT_TIMEOUT)
}

/// A registry holding the given definitions.
pub fn registry_of(defs: impl IntoIterator<Item = saga_dsl::SagaDefinition>) -> Registry {
    let mut r = Registry::new();
    for d in defs {
        r.register(d).unwrap();
    }
    r
}

/// The directory holding the workspace's built binaries (`target/debug`), found from the test
/// executable (`target/debug/deps/NAME-HASH`).
pub fn bin_path(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Runs the workspace binary `bin` (see [`bin_path`]) in `cwd` to completion, logging errors
/// only and without the caller's `SAGA_SERVER`, `SAGA_API_TOKEN` and `DATABASE_URL`, so that it
/// talks to the server or database its arguments name and to nothing else.
pub async fn run_bin(bin: &str, args: &[&str], cwd: &std::path::Path) -> std::process::Output {
    tokio::process::Command::new(bin_path(bin))
        .args(args)
        .current_dir(cwd)
        .env_remove("SAGA_SERVER")
        .env_remove("SAGA_API_TOKEN")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap()
}

/// Waits for `child` to exit, for at most `timeout` (then kills it and fails the test).
pub fn wait_exit(child: &mut std::process::Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGTERM to `child` and waits (at most 30 s) for it to exit.
pub fn sigterm(child: &mut std::process::Child) -> std::process::ExitStatus {
    let sent = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(sent, "kill -TERM failed");
    wait_exit(child, Duration::from_secs(30))
}

/// A real `example-sagas serve` process on loopback, killed with SIGKILL when dropped.
pub struct Server {
    /// The process.
    pub child: std::process::Child,
    /// `http://ADDR`, as the server printed it.
    pub base: String,
}

impl Server {
    /// Starts `example-sagas serve` on the saga database `db_url` and `shop.db` in `dir`, with
    /// a 2-second lease (so a restart after a kill takes over quickly on PostgreSQL), extra environment
    /// variables (`SAGA_LISTEN` for an address of the test's choosing, else a free port), and
    /// waits until it answers `/healthz`.
    pub async fn spawn(
        db_url: &str,
        dir: &std::path::Path,
        env: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Self {
        let mut cmd = std::process::Command::new(bin_path("example-sagas"));
        // A test that restarts a server on the same address gives it as `SAGA_LISTEN`.
        let listen = if env.iter().any(|(k, _)| *k == "SAGA_LISTEN") {
            vec![]
        } else {
            vec!["--listen", "127.0.0.1:0"]
        };
        cmd.arg("serve")
            .args(listen)
            .arg("--database-url")
            .arg(db_url)
            .args(if env.iter().any(|(k, _)| *k == "SHOP_DATABASE_URL") {
                vec![]
            } else {
                vec![
                    "--shop-database-url".to_owned(),
                    format!("sqlite://{}", dir.join("shop.db").display()),
                ]
            })
            .args(["--lease-ttl-secs", "2"])
            .args(extra_args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .env("RUST_LOG", "error");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::from_command(cmd).await
    }

    /// Starts `saga-suite-stages` (the sagas of `tests/support/bin/stages.rs`) on the saga
    /// database `db_url`, and waits until it answers `/healthz`.
    pub async fn spawn_stages(db_url: &str) -> Self {
        Self::spawn_stages_with(db_url, &[]).await
    }

    /// [`Server::spawn_stages`] with extra environment variables (a crash point, say).
    pub async fn spawn_stages_with(db_url: &str, env: &[(&str, &str)]) -> Self {
        let mut cmd = std::process::Command::new(bin_path("saga-suite-stages"));
        cmd.env("DATABASE_URL", db_url)
            .env("RUST_LOG", "error")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit());
        Self::from_command(cmd).await
    }

    /// Spawns `cmd` (its stdout piped), reads `listening on http://ADDR` from it and waits
    /// until the server answers `/healthz`.
    async fn from_command(mut cmd: std::process::Command) -> Self {
        use std::io::BufRead;
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        // The server prints `listening on http://ADDR` once bound.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.trim().to_owned());
                }
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("server did not start");
        let server = Self { child, base };
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = client.get(format!("{}/healthz", server.base)).send().await {
                if r.status().is_success() {
                    return server;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("server at {} never became healthy", server.base);
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`STOP`, `CONT`, `TERM`, …) with `kill(1)`.
    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// SIGKILL, and reap the process.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own (a crash point aborting it).
    pub fn wait_exit(mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// POSTs a saga start and returns its id.
    pub async fn start(&self, name: &str, input: serde_json::Value) -> Uuid {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/sagas/{name}", self.base))
            .json(&input)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{:?}", r.text().await);
        let body: serde_json::Value = r.json().await.unwrap();
        body["id"].as_str().unwrap().parse().unwrap()
    }

    /// GETs `/metrics`: the Prometheus text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// GETs a saga as JSON.
    pub async fn saga(&self, id: Uuid) -> serde_json::Value {
        reqwest::Client::new()
            .get(format!("{}/v1/sagas/{id}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Polls the saga over HTTP until `until` holds; panics after `timeout`.
    pub async fn wait_for(
        &self,
        id: Uuid,
        timeout: Duration,
        until: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let saga = self.saga(id).await;
            if until(&saga) {
                return saga;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "saga {id} never reached the expected state: {saga:#}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
