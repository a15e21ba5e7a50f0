//! Bearer auth: with a token, every `/v1` route and `/metrics` refuse a request without it (and
//! such a request changes nothing); the health check and the API document stay open; without a
//! token the API is open.

use reqwest::{Method, StatusCode};
use saga_suite::api::{Answer, Api};
use serde_json::{json, Value};

use crate::{own, shared, with_token, TOKEN};

fn assert_unauthorized(a: &Answer, what: &str) {
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{what}: {}", a.body);
    assert_eq!(
        a.body["error"]["code"], "unauthorized",
        "{what}: {}",
        a.body
    );
    assert!(
        a.header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer")),
        "{what}: {:?}",
        a.headers
    );
}

#[tokio::test]
async fn with_a_token_every_v1_request_without_it_is_refused_and_nothing_is_created() {
    // A server of its own: a token, and the test counts every saga of the database.
    let api = own(with_token()).await;
    // One saga, started with the token, to aim reads and a cancel at.
    let id = api.start_saga("slow", json!({})).await;
    assert_eq!(api.saga_count().await, 1);

    let bad_credentials: [(&str, Option<&str>); 6] = [
        ("no header", None),
        ("wrong token", Some("Bearer not-the-token")),
        (
            "token in another case",
            Some("Bearer TEST-TOKEN-0123456789"),
        ),
        ("token prefix", Some("Bearer test-token")),
        ("another scheme", Some("Basic dGVzdDp0ZXN0")),
        ("empty bearer", Some("Bearer ")),
    ];
    let requests: Vec<(Method, String, Option<Value>)> = vec![
        (Method::POST, "/v1/sagas/s".into(), Some(json!({}))),
        (Method::POST, "/v1/sagas/nope".into(), Some(json!({}))),
        (Method::POST, format!("/v1/sagas/{id}/cancel"), None),
        (Method::GET, "/v1/sagas".into(), None),
        (Method::GET, format!("/v1/sagas/{id}"), None),
        (Method::GET, format!("/v1/sagas/{id}/events"), None),
        (Method::GET, "/v1/unknown".into(), None),
        (Method::DELETE, format!("/v1/sagas/{id}"), None),
        (Method::GET, "/metrics".into(), None),
    ];
    for (what, credentials) in bad_credentials {
        for (method, path, body) in &requests {
            let mut req = api.anonymous(method.clone(), path);
            if let Some(c) = credentials {
                req = req.header("authorization", c);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let a = Api::send(req).await;
            assert_unauthorized(&a, &format!("{what}: {method} {path}"));
        }
    }
    // A refused start created nothing, a refused cancel cancelled nothing.
    assert_eq!(api.saga_count().await, 1);
    let saga = api.stored_saga(id.parse().unwrap()).await;
    assert!(!saga.cancel_requested);

    // Open without a token: the health check and the API document.
    let a = Api::send(api.anonymous(Method::GET, "/healthz")).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = Api::send(api.anonymous(Method::GET, "/openapi.json")).await;
    assert_eq!(a.status, StatusCode::OK);

    // With the token (the scheme in any case) everything works.
    let a = Api::send(
        api.anonymous(Method::POST, "/v1/sagas/s")
            .header("authorization", format!("bearer {TOKEN}"))
            .json(&json!({})),
    )
    .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let a = Api::send(api.req(Method::GET, "/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    let a = Api::send(api.req(Method::POST, &format!("/v1/sagas/{id}/cancel"))).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    assert_eq!(api.saga_count().await, 2);
}

#[tokio::test]
async fn without_a_token_the_api_is_open() {
    let api = shared();
    let a = Api::send(api.anonymous(Method::POST, "/v1/sagas/s").json(&json!({}))).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let a = Api::send(api.anonymous(Method::GET, "/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    // A token sent to a server without one is simply not needed.
    let a = Api::send(
        api.anonymous(Method::GET, "/v1/sagas")
            .bearer_auth("whatever"),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
}
