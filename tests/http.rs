//! The HTTP API over a real loopback socket: `serve` runs in a task on 127.0.0.1:0 and the tests
//! talk to it with reqwest, as a client would. Covers the happy paths of §4 of the specification,
//! every documented error (always JSON `{"error": {"code", "message"}}`), and a fuzz-ish pass of
//! malformed requests that must never produce a 5xx or a saga.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use orchestrator::http::{router, serve, HttpConfig};
use orchestrator::model::ListFilter;
use orchestrator::Store;
use reqwest::{Method, StatusCode};
use saga_dsl::SagaDefinition;
use saga_suite::{fixtures, registry_of, test_config, Journal, RunningEngine, TempDb};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The definitions every test server knows (from `saga_suite::fixtures`):
/// - `s`: two compensatable steps and a pivot, all succeed;
/// - `fails`: `b` fails permanently, so `a` is compensated;
/// - `typed`: declares the `Order` input type;
/// - `slow`: a slow compensatable step then a pivot (cancel while it runs);
/// - `slow_pivot`: a slow pivot first (cancel once it has started is refused).
fn definitions(journal: &Journal) -> Vec<SagaDefinition> {
    let slow = Duration::from_millis(600);
    vec![
        fixtures::succeeds(journal),
        fixtures::fails(journal),
        fixtures::typed(),
        fixtures::slow(slow),
        fixtures::slow_pivot(slow),
    ]
}

/// An engine and the HTTP API over one temporary database.
struct Api {
    base: String,
    client: reqwest::Client,
    store: Arc<dyn Store>,
    engine: RunningEngine,
    shutdown: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    _db: TempDb,
}

impl Api {
    async fn start(config: HttpConfig) -> Self {
        let db = TempDb::new();
        let stores = db.stores().await;
        let store = stores.log.clone();
        let journal = Journal::default();
        let engine = RunningEngine::start(
            store.clone(),
            registry_of(definitions(&journal)),
            test_config(),
        );
        engine.ready().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            router(engine.engine.clone(), config),
            shutdown.clone(),
        ));
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            store,
            engine,
            shutdown,
            server,
            _db: db,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends a request and returns the status, the headers and the body parsed as JSON.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = self.client.request(method, self.url(path));
        if let Some((content_type, bytes)) = body {
            if !content_type.is_empty() {
                req = req.header("content-type", content_type);
            }
            req = req.body(bytes);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{status}: body is not JSON ({e}): {:?}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        (status, headers, value)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (s, _, v) = self.send(Method::GET, path, None).await;
        (s, v)
    }

    async fn post(
        &self,
        path: &str,
        body: &Value,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        self.send(Method::POST, path, Some(("application/json", bytes)))
            .await
    }

    /// Starts a saga over HTTP and returns its id.
    async fn start_saga(&self, name: &str, input: Value) -> String {
        let (status, headers, body) = self.post(&format!("/v1/sagas/{name}"), &input).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let id = body["id"].as_str().unwrap().to_owned();
        assert_eq!(
            headers["location"].to_str().unwrap(),
            format!("/v1/sagas/{id}")
        );
        id
    }

    /// Polls `GET /v1/sagas/{id}` until `until` holds; panics after 20 s.
    async fn wait(&self, id: &str, until: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (status, saga) = self.get(&format!("/v1/sagas/{id}")).await;
            assert_eq!(status, StatusCode::OK, "{saga}");
            if until(&saga) {
                return saga;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "saga {id} did not settle: {saga:#}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_status(&self, id: &str, status: &str) -> Value {
        self.wait(id, |s| s["status"] == status).await
    }

    async fn saga_count(&self) -> usize {
        let filter = ListFilter {
            limit: 1000,
            ..ListFilter::default()
        };
        self.store.list_sagas(&filter).await.unwrap().sagas.len()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
        self.engine.stop().await;
    }
}

/// Asserts the API's error shape and returns the message.
fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) -> String {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{body}");
    message.to_owned()
}

