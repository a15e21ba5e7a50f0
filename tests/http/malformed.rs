//! Bad requests: every documented error of a start or a read, unknown routes and methods, and a
//! fuzz-ish pass of malformed requests, none of which may get a 5xx or create a saga.

use std::time::Duration;

use orchestrator::http::HttpConfig;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{assert_error, own};

#[tokio::test]
async fn every_error_is_json_and_invalid_starts_create_nothing() {
    // A server of its own: a small body limit, and it checks that no start created a saga.
    let api = own(HttpConfig {
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
        .request(
            Method::POST,
            "/v1/sagas/no_such_saga",
            Some(("application/json", b"{oops".to_vec())),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // Malformed JSON, empty body, wrong content type.
    let (status, _, body) = api
        .request(
            Method::POST,
            "/v1/sagas/typed",
            Some(("application/json", b"{\"order_id\": ".to_vec())),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, _, body) = api
        .request(
            Method::POST,
            "/v1/sagas/typed",
            Some(("application/json", Vec::new())),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, _, body) = api
        .request(
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

    // Unknown routes and methods (`/` leads to the console: see the console's tests).
    for path in [
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
        .request(
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
    let (status, _, body) = api.request(Method::PUT, "/v1/sagas", None).await;
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
    // A server of its own: it checks that no request created a saga.
    let api = own(HttpConfig::default()).await;
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
        let (status, headers, value) = api.request(method, &path, body).await;
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
