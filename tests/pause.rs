//! Pausing (SPEC §13) through a real `example-sagas serve` over loopback HTTP, on the backend
//! `SAGA_TEST_BACKEND` selects: `fulfil_order`'s `charge_payment` pausing when its retries run
//! out and completing after a resume with each effect once; a pause of a sleeping saga (its
//! sleep does not fire until the resume), of one waiting for a signal (the signal is kept), of
//! one whose call is in flight (recorded, nothing further starts); a cancel of a paused saga;
//! a paused saga across a `kill -9` and a restart; and, on PostgreSQL, two servers neither of
//! which claims a paused saga.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use example_sagas::shop::Shop;
use saga_suite::{backend_is_postgres, Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(30);

fn order(id: &str, extra: Value) -> Value {
    let mut input = json!({
        "order_id": id, "user": "ada", "amount": 4200,
        "items": [{"sku": "sku-1", "qty": 1}, {"sku": "sku-2", "qty": 2}],
    });
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    input
}

async fn ledger(db: &TempDb, order: &str) -> BTreeMap<String, u64> {
    let shop = Shop::open(&format!(
        "sqlite://{}",
        db.dir.path().join("shop.db").display()
    ))
    .await
    .unwrap();
    let entry = shop.fulfilment_ledger_for(order).await.unwrap();
    shop.close().await;
    entry
}

fn step<'a>(saga: &'a Value, name: &str) -> &'a Value {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

/// POSTs an operator command (`pause`, `resume`, `cancel`, …) with a reason; its status and
/// body.
async fn command(server: &Server, id: Uuid, what: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/{what}", server.base))
        .json(&json!({"reason": format!("{what} for the test")}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn cancel(server: &Server, id: Uuid) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/cancel", server.base))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn status_is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |s| s["status"] == status
}

/// The event types of a saga, in order, read from the log.
async fn events(db: &TempDb, id: Uuid) -> Vec<(String, Value)> {
    let store = db.store().await;
    store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.data))
        .collect()
}

