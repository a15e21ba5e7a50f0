//! Discovery (SPEC §8) over real loopback sockets, on the example sagas: `GET /v1/definitions`
//! (its exact shape, the input schemas, auth), the served OpenAPI document with one start route
//! per saga whose body references its input schema (and every `$ref` of it resolving), `422`
//! messages that name the field path, and `saga definitions` against a real
//! `example-sagas serve` process.
//!
//! The binary tests need `target/debug/saga` and `target/debug/example-sagas`: run
//! `cargo build --workspace --bins` first (scripts/test.sh does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use example_sagas::shop::Shop;
use orchestrator::client::{ClientError, SagaClient};
use orchestrator::http::{openapi_json, openapi_json_for, HttpConfig};
use orchestrator::model::{DefinitionList, ListFilter};
use reqwest::StatusCode;
use saga_dsl::Registry;
use saga_suite::api::{Api, Harness};
use saga_suite::{bin_path, Server, TempDb};
use serde_json::{json, Value};

const TOKEN: &str = "discovery-token-0123456789";

/// The example registry (`place_order`, `book_trip`, `fulfil_order`, `payout`) over the shop
/// database in `dir`.
async fn example_registry(dir: &std::path::Path) -> Registry {
    let shop = Shop::open(&format!("sqlite://{}", dir.join("shop.db").display()))
        .await
        .unwrap();
    example_sagas::registry(Arc::new(shop)).unwrap()
}

