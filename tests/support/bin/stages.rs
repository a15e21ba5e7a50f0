//! `saga-suite-stages`: a server, like an application's, for the sagas the crash tests of stages
//! that call nothing need (`tests/crash/stages.rs`). Database from `DATABASE_URL`, HTTP on a free
//! loopback port (printed as `listening on http://ADDR`), leases of 2 seconds so that a restart
//! after `kill -9` takes over quickly on PostgreSQL.
//!
//! `nap`: input `{"nap_ms": int}`; `a` (compensatable, no-op), `nap` (a durable sleep of
//! `nap_ms`), `b` (pivot, no-op).
//! `approval`: `a` (compensatable, no-op), `await_approval` (waits for the signal `approval`),
//! `b` (pivot, no-op).
//! `delegate`: input `{"nap_ms": int}`; `a` (compensatable, no-op), `errand` (the child saga
//! `errand` with the same input), `b` (pivot, no-op).
//! `errand`: input `{"nap_ms": int}`; `a` (compensatable, no-op), `nap` (a durable sleep of
//! `nap_ms`), and no pivot, as a child before its parent's point of no return must be.

use std::time::Duration;

use orchestrator::{EngineConfig, Orchestrator};
use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};

#[derive(serde::Deserialize)]
struct Nap {
    nap_ms: u64,
}

async fn nothing(_: StepContext) -> Result<(), StepError> {
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let nap = SagaDefinition::builder("nap", 1)
        .step(Step::compensatable("a", nothing, nothing))
        .step(Step::sleep_for("nap", |ctx| {
            Ok(Duration::from_millis(ctx.input::<Nap>()?.nap_ms))
        }))
        .step(Step::pivot("b", nothing))
        .build()?;
    let errand = SagaDefinition::builder("errand", 1)
        .step(Step::compensatable("a", nothing, nothing))
        .step(Step::sleep_for("nap", |ctx| {
            Ok(Duration::from_millis(ctx.input::<Nap>()?.nap_ms))
        }))
        .build()?;
    let delegate = SagaDefinition::builder("delegate", 1)
        .step(Step::compensatable("a", nothing, nothing))
        .step(Step::child("errand", "errand", |ctx| {
            Ok(ctx.raw_input().clone())
        }))
        .step(Step::pivot("b", nothing))
        .build()?;
    let approval = SagaDefinition::builder("approval", 1)
        .step(Step::compensatable("a", nothing, nothing))
        .step(Step::signal("await_approval", "approval"))
        .step(Step::pivot("b", nothing))
        .build()?;
    Orchestrator::builder(
        Registry::new()
            .with(nap)?
            .with(approval)?
            .with(errand)?
            .with(delegate)?,
    )
    .listen("127.0.0.1:0")
    .engine_config(EngineConfig {
        lease_ttl: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        ..EngineConfig::default()
    })
    .serve()
    .await?;
    Ok(())
}