/// Asserts the saga stays `PAUSED`, unleased, for `time`, with `stage` as `status`.
async fn stays_paused(server: &Server, id: Uuid, time: Duration, stage: &str, status: &str) {
    let until = tokio::time::Instant::now() + time;
    while tokio::time::Instant::now() < until {
        let saga = server.saga(id).await;
        assert_eq!(saga["status"], "PAUSED", "{saga:#}");
        assert_eq!(
            saga["lease_owner"],
            Value::Null,
            "a paused saga holds no lease"
        );
        assert_eq!(saga["waiting_for"], "resume");
        assert_eq!(saga["wake_at"], Value::Null);
        assert_eq!(step(&saga, stage)["status"], status, "{saga:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_charge_whose_retries_run_out_pauses_then_completes_after_a_resume_charging_once() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let input = order(
        "p-exhaust",
        json!({"simulate": {"transient_failures": {"charge_payment": 7}}}),
    );
    let id = server.start("fulfil_order", input).await;
    let paused = server.wait_for(id, LONG, status_is("PAUSED")).await;
    assert_eq!(paused["needs_attention"], true);
    assert_eq!(paused["lease_owner"], Value::Null);
    assert_eq!(paused["waiting_for"], "resume");
    let error = paused["error"].as_str().unwrap();
    assert!(
        error.starts_with("charge_payment: its retries ran out after 5 attempts")
            && error.contains("simulated transient failure (attempt 5 of 7 failing)"),
        "{error}"
    );
    assert_eq!(step(&paused, "charge_payment")["attempts"], 5);
    // Nothing compensates: the reservations stand, nothing was charged or refunded.
    assert_eq!(
        step(&paused, "charge_payment")["compensation"]["status"],
        "NOT_NEEDED",
        "the charge never took effect"
    );
    assert_eq!(
        step(&paused, "reserve_items/sku-1")["compensation"]["status"],
        "PENDING",
        "a paused saga may still go back"
    );
    let booked = ledger(&db, "p-exhaust").await;
    assert_eq!(booked.get("reserved:sku-1"), Some(&1));
    assert_eq!(booked.get("released:sku-1"), None);
    assert_eq!(booked.get("charged"), None);
    let log = events(&db, id).await;
    let (_, data) = log.iter().find(|(k, _)| k == "saga.paused").unwrap();
    assert_eq!(data["actor"], "engine");
    assert_eq!(data["step"], "charge_payment");
    assert!(data["reason"].as_str().unwrap().contains("retries ran out"));
    assert!(data["last_error"]
        .as_str()
        .unwrap()
        .contains("attempt 5 of 7"));
    assert!(!log.iter().any(|(k, _)| k == "saga.compensating"));

    // `retry` is not how a paused saga goes on.
    let (code, body) = command(&server, id, "retry").await;
    assert_eq!(code, 409, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resume"));

    let (code, resumed) = command(&server, id, "resume").await;
    assert_eq!(code, 200, "{resumed}");
    assert_ne!(resumed["status"], "PAUSED");
    assert_eq!(resumed["needs_attention"], false);
    let done = server.wait_for(id, LONG, status_is("COMPLETED")).await;
    assert_eq!(
        step(&done, "charge_payment")["attempts"],
        8,
        "attempts 6 and 7 fail, the 8th succeeds"
    );
    let booked = ledger(&db, "p-exhaust").await;
    assert_eq!(booked.get("charged"), Some(&1));
    assert_eq!(booked.get("refunded"), None);
    assert_eq!(booked.get("shipped"), Some(&1));
    let log = events(&db, id).await;
    let (_, data) = log.iter().find(|(k, _)| k == "saga.resumed").unwrap();
    assert_eq!(data["step"], "charge_payment");
    assert_eq!(data["reason"], "resume for the test");
    // Resuming a completed saga is refused.
    assert_eq!(command(&server, id, "resume").await.0, 409);
    server.kill9();
}

#[tokio::test]
async fn a_sleep_that_passes_while_paused_fires_only_after_the_resume() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("p-sleep", json!({"cooling_off_ms": 1500})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| step(s, "cooling_off")["status"] == "WAITING")
        .await;
    let (code, paused) = command(&server, id, "pause").await;
    assert_eq!(code, 200, "{paused}");
    assert_eq!(
        paused["status"], "PAUSED",
        "parked without a lease: paused at once"
    );
    assert!(
        step(&paused, "cooling_off")["wake_at"].is_string(),
        "its own deadline is kept"
    );
    // A second pause is refused.
    assert_eq!(command(&server, id, "pause").await.0, 409);
    stays_paused(
        &server,
        id,
        Duration::from_millis(2500),
        "cooling_off",
        "WAITING",
    )
    .await;
    assert_eq!(ledger(&db, "p-sleep").await.get("shipped"), None);
    let (_, data) = events(&db, id)
        .await
        .into_iter()
        .find(|(k, _)| k == "saga.paused")
        .unwrap();
    assert_eq!(data["reason"], "pause for the test");
    assert_eq!(data["previous_status"], "RUNNING");
    assert!(data["actor"].is_string());

    assert_eq!(command(&server, id, "resume").await.0, 200);
    let done = server.wait_for(id, LONG, status_is("COMPLETED")).await;
    assert_eq!(step(&done, "cooling_off")["status"], "SUCCEEDED");
    assert_eq!(ledger(&db, "p-sleep").await.get("shipped"), Some(&1));
    server.kill9();
}

#[tokio::test]
async fn a_signal_sent_while_paused_is_kept_and_taken_after_the_resume() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("p-signal", json!({"needs_approval": true})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| {
            step(s, "await_approval")["status"] == "WAITING"
        })
        .await;
    assert_eq!(command(&server, id, "pause").await.0, 200);
    let sent = reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/signals/approval", server.base))
        .json(&json!({"approved": true, "by": "grace"}))
        .send()
        .await
        .unwrap()
        .status();
    assert!(sent.is_success(), "{sent}");
    stays_paused(
        &server,
        id,
        Duration::from_millis(1500),
        "await_approval",
        "WAITING",
    )
    .await;
    assert_eq!(command(&server, id, "resume").await.0, 200);
    let done = server.wait_for(id, LONG, status_is("COMPLETED")).await;
    assert_eq!(step(&done, "await_approval")["output"]["by"], "grace");
    assert_eq!(ledger(&db, "p-signal").await.get("shipped"), Some(&1));
    server.kill9();
}

#[tokio::test]
async fn a_pause_during_a_call_records_its_result_and_starts_nothing_more() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let input = order("p-flight", json!({"simulate": {"delay_ms": 2000}}));
    let id = server.start("fulfil_order", input).await;
    server
        .wait_for(id, LONG, |s| {
            step(s, "charge_payment")["status"] == "RUNNING"
        })
        .await;
    let (code, asked) = command(&server, id, "pause").await;
    assert_eq!(code, 200, "{asked}");
    assert_eq!(
        asked["status"], "RUNNING",
        "a worker drives it: not taken over"
    );
    assert_eq!(asked["pause_requested"], true);
    let paused = server.wait_for(id, LONG, status_is("PAUSED")).await;
    assert_eq!(step(&paused, "charge_payment")["status"], "SUCCEEDED");
    assert_eq!(paused["pause_requested"], false);
    assert_eq!(paused["needs_attention"], false);
    stays_paused(&server, id, Duration::from_millis(2500), "ship", "PENDING").await;
    let booked = ledger(&db, "p-flight").await;
    assert_eq!(booked.get("charged"), Some(&1));
    assert_eq!(booked.get("shipped"), None);
    let kinds: Vec<String> = events(&db, id).await.into_iter().map(|e| e.0).collect();
    let asked = kinds
        .iter()
        .position(|k| k == "saga.pause_requested")
        .unwrap();
    let charged = kinds.iter().rposition(|k| k == "step.succeeded").unwrap();
    let paused_at = kinds.iter().position(|k| k == "saga.paused").unwrap();
    assert!(asked < charged && charged < paused_at, "{kinds:?}");

    assert_eq!(command(&server, id, "resume").await.0, 200);
    server.wait_for(id, LONG, status_is("COMPLETED")).await;
    let booked = ledger(&db, "p-flight").await;
    assert_eq!(booked.get("charged"), Some(&1));
    assert_eq!(booked.get("shipped"), Some(&1));
    server.kill9();
}

