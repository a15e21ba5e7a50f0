//! The `book_trip` saga: book a flight, a hotel and a car (each cancellable), then charge and
//! confirm the trip — the pivot, after which there is no going back — and finally send the
//! itinerary, retried until it goes through.
//!
//! It shows the two step kinds `place_order` lacks, and data flow between steps: the pivot charges
//! the sum of the prices the three bookings returned.

use std::sync::Arc;

use saga_dsl::{
    Action, Compensation, DefinitionError, JsonSchema, SagaDefinition, Step, StepContext,
    StepError, Value,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::place_order::ATTEMPT_TIMEOUT;
use crate::place_order::{action_policy, compensatable, compensation_policy, short_id};
use crate::shop::{Effect, Shop};
use crate::simulate::{act, compensate, Call, Simulate};

/// The saga's name.
pub const NAME: &str = "book_trip";
/// The definition's version.
pub const VERSION: u32 = 1;

/// The input of `book_trip`: `{"trip_id": str, "traveller": str, "simulate": {…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct TripInput {
    /// The trip; the trip ledger groups effects by it.
    pub trip_id: String,
    /// Who travels (and receives the itinerary).
    pub traveller: String,
    /// Injected trouble, as for `place_order`; step names are this saga's.
    #[serde(default)]
    pub simulate: Simulate,
}

/// The output of `book_flight`, `book_hotel` and `rent_car`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Booking {
    /// The supplier's booking reference.
    pub booking_ref: String,
    /// The price, in the smallest currency unit.
    pub price: i64,
}

/// The output of `charge_and_confirm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TripCharge {
    /// The payment provider's charge id.
    pub charge_id: String,
    /// The total charged: the sum of the three bookings' prices.
    pub amount: i64,
}

/// The output of `send_itinerary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Itinerary {
    /// Who it was sent to.
    pub sent_to: String,
}

/// The bookable parts of a trip: step, compensation, effects, prefix, price, refusal message.
struct Part {
    step: &'static str,
    compensation: &'static str,
    booked: Effect,
    cancelled: Effect,
    prefix: &'static str,
    price: i64,
    refusal: &'static str,
}

static PARTS: [Part; 3] = [
    Part {
        step: "book_flight",
        compensation: "cancel_flight",
        booked: Effect::FlightBooked,
        cancelled: Effect::FlightCancelled,
        prefix: "FL",
        price: 32_000,
        refusal: "flight sold out",
    },
    Part {
        step: "book_hotel",
        compensation: "cancel_hotel",
        booked: Effect::HotelBooked,
        cancelled: Effect::HotelCancelled,
        prefix: "HT",
        price: 18_000,
        refusal: "no rooms available",
    },
    Part {
        step: "rent_car",
        compensation: "return_car",
        booked: Effect::CarRented,
        cancelled: Effect::CarReturned,
        prefix: "CR",
        price: 9_000,
        refusal: "no cars available",
    },
];

/// The `book_trip` definition, its participants working against `shop`.
pub fn book_trip(shop: Arc<Shop>) -> Result<SagaDefinition, DefinitionError> {
    let mut builder = SagaDefinition::builder(NAME, VERSION)
        .input::<TripInput>()
        .state(shop);
    for part in &PARTS {
        builder = builder.step(compensatable(part.step, book(part), cancel(part)));
    }
    builder
        .step(
            Step::pivot("charge_and_confirm", charge_and_confirm)
                .retry(action_policy())
                .timeout(ATTEMPT_TIMEOUT),
        )
        .step(
            // Retried without end: after the pivot the only way is forward.
            Step::retriable("send_itinerary", send_itinerary)
                .retry(compensation_policy())
                .timeout(ATTEMPT_TIMEOUT),
        )
        .build()
}

fn book(part: &'static Part) -> impl Action {
    move |ctx: StepContext| async move {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<TripInput>()?);
        let output = Booking {
            booking_ref: short_id(part.prefix, &ctx),
            price: part.price,
        };
        let call = Call {
            owner: &input.trip_id,
            effect: part.booked.into(),
            amount: part.price,
            refusal: part.refusal,
            output: json!(output),
        };
        act(shop, &ctx, &input.simulate, call).await
    }
}