/// The example sagas over a fresh database (their shop database in its directory) and the HTTP
/// API over them, wanting `token` if given.
async fn start(token: Option<&str>) -> (Harness, Api) {
    let db = TempDb::new();
    let registry = example_registry(db.dir.path()).await;
    let harness = Harness::on(db, registry).await;
    let config = HttpConfig {
        api_token: token.map(str::to_owned),
        ..HttpConfig::default()
    };
    let api = harness.serve(config).await;
    (harness, api)
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Every `$ref` in `doc` that does not resolve inside `doc` (only local references are
/// allowed here: the document must stand alone).
fn unresolved_refs(doc: &Value) -> Vec<String> {
    fn walk(node: &Value, doc: &Value, bad: &mut Vec<String>, seen: &mut usize) {
        match node {
            Value::Object(map) => {
                for (k, v) in map {
                    if k == "$ref" {
                        *seen += 1;
                        let target = v.as_str().and_then(|r| r.strip_prefix('#'));
                        if target.and_then(|p| doc.pointer(p)).is_none() {
                            bad.push(v.to_string());
                        }
                    } else {
                        walk(v, doc, bad, seen);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, doc, bad, seen)),
            _ => {}
        }
    }
    let (mut bad, mut seen) = (Vec::new(), 0);
    walk(doc, doc, &mut bad, &mut seen);
    assert!(seen > 0, "the document has no references at all");
    bad
}

/// Follows a local `$ref` in `doc`.
fn resolve<'a>(doc: &'a Value, reference: &Value) -> &'a Value {
    let pointer = reference.as_str().unwrap().strip_prefix('#').unwrap();
    doc.pointer(pointer)
        .unwrap_or_else(|| panic!("{reference} does not resolve"))
}

#[tokio::test]
async fn definitions_list_every_example_saga_with_its_stages_and_input_schema() {
    let (h, api) = start(None).await;
    let (status, body) = api.get("/v1/definitions").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(keys(&body), BTreeSet::from(["definitions"]));
    let defs = body["definitions"].as_array().unwrap();
    // By name, then version.
    let names: Vec<&str> = defs.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["book_trip", "fulfil_order", "payout", "place_order"]
    );
    let registry = example_registry(h.db.dir.path()).await;
    for d in defs {
        assert_eq!(
            keys(d),
            BTreeSet::from(["name", "version", "hash", "stages", "input_schema", "attrs"]),
            "{d}"
        );
        let def = registry.latest(d["name"].as_str().unwrap()).unwrap();
        assert_eq!(d["version"], def.version());
        let attrs: Vec<&str> = def.attr_names().collect();
        assert_eq!(d["attrs"], json!(attrs));
        assert_eq!(d["hash"], def.hash());
        for stage in d["stages"].as_array().unwrap() {
            assert_eq!(keys(stage), BTreeSet::from(["name", "kind"]), "{stage}");
        }
    }
    let book_trip = &defs[0];
    assert_eq!(
        book_trip["stages"],
        json!([
            {"name": "book_flight", "kind": "compensatable"},
            {"name": "book_hotel", "kind": "compensatable"},
            {"name": "rent_car", "kind": "compensatable"},
            {"name": "charge_and_confirm", "kind": "pivot"},
            {"name": "send_itinerary", "kind": "retriable"},
        ])
    );
    assert_eq!(
        book_trip["input_schema"]["required"],
        json!(["trip_id", "traveller"])
    );

    assert_eq!(
        defs[1]["stages"],
        json!([
            {"name": "reserve_items", "kind": "parallel"},
            {"name": "charge_payment", "kind": "compensatable"},
            {"name": "await_approval", "kind": "signal"},
            {"name": "cooling_off", "kind": "sleep"},
            {"name": "ship", "kind": "pivot"},
            {"name": "notify_customer", "kind": "retriable"},
        ])
    );
    assert_eq!(
        defs[2]["stages"],
        json!([
            {"name": "debit_balance", "kind": "compensatable"},
            {"name": "send_transfer", "kind": "pivot"},
            {"name": "notify_merchant", "kind": "retriable"},
        ])
    );
    assert_eq!(
        defs[2]["input_schema"]["required"],
        json!(["payout_id", "merchant", "amount"])
    );
    let place_order = &defs[3];
    assert_eq!(place_order["version"], 1);
    assert_eq!(
        place_order["stages"],
        json!([
            {"name": "reserve_stock", "kind": "compensatable"},
            {"name": "charge_payment", "kind": "compensatable"},
            {"name": "assign_rider", "kind": "compensatable"},
        ])
    );
    let schema = &place_order["input_schema"];
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["type"], "object");
    // `simulate` has a default, so it is not required.
    assert_eq!(schema["required"], json!(["order_id", "user", "amount"]));
    let props = &schema["properties"];
    assert_eq!(props["order_id"]["type"], "string");
    assert_eq!(props["user"]["type"], "string");
    assert_eq!(props["amount"]["type"], "integer");
    assert_eq!(props["amount"]["format"], "int64");
    // The nested type is a definition of the schema itself: the schema stands alone.
    let simulate = resolve(schema, &props["simulate"]["$ref"]);
    assert_eq!(simulate["type"], "object");
    assert_eq!(simulate["additionalProperties"], false);
    assert_eq!(simulate["properties"]["delay_ms"]["type"], "integer");
    assert_eq!(
        simulate["properties"]["fail_step"]["type"],
        json!(["string", "null"])
    );

    // The typed client reads the same answer.
    let client = SagaClient::new(&api.base, None).unwrap();
    let typed = client.definitions().await.unwrap();
    assert_eq!(
        typed,
        serde_json::from_value::<DefinitionList>(body.clone()).unwrap()
    );
    assert_eq!(
        typed.definitions[3].required_fields(),
        ["order_id", "user", "amount"]
    );
    api.stop().await;
}

#[tokio::test]
async fn definitions_need_the_token_when_the_server_has_one() {
    let (_h, api) = start(Some(TOKEN)).await;
    let anonymous = api
        .http
        .get(format!("{}/v1/definitions", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let challenge = anonymous.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer"), "{challenge}");
    let body: Value = anonymous.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let wrong = api
        .http
        .get(format!("{}/v1/definitions", api.base))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);

    let (status, body) = api.get("/v1/definitions").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["definitions"].as_array().unwrap().len(), 4);

    let with = SagaClient::new(&api.base, Some(TOKEN.to_owned())).unwrap();
    assert_eq!(with.definitions().await.unwrap().definitions.len(), 4);
    let without = SagaClient::new(&api.base, None).unwrap();
    match without.definitions().await {
        Err(e @ ClientError::Api { .. }) => {
            assert_eq!(e.status(), Some(401));
            assert_eq!(e.code(), Some("unauthorized"));
        }
        other => panic!("expected a 401, got {other:?}"),
    }
    api.stop().await;
}

