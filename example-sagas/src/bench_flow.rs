//! The flow-control workloads of the benchmark (SPEC §14): sagas under a max-running and a
//! per-key limit, and sagas whose one call takes a rate limiter's token, with the figures
//! only they have (how long sagas waited to start; the rate the participant saw).

use std::sync::{Arc, Mutex};

use orchestrator::store::Store;
use saga_dsl::{Rate, SagaDefinition, Step, StepContext, StepError};
use serde_json::json;
use uuid::Uuid;

/// How many keys the limited workload spreads its sagas over.
pub const KEYS: usize = 16;
/// The limited workload's max running.
pub const MAX_RUNNING: u32 = 64;
/// The limited workload's per-key limit: with [`KEYS`] keys, twice the max running in all, so
/// both limits bind at times.
pub const PER_KEY: u32 = 8;

/// The limited workload's saga: three no-op steps, at most [`MAX_RUNNING`] running and
/// [`PER_KEY`] per key.
pub fn bench_limited_saga() -> Result<SagaDefinition, saga_dsl::DefinitionError> {
    async fn noop(ctx: StepContext) -> Result<serde_json::Value, StepError> {
        Ok(json!({"step": ctx.step_name()}))
    }
    SagaDefinition::builder("bench_limited", 1)
        .max_running("bench_running", MAX_RUNNING)
        .per_key("bench_per_key", "key", PER_KEY)
        .step(Step::pivot("one", noop))
        .step(Step::retriable("two", noop))
        .step(Step::retriable("three", noop))
        .build()
}

/// The times (milliseconds, this process's clock) at which the rated saga's participant was
/// called.
pub type Calls = Arc<Mutex<Vec<i64>>>;

/// The rated workload's saga: one call that takes a token from `bench_bank` (`rate`, a burst
/// of 1), recording when it is called in `calls`.
pub fn bench_rated_saga(
    rate: Rate,
    calls: Calls,
) -> Result<SagaDefinition, saga_dsl::DefinitionError> {
    let call = move |_: StepContext| {
        let calls = calls.clone();
        async move {
            calls
                .lock()
                .map_err(|_| StepError::permanent("poisoned"))?
                .push(now_ms());
            Ok::<_, StepError>(())
        }
    };
    SagaDefinition::builder("bench_rated", 1)
        .rate_limiter("bench_bank", rate, 1)
        .step(Step::pivot("call_bank", call).rate_limited("bench_bank"))
        .build()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The 99th percentile of how long the sagas `ids` waited to start: from their creation to
/// their first attempt, read from the attempt log after the run.
pub async fn start_p99_ms(store: &Arc<dyn Store>, ids: &[Uuid]) -> anyhow::Result<f64> {
    let mut waits = Vec::with_capacity(ids.len());
    for &id in ids {
        let Some(saga) = store.get_saga(id).await? else {
            continue;
        };
        let attempts = store.attempts(id).await?;
        if let Some(first) = attempts.iter().map(|a| a.started_at).min() {
            waits.push((first - saga.created_at).max(0));
        }
    }
    waits.sort_unstable();
    let i = ((waits.len() as f64 * 0.99).ceil() as usize).clamp(1, waits.len().max(1)) - 1;
    Ok(waits.get(i).copied().unwrap_or(0) as f64)
}

/// The rate the participant saw over the measured run (calls after the first, per second of
/// the time from the first to the last) and the most calls in any one-second window.
pub fn observed_rate(calls: &Calls) -> (f64, u64) {
    let mut times = calls.lock().map(|c| c.clone()).unwrap_or_default();
    times.sort_unstable();
    let (Some(first), Some(last)) = (times.first(), times.last()) else {
        return (0.0, 0);
    };
    let span = (last - first) as f64 / 1000.0;
    let rate = if span > 0.0 {
        (times.len() - 1) as f64 / span
    } else {
        0.0
    };
    let most = times
        .iter()
        .enumerate()
        .map(|(i, &t)| times[i..].iter().take_while(|&&u| u < t + 1000).count())
        .max()
        .unwrap_or(0);
    (rate, most as u64)
}
