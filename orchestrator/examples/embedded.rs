//! The engine alone, embedded in an application on SQLite: no HTTP server, no command line.
//! Built with the smallest set of features,
//!
//! ```text
//! cargo run -p orchestrator --example embedded --no-default-features --features sqlite
//! ```
//!
//! it runs one saga to its end on a fresh database file and exits non-zero unless the saga
//! completed.

use std::sync::Arc;
use std::time::Duration;

use orchestrator::{store, Engine, EngineConfig, SagaStatus, StartRequest};
use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};
use tokio_util::sync::CancellationToken;

async fn reserve(ctx: StepContext) -> Result<String, StepError> {
    Ok(format!("hold-{}", ctx.idempotency_key()))
}

async fn release(_ctx: StepContext) -> Result<(), StepError> {
    Ok(())
}

async fn charge(_ctx: StepContext) -> Result<(), StepError> {
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("embedded-saga-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("saga.db").display());

    let definition = SagaDefinition::builder("book_seat", 1)
        .step(Step::compensatable("reserve", reserve, release))
        .step(Step::pivot("charge", charge))
        .build()?;
    let registry = Arc::new(Registry::new().with(definition)?);
    let engine = Engine::new(store::open(&url).await?, registry, EngineConfig::default());
    engine.register().await?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });

    let started = engine
        .start(StartRequest::new("book_seat", serde_json::json!({})))
        .await?;
    let status = engine
        .wait_terminal(started.saga_id(), Duration::from_secs(30))
        .await?;
    shutdown.cancel();
    running.await??;
    std::fs::remove_dir_all(&dir)?;

    println!("saga {} ended {status:?}", started.saga_id());
    if status == Some(SagaStatus::Completed) {
        Ok(())
    } else {
        Err(format!("the saga did not complete: {status:?}").into())
    }
}
