//! The sagas of a run, drawn from its seed: compensatable steps, now and then a parallel group,
//! a sleep or a signal wait with a timeout before the point of no return, an optional pivot
//! and retriable steps after it; and what each call of each step does ([`Attempt`]), now and
//! then a compensation that fails more often than the engine flags *needs attention* after,
//! and now and then a compensatable step completed by its participant's callback.
//!
//! Each saga has a definition of its own whose step names carry its number, since the kit
//! scripts calls by step name across every saga of a world.
//!
//! An action's script puts its definitive failures (retryable, retry-after, permanent) before
//! any call that runs the step's code: a participant deduplicating on the key answers a call
//! for a key it has already applied with that success, never with a failure, so a script that
//! failed after an effect would describe a participant that breaks its own contract.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use saga_dsl::{Registry, RetryPolicy, SagaDefinition, Step, StepContext, StepError, StepKind};
use saga_test::Attempt;
use serde_json::json;

use crate::ledger::Ledger;

/// How long a call completed by callback waits for its answer before the engine counts its
/// outcome unknown and tries again.
pub const CALLBACK_TIMEOUT: Duration = Duration::from_secs(60);

/// How many attempts an action before the point of no return gets.
pub const ACTION_ATTEMPTS: u32 = 3;

/// After how many failed attempts of a compensation the kit's engine flags its saga *needs
/// attention*: the engine's default, which the kit keeps.
pub fn attention_after() -> u32 {
    orchestrator::engine::EngineConfig::default().needs_attention_after
}

/// One action (and compensation, if any) the ledger sees: a step, or a branch of a group.
#[derive(Debug, Clone)]
pub struct Unit {
    /// The name the log and the ledger know it by (`group/branch` for a branch).
    pub name: String,
    /// The position of its stage in the definition.
    pub stage: usize,
    pub kind: StepKind,
    /// For a branch: its group's and its own name.
    pub branch: Option<(String, String)>,
    /// What its action books.
    pub amount: i64,
    /// Whether its action is completed by its participant's callback: the call hands the
    /// participant a task, which books the effect when the schedule answers it.
    pub callback: bool,
    pub action: Vec<Attempt>,
    pub compensation: Vec<Attempt>,
}

/// A stage of a simulated saga.
#[derive(Debug, Clone)]
pub enum Stage {
    Call(Unit),
    Group(String, Vec<Unit>),
    Sleep(String, Duration),
    /// A wait for the signal `go`, with its timeout and whether it has a default payload.
    Signal(String, Duration, bool),
}

/// A simulated saga: its definition's name and stages, and when it starts.
#[derive(Debug, Clone)]
pub struct Shape {
    pub name: String,
    pub stages: Vec<Stage>,
    pub start_delay: Option<Duration>,
}

