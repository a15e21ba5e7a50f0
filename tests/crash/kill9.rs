//! SIGKILL from outside, at a moment seen over the API: during an action (the first one, whose
//! running state came with the start's own commit, and a later one), a compensation, a backoff
//! wait, and many sagas at once.

use std::time::Duration;

use saga_suite::{Server, TempDb};
use serde_json::json;

use crate::{
    assert_completed_once, assert_net_zero, ledger, order, restart_and_finish, step, LONG,
};

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