fn cancel(part: &'static Part) -> impl Compensation {
    move |ctx: StepContext| async move {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<TripInput>()?);
        compensate(
            shop,
            &ctx,
            &input.simulate,
            part.compensation,
            &input.trip_id,
            part.booked.into(),
            part.cancelled.into(),
        )
        .await
    }
}

async fn charge_and_confirm(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<TripInput>()?);
    let mut amount = 0;
    for part in &PARTS {
        amount += ctx.output_of::<Booking>(part.step)?.price;
    }
    let output = TripCharge {
        charge_id: short_id("ch", &ctx),
        amount,
    };
    let call = Call {
        owner: &input.trip_id,
        effect: Effect::TripCharged.into(),
        amount,
        refusal: "card declined",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

async fn send_itinerary(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<TripInput>()?);
    let output = Itinerary {
        sent_to: input.traveller.clone(),
    };
    let call = Call {
        owner: &input.trip_id,
        effect: Effect::ItinerarySent.into(),
        amount: 0,
        refusal: "mailbox does not exist",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

#[cfg(test)]
// A failed unwrap is a failed test, with the error in the panic message.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use saga_dsl::{Phase, StepKind, Value};
    use uuid::Uuid;

    use crate::shop::TripLedgerEntry;

    #[tokio::test]
    async fn trip_runs_forward_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let shop = Arc::new(Shop::open(&url).await.unwrap());
        let def = book_trip(shop.clone()).unwrap();
        let kinds: Vec<_> = def.steps().iter().map(|s| s.kind()).collect();
        use StepKind::*;
        assert_eq!(
            kinds,
            [
                Compensatable,
                Compensatable,
                Compensatable,
                Pivot,
                Retriable
            ]
        );
        assert_eq!(def.point_of_no_return(), Some(3));
        assert!(def
            .check_input(&json!({"trip_id": "t1", "traveller": "Ada"}))
            .is_ok());
        assert!(def.check_input(&json!({"trip_id": "t1"})).is_err());

        let saga = Uuid::new_v4();
        let input = Arc::new(json!({"trip_id": "t1", "traveller": "Ada",
                                    "simulate": {"transient_failures": {"send_itinerary": 1}}}));
        let mut outputs: BTreeMap<String, Value> = BTreeMap::new();
        for (index, step) in def.steps().iter().enumerate() {
            let mut attempt = 1;
            let out = loop {
                let ctx = StepContext::new(
                    saga,
                    index,
                    step.name(),
                    Phase::Action,
                    attempt,
                    input.clone(),
                    Arc::new(outputs.clone()),
                )
                .with_state(def.state().cloned());
                match step
                    .call()
                    .expect("book_trip's steps all call")
                    .action()
                    .run(ctx)
                    .await
                {
                    Ok(out) => break out,
                    Err(e) if e.is_retryable() => attempt += 1,
                    Err(e) => panic!("{e}"),
                }
            };
            outputs.insert(step.name().to_owned(), out);
        }
        let charge: TripCharge =
            serde_json::from_value(outputs["charge_and_confirm"].clone()).unwrap();
        assert_eq!(charge.amount, 32_000 + 18_000 + 9_000);
        assert_eq!(
            shop.trip_ledger_for("t1").await.unwrap(),
            TripLedgerEntry {
                flight_booked: 1,
                hotel_booked: 1,
                car_rented: 1,
                trip_charged: 1,
                itinerary_sent: 1,
                ..TripLedgerEntry::default()
            }
        );
        // Trip effects stay out of the place_order ledger.
        assert!(shop.ledger().await.unwrap().is_empty());

        // Cancelling the flight (as compensation would) twice cancels once.
        for attempt in 1..=2 {
            let ctx = StepContext::new(
                saga,
                0,
                "book_flight",
                Phase::Compensation,
                attempt,
                input.clone(),
                Arc::new(outputs.clone()),
            )
            .with_state(def.state().cloned());
            def.steps()[0]
                .call()
                .and_then(|c| c.compensation())
                .unwrap()
                .run(ctx)
                .await
                .unwrap();
        }
        assert_eq!(
            shop.trip_ledger_for("t1").await.unwrap().flight_cancelled,
            1
        );
    }
}
