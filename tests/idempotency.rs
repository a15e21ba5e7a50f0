//! `Idempotency-Key` on `POST /v1/sagas/{name}` (SPEC §4) over real loopback sockets, on the
//! backend `SAGA_TEST_BACKEND` selects: one saga for any number of concurrent identical
//! requests, replays with `Idempotent-Replayed`, `422` for a reused key, `409` while a waiting
//! request holds the key, the key's format, scoping per client, retention and the sweeper.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use orchestrator::http::HttpConfig;
use orchestrator::model::{ListFilter, SagaStatus};
use reqwest::StatusCode;
use saga_dsl::SagaDefinition;
use saga_suite::api::Harness;
use saga_suite::{fixtures, registry_of, wait_terminal, Journal};
use serde_json::json;

const TOKEN: &str = "idem-token-0123456789";

/// From `saga_suite::fixtures`: `s`, three quick steps; `other`, one quick step; `slow`, a
/// 1.5 s step then a pivot; `typed`, which needs an `{"order_id", "amount"}` input.
fn definitions() -> Vec<SagaDefinition> {
    let journal = Journal::default();
    vec![
        fixtures::succeeds(&journal),
        fixtures::other(&journal),
        fixtures::slow(Duration::from_millis(1500)),
        fixtures::typed(),
    ]
}

