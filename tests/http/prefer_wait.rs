//! `Prefer: wait`: a start or a read held until the saga ends (`200`) or the wait is up (`202`,
//! the saga as it is), capped by the server's `max_wait`, and cut short by a shutdown.

use std::time::{Duration, Instant};

use orchestrator::http::HttpConfig;
use orchestrator::model::SagaStatus;
use reqwest::{Method, StatusCode};
use saga_suite::api::Api;
use serde_json::{json, Value};

use crate::{own, shared};

#[tokio::test]
async fn prefer_wait_answers_200_with_the_finished_saga() {
    let api = shared();
    let a = Api::send(
        api.req(Method::POST, "/v1/sagas/s")
            .header("prefer", "wait=10")
            .json(&json!({"x": 1})),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["status"], "COMPLETED");
    assert_eq!(a.body["input"], json!({"x": 1}));
    assert_eq!(a.body["steps"].as_array().unwrap().len(), 3);
    assert_eq!(a.header("preference-applied"), Some("wait=10"));
    let id = a.body["id"].as_str().unwrap();
    assert_eq!(
        a.header("location"),
        Some(format!("/v1/sagas/{id}").as_str())
    );
    assert!(a.header("vary").is_some_and(|v| v.contains("prefer")));

    // A saga that fails ends too: 200 with its final state.
    let a = Api::send(
        api.req(Method::POST, "/v1/sagas/fails")
            .header("prefer", "respond-async, wait=10")
            .json(&json!({})),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["status"], "COMPENSATED");
}

#[tokio::test]
async fn a_short_wait_on_a_slow_saga_answers_202_and_a_long_poll_gets_the_end() {
    // A server of its own: a shorter longest wait.
    let api = own(HttpConfig {
        max_wait: Duration::from_secs(5),
        ..HttpConfig::default()
    })
    .await;
    let asked = Instant::now();
    let a = Api::send(
        api.req(Method::POST, "/v1/sagas/slow")
            .header("prefer", "wait=1")
            .json(&json!({})),
    )
    .await;
    let took = asked.elapsed();
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    assert_eq!(a.header("preference-applied"), Some("wait=1"));
    assert!(
        took >= Duration::from_millis(900),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    let id = a.body["id"].as_str().unwrap().to_owned();
    assert!(a.header("location").is_some());
    assert_ne!(a.body["status"], "COMPLETED");

    // A long poll on the saga: held until it ends; the wait asked for is capped to 5 s.
    let asked = Instant::now();
    let a = Api::send(
        api.req(Method::GET, &format!("/v1/sagas/{id}"))
            .header("prefer", "wait=600"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["status"], "COMPLETED", "{}", a.body);
    assert_eq!(a.header("preference-applied"), Some("wait=5"));
    assert!(asked.elapsed() < Duration::from_secs(5));

    // Without Prefer, a read answers at once; a bad preference is ignored, not an error.
    let a = Api::send(
        api.req(Method::GET, &format!("/v1/sagas/{id}"))
            .header("prefer", "wait=soon"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("preference-applied"), None);
}

#[tokio::test]
async fn shutdown_ends_long_waits_at_once() {
    // A server of its own, since the test shuts it down.
    let mut api = own(HttpConfig::default()).await;
    let id = api.start_saga("stuck", json!({})).await;
    let poll = {
        let req = api
            .req(Method::GET, &format!("/v1/sagas/{id}"))
            .header("prefer", "wait=60");
        tokio::spawn(async move { Api::send(req).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    api.shut_down();
    let a = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the long poll ended at shutdown")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(!status_of(&a.body).is_terminal(), "{}", a.body);
    tokio::time::timeout(Duration::from_secs(10), api.stop_server())
        .await
        .expect("the server stopped");
    assert!(stopping.elapsed() < Duration::from_secs(10));
}

/// The status of a saga object.
fn status_of(saga: &Value) -> SagaStatus {
    saga["status"].as_str().unwrap().parse().unwrap()
}
