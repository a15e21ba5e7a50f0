//! SIGKILL of a server whose saga waits (`saga-suite-stages`): for a sleep the wake time in the
//! log holds, whether the server is back before it or after it; a signal is never lost; a
//! parent killed around its child's start, or while its child runs, ends with exactly one child.

use std::time::{Duration, Instant};

use saga_suite::{Server, TempDb};
use serde_json::json;

use crate::{step, LONG};

/// Starts a `nap` of `nap` and kills the server once the saga sleeps; returns the wake time
/// the log recorded (RFC 3339, which sorts as time does).
async fn asleep_then_killed(db: &TempDb, nap: Duration) -> (uuid::Uuid, String) {
    let server = Server::spawn_stages(&db.url).await;
    let id = server
        .start("nap", json!({"nap_ms": nap.as_millis() as u64}))
        .await;
    let saga = server
        .wait_for(id, LONG, |s| step(s, "nap")["status"] == "WAITING")
        .await;
    assert_eq!(saga["status"], "RUNNING");
    assert_eq!(
        saga["lease_owner"],
        serde_json::Value::Null,
        "no worker waits"
    );
    let wake = step(&saga, "nap")["wake_at"].as_str().unwrap().to_owned();
    server.kill9();
    (id, wake)
}

/// The sleep ended at its wake time, not before and not restarted, and `b` ran after it.
fn assert_woke_at(saga: &serde_json::Value, wake: &str) {
    assert_eq!(saga["status"], "COMPLETED", "{saga:#}");
    let nap = step(saga, "nap");
    assert_eq!(
        nap["wake_at"], wake,
        "the wake time is the one first recorded"
    );
    assert!(nap["ended_at"].as_str().unwrap() >= wake, "{nap:#}");
    assert!(step(saga, "b")["started_at"].as_str().unwrap() >= wake);
    assert_eq!(step(saga, "a")["attempts"], 1);
}

#[tokio::test]
async fn killed_during_a_sleep_and_back_before_its_end_it_wakes_on_time() {
    let db = TempDb::new();
    let (id, wake) = asleep_then_killed(&db, Duration::from_secs(4)).await;
    let server = Server::spawn_stages(&db.url).await;
    let early = server.saga(id).await;
    assert_eq!(
        step(&early, "nap")["status"],
        "WAITING",
        "not restarted, not ended early"
    );
    let saga = server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_woke_at(&saga, &wake);
    server.kill9();
}

#[tokio::test]
async fn killed_during_a_sleep_that_ends_while_it_is_down_it_wakes_on_restart() {
    let db = TempDb::new();
    let nap = Duration::from_millis(1500);
    let (id, wake) = asleep_then_killed(&db, nap).await;
    tokio::time::sleep(nap + Duration::from_millis(500)).await;
    let back = Instant::now();
    let server = Server::spawn_stages(&db.url).await;
    let saga = server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    // Due since its wake time: the first claim takes it (the lease of the killed process is
    // given up at once on SQLite, after its 2-second time to live on PostgreSQL).
    assert!(
        back.elapsed() < Duration::from_secs(6),
        "{:?}",
        back.elapsed()
    );
    assert_woke_at(&saga, &wake);
    server.kill9();
}

