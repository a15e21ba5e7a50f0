//! The OpenAPI document: the served one against the live router (every route, method and status
//! documented, and every documented status answered), the committed `docs/openapi.json` against
//! the code.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use orchestrator::http::{openapi_json, openapi_json_for, ApiToken, HttpConfig, Scope};
use reqwest::{Method, StatusCode};
use saga_suite::api::{Api, Harness};
use saga_suite::{fixtures, registry_of};
use serde_json::{json, Value};

use crate::{definitions, own, TOKEN};

/// A token that may only read.
const READ_ONLY: &str = "read-only-token-0123456789";
/// A token that may only start (and signal, and cancel).
const START_ONLY: &str = "start-only-token-0123456789";

/// A documented path with its parameters filled in.
fn concrete(template: &str, saga_id: &str) -> String {
    template.replace("{saga}", saga_id)
}

/// The operations of the document: path → method (upper case) → documented statuses.
fn operations(doc: &Value) -> BTreeMap<String, BTreeMap<String, BTreeSet<u16>>> {
    let mut ops = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let mut methods = BTreeMap::new();
        for (method, op) in item.as_object().unwrap() {
            let Some(responses) = op.get("responses").and_then(Value::as_object) else {
                continue;
            };
            let statuses = responses.keys().map(|s| s.parse().unwrap()).collect();
            methods.insert(method.to_uppercase(), statuses);
        }
        ops.insert(path.clone(), methods);
    }
    ops
}

