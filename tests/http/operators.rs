//! Named tokens with scopes, each scope against each route (a table), and the operator
//! routes (abort, retry, mark-compensated) with the token's name as the audit actor.

use orchestrator::http::{ApiToken, HttpConfig, Scope};
use reqwest::{Method, StatusCode};
use saga_suite::api::Api;
use serde_json::{json, Value};

use crate::{assert_error, own};

const READER: &str = "reader-token-0123456789";
const STARTER: &str = "starter-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";

fn with_scoped_tokens() -> HttpConfig {
    HttpConfig {
        api_tokens: vec![
            ApiToken::new("reader", &[Scope::Read], READER),
            ApiToken::new("ci", &[Scope::Start], STARTER),
            ApiToken::new("ops", &[Scope::Operate, Scope::Read], OPERATOR),
            ApiToken::new("root", &[Scope::Admin], ADMIN),
        ],
        ..HttpConfig::default()
    }
}

/// Sends `method path` with `token` and the JSON `body`.
async fn call(
    api: &Api,
    token: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let mut req = api.anonymous(method, path).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(body);
    }
    let a = Api::send(req).await;
    (a.status, a.body)
}

#[tokio::test]
async fn each_route_needs_its_scope() {
    let api = own(with_scoped_tokens()).await;
    // A saga to aim at, started by the admin: one that waits for a signal, so that nothing
    // ends it meanwhile and no call holds the server's shutdown.
    let (s, started) = call(
        &api,
        ADMIN,
        Method::POST,
        "/v1/sagas/approval",
        Some(&json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{started}");
    let id = started["id"].as_str().unwrap().to_owned();
    let reason = json!({"reason": "scope test"});
    let routes: Vec<(Method, String, Option<Value>, Scope)> = vec![
        (Method::GET, "/v1/sagas".into(), None, Scope::Read),
        (Method::GET, format!("/v1/sagas/{id}"), None, Scope::Read),
        (
            Method::GET,
            format!("/v1/sagas/{id}/events"),
            None,
            Scope::Read,
        ),
        (
            Method::GET,
            format!("/v1/sagas/{id}/deliveries"),
            None,
            Scope::Read,
        ),
        (Method::GET, "/v1/definitions".into(), None, Scope::Read),
        (Method::GET, "/metrics".into(), None, Scope::Read),
        (
            Method::POST,
            "/v1/sagas/s".into(),
            Some(json!({})),
            Scope::Start,
        ),
        (
            Method::POST,
            format!("/v1/sagas/{id}/signals/nope"),
            Some(json!(null)),
            Scope::Start,
        ),
        (
            Method::POST,
            format!("/v1/sagas/{}/cancel", uuid::Uuid::nil()),
            None,
            Scope::Start,
        ),
        (
            Method::POST,
            format!("/v1/sagas/{}/abort", uuid::Uuid::nil()),
            Some(reason.clone()),
            Scope::Operate,
        ),
        (
            Method::POST,
            format!("/v1/sagas/{}/retry", uuid::Uuid::nil()),
            None,
            Scope::Operate,
        ),
        (
            Method::POST,
            format!(
                "/v1/sagas/{}/steps/reserve/mark-compensated",
                uuid::Uuid::nil()
            ),
            Some(reason.clone()),
            Scope::Operate,
        ),
    ];
    let tokens: [(&str, &[Scope]); 4] = [
        (READER, &[Scope::Read]),
        (STARTER, &[Scope::Start]),
        (OPERATOR, &[Scope::Operate, Scope::Read]),
        (ADMIN, &[Scope::Admin]),
    ];
    for (token, scopes) in tokens {
        for (method, path, body, needed) in &routes {
            let (status, body) = call(&api, token, method.clone(), path, body.as_ref()).await;
            let allowed = scopes.contains(needed) || scopes.contains(&Scope::Admin);
            let what = format!("{token} {method} {path}");
            if allowed {
                assert!(
                    status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED,
                    "{what}: {status} {body}"
                );
            } else {
                let message = assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
                assert!(message.contains(needed.as_str()), "{what}: {message}");
                assert!(
                    !message.contains(token),
                    "a token is never echoed: {message}"
                );
            }
        }
    }
    // Unknown and absent tokens are 401, not 403.
    for token in ["not-a-token", ""] {
        let a = Api::send(api.anonymous(Method::GET, "/v1/sagas").bearer_auth(token)).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{token:?}: {}", a.body);
    }
    // The refused starts created nothing: the admin's saga and the starter's and admin's `s`.
    assert_eq!(api.saga_count().await, 3);
    api.stop().await;
}

#[tokio::test]
async fn operator_routes_act_with_the_tokens_name_as_the_actor() {
    let api = own(with_scoped_tokens()).await;
    // `slow`: its first step takes 1.5 s, time to act while it runs.
    let (_, started) = call(
        &api,
        ADMIN,
        Method::POST,
        "/v1/sagas/slow",
        Some(&json!({})),
    )
    .await;
    let id = started["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, saga) = call(&api, READER, Method::GET, &format!("/v1/sagas/{id}"), None).await;
        if saga["steps"][0]["status"] == "RUNNING" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{saga}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // Bad input first: no reason, an empty one, an unknown field, an unknown saga.
    for body in [
        json!({}),
        json!({"reason": "  "}),
        json!({"reason": "x", "who": "me"}),
    ] {
        let (s, b) = call(
            &api,
            OPERATOR,
            Method::POST,
            &format!("/v1/sagas/{id}/abort"),
            Some(&body),
        )
        .await;
        assert_error(s, &b, StatusCode::BAD_REQUEST, "bad_request");
    }
    let nil = uuid::Uuid::nil();
    let (s, b) = call(
        &api,
        OPERATOR,
        Method::POST,
        &format!("/v1/sagas/{nil}/abort"),
        Some(&json!({"reason": "x"})),
    )
    .await;
    assert_error(s, &b, StatusCode::NOT_FOUND, "not_found");
    // Not compensating: mark-compensated is a conflict; an unknown step is 404.
    let (s, b) = call(
        &api,
        OPERATOR,
        Method::POST,
        &format!("/v1/sagas/{id}/steps/nope/mark-compensated"),
        Some(&json!({"reason": "x"})),
    )
    .await;
    assert_error(s, &b, StatusCode::NOT_FOUND, "not_found");

    // Retry of a running saga is accepted and audited; abort ends it, with its call abandoned.
    let (s, retried) = call(
        &api,
        OPERATOR,
        Method::POST,
        &format!("/v1/sagas/{id}/retry"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{retried}");
    let (s, aborted) = call(
        &api,
        OPERATOR,
        Method::POST,
        &format!("/v1/sagas/{id}/abort"),
        Some(&json!({"reason": "stuck at the warehouse"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{aborted}");
    assert_eq!(aborted["status"], "ABORTED");
    assert_eq!(aborted["steps"][0]["status"], "UNKNOWN", "{aborted}");
    let (_, got) = call(&api, READER, Method::GET, &format!("/v1/sagas/{id}"), None).await;
    assert_eq!(got["status"], "ABORTED");
    assert_eq!(got["steps"][0]["status"], "UNKNOWN");
    let (_, events) = call(
        &api,
        READER,
        Method::GET,
        &format!("/v1/sagas/{id}/events"),
        None,
    )
    .await;
    let events = events["events"].as_array().unwrap();
    let actor_of = |kind: &str| {
        events
            .iter()
            .find(|e| e["type"] == kind)
            .map(|e| e["data"]["actor"].clone())
    };
    assert_eq!(
        actor_of("saga.retry_requested"),
        Some(json!("ops")),
        "{events:?}"
    );
    assert_eq!(actor_of("saga.aborted"), Some(json!("ops")), "{events:?}");
    let abort = events.iter().find(|e| e["type"] == "saga.aborted").unwrap();
    assert_eq!(abort["data"]["reason"], "stuck at the warehouse");
    assert_eq!(abort["data"]["abandoned"][0]["step"], "wait");

    // Twice is a conflict, and so is a retry of the aborted saga.
    let (s, b) = call(
        &api,
        OPERATOR,
        Method::POST,
        &format!("/v1/sagas/{id}/abort"),
        Some(&json!({"reason": "again"})),
    )
    .await;
    assert_error(s, &b, StatusCode::CONFLICT, "conflict");
    let (s, b) = call(
        &api,
        OPERATOR,
        Method::POST,
        &format!("/v1/sagas/{id}/retry"),
        None,
    )
    .await;
    assert_error(s, &b, StatusCode::CONFLICT, "conflict");
    api.stop().await;
}

#[tokio::test]
async fn idempotency_keys_are_scoped_by_token_name() {
    let api = own(with_scoped_tokens()).await;
    let start = |token: &'static str| {
        let api = &api;
        async move {
            let req = api
                .anonymous(Method::POST, "/v1/sagas/s")
                .bearer_auth(token)
                .header("idempotency-key", "order-1")
                .json(&json!({}));
            Api::send(req).await
        }
    };
    let first = start(STARTER).await;
    let again = start(STARTER).await;
    let other = start(ADMIN).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert!(again.replayed());
    assert_eq!(again.body["id"], first.body["id"]);
    assert!(!other.replayed());
    assert_ne!(
        other.body["id"], first.body["id"],
        "another token's key is its own"
    );
    api.stop().await;
}