#[tokio::test]
async fn a_cancel_of_a_paused_saga_before_its_pivot_compensates_it() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("p-cancel", json!({"cooling_off_ms": 3_600_000})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| step(s, "cooling_off")["status"] == "WAITING")
        .await;
    assert_eq!(command(&server, id, "pause").await.0, 200);
    assert_eq!(cancel(&server, id).await, 202);
    let saga = server.wait_for(id, LONG, status_is("COMPENSATED")).await;
    assert_eq!(saga["error"], "cancelled on request");
    let booked = ledger(&db, "p-cancel").await;
    assert_eq!(booked.get("refunded"), Some(&1));
    assert_eq!(booked.get("released:sku-2"), Some(&1));
    assert_eq!(booked.get("shipped"), None);
    server.kill9();
}

#[tokio::test]
async fn a_paused_saga_stays_paused_across_a_kill_and_a_restart() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("p-kill", json!({"cooling_off_ms": 1000})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| step(s, "cooling_off")["status"] == "WAITING")
        .await;
    assert_eq!(command(&server, id, "pause").await.0, 200);
    server.kill9();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    // Past the sleep and past a lease's time to live (2 s): nothing runs.
    stays_paused(
        &server,
        id,
        Duration::from_millis(3000),
        "cooling_off",
        "WAITING",
    )
    .await;
    assert_eq!(ledger(&db, "p-kill").await.get("shipped"), None);
    assert_eq!(command(&server, id, "resume").await.0, 200);
    server.wait_for(id, LONG, status_is("COMPLETED")).await;
    assert_eq!(ledger(&db, "p-kill").await.get("shipped"), Some(&1));
    server.kill9();
}

#[tokio::test]
async fn on_postgres_two_servers_leave_a_paused_saga_alone() {
    if !backend_is_postgres() {
        // Several processes share a log only on PostgreSQL; SQLite allows one engine per file.
        return;
    }
    let db = TempDb::new();
    let a = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let b = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = a
        .start(
            "fulfil_order",
            order("p-two", json!({"cooling_off_ms": 800})),
        )
        .await;
    a.wait_for(id, LONG, |s| step(s, "cooling_off")["status"] == "WAITING")
        .await;
    assert_eq!(command(&b, id, "pause").await.0, 200);
    stays_paused(
        &a,
        id,
        Duration::from_millis(3000),
        "cooling_off",
        "WAITING",
    )
    .await;
    assert_eq!(ledger(&db, "p-two").await.get("shipped"), None);
    assert_eq!(command(&a, id, "resume").await.0, 200);
    b.wait_for(id, LONG, status_is("COMPLETED")).await;
    assert_eq!(ledger(&db, "p-two").await.get("shipped"), Some(&1));
    a.kill9();
    b.kill9();
}

#[tokio::test]
async fn the_cli_pauses_through_a_server_and_resumes_on_the_database() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("p-cli", json!({"cooling_off_ms": 600_000})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| step(s, "cooling_off")["status"] == "WAITING")
        .await;
    let full = id.to_string();
    let base = server.base.clone();
    // Through the server, with a prefix the API resolves.
    let out = saga_suite::run_bin(
        "example-sagas",
        &[
            "pause",
            &full[..13],
            "--reason",
            "hold it",
            "--server",
            &base,
        ],
        db.dir.path(),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("PAUSED"),
        "{out:?}"
    );
    let paused = server.wait_for(id, LONG, status_is("PAUSED")).await;
    assert_eq!(paused["waiting_for"], "resume", "{paused}");
    // A pause of a paused saga is refused, with the reason and a failing exit.
    let again = saga_suite::run_bin(
        "example-sagas",
        &["pause", &full, "--reason", "again", "--server", &base],
        db.dir.path(),
    )
    .await;
    assert!(!again.status.success(), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already PAUSED"),
        "{again:?}"
    );
    // Straight on the database, as for a server that is down.
    let out = saga_suite::run_bin(
        "example-sagas",
        &[
            "--database-url",
            &db.url,
            "resume",
            &full,
            "--reason",
            "go on",
        ],
        db.dir.path(),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    server
        .wait_for(id, LONG, |s| {
            s["status"] == "RUNNING" && s["waiting_for"] == "sleep"
        })
        .await;
    let resumed: Vec<_> = events(&db, id)
        .await
        .into_iter()
        .filter(|(k, _)| k == "saga.resumed")
        .collect();
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].1["reason"], "go on");
    server.kill9();
}
