//! A saga of your own: reserve a seat, then charge for it; a declined card releases the seat.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use saga_dsl::{DefinitionError, JsonSchema, SagaDefinition, Step, StepContext, StepError};
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
struct Booking {
    seat: String,
    amount: u64,
}

/// The seat and payment services the steps call: here they print each call and keep what
/// was done, once per idempotency key, as real ones dedupe on the key they are handed.
#[derive(Debug, Default)]
pub struct Services {
    done: Mutex<BTreeMap<String, String>>,
}

impl Services {
    /// Does `what` unless a call with the same key did (a retry, or a call after a crash).
    fn once(&self, key: impl std::fmt::Display, what: String) {
        println!("{what} (key {key})");
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        done.entry(key.to_string()).or_insert(what);
    }

    /// What was done, one entry per key, sorted: `["charge 120", "reserve 12A"]`, or
    /// `["release hold-12B", "reserve 12B"]` when the card was declined.
    pub fn done(&self) -> Vec<String> {
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let mut done: Vec<String> = done.values().cloned().collect();
        done.sort();
        done
    }
}

async fn reserve_seat(ctx: StepContext) -> Result<String, StepError> {
    // The input is deserialised once per run of the saga and shared by its steps.
    let booking = ctx.input::<Booking>()?;
    // Hand the key to the seat service: it is the same on every retry and after a crash.
    let services = ctx.state::<Services>()?;
    services.once(ctx.idempotency_key(), format!("reserve {}", booking.seat));
    Ok(format!("hold-{}", booking.seat))
}

async fn release_seat(ctx: StepContext) -> Result<(), StepError> {
    let hold: Option<String> = ctx.action_output()?; // None if the reserve's outcome is unknown
    let what = match hold {
        Some(hold) => format!("release {hold}"),
        // The seat service finds the hold, if it made one, by the reserve's key.
        None => format!("release the hold of key {}", ctx.action_key()),
    };
    ctx.state::<Services>()?.once(ctx.idempotency_key(), what);
    Ok(())
}

async fn charge_card(ctx: StepContext) -> Result<(), StepError> {
    let booking = ctx.input::<Booking>()?;
    if booking.amount > 500 {
        return Err(StepError::permanent("card declined"));
    }
    let services = ctx.state::<Services>()?;
    services.once(ctx.idempotency_key(), format!("charge {}", booking.amount));
    Ok(())
}

/// The `book_seat` saga, its steps calling `services`.
pub fn book_seat(services: Arc<Services>) -> Result<SagaDefinition, DefinitionError> {
    SagaDefinition::builder("book_seat", 1)
        .input::<Booking>()
        .state(services)
        .step(Step::compensatable(
            "reserve_seat",
            reserve_seat,
            release_seat,
        ))
        .step(Step::pivot("charge_card", charge_card))
        .build()
}
