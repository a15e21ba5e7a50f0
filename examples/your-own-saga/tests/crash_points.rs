//! `book_seat` against the test kit: every crash point explored, and scripted attempts.

use std::sync::Arc;

use orchestrator::SagaStatus;
use saga_dsl::Registry;
use saga_test::{explore, Attempt, SagaTest};
use serde_json::json;
use your_own_saga::{book_seat, Services};

/// The saga and the services it calls, which outlive the engine's crashes.
fn world() -> (Registry, Arc<Services>) {
    let services = Arc::new(Services::default());
    let saga = book_seat(services.clone()).expect("book_seat is valid");
    (Registry::new().with(saga).expect("one saga"), services)
}

#[test]
fn a_declined_card_releases_the_seat_once_whatever_the_crash() {
    let report = explore(world)
        .start("book_seat", json!({"seat": "12B", "amount": 900}))
        .check(|ended, services| {
            assert_eq!(ended.status(), SagaStatus::Compensated);
            // Reserved and released once each, the release handed the reserve's hold.
            assert_eq!(services.done(), ["release hold-12B", "reserve 12B"]);
        })
        .run();
    eprintln!("{report:?}");
}

#[test]
fn a_booking_charges_once_and_keeps_the_seat_whatever_the_crash() {
    let report = explore(world)
        .start("book_seat", json!({"seat": "12A", "amount": 120}))
        .check(|ended, services| {
            assert_eq!(ended.status(), SagaStatus::Completed);
            assert_eq!(services.done(), ["charge 120", "reserve 12A"]);
        })
        .run();
    eprintln!("{report:?}");
}

#[test]
fn a_lost_reply_from_the_card_service_charges_once() {
    let (registry, services) = world();
    let mut t = SagaTest::new(registry);
    // The first charge happens but its reply never comes: the engine calls again, same key.
    t.script("charge_card", [Attempt::Unknown]);
    let id = t.start("book_seat", json!({"seat": "12A", "amount": 120}));
    let ended = t.run(id);
    assert_eq!(ended.status(), SagaStatus::Completed);
    assert_eq!(
        ended.calls,
        [
            "reserve_seat:action",
            "charge_card:action",
            "charge_card:action"
        ]
    );
    assert_eq!(services.done(), ["charge 120", "reserve 12A"]);
}

#[test]
fn a_card_service_busy_then_declining_releases_the_seat() -> Result<(), Box<dyn std::error::Error>>
{
    let services = Arc::new(Services::default());
    let registry = Registry::new().with(book_seat(services.clone())?)?;
    let mut t = SagaTest::new(registry);
    t.script("charge_card", [Attempt::Retryable, Attempt::Permanent]);
    let id = t.start("book_seat", json!({"seat": "12A", "amount": 90}));
    let ended = t.run(id); // until COMPLETED, COMPENSATED, FAILED or ABORTED
    assert_eq!(ended.status(), SagaStatus::Compensated);
    assert_eq!(
        ended.calls,
        [
            "reserve_seat:action",
            "charge_card:action",
            "charge_card:action",
            "reserve_seat:compensation"
        ]
    );
    assert_eq!(services.done(), ["release hold-12A", "reserve 12A"]);
    Ok(())
}