#[tokio::test]
async fn the_openapi_document_matches_the_routes_methods_and_statuses() {
    // A server of its own: a token and a small body limit, for their statuses.
    // Two named tokens with one scope each, for the 403 of every route.
    // With `callback`, whose step waits for its participant: the task routes' probes.
    let definitions = || {
        let mut all = definitions();
        all.push(fixtures::callback());
        all
    };
    let harness = Harness::new(registry_of(definitions())).await;
    // The routes of flow control answer about declared limits: one of each kind.
    harness
        .stores
        .log
        .declare_limits(&fixtures::payout_limits(), &["payout".to_owned()])
        .await
        .unwrap();
    let api = harness
        .into_api(HttpConfig {
            api_token: Some(TOKEN.to_owned()),
            api_tokens: vec![
                ApiToken::new("reader", &[Scope::Read], READ_ONLY),
                ApiToken::new("starter", &[Scope::Start], START_ONLY),
            ],
            body_limit: 4096,
            ..HttpConfig::default()
        })
        .await;
    let resp = api.http.get(api.url("/openapi.json")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let text = resp.text().await.unwrap();
    assert_eq!(
        text,
        openapi_json_for(&registry_of(definitions())),
        "GET /openapi.json is the generated document, with the registry's start routes"
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut ops = operations(&doc);
    // Each definition has its own start route, a copy of the generic one (tests/discovery.rs
    // checks them); the router serves it through `/v1/sagas/{saga}`, so it allows POST there.
    for def in definitions() {
        let path = format!("/v1/sagas/{}", def.name());
        let methods = ops.remove(&path);
        assert_eq!(
            methods.map(|m| m.into_keys().collect::<Vec<_>>()),
            Some(vec!["POST".to_owned()]),
            "{path}"
        );
        let a = Api::send(api.req(Method::PATCH, &path)).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "PATCH {path}");
        assert!(
            a.header("allow").unwrap_or_default().contains("POST"),
            "{path}"
        );
    }

    // Every route of SPEC §4 and of §8's operator API is documented.
    for (method, path) in [
        ("POST", "/v1/sagas/{saga}"),
        ("GET", "/v1/sagas/{saga}"),
        ("GET", "/v1/sagas"),
        ("GET", "/v1/sagas/{saga}/events"),
        ("GET", "/v1/sagas/{saga}/attempts"),
        ("GET", "/v1/sagas/{saga}/deliveries"),
        ("POST", "/v1/sagas/{saga}/cancel"),
        ("POST", "/v1/sagas/{saga}/abort"),
        ("POST", "/v1/sagas/{saga}/retry"),
        ("POST", "/v1/sagas/{saga}/steps/{step}/mark-compensated"),
        ("POST", "/v1/sagas/{saga}/steps/{step}/complete"),
        ("POST", "/v1/sagas/{saga}/fork"),
        ("POST", "/v1/bulk"),
        ("GET", "/v1/bulk"),
        ("GET", "/v1/bulk/{id}"),
        ("POST", "/v1/sagas/{saga}/pause"),
        ("POST", "/v1/sagas/{saga}/resume"),
        ("GET", "/v1/definitions"),
        ("GET", "/v1/limits"),
        ("PUT", "/v1/limits/{name}"),
        ("POST", "/v1/schedules"),
        ("GET", "/v1/schedules"),
        ("GET", "/v1/schedules/{id}"),
        ("DELETE", "/v1/schedules/{id}"),
        ("POST", "/v1/schedules/{id}/pause"),
        ("POST", "/v1/schedules/{id}/resume"),
        ("POST", "/v1/schedules/{id}/trigger"),
        ("GET", "/v1/counts"),
        ("GET", "/v1/whoami"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ] {
        assert!(
            ops.get(path).is_some_and(|m| m.contains_key(method)),
            "{method} {path} is not in the document"
        );
    }

    // The router serves exactly the documented methods on each documented path: a method it
    // does not serve is a 405 whose `Allow` lists the ones it does.
    let some_id = uuid::Uuid::now_v7().to_string();
    for (template, methods) in &ops {
        let a = Api::send(api.req(Method::PATCH, &concrete(template, &some_id))).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "PATCH {template}");
        let allowed: BTreeSet<String> = a
            .header("allow")
            .unwrap_or_default()
            .split(',')
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty() && m != "HEAD")
            .collect();
        let documented: BTreeSet<String> = methods.keys().cloned().collect();
        assert_eq!(allowed, documented, "methods of {template}");
    }
    // And an undocumented path is not served.
    let a = Api::send(api.req(Method::GET, "/v1/other")).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);

    // Every status the router answers is documented for its operation, and every documented
    // status but the server-side ones (500, 503) is answered by some request here.
    let done = api.run_saga("s").await["id"].as_str().unwrap().to_owned();
    // Still running when its cancel is probed, however long the probes before it take.
    let running = api.start_saga("stuck", json!({})).await;
    // Sent its signal by the probes (before or after it reaches its wait).
    let approving = api.start_saga("approval", json!({})).await;
    let signal = |id: &str| format!("/v1/sagas/{id}/signals/approval");
    let unknown = uuid::Uuid::now_v7().to_string();
    let big = json!({"pad": "x".repeat(8192)});
    // Running, for the operator commands: one to abort, one to retry, one stuck compensating.
    let to_abort = api.start_saga("stuck", json!({})).await;
    let to_retry = api.start_saga("stuck", json!({})).await;
    // Running: paused (a request, its call being in flight), then resumed (withdrawn).
    let to_pause = api.start_saga("stuck", json!({})).await;
    let undoing = api.start_saga("stuck_undo", json!({})).await;
    api.wait(&undoing, |s| {
        s["steps"][0]["compensation"]["status"] == "RUNNING"
    })
    .await;
    let with =
        |token: &str, method: Method, path: &str| api.anonymous(method, path).bearer_auth(token);
    let reason = json!({"reason": "probe"});
    let abort = |id: &str| format!("/v1/sagas/{id}/abort");
    let retry = |id: &str| format!("/v1/sagas/{id}/retry");
    let mark = |id: &str, step: &str| format!("/v1/sagas/{id}/steps/{step}/mark-compensated");
    let complete = |id: &str, step: &str| format!("/v1/sagas/{id}/steps/{step}/complete");
    let fork = |id: &str| format!("/v1/sagas/{id}/fork");
    // Waiting for its approval: a step a person may complete.
    let to_complete = api.start_saga("approval", json!({})).await;
    api.wait(&to_complete, |s| s["steps"][1]["status"] == "WAITING")
        .await;
    // An output over the operator's limit fits only a body limit above it: a server of its own.
    let roomy = own(HttpConfig {
        api_token: Some(TOKEN.to_owned()),
        body_limit: 2 * orchestrator::operations::MAX_OUTPUT,
        ..HttpConfig::default()
    })
    .await;
    let roomy_done = roomy.run_saga("s").await["id"].as_str().unwrap().to_owned();
    let too_big = json!({
        "output": "x".repeat(orchestrator::operations::MAX_OUTPUT),
        "reason": "probe",
    });
    let pause = |id: &str| format!("/v1/sagas/{id}/pause");
    let resume = |id: &str| format!("/v1/sagas/{id}/resume");
    // A start that waits holds its idempotency key in progress: a retry meanwhile is 409.
    let waiting = {
        let req = api
            .req(Method::POST, "/v1/sagas/stuck")
            .header("idempotency-key", "probe-in-progress")
            .header("prefer", "wait=20")
            .json(&json!({}));
        tokio::spawn(async move { req.send().await.map(|r| r.status()) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    type Probe = (
        &'static str,
        &'static str,
        reqwest::RequestBuilder,
        &'static str,
    );
    // Three steps waiting for their callbacks: one completed, one failed, one kept alive.
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let id = api.start_saga("callback", json!({})).await;
        api.wait(&id, |s| s["steps"][0]["status"] == "WAITING")
            .await;
        tokens.push(fixtures::task_tokens(&id).remove(0));
    }
    let task = |token: &str, what: &str| format!("/v1/tasks/{token}/{what}");
    let forged = "0".repeat(tokens[0].len());
    let probes: Vec<Probe> = vec![
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.req(Method::POST, &task(&tokens[0], "complete"))
                .json(&json!({"output": {"paid": true}})),
            "200",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.req(Method::POST, &task(&tokens[0], "complete"))
                .json(&json!({"outputs": 1})),
            "400",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.anonymous(Method::POST, &task(&tokens[0], "complete"))
                .json(&json!({"output": 1})),
            "401",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            with(READ_ONLY, Method::POST, &task(&tokens[0], "complete"))
                .json(&json!({"output": 1})),
            "403",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.req(Method::POST, &task(&forged, "complete"))
                .json(&json!({"output": 1})),
            "404",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.req(Method::POST, &task(&tokens[0], "complete"))
                .json(&json!({"output": {"paid": false}})),
            "409",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.req(Method::POST, &task(&tokens[0], "complete"))
                .json(&big),
            "413",
        ),
        (
            "POST",
            "/v1/tasks/{token}/complete",
            api.req(Method::POST, &task(&tokens[0], "complete"))
                .header("content-type", "text/plain")
                .body("{}"),
            "415",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.req(Method::POST, &task(&tokens[1], "fail"))
                .json(&json!({"error": "declined", "retryable": false})),
            "200",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.req(Method::POST, &task(&tokens[1], "fail"))
                .json(&json!({"error": "x".repeat(1001)})),
            "400",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.anonymous(Method::POST, &task(&tokens[1], "fail"))
                .json(&json!({"error": "declined"})),
            "401",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            with(READ_ONLY, Method::POST, &task(&tokens[1], "fail"))
                .json(&json!({"error": "declined"})),
            "403",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.req(Method::POST, &task(&forged, "fail"))
                .json(&json!({"error": "declined"})),
            "404",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.req(Method::POST, &task(&tokens[0], "fail"))
                .json(&json!({"error": "declined"})),
            "409",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.req(Method::POST, &task(&tokens[1], "fail")).json(&big),
            "413",
        ),
        (
            "POST",
            "/v1/tasks/{token}/fail",
            api.req(Method::POST, &task(&tokens[1], "fail"))
                .header("content-type", "text/plain")
                .body("{}"),
            "415",
        ),
        (
            "POST",
            "/v1/tasks/{token}/heartbeat",
            api.req(Method::POST, &task(&tokens[2], "heartbeat")),
            "200",
        ),
        (
            "POST",
            "/v1/tasks/{token}/heartbeat",
            api.anonymous(Method::POST, &task(&tokens[2], "heartbeat")),
            "401",
        ),
        (
            "POST",
            "/v1/tasks/{token}/heartbeat",
            with(READ_ONLY, Method::POST, &task(&tokens[2], "heartbeat")),
            "403",
        ),
        (
            "POST",
            "/v1/tasks/{token}/heartbeat",
            api.req(Method::POST, &task(&forged, "heartbeat")),
            "404",
        ),
        (
            "POST",
            "/v1/tasks/{token}/heartbeat",
            api.req(Method::POST, &task(&tokens[0], "heartbeat")),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/s").json(&json!({})),
            "202",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/s")
                .header("prefer", "wait=20")
                .json(&json!({})),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/s")
                .header("content-type", "application/json")
                .body("{"),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.anonymous(Method::POST, "/v1/sagas/s").json(&json!({})),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/nope").json(&json!({})),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/stuck")
                .header("idempotency-key", "probe-in-progress")
                .json(&json!({})),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/s").json(&big),
            "413",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/s")
                .header("content-type", "text/plain")
                .body("{}"),
            "415",
        ),
        (
            "POST",
            "/v1/sagas/{saga}",
            api.req(Method::POST, "/v1/sagas/typed")
                .json(&json!({"order_id": 7})),
            "422",
        ),
        (
            "GET",
            "/v1/sagas/{saga}",
            api.req(Method::GET, &format!("/v1/sagas/{done}")),
            "200",
        ),
        (
            "GET",
            "/v1/sagas/{saga}",
            api.req(Method::GET, "/v1/sagas/not-a-uuid"),
            "400",
        ),
        (
            "GET",
            "/v1/sagas/{saga}",
            api.anonymous(Method::GET, &format!("/v1/sagas/{done}")),
            "401",
        ),
        (
            "GET",
            "/v1/sagas/{saga}",
            api.req(Method::GET, &format!("/v1/sagas/{unknown}")),
            "404",
        ),
        (
            "GET",
            "/v1/sagas",
            api.req(Method::GET, "/v1/sagas?status=COMPLETED"),
            "200",
        ),
        (
            "GET",
            "/v1/sagas",
            api.req(Method::GET, "/v1/sagas?limit=0"),
            "400",
        ),
        (
            "GET",
            "/v1/sagas",
            api.anonymous(Method::GET, "/v1/sagas"),
            "401",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/events",
            api.req(Method::GET, &format!("/v1/sagas/{done}/events")),
            "200",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/events",
            api.req(Method::GET, "/v1/sagas/x/events"),
            "400",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/events",
            api.anonymous(Method::GET, &format!("/v1/sagas/{done}/events")),
            "401",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/events",
            api.req(Method::GET, &format!("/v1/sagas/{unknown}/events")),
            "404",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/attempts",
            api.req(Method::GET, &format!("/v1/sagas/{unknown}/attempts")),
            "404",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/attempts",
            api.req(Method::GET, &format!("/v1/sagas/{done}/attempts")),
            "200",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/attempts",
            api.req(Method::GET, "/v1/sagas/x/attempts"),
            "400",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/attempts",
            api.anonymous(Method::GET, &format!("/v1/sagas/{done}/attempts")),
            "401",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/deliveries",
            api.req(Method::GET, &format!("/v1/sagas/{done}/deliveries")),
            "200",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/deliveries",
            api.req(Method::GET, "/v1/sagas/x/deliveries"),
            "400",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/deliveries",
            api.anonymous(Method::GET, &format!("/v1/sagas/{done}/deliveries")),
            "401",
        ),
        (
            "GET",
            "/v1/sagas/{saga}/deliveries",
            api.req(Method::GET, &format!("/v1/sagas/{unknown}/deliveries")),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/cancel",
            api.req(Method::POST, &format!("/v1/sagas/{running}/cancel")),
            "202",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/cancel",
            api.req(Method::POST, "/v1/sagas/x/cancel"),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/cancel",
            api.anonymous(Method::POST, &format!("/v1/sagas/{done}/cancel")),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/cancel",
            api.req(Method::POST, &format!("/v1/sagas/{unknown}/cancel")),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/cancel",
            api.req(Method::POST, &format!("/v1/sagas/{done}/cancel")),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, &signal(&approving))
                .header("idempotency-key", "probe-signal")
                .json(&json!({"approved": true})),
            "202",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, "/v1/sagas/x/signals/approval")
                .json(&json!({})),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.anonymous(Method::POST, &signal(&approving))
                .json(&json!({})),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, &signal(&unknown)).json(&json!({})),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, &signal(&approving))
                .json(&json!({"approved": false})),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, &signal(&approving)).json(&big),
            "413",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, &signal(&approving))
                .header("content-type", "text/plain")
                .body("{}"),
            "415",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            api.req(Method::POST, &signal(&approving))
                .header("idempotency-key", "probe-signal")
                .json(&json!({"approved": "later"})),
            "422",
        ),
        (
            "GET",
            "/v1/definitions",
            api.req(Method::GET, "/v1/definitions"),
            "200",
        ),
        (
            "GET",
            "/v1/definitions",
            api.anonymous(Method::GET, "/v1/definitions"),
            "401",
        ),
        (
            "GET",
            "/v1/counts",
            api.req(Method::GET, "/v1/counts"),
            "200",
        ),
        (
            "GET",
            "/v1/counts",
            api.anonymous(Method::GET, "/v1/counts"),
            "401",
        ),
        (
            "GET",
            "/v1/whoami",
            api.req(Method::GET, "/v1/whoami"),
            "200",
        ),
        (
            "GET",
            "/v1/whoami",
            api.anonymous(Method::GET, "/v1/whoami"),
            "401",
        ),
        (
            "GET",
            "/healthz",
            api.anonymous(Method::GET, "/healthz"),
            "200",
        ),
        ("GET", "/metrics", api.req(Method::GET, "/metrics"), "200"),
        (
            "GET",
            "/metrics",
            api.anonymous(Method::GET, "/metrics"),
            "401",
        ),
        (
            "GET",
            "/openapi.json",
            api.anonymous(Method::GET, "/openapi.json"),
            "200",
        ),
    ];
    // Every protected route refuses a token without its scope.
    let mut probes = probes;
    for (method, template, path, token) in [
        (
            "POST",
            "/v1/sagas/{saga}",
            "/v1/sagas/s".to_owned(),
            READ_ONLY,
        ),
        (
            "GET",
            "/v1/sagas/{saga}",
            format!("/v1/sagas/{done}"),
            START_ONLY,
        ),
        ("GET", "/v1/sagas", "/v1/sagas".to_owned(), START_ONLY),
        (
            "GET",
            "/v1/sagas/{saga}/events",
            format!("/v1/sagas/{done}/events"),
            START_ONLY,
        ),
        (
            "GET",
            "/v1/sagas/{saga}/attempts",
            format!("/v1/sagas/{done}/attempts"),
            START_ONLY,
        ),
        (
            "GET",
            "/v1/sagas/{saga}/deliveries",
            format!("/v1/sagas/{done}/deliveries"),
            START_ONLY,
        ),
        (
            "POST",
            "/v1/sagas/{saga}/cancel",
            format!("/v1/sagas/{done}/cancel"),
            READ_ONLY,
        ),
        (
            "POST",
            "/v1/sagas/{saga}/signals/{signal}",
            signal(&approving),
            READ_ONLY,
        ),
        (
            "GET",
            "/v1/definitions",
            "/v1/definitions".to_owned(),
            START_ONLY,
        ),
        ("GET", "/metrics", "/metrics".to_owned(), START_ONLY),
        ("GET", "/v1/counts", "/v1/counts".to_owned(), START_ONLY),
        ("POST", "/v1/sagas/{saga}/abort", abort(&done), READ_ONLY),
        ("POST", "/v1/sagas/{saga}/retry", retry(&done), READ_ONLY),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            mark(&done, "a"),
            READ_ONLY,
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            complete(&done, "a"),
            READ_ONLY,
        ),
        ("POST", "/v1/sagas/{saga}/fork", fork(&done), READ_ONLY),
        ("POST", "/v1/bulk", "/v1/bulk".to_owned(), READ_ONLY),
        ("GET", "/v1/bulk", "/v1/bulk".to_owned(), START_ONLY),
        (
            "GET",
            "/v1/bulk/{id}",
            format!("/v1/bulk/{some_id}"),
            START_ONLY,
        ),
        ("POST", "/v1/sagas/{saga}/pause", pause(&done), READ_ONLY),
        ("POST", "/v1/sagas/{saga}/resume", resume(&done), READ_ONLY),
        ("GET", "/v1/limits", "/v1/limits".to_owned(), START_ONLY),
        (
            "PUT",
            "/v1/limits/{name}",
            "/v1/limits/payout_running".to_owned(),
            READ_ONLY,
        ),
    ] {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        probes.push((
            method,
            template,
            with(token, m, &path).json(&json!({})),
            "403",
        ));
    }
    // The operator commands, bulk actions among them.
    let nothing = json!({"action": "abort", "filter": {"name": "no_such_saga"}, "reason": "probe"});
    let (status, _, job) = api.post("/v1/bulk", &nothing).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let job = format!("/v1/bulk/{}", job["id"].as_str().unwrap());
    let operator: Vec<Probe> = vec![
        (
            "POST",
            "/v1/bulk",
            api.req(Method::POST, "/v1/bulk").json(&nothing),
            "202",
        ),
        (
            "POST",
            "/v1/bulk",
            api.req(Method::POST, "/v1/bulk").json(
                &json!({"action": "abort", "filter": {}, "reason": "probe", "dry_run": true}),
            ),
            "200",
        ),
        (
            "POST",
            "/v1/bulk",
            api.req(Method::POST, "/v1/bulk").json(&json!({})),
            "400",
        ),
        (
            "POST",
            "/v1/bulk",
            api.anonymous(Method::POST, "/v1/bulk").json(&nothing),
            "401",
        ),
        (
            "POST",
            "/v1/bulk",
            api.req(Method::POST, "/v1/bulk")
                .json(&json!({"action": "abort", "filter": {}, "reason": "probe"})),
            "422",
        ),
        ("GET", "/v1/bulk", api.req(Method::GET, "/v1/bulk"), "200"),
        (
            "GET",
            "/v1/bulk",
            api.req(Method::GET, "/v1/bulk?limit=0"),
            "400",
        ),
        (
            "GET",
            "/v1/bulk",
            api.anonymous(Method::GET, "/v1/bulk"),
            "401",
        ),
        ("GET", "/v1/bulk/{id}", api.req(Method::GET, &job), "200"),
        (
            "GET",
            "/v1/bulk/{id}",
            api.req(Method::GET, "/v1/bulk/not-a-job"),
            "400",
        ),
        (
            "GET",
            "/v1/bulk/{id}",
            api.anonymous(Method::GET, &job),
            "401",
        ),
        (
            "GET",
            "/v1/bulk/{id}",
            api.req(Method::GET, &format!("/v1/bulk/{some_id}")),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/abort",
            api.req(Method::POST, &abort(&to_abort)).json(&reason),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/abort",
            api.req(Method::POST, &abort(&to_abort)).json(&json!({})),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/abort",
            api.anonymous(Method::POST, &abort(&to_abort)).json(&reason),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/abort",
            api.req(Method::POST, &abort(&unknown)).json(&reason),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/abort",
            api.req(Method::POST, &abort(&done)).json(&reason),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/retry",
            api.req(Method::POST, &retry(&to_retry)),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/retry",
            api.req(Method::POST, &retry("x")),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/retry",
            api.anonymous(Method::POST, &retry(&to_retry)),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/retry",
            api.req(Method::POST, &retry(&unknown)),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/retry",
            api.req(Method::POST, &retry(&done)),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            api.req(Method::POST, &mark(&undoing, "hold")).json(&reason),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            api.req(Method::POST, &mark("x", "hold")).json(&reason),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            api.anonymous(Method::POST, &mark(&undoing, "hold"))
                .json(&reason),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            api.req(Method::POST, &mark(&unknown, "hold")).json(&reason),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            api.req(Method::POST, &mark(&done, "a")).json(&reason),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/pause",
            api.req(Method::POST, &pause(&to_pause)).json(&reason),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/pause",
            api.req(Method::POST, &pause(&to_pause)).json(&json!({})),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/pause",
            api.anonymous(Method::POST, &pause(&to_pause)).json(&reason),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/pause",
            api.req(Method::POST, &pause(&unknown)).json(&reason),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/pause",
            api.req(Method::POST, &pause(&done)).json(&reason),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/resume",
            api.req(Method::POST, &resume(&to_pause)).json(&reason),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/resume",
            api.req(Method::POST, &resume(&to_pause)).json(&json!({})),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/resume",
            api.anonymous(Method::POST, &resume(&to_pause))
                .json(&reason),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/resume",
            api.req(Method::POST, &resume(&unknown)).json(&reason),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/resume",
            api.req(Method::POST, &resume(&done)).json(&reason),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            api.req(Method::POST, &complete(&to_complete, "await_approval"))
                .json(&json!({"output": {"approved": true}, "reason": "by phone"})),
            "200",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            api.req(Method::POST, &complete(&to_complete, "reserve"))
                .json(&reason),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            api.anonymous(Method::POST, &complete(&to_complete, "reserve"))
                .json(&json!({"output": 1, "reason": "probe"})),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            api.req(Method::POST, &complete(&done, "nope"))
                .json(&json!({"output": 1, "reason": "probe"})),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            api.req(Method::POST, &complete(&done, "a"))
                .json(&json!({"output": 1, "reason": "probe"})),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            api.req(Method::POST, &complete(&done, "a"))
                .json(&json!({"output": big, "reason": "probe"})),
            "413",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/steps/{step}/complete",
            roomy
                .req(Method::POST, &complete(&roomy_done, "a"))
                .json(&too_big),
            "422",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.req(Method::POST, &fork(&done)).json(&reason),
            "201",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.req(Method::POST, &fork("x")).json(&reason),
            "400",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.anonymous(Method::POST, &fork(&done)).json(&reason),
            "401",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.req(Method::POST, &fork(&unknown)).json(&reason),
            "404",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.req(Method::POST, &fork(&running))
                .json(&json!({"from_stage": "hang", "reason": "probe"})),
            "409",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.req(Method::POST, &fork(&done))
                .json(&json!({"input": big, "reason": "probe"})),
            "413",
        ),
        (
            "POST",
            "/v1/sagas/{saga}/fork",
            api.req(Method::POST, &fork(&done))
                .json(&json!({"from_stage": "nope", "reason": "probe"})),
            "422",
        ),
    ];
    probes.extend(operator);
    // Flow control: the limits, and an operator's change of one.
    let limit = |name: &str| format!("/v1/limits/{name}");
    probes.extend::<Vec<Probe>>(vec![
        (
            "GET",
            "/v1/limits",
            api.req(Method::GET, "/v1/limits"),
            "200",
        ),
        (
            "GET",
            "/v1/limits",
            api.anonymous(Method::GET, "/v1/limits"),
            "401",
        ),
        (
            "PUT",
            "/v1/limits/{name}",
            api.req(Method::PUT, &limit("payout_running"))
                .json(&json!({"limit": 40, "reason": "probe"})),
            "200",
        ),
        (
            "PUT",
            "/v1/limits/{name}",
            api.req(Method::PUT, &limit("payout_running"))
                .json(&json!({})),
            "400",
        ),
        (
            "PUT",
            "/v1/limits/{name}",
            api.anonymous(Method::PUT, &limit("payout_running"))
                .json(&json!({"limit": 40})),
            "401",
        ),
        (
            "PUT",
            "/v1/limits/{name}",
            api.req(Method::PUT, &limit("no_such_limit"))
                .json(&json!({"limit": 40})),
            "404",
        ),
        (
            "PUT",
            "/v1/limits/{name}",
            api.req(Method::PUT, &limit("bank"))
                .json(&json!({"limit": 40})),
            "422",
        ),
    ]);
    // Schedules: made (paused, so only the trigger fires it), read, acted on, deleted last.
    let sched = |rest: &str| format!("/v1/schedules/probe{rest}");
    let nightly = json!({"id": "probe", "saga": "s", "every": "1h", "paused": true});
    for (method, template, path, token) in [
        (
            "POST",
            "/v1/schedules",
            "/v1/schedules".to_owned(),
            READ_ONLY,
        ),
        (
            "GET",
            "/v1/schedules",
            "/v1/schedules".to_owned(),
            START_ONLY,
        ),
        ("GET", "/v1/schedules/{id}", sched(""), START_ONLY),
        ("DELETE", "/v1/schedules/{id}", sched(""), READ_ONLY),
        (
            "POST",
            "/v1/schedules/{id}/pause",
            sched("/pause"),
            READ_ONLY,
        ),
        (
            "POST",
            "/v1/schedules/{id}/resume",
            sched("/resume"),
            READ_ONLY,
        ),
        (
            "POST",
            "/v1/schedules/{id}/trigger",
            sched("/trigger"),
            READ_ONLY,
        ),
    ] {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        probes.push((method, template, with(token, m.clone(), &path), "403"));
        probes.push((method, template, api.anonymous(m, &path), "401"));
    }
    probes.extend::<Vec<Probe>>(vec![
        (
            "POST",
            "/v1/schedules",
            api.req(Method::POST, "/v1/schedules").json(&nightly),
            "201",
        ),
        (
            "POST",
            "/v1/schedules",
            api.req(Method::POST, "/v1/schedules").json(&nightly),
            "409",
        ),
        (
            "POST",
            "/v1/schedules",
            api.req(Method::POST, "/v1/schedules")
                .json(&json!({"id": "other", "every": "1h"})),
            "400",
        ),
        (
            "POST",
            "/v1/schedules",
            api.req(Method::POST, "/v1/schedules")
                .json(&json!({"id": "other", "saga": "no_such_saga", "every": "1h"})),
            "422",
        ),
        (
            "GET",
            "/v1/schedules",
            api.req(Method::GET, "/v1/schedules"),
            "200",
        ),
        (
            "GET",
            "/v1/schedules/{id}",
            api.req(Method::GET, &sched("")),
            "200",
        ),
        (
            "GET",
            "/v1/schedules/{id}",
            api.req(Method::GET, "/v1/schedules/nope"),
            "404",
        ),
        (
            "POST",
            "/v1/schedules/{id}/trigger",
            api.req(Method::POST, &sched("/trigger")),
            "200",
        ),
        (
            "POST",
            "/v1/schedules/{id}/trigger",
            api.req(Method::POST, "/v1/schedules/nope/trigger"),
            "404",
        ),
        (
            "POST",
            "/v1/schedules/{id}/resume",
            api.req(Method::POST, &sched("/resume")),
            "200",
        ),
        (
            "POST",
            "/v1/schedules/{id}/resume",
            api.req(Method::POST, "/v1/schedules/nope/resume"),
            "404",
        ),
        (
            "POST",
            "/v1/schedules/{id}/pause",
            api.req(Method::POST, &sched("/pause")),
            "200",
        ),
        (
            "POST",
            "/v1/schedules/{id}/pause",
            api.req(Method::POST, "/v1/schedules/nope/pause"),
            "404",
        ),
        (
            "DELETE",
            "/v1/schedules/{id}",
            api.req(Method::DELETE, &sched("")),
            "204",
        ),
        (
            "DELETE",
            "/v1/schedules/{id}",
            api.req(Method::DELETE, &sched("")),
            "404",
        ),
    ]);
    let mut seen: BTreeMap<(String, String), BTreeSet<u16>> = BTreeMap::new();
    for (method, template, req, want) in probes {
        let a = Api::send(req).await;
        let status = a.status.as_u16();
        assert_eq!(status.to_string(), want, "{method} {template}: {}", a.body);
        let documented = &ops[template][method];
        assert!(
            documented.contains(&status),
            "{method} {template} answered {status}, not in the document ({documented:?})"
        );
        seen.entry((template.to_owned(), method.to_owned()))
            .or_default()
            .insert(status);
    }
    waiting.abort();
    for (template, methods) in &ops {
        for (method, documented) in methods {
            let seen = seen
                .get(&(template.clone(), method.clone()))
                .cloned()
                .unwrap_or_default();
            for status in documented {
                if *status != 500 && *status != 503 {
                    assert!(
                        seen.contains(status),
                        "{method} {template} documents {status}, which no probe produced"
                    );
                }
            }
        }
    }
}

#[test]
fn the_committed_openapi_document_is_up_to_date() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    let generated = openapi_json();
    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date with the code: regenerate it with \
         `UPDATE_OPENAPI=1 cargo test -p saga-suite --test http openapi::the_committed_openapi_document_is_up_to_date` \
         and commit the result",
        path.display()
    );
}