impl Shape {
    /// Draws saga number `i`.
    pub fn draw(rng: &mut StdRng, i: usize) -> Self {
        let p = format!("s{i}");
        let mut stages = Vec::new();
        for j in 0..rng.gen_range(1..=3) {
            stages.push(Stage::Call(Unit::draw(
                rng,
                format!("{p}c{j}"),
                StepKind::Compensatable,
            )));
        }
        if rng.gen_bool(0.3) {
            let group = format!("{p}g");
            let branches = (0..rng.gen_range(2..=3))
                .map(|b| {
                    let mut unit =
                        Unit::draw(rng, format!("{group}/b{b}"), StepKind::Compensatable);
                    unit.branch = Some((group.clone(), format!("b{b}")));
                    unit
                })
                .collect();
            let at = rng.gen_range(0..=stages.len());
            stages.insert(at, Stage::Group(group, branches));
        }
        if rng.gen_bool(0.25) {
            let at = rng.gen_range(0..=stages.len());
            let length = Duration::from_secs(rng.gen_range(1..=600));
            stages.insert(at, Stage::Sleep(format!("{p}z"), length));
        }
        if rng.gen_bool(0.3) {
            let at = rng.gen_range(0..=stages.len());
            let timeout = Duration::from_secs(rng.gen_range(1..=3600));
            stages.insert(
                at,
                Stage::Signal(format!("{p}w"), timeout, rng.gen_bool(0.5)),
            );
        }
        if rng.gen_bool(0.25) {
            let mut unit = Unit::draw(rng, format!("{p}k"), StepKind::Compensatable);
            unit.callback = true;
            // Its scripted failures come before the hand-off; every later call hands the task
            // over again, and the answer decides the attempt.
            unit.action.retain(|a| {
                matches!(
                    a,
                    Attempt::Retryable | Attempt::RetryAfter(_) | Attempt::Permanent
                )
            });
            let at = rng.gen_range(0..=stages.len());
            stages.insert(at, Stage::Call(unit));
        }
        if rng.gen_bool(0.6) {
            stages.push(Stage::Call(Unit::draw(
                rng,
                format!("{p}p"),
                StepKind::Pivot,
            )));
            for j in 0..rng.gen_range(0..=2) {
                stages.push(Stage::Call(Unit::draw(
                    rng,
                    format!("{p}r{j}"),
                    StepKind::Retriable,
                )));
            }
        }
        for (at, stage) in stages.iter_mut().enumerate() {
            match stage {
                Stage::Call(unit) => unit.stage = at,
                Stage::Group(_, branches) => branches.iter_mut().for_each(|b| b.stage = at),
                Stage::Sleep(..) | Stage::Signal(..) => {}
            }
        }
        let start_delay = rng
            .gen_bool(0.4)
            .then(|| Duration::from_millis(rng.gen_range(1..=120_000)));
        Self {
            name: format!("sim{i}"),
            stages,
            start_delay,
        }
    }

    /// Every action the ledger may see, in stage order.
    pub fn units(&self) -> Vec<&Unit> {
        self.stages
            .iter()
            .flat_map(|s| match s {
                Stage::Call(u) => vec![u],
                Stage::Group(_, b) => b.iter().collect(),
                Stage::Sleep(..) | Stage::Signal(..) => vec![],
            })
            .collect()
    }

    /// The unit named `name`.
    pub fn unit(&self, name: &str) -> Option<&Unit> {
        self.units().into_iter().find(|u| u.name == name)
    }

    /// Whether it has a pivot (a point of no return).
    pub fn has_pivot(&self) -> bool {
        self.units().iter().any(|u| u.kind == StepKind::Pivot)
    }

    /// Its units completed by callback.
    pub fn callbacks(&self) -> impl Iterator<Item = &Unit> {
        self.units().into_iter().filter(|u| u.callback)
    }

    /// Whether it waits for a signal.
    pub fn waits_for_signal(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::Signal(..)))
    }

    /// Its definition, each call booking on `ledger`.
    pub fn definition(&self, ledger: &Ledger) -> SagaDefinition {
        let mut builder = SagaDefinition::builder(self.name.clone(), 1);
        for stage in &self.stages {
            builder = match stage {
                Stage::Call(unit) => builder.step(unit.step(ledger, &unit.name)),
                Stage::Group(name, branches) => builder.step(Step::parallel(
                    name.clone(),
                    branches.iter().map(|b| {
                        let own = b.branch.as_ref().map_or(b.name.as_str(), |(_, n)| n);
                        b.step(ledger, own)
                    }),
                )),
                Stage::Sleep(name, length) => builder.step(Step::sleep(name.clone(), *length)),
                Stage::Signal(name, timeout, default) => {
                    let wait = Step::signal(name.clone(), "go").signal_timeout(*timeout);
                    if *default {
                        builder.step(wait.default_payload(json!({"by": "default"})))
                    } else {
                        builder.step(wait)
                    }
                }
            };
        }
        builder
            .build()
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

/// The registry of a run's sagas.
pub fn registry(shapes: &[Shape], ledger: &Ledger) -> Registry {
    shapes.iter().fold(Registry::new(), |registry, shape| {
        registry
            .with(shape.definition(ledger))
            .unwrap_or_else(|e| panic!("{}: {e}", shape.name))
    })
}

fn backoff(policy: RetryPolicy) -> RetryPolicy {
    // No jitter: the engine would draw it outside the seed.
    policy
        .with_initial_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(60))
        .with_jitter(false)
}

