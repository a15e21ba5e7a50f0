//! Bulk actions (SPEC §13) through real `example-sagas serve` processes over HTTP, on the
//! backend `SAGA_TEST_BACKEND` selects: a job acts on exactly the sagas its filter matched when
//! it was made, lists those that refused the command with the command's error, survives
//! `kill -9` of its server acting on each saga exactly once, and is shared by several servers
//! on PostgreSQL without any saga being acted on twice (that test always runs on PostgreSQL).
//!
//! Needs the workspace's binaries: `cargo build --workspace --bins` first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(60);

fn order(id: &str) -> Value {
    json!({"order_id": id, "user": "ada", "amount": 1200, "simulate": {}})
}

/// Starts a `place_order` due in an hour: it stays `QUEUED`, so every command applies to it.
async fn start_later(server: &Server, id: &str) -> Uuid {
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sagas/place_order", server.base))
        .header("Saga-Start-At", at.to_rfc3339())
        .json(&order(id))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED, "{:?}", r.text().await);
    let body: Value = r.json().await.unwrap();
    body["id"].as_str().unwrap().parse().unwrap()
}

async fn post_bulk(server: &Server, body: &Value) -> (StatusCode, Option<String>, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/bulk", server.base))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let location = r
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned());
    (status, location, r.json().await.unwrap())
}

