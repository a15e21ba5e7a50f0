//! The operator surfaces of flow control (SPEC §14) through real `example-sagas serve`
//! processes, on the backend `SAGA_TEST_BACKEND` selects: `GET /v1/limits` lists the limits
//! `payout` declares; `PUT /v1/limits/{name}` changes one, audited in `limit_changes` (read
//! from the database itself) and kept across a restart; every refusal (unknown name, a change
//! of the other kind, a rate that does not parse, a value out of range, a malformed body, a
//! token without the `operate` scope) says why and changes nothing; `Saga-Priority` is one
//! digit or refused, and shows on the saga; `saga limits`, `saga limits set` and
//! `saga start --priority` through the server and on the database.
//!
//! Needs the workspace's binaries: `cargo build --workspace --bins` first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use reqwest::{Method, StatusCode};
use saga_suite::{backend_is_postgres, run_bin, Server, TempDb};
use serde_json::{json, Value};

/// A token with the scopes to start, read and operate.
const OPS: &str = "limits-ops-4d1e7a90c2";
/// A token that may only read.
const VIEWER: &str = "limits-viewer-8b03f65e17";

/// Starts `example-sagas serve` on `db` with the tokens [`OPS`] (named `ops`) and [`VIEWER`].
async fn serve(db: &TempDb) -> Server {
    let tokens = db.dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("ops start,read,operate {OPS}\nviewer read {VIEWER}\n"),
    )
    .unwrap();
    let tokens = tokens.display().to_string();
    Server::spawn(&db.url, db.dir.path(), &[], &["--api-tokens-file", &tokens]).await
}

/// One request with `token` (none when `None`) and a JSON body if given: status and body.
async fn call(
    server: &Server,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", server.base));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn limits(server: &Server) -> Vec<Value> {
    let (status, body) = call(server, Method::GET, "/v1/limits", Some(VIEWER), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["limits"].as_array().unwrap().clone()
}

fn named<'a>(limits: &'a [Value], name: &str) -> &'a Value {
    limits
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no limit {name} in {limits:?}"))
}

async fn put(server: &Server, name: &str, token: &str, body: Value) -> (StatusCode, Value) {
    call(
        server,
        Method::PUT,
        &format!("/v1/limits/{name}"),
        Some(token),
        Some(body),
    )
    .await
}

/// One row of `limit_changes`: the limit, actor, reason, old and new values.
#[derive(Debug, PartialEq)]
struct Change {
    name: String,
    actor: Option<String>,
    reason: Option<String>,
    old: Value,
    new: Value,
}

/// Every row of `limit_changes`, oldest first, read from the database itself.
async fn changes(db: &TempDb) -> Vec<Change> {
    use sqlx::Row;
    let sql = if backend_is_postgres() {
        "SELECT name, actor, reason, old::text AS old, new::text AS new FROM limit_changes \
         ORDER BY id"
    } else {
        "SELECT name, actor, reason, old, new FROM limit_changes ORDER BY id"
    };
    let read = |name: String, actor, reason, old: String, new: String| Change {
        name,
        actor,
        reason,
        old: serde_json::from_str(&old).unwrap(),
        new: serde_json::from_str(&new).unwrap(),
    };
    if backend_is_postgres() {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| {
                read(
                    r.get("name"),
                    r.get("actor"),
                    r.get("reason"),
                    r.get("old"),
                    r.get("new"),
                )
            })
            .collect()
    } else {
        let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
        let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| {
                read(
                    r.get("name"),
                    r.get("actor"),
                    r.get("reason"),
                    r.get("old"),
                    r.get("new"),
                )
            })
            .collect()
    }
}

/// A change refused: the limit, the token (none: anonymous), the body, and the status, error
/// code and words of the answer.
type Refusal = (
    &'static str,
    Option<&'static str>,
    Value,
    StatusCode,
    &'static str,
    &'static str,
);

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) -> String {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{body}");
    message.to_owned()
}

