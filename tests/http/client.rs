//! The typed client (`orchestrator::client::SagaClient`): one `Idempotency-Key` per logical
//! start across its retries, giving up with the server's error or the network's cause, and
//! reads, waits and cancels against a real server; then `saga start` (and the application's own
//! `start`) as real processes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::client::{ClientError, SagaClient};
use orchestrator::model::{SagaStatus, StepStatus};
use saga_suite::{run_bin, Server, TempDb};
use serde_json::{json, Value};

use crate::{own, with_token, TOKEN};

/// A stub of the start endpoint that fails the first `failures` requests with `status` and
/// records every `Idempotency-Key` it is sent.
async fn stub_server(failures: usize, status: u16) -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    use axum::extract::{Path, State};
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;

    type Keys = Arc<Mutex<Vec<Option<String>>>>;
    let keys: Keys = Arc::default();
    async fn start(
        State((keys, failures, status)): State<(Keys, usize, u16)>,
        Path(name): Path<String>,
        headers: HeaderMap,
    ) -> axum::response::Response {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let n = {
            let mut keys = keys.lock().unwrap();
            keys.push(key);
            keys.len()
        };
        if n <= failures {
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            let body = json!({"error": {"code": "unavailable", "message": "try again"}});
            return (status, axum::Json(body)).into_response();
        }
        let body = json!({"id": uuid::Uuid::now_v7(), "name": name, "status": "QUEUED"});
        (axum::http::StatusCode::ACCEPTED, axum::Json(body)).into_response()
    }
    let app = axum::Router::new()
        .route("/v1/sagas/{name}", axum::routing::post(start))
        .with_state((keys.clone(), failures, status));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), keys)
}

fn fast(client: SagaClient) -> SagaClient {
    client.with_backoff(Duration::from_millis(10), Duration::from_millis(50))
}

