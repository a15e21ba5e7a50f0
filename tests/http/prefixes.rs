//! A saga named by a prefix of its id on every route about one saga, resolved by the server:
//! the saga when one id starts with it, `400 ambiguous_id` naming the candidates when several
//! do, `404` when none does; then the CLI's commands through a server by prefix, and the
//! server found by the address it writes beside its database.

use orchestrator::http::HttpConfig;
use orchestrator::store::NewSaga;
use reqwest::StatusCode;
use saga_suite::api::Harness;
use saga_suite::{fixtures, registry_of, run_bin, Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::definitions;

/// The `approval` sagas the tests name by prefix: two that share their first 8 characters and
/// more, and one alone.
const TWINS: [&str; 2] = [
    "aaaaaaaa-0000-7000-8000-000000000001",
    "aaaaaaaa-0000-7000-8000-000000000002",
];
const ALONE: &str = "bbbbbbbb-1234-7000-8000-000000000003";

#[tokio::test]
async fn every_route_about_one_saga_takes_a_unique_prefix_of_its_id() {
    let harness = Harness::new(registry_of(definitions())).await;
    for id in TWINS.iter().chain([&ALONE]) {
        let mut new = NewSaga::of(&fixtures::approval(), json!({}));
        new.id = Uuid::parse_str(id).unwrap();
        harness.stores.log.create_saga(new).await.unwrap();
    }
    let api = harness.serve(HttpConfig::default()).await;
    // The engine takes them to their wait for the signal.
    for id in TWINS.iter().chain([&ALONE]) {
        api.wait(id, |s| s["steps"][1]["status"] == "WAITING").await;
    }

    // Reads: the saga object, its events and attempts, by 8 characters or more, any case.
    for prefix in ["bbbbbbbb", "BBBBBBBB-12", "bbbbbbbb-1234-7000"] {
        let (status, saga) = api.get(&format!("/v1/sagas/{prefix}")).await;
        assert_eq!(status, StatusCode::OK, "{prefix}: {saga}");
        assert_eq!(saga["id"], ALONE);
    }
    let (status, events) = api.get("/v1/sagas/bbbbbbbb/events").await;
    assert_eq!(status, StatusCode::OK, "{events}");
    assert_eq!(events["events"][0]["type"], "saga.started");
    let (status, attempts) = api.get("/v1/sagas/bbbbbbbb/attempts").await;
    assert_eq!(status, StatusCode::OK, "{attempts}");
    assert_eq!(attempts["attempts"][0]["step"], "reserve");
    let (status, deliveries) = api.get("/v1/sagas/bbbbbbbb/deliveries").await;
    assert_eq!(status, StatusCode::OK, "{deliveries}");

    // Ambiguous: 400 ambiguous_id, naming both, on reads and on commands; nothing changes.
    for (method, path, body) in [
        ("GET", "/v1/sagas/aaaaaaaa".to_owned(), None),
        ("GET", "/v1/sagas/aaaaaaaa-0000/events".to_owned(), None),
        (
            "POST",
            "/v1/sagas/aaaaaaaa/cancel".to_owned(),
            Some(json!({})),
        ),
        (
            "POST",
            "/v1/sagas/aaaaaaaa/signals/approval".to_owned(),
            Some(json!({"approved": true})),
        ),
        (
            "POST",
            "/v1/sagas/aaaaaaaa/abort".to_owned(),
            Some(json!({"reason": "by prefix"})),
        ),
        ("POST", "/v1/sagas/aaaaaaaa/retry".to_owned(), None),
        (
            "POST",
            "/v1/sagas/aaaaaaaa/steps/reserve/mark-compensated".to_owned(),
            Some(json!({"reason": "by prefix"})),
        ),
    ] {
        let (status, _, answer) = match body {
            Some(body) => api.post(&path, &body).await,
            None if method == "POST" => api.request(reqwest::Method::POST, &path, None).await,
            None => {
                let (status, answer) = api.get(&path).await;
                (status, Default::default(), answer)
            }
        };
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "ambiguous_id", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(TWINS[0]) && message.contains(TWINS[1]),
            "the candidates are named: {message}"
        );
        assert!(message.contains("give more of the id"), "{message}");
    }
    for id in TWINS {
        let (_, saga) = api.get(&format!("/v1/sagas/{id}")).await;
        assert_ne!(saga["status"], "ABORTED", "unchanged: {saga}");
        assert_eq!(saga["cancel_requested"], false, "unchanged: {saga}");
        assert_eq!(saga["steps"][1]["status"], "WAITING", "unchanged: {saga}");
    }
    // More of the id tells them apart.
    let (status, saga) = api
        .get("/v1/sagas/aaaaaaaa-0000-7000-8000-00000000000")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{saga}");
    let (status, saga) = api
        .get("/v1/sagas/aaaaaaaa-0000-7000-8000-000000000002")
        .await;
    assert_eq!(status, StatusCode::OK, "{saga}");
    assert_eq!(saga["id"], TWINS[1]);

    // Commands by prefix: the signal reaches the saga, whose whole id the answer names.
    let (status, _, answer) = api
        .post(
            "/v1/sagas/bbbbbbbb-1234/signals/approval",
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["id"], ALONE);
    let done = api.wait_status(ALONE, "COMPLETED").await;
    assert_eq!(done["steps"][1]["status"], "SUCCEEDED");
    let (status, _, answer) = api
        .post(
            "/v1/sagas/AAAAAAAA-0000-7000-8000-000000000001/cancel",
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["id"], TWINS[0]);

    // None, too short, not an id.
    let (status, answer) = api.get("/v1/sagas/dddddddd").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["error"]["code"], "not_found");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no saga has an id starting with"),
        "{answer}"
    );
    let (status, answer) = api.get("/v1/sagas/aaaaaaa").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "bad_request");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too short"),
        "{answer}"
    );
    // Only as the API writes ids: with their dashes, where they go.
    for text in ["bbbbbbbb1234", "bbbb-bbbb", "%20bbbbbbbb"] {
        let (status, answer) = api.get(&format!("/v1/sagas/{text}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}: {answer}");
    }
    let (status, answer) = api.get("/v1/sagas/not-a-saga-id").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "bad_request");
    harness.stop().await;
}

