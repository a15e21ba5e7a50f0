//! Crash recovery with real processes: `example-sagas serve` on a temporary SQLite file is
//! killed with SIGKILL (or aborts itself at an armed crash point) in each window that matters,
//! restarted, and must bring every saga to the right terminal status with every effect in the
//! participants' ledger exactly once (net zero for compensated orders).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use example_sagas::shop::{LedgerEntry, Shop};
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

fn step<'a>(saga: &'a Value, name: &str) -> &'a Value {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

async fn ledger(dir: &std::path::Path, order: &str) -> LedgerEntry {
    let shop = Shop::open(&format!("sqlite://{}", dir.join("shop.db").display()))
        .await
        .unwrap();
    let entry = shop.ledger_for(order).await.unwrap();
    shop.close().await;
    entry
}

fn order(id: &str, simulate: Value) -> Value {
    json!({"order_id": id, "user": "ada", "amount": 1200, "simulate": simulate})
}

async fn restart_and_finish(db: &TempDb, id: uuid::Uuid, want: &str) -> Value {
    let dir = db.dir.path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let saga = server
        .wait_for(id, LONG, |s| {
            s["status"] != "RUNNING" && s["status"] != "COMPENSATING" && s["status"] != "QUEUED"
        })
        .await;
    assert_eq!(saga["status"], want, "{saga:#}");
    server.kill9();
    saga
}

fn assert_completed_once(l: &LedgerEntry) {
    assert_eq!(
        (l.reserved, l.charged, l.rider_assigned),
        (1, 1, 1),
        "{l:?}"
    );
    assert_eq!(
        (l.released, l.refunded, l.rider_unassigned),
        (0, 0, 0),
        "{l:?}"
    );
}

fn assert_net_zero(l: &LedgerEntry) {
    assert_eq!(l.reserved, 1, "{l:?}");
    assert_eq!(l.released, 1, "{l:?}");
    assert_eq!(l.charged, 1, "{l:?}");
    assert_eq!(l.refunded, 1, "{l:?}");
    assert_eq!((l.rider_assigned, l.rider_unassigned), (0, 0), "{l:?}");
}

/// Starts a `place_order` saga whose every call takes 1.5 s, kills the server with `kill -9`
/// while `step`'s action runs, restarts it and checks that the saga completed, that action's
/// interrupted attempt counted, and every effect happened once.
async fn kill_during_the_action_of(step_name: &str, order_id: &str) {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let id = server
        .start("place_order", order(order_id, json!({"delay_ms": 1500})))
        .await;
    server
        .wait_for(id, LONG, |s| step(s, step_name)["status"] == "RUNNING")
        .await;
    server.kill9();
    let saga = restart_and_finish(&db, id, "COMPLETED").await;
    assert_eq!(
        step(&saga, step_name)["attempts"],
        2,
        "the interrupted attempt counts"
    );
    assert_completed_once(&ledger(dir, order_id).await);
}

#[tokio::test]
async fn killed_during_an_action() {
    kill_during_the_action_of("charge_payment", "o-action").await;
}

#[tokio::test]
async fn killed_during_the_first_action_whose_write_ahead_came_with_the_start() {
    // The server has a free worker, so the start's own commit recorded the first action as
    // running: killed during that call, the restarted engine finds the attempt interrupted and
    // makes the same call again with the same key.
    kill_during_the_action_of("reserve_stock", "o-first").await;
}

#[tokio::test]
async fn crash_between_an_action_returning_and_its_result_being_logged() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(
        &db.url,
        dir,
        &[("SAGA_CRASH_AT", "after_action:charge_payment")],
        &[],
    )
    .await;
    let id = server
        .start("place_order", order("o-after", json!({})))
        .await;
    let status = server.wait_exit(LONG);
    assert!(!status.success(), "the crash point aborts the process");
    // The card was charged, the log does not know it yet.
    let before = ledger(dir, "o-after").await;
    assert_eq!(before.charged, 1);
    let saga = restart_and_finish(&db, id, "COMPLETED").await;
    assert_eq!(step(&saga, "charge_payment")["attempts"], 2);
    // The second call carried the same key: the participant deduplicated it.
    assert_completed_once(&ledger(dir, "o-after").await);
}

