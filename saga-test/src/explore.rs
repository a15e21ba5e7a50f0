//! Crash-point exploration: a saga run once without a crash, to number the writes it makes to
//! its step log, then once per write and side of it, stopped there as a kill -9 would stop it
//! and resumed on the same log until it ends; the test's invariants are checked after every
//! run. With several seeds, parallel branches' results arrive in a different order for each.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::model::{Saga, SagaStatus};
use orchestrator::store::TaskAnswer;
use saga_dsl::{Phase, Registry, StepError};
use serde_json::Value;
use uuid::Uuid;

use crate::ended::Ended;
use crate::script::Attempt;
use crate::tap::CrashPoint;
use crate::world::SagaTest;

/// The environment variable that runs one crash point alone (`before:N` or `after:N`).
pub const CRASH_ENV: &str = "SAGA_TEST_CRASH";
/// The environment variable that runs one seed alone.
pub const SEED_ENV: &str = "SAGA_TEST_SEED";

type Check<W> = Box<dyn Fn(&Ended, &W)>;
type Answer<W> = Box<dyn Fn(&W) -> Result<Value, StepError>>;

/// An exploration of every crash point of one saga: see [`explore`].
pub struct Explorer<W> {
    world: Box<dyn Fn() -> (Registry, W)>,
    start: Option<(String, Value)>,
    scripts: Vec<(String, Phase, Vec<Attempt>)>,
    signals: Vec<(String, Value)>,
    answers: Vec<(String, Answer<W>)>,
    seeds: Vec<u64>,
    checks: Vec<Check<W>>,
    only: Option<(u64, CrashPoint)>,
    max_wait: Option<Duration>,
}

impl<W> std::fmt::Debug for Explorer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Explorer")
            .field("start", &self.start)
            .field("seeds", &self.seeds)
            .finish_non_exhaustive()
    }
}

/// What an exploration ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The seeds explored.
    pub seeds: usize,
    /// The writes of the runs without a crash, summed over the seeds: each is two crash
    /// points.
    pub writes: usize,
    /// The runs made: per seed, one without a crash and two per write.
    pub runs: usize,
    /// How long it took.
    pub elapsed: Duration,
}

/// Explores every crash point of a saga. `world` makes a fresh registry and the participants
/// its steps call (fakes holding the effects, which survive a crash of the engine as other
/// services would) for each run; [`Explorer::start`] names the saga, [`Explorer::check`] the
/// invariants, and [`Explorer::run`] runs it all, failing the test at the first broken
/// invariant with the crash point and seed that reproduce it.
pub fn explore<W: 'static>(world: impl Fn() -> (Registry, W) + 'static) -> Explorer<W> {
    Explorer {
        world: Box::new(world),
        start: None,
        scripts: Vec::new(),
        signals: Vec::new(),
        answers: Vec::new(),
        seeds: vec![0],
        checks: Vec::new(),
        only: None,
        max_wait: None,
    }
}

