//! The HTTP API's outer layer over real loopback sockets: bearer auth, the OpenAPI document
//! (checked against the live router and against `docs/openapi.json`), Prometheus metrics,
//! `Prefer: wait`, the typed client and its one-key-per-start retries and `saga start` end to end.
//!
//! Regenerate the committed document with `UPDATE_OPENAPI=1 cargo test --test http_api`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orchestrator::client::{ClientError, SagaClient};
use orchestrator::http::{openapi_json, openapi_json_for, router_with_shutdown, serve, HttpConfig};
use orchestrator::model::{ListFilter, SagaStatus, StepStatus};
use orchestrator::Store;
use reqwest::{Method, StatusCode};
use saga_dsl::SagaDefinition;
use saga_suite::{
    bin_path, fixtures, registry_of, test_config, Journal, RunningEngine, Server, TempDb,
};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "test-token-0123456789";

/// - `s`: three steps that succeed; `fails`: `b` fails, `a` is compensated; `flaky`: `a` fails
///   once (retryable); `typed`: declares the `Order` input; `slow`: a 1.5 s step then a
///   pivot; `stuck`: a step that takes ten minutes (all from `saga_suite::fixtures`).
fn definitions() -> Vec<SagaDefinition> {
    let journal = Journal::default();
    vec![
        fixtures::succeeds(&journal),
        fixtures::fails(&journal),
        fixtures::flaky(&journal),
        fixtures::typed(),
        fixtures::slow(Duration::from_millis(1500)),
        fixtures::stuck(),
    ]
}

/// An engine and the HTTP API (built with `router_with_shutdown`) over one temporary database.
struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
    store: Arc<dyn Store>,
    _engine: RunningEngine,
    shutdown: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    _db: TempDb,
}