#[tokio::test]
async fn the_served_openapi_document_has_a_start_route_per_saga_with_its_input_schema() {
    let (h, api) = start(Some(TOKEN)).await;
    // Open, like the generic document.
    let resp = api
        .http
        .get(format!("{}/openapi.json", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.unwrap();
    let registry = example_registry(h.db.dir.path()).await;
    assert_eq!(
        text,
        openapi_json_for(&registry),
        "GET /openapi.json is openapi_json_for(the engine's registry)"
    );
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(unresolved_refs(&doc), Vec::<String>::new());

    let generic = &doc["paths"]["/v1/sagas/{saga}"]["post"];
    assert_eq!(
        generic["operationId"], "start_saga",
        "the generic route stays"
    );
    assert!(doc["paths"]["/v1/definitions"]["get"].is_object());
    for (name, required) in [
        ("place_order", json!(["order_id", "user", "amount"])),
        ("book_trip", json!(["trip_id", "traveller"])),
        ("payout", json!(["payout_id", "merchant", "amount"])),
    ] {
        let path = format!("/v1/sagas/{name}");
        let item = &doc["paths"][&path];
        assert_eq!(keys(item), BTreeSet::from(["post"]), "{path}");
        let op = &item["post"];
        assert_eq!(op["operationId"], format!("start_{name}"));
        let schema_ref = &op["requestBody"]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(
            schema_ref,
            &json!(format!("#/components/schemas/{name}_input"))
        );
        let schema = resolve(&doc, schema_ref);
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], required);
        // The same answers and headers as the generic route, which on a server with sagas
        // links none (it starts none of them); each saga's own route links its answers to
        // the operations on the saga it started. No path parameter to fill.
        let mut answers = op["responses"].clone();
        for answer in answers.as_object_mut().unwrap().values_mut() {
            answer.as_object_mut().unwrap().remove("links");
        }
        assert_eq!(answers, generic["responses"]);
        assert!(generic["responses"]["202"].get("links").is_none());
        assert_eq!(
            op["responses"]["202"]["links"]["get_saga"]["parameters"]["saga"],
            "$response.body#/id"
        );
        let header_params: Vec<&Value> = generic["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] != "path")
            .collect();
        assert!(!header_params.is_empty());
        assert_eq!(
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            header_params
        );
        assert_eq!(op["security"], generic["security"]);
    }
    // `place_order`'s nested input type is a component of its own, referenced from the input.
    let input = &doc["components"]["schemas"]["place_order_input"];
    let simulate = resolve(&doc, &input["properties"]["simulate"]["$ref"]);
    assert_eq!(simulate["properties"]["delay_ms"]["type"], "integer");
    assert_eq!(input["properties"]["amount"]["type"], "integer");
    assert!(input.get("$defs").is_none() && input.get("$schema").is_none());

    // The registry-free document (docs/openapi.json) resolves too, and has no saga of its own.
    let generic_doc: Value = serde_json::from_str(&openapi_json()).unwrap();
    assert_eq!(unresolved_refs(&generic_doc), Vec::<String>::new());
    assert!(generic_doc["paths"].get("/v1/sagas/place_order").is_none());
    assert!(generic_doc["paths"]["/v1/definitions"]["get"].is_object());
    api.stop().await;
}

#[tokio::test]
async fn a_start_that_does_not_fit_the_input_names_the_field_path() {
    let (h, api) = start(None).await;
    let good = json!({"order_id": "o-1", "user": "ada", "amount": 1200});
    for (body, message) in [
        (
            json!({"order_id": "o-1", "user": "ada", "amount": "x"}),
            r#"amount: invalid type: string "x", expected i64"#,
        ),
        (
            json!({"order_id": "o-1", "user": "ada", "amount": 1, "simulate": {"delay_ms": "slow"}}),
            r#"simulate.delay_ms: invalid type: string "slow", expected u64"#,
        ),
        (
            json!({"order_id": "o-1", "user": "ada", "amount": 1,
                   "simulate": {"transient_failures": {"charge_payment": -1}}}),
            "simulate.transient_failures.charge_payment: invalid value: integer `-1`, expected u32",
        ),
        (
            json!({"order_id": "o-1", "amount": 1}),
            "missing field `user`",
        ),
        (
            json!("o-1"),
            r#"(root): invalid type: string "o-1", expected struct OrderInput"#,
        ),
    ] {
        let (status, _, answer) = api.post("/v1/sagas/place_order", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_input");
        let text = answer["error"]["message"].as_str().unwrap();
        assert!(
            text.contains(message),
            "{body}: the message {text:?} does not say {message:?}"
        );
    }
    // Refused starts created nothing; a fitting one still starts.
    let filter = ListFilter {
        limit: 10,
        ..ListFilter::default()
    };
    assert!(h
        .stores
        .log
        .list_sagas(&filter)
        .await
        .unwrap()
        .sagas
        .is_empty());
    let (status, _, answer) = api.post("/v1/sagas/place_order", &good).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    api.stop().await;
}

/// Runs the `saga` binary in `cwd` without inheriting the API's environment variables.
async fn saga_cli(
    cwd: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(bin_path("saga"));
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("SAGA_SERVER")
        .env_remove("SAGA_API_TOKEN")
        .env_remove("DATABASE_URL")
        .env_remove("COLUMNS")
        .env("RUST_LOG", "error");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test]
async fn saga_definitions_asks_a_real_server() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[("SAGA_API_TOKEN", TOKEN)], &[]).await;
    let base = server.base.as_str();
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();

    // `--json` prints the API's answer.
    let out = saga_cli(
        cwd,
        &["definitions", "--server", base, "--token", TOKEN, "--json"],
        &[],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let api: Value = reqwest::Client::new()
        .get(format!("{base}/v1/definitions"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(printed, api);
    let hash = |name: &str| {
        let d = api["definitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .unwrap();
        d["hash"].as_str().unwrap().to_owned()
    };

    // The table, with the token from the environment as `start` takes it.
    let out = saga_cli(
        cwd,
        &["definitions", "--server", base],
        &[("SAGA_API_TOKEN", TOKEN)],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let table = stdout(&out);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"))
            .to_owned()
    };
    let place_order = row("place_order");
    for part in [
        "reserve_stock → charge_payment → assign_rider",
        "order_id, user, amount",
        &hash("place_order")[..8],
    ] {
        assert!(place_order.contains(part), "{part:?} missing:\n{table}");
    }
    assert!(
        !place_order.contains(&hash("place_order")),
        "the hash is shortened:\n{table}"
    );
    let book_trip = row("book_trip");
    for part in [
        "book_flight → book_hotel → rent_car → charge_and_confirm (pivot) → send_itinerary \
         (retriable)",
        "trip_id, traveller",
        &hash("book_trip")[..8],
    ] {
        assert!(book_trip.contains(part), "{part:?} missing:\n{table}");
    }
    for header in ["NAME", "VERSION", "HASH", "STAGES", "REQUIRED INPUT"] {
        assert!(table.lines().nth(1).unwrap().contains(header), "{table}");
    }
    // By name: book_trip first.
    assert!(table.find("book_trip").unwrap() < table.find("place_order").unwrap());

    // Without the token: the server's refusal, on one line, exit 1.
    let out = saga_cli(cwd, &["definitions", "--server", base], &[]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: ") && err.contains("401"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // It asks the server only: no database was opened (or created) where it ran.
    assert_eq!(std::fs::read_dir(cwd).unwrap().count(), 0);
}