/// An engine over a fresh database; each test puts one or more HTTP servers on it.
async fn harness() -> Harness {
    Harness::new(registry_of(definitions())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_requests_create_exactly_one_saga() {
    let h = harness().await;
    let api = h.serve(HttpConfig::default()).await;
    let api = std::sync::Arc::new(api);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            api.start_raw(
                "s",
                r#"{"order": 7, "items": [1, 2]}"#,
                &[("idempotency-key", "k-50")],
            )
            .await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    for a in &answers {
        assert_eq!(a.status, StatusCode::ACCEPTED, "{a:?}");
    }
    let first = &answers[0];
    let id = first.json()["id"].as_str().unwrap().to_owned();
    for a in &answers {
        assert_eq!(a.text, first.text, "every answer is the same body");
        assert_eq!(
            a.header("location"),
            Some(format!("/v1/sagas/{id}").as_str())
        );
    }
    let fresh = answers.iter().filter(|a| !a.replayed()).count();
    assert_eq!(fresh, 1, "one request created the saga, 49 were replays");
    assert_eq!(h.count("s").await, 1, "exactly one saga");
    std::sync::Arc::try_unwrap(api).ok().unwrap().stop().await;
    h.engine.stop().await;
}

#[tokio::test]
async fn a_retry_replays_the_answer_and_a_different_request_is_422() {
    let h = harness().await;
    let api = h.serve(HttpConfig::default()).await;
    let key = [("idempotency-key", "order-1")];
    let first = api
        .start_raw("s", r#"{"a": 1, "b": {"x": true, "y": [1]}}"#, &key)
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert!(!first.replayed());
    // A free worker took it at once.
    assert_eq!(first.json()["status"], "RUNNING");

    // Same request: the same status and body, marked as a replay; nothing new.
    let again = api
        .start_raw("s", r#"{"a": 1, "b": {"x": true, "y": [1]}}"#, &key)
        .await;
    assert_eq!((again.status, &again.text), (first.status, &first.text));
    assert!(again.replayed());
    assert_eq!(again.header("location"), first.header("location"));

    // Key order and whitespace do not matter; the quoted (RFC 8941) form is the same key.
    let reordered = api
        .start_raw(
            "s",
            r#"{ "b": {"y": [1], "x": true}, "a": 1 }"#,
            &[("idempotency-key", "\"order-1\"")],
        )
        .await;
    assert_eq!(reordered.status, StatusCode::ACCEPTED);
    assert!(reordered.replayed());
    assert_eq!(reordered.text, first.text);

    // A different body, or another saga, with the same key: 422, nothing created.
    let other_body = api
        .start_raw("s", r#"{"a": 2, "b": {"x": true, "y": [1]}}"#, &key)
        .await;
    assert_eq!(other_body.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other_body.json()["error"]["code"], "idempotency_key_reused");
    let other_saga = api
        .start_raw("other", r#"{"a": 1, "b": {"x": true, "y": [1]}}"#, &key)
        .await;
    assert_eq!(other_saga.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(h.count("s").await, 1);
    assert_eq!(h.count("other").await, 0);

    // Errors are not saved: a request refused for its input does not use the key up.
    let bad = api
        .start_raw(
            "typed",
            r#"{"wrong": 1}"#,
            &[("idempotency-key", "typed-1")],
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.json()["error"]["code"], "invalid_input");
    let fixed = api
        .start_raw(
            "typed",
            r#"{"order_id": "o1", "amount": 1}"#,
            &[("idempotency-key", "typed-1")],
        )
        .await;
    assert_eq!(fixed.status, StatusCode::ACCEPTED);
    assert!(!fixed.replayed());
    assert_eq!(h.count("typed").await, 1);
    api.stop().await;
    h.engine.stop().await;
}

#[tokio::test]
async fn malformed_keys_are_400_and_create_nothing() {
    let h = harness().await;
    let api = h.serve(HttpConfig::default()).await;
    let long = "k".repeat(256);
    for bad in [long.as_str(), "", "\"\"", "has space", "\"unterminated"] {
        let a = api.start_raw("s", "{}", &[("idempotency-key", bad)]).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "key {bad:?}: {}", a.text);
        assert_eq!(a.json()["error"]["code"], "bad_request");
    }
    let two = api
        .http
        .post(format!("{}/v1/sagas/s", api.base))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(two.status(), StatusCode::BAD_REQUEST);
    assert_eq!(h.count("s").await, 0);
    // 255 characters is fine.
    let max = "k".repeat(255);
    let ok = api
        .start_raw("s", "{}", &[("idempotency-key", max.as_str())])
        .await;
    assert_eq!(ok.status, StatusCode::ACCEPTED);
    // An unknown saga is 404 before the key is looked at.
    let unknown = api
        .start_raw("nope", "{}", &[("idempotency-key", "")])
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    api.stop().await;
    h.engine.stop().await;
}

#[tokio::test]
async fn a_server_may_require_the_key() {
    let h = harness().await;
    let api = h
        .serve(HttpConfig {
            require_idempotency_key: true,
            ..HttpConfig::default()
        })
        .await;
    let missing = api.start_raw("s", "{}", &[]).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(
        missing.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{}",
        missing.text
    );
    assert_eq!(h.count("s").await, 0);
    let with = api.start_raw("s", "{}", &[("idempotency-key", "k")]).await;
    assert_eq!(with.status, StatusCode::ACCEPTED);
    api.stop().await;
    h.engine.stop().await;
}

/// Keys are scoped to the API client: a server without a token sees everyone as `anonymous`,
/// one with a token sees its holder as `token`, so the same key from each is two starts. (The
/// server knows one token; each token, were there several, would be its own scope.)
#[tokio::test]
async fn keys_are_scoped_per_client() {
    let h = harness().await;
    let open = h.serve(HttpConfig::default()).await;
    let authed = h
        .serve(HttpConfig {
            api_token: Some(TOKEN.to_owned()),
            ..HttpConfig::default()
        })
        .await;
    let key = [("idempotency-key", "shared-key")];
    let a = open.start_raw("s", "{}", &key).await;
    let b = authed.start_raw("s", "{}", &key).await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::ACCEPTED, StatusCode::ACCEPTED)
    );
    assert!(!a.replayed() && !b.replayed());
    assert_ne!(a.json()["id"], b.json()["id"], "two clients, two sagas");
    // Each client replays its own.
    let a2 = open.start_raw("s", "{}", &key).await;
    let b2 = authed.start_raw("s", "{}", &key).await;
    assert_eq!(a2.json()["id"], a.json()["id"]);
    assert_eq!(b2.json()["id"], b.json()["id"]);
    assert_eq!(h.count("s").await, 2);
    open.stop().await;
    authed.stop().await;
    h.engine.stop().await;
}

/// `Prefer: wait` with a key: the key stays in progress until the waiting request answers, so a
/// retry meanwhile is `409` with `Retry-After`; afterwards the final `200` is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_while_the_first_request_waits_is_409() {
    let h = harness().await;
    let api = std::sync::Arc::new(h.serve(HttpConfig::default()).await);
    let first = {
        let api = api.clone();
        tokio::spawn(async move {
            api.start_raw(
                "slow",
                "{}",
                &[("idempotency-key", "wait-1"), ("prefer", "wait=20")],
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let during = api
        .start_raw("slow", "{}", &[("idempotency-key", "wait-1")])
        .await;
    assert_eq!(during.status, StatusCode::CONFLICT, "{}", during.text);
    assert_eq!(during.header("retry-after"), Some("1"));
    assert_eq!(during.json()["error"]["code"], "request_in_progress");

    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    assert_eq!(first.json()["status"], "COMPLETED");
    assert_eq!(first.header("preference-applied"), Some("wait=20"));

    let after = api
        .start_raw("slow", "{}", &[("idempotency-key", "wait-1")])
        .await;
    assert_eq!(after.status, StatusCode::OK);
    assert!(after.replayed());
    assert_eq!(
        after.text, first.text,
        "the final answer is replayed as it was"
    );
    assert_eq!(h.count("slow").await, 1);

    // A waiting request whose process died leaves its key in progress; once it is older than
    // any request could be, the key is answered like a plain start (202) and completed so.
    h.db.execute(
        "UPDATE idempotency_keys SET completed_at = NULL, status_code = NULL, \
         response_body = NULL, created_at = 0",
    )
    .await;
    let orphan = api
        .start_raw("slow", "{}", &[("idempotency-key", "wait-1")])
        .await;
    assert_eq!(orphan.status, StatusCode::ACCEPTED, "{}", orphan.text);
    assert!(orphan.replayed());
    assert_eq!(orphan.json()["id"], first.json()["id"]);
    assert_eq!(orphan.json()["status"], "COMPLETED");
    let again = api
        .start_raw("slow", "{}", &[("idempotency-key", "wait-1")])
        .await;
    assert_eq!(again.text, orphan.text);
    assert_eq!(h.count("slow").await, 1);
    std::sync::Arc::try_unwrap(api).ok().unwrap().stop().await;
    h.engine.stop().await;
}

#[tokio::test]
async fn expired_keys_start_anew_and_are_swept() {
    let h = harness().await;
    let api = h
        .serve(HttpConfig {
            idempotency_retention: Duration::from_millis(300),
            ..HttpConfig::default()
        })
        .await;
    let key = [("idempotency-key", "short-lived")];
    let a = api.start_raw("s", "{}", &key).await;
    let b = api.start_raw("s", "{}", &key).await;
    assert!(b.replayed());
    assert_eq!(a.json()["id"], b.json()["id"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Expired but not swept yet: the key counts as new.
    let c = api.start_raw("s", "{}", &key).await;
    assert!(!c.replayed());
    assert_ne!(c.json()["id"], a.json()["id"]);
    assert_eq!(h.count("s").await, 2);

    tokio::time::sleep(Duration::from_millis(400)).await;
    let now = h.stores.log.now().await.unwrap();
    let swept = h.stores.idempotency.sweep_idempotency(now).await.unwrap();
    assert_eq!(swept, 1, "the expired key is deleted");
    assert_eq!(
        h.stores.idempotency.sweep_idempotency(now).await.unwrap(),
        0
    );
    api.stop().await;
    h.engine.stop().await;
}

/// The typed client sends one key per logical start; against the real server a retried start
/// is a replay, not a second saga.
#[tokio::test]
async fn the_client_and_the_server_agree_on_keys() {
    let h = harness().await;
    let api = h.serve(HttpConfig::default()).await;
    let client = orchestrator::client::SagaClient::new(&api.base, None).unwrap();
    let first = client
        .start("s", &json!({"n": 1}), Some("client-key".to_owned()))
        .await
        .unwrap();
    let second = client
        .start("s", &json!({"n": 1}), Some("client-key".to_owned()))
        .await
        .unwrap();
    assert_eq!(first.id, second.id);
    assert_eq!(h.count("s").await, 1);
    api.stop().await;
    h.engine.stop().await;
}

/// The record of a new saga of the quick `other` definition, with a fresh id.
fn new_other(h: &Harness) -> orchestrator::store::NewSaga {
    let def = h.engine.engine.registry().latest("other").unwrap();
    orchestrator::store::NewSaga::of(def, json!({}))
}

/// Many idempotent starts at once share the writer's transactions (on SQLite, many per
/// transaction): each key creates one saga with its callback, a second start
/// with the same key in the same burst gets the first one's answer, and a start whose saga
/// cannot be written fails alone, leaving its key unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_keyed_starts_creates_one_saga_per_key_and_a_bad_one_fails_alone() {
    use orchestrator::store::{Callback, IdempotencyKey, IdempotentStart, SavedResponse};
    let h = harness().await;
    let existing = h
        .engine
        .engine
        .start_saga("other", json!({}))
        .await
        .unwrap();
    let key = |k: &str| IdempotencyKey {
        scope: "burst".to_owned(),
        key: k.to_owned(),
        fingerprint: "same request".to_owned(),
        retention: Duration::from_secs(60),
    };
    let mut starts = Vec::new();
    for i in 0..40 {
        // Keys k-0 to k-9 twice each, k-10 to k-29 once; k-25 collides with a saga.
        let k = key(&format!("k-{}", i % 30));
        let mut new = new_other(&h);
        if i == 25 {
            new.id = existing.id;
        }
        let callback = Callback {
            url: format!("http://127.0.0.1:9/cb/{i}"),
            secret: None,
        };
        let response = SavedResponse {
            status_code: 202,
            body: format!("answer {i}"),
        };
        let store = h.stores.idempotency.clone();
        starts.push(tokio::spawn(async move {
            let id = new.id;
            let got = store
                .create_saga_idempotent(&k, new, Some(&callback), Some(&response), None)
                .await;
            (k.key, id, got)
        }));
    }
    let mut created = std::collections::HashMap::new();
    let mut replays = Vec::new();
    let mut failed = Vec::new();
    for s in starts {
        let (k, id, got) = s.await.unwrap();
        match got {
            Ok(IdempotentStart::Created(saga)) => {
                assert_eq!(saga.id, id);
                assert!(created.insert(k, id).is_none(), "one creation per key");
            }
            Ok(IdempotentStart::Replay { saga_id, response }) => {
                replays.push((k, saga_id, response))
            }
            Ok(other) => panic!("{k}: {other:?}"),
            Err(e) => failed.push((k, e)),
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "k-25", "only the colliding start failed");
    assert_eq!(created.len(), 29, "every other key created its saga");
    assert_eq!(replays.len(), 10);
    for (k, saga_id, response) in &replays {
        assert_eq!(
            created.get(k),
            Some(saga_id),
            "{k} answered for its first start"
        );
        assert_eq!(response.status_code, 202);
    }
    let ids: Vec<uuid::Uuid> = created.values().copied().collect();
    let callbacks = h.stores.outbox.saga_callbacks(&ids).await.unwrap();
    assert_eq!(callbacks.len(), 29, "each created saga has its callback");
    let page = h
        .stores
        .log
        .list_sagas(&ListFilter {
            name: Some("other".to_owned()),
            limit: 1000,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.sagas.len(),
        30,
        "29 keyed sagas and the one started before"
    );
    // The failed start recorded nothing: its key is still free.
    let retry = h
        .stores
        .idempotency
        .create_saga_idempotent(&key("k-25"), new_other(&h), None, None, None)
        .await
        .unwrap();
    assert!(matches!(retry, IdempotentStart::Created(_)), "{retry:?}");
    h.engine.stop().await;
}

/// A keyed start whose process has a free worker creates its saga already leased to that
/// worker (epoch 1) and drives it at once: nobody claims it, so its epoch never moves. A retry
/// with the same key creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_start_with_a_free_worker_is_created_leased_and_driven_without_a_claim() {
    use orchestrator::{StartKey, StartOutcome, StartRequest};
    let h = harness().await;
    h.engine.ready().await;
    let engine = &h.engine.engine;
    let owner = engine.config().worker_id.clone();
    let request = || StartRequest::new("other", json!({})).with_key(StartKey::new("direct", "d-1"));
    let got = engine.start(request()).await.unwrap();
    let StartOutcome::Created { saga, started, .. } = got else {
        panic!("a new key creates its saga: {got:?}")
    };
    assert_eq!(saga.lease_owner.as_deref(), Some(owner.as_str()));
    assert_eq!(saga.lease_epoch, 1);
    assert_eq!(
        started.status,
        SagaStatus::Running,
        "its first action written ahead"
    );
    let done = wait_terminal(&h.stores.log, saga.id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(done.lease_epoch, 1, "never claimed: {done:?}");
    let attempts = h.stores.log.attempts(saga.id).await.unwrap();
    assert!(!attempts.is_empty());
    assert!(
        attempts
            .iter()
            .all(|a| a.lease_epoch == 1 && a.worker == owner),
        "{attempts:?}"
    );
    // The key is recorded: the same request replays the saved answer and starts nothing.
    let replay = engine.start(request()).await.unwrap();
    match replay {
        StartOutcome::Replayed { saga_id, response } => {
            assert_eq!(saga_id, saga.id);
            assert_eq!(response.status_code, 202);
            assert_eq!(
                response.body,
                started.to_json(),
                "the answer as first given"
            );
        }
        other => panic!("a known key replays: {other:?}"),
    }
    h.engine.stop().await;
}
