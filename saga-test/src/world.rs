//! [`SagaTest`]: a registry run in-process on a temporary SQLite log, on the virtual clock,
//! one process lifetime after another.
//!
//! Each lifetime is a tokio runtime of its own (current-thread, time paused) with a store and an
//! engine opened in it. A crash drops the runtime as it stands, as a kill -9 would stop a
//! process; the next call opens a new lifetime on the same file, whose engine takes the sagas
//! over as a restarted server would. The saga's participants (whatever the registry's steps
//! call) live outside the lifetimes, as other services do.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use orchestrator::engine::{Engine, EngineConfig, StartKey, StartOutcome, StartRequest};
use orchestrator::model::{Millis, Saga};
use orchestrator::operations::{Cancelled, OperationError, Operations, Reason, Report};
use orchestrator::store::{
    SignalOutcome, SignalRequest, SqliteStore, Store, TaskAnswer, TaskRef, TaskReport,
};
use saga_dsl::{Phase, Registry, StepError};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::{VirtualClock, DEFAULT_START_MS};
use crate::ended::Ended;
use crate::script::{Attempt, Script};
use crate::tap::{CrashPoint, Lifeline, Tap, TappedStore};

/// The actor the kit's operator commands are recorded under.
const ACTOR: &str = "saga-test";

/// A test world: the sagas of one registry on a temporary SQLite log and a virtual clock.
///
/// Sleeps, retry delays, timeouts, signal timeouts and scheduled starts pass at once, in
/// order. Steps' attempts can be scripted ([`SagaTest::script`]); signals, cancels and the
/// other operator commands are sent from the test; [`SagaTest::crash`] stops the engine as a
/// kill -9 would, and the next call restarts it on the same log.
pub struct SagaTest {
    registry: Arc<Registry>,
    // Held for its lifetime: the log's folder.
    _dir: tempfile::TempDir,
    url: String,
    clock: Arc<VirtualClock>,
    tap: Arc<Tap>,
    script: Arc<Script>,
    config: EngineConfig,
    max_wait: Duration,
    life: Option<Life>,
    lifetimes: usize,
    crashes: usize,
}

/// One process lifetime.
struct Life {
    rt: tokio::runtime::Runtime,
    /// The store's runtime (real time, its own threads), dropped after the lifetime's.
    db: tokio::runtime::Runtime,
    engine: Engine,
    store: Arc<SqliteStore>,
    line: Arc<Lifeline>,
    _shutdown: CancellationToken,
}

impl std::fmt::Debug for SagaTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaTest")
            .field("url", &self.url)
            .field("lifetimes", &self.lifetimes)
            .finish_non_exhaustive()
    }
}

impl SagaTest {
    /// A world running `registry`'s sagas on a new temporary log, its clock at
    /// 2026-01-01T00:00:00Z.
    pub fn new(registry: Registry) -> Self {
        Self::build(Arc::new(registry), None, None)
    }

    pub(crate) fn build(
        registry: Arc<Registry>,
        seed: Option<u64>,
        crash: Option<CrashPoint>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("saga-test: cannot create a temporary folder");
        let url = format!("sqlite://{}", dir.path().join("saga.db").display());
        let script = Arc::new(Script::seeded(seed));
        let config = EngineConfig {
            workers: 16,
            // Long, so that heartbeats are rare in a long wait of virtual time (each is a
            // write the kit must make in real time); a restart on SQLite frees a dead
            // process's leases at once anyway.
            lease_ttl: Duration::from_secs(3 * 24 * 3600),
            // The engine wakes itself for every timer of its sagas, and every command the kit
            // sends wakes it: the poll only bounds how often an idle engine reads the log, each
            // read costing real time during a week of virtual sleep.
            poll_interval: Duration::from_secs(24 * 3600),
            worker_id: "saga-test:1".to_owned(),
            call_hook: Some(script.clone()),
            ..EngineConfig::default()
        };
        Self {
            registry,
            _dir: dir,
            url,
            clock: Arc::new(VirtualClock::starting_at(DEFAULT_START_MS)),
            tap: Arc::new(Tap::crashing_at(crash)),
            script,
            config,
            max_wait: Duration::from_secs(24 * 3600),
            life: None,
            lifetimes: 0,
            crashes: 0,
        }
    }