/// POSTs the signal `approval` to saga `id` at `base`; returns the status code.
async fn approve(base: &str, id: uuid::Uuid, by: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("{base}/v1/sagas/{id}/signals/approval"))
        .json(&json!({"approved": true, "by": by}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn killed_while_waiting_for_a_signal_the_signal_sent_after_the_restart_is_taken() {
    let db = TempDb::new();
    let server = Server::spawn_stages(&db.url).await;
    let id = server.start("approval", json!({})).await;
    server
        .wait_for(id, LONG, |s| {
            step(s, "await_approval")["status"] == "WAITING"
        })
        .await;
    server.kill9();
    // While no server runs, nothing can take the signal; once one is back, it is kept and
    // taken, whichever process receives it.
    let server = Server::spawn_stages(&db.url).await;
    assert_eq!(approve(&server.base, id, "after-restart").await, 202);
    let saga = server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_eq!(
        step(&saga, "await_approval")["output"]["by"],
        "after-restart"
    );
    assert_eq!(step(&saga, "a")["attempts"], 1);
    server.kill9();
}

#[tokio::test]
async fn a_signal_received_just_before_a_kill_is_taken_after_the_restart() {
    // Sent the moment the saga starts (it may not have reached its wait yet), then the server
    // is killed: the restarted one finds the signal kept and goes on with it.
    let db = TempDb::new();
    let server = Server::spawn_stages(&db.url).await;
    let id = server.start("approval", json!({})).await;
    assert_eq!(approve(&server.base, id, "early").await, 202);
    server.kill9();
    let server = Server::spawn_stages(&db.url).await;
    let saga = server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_eq!(step(&saga, "await_approval")["output"]["by"], "early");
    server.kill9();
}

/// The stage `name` of the saga's per-stage view.
fn stage<'a>(saga: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    saga["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

/// The `errand` sagas in the log: the children every `delegate` started.
async fn errands(server: &Server) -> Vec<serde_json::Value> {
    let page: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/sagas?name=errand", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["sagas"].as_array().unwrap().clone()
}

/// The parent completed with its one child's output, and the child points back at it.
async fn assert_one_child(server: &Server, parent: &serde_json::Value) {
    assert_eq!(parent["status"], "COMPLETED", "{parent:#}");
    let child_id = stage(parent, "errand")["child_id"].as_str().unwrap();
    let children = errands(server).await;
    assert_eq!(children.len(), 1, "never two children: {children:#?}");
    assert_eq!(children[0]["id"], child_id);
    let child = server.saga(child_id.parse().unwrap()).await;
    assert_eq!(child["status"], "COMPLETED", "{child:#}");
    assert_eq!(child["parent_id"], parent["id"]);
    assert_eq!(step(&child, "a")["attempts"], 1, "{child:#}");
    assert_eq!(step(parent, "a")["attempts"], 1, "{parent:#}");
}

/// A server restarted on `db` brings the parent `id` to its end with exactly one child.
async fn restart_and_find_one_child(db: &TempDb, id: uuid::Uuid) {
    let server = Server::spawn_stages(&db.url).await;
    let saga = server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_one_child(&server, &saga).await;
    server.kill9();
}

/// A crash point in a child stage aborts the first server; a second one brings the parent to
/// its end with exactly one child.
async fn crash_in_a_child_stage(point: &str) {
    let db = TempDb::new();
    let armed = format!("{point}:errand");
    let server = Server::spawn_stages_with(&db.url, &[("SAGA_CRASH_AT", armed.as_str())]).await;
    let id = server.start("delegate", json!({"nap_ms": 200})).await;
    assert!(
        !server.wait_exit(LONG).success(),
        "the crash point aborts the process"
    );
    restart_and_find_one_child(&db, id).await;
}

#[tokio::test]
async fn killed_after_a_child_stage_is_logged_and_before_its_child_exists() {
    crash_in_a_child_stage("before_child").await;
}

#[tokio::test]
async fn killed_after_the_child_is_created_and_before_its_parent_waits() {
    crash_in_a_child_stage("after_child").await;
}

#[tokio::test]
async fn killed_while_the_child_runs_the_parent_gets_its_one_child_after_the_restart() {
    let db = TempDb::new();
    let server = Server::spawn_stages(&db.url).await;
    let id = server.start("delegate", json!({"nap_ms": 1500})).await;
    let saga = server
        .wait_for(id, LONG, |s| step(s, "errand")["status"] == "WAITING")
        .await;
    let child: uuid::Uuid = stage(&saga, "errand")["child_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    server
        .wait_for(child, LONG, |s| {
            s["steps"].as_array().is_some_and(|steps| {
                steps
                    .iter()
                    .any(|st| st["name"] == "nap" && st["status"] == "WAITING")
            })
        })
        .await;
    server.kill9();
    restart_and_find_one_child(&db, id).await;
}