/// An answer: status, headers, and the body as JSON (or as a JSON string when it is not JSON).
struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Api {
    async fn start(config: HttpConfig) -> Self {
        let db = TempDb::new();
        let stores = db.stores().await;
        let store = stores.log.clone();
        let engine = RunningEngine::start(store.clone(), registry_of(definitions()), test_config());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let token = config.api_token.clone();
        let router = router_with_shutdown(engine.engine.clone(), config, shutdown.clone());
        let server = tokio::spawn(serve(listener, router, shutdown.clone()));
        Self {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            token,
            store,
            _engine: engine,
            shutdown,
            server,
            _db: db,
        }
    }

    async fn with_token() -> Self {
        Self::start(HttpConfig {
            api_token: Some(TOKEN.to_owned()),
            ..HttpConfig::default()
        })
        .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request carrying the server's token, if it has one.
    fn req(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, self.url(path));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// A request without credentials.
    fn anonymous(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path))
    }

    async fn send(req: reqwest::RequestBuilder) -> Answer {
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn start_saga(&self, name: &str, input: Value) -> String {
        let a = Self::send(
            self.req(Method::POST, &format!("/v1/sagas/{name}"))
                .json(&input),
        )
        .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        a.body["id"].as_str().unwrap().to_owned()
    }

    /// Starts a saga and waits (server side) for it to end.
    async fn run_saga(&self, name: &str) -> Value {
        let a = Self::send(
            self.req(Method::POST, &format!("/v1/sagas/{name}"))
                .header("prefer", "wait=20")
                .json(&json!({})),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        a.body
    }

    async fn saga_count(&self) -> usize {
        let filter = ListFilter {
            limit: 1000,
            ..ListFilter::default()
        };
        self.store.list_sagas(&filter).await.unwrap().sagas.len()
    }
}

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

// ---------------------------------------------------------------------------------------------
// Auth
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn with_a_token_every_v1_request_without_it_is_refused_and_nothing_is_created() {
    let api = Api::with_token().await;
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
    let saga = api
        .store
        .get_saga(id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
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
    let api = Api::start(HttpConfig::default()).await;
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

// ---------------------------------------------------------------------------------------------
// OpenAPI
// ---------------------------------------------------------------------------------------------

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
    let api = Api::start(HttpConfig {
        api_token: Some(TOKEN.to_owned()),
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

    // Every route of SPEC §4 is documented.
    for (method, path) in [
        ("POST", "/v1/sagas/{saga}"),
        ("GET", "/v1/sagas/{saga}"),
        ("GET", "/v1/sagas"),
        ("GET", "/v1/sagas/{saga}/events"),
        ("GET", "/v1/sagas/{saga}/deliveries"),
        ("POST", "/v1/sagas/{saga}/cancel"),
        ("GET", "/v1/definitions"),
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
    let unknown = uuid::Uuid::now_v7().to_string();
    let big = json!({"pad": "x".repeat(8192)});
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
    let probes: Vec<Probe> = vec![
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
         `UPDATE_OPENAPI=1 cargo test --test http_api the_committed_openapi_document_is_up_to_date` \
         and commit the result",
        path.display()
    );
}

// ---------------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------------

/// Whether some sample line of `metric` carries every `label="value"` pair given.
fn has_sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> bool {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .any(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
}

#[tokio::test]
async fn metrics_expose_the_saga_and_http_series() {
    let api = Api::with_token().await;
    assert_eq!(api.run_saga("s").await["status"], "COMPLETED");
    assert_eq!(api.run_saga("fails").await["status"], "COMPENSATED");
    assert_eq!(api.run_saga("flaky").await["status"], "COMPLETED");
    let a = Api::send(api.anonymous(Method::GET, "/v1/sagas")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    let a = Api::send(api.req(Method::GET, "/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.header("content-type").unwrap().starts_with("text/plain"));
    let text = a.body.as_str().unwrap().to_owned();
    let expect: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("saga_started_total", vec![("name", "s")]),
        (
            "saga_ended_total",
            vec![("name", "s"), ("status", "COMPLETED")],
        ),
        (
            "saga_ended_total",
            vec![("name", "fails"), ("status", "COMPENSATED")],
        ),
        (
            "saga_step_duration_seconds_bucket",
            vec![
                ("name", "s"),
                ("step", "a"),
                ("phase", "action"),
                ("outcome", "succeeded"),
            ],
        ),
        (
            "saga_step_duration_seconds_count",
            vec![("name", "fails"), ("step", "b"), ("outcome", "failed")],
        ),
        (
            "saga_step_retries_total",
            vec![("name", "flaky"), ("step", "a"), ("phase", "action")],
        ),
        (
            "saga_compensations_total",
            vec![("name", "fails"), ("step", "a")],
        ),
        ("saga_needs_attention", vec![]),
        (
            "http_requests_total",
            vec![
                ("method", "POST"),
                ("route", "/v1/sagas/{saga}"),
                ("status", "200"),
            ],
        ),
        (
            "http_requests_total",
            vec![("method", "GET"), ("route", "/v1/sagas"), ("status", "401")],
        ),
    ];
    for (metric, labels) in expect {
        assert!(
            has_sample(&text, metric, &labels),
            "no {metric} sample with {labels:?} in:\n{text}"
        );
    }
    // Raw paths never become labels (a label per saga id would explode the series count).
    assert!(!text.contains("route=\"/v1/sagas/0"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Prefer: wait
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn prefer_wait_answers_200_with_the_finished_saga() {
    let api = Api::start(HttpConfig::default()).await;
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
    let api = Api::start(HttpConfig {
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
    let api = Api::start(HttpConfig::default()).await;
    let id = api.start_saga("stuck", json!({})).await;
    let poll = {
        let req = api
            .req(Method::GET, &format!("/v1/sagas/{id}"))
            .header("prefer", "wait=60");
        tokio::spawn(async move { Api::send(req).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    api.shutdown.cancel();
    let a = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the long poll ended at shutdown")
        .unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(!status_of(&a.body).is_terminal(), "{}", a.body);
    tokio::time::timeout(Duration::from_secs(10), api.server)
        .await
        .expect("the server stopped")
        .unwrap()
        .unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(10));
}

/// The status of a saga object.
fn status_of(saga: &Value) -> SagaStatus {
    saga["status"].as_str().unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// The typed client
// ---------------------------------------------------------------------------------------------

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
    let api = Api::with_token().await;
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

// ---------------------------------------------------------------------------------------------
// Real processes: `saga start`
// ---------------------------------------------------------------------------------------------

/// Runs a binary with the given arguments, without inheriting the API's environment variables.
async fn run(bin: &str, args: &[&str], cwd: &std::path::Path) -> std::process::Output {
    tokio::process::Command::new(bin_path(bin))
        .args(args)
        .current_dir(cwd)
        .env_remove("SAGA_SERVER")
        .env_remove("SAGA_API_TOKEN")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn saga_start_goes_through_the_http_api() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[("SAGA_API_TOKEN", TOKEN)], &[]).await;
    let cwd = tempfile::tempdir().unwrap();
    let input = r#"{"order_id": "o-cli", "user": "ada", "amount": 1200}"#;

    // Started and waited for, as JSON: the saga object.
    let out = run(
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
    let out = run(
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
    let out = run(
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
        let out = run("saga", &all, cwd.path()).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expect), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    let out = run(
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
    let out = run(
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