    /// Delays every call by a few virtual milliseconds drawn from `seed` and the call, so that
    /// parallel branches' results arrive in an order the seed fixes. Only before the first call
    /// that runs the engine.
    pub fn seeded(mut self, seed: u64) -> Self {
        assert!(
            self.life.is_none(),
            "saga-test: seed the world before running"
        );
        let script = Arc::new(Script::seeded(Some(seed)));
        self.config.call_hook = Some(script.clone());
        self.script = script;
        self
    }

    /// Stops the engine at `point` (counted over every write of this world, across sagas), as
    /// a kill -9 there would; the next call resumes on the same log. Once.
    pub fn crash_at(self, point: CrashPoint) -> Self {
        self.tap.plan(point);
        self
    }

    /// Starts the clock at `start_ms` (milliseconds since the Unix epoch) rather than
    /// 2026-01-01T00:00:00Z. Only before the first call that runs the engine.
    pub fn starting_at(mut self, start_ms: Millis) -> Self {
        assert!(
            self.life.is_none(),
            "saga-test: set the start time before running"
        );
        self.clock = Arc::new(VirtualClock::starting_at(start_ms));
        self
    }

    /// How much virtual time [`SagaTest::run`] waits for a saga to end before failing the
    /// test (a day unless set).
    pub fn waiting_at_most(mut self, virtual_time: Duration) -> Self {
        self.max_wait = virtual_time;
        self
    }

    /// Scripts the calls of `step`'s action: its `n`th call (counted across crashes) does
    /// `attempts[n - 1]`; later ones run the step's code. A call the engine wrote ahead but a
    /// crash stopped before it began is not counted.
    pub fn script(&mut self, step: &str, attempts: impl IntoIterator<Item = Attempt>) -> &mut Self {
        self.script
            .set(step, Phase::Action, attempts.into_iter().collect());
        self
    }

    /// Scripts the attempts of `step`'s compensation, as [`SagaTest::script`] does its action.
    pub fn script_compensation(
        &mut self,
        step: &str,
        attempts: impl IntoIterator<Item = Attempt>,
    ) -> &mut Self {
        self.script
            .set(step, Phase::Compensation, attempts.into_iter().collect());
        self
    }

