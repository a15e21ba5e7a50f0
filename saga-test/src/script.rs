//! Scripted calls: what each call of a step's action or compensation does, set by the test,
//! through the engine's [`CallHook`]. Unscripted calls run the saga's own code.
//!
//! Scripts count calls that began, not attempt numbers: after a crash, the attempt the engine
//! wrote ahead but never ran is recorded as interrupted and the next attempt is the step's
//! first call, which is what a script of "the first call fails" means.
//!
//! Virtual time stands still while a step's own code runs: it may wait on real I/O (its
//! participant's database, a socket), during which the engine's timers must not fire as though
//! the wait were long. Code that itself sleeps on tokio's clock would therefore wait for ever
//! in the kit; a script's [`Attempt::Delayed`] is how a call takes virtual time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::engine::{CallFuture, CallHook, CallSite};
use saga_dsl::{Phase, StepError};
use uuid::Uuid;

use crate::clock::real_io;

/// What one attempt of a call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Runs the saga's own code (what an unscripted attempt does).
    Run,
    /// Fails with a retryable error, without running the code.
    Retryable,
    /// Fails with a retryable error asking for the next attempt after the delay, without
    /// running the code.
    RetryAfter(Duration),
    /// Fails for good, without running the code.
    Permanent,
    /// Runs the code (its effect happens), then outlasts the step's timeout: the engine
    /// records the outcome as unknown, as when a reply is lost.
    Unknown,
    /// Outlasts the step's timeout without running the code: the outcome is unknown, and
    /// nothing happened.
    Hang,
    /// Runs the code after the delay of virtual time.
    Delayed(Duration),
}

/// The scripts of one test world, by step and phase, and how many calls of each have run;
/// and, for exploring interleavings, a seed that delays each call by a few virtual
/// milliseconds.
#[derive(Debug, Default)]
pub(crate) struct Script {
    state: Arc<Mutex<State>>,
    /// Every call is delayed by a pseudo-random 0–`JITTER_MS` ms drawn from the seed and the
    /// call (not from the order of calls), so that a seed fixes the order in which parallel
    /// branches' results arrive.
    seed: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    attempts: HashMap<(String, Phase), Vec<Attempt>>,
    /// Calls that have begun, by step and phase, across the world's lifetimes.
    calls: HashMap<(String, Phase), usize>,
    /// Every call that began, in order: its saga and `step:phase`.
    journal: Vec<(Uuid, String)>,
}

/// The largest delay a seed gives a call.
const JITTER_MS: u64 = 50;

impl Script {
    pub(crate) fn seeded(seed: Option<u64>) -> Self {
        Self {
            state: Arc::default(),
            seed,
        }
    }

    /// Scripts the calls of `step`'s `phase`, from the next: call `n` (counted across crashes,
    /// from the first call the world made) does `attempts[n - 1]`, and every call after the
    /// list runs the code.
    pub(crate) fn set(&self, step: &str, phase: Phase, attempts: Vec<Attempt>) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attempts
            .insert((step.to_owned(), phase), attempts);
    }

    /// The calls of saga `saga` that began, in order, as `step:phase`.
    pub(crate) fn calls_of(&self, saga: Uuid) -> Vec<String> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .journal
            .iter()
            .filter(|(s, _)| *s == saga)
            .map(|(_, call)| call.clone())
            .collect()
    }

    fn jitter(&self, site: &CallSite<'_>) -> Duration {
        let Some(seed) = self.seed else {
            return Duration::ZERO;
        };
        // FNV-1a: the same on every platform and toolchain, so a seed reproduces anywhere.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let phase = [u8::from(site.phase == Phase::Action)];
        for bytes in [
            &seed.to_le_bytes()[..],
            site.step.as_bytes(),
            &phase,
            &site.attempt.to_le_bytes(),
        ] {
            for b in bytes {
                h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Duration::from_millis(h % (JITTER_MS + 1))
    }
}

/// What the next call of `step`'s `phase` does, counted as begun.
fn next_call(state: &Mutex<State>, saga: Uuid, step: &(String, Phase)) -> Attempt {
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    let phase = match step.1 {
        Phase::Action => "action",
        Phase::Compensation => "compensation",
    };
    state.journal.push((saga, format!("{}:{phase}", step.0)));
    let n = state.calls.entry(step.clone()).or_default();
    *n += 1;
    let n = *n;
    state
        .attempts
        .get(step)
        .and_then(|list| list.get(n - 1))
        .cloned()
        .unwrap_or(Attempt::Run)
}

impl CallHook for Script {
    fn wrap(&self, site: &CallSite<'_>, run: CallFuture) -> CallFuture {
        let jitter = self.jitter(site);
        let state = self.state.clone();
        let step = (site.step.to_owned(), site.phase);
        let saga = site.saga;
        Box::pin(async move {
            tokio::time::sleep(jitter).await;
            // Counted once the call begins: a call the engine wrote ahead but a crash stopped
            // before it ran is not one.
            match next_call(&state, saga, &step) {
                Attempt::Run => real_io(run).await,
                Attempt::Delayed(delay) => {
                    tokio::time::sleep(delay).await;
                    real_io(run).await
                }
                Attempt::Retryable => Err(StepError::retryable("scripted: a retryable failure")),
                Attempt::RetryAfter(delay) => Err(StepError::retry_after(
                    delay,
                    "scripted: a retryable failure with a delay",
                )),
                Attempt::Permanent => Err(StepError::permanent("scripted: a permanent failure")),
                // Waits for ever rather than just past the timeout: after a clock jump past
                // both, the engine's timeout polls the call first and would take its answer.
                Attempt::Unknown => {
                    let _ = real_io(run).await;
                    std::future::pending().await
                }
                Attempt::Hang => std::future::pending().await,
            }
        })
    }
}