#[tokio::test]
async fn start_answers_202_with_location_and_the_saga_completes() {
    let api = Api::start(HttpConfig::default()).await;
    let (status, headers, body) = api.post("/v1/sagas/s", &json!({"x": 1})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["name"], "s");
    // A free worker took it at once.
    assert_eq!(body["status"], "RUNNING");
    let id = body["id"].as_str().unwrap();
    let location = headers["location"].to_str().unwrap();
    assert_eq!(location, format!("/v1/sagas/{id}"));
    assert!(headers.contains_key("x-request-id"));

    let done = api.wait(id, |s| s["status"] == "COMPLETED").await;
    assert_eq!(done["id"], id);
    assert_eq!(done["version"], 1);
    assert_eq!(done["input"], json!({"x": 1}));
    assert_eq!(done["needs_attention"], false);
    assert_eq!(done["blocked"], false);
    assert!(done["created_at"].as_str().unwrap().ends_with('Z'));
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert!(steps
        .iter()
        .all(|s| s["status"] == "SUCCEEDED" && s["attempts"] == 1));
    assert_eq!(steps[2]["kind"], "pivot");
    assert_eq!(steps[2]["compensation"]["status"], "NONE");
    // The Location header is the URL to poll.
    let (status, by_location) = api.get(location).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(by_location, done);

    // A body without any content type is accepted as JSON.
    let (status, _, body) = api
        .send(Method::POST, "/v1/sagas/s", Some(("", b"{}".to_vec())))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    api.stop().await;
}

#[tokio::test]
async fn compensated_saga_shows_each_steps_compensation_and_its_events() {
    let api = Api::start(HttpConfig::default()).await;
    let id = api.start_saga("fails", json!({})).await;
    let saga = api.wait_status(&id, "COMPENSATED").await;
    assert!(saga["error"]
        .as_str()
        .unwrap()
        .contains("scripted permanent failure"));
    let steps = &saga["steps"];
    assert_eq!(steps[0]["status"], "SUCCEEDED");
    assert_eq!(steps[0]["compensation"]["status"], "SUCCEEDED");
    assert_eq!(steps[0]["compensation"]["attempts"], 1);
    assert_eq!(steps[1]["status"], "FAILED");
    assert_eq!(steps[1]["last_error"], "scripted permanent failure");
    assert_eq!(steps[1]["compensation"]["status"], "PENDING");
    assert_eq!(steps[2]["status"], "PENDING");

    let (status, body) = api.get(&format!("/v1/sagas/{id}/events")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = body["events"].as_array().unwrap();
    assert_eq!(events[0]["type"], "saga.started");
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events.last().unwrap()["type"], "saga.compensated");
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(events
        .iter()
        .any(|e| e["type"] == "step.compensated" && e["step"] == "a"));
    assert!(events
        .iter()
        .any(|e| e["type"] == "step.failed" && e["step"] == "b"));

    // Events of an unknown saga are 404, not an empty list.
    let (status, body) = api
        .get("/v1/sagas/0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60/events")
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    api.stop().await;
}

#[tokio::test]
async fn list_filters_by_status_and_name_and_pages_with_a_cursor() {
    let api = Api::start(HttpConfig::default()).await;
    let mut completed = Vec::new();
    for i in 0..3 {
        completed.push(api.start_saga("s", json!({"i": i})).await);
    }
    let failed = api.start_saga("fails", json!({})).await;
    for id in &completed {
        api.wait_status(id, "COMPLETED").await;
    }
    api.wait_status(&failed, "COMPENSATED").await;

    let (status, page) = api.get("/v1/sagas?status=COMPLETED&limit=2").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let ids: Vec<&str> = page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    // Newest first (ids are UUIDv7, so they sort by creation time).
    assert_eq!(ids, [completed[2].as_str(), completed[1].as_str()]);
    assert!(page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["status"] == "COMPLETED"));
    let cursor = page["next_cursor"].as_str().unwrap();
    let (status, page2) = api
        .get(&format!(
            "/v1/sagas?status=COMPLETED&limit=2&cursor={cursor}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{page2}");
    assert_eq!(page2["sagas"].as_array().unwrap().len(), 1);
    assert_eq!(page2["sagas"][0]["id"], completed[0].as_str());
    assert_eq!(page2["next_cursor"], Value::Null);

    let (_, all) = api.get("/v1/sagas").await;
    assert_eq!(all["sagas"].as_array().unwrap().len(), 4);
    assert_eq!(all["next_cursor"], Value::Null);
    // Lower case is accepted; the wire form stays upper case.
    let (_, compensated) = api.get("/v1/sagas?status=compensated").await;
    assert_eq!(compensated["sagas"].as_array().unwrap().len(), 1);
    assert_eq!(compensated["sagas"][0]["status"], "COMPENSATED");
    let (_, by_name) = api.get("/v1/sagas?name=fails&status=").await;
    assert_eq!(by_name["sagas"][0]["id"], failed.as_str());
    assert_eq!(by_name["sagas"].as_array().unwrap().len(), 1);

    let (status, body) = api.get("/v1/sagas?status=DONE").await;
    let message = assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        message.contains("COMPENSATING") && message.contains("QUEUED"),
        "{message}"
    );
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=-3",
        "limit=ten",
        "cursor=not-a-uuid",
        "needs_attention=maybe",
        "colour=blue",
        "limit=1&limit=2",
    ] {
        let (status, body) = api.get(&format!("/v1/sagas?{bad}")).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, page) = api.get("/v1/sagas?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    api.stop().await;
}