#[tokio::test]
async fn limits_are_listed_changed_audited_and_kept_across_a_restart() {
    let db = TempDb::new();
    let server = serve(&db).await;

    // As `payout` declares them, by name.
    let all = limits(&server).await;
    let names: Vec<&str> = all.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["bank", "payout_per_merchant", "payout_running"]);
    let bank = named(&all, "bank");
    assert_eq!(
        (&bank["kind"], &bank["rate"], &bank["burst"], &bank["limit"]),
        (&json!("rate"), &json!("20/s"), &json!(5), &Value::Null)
    );
    assert_eq!(bank["saga"], Value::Null);
    let per_merchant = named(&all, "payout_per_merchant");
    assert_eq!(
        (
            &per_merchant["kind"],
            &per_merchant["saga"],
            &per_merchant["key"],
            &per_merchant["limit"]
        ),
        (
            &json!("per_key"),
            &json!("payout"),
            &json!("merchant"),
            &json!(1)
        )
    );
    let running = named(&all, "payout_running");
    assert_eq!(
        (&running["kind"], &running["limit"]),
        (&json!("max_running"), &json!(50))
    );
    for l in &all {
        assert_eq!(
            (&l["updated_at"], &l["updated_by"]),
            (&Value::Null, &Value::Null)
        );
        assert_eq!((&l["in_use"], &l["waiting"]), (&json!(0), &json!(0)));
    }

    // Changed by an operator: answered with the limit as it now stands.
    let (status, after) = put(
        &server,
        "payout_running",
        OPS,
        json!({"limit": 10, "reason": "the ledger is slow today"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(
        (&after["limit"], &after["declared"]["limit"]),
        (&json!(10), &json!(50))
    );
    assert_eq!(after["updated_by"], "ops");
    assert!(chrono::DateTime::parse_from_rfc3339(after["updated_at"].as_str().unwrap()).is_ok());
    // A rate without a burst keeps the limiter's burst.
    let (status, after) = put(
        &server,
        "bank",
        OPS,
        json!({"rate": "40/s", "reason": "quota"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(
        (&after["rate"], &after["burst"]),
        (&json!("40/s"), &json!(5))
    );
    let (status, after) = put(&server, "bank", OPS, json!({"rate": "2/m", "burst": 3})).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(
        (&after["rate"], &after["burst"]),
        (&json!("2/m"), &json!(3))
    );
    assert_eq!(
        (&after["declared"]["rate"], &after["declared"]["burst"]),
        (&json!("20/s"), &json!(5))
    );

    // Audited in the database: who, why, from what to what.
    let audited = changes(&db).await;
    assert_eq!(audited.len(), 3, "{audited:?}");
    assert_eq!(
        audited[0],
        Change {
            name: "payout_running".to_owned(),
            actor: Some("ops".to_owned()),
            reason: Some("the ledger is slow today".to_owned()),
            old: json!({"limit": 50, "rate": null, "burst": null}),
            new: json!({"limit": 10, "rate": null, "burst": null}),
        }
    );
    assert_eq!(
        (&audited[1].name, &audited[1].reason, &audited[1].new),
        (
            &"bank".to_owned(),
            &Some("quota".to_owned()),
            &json!({"limit": null, "rate": "40/s", "burst": 5})
        )
    );
    assert_eq!(
        audited[1].old,
        json!({"limit": null, "rate": "20/s", "burst": 5})
    );
    assert_eq!(
        (&audited[2].actor, &audited[2].reason),
        (&Some("ops".to_owned()), &None)
    );

    // Every refusal says why, and changes nothing.
    let before = limits(&server).await;
    let refusals: Vec<Refusal> = vec![
        (
            "bank",
            Some(VIEWER),
            json!({"limit": 1}),
            StatusCode::FORBIDDEN,
            "forbidden",
            "operate",
        ),
        (
            "bank",
            None,
            json!({"limit": 1}),
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "token",
        ),
        (
            "no_such_limit",
            Some(OPS),
            json!({"limit": 1}),
            StatusCode::NOT_FOUND,
            "unknown_limit",
            "no_such_limit",
        ),
        (
            "bank",
            Some(OPS),
            json!({"limit": 3}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            "rate limiter",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"rate": "1/s"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unprocessable",
            "concurrency limit",
        ),
        (
            "bank",
            Some(OPS),
            json!({"rate": "fast"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_rate",
            "N/s, N/m or N/h",
        ),
        (
            "bank",
            Some(OPS),
            json!({"rate": "0/s"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_rate",
            "at least 1",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"limit": 1_000_001}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "out of range",
        ),
        (
            "bank",
            Some(OPS),
            json!({"rate": "2000000/s"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "out of range",
        ),
        (
            "bank",
            Some(OPS),
            json!({"rate": "1/s", "burst": 0}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "out of range",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"limit": -1}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "limit",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "neither",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"limit": 1, "rate": "1/s"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "both",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"limit": 1, "burst": 2}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "burst",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"limit": "ten"}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "limit",
        ),
        (
            "payout_running",
            Some(OPS),
            json!({"limit": 1, "reason": "   "}),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "reason",
        ),
        (
            "payout_running",
            Some(OPS),
            json!([1]),
            StatusCode::BAD_REQUEST,
            "bad_request",
            "object",
        ),
    ];
    for (name, token, body, want, code, says) in refusals {
        let (status, answer) = call(
            &server,
            Method::PUT,
            &format!("/v1/limits/{name}"),
            token,
            Some(body.clone()),
        )
        .await;
        let message = assert_error(status, &answer, want, code);
        assert!(message.contains(says), "{body} to {name}: {message}");
    }
    assert_eq!(limits(&server).await, before, "a refusal changes no limit");
    assert_eq!(changes(&db).await.len(), 3, "and records nothing");

    // Kept in the database: a restarted server declares `payout`'s values again and keeps the
    // operator's, showing the declared ones beside them.
    server.kill9();
    let server = serve(&db).await;
    let again = limits(&server).await;
    assert_eq!(again, before, "the same limits after a restart");
    let running = named(&again, "payout_running");
    assert_eq!(
        (&running["limit"], &running["declared"]["limit"]),
        (&json!(10), &json!(50))
    );
    assert_eq!(running["updated_by"], "ops");
    let bank = named(&again, "bank");
    assert_eq!((&bank["rate"], &bank["burst"]), (&json!("2/m"), &json!(3)));
}

#[tokio::test]
async fn saga_priority_is_one_digit_or_refused_and_shows_on_the_saga() {
    let db = TempDb::new();
    let server = serve(&db).await;
    let order = json!({"order_id": "o-1", "user": "ada", "amount": 10});
    let start = |name: &'static str, priority: Vec<&'static str>| {
        let mut req = reqwest::Client::new()
            .post(format!("{}/v1/sagas/{name}", server.base))
            .bearer_auth(OPS)
            .json(&order);
        for p in priority {
            req = req.header("Saga-Priority", p);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    // Each saga's own route (served by the generic one's handler, which checks the name first).
    for name in ["place_order", "payout"] {
        for bad in [
            vec!["10"],
            vec!["-1"],
            vec!["+5"],
            vec!["5.0"],
            vec!["high"],
            vec![""],
            vec!["1", "2"],
        ] {
            let (status, body) = start(name, bad.clone()).await;
            let message = assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_priority");
            assert!(message.contains("Saga-Priority"), "{bad:?}: {message}");
        }
    }
    let (status, body) = call(&server, Method::GET, "/v1/sagas", Some(OPS), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["sagas"], json!([]), "a refused start creates nothing");

    let mut ids = Vec::new();
    for (priority, want) in [(vec!["7"], 7), (vec![" 0 "], 0), (vec![], 5)] {
        let (status, body) = start("place_order", priority).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        ids.push((body["id"].as_str().unwrap().to_owned(), want));
    }
    for (id, want) in ids {
        // Each runs to its end whatever its priority; the saga shows the one it was given.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, saga) = call(
                &server,
                Method::GET,
                &format!("/v1/sagas/{id}"),
                Some(OPS),
                None,
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{saga}");
            assert_eq!(saga["priority"], want, "{saga}");
            if saga["status"] == "COMPLETED" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{saga:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn the_cli_lists_and_changes_limits_through_the_server_and_on_the_database() {
    let db = TempDb::new();
    let server = serve(&db).await;
    let dir = db.dir.path();
    let text = |out: &[u8]| String::from_utf8_lossy(out).into_owned();

    // `limits --json` is the API's answer.
    let out = run_bin(
        "saga",
        &[
            "limits",
            "--json",
            "--server",
            &server.base,
            "--token",
            VIEWER,
        ],
        dir,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["limits"], Value::Array(limits(&server).await));

    // Through the server, audited with the token's name.
    let out = run_bin(
        "saga",
        &[
            "limits",
            "set",
            "payout_per_merchant",
            "--limit",
            "3",
            "--reason",
            "a busy day",
            "--server",
            &server.base,
            "--token",
            OPS,
        ],
        dir,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("per-key limit payout_per_merchant is now 3 (declared: 1)"),
        "{said}"
    );
    assert_eq!(
        named(&limits(&server).await, "payout_per_merchant")["limit"],
        3
    );
    let audited = changes(&db).await;
    assert_eq!(
        (audited[0].actor.as_deref(), audited[0].reason.as_deref()),
        (Some("ops"), Some("a busy day"))
    );
    // A token that may only read is refused, and nothing changes.
    let out = run_bin(
        "saga",
        &[
            "limits",
            "set",
            "payout_per_merchant",
            "--limit",
            "4",
            "--server",
            &server.base,
            "--token",
            VIEWER,
        ],
        dir,
    )
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("403 forbidden"),
        "{}",
        text(&out.stderr)
    );

    // On the database, audited as the user at the command line; the server reads it.
    let out = run_bin(
        "saga",
        &[
            "--database-url",
            &db.url,
            "limits",
            "set",
            "bank",
            "--rate",
            "10/s",
            "--reason",
            "the bank is slow",
        ],
        dir,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("writes the database directly"),
        "{}",
        text(&out.stderr)
    );
    let bank = named(&limits(&server).await, "bank").clone();
    assert_eq!(
        (&bank["rate"], &bank["burst"]),
        (&json!("10/s"), &json!(5)),
        "the burst kept"
    );
    assert!(
        bank["updated_by"].as_str().unwrap().ends_with("@cli"),
        "{bank}"
    );
    let audited = changes(&db).await;
    assert_eq!(audited.len(), 2);
    assert_eq!(audited[1].reason.as_deref(), Some("the bank is slow"));
    let out = run_bin("saga", &["--database-url", &db.url, "limits"], dir).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    for want in [
        "payout_per_merchant",
        "payout_running",
        "10/s",
        "20/s, burst 5",
        "ops",
    ] {
        assert!(table.contains(want), "{want}:\n{table}");
    }
    // A change of the other kind is refused on the database too, and recorded nowhere.
    let out = run_bin(
        "saga",
        &[
            "--database-url",
            &db.url,
            "limits",
            "set",
            "bank",
            "--limit",
            "2",
        ],
        dir,
    )
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("bank is a rate limiter"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(changes(&db).await.len(), 2);

    // `start --priority` sends Saga-Priority; a priority past 9 is refused before sending.
    let input = r#"{"payout_id": "pay-cli", "merchant": "acme", "amount": 5}"#;
    let out = run_bin(
        "saga",
        &[
            "start",
            "payout",
            "--input",
            input,
            "--priority",
            "8",
            "--json",
            "--server",
            &server.base,
            "--token",
            OPS,
        ],
        dir,
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let started: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = started["id"].as_str().unwrap();
    let (_, saga) = call(
        &server,
        Method::GET,
        &format!("/v1/sagas/{id}"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(saga["priority"], 8, "{saga}");
    let out = run_bin(
        "saga",
        &[
            "start",
            "payout",
            "--input",
            input,
            "--priority",
            "10",
            "--server",
            &server.base,
            "--token",
            OPS,
        ],
        dir,
    )
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--priority"),
        "{}",
        text(&out.stderr)
    );
}