#[tokio::test]
async fn killed_during_a_compensation() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let id = server
        .start(
            "place_order",
            order(
                "o-comp",
                json!({"fail_step": "assign_rider", "delay_ms": 1200}),
            ),
        )
        .await;
    server
        .wait_for(id, LONG, |s| {
            step(s, "charge_payment")["compensation"]["status"] == "RUNNING"
        })
        .await;
    server.kill9();
    let saga = restart_and_finish(&db, id, "COMPENSATED").await;
    assert_eq!(saga["error"], "assign_rider: no rider within 5 km");
    assert_net_zero(&ledger(dir, "o-comp").await);
}

#[tokio::test]
async fn crash_after_a_compensation_ran_but_before_it_was_logged() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(
        &db.url,
        dir,
        &[("SAGA_CRASH_AT", "after_compensation:charge_payment")],
        &[],
    )
    .await;
    let id = server
        .start(
            "place_order",
            order("o-comp2", json!({"fail_step": "assign_rider"})),
        )
        .await;
    assert!(!server.wait_exit(LONG).success());
    assert_eq!(ledger(dir, "o-comp2").await.refunded, 1);
    let saga = restart_and_finish(&db, id, "COMPENSATED").await;
    assert_eq!(step(&saga, "charge_payment")["compensation"]["attempts"], 2);
    assert_net_zero(&ledger(dir, "o-comp2").await);
}

#[tokio::test]
async fn killed_during_a_backoff_wait() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let id = server
        .start(
            "place_order",
            order(
                "o-backoff",
                json!({"transient_failures": {"charge_payment": 4}}),
            ),
        )
        .await;
    let waiting = server
        .wait_for(id, LONG, |s| {
            let c = step(s, "charge_payment");
            c["status"] == "RETRYING" && c["attempts"].as_u64() >= Some(2)
        })
        .await;
    assert!(
        waiting["next_run_at"].is_string(),
        "the retry time is in the log"
    );
    server.kill9();
    let saga = restart_and_finish(&db, id, "COMPLETED").await;
    // Four transient failures then success: the crash neither reset nor skipped the count
    // (backoffs of 50, 100, 200 and 400 ms: the crash hits one of them, held or released).
    assert_eq!(step(&saga, "charge_payment")["attempts"], 5);
    assert_completed_once(&ledger(dir, "o-backoff").await);
}

#[tokio::test]
async fn many_sagas_killed_mid_run_all_finish_with_effects_once() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let mut ids = Vec::new();
    for i in 0..30 {
        let simulate = match i % 3 {
            0 => json!({"delay_ms": 300}),
            1 => json!({"delay_ms": 300, "fail_step": "assign_rider"}),
            _ => {
                json!({"delay_ms": 200, "transient_failures": {"reserve_stock": 1}, "compensation_failures": {"charge_payment": 1}, "fail_step": "assign_rider"})
            }
        };
        ids.push((
            i,
            server
                .start("place_order", order(&format!("m{i}"), simulate))
                .await,
        ));
    }
    tokio::time::sleep(Duration::from_millis(450)).await;
    server.kill9();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill9();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    for (i, id) in &ids {
        let saga = server
            .wait_for(*id, LONG, |s| {
                s["status"] == "COMPLETED" || s["status"] == "COMPENSATED"
            })
            .await;
        let l = ledger(dir, &format!("m{i}")).await;
        if i % 3 == 0 {
            assert_eq!(saga["status"], "COMPLETED");
            assert_completed_once(&l);
        } else {
            assert_eq!(saga["status"], "COMPENSATED");
            assert_net_zero(&l);
        }
    }
}
