//! Search attributes (SPEC §17) through the HTTP API of an engine over a real database, on the
//! backend `SAGA_TEST_BACKEND` selects: written with the saga on every path that creates one
//! (a plain start, a keyed one, one with a callback, a scheduled one, a child, a fork), shown
//! by the detail and the list, found by `attr.NAME=VALUE` alone, with the other filters and a
//! page at a time, refused when malformed or too long (writing nothing), and selecting the
//! same sagas for a bulk action's dry run and for a purge.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use orchestrator::http::HttpConfig;
use orchestrator::retention::{purge_finished_before, PurgeOptions};
use orchestrator::webhooks::CallbackPolicy;
use reqwest::StatusCode;
use saga_dsl::{JsonSchema, SagaDefinition, Step, StepContext, StepError};
use saga_suite::api::{Api, Harness};
use saga_suite::registry_of;
use serde_json::{json, Value};

#[derive(serde::Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
#[allow(dead_code)] // Read by the attributes only.
struct Order {
    order_id: String,
    user: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    fail: bool,
}

async fn reserve(ctx: StepContext) -> Result<(), StepError> {
    if ctx.input::<Order>()?.fail {
        return Err(StepError::permanent("asked to fail"));
    }
    Ok(())
}

async fn release(_: StepContext) -> Result<(), StepError> {
    Ok(())
}

/// `order`: one step, attributes `order_id`, `user` and `note` (absent when the input has
/// none); `parent`: a child stage starting an `order` with its own input; `plain`: no
/// attributes.
fn registry() -> saga_dsl::Registry {
    let order = SagaDefinition::builder("order", 1)
        .input::<Order>()
        .attr("order_id", |o: &Order| o.order_id.clone())
        .attr("user", |o: &Order| o.user.clone())
        .attr("note", |o: &Order| o.note.clone())
        .step(Step::compensatable("reserve", reserve, release))
        .build()
        .unwrap();
    let parent = SagaDefinition::builder("parent", 1)
        .step(Step::child("child", "order", |ctx| {
            Ok(ctx.raw_input().clone())
        }))
        .build()
        .unwrap();
    let plain = SagaDefinition::builder("plain", 1)
        .step(Step::compensatable("reserve", release, release))
        .build()
        .unwrap();
    registry_of([order, parent, plain])
}

async fn api() -> Api {
    Harness::new(registry())
        .await
        .into_api(HttpConfig {
            callbacks: CallbackPolicy::new().allow("127.0.0.1"),
            ..HttpConfig::default()
        })
        .await
}

fn order(id: &str, user: &str) -> Value {
    json!({"order_id": id, "user": user})
}

