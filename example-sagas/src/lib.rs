//! # example-sagas: runnable examples for the saga orchestrator
//!
//! Four realistic sagas, written with [`saga_dsl`]:
//!
//! - [`place_order`](place_order::place_order) (SPEC §6): reserve stock, charge the payment,
//!   assign a rider — three compensatable steps, undone in reverse order when a later one fails;
//! - [`book_trip`](book_trip::book_trip): book a flight, a hotel and a car, then charge and confirm
//!   the trip (the pivot) and send the itinerary (retriable until it succeeds);
//! - [`fulfil_order`](fulfil_order::fulfil_order) (SPEC §7): reserve every item at once (a
//!   mapped parallel group), charge, wait for a person's approval when the order needs one (a
//!   signal), wait out a cooling-off period (a durable sleep), ship (the pivot) and notify;
//! - [`payout`](payout::payout) (SPEC §14): debit a merchant's balance, send the transfer (the
//!   pivot, rate-limited by the limiter `bank`) and tell the merchant — one payout per merchant
//!   at a time, at most 50 at once, the example of flow control.
//!
//! Their inputs accept a `"simulate"` object ([`place_order::Simulate`]) that injects permanent
//! failures, K transient failures, failing compensations and delays, for demos and tests.
//!
//! The [`bank`] module holds a fake bank: a separate HTTP service with its own database,
//! which answers `202 Accepted` to a transfer and reports its outcome later by calling back the
//! orchestrator's task URL (SPEC §16); `example-sagas bank --listen ADDR` runs it alone.
//!
//! ## Why the participants dedupe by key
//!
//! The orchestrator guarantees *at-least-once* calls: after a crash between "about to run" and
//! "done" it cannot know whether the call took effect, so it makes the same call again with the
//! same idempotency key. *Exactly-once effects* are then the participant's job: each one, in
//! [`shop::Shop`], records the keys it has processed in the same transaction as its effect, in its
//! own store (never the orchestrator's), so a repeated call changes nothing and answers as the
//! first did. Its ledger ([`shop::Shop::ledger`]) is the bank statement against which "charged
//! exactly once" and "every compensated order nets to zero" are checked.

use std::sync::Arc;

use saga_dsl::{DefinitionError, Registry};

pub mod bank;
pub mod bench;
#[cfg(feature = "nats")]
pub mod bench_broker;
pub mod bench_flow;
pub mod bench_participants;
#[cfg(feature = "nats")]
pub mod bench_triggers;
pub mod book_trip;
pub mod fulfil_order;
#[cfg(feature = "nats")]
pub mod notify;
pub mod payout;
pub mod place_order;
pub mod shop;
mod simulate;

use shop::Shop;

/// Every example saga, its participants working against `shop`, `payout`'s bank included
/// (for the test kit and the benchmarks, which have no HTTP API for a bank to call back).
pub fn registry(shop: Arc<Shop>) -> Result<Registry, DefinitionError> {
    registry_with_bank(shop, payout::BankLink::InShop)
}

/// Every example saga, its participants working against `shop`, `payout`'s `send_transfer`
/// reaching the bank through `bank` (what `serve` runs: the bank over HTTP).
pub fn registry_with_bank(
    shop: Arc<Shop>,
    bank: payout::BankLink,
) -> Result<Registry, DefinitionError> {
    let mut registry = Registry::new();
    registry.register(place_order::place_order(shop.clone())?)?;
    registry.register(book_trip::book_trip(shop.clone())?)?;
    registry.register(fulfil_order::fulfil_order(shop.clone())?)?;
    registry.register(payout::payout_via(shop, bank)?)?;
    Ok(registry)
}