    /// Now, on the virtual clock, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> Millis {
        use orchestrator::clock::Clock;
        self.clock.now_ms()
    }

    /// The writes the engine has made to the step log so far, each described, in order: what
    /// crash points are numbered by.
    pub fn writes(&self) -> Vec<String> {
        self.tap.writes()
    }

    /// How many process lifetimes have run (1 until the first crash).
    pub fn lifetimes(&self) -> usize {
        self.lifetimes
    }

    /// How many crashes stopped a running engine: a planned crash point that was reached, or
    /// [`SagaTest::crash`] while an engine ran. A crash point a later plan replaced, or one
    /// the run never reached, is not counted, nor a [`SagaTest::crash`] with no engine running.
    pub fn crashes(&self) -> usize {
        self.crashes
    }

    /// The crash point planned and not reached yet, if any.
    pub fn planned_crash(&self) -> Option<CrashPoint> {
        self.tap.planned()
    }

    /// Starts saga `name` with `input`, now; returns its id. The start carries an idempotency
    /// key, so a start cut short by a crash is made again after it and finds the same saga.
    pub fn start(&mut self, name: &str, input: Value) -> Uuid {
        self.start_request(name, input, None)
    }

    /// Starts saga `name` with `input` after `delay` of virtual time (`Saga-Start-At`).
    pub fn start_after(&mut self, name: &str, input: Value, delay: Duration) -> Uuid {
        let at = self.now_ms() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 4);
        self.start_request(name, input, Some(at))
    }

    fn start_request(&mut self, name: &str, input: Value, at: Option<Millis>) -> Uuid {
        let key = Uuid::new_v4().to_string();
        loop {
            let mut request = StartRequest::new(name, input.clone())
                .with_key(StartKey::new("saga-test", key.clone()));
            if let Some(at) = at {
                request = request.at(at);
            }
            match self.drive(|engine| async move { engine.start(request).await }) {
                Some(Ok(outcome)) => return started_id(&outcome),
                Some(Err(e)) => panic!("saga-test: starting {name} failed: {e}"),
                // Crashed before the answer: the client tries again with the same key.
                None => continue,
            }
        }
    }

    /// Runs until saga `id` ends (`COMPLETED`, `COMPENSATED`, `FAILED` or `ABORTED`), through
    /// any crash, and reads it. Fails the test if it has not ended after the virtual time
    /// allowed ([`SagaTest::waiting_at_most`]).
    pub fn run(&mut self, id: Uuid) -> Ended {
        self.run_until(id, |saga| saga.status.is_terminal());
        self.read(id)
    }

    /// Runs until saga `id`'s record, as operators see it (with `waiting_for` and the shown
    /// statuses), satisfies `done` (checked after each write to the log),
    /// through any crash; returns the record. Fails the test if that does not happen within the
    /// virtual time allowed.
    pub fn run_until(&mut self, id: Uuid, done: impl Fn(&Saga) -> bool + Clone) -> Saga {
        let deadline =
            self.now_ms() + i64::try_from(self.max_wait.as_millis()).unwrap_or(i64::MAX / 4);
        loop {
            let clock = self.clock.clone();
            let tap = self.tap.clone();
            let done = done.clone();
            let outcome = self.drive(|engine| async move {
                use orchestrator::clock::Clock;
                loop {
                    let written = tap.written();
                    tokio::pin!(written);
                    written.as_mut().enable();
                    let saga = match engine.store().get_saga(id).await {
                        // As operators see it: with what it waits for.
                        Ok(Some(saga)) => saga.shown(),
                        Ok(None) => return Err(format!("no saga {id} in the log")),
                        Err(e) => return Err(format!("reading saga {id}: {e}")),
                    };
                    if done(&saga) {
                        return Ok(saga);
                    }
                    let left = deadline - clock.now_ms();
                    if left <= 0 {
                        return Err(format!(
                            "saga {id} ({}) is {} after the virtual time allowed{}",
                            saga.name,
                            saga.status,
                            saga.waiting_for
                                .as_deref()
                                .map(|w| format!(", waiting for {w}"))
                                .unwrap_or_default()
                        ));
                    }
                    tokio::select! {
                        () = &mut written => {}
                        () = tokio::time::sleep(Duration::from_millis(left as u64)) => {}
                    }
                }
            });
            match outcome {
                Some(Ok(saga)) => return saga,
                Some(Err(message)) => panic!("saga-test: {message}"),
                None => continue,
            }
        }
    }

    /// Reads saga `id` with its attempt log and events.
    pub fn read(&mut self, id: Uuid) -> Ended {
        let read = self.drive(|engine| async move {
            let store = engine.store();
            let saga = store.get_saga(id).await?;
            let attempts = store.attempts(id).await?;
            let events = store.events(id).await?;
            Ok::<_, orchestrator::StoreError>((saga, attempts, events))
        });
        match read {
            Some(Ok((Some(saga), attempts, events))) => Ended {
                saga: saga.shown(),
                attempts,
                events,
                calls: self.script.calls_of(id),
            },
            Some(Ok((None, _, _))) => panic!("saga-test: no saga {id} in the log"),
            Some(Err(e)) => panic!("saga-test: reading saga {id}: {e}"),
            None => self.read(id),
        }
    }

    /// Sends signal `name` with `payload` to saga `id`.
    pub fn signal(
        &mut self,
        id: Uuid,
        name: &str,
        payload: Value,
    ) -> Result<SignalOutcome, OperationError> {
        let payload = &payload;
        self.operate(move |engine| async move {
            Operations::of(&engine)
                .signal(SignalRequest {
                    saga: id,
                    name,
                    payload,
                    key: None,
                })
                .await
        })
    }

    /// Asks saga `id` to cancel (it compensates once the call in flight ends).
    pub fn cancel(&mut self, id: Uuid) -> Result<Cancelled, OperationError> {
        self.operate(move |engine| async move { Operations::of(&engine).cancel(id).await })
    }

    /// Pauses saga `id` (its call in flight ends first).
    pub fn pause(&mut self, id: Uuid, reason: &str) -> Result<Saga, OperationError> {
        let reason = &Reason::parse(reason)?;
        self.operate(
            move |engine| async move { Operations::of(&engine).pause(id, reason, ACTOR).await },
        )
    }

    /// Resumes paused saga `id`.
    pub fn resume(&mut self, id: Uuid, reason: &str) -> Result<Saga, OperationError> {
        let reason = &Reason::parse(reason)?;
        self.operate(move |engine| async move {
            Operations::of(&engine).resume(id, reason, ACTOR).await
        })
    }

    /// Makes saga `id`'s waiting retry happen now, or gives a `FAILED` saga's failed step
    /// another attempt.
    pub fn retry(&mut self, id: Uuid) -> Result<Saga, OperationError> {
        self.operate(move |engine| async move { Operations::of(&engine).retry(id, ACTOR).await })
    }

    /// Aborts saga `id` without compensation.
    pub fn abort(&mut self, id: Uuid, reason: &str) -> Result<Saga, OperationError> {
        let reason = &Reason::parse(reason)?;
        self.operate(
            move |engine| async move { Operations::of(&engine).abort(id, reason, ACTOR).await },
        )
    }

    /// Completes `step` of saga `id` by hand with `output` (as an operator would for a step
    /// done outside the saga).
    pub fn complete_step(
        &mut self,
        id: Uuid,
        step: &str,
        output: Value,
        reason: &str,
    ) -> Result<Saga, OperationError> {
        let reason = &Reason::parse(reason)?;
        let output = &output;
        self.operate(move |engine| async move {
            Operations::of(&engine)
                .complete_step(id, step, output.clone(), reason, ACTOR)
                .await
        })
    }

    /// Reports `report` for the call that handed its participant `token` (what its step read
    /// from [`StepContext::task`](saga_dsl::StepContext::task)), as the participant would with
    /// `POST /v1/tasks/{token}/…`.
    pub fn report_task(
        &mut self,
        token: &str,
        report: Report,
    ) -> Result<(TaskRef, TaskAnswer), OperationError> {
        let report = &report;
        self.operate(move |engine| async move {
            Operations::of(&engine)
                .report_task(token, report.clone())
                .await
        })
    }

    /// Completes with `output` the call of `step` of saga `id` that waits for its callback
    /// (its current attempt), as its participant would: for a test that does not keep the
    /// token its fake participant was handed.
    pub fn complete_task(
        &mut self,
        id: Uuid,
        step: &str,
        output: Value,
    ) -> Result<TaskAnswer, OperationError> {
        self.answer_task(id, step, Ok(output))
    }

    /// Reports `outcome` for the call of `step` of saga `id` that waits for its callback (its
    /// current attempt), as its participant would: `Ok` completes it with that output, an error
    /// fails it, for good unless [`StepError::is_retryable`].
    pub fn answer_task(
        &mut self,
        id: Uuid,
        step: &str,
        outcome: Result<Value, StepError>,
    ) -> Result<TaskAnswer, OperationError> {
        let report = &match outcome {
            Ok(output) => TaskReport::Complete(output),
            Err(e) => TaskReport::Fail {
                error: e.message().to_owned(),
                retryable: e.is_retryable(),
            },
        };
        self.operate(move |engine| async move {
            let store = engine.store();
            let saga = store
                .get_saga(id)
                .await?
                .ok_or_else(|| OperationError::NotFound(format!("no saga {id}")))?;
            let row =
                saga.steps.iter().find(|s| s.name == step).ok_or_else(|| {
                    OperationError::NotFound(format!("saga {id} has no step {step}"))
                })?;
            let task = TaskRef {
                saga: id,
                step_index: row.index,
                phase: Phase::Action,
                attempt: row.action.attempts,
            };
            Ok(store.report_task(&task, report).await?)
        })
    }

    /// Moves the clock forward by `by` at once (a clock jump): every timer due meanwhile fires.
    /// No store call is in flight during the jump (each blocks the lifetime's thread), so a
    /// call's own timeouts (a pool's wait for a connection) never see it.
    /// A jump longer than the engine's lease lapses the leases of the sagas in flight, as a
    /// process stalled that long would lose them.
    pub fn advance(&mut self, by: Duration) {
        self.drive(|_| async move {
            // The tasks that can run first do, so that a store call they are about to make
            // happens before the jump, as it would on a clock that does not jump.
            tokio::task::yield_now().await;
            tokio::time::advance(by).await;
        });
    }

    /// Stops the engine now, as a kill -9 would: nothing more reaches the log, the calls in
    /// flight are cut off. The next call starts a new process lifetime on the same log.
    pub fn crash(&mut self) {
        if let Some(life) = self.life.take() {
            self.crashes += 1;
            self.end(life);
        }
    }

    /// A command from outside, made again after a crash cut it short (as an operator retries).
    fn operate<T, F: Future<Output = Result<T, OperationError>>>(
        &mut self,
        command: impl Fn(Engine) -> F,
    ) -> Result<T, OperationError> {
        loop {
            if let Some(result) = self.drive(&command) {
                if let Some(life) = &self.life {
                    life.engine.wake();
                }
                return result;
            }
        }
    }

    /// Runs `op` in the current lifetime (starting one if none runs); `None` if the lifetime
    /// crashed before `op` finished (it has then been ended).
    fn drive<T, F: Future<Output = T>>(&mut self, op: impl FnOnce(Engine) -> F) -> Option<T> {
        let life = self.life();
        let engine = life.engine.clone();
        let line = life.line.clone();
        let _watch = Watchdog::start();
        let out = life.rt.block_on(async {
            tokio::select! {
                biased;
                () = line.stopped() => None,
                out = op(engine) => Some(out),
            }
        });
        if line.is_dead() {
            // Only a planned crash point kills a running lifetime's line.
            self.crashes += 1;
            let life = self.life.take().expect("the lifetime runs");
            self.end(life);
        }
        out
    }

    /// The current lifetime, started if none runs.
    fn life(&mut self) -> &Life {
        if self.life.is_none() {
            let life = self.begin();
            self.life = Some(life);
        }
        self.life.as_ref().expect("just started")
    }

    fn begin(&mut self) -> Life {
        self.lifetimes += 1;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("saga-test: cannot build a runtime");
        let line = Arc::new(Lifeline::default());
        let shutdown = CancellationToken::new();
        let mut config = self.config.clone();
        config.worker_id = format!("saga-test:{}", self.lifetimes);
        // The store runs in a runtime of its own, on real time: its pool's timeouts and its
        // writer are the database's business, and the lifetime waits for each call.
        let db = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("saga-test: cannot build a runtime");
        rt.block_on(async { self.clock.attach() });
        let store = db
            .block_on(SqliteStore::open_on_clock(&self.url, self.clock.clone()))
            .expect("saga-test: cannot open the step log");
        let store = Arc::new(store);
        let db_handle = db.handle().clone();
        let (engine, store) = rt.block_on(async {
            let tapped: Arc<dyn Store> = Arc::new(TappedStore::new(
                store.clone(),
                self.tap.clone(),
                line.clone(),
                db_handle,
            ));
            let engine =
                Engine::with_clock(tapped, self.registry.clone(), config, self.clock.clone());
            engine
                .register()
                .await
                .expect("saga-test: the engine cannot start");
            let runner = engine.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                if let Err(e) = runner.run(stop).await {
                    eprintln!("saga-test: the engine stopped: {e}");
                }
            });
            (engine, store)
        });
        Life {
            rt,
            db,
            engine,
            store,
            line,
            _shutdown: shutdown,
        }
    }

    /// Ends a lifetime as a kill -9 would: nothing more reaches the log, the store calls in
    /// flight settle, and the runtime is dropped with every task where it waits.
    fn end(&mut self, life: Life) {
        life.line.die();
        life.rt.block_on(life.line.stopped());
        life.db.block_on(life.store.settled());
        {
            let _in = life.rt.enter();
            self.clock.detach();
        }
        let Life {
            rt,
            db,
            engine,
            store,
            ..
        } = life;
        drop(engine);
        rt.shutdown_timeout(Duration::from_secs(10));
        drop(store);
        db.shutdown_timeout(Duration::from_secs(10));
    }
}

impl Drop for SagaTest {
    fn drop(&mut self) {
        if let Some(life) = self.life.take() {
            self.end(life);
        }
    }
}

fn started_id(outcome: &StartOutcome) -> Uuid {
    outcome.saga_id()
}

/// How long a call of the kit may go without returning, in real time, before it says why it
/// might be stuck.
const STUCK_AFTER: Duration = Duration::from_secs(60);

/// Warns, once, if a call of the kit outlasts [`STUCK_AFTER`] of real time: virtual time
/// stands still while a step's own code runs, so a step that sleeps on tokio's clock waits for
/// ever, and without a word the test would just hang.
struct Watchdog {
    // Dropped when the call returns, which ends the watching thread.
    _done: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    fn start() -> Self {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(STUCK_AFTER)
            {
                eprintln!(
                    "saga-test: no progress for {} s of real time. Virtual time stands still \
                     while a step's own code runs: a step that sleeps on tokio's clock waits for \
                     ever (script Attempt::Delayed to let a call take virtual time).",
                    STUCK_AFTER.as_secs()
                );
            }
        });
        Self { _done: done }
    }
}
