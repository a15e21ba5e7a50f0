//! A saga of your own: reserve a seat, then charge for it; a declined card releases the seat.
use orchestrator::Orchestrator;
use saga_dsl::{JsonSchema, Registry, SagaDefinition, Step, StepContext, StepError};
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
struct Booking {
    seat: String,
    amount: u64,
}

async fn reserve_seat(ctx: StepContext) -> Result<String, StepError> {
    // The input is deserialised once per run of the saga and shared by its steps.
    let booking = ctx.input::<Booking>()?;
    // Hand the key to the seat service: it is the same on every retry and after a crash.
    println!("reserve {} (key {})", booking.seat, ctx.idempotency_key());
    Ok(format!("hold-{}", booking.seat))
}

async fn release_seat(ctx: StepContext) -> Result<(), StepError> {
    let hold: Option<String> = ctx.action_output()?; // None if the reserve's outcome is unknown
    println!("release {hold:?} (key {})", ctx.idempotency_key());
    Ok(())
}

async fn charge_card(ctx: StepContext) -> Result<(), StepError> {
    let booking = ctx.input::<Booking>()?;
    if booking.amount > 500 {
        return Err(StepError::permanent("card declined"));
    }
    println!("charge {} (key {})", booking.amount, ctx.idempotency_key());
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let book_seat = SagaDefinition::builder("book_seat", 1)
        .input::<Booking>()
        .step(Step::compensatable(
            "reserve_seat",
            reserve_seat,
            release_seat,
        ))
        .step(Step::pivot("charge_card", charge_card))
        .build()?;
    // SQLite `saga.db` in the working directory, HTTP on 127.0.0.1:8080, until Ctrl-C;
    // `--help` lists the flags (`--listen 9000`, `--database-url`, `--workers`, …).
    Orchestrator::builder(Registry::new().with(book_seat)?)
        .run_from_args()
        .await?;
    Ok(())
}