/// The ids of `GET /v1/sagas?{query}`, every page followed.
async fn listed(api: &Api, query: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/sagas?{query}&cursor={c}"),
            None => format!("/v1/sagas?{query}"),
        };
        let (status, page) = api.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
        for s in page["sagas"].as_array().unwrap() {
            ids.push(s["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return ids,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_are_written_at_start_and_shown_by_the_detail_the_list_and_the_definitions() {
    let api = api().await;
    let id = api
        .start_saga(
            "order",
            json!({"order_id": "o-991", "user": "ada", "note": "gift"}),
        )
        .await;
    let saga = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(
        saga["attrs"],
        json!({"order_id": "o-991", "user": "ada", "note": "gift"})
    );
    // An absent value is left out; a definition without attributes shows `{}`.
    let without_note = api.start_saga("order", order("o-992", "ada")).await;
    let saga = api.wait_status(&without_note, "COMPLETED").await;
    assert_eq!(saga["attrs"], json!({"order_id": "o-992", "user": "ada"}));
    let plain = api.start_saga("plain", json!({})).await;
    assert_eq!(
        api.wait_status(&plain, "COMPLETED").await["attrs"],
        json!({})
    );

    let (status, page) = api.get("/v1/sagas?limit=10").await;
    assert_eq!(status, StatusCode::OK);
    let by_id = |id: &str| {
        page["sagas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        by_id(&id)["attrs"],
        json!({"order_id": "o-991", "user": "ada", "note": "gift"})
    );
    assert_eq!(by_id(&plain)["attrs"], json!({}));

    let (status, defs) = api.get("/v1/definitions").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<(String, Value)> = defs["definitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["name"].as_str().unwrap().to_owned(), d["attrs"].clone()))
        .collect();
    assert!(names.contains(&("order".to_owned(), json!(["order_id", "user", "note"]))));
    assert!(names.contains(&("plain".to_owned(), json!([]))));
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_that_creates_a_saga_writes_its_attributes() {
    let api = api().await;
    let attrs_of = |user: &str, id: &str| json!({"order_id": id, "user": user});

    let keyed = api
        .start_raw(
            "order",
            &order("k-1", "keyed").to_string(),
            &[("idempotency-key", "attrs-keyed-1")],
        )
        .await;
    assert_eq!(keyed.status, StatusCode::ACCEPTED, "{}", keyed.text);
    let keyed = keyed.json()["id"].as_str().unwrap().to_owned();

    let callback = api
        .start_raw(
            "order",
            &order("c-1", "callback").to_string(),
            &[("saga-callback-url", "http://127.0.0.1:9/hook")],
        )
        .await;
    assert_eq!(callback.status, StatusCode::ACCEPTED, "{}", callback.text);
    let callback = callback.json()["id"].as_str().unwrap().to_owned();

    let at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let scheduled = api
        .start_raw(
            "order",
            &order("s-1", "scheduled").to_string(),
            &[("saga-start-at", at.as_str())],
        )
        .await;
    assert_eq!(scheduled.status, StatusCode::ACCEPTED, "{}", scheduled.text);
    let scheduled = scheduled.json()["id"].as_str().unwrap().to_owned();

    let parent = api.start_saga("parent", order("p-1", "child")).await;
    let parent = api.wait_status(&parent, "COMPLETED").await;
    let child = parent["stages"][0]["child_id"].as_str().unwrap().to_owned();

    let failed = api
        .start_saga(
            "order",
            json!({"order_id": "f-1", "user": "forked", "fail": true}),
        )
        .await;
    api.wait_status(&failed, "COMPENSATED").await;
    let (status, _, fork) = api
        .post(
            &format!("/v1/sagas/{failed}/fork"),
            &json!({"input": {"order_id": "f-2", "user": "forked"}, "reason": "fixed"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{fork}");
    let fork = fork["id"].as_str().unwrap().to_owned();

    for (id, user, order_id) in [
        (&keyed, "keyed", "k-1"),
        (&callback, "callback", "c-1"),
        (&scheduled, "scheduled", "s-1"),
        (&child, "child", "p-1"),
        (&failed, "forked", "f-1"),
        (&fork, "forked", "f-2"),
    ] {
        let (status, saga) = api.get(&format!("/v1/sagas/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{saga}");
        assert_eq!(saga["attrs"], attrs_of(user, order_id), "{user}");
        assert_eq!(
            listed(&api, &format!("attr.order_id={order_id}")).await,
            vec![id.clone()],
            "{user}"
        );
    }
    // The parent's definition declares none: its input's fields are not attributes of its own.
    assert!(!listed(&api, "attr.user=child")
        .await
        .contains(&parent["id"].as_str().unwrap().to_owned()));
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_matches_every_attribute_given_combines_with_the_others_and_pages() {
    let api = api().await;
    let mut ada = Vec::new();
    for i in 0..7 {
        ada.push(
            api.start_saga("order", order(&format!("a-{i}"), "ada"))
                .await,
        );
        api.start_saga("order", order(&format!("g-{i}"), "grace"))
            .await;
        api.start_saga("plain", json!({"user": "ada"})).await;
    }
    let failed = api
        .start_saga(
            "order",
            json!({"order_id": "a-x", "user": "ada", "fail": true}),
        )
        .await;
    api.wait_status(&failed, "COMPENSATED").await;
    for id in &ada {
        api.wait_status(id, "COMPLETED").await;
    }
    ada.push(failed.clone());
    // Newest first, across pages of 3, each saga once.
    let mut newest_first = ada.clone();
    newest_first.sort();
    newest_first.reverse();
    assert_eq!(listed(&api, "attr.user=ada&limit=3").await, newest_first);
    assert_eq!(listed(&api, "attr.user=ada&limit=1000").await, newest_first);
    // Every attribute given must match.
    assert_eq!(
        listed(&api, "attr.user=ada&attr.order_id=a-3").await,
        vec![ada[3].clone()]
    );
    assert!(listed(&api, "attr.user=grace&attr.order_id=a-3")
        .await
        .is_empty());
    // With the other filters.
    assert_eq!(
        listed(&api, "attr.user=ada&status=COMPENSATED").await,
        vec![failed.clone()]
    );
    assert_eq!(
        listed(&api, "attr.user=ada&status=COMPLETED&name=order&limit=2")
            .await
            .len(),
        7
    );
    assert!(listed(&api, "attr.user=ada&name=plain").await.is_empty());
    let after = chrono::Utc::now() + chrono::Duration::hours(1);
    let after = after.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        listed(&api, &format!("attr.user=ada&created_after={after}"))
            .await
            .is_empty()
    );
    // A value nobody has; an attribute no definition declares.
    assert!(listed(&api, "attr.user=nobody").await.is_empty());
    assert!(listed(&api, "attr.colour=red").await.is_empty());
    // Percent-encoded values are compared decoded.
    let odd = api
        .start_saga("order", order("o/1 &x", "ada lovelace"))
        .await;
    assert_eq!(
        listed(&api, "attr.user=ada%20lovelace&attr.order_id=o%2F1%20%26x").await,
        vec![odd]
    );
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_attribute_parameter_is_a_400_with_a_json_error() {
    let api = api().await;
    for query in [
        "attr.=ada",
        "attr.User=ada",
        "attr.9user=ada",
        "attr.user-name=ada",
        "attr.user=ada&attr.user=grace",
        "colour=red",
    ] {
        let (status, body) = api.get(&format!("/v1/sagas?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{query}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().len() > 10,
            "{query}: {body}"
        );
    }
    // The other parameters are still checked as before.
    let (status, body) = api.get("/v1/sagas?attr.user=ada&status=SLEEPY").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_too_long_refuses_the_start_naming_the_attribute_and_writes_nothing() {
    let api = api().await;
    let long = "x".repeat(saga_dsl::MAX_ATTR_VALUE + 1);
    for headers in [
        &[][..],
        &[("idempotency-key", "too-long")][..],
        &[("saga-callback-url", "http://127.0.0.1:9/hook")][..],
    ] {
        let a = api
            .start_raw("order", &order("o-1", &long).to_string(), headers)
            .await;
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.text);
        let message = a.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("attribute user"), "{message}");
        assert!(message.contains("256"), "{message}");
    }
    assert_eq!(api.saga_count().await, 0);
    // At the bound it is taken.
    let at_bound = "x".repeat(saga_dsl::MAX_ATTR_VALUE);
    let id = api.start_saga("order", order("o-1", &at_bound)).await;
    assert_eq!(
        listed(&api, &format!("attr.user={at_bound}")).await,
        vec![id]
    );
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_filter_and_a_purge_by_attribute_select_the_sagas_the_list_does() {
    let harness = Harness::new(registry()).await;
    let store = harness.stores.log.clone();
    let api = harness.into_api(HttpConfig::default()).await;
    let mut ada = BTreeSet::new();
    for i in 0..4 {
        ada.insert(
            api.start_saga("order", order(&format!("a-{i}"), "ada"))
                .await,
        );
        api.start_saga("order", order(&format!("g-{i}"), "grace"))
            .await;
    }
    for id in &ada {
        api.wait_status(id, "COMPLETED").await;
    }
    let listed_ada: BTreeSet<String> = listed(&api, "attr.user=ada").await.into_iter().collect();
    assert_eq!(listed_ada, ada);

    let (status, _, dry) = api
        .post(
            "/v1/bulk",
            &json!({"action": "retry", "filter": {"attr": {"user": "ada"}},
                    "reason": "checking", "dry_run": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["matched"], 4, "{dry}");
    let sample: BTreeSet<String> = dry["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sample, ada);
    // An attribute alone is a filter: a job may be recorded with it.
    let (status, _, job) = api
        .post(
            "/v1/bulk",
            &json!({"action": "retry", "filter": {"attr": {"user": "ada"}}, "reason": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    assert_eq!(job["matched"], 4, "{job}");
    for (filter, what) in [
        (json!({"attr": {"User": "ada"}}), "a bad name"),
        (json!({"attr": {"user": 7}}), "a value not a string"),
    ] {
        let (status, _, body) = api
            .post(
                "/v1/bulk",
                &json!({"action": "retry", "filter": filter, "reason": "x", "dry_run": true}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
        assert_eq!(body["error"]["code"], "invalid_filter", "{what}: {body}");
    }

    // A purge by attribute deletes exactly those (finished before now + 1 s: all of them).
    let before = chrono::Utc::now().timestamp_millis() + 1000;
    let options = PurgeOptions {
        attrs: vec![("user".to_owned(), "ada".to_owned())],
        ..PurgeOptions::default()
    };
    let dry = purge_finished_before(
        store.as_ref(),
        before,
        &PurgeOptions {
            dry_run: true,
            ..options.clone()
        },
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(dry.purged, 4);
    let report = purge_finished_before(store.as_ref(), before, &options, |_| {})
        .await
        .unwrap();
    assert_eq!(report.purged, 4);
    assert!(listed(&api, "attr.user=ada").await.is_empty());
    assert_eq!(listed(&api, "attr.user=grace").await.len(), 4);
    for id in &ada {
        let (status, _) = api.get(&format!("/v1/sagas/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    api.stop().await;
}

/// A `place_order` due in an hour: it stays `QUEUED`.
async fn start_later(base: &str, order_id: &str, user: &str) -> String {
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/sagas/place_order"))
        .header("Saga-Start-At", at.to_rfc3339())
        .json(&json!({"order_id": order_id, "user": user, "amount": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED, "{:?}", r.text().await);
    let body: Value = r.json().await.unwrap();
    body["id"].as_str().unwrap().to_owned()
}

async fn get_json(base: &str, path: &str) -> Value {
    let r = reqwest::get(format!("{base}{path}")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// The example sagas' attributes through a real `example-sagas serve`: a bulk job by
/// attribute acts on exactly those sagas, and the CLI lists them by attribute on the database
/// and through the server, shows them, and purges by attribute.
#[tokio::test]
async fn the_example_sagas_attributes_serve_a_bulk_job_the_cli_and_a_purge() {
    use saga_suite::{run_bin, Server, TempDb};
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let base = server.base.clone();
    let defs = get_json(&base, "/v1/definitions").await;
    let attrs_of = |name: &str| {
        defs["definitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .map(|d| d["attrs"].clone())
            .unwrap()
    };
    assert_eq!(attrs_of("place_order"), json!(["order_id", "user"]));
    assert_eq!(attrs_of("fulfil_order"), json!(["order_id", "user"]));
    assert_eq!(attrs_of("payout"), json!(["merchant"]));

    let mut ada = BTreeSet::new();
    let mut grace = BTreeSet::new();
    for i in 0..3 {
        ada.insert(start_later(&base, &format!("a{i}"), "ada").await);
        grace.insert(start_later(&base, &format!("g{i}"), "grace").await);
    }
    let saga = get_json(&base, &format!("/v1/sagas/{}", ada.first().unwrap())).await;
    assert_eq!(saga["attrs"]["user"], "ada");

    // The CLI lists by attribute on the database and through the server alike.
    let dir = db.dir.path();
    let ids = |out: &std::process::Output| -> BTreeSet<String> {
        assert!(out.status.success(), "{out:?}");
        let page: Value = serde_json::from_slice(&out.stdout).unwrap();
        page["sagas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let url = db.url.as_str();
    let on_db = run_bin(
        "example-sagas",
        &[
            "list",
            "--attr",
            "user=ada",
            "--json",
            "--database-url",
            url,
        ],
        dir,
    )
    .await;
    assert_eq!(ids(&on_db), ada);
    let via_server = run_bin(
        "example-sagas",
        &["list", "--attr", "user=ada", "--json", "--server", &base],
        dir,
    )
    .await;
    assert_eq!(ids(&via_server), ada);
    let both = run_bin(
        "example-sagas",
        &[
            "list",
            "--attr",
            "user=ada",
            "--attr",
            "order_id=a1",
            "--json",
            "--database-url",
            url,
        ],
        dir,
    )
    .await;
    assert_eq!(ids(&both).len(), 1);
    let bad = run_bin(
        "example-sagas",
        &["list", "--attr", "user", "--database-url", url],
        dir,
    )
    .await;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("NAME=VALUE"),
        "{bad:?}"
    );
    let first = ada.first().unwrap().clone();
    let shown = run_bin(
        "example-sagas",
        &["show", &first, "--database-url", url],
        dir,
    )
    .await;
    assert!(shown.status.success(), "{shown:?}");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("user=ada"), "{text}");
    let table = run_bin(
        "example-sagas",
        &["list", "--attr", "user=ada", "--database-url", url],
        dir,
    )
    .await;
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("user=ada"),
        "{table:?}"
    );

    // A bulk job by attribute cancels ada's sagas, and only hers.
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/bulk"))
        .json(
            &json!({"action": "cancel", "filter": {"attr": {"user": "ada"}},
                      "reason": "ada asked"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let job: Value = r.json().await.unwrap();
    assert_eq!(job["matched"], 3, "{job}");
    let job_id = job["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let job = get_json(&base, &format!("/v1/bulk/{job_id}")).await;
        if job["status"] == "DONE" {
            assert_eq!(job["done"], 3, "{job}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for id in &ada {
        // Cancelled before it started: it ends without running anything.
        loop {
            let saga = get_json(&base, &format!("/v1/sagas/{id}")).await;
            let status = saga["status"].as_str().unwrap().to_owned();
            if ["COMPENSATED", "ABORTED"].contains(&status.as_str()) {
                break;
            }
            assert_ne!(status, "COMPLETED", "{saga}");
            assert!(tokio::time::Instant::now() < deadline, "{saga}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    for id in &grace {
        let saga = get_json(&base, &format!("/v1/sagas/{id}")).await;
        assert_eq!(saga["status"], "QUEUED", "{saga}");
    }

    // `purge --attr` deletes ada's (ended) sagas and nothing else, once the outbox has
    // relayed their last events (until then a purge keeps them).
    let mut purged = 0;
    while purged < 3 {
        let purge = run_bin(
            "example-sagas",
            &[
                "purge",
                "--finished-before",
                "0s",
                "--attr",
                "user=ada",
                "--database-url",
                url,
            ],
            dir,
        )
        .await;
        assert!(purge.status.success(), "{purge:?}");
        let text = String::from_utf8_lossy(&purge.stdout).into_owned();
        let n: u64 = text
            .strip_prefix("purged ")
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        purged += n;
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(purged, 3);
    let left: BTreeSet<String> = listed_at(&base, "attr.user=grace").await;
    assert_eq!(left, grace);
    assert!(listed_at(&base, "attr.user=ada").await.is_empty());
    server.kill9();
}

async fn listed_at(base: &str, query: &str) -> BTreeSet<String> {
    get_json(base, &format!("/v1/sagas?{query}&limit=1000")).await["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}