impl Unit {
    fn draw(rng: &mut StdRng, name: String, kind: StepKind) -> Self {
        let mut action = Vec::new();
        for _ in 0..rng.gen_range(0..=2) {
            let failure = match rng.gen_range(0..10) {
                0..=4 => Attempt::Retryable,
                5..=7 => Attempt::RetryAfter(Duration::from_secs(rng.gen_range(1..=120))),
                _ => Attempt::Permanent,
            };
            action.push(failure);
            if failure == Attempt::Permanent {
                break;
            }
        }
        if action.last() != Some(&Attempt::Permanent) {
            for _ in 0..rng.gen_range(0..=2) {
                action.push(match rng.gen_range(0..6) {
                    0 | 1 => Attempt::Unknown,
                    2 => Attempt::Hang,
                    3 => Attempt::Delayed(Duration::from_secs(rng.gen_range(1..=20))),
                    _ => Attempt::Run,
                });
            }
        }
        let compensation = if kind == StepKind::Compensatable && rng.gen_bool(0.12) {
            // A compensation that keeps failing, past the threshold that flags its saga.
            let from = attention_after();
            (0..rng.gen_range(from..=from + 2))
                .map(|_| match rng.gen_range(0..4) {
                    0 | 1 => Attempt::Retryable,
                    2 => Attempt::RetryAfter(Duration::from_secs(rng.gen_range(1..=30))),
                    _ => Attempt::Hang,
                })
                .collect()
        } else if kind == StepKind::Compensatable {
            (0..rng.gen_range(0..=2))
                .map(|_| match rng.gen_range(0..6) {
                    0 => Attempt::Retryable,
                    1 => Attempt::RetryAfter(Duration::from_secs(rng.gen_range(1..=120))),
                    2 => Attempt::Permanent,
                    3 => Attempt::Unknown,
                    4 => Attempt::Hang,
                    _ => Attempt::Delayed(Duration::from_secs(rng.gen_range(1..=20))),
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            name,
            stage: 0,
            kind,
            branch: None,
            amount: rng.gen_range(1..=1000),
            callback: false,
            action,
            compensation,
        }
    }

    /// The step (or branch, named `own`) that books this unit's amount.
    fn step(&self, ledger: &Ledger, own: &str) -> Step<saga_dsl::Call> {
        let amount = self.amount;
        let act = {
            let ledger = ledger.clone();
            move |ctx: StepContext| {
                let ledger = ledger.clone();
                async move { Ok::<_, StepError>(ledger.act(&ctx, amount)) }
            }
        };
        let timeout = Duration::from_secs(30);
        match self.kind {
            StepKind::Compensatable if self.callback => {
                let hand = {
                    let ledger = ledger.clone();
                    move |ctx: StepContext| {
                        let ledger = ledger.clone();
                        async move { Ok::<_, StepError>(ledger.hand_off(&ctx)) }
                    }
                };
                let ledger = ledger.clone();
                let undo = move |ctx: StepContext| {
                    let ledger = ledger.clone();
                    async move { ledger.undo(&ctx) }
                };
                Step::compensatable(own, hand, undo)
                    .completed_by_callback()
                    .retry(backoff(
                        RetryPolicy::new().with_max_attempts(ACTION_ATTEMPTS),
                    ))
                    .timeout(CALLBACK_TIMEOUT)
                    .compensation_retry(backoff(RetryPolicy::forever()))
                    .compensation_timeout(timeout)
            }
            StepKind::Compensatable => {
                let ledger = ledger.clone();
                let undo = move |ctx: StepContext| {
                    let ledger = ledger.clone();
                    async move { ledger.undo(&ctx) }
                };
                Step::compensatable(own, act, undo)
                    .retry(backoff(
                        RetryPolicy::new().with_max_attempts(ACTION_ATTEMPTS),
                    ))
                    .timeout(timeout)
                    .compensation_retry(backoff(RetryPolicy::forever()))
                    .compensation_timeout(timeout)
            }
            StepKind::Pivot => Step::pivot(own, act)
                .retry(backoff(
                    RetryPolicy::new().with_max_attempts(ACTION_ATTEMPTS),
                ))
                .timeout(timeout),
            _ => Step::retriable(own, act)
                .retry(backoff(RetryPolicy::forever()))
                .timeout(timeout),
        }
    }
}