impl<W: 'static> Explorer<W> {
    /// The saga to run: its definition's name and input.
    pub fn start(mut self, name: &str, input: Value) -> Self {
        self.start = Some((name.to_owned(), input));
        self
    }

    /// Scripts `step`'s action attempts in every run (see [`SagaTest::script`]).
    pub fn script(mut self, step: &str, attempts: impl IntoIterator<Item = Attempt>) -> Self {
        self.scripts.push((
            step.to_owned(),
            Phase::Action,
            attempts.into_iter().collect(),
        ));
        self
    }

    /// Scripts `step`'s compensation attempts in every run.
    pub fn script_compensation(
        mut self,
        step: &str,
        attempts: impl IntoIterator<Item = Attempt>,
    ) -> Self {
        self.scripts.push((
            step.to_owned(),
            Phase::Compensation,
            attempts.into_iter().collect(),
        ));
        self
    }

    /// Sends signal `name` with `payload` right after the start (the log keeps it until the
    /// saga's signal step takes it).
    pub fn signal(mut self, name: &str, payload: Value) -> Self {
        self.signals.push((name.to_owned(), payload));
        self
    }

    /// Answers the calls of `step`, a step completed by callback, as its participant would:
    /// each time an attempt of it waits for its callback, `answer` is reported for that attempt
    /// (`Ok` completes it with the output, an error fails it, for good unless retryable). The
    /// report is a write to the log like any other, so its crash points are explored too.
    /// `answer` is called once per attempt, with the run's participants (a fake that acts on
    /// the call when it answers, as a real participant acts before calling back).
    pub fn answer_task(
        mut self,
        step: &str,
        answer: impl Fn(&W) -> Result<Value, StepError> + 'static,
    ) -> Self {
        self.answers.push((step.to_owned(), Box::new(answer)));
        self
    }

    /// How much virtual time each run waits for the saga to end, or between two of its calls
    /// completed by callback, before failing (a day unless set), as
    /// [`SagaTest::waiting_at_most`].
    pub fn waiting_at_most(mut self, virtual_time: Duration) -> Self {
        self.max_wait = Some(virtual_time);
        self
    }

    /// Explores with each of `seeds` (one, `0`, unless set): a seed delays every call by a few
    /// virtual milliseconds of its own, so that parallel branches' results arrive in another
    /// order.
    pub fn seeds(mut self, seeds: impl IntoIterator<Item = u64>) -> Self {
        self.seeds = seeds.into_iter().collect();
        self
    }

    /// Runs only the case of `seed` crashed at `point` (what a failure names), as
    /// [`SEED_ENV`] and [`CRASH_ENV`] do from the environment.
    pub fn only(mut self, seed: u64, point: CrashPoint) -> Self {
        self.only = Some((seed, point));
        self
    }

    /// An invariant, checked (by panicking, as `assert!` does) once the saga has ended in every
    /// run, with the participants of that run.
    pub fn check(mut self, check: impl Fn(&Ended, &W) + 'static) -> Self {
        self.checks.push(Box::new(check));
        self
    }

    /// Runs the exploration; fails the test at the first broken invariant or saga that does not
    /// end, naming the crash point and the seed. [`CRASH_ENV`] and [`SEED_ENV`] narrow it to
    /// one case.
    pub fn run(self) -> Report {
        let began = Instant::now();
        let only_seed = self
            .only
            .map(|(seed, _)| seed)
            .or_else(|| env_parse::<u64>(SEED_ENV));
        let only_crash = self
            .only
            .map(|(_, point)| point)
            .or_else(|| env_parse::<CrashPoint>(CRASH_ENV));
        let seeds: Vec<u64> = match only_seed {
            Some(seed) => vec![seed],
            None => self.seeds.clone(),
        };
        let mut report = Report {
            seeds: seeds.len(),
            writes: 0,
            runs: 0,
            elapsed: Duration::ZERO,
        };
        for seed in seeds {
            let writes = self.case(seed, None, &[]);
            report.runs += 1;
            report.writes += writes.len();
            let points: Vec<CrashPoint> = match only_crash {
                Some(point) if point.write() > writes.len() => panic!(
                    "saga-test: crash point {point} is beyond the {} writes of the run \
                     without a crash (seed {seed}); nothing to run",
                    writes.len()
                ),
                Some(point) => vec![point],
                None => (1..=writes.len())
                    .flat_map(|n| [CrashPoint::Before(n), CrashPoint::After(n)])
                    .collect(),
            };
            for point in points {
                self.case(seed, Some(point), &writes);
                report.runs += 1;
            }
        }
        report.elapsed = began.elapsed();
        report
    }

    /// One run: crashed at `point` (if any) and resumed until the saga ends, then checked.
    /// Returns the writes it made.
    fn case(&self, seed: u64, point: Option<CrashPoint>, baseline: &[String]) -> Vec<String> {
        let (name, input) = self
            .start
            .clone()
            .expect("saga-test: name the saga to explore with .start(name, input)");
        let (registry, world) = (self.world)();
        let mut test = SagaTest::build(Arc::new(registry), Some(seed), point);
        if let Some(wait) = self.max_wait {
            test = test.waiting_at_most(wait);
        }
        for (step, phase, attempts) in &self.scripts {
            match phase {
                Phase::Action => test.script(step, attempts.clone()),
                Phase::Compensation => test.script_compensation(step, attempts.clone()),
            };
        }
        let run = catch_unwind(AssertUnwindSafe(|| {
            let id = test.start(&name, input);
            for (signal, payload) in &self.signals {
                if let Err(e) = test.signal(id, signal, payload.clone()) {
                    panic!("saga-test: signal {signal} refused: {e}");
                }
            }
            let ended = self.run_answering(&mut test, id, &world);
            for check in &self.checks {
                check(&ended, &world);
            }
        }));
        if let Err(panic) = run {
            let context = self.failure(seed, point, baseline, &test.writes());
            let cause = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied());
            match cause {
                Some(cause) => panic!("{context}\n  {cause}"),
                None => {
                    eprintln!("{context}");
                    resume_unwind(panic)
                }
            }
        }
        test.writes()
    }

    /// Runs saga `id` until it ends, answering each attempt that waits for its callback.
    fn run_answering(&self, test: &mut SagaTest, id: Uuid, world: &W) -> Ended {
        // The attempts answered, as their participants remember what they reported.
        let mut answered: Vec<(String, u32)> = Vec::new();
        loop {
            let seen = answered.clone();
            let saga = test.run_until(id, move |s| {
                s.status.is_terminal() || awaited_task(s, &seen).is_some()
            });
            let Some(attempt) = awaited_task(&saga, &answered) else {
                return test.read(id);
            };
            let step = &attempt.0;
            let Some((_, answer)) = self.answers.iter().find(|(s, _)| s == step) else {
                panic!(
                    "saga-test: saga {} waits for the callback of {step}, which this \
                     exploration does not answer: add .answer_task({step:?}, …)",
                    saga.name
                );
            };
            match test.answer_task(id, step, answer(world)) {
                // Made again after a crash cut it short, the report answers as it first did.
                Ok(TaskAnswer::Recorded { .. } | TaskAnswer::Repeated { .. }) => {}
                // Refused because the attempt went on meanwhile, as a late callback is.
                Ok(TaskAnswer::NotCurrent) => {}
                Ok(TaskAnswer::NotFound) => {
                    panic!("saga-test: the log has no call of {step} waiting for its callback")
                }
                Ok(other @ TaskAnswer::Extended { .. }) => {
                    panic!("saga-test: a report for {step} was taken as a heartbeat: {other:?}")
                }
                Err(e) => panic!("saga-test: the report for {step}'s call failed: {e}"),
            }
            answered.push(attempt);
        }
    }

    fn failure(
        &self,
        seed: u64,
        point: Option<CrashPoint>,
        baseline: &[String],
        writes: &[String],
    ) -> String {
        let mut text = String::from("saga-test: the saga broke an invariant ");
        match point {
            None => text.push_str(&format!("in its run without a crash (seed {seed})")),
            Some(point) => {
                let what = baseline
                    .get(point.write() - 1)
                    .map(String::as_str)
                    .unwrap_or("beyond the run without a crash");
                text.push_str(&format!(
                    "after a crash {} write {} of {} ({what}), seed {seed}",
                    match point {
                        CrashPoint::Before(_) => "just before",
                        CrashPoint::After(_) => "just after",
                    },
                    point.write(),
                    baseline.len(),
                ));
                text.push_str(&format!(
                    "\n  to run this case alone: {SEED_ENV}={seed} {CRASH_ENV}={point}"
                ));
            }
        }
        text.push_str("\n  the writes of this run:");
        for (i, w) in writes.iter().enumerate() {
            text.push_str(&format!("\n    {:>3} {w}", i + 1));
        }
        text
    }
}

/// The step and attempt of saga `saga`'s call that waits for its callback, unless answered.
fn awaited_task(saga: &Saga, answered: &[(String, u32)]) -> Option<(String, u32)> {
    if saga.status != SagaStatus::Running {
        return None;
    }
    saga.steps
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.awaited_task()?)))
        .find(|attempt| !answered.contains(attempt))
}

/// A variable of the environment, parsed; a value that does not parse fails the test.
fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    let raw = std::env::var(name).ok()?;
    match raw.trim().parse() {
        Ok(v) => Some(v),
        Err(e) => panic!("saga-test: {name}={raw:?}: {e}"),
    }
}
