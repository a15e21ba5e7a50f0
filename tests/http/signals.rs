//! `POST /v1/sagas/{id}/signals/{signal}`: delivered to a waiting saga or kept for a later
//! wait, first of a name wins, Idempotency-Key replays, and every refusal; then `saga signal`.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::{assert_error, shared};
use saga_suite::api::Api;
use saga_suite::run_bin;

/// Starts an `approval` saga and waits until it waits for its signal.
async fn waiting(api: &Api) -> String {
    let id = api.start_saga("approval", json!({})).await;
    api.wait(&id, |s| s["steps"][1]["status"] == "WAITING")
        .await;
    id
}

async fn signal(
    api: &Api,
    id: &str,
    name: &str,
    payload: &str,
    key: Option<&str>,
) -> saga_suite::api::Answer {
    let mut req = api
        .req(Method::POST, &format!("/v1/sagas/{id}/signals/{name}"))
        .header("content-type", "application/json")
        .body(payload.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    Api::send(req).await
}

#[tokio::test]
async fn a_signal_resumes_the_waiting_saga_with_its_payload() {
    let api = shared();
    let id = waiting(&api).await;
    // Parked: due only on a signal or a cancel.
    let saga = api
        .wait(&id, |s| {
            s["next_run_at"] == Value::Null && s["lease_owner"] == Value::Null
        })
        .await;
    let wait = &saga["steps"][1];
    assert_eq!(wait["kind"], "signal");
    assert_eq!(wait["waiting_for"], "approval");

    let answer = signal(
        &api,
        &id,
        "approval",
        r#"{"approved": true, "by": "grace"}"#,
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.json());
    let body = answer.json();
    assert_eq!(
        (body["id"].as_str(), &body["signal"], &body["outcome"]),
        (Some(id.as_str()), &json!("approval"), &json!("received"))
    );
    let done = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(
        done["steps"][1]["output"],
        json!({"approved": true, "by": "grace"})
    );
    assert_eq!(done["output"]["await_approval"]["by"], "grace");

    // The same signal again changes nothing; another payload loses to the first.
    let again = signal(
        &api,
        &id,
        "approval",
        r#"{"by": "grace", "approved": true}"#,
        None,
    )
    .await;
    assert_eq!(again.status, StatusCode::ACCEPTED);
    assert_eq!(again.json()["outcome"], "already_received");
    assert!(!again.replayed(), "no key, no replay");
    let other = signal(&api, &id, "approval", r#"{"approved": false}"#, None).await;
    let message = assert_error(
        other.status,
        &other.json(),
        StatusCode::CONFLICT,
        "signal_already_received",
    );
    assert!(message.contains("first one wins"), "{message}");
    let (_, events) = api.get(&format!("/v1/sagas/{id}/events")).await;
    let received = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "signal.received")
        .count();
    assert_eq!(received, 1);
}

#[tokio::test]
async fn a_payload_its_step_refuses_compensates_the_saga() {
    let api = shared();
    let id = waiting(&api).await;
    let answer = signal(&api, &id, "approval", r#"{"approved": false}"#, None).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    let done = api.wait_status(&id, "COMPENSATED").await;
    assert_eq!(done["error"], "await_approval: not approved");
    assert_eq!(done["steps"][0]["compensation"]["status"], "SUCCEEDED");
}

#[tokio::test]
async fn an_idempotency_key_replays_and_may_not_change_the_payload() {
    let api = shared();
    let id = waiting(&api).await;
    let first = signal(
        &api,
        &id,
        "approval",
        r#"{"approved": true}"#,
        Some("sig-key-1"),
    )
    .await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert!(!first.replayed());
    let replay = signal(
        &api,
        &id,
        "approval",
        r#"{"approved": true}"#,
        Some("sig-key-1"),
    )
    .await;
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert!(
        replay.replayed(),
        "{:?}",
        replay.header("idempotent-replayed")
    );
    let reused = signal(
        &api,
        &id,
        "approval",
        r#"{"approved": "maybe"}"#,
        Some("sig-key-1"),
    )
    .await;
    assert_error(
        reused.status,
        &reused.json(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    );
    api.wait_status(&id, "COMPLETED").await;
}

#[tokio::test]
async fn bad_signals_are_refused_and_change_nothing() {
    let api = shared();
    let id = waiting(&api).await;
    let unknown = signal(&api, &id, "payment", "{}", None).await;
    let message = assert_error(
        unknown.status,
        &unknown.json(),
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert!(
        message.contains("waits for no signal \"payment\""),
        "{message}"
    );
    let no_saga = signal(
        &api,
        "0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60",
        "approval",
        "{}",
        None,
    )
    .await;
    assert_error(
        no_saga.status,
        &no_saga.json(),
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let bad_id = signal(&api, "nope", "approval", "{}", None).await;
    assert_error(
        bad_id.status,
        &bad_id.json(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    let not_json = signal(&api, &id, "approval", "{approved", None).await;
    assert_error(
        not_json.status,
        &not_json.json(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    let (_, saga) = api.get(&format!("/v1/sagas/{id}")).await;
    assert_eq!(
        saga["steps"][1]["status"], "WAITING",
        "still waiting: {saga}"
    );

    // A saga that ended takes no signal.
    let (status, _, _) = api
        .post(&format!("/v1/sagas/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    api.wait_status(&id, "COMPENSATED").await;
    let late = signal(&api, &id, "approval", "{}", None).await;
    let message = assert_error(late.status, &late.json(), StatusCode::CONFLICT, "conflict");
    assert!(message.contains("COMPENSATED"), "{message}");
}

#[tokio::test]
async fn saga_signal_sends_one_through_the_http_api() {
    let api = shared();
    let id = waiting(&api).await;
    let cwd = tempfile::tempdir().unwrap();
    let out = run_bin(
        "saga",
        &[
            "signal",
            &id,
            "approval",
            "--payload",
            r#"{"approved": true, "by": "cli"}"#,
            "--server",
            &api.base,
        ],
        cwd.path(),
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("signal approval delivered to saga"),
        "{stdout}"
    );
    let done = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(done["steps"][1]["output"]["by"], "cli");

    let out = run_bin(
        "saga",
        &[
            "signal",
            &id,
            "approval",
            "--payload",
            r#"{"approved": false}"#,
            "--server",
            &api.base,
        ],
        cwd.path(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("first one wins"), "{stderr}");
    // A prefix of the id (long enough to be unique among the shared server's sagas, made in
    // the same milliseconds) is resolved by the server: the same saga, which has its signal.
    let out = run_bin(
        "saga",
        &["signal", &id[..23], "approval", "--server", &api.base],
        cwd.path(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("first one wins"), "{stderr}");
    assert!(
        std::fs::read_dir(cwd.path()).unwrap().next().is_none(),
        "saga signal created files"
    );
}