async fn get(server: &Server, path: &str) -> (StatusCode, Value) {
    let r = reqwest::get(format!("{}{path}", server.base))
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

async fn job(server: &Server, id: &str) -> Value {
    let (status, job) = get(server, &format!("/v1/bulk/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    job
}

async fn wait_done(server: &Server, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let job = job(server, id).await;
        if job["status"] == "DONE" {
            return job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "bulk job not done: {job:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many events of saga `saga` carry `bulk_id` `job`, and their types.
async fn events_of_job(server: &Server, saga: Uuid, job: &str) -> Vec<String> {
    let (status, body) = get(server, &format!("/v1/sagas/{saga}/events")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"]["bulk_id"] == job)
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_bulk_cancel_acts_on_the_matched_sagas_and_lists_those_that_refused() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    // Ten finished orders (not cancellable any more), forty waiting ones.
    let mut finished = Vec::new();
    for i in 0..10 {
        finished.push(server.start("place_order", order(&format!("f{i}"))).await);
    }
    for id in &finished {
        server
            .wait_for(*id, LONG, |s| s["status"] == "COMPLETED")
            .await;
    }
    let mut waiting = HashSet::new();
    for i in 0..40 {
        waiting.insert(start_later(&server, &format!("w{i}")).await);
    }

    // A dry run of the waiting ones: counted, nothing recorded.
    let (status, _, dry) = post_bulk(
        &server,
        &json!({"action": "cancel", "filter": {"status": "queued", "name": "place_order"},
                "reason": "provider outage", "dry_run": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["id"], Value::Null);
    assert_eq!(dry["matched"], 40);
    let sample: Vec<Uuid> = dry["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(sample.len(), 20);
    assert!(sample.windows(2).all(|w| w[0] < w[1]), "{sample:?}");
    assert!(sample.iter().all(|s| waiting.contains(s)));
    let (_, jobs) = get(&server, "/v1/bulk").await;
    assert_eq!(jobs["jobs"], json!([]), "a dry run records no job");

    // The real thing, over the name (all fifty).
    let (status, location, created) = post_bulk(
        &server,
        &json!({"action": "cancel", "filter": {"name": "place_order"}, "reason": "provider outage"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!(created["matched"], 50);
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(location.as_deref(), Some(format!("/v1/bulk/{id}").as_str()));
    // A saga started after the job is not part of it.
    let later = start_later(&server, "late").await;

    let done = wait_done(&server, &id).await;
    assert_eq!(done["action"], "cancel");
    assert_eq!(done["matched"], 50);
    assert_eq!(done["done"], 50);
    assert_eq!(done["reason"], "provider outage");
    let refused = done["refused"].as_array().unwrap();
    let refused_ids: HashSet<Uuid> = refused
        .iter()
        .map(|r| r["saga_id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        refused_ids,
        finished.iter().copied().collect::<HashSet<_>>()
    );
    for r in refused {
        assert_eq!(r["code"], "conflict", "{r}");
        assert!(r["message"].as_str().unwrap().contains("COMPLETED"), "{r}");
    }
    for saga in &waiting {
        assert_eq!(
            events_of_job(&server, *saga, &id).await,
            ["saga.cancel_requested"],
            "saga {saga}"
        );
        server
            .wait_for(*saga, LONG, |s| s["status"] == "COMPENSATED")
            .await;
    }
    for saga in &finished {
        assert!(events_of_job(&server, *saga, &id).await.is_empty());
    }
    let (_, late) = get(&server, &format!("/v1/sagas/{later}")).await;
    assert_eq!(late["status"], "QUEUED", "{late}");
    assert!(events_of_job(&server, later, &id).await.is_empty());

    let (_, jobs) = get(&server, "/v1/bulk").await;
    assert_eq!(jobs["jobs"][0]["id"], id.as_str());
    server.kill9();
}

#[tokio::test]
async fn a_bulk_action_over_picked_ids_acts_on_those_sagas_only() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let mut sagas = Vec::new();
    for i in 0..5 {
        sagas.push(start_later(&server, &format!("p{i}")).await);
    }
    // Picked one by one, one of them twice (as a selection kept across pages may): counted once.
    let picked = json!([sagas[0], sagas[2], sagas[4], sagas[2]]);
    let (status, _, created) = post_bulk(
        &server,
        &json!({"action": "abort", "filter": {"ids": picked}, "reason": "picked on the list"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!(created["matched"], 3);
    let id = created["id"].as_str().unwrap().to_owned();
    let done = wait_done(&server, &id).await;
    assert_eq!(done["done"], 3);
    assert_eq!(done["refused"], json!([]));
    for (i, saga) in sagas.iter().enumerate() {
        let (_, s) = get(&server, &format!("/v1/sagas/{saga}")).await;
        let expected = if i % 2 == 0 { "ABORTED" } else { "QUEUED" };
        assert_eq!(s["status"], expected, "saga {i}: {s}");
    }

    // More than a selection may name: refused, nothing recorded.
    let many: Vec<Uuid> = (0..1001).map(|_| Uuid::now_v7()).collect();
    let (status, _, refused) = post_bulk(
        &server,
        &json!({"action": "abort", "filter": {"ids": many}, "reason": "too many"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_filter", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 1000"),
        "{refused}"
    );
    let (_, jobs) = get(&server, "/v1/bulk").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 1);
    server.kill9();
}

/// Starts a bulk `action` over `sagas` and waits for it to finish; its id.
async fn bulk_over(server: &Server, action: &str, sagas: &[Uuid]) -> String {
    let (status, _, created) = post_bulk(
        server,
        &json!({"action": action, "filter": {"ids": sagas}, "reason": format!("bulk {action}")}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!(created["matched"], sagas.len());
    let id = created["id"].as_str().unwrap().to_owned();
    let done = wait_done(server, &id).await;
    assert_eq!(done["refused"], json!([]), "{done}");
    id
}

#[tokio::test]
async fn bulk_pause_resume_and_fork_act_on_each_saga_once() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let mut sagas = Vec::new();
    for i in 0..4 {
        let id = server
            .start(
                "fulfil_order",
                json!({"order_id": format!("bp{i}"), "user": "ada", "amount": 10,
                       "items": [{"sku": "sku-1", "qty": 1}], "cooling_off_ms": 600_000}),
            )
            .await;
        sagas.push(id);
    }
    for id in &sagas {
        server
            .wait_for(*id, LONG, |s| s["waiting_for"] == "sleep")
            .await;
    }

    let paused = bulk_over(&server, "pause", &sagas).await;
    for id in &sagas {
        let (_, s) = get(&server, &format!("/v1/sagas/{id}")).await;
        assert_eq!(s["status"], "PAUSED", "{s}");
        assert_eq!(events_of_job(&server, *id, &paused).await, ["saga.paused"]);
    }
    let resumed = bulk_over(&server, "resume", &sagas).await;
    for id in &sagas {
        server
            .wait_for(*id, LONG, |s| s["waiting_for"] == "sleep")
            .await;
        assert_eq!(
            events_of_job(&server, *id, &resumed).await,
            ["saga.resumed"]
        );
    }
    let forked = bulk_over(&server, "fork", &sagas).await;
    for id in &sagas {
        // Forked afresh: the original goes on as it was, and a new saga names it.
        assert_eq!(events_of_job(&server, *id, &forked).await, ["saga.forked"]);
        let (_, s) = get(&server, &format!("/v1/sagas/{id}")).await;
        assert_eq!(s["status"], "RUNNING", "{s}");
    }
    let (_, list) = get(&server, "/v1/sagas?name=fulfil_order&limit=100").await;
    assert_eq!(
        list["sagas"].as_array().unwrap().len(),
        8,
        "one fork per saga"
    );
    server.kill9();
}

#[tokio::test]
async fn a_filter_that_matches_nothing_makes_a_job_done_at_once() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    start_later(&server, "x").await;
    let (status, _, created) = post_bulk(
        &server,
        &json!({"action": "abort", "filter": {"name": "no_such_saga"}, "reason": "tidy up"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!(created["matched"], 0);
    let job = job(&server, created["id"].as_str().unwrap()).await;
    assert_eq!(job["status"], "DONE", "{job}");
    assert_eq!(job["done"], 0);
    server.kill9();
}

#[tokio::test]
async fn bad_bulk_requests_are_refused_with_clear_messages_and_record_nothing() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let cases = [
        (
            json!({"action": "cancel", "filter": {"status": "SLEEPING"}, "reason": "r"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_filter",
            "unknown status",
        ),
        (
            json!({"action": "cancel", "filter": {"created_after": "yesterday"}, "reason": "r"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_filter",
            "RFC 3339",
        ),
        (
            json!({"action": "cancel", "filter": {"attr": {"User": "ada"}}, "reason": "r"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_filter",
            "is not a search attribute's name",
        ),
        (
            json!({"action": "abort", "filter": {}, "reason": "r"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_filter",
            "the filter is empty",
        ),
        (
            json!({"action": "abort", "reason": "r"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_filter",
            "the filter is empty",
        ),
        (
            json!({"action": "explode", "filter": {"name": "place_order"}, "reason": "r"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_action",
            "valid actions are cancel, pause, resume, retry, abort, fork",
        ),
        (
            json!({"action": "abort", "filter": {"name": "place_order"}, "reason": "  "}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "reason",
        ),
        (
            json!({"action": "abort", "filter": {"name": "place_order"}}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "reason",
        ),
        (
            json!({"action": "abort", "filter": {"nmae": "place_order"}, "reason": "r"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "nmae",
        ),
    ];
    for (body, status, code, words) in cases {
        let (got, _, answer) = post_bulk(&server, &body).await;
        assert_eq!(got, status, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], code, "{body} -> {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{body} -> {message}");
    }
    let (_, jobs) = get(&server, "/v1/bulk").await;
    assert_eq!(jobs["jobs"], json!([]));
    let (status, answer) = get(&server, "/v1/bulk/not-a-job").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, answer) = get(&server, &format!("/v1/bulk/{}", Uuid::now_v7())).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    server.kill9();
}

/// Polls the job until it is part done, so that a kill lands in the middle of it.
async fn wait_part_done(server: &Server, id: &str, matched: u64) {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let job = job(server, id).await;
        let done = job["done"].as_u64().unwrap();
        if done >= 1 {
            assert!(
                done < matched,
                "the job ended before it could be interrupted: {job}"
            );
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn assert_each_aborted_once(server: &Server, sagas: &[Uuid], job_id: &str) {
    for saga in sagas {
        assert_eq!(
            events_of_job(server, *saga, job_id).await,
            ["saga.aborted"],
            "saga {saga}"
        );
        let (_, body) = get(server, &format!("/v1/sagas/{saga}")).await;
        assert_eq!(body["status"], "ABORTED", "{body}");
    }
}

#[tokio::test]
async fn a_bulk_job_killed_mid_way_finishes_after_a_restart_acting_on_each_saga_once() {
    let db = TempDb::new();
    let dir = db.dir.path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let mut sagas = Vec::new();
    for i in 0..300 {
        sagas.push(start_later(&server, &format!("k{i}")).await);
    }
    let (status, _, created) = post_bulk(
        &server,
        &json!({"action": "abort", "filter": {"status": "QUEUED", "name": "place_order"},
                "reason": "orders withdrawn"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    assert_eq!(created["matched"], 300);
    let id = created["id"].as_str().unwrap().to_owned();
    wait_part_done(&server, &id, 300).await;
    server.kill9();

    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let done = wait_done(&server, &id).await;
    assert_eq!(done["matched"], 300);
    assert_eq!(done["done"], 300);
    assert_eq!(done["refused"], json!([]), "{done:#}");
    assert_each_aborted_once(&server, &sagas, &id).await;
    server.kill9();
}

#[tokio::test]
async fn two_servers_sharing_a_job_act_on_each_saga_once() {
    // Several processes share a database only on PostgreSQL (SQLite's engine lock admits one),
    // so this test runs on PostgreSQL whatever the backend selected.
    let db = TempDb::postgres();
    let dir = db.dir.path();
    let a = Server::spawn(&db.url, dir, &[], &[]).await;
    let b = Server::spawn(&db.url, dir, &[], &[]).await;
    let mut sagas = Vec::new();
    for i in 0..300 {
        sagas.push(start_later(&a, &format!("s{i}")).await);
    }
    // B paused: A claims the job.
    b.signal("STOP");
    let (status, _, created) = post_bulk(
        &a,
        &json!({"action": "abort", "filter": {"name": "place_order"}, "reason": "two workers"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    wait_part_done(&a, &id, 300).await;
    // A stops in the middle of its batch; B takes the job over once A's lease expires, then A
    // wakes and goes on with the commands of its stale claim.
    a.signal("STOP");
    b.signal("CONT");
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.signal("CONT");
    let done = wait_done(&b, &id).await;
    assert_eq!(done["matched"], 300);
    assert_eq!(done["done"], 300, "{done:#}");
    // A saga A aborted while B's claim found it pending is settled already: B's refusal of it
    // (already aborted) records nothing.
    assert_eq!(done["refused"], json!([]), "{done:#}");
    assert_each_aborted_once(&b, &sagas, &id).await;
    a.kill9();
    b.kill9();
}

#[tokio::test]
async fn the_cli_runs_a_bulk_job_through_the_server_and_follows_it_to_the_end() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let mut sagas = Vec::new();
    for i in 0..3 {
        sagas.push(start_later(&server, &format!("c{i}")).await);
    }
    let base = server.base.clone();
    let args = [
        "bulk",
        "abort",
        "--name",
        "place_order",
        "--status",
        "QUEUED",
        "--reason",
        "withdrawn",
        "--server",
        &base,
    ];
    // A dry run counts and changes nothing.
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let out = saga_suite::run_bin("example-sagas", &dry, db.dir.path()).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains('3'),
        "{out:?}"
    );
    let (_, s) = get(&server, &format!("/v1/sagas/{}", sagas[0])).await;
    assert_eq!(s["status"], "QUEUED");

    let mut wait = args.to_vec();
    wait.push("--wait");
    let out = saga_suite::run_bin("example-sagas", &wait, db.dir.path()).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("DONE"),
        "{out:?}"
    );
    for id in &sagas {
        let (_, s) = get(&server, &format!("/v1/sagas/{id}")).await;
        assert_eq!(s["status"], "ABORTED", "{s}");
    }
    // Without any filter the command refuses before asking the server.
    let out = saga_suite::run_bin(
        "example-sagas",
        &["bulk", "abort", "--reason", "all", "--server", &base],
        db.dir.path(),
    )
    .await;
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("filter"),
        "{out:?}"
    );
    server.kill9();
}
