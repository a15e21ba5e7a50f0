//! The OpenAPI document as an exact contract, case by case: what the document declares valid
//! the server takes, what it declares invalid the server refuses, and every answer is one the
//! document gives. `scripts/contract.sh` checks the same with generated requests (schemathesis);
//! these are the cases it once found, kept here by name.

use orchestrator::http::openapi_json_for;
use reqwest::{Method, StatusCode};
use saga_suite::api::Api;
use saga_suite::registry_of;
use serde_json::{json, Value};

use crate::{assert_error, definitions, shared};

/// The document a server of this binary's definitions serves.
fn served_document() -> Value {
    serde_json::from_str(&openapi_json_for(&registry_of(definitions()))).unwrap()
}

/// The parameter `name` of operation `method path` in `doc`.
fn parameter<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
}

#[tokio::test]
async fn a_start_takes_integral_numbers_as_the_integers_its_schema_says_they_are() {
    let api = shared();
    let doc = served_document();
    let amount = &doc["components"]["schemas"]["typed_input"]["properties"]["amount"];
    assert_eq!(amount["type"], "integer", "{amount}");
    // The bounds of the field's Rust type, which serde enforces.
    assert_eq!(amount["maximum"], json!(i64::MAX), "{amount}");
    assert_eq!(amount["minimum"], json!(i64::MIN), "{amount}");

    let id = api
        .start_saga("typed", json!({"order_id": "o-float", "amount": 4.0}))
        .await;
    let saga = api.wait(&id, |s| s["status"] == "COMPLETED").await;
    // Stored as the integer it is.
    assert_eq!(saga["input"]["amount"], json!(4), "{saga}");
    let a = api
        .start_raw("typed", r#"{"order_id": "o-exp", "amount": 1e3}"#, &[])
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);
    // Read exactly: a parser that rounds to a neighbouring double would make this one
    // -2207974657785919.25, a fraction, and refuse an integer.
    let id = api
        .start_saga(
            "typed",
            json!({"order_id": "o-exact", "amount": -2_207_974_657_785_919.0}),
        )
        .await;
    let saga = api.wait(&id, |s| s["status"] == "COMPLETED").await;
    assert_eq!(
        saga["input"]["amount"],
        json!(-2_207_974_657_785_919_i64),
        "{saga}"
    );

    // A fraction is still no integer, and a number past the type's bounds is refused as its
    // schema's maximum says.
    for body in [
        r#"{"order_id": "o-half", "amount": 4.5}"#,
        r#"{"order_id": "o-big", "amount": 1e19}"#,
        // One below `i64::MIN`: parsed as the double `i64::MIN` is, still refused.
        r#"{"order_id": "o-low", "amount": -9223372036854775809}"#,
        r#"{"order_id": "o-high", "amount": 9223372036854775808}"#,
    ] {
        let a = api.start_raw("typed", body, &[]).await;
        let message = assert_error(
            a.status,
            &a.body,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
        );
        assert!(message.contains("amount"), "{message}");
    }
}

#[tokio::test]
async fn get_and_options_on_a_start_route_are_405_allowing_post() {
    let api = shared();
    for method in [Method::GET, Method::OPTIONS, Method::PUT] {
        let a = Api::send(api.req(method.clone(), "/v1/sagas/typed")).await;
        let message = assert_error(
            a.status,
            &a.body,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        );
        assert_eq!(a.header("allow"), Some("POST"), "{method}");
        assert!(message.contains("POST"), "{message}");
    }
    // A path that names no definition is still a saga id.
    let (status, body) = api.get("/v1/sagas/not-a-uuid").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    // And the generic start route declares that it covers only the other names.
    let doc = served_document();
    let saga = parameter(&doc, "/v1/sagas/{saga}", "post", "saga");
    let excluded = saga["schema"]["not"]["enum"].as_array().unwrap();
    assert!(excluded.contains(&json!("typed")), "{saga}");
}