/// The words of a command's run, and whether it succeeded.
fn said(out: &std::process::Output) -> (bool, String, String) {
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_names_sagas_by_prefix_through_the_server_it_finds_beside_the_database() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let cwd = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let start = |order: &str| {
        let body = json!({
            "order_id": order, "user": "ada", "amount": 4200, "needs_approval": true,
            "items": [{"sku": "sku-1", "qty": 1}]
        });
        let (client, base) = (client.clone(), server.base.clone());
        async move {
            let answer: Value = client
                .post(format!("{base}/v1/sagas/fulfil_order"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            answer["id"].as_str().unwrap().to_owned()
        }
    };
    let first = start("f-prefix-1").await;
    let second = start("f-prefix-2").await;
    // Both wait for their approval.
    for id in [&first, &second] {
        let mut waiting = false;
        for _ in 0..400 {
            let saga: Value = client
                .get(format!("{}/v1/sagas/{id}", server.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if saga["waiting_for"].as_str() == Some("signal:approval") {
                waiting = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert!(waiting, "saga {id} never waited for its approval");
    }

    // `signal` by prefix, with no --server: on an SQLite database, the address the server
    // wrote beside it. A PostgreSQL log has no file beside it: there the server is named.
    let prefix = &first[..23];
    let sqlite = db.url.starts_with("sqlite:");
    let mut args = vec![
        "signal",
        prefix,
        "approval",
        "--payload",
        r#"{"approved": true, "by": "grace"}"#,
        "--database-url",
        &db.url,
    ];
    if !sqlite {
        args.extend(["--server", &server.base]);
    }
    let (ok, stdout, stderr) = said(&run_bin("saga", &args, cwd.path()).await);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!("signal approval delivered to saga {first}")),
        "the whole id: {stdout}"
    );

    // `cancel` by prefix through --server, as every operator command.
    let (ok, stdout, stderr) = said(
        &run_bin(
            "saga",
            &["cancel", &second[..23], "--server", &server.base],
            cwd.path(),
        )
        .await,
    );
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains(&format!("cancel requested for saga {second}")),
        "{stdout}"
    );
    // A prefix both share (their first 8 characters, made in the same minute, or fewer when
    // not): the server's error names the candidates, and nothing changes.
    let shared: String = first
        .chars()
        .zip(second.chars())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    if shared.len() >= 8 {
        let (ok, _, stderr) = said(
            &run_bin(
                "saga",
                &[
                    "abort",
                    &shared,
                    "--reason",
                    "by prefix",
                    "--server",
                    &server.base,
                ],
                cwd.path(),
            )
            .await,
        );
        assert!(!ok);
        assert!(stderr.contains("ambiguous"), "{stderr}");
        assert!(
            stderr.contains(&first) && stderr.contains(&second),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }

    // A server that was killed leaves its address behind: the command says where it found it.
    let address = orchestrator::discovery::address_file(&db.url);
    drop(server);
    if let Some(file) = address {
        assert!(file.exists(), "a killed server cannot remove it");
        let (ok, _, stderr) = said(
            &run_bin(
                "saga",
                &["signal", prefix, "approval", "--database-url", &db.url],
                cwd.path(),
            )
            .await,
        );
        assert!(!ok);
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains("still running"), "{stderr}");
    }
}