#[tokio::test]
async fn cancel_is_accepted_while_running_and_refused_when_too_late() {
    let api = Api::start(HttpConfig::default()).await;

    // Cancel while the first (compensatable) step runs: it finishes, then compensates.
    let id = api.start_saga("slow", json!({})).await;
    api.wait(&id, |s| s["steps"][0]["status"] == "RUNNING")
        .await;
    let (status, _, body) = api
        .send(Method::POST, &format!("/v1/sagas/{id}/cancel"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["cancel"], "accepted");
    let saga = api.wait_status(&id, "COMPENSATED").await;
    assert_eq!(saga["steps"][0]["compensation"]["status"], "SUCCEEDED");
    assert_eq!(saga["steps"][1]["status"], "PENDING");

    // Terminal: 409.
    let (status, _, body) = api
        .send(Method::POST, &format!("/v1/sagas/{id}/cancel"), None)
        .await;
    let message = assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(message.contains("COMPENSATED"), "{message}");

    let done = api.start_saga("s", json!({})).await;
    api.wait_status(&done, "COMPLETED").await;
    let (status, _, body) = api
        .send(Method::POST, &format!("/v1/sagas/{done}/cancel"), None)
        .await;
    let message = assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(message.contains("COMPLETED"), "{message}");

    // Past the pivot: 409 with a clear reason, and the saga runs on to completion.
    let pivot = api.start_saga("slow_pivot", json!({})).await;
    api.wait(&pivot, |s| s["pivot_reached"] == true).await;
    let (status, _, body) = api
        .send(Method::POST, &format!("/v1/sagas/{pivot}/cancel"), None)
        .await;
    let message = assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(message.contains("point of no return"), "{message}");
    api.wait_status(&pivot, "COMPLETED").await;

    // Unknown and malformed ids.
    let (status, _, body) = api
        .send(
            Method::POST,
            "/v1/sagas/0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60/cancel",
            None,
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, _, body) = api.send(Method::POST, "/v1/sagas/nope/cancel", None).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    api.stop().await;
}

#[tokio::test]
async fn every_error_is_json_and_invalid_starts_create_nothing() {
    let api = Api::start(HttpConfig {
        body_limit: 1024,
        ..HttpConfig::default()
    })
    .await;

    // Unknown and malformed ids.
    let (status, body) = api
        .get("/v1/sagas/0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60")
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, body) = api.get("/v1/sagas/not-a-uuid").await;
    let message = assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(message.contains("not-a-uuid"), "{message}");

    // Unknown definition, whatever the body.
    let (status, _, body) = api.post("/v1/sagas/no_such_saga", &json!({})).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, _, body) = api
        .send(
            Method::POST,
            "/v1/sagas/no_such_saga",
            Some(("application/json", b"{oops".to_vec())),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // Malformed JSON, empty body, wrong content type.
    let (status, _, body) = api
        .send(
            Method::POST,
            "/v1/sagas/typed",
            Some(("application/json", b"{\"order_id\": ".to_vec())),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, _, body) = api
        .send(
            Method::POST,
            "/v1/sagas/typed",
            Some(("application/json", Vec::new())),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, _, body) = api
        .send(
            Method::POST,
            "/v1/sagas/typed",
            Some(("text/plain", br#"{"order_id": "o1", "amount": 5}"#.to_vec())),
        )
        .await;
    assert_error(
        status,
        &body,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );

    // Well-formed JSON of the wrong type: 422, and nothing is created.
    for input in [
        json!({"order_id": 1, "amount": 5}),
        json!({"order_id": "o1"}),
        json!([1, 2, 3]),
        json!("o1"),
        json!({"order_id": "o1", "amount": 1e300}),
    ] {
        let (status, _, body) = api.post("/v1/sagas/typed", &input).await;
        assert_error(
            status,
            &body,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        );
    }

    // Over the (small) body limit: 413, with the limit in the message.
    let big = json!({"order_id": "x".repeat(4096), "amount": 1});
    let (status, _, body) = api.post("/v1/sagas/typed", &big).await;
    let message = assert_error(
        status,
        &body,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    assert!(message.contains("1024"), "{message}");

    let (_, page) = api.get("/v1/sagas").await;
    assert_eq!(page["sagas"], json!([]), "invalid starts created sagas");
    assert_eq!(api.saga_count().await, 0);

    // Unknown routes and methods.
    for path in [
        "/",
        "/v1",
        "/v1/sagas/",
        "/v2/sagas",
        "/v1/sagas/a/b/c",
        "/healthz/x",
    ] {
        let (status, body) = api.get(path).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    }
    let (status, headers, body) = api
        .send(
            Method::DELETE,
            "/v1/sagas/0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60",
            None,
        )
        .await;
    assert_error(
        status,
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    let allow = headers["allow"].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    assert!(headers.contains_key("x-request-id"));
    let (status, _, body) = api.send(Method::PUT, "/v1/sagas", None).await;
    assert_error(
        status,
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );

    // A valid start still works on this server.
    api.start_saga("typed", json!({"order_id": "o1", "amount": 5}))
        .await;
    assert_eq!(api.saga_count().await, 1);
    api.stop().await;
}

#[tokio::test]
async fn healthz_and_request_ids() {
    let api = Api::start(HttpConfig::default()).await;
    let (status, headers, body) = api.send(Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ok"}));
    let generated = headers["x-request-id"].to_str().unwrap();
    assert_eq!(generated.len(), 36, "{generated}");

    // A sane request id from a proxy is kept; another is replaced.
    let resp = api
        .client
        .get(api.url("/healthz"))
        .header("x-request-id", "lb-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "lb-1234");
    let resp = api
        .client
        .get(api.url("/healthz"))
        .header("x-request-id", "evil id <script>")
        .send()
        .await
        .unwrap();
    assert_ne!(resp.headers()["x-request-id"], "evil id <script>");
    api.stop().await;
}

/// A small deterministic PRNG (xorshift64*), so a failing case can be reproduced.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// Text assembled from JSON-ish tokens: mostly malformed, now and then valid.
    fn jsonish(&mut self) -> Vec<u8> {
        const TOKENS: &[&str] = &[
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            "\"order_id\"",
            "\"amount\"",
            "\"x\"",
            "1",
            "-0",
            "1e999",
            "null",
            "true",
            "fals",
            "\"\\u0000\"",
            "\"\\ud800\"",
            " ",
            "\n",
            "\"",
            "\\",
            "NaN",
            "Infinity",
            "0x10",
            "'",
            "/*",
            "𝄞",
        ];
        let n = self.below(40);
        (0..n).flat_map(|_| self.pick(TOKENS).bytes()).collect()
    }

    fn percent_encoded(&mut self, max: usize) -> String {
        self.bytes(max)
            .iter()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (*b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }
}

/// One request of the fuzz test: method, path and query, optional content type and body.
type Case = (Method, String, Option<(&'static str, Vec<u8>)>);

/// Bodies a hostile or broken client might send to `POST /v1/sagas/typed`.
fn nasty_bodies() -> Vec<Vec<u8>> {
    let deep_array = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_object = format!("{}1{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
    let unbalanced = "[".repeat(10_000);
    vec![
        deep_array.into_bytes(),
        deep_object.into_bytes(),
        unbalanced.into_bytes(),
        b"1e999999".to_vec(),
        b"-1e400".to_vec(),
        "9".repeat(5000).into_bytes(),
        br#"{"order_id": "o", "amount": 1e400}"#.to_vec(),
        br#"{"order_id": "o", "amount": 99999999999999999999999}"#.to_vec(),
        br#"{"order_id": "o", "amount": 1.5}"#.to_vec(),
        b"{\"order_id\": \"\xff\xfe\", \"amount\": 1}".to_vec(),
        vec![0xef, 0xbb, 0xbf, b'{', b'}'],
        b"\0\0\0\0".to_vec(),
        b"null".to_vec(),
        br#"{"order_id": "'; DROP TABLE sagas; --", "amount": "1 OR 1=1"}"#.to_vec(),
        br#"{"order_id": "o", "amount": 1} trailing"#.to_vec(),
    ]
}

#[tokio::test]
async fn malformed_requests_never_get_a_5xx_nor_create_a_saga() {
    let api = Api::start(HttpConfig::default()).await;
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut cases: Vec<Case> = Vec::new();
    for body in nasty_bodies() {
        cases.push((
            Method::POST,
            "/v1/sagas/typed".into(),
            Some(("application/json", body)),
        ));
    }
    let sql = [
        "name=%27%20OR%201%3D1%20--",
        "status=COMPLETED%27%20OR%20%271%27%3D%271",
        "limit=1%3BDROP%20TABLE%20sagas",
        "cursor=%27%20UNION%20SELECT%20*%20FROM%20sagas%20--",
        "name=%00",
        "name=%FF%FE",
        "status=%FF",
        "limit=99999999999999999999999",
        "limit=1e3",
        "cursor=00000000-0000-0000-0000-000000000000",
        "%FF=1",
        "name",
        "&&&",
    ];
    for q in sql {
        cases.push((Method::GET, format!("/v1/sagas?{q}"), None));
    }
    let methods = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ];
    let content_types = [
        "application/json",
        "",
        "text/plain",
        "application/json; charset=utf-8",
    ];
    while cases.len() < 200 {
        let method = methods[rng.below(methods.len())].clone();
        let content_type = rng.pick(&content_types);
        let case = match rng.below(6) {
            0 => (
                Method::POST,
                "/v1/sagas/typed".to_owned(),
                Some((content_type, rng.bytes(2000))),
            ),
            1 => (
                Method::POST,
                "/v1/sagas/typed".to_owned(),
                Some((content_type, rng.jsonish())),
            ),
            2 => (
                method,
                format!("/v1/sagas/{}", rng.percent_encoded(40)),
                None,
            ),
            3 => {
                let tail = rng.pick(&["events", "cancel", "", "x"]);
                (
                    method,
                    format!("/v1/sagas/{}/{tail}", rng.percent_encoded(40)),
                    None,
                )
            }
            4 => (
                method,
                format!("/{}?{}", rng.percent_encoded(20), rng.percent_encoded(40)),
                Some((content_type, rng.bytes(200))),
            ),
            _ => (
                Method::GET,
                format!(
                    "/v1/sagas?{}={}",
                    rng.pick(&["status", "name", "limit", "cursor"]),
                    rng.percent_encoded(30)
                ),
                None,
            ),
        };
        cases.push(case);
    }

    let mut seen = std::collections::BTreeMap::<u16, usize>::new();
    for (method, path, body) in cases {
        let shown = format!("{method} {path}");
        let (status, headers, value) = api.send(method, &path, body).await;
        *seen.entry(status.as_u16()).or_default() += 1;
        assert!(!status.is_server_error(), "{shown} -> {status}: {value}");
        assert!(headers.contains_key("x-request-id"), "{shown}");
        if status.is_client_error() {
            assert!(
                value["error"]["code"].is_string(),
                "{shown} -> {status}: {value}"
            );
        }
    }

    eprintln!("statuses of the fuzz cases: {seen:?}");
    for expected in [400, 404, 405, 415, 422] {
        assert!(seen.contains_key(&expected), "no {expected} among {seen:?}");
    }

    // Raw bytes that are not even valid HTTP: hyper refuses them before the router; the server
    // must stay up and answer no 5xx.
    let addr = api.base.trim_start_matches("http://").to_owned();
    for raw in [
        b"GET /v1/sagas/\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        b"POST /v1/sagas/typed HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n\xff\xfe\xfd\xfc\xfb".to_vec(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
    ] {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(&raw).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        let head = String::from_utf8_lossy(&answer);
        eprintln!("raw request answered: {:?}", head.lines().next());
        assert!(!head.starts_with("HTTP/1.1 5"), "{head}");
    }

    assert_eq!(
        api.saga_count().await,
        0,
        "an invalid request created a saga"
    );
    let (status, body) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    api.stop().await;
}