#[tokio::test]
async fn the_list_takes_exactly_the_forms_its_parameters_declare() {
    let api = shared();
    // Empty values stand for absent parameters, as the schemas' `""` alternatives say.
    let (status, body) = api
        .get("/v1/sagas?status=&cursor=&limit=&created_after=&needs_attention=&id_prefix=")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for good in [
        "status=completed",
        "needs_attention=1",
        "limit=7",
        "created_after=2026-12-24T18:00:00Z",
        "created_before=2026-12-24t18:00:00.5%2B01:00",
        "id_prefix=0190f5b4-7a3c",
        "cursor=0190F5B4-7A3C-7CC1-9F5E-2B8D3C4E5F60",
    ] {
        let (status, body) = api.get(&format!("/v1/sagas?{good}")).await;
        assert_eq!(status, StatusCode::OK, "{good}: {body}");
    }
    // Forms the server's parsers would take but the document's types do not have.
    for bad in [
        "limit=%2B5",
        "limit=007",
        "cursor=0190f5b47a3c7cc19f5e2b8d3c4e5f60",
        "cursor=%7B0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60%7D",
        "created_after=2026-12-24%2018:00:00Z",
    ] {
        let (status, body) = api.get(&format!("/v1/sagas?{bad}")).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let doc = served_document();
    let after = parameter(&doc, "/v1/sagas", "get", "created_after");
    assert_eq!(
        after["schema"]["anyOf"][0]["format"], "date-time",
        "{after}"
    );
    let cursor = parameter(&doc, "/v1/sagas", "get", "cursor");
    assert_eq!(cursor["schema"]["anyOf"][0]["format"], "uuid", "{cursor}");
    assert_eq!(
        cursor["schema"]["anyOf"][1]["enum"],
        json!([""]),
        "{cursor}"
    );
    // Saga ids in paths are hyphenated UUIDs too.
    let (status, body) = api.get("/v1/sagas/0190f5b47a3c7cc19f5e2b8d3c4e5f60").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
}

#[tokio::test]
async fn headers_the_document_calls_invalid_are_refused_and_none_is_nullable() {
    let api = shared();
    let doc = served_document();
    for (path, method, header) in [
        ("/v1/sagas/{saga}", "post", "Idempotency-Key"),
        ("/v1/sagas/typed", "post", "Idempotency-Key"),
        (
            "/v1/sagas/{saga}/signals/{signal}",
            "post",
            "Idempotency-Key",
        ),
        ("/v1/sagas/{saga}", "post", "Saga-Callback-Url"),
        ("/v1/sagas/{saga}", "post", "Saga-Callback-Secret"),
        ("/v1/sagas/{saga}", "post", "Saga-Start-At"),
        ("/v1/sagas/typed", "post", "Saga-Start-At"),
    ] {
        let p = parameter(&doc, path, method, header);
        assert!(p["schema"]["pattern"].is_string(), "{method} {path}: {p}");
        assert_eq!(p["schema"]["type"], "string", "{method} {path}: {p}");
    }

    let body = r#"{"order_id": "o-h", "amount": 1}"#;
    for (header, value) in [
        ("idempotency-key", ""),
        ("idempotency-key", "\"\""),
        ("saga-callback-url", "ftp://hooks.example/x"),
        ("saga-start-at", "2026-12-24 18:00:00Z"),
    ] {
        let a = api.start_raw("typed", body, &[(header, value)]).await;
        assert_error(a.status, &a.body, StatusCode::BAD_REQUEST, "bad_request");
    }
    // Each header well formed, the pair not: a secret signs nothing without a URL.
    let a = api
        .start_raw("typed", body, &[("saga-callback-secret", "s3cret")])
        .await;
    let message = assert_error(
        a.status,
        &a.body,
        StatusCode::UNPROCESSABLE_ENTITY,
        "callback_secret_without_url",
    );
    assert!(message.contains("Saga-Callback-Url"), "{message}");
}

/// `Saga-Start-At` is declared by a pattern (client generators cannot take a date-time
/// header): a value it matches is read as an instant, started or refused only for being past,
/// and any other is `400`.
#[tokio::test]
async fn a_start_at_is_read_exactly_when_its_pattern_matches() {
    let api = shared();
    let doc = served_document();
    let schema = &parameter(&doc, "/v1/sagas/typed", "post", "Saga-Start-At")["schema"];
    let pattern = regex::Regex::new(schema["pattern"].as_str().unwrap()).unwrap();
    let body = r#"{"order_id": "o-start-at", "amount": 1}"#;
    for (value, expected) in [
        ("2099-12-24T18:00:00Z", StatusCode::ACCEPTED),
        (
            "2096-02-29t23:59:60.123456789123+23:59",
            StatusCode::ACCEPTED,
        ),
        ("2400-02-29T00:00:00z", StatusCode::ACCEPTED),
        ("2099-01-01T00:00:00-00:30", StatusCode::ACCEPTED),
        ("2000-02-29T00:00:00Z", StatusCode::UNPROCESSABLE_ENTITY),
        (
            "1999-04-30T12:00:00.5-23:59",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        ("2100-02-29T00:00:00Z", StatusCode::BAD_REQUEST),
        ("2099-04-31T00:00:00Z", StatusCode::BAD_REQUEST),
        ("2099-00-10T00:00:00Z", StatusCode::BAD_REQUEST),
        ("2099-01-01T24:00:00Z", StatusCode::BAD_REQUEST),
        ("2099-01-01T00:60:00Z", StatusCode::BAD_REQUEST),
        ("2099-01-01T00:00:61Z", StatusCode::BAD_REQUEST),
        ("2099-01-01T00:00:00+24:00", StatusCode::BAD_REQUEST),
        ("2099-01-01T00:00:00+0100", StatusCode::BAD_REQUEST),
        ("2099-01-01 00:00:00Z", StatusCode::BAD_REQUEST),
        ("2099-01-01T00:00:00", StatusCode::BAD_REQUEST),
        ("2099-01-01T00:00:00.Z", StatusCode::BAD_REQUEST),
        ("2099-1-01T00:00:00Z", StatusCode::BAD_REQUEST),
    ] {
        let a = api
            .start_raw("typed", body, &[("saga-start-at", value)])
            .await;
        assert_eq!(a.status, expected, "{value}: {}", a.body);
        assert_eq!(
            pattern.is_match(value),
            expected != StatusCode::BAD_REQUEST,
            "the pattern and the server disagree on {value}"
        );
        if expected == StatusCode::UNPROCESSABLE_ENTITY {
            assert_error(a.status, &a.body, expected, "start_in_past");
        }
    }
}

#[tokio::test]
async fn a_reason_is_counted_as_sent_and_needs_more_than_white_space() {
    let api = shared();
    let id = api.start_saga("stuck", json!({})).await;
    let abort = format!("/v1/sagas/{id}/abort");
    let doc = served_document();
    let reason = &doc["components"]["schemas"]["OperatorReason"]["properties"]["reason"];
    assert_eq!(reason["maxLength"], 1000, "{reason}");
    assert!(reason["pattern"].is_string(), "{reason}");
    for bad in [
        String::new(),
        " \t\u{3000}".to_owned(),
        format!(" {} ", "x".repeat(999)),
    ] {
        let (status, _, body) = api.post(&abort, &json!({"reason": bad})).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, _, body) = api
        .post(&abort, &json!({"reason": format!(" {} ", "x".repeat(998))}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_start_links_its_answers_to_the_operations_on_its_saga() {
    let served = served_document();
    let generic: Value = serde_json::from_str(&orchestrator::http::openapi_json()).unwrap();
    // The generic document's start route, and each saga's own on a server that has sagas.
    for (doc, path) in [(&generic, "/v1/sagas/{saga}"), (&served, "/v1/sagas/typed")] {
        for status in ["200", "202"] {
            let links = &doc["paths"][path]["post"]["responses"][status]["links"];
            let get = &links["get_saga"];
            assert_eq!(get["operationId"], "get_saga", "{path} {status}: {links}");
            assert_eq!(get["parameters"]["saga"], "$response.body#/id");
            for (_, link) in links.as_object().unwrap() {
                let target = link["operationId"].as_str().unwrap();
                let found = doc["paths"].as_object().unwrap().values().any(|item| {
                    item.as_object()
                        .unwrap()
                        .values()
                        .any(|op| op["operationId"] == target)
                });
                assert!(found, "{path} {status} links to unknown {target}");
            }
        }
    }
    // On a server with sagas the generic route matches only names it does not have: it
    // starts nothing, so its answers link nowhere.
    for status in ["200", "202"] {
        let response = &served["paths"]["/v1/sagas/{saga}"]["post"]["responses"][status];
        assert!(response.get("links").is_none(), "{status}: {response}");
    }
}