#[tokio::test]
async fn the_client_reuses_one_key_across_retries() {
    let (base, keys) = stub_server(2, 503).await;
    let client = fast(SagaClient::new(&base, None).unwrap());
    let started = client.start("s", &json!({}), None).await.unwrap();
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 3, "two failures, then success: {keys:?}");
    let first = keys[0].clone().expect("an Idempotency-Key header");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(first.as_str())),
        "{keys:?}"
    );
    assert_eq!(started.idempotency_key, first);
    let parsed = uuid::Uuid::parse_str(&first).unwrap();
    assert_eq!(parsed.get_version_num(), 4);
    assert_eq!(started.status, SagaStatus::Queued);

    // A key given by the caller is the one sent; 409 (in progress) is retried too.
    let (base, keys) = stub_server(1, 409).await;
    let client = fast(SagaClient::new(&base, None).unwrap());
    let started = client
        .start("s", &json!({}), Some("order-42".to_owned()))
        .await
        .unwrap();
    assert_eq!(started.idempotency_key, "order-42");
    assert_eq!(
        keys.lock().unwrap().clone(),
        vec![Some("order-42".to_owned()), Some("order-42".to_owned())]
    );

    // Two logical starts get two keys.
    let (base, keys) = stub_server(0, 503).await;
    let client = SagaClient::new(&base, None).unwrap();
    let a = client.start("s", &json!({}), None).await.unwrap();
    let b = client.start("s", &json!({}), None).await.unwrap();
    assert_ne!(a.idempotency_key, b.idempotency_key);
    assert_eq!(keys.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn the_client_gives_up_with_the_servers_error_or_the_network_cause() {
    // Always failing: five attempts, then the server's error.
    let (base, keys) = stub_server(usize::MAX, 503).await;
    let client = fast(SagaClient::new(&base, None).unwrap());
    let err = client.start("s", &json!({}), None).await.unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
    assert_eq!(err.code(), Some("unavailable"));
    assert_eq!(keys.lock().unwrap().len(), 5);

    // A client error is not retried.
    let (base, keys) = stub_server(usize::MAX, 422).await;
    let client = fast(SagaClient::new(&base, None).unwrap());
    let err = client.start("s", &json!({}), None).await.unwrap_err();
    assert_eq!(err.status(), Some(422));
    assert_eq!(keys.lock().unwrap().len(), 1);

    // Nobody listening: a transport error after every attempt.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = fast(SagaClient::new(&format!("http://127.0.0.1:{port}"), None).unwrap())
        .with_max_attempts(3);
    match client.start("s", &json!({}), None).await {
        Err(ClientError::Transport { attempts, .. }) => assert_eq!(attempts, 3),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_client_starts_reads_waits_for_and_cancels_sagas() {
    // A server of its own: a token, and the test counts every saga of the database.
    let api = own(with_token()).await;
    let client = SagaClient::new(&api.base, Some(TOKEN.to_owned())).unwrap();
    let started = client.start("s", &json!({"x": 1}), None).await.unwrap();
    let saga = client
        .wait(started.id, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(saga.status, SagaStatus::Completed);
    assert_eq!(saga.input, json!({"x": 1}));
    assert!(saga
        .steps
        .iter()
        .all(|s| s.action.status == StepStatus::Succeeded));
    let again = client.get(started.id).await.unwrap();
    assert_eq!(again, saga, "the same saga, read back");

    let slow = client.start("slow", &json!({}), None).await.unwrap();
    let cancelled = client.cancel(slow.id).await.unwrap();
    assert_eq!(cancelled.cancel, "accepted");
    let end = client.wait(slow.id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(end.status, SagaStatus::Compensated);

    // Errors carry the server's code and message.
    let err = client.start("nope", &json!({}), None).await.unwrap_err();
    assert_eq!(err.status(), Some(404));
    assert_eq!(err.code(), Some("not_found"));
    let err = client.cancel(saga.id).await.unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    let anonymous = fast(SagaClient::new(&api.base, None).unwrap());
    let err = anonymous.get(saga.id).await.unwrap_err();
    assert_eq!(err.code(), Some("unauthorized"));
    assert_eq!(api.saga_count().await, 2);
}

#[tokio::test]
async fn the_client_completes_a_step_by_hand_and_forks_a_saga() {
    let api = own(with_token()).await;
    let client = SagaClient::new(&api.base, Some(TOKEN.to_owned())).unwrap();
    let waiting = client.start("approval", &json!({}), None).await.unwrap();
    api.wait(&waiting.id.to_string(), |s| {
        s["steps"][1]["status"] == "WAITING"
    })
    .await;
    let saga = client
        .complete_step(
            waiting.id,
            "await_approval",
            &json!({"approved": true, "by": "phone"}),
            "approved by phone",
        )
        .await
        .unwrap();
    assert_eq!(saga.steps[1].action.status, StepStatus::Succeeded);
    let done = client
        .wait(waiting.id, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(
        done.steps[1].output,
        Some(json!({"approved": true, "by": "phone"}))
    );

    // Afresh: the original is left as it is; from a stage of a completed saga: superseded.
    let fresh = client
        .fork(
            waiting.id,
            Some(&json!({"edited": true})),
            None,
            "once more",
        )
        .await
        .unwrap();
    assert_eq!(fresh.input, json!({"edited": true}));
    let from = fresh.forked_from.clone().unwrap();
    assert_eq!((from.saga_id, from.stage), (waiting.id, None));
    let taken = client
        .fork(waiting.id, None, Some("ship"), "ship it again")
        .await
        .unwrap();
    assert_eq!(taken.steps[1].output, done.steps[1].output);
    let old = client.get(waiting.id).await.unwrap();
    assert_eq!(old.status, SagaStatus::Aborted);
    assert_eq!(old.superseded_by, Some(taken.id));
    let err = client
        .fork(waiting.id, None, Some("ship"), "twice")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    let err = client
        .complete_step(taken.id, "nope", &json!(1), "x")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
}

#[tokio::test]
async fn saga_start_goes_through_the_http_api() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[("SAGA_API_TOKEN", TOKEN)], &[]).await;
    let cwd = tempfile::tempdir().unwrap();
    let input = r#"{"order_id": "o-cli", "user": "ada", "amount": 1200}"#;

    // Started and waited for, as JSON: the saga object.
    let out = run_bin(
        "saga",
        &[
            "start",
            "place_order",
            "--input",
            input,
            "--server",
            &server.base,
            "--token",
            TOKEN,
            "--wait",
            "30",
            "--json",
        ],
        cwd.path(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let saga: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(saga["status"], "COMPLETED", "{saga}");
    assert_eq!(saga["input"]["order_id"], "o-cli");

    // For people: the id and the status, then the key to retry with.
    let out = run_bin(
        "saga",
        &[
            "start",
            "place_order",
            "--input",
            input,
            "--server",
            &server.base,
            "--token",
            TOKEN,
            "--idempotency-key",
            "cli-key-1",
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
    // The engine runs (the start above completed), so a worker takes the saga at once.
    assert!(
        stdout.contains("started: RUNNING (place_order)"),
        "{stdout}"
    );
    assert!(stdout.contains("idempotency key cli-key-1"), "{stdout}");

    // The application binary has the same command.
    let out = run_bin(
        "example-sagas",
        &[
            "start",
            "place_order",
            "--input",
            input,
            "--server",
            &server.base,
            "--token",
            TOKEN,
            "--json",
        ],
        cwd.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(started["status"], "RUNNING");
    assert!(started["idempotency_key"].is_string());

    // Refusals are one line on stderr and exit 1.
    for (input, token, expect) in [
        (input, "wrong", "unauthorized"),
        ("{nope", TOKEN, "--input is not valid JSON"),
    ] {
        let all = [
            "start",
            "place_order",
            "--input",
            input,
            "--server",
            &server.base,
            "--token",
            token,
        ];
        let out = run_bin("saga", &all, cwd.path()).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expect), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    let out = run_bin(
        "saga",
        &[
            "start",
            "nope",
            "--input",
            "{}",
            "--server",
            &server.base,
            "--token",
            TOKEN,
        ],
        cwd.path(),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found"));

    // `start` opens no database: nothing was created in the working directory.
    assert!(
        std::fs::read_dir(cwd.path()).unwrap().next().is_none(),
        "saga start created files"
    );
    drop(server);
}

#[tokio::test]
async fn saga_start_reports_an_unreachable_server() {
    let cwd = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let server = format!("http://127.0.0.1:{port}");
    let out = run_bin(
        "saga",
        &["start", "s", "--input", "{}", "--server", &server],
        cwd.path(),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach"), "{stderr}");
    assert!(stderr.contains("5 attempt"), "{stderr}");
}
