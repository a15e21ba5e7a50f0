//! The example saga `fulfil_order` (SPEC §7) end to end, through a real `example-sagas serve`
//! over loopback HTTP, on the backend `SAGA_TEST_BACKEND` selects: every path of the
//! specification, with the participants' ledger showing each effect exactly once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use example_sagas::shop::Shop;
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

fn order(id: &str, extra: Value) -> Value {
    let mut input = json!({
        "order_id": id, "user": "ada", "amount": 4200,
        "items": [{"sku": "sku-1", "qty": 1}, {"sku": "sku-2", "qty": 2}, {"sku": "sku-3", "qty": 1}],
    });
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    input
}

async fn ledger(db: &TempDb, order: &str) -> BTreeMap<String, u64> {
    let shop = Shop::open(&format!(
        "sqlite://{}",
        db.dir.path().join("shop.db").display()
    ))
    .await
    .unwrap();
    let entry = shop.fulfilment_ledger_for(order).await.unwrap();
    shop.close().await;
    entry
}

fn keys(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
}

fn step<'a>(saga: &'a Value, name: &str) -> &'a Value {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

async fn signal(server: &Server, id: uuid::Uuid, payload: Value) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/signals/approval", server.base))
        .json(&payload)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn done(server: &Server, id: uuid::Uuid) -> Value {
    server
        .wait_for(id, LONG, |s| {
            matches!(
                s["status"].as_str(),
                Some("COMPLETED" | "COMPENSATED" | "FAILED")
            )
        })
        .await
}

#[tokio::test]
async fn an_order_without_approval_reserves_every_item_charges_ships_and_notifies() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start("fulfil_order", order("f-happy", json!({})))
        .await;
    let saga = done(&server, id).await;
    assert_eq!(saga["status"], "COMPLETED", "{saga:#}");
    assert_eq!(step(&saga, "reserve_items")["kind"], "parallel");
    assert_eq!(step(&saga, "await_approval")["status"], "SKIPPED");
    assert_eq!(saga["output"]["reserve_items"]["sku-2"]["qty"], 2);
    assert_eq!(step(&saga, "reserve_items/sku-3")["status"], "SUCCEEDED");
    assert_eq!(
        ledger(&db, "f-happy").await,
        keys(&[
            ("reserved:sku-1", 1),
            ("reserved:sku-2", 1),
            ("reserved:sku-3", 1),
            ("charged", 1),
            ("shipped", 1),
            ("notified", 1)
        ])
    );
    server.kill9();
}

#[tokio::test]
async fn a_branch_that_fails_releases_the_other_items_and_charges_nothing() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let input = order(
        "f-fail",
        json!({"simulate": {"fail_step": "reserve_items/sku-2"}}),
    );
    let id = server.start("fulfil_order", input).await;
    let saga = done(&server, id).await;
    assert_eq!(saga["status"], "COMPENSATED", "{saga:#}");
    assert_eq!(saga["error"], "reserve_items: branch sku-2: out of stock");
    assert_eq!(
        ledger(&db, "f-fail").await,
        keys(&[
            ("reserved:sku-1", 1),
            ("released:sku-1", 1),
            ("reserved:sku-3", 1),
            ("released:sku-3", 1)
        ])
    );
    server.kill9();
}

#[tokio::test]
async fn an_order_that_needs_approval_waits_for_it_then_ships() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("f-ok", json!({"needs_approval": true})),
        )
        .await;
    let waiting = server
        .wait_for(id, LONG, |s| {
            step(s, "await_approval")["status"] == "WAITING"
        })
        .await;
    let wait = step(&waiting, "await_approval");
    assert_eq!(wait["waiting_for"], "approval");
    assert!(wait["timeout_at"].is_string(), "{wait:#}");
    assert_eq!(
        ledger(&db, "f-ok").await.get("shipped"),
        None,
        "nothing ships before"
    );
    assert_eq!(
        signal(&server, id, json!({"approved": true, "by": "grace"})).await,
        202
    );
    let saga = done(&server, id).await;
    assert_eq!(saga["status"], "COMPLETED", "{saga:#}");
    assert_eq!(step(&saga, "await_approval")["output"]["by"], "grace");
    assert_eq!(ledger(&db, "f-ok").await.get("shipped"), Some(&1));
    server.kill9();
}

#[tokio::test]
async fn a_refusal_or_a_missed_approval_refunds_and_releases_everything() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("f-no", json!({"needs_approval": true})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| {
            step(s, "await_approval")["status"] == "WAITING"
        })
        .await;
    assert_eq!(
        signal(&server, id, json!({"approved": false, "by": "grace"})).await,
        202
    );
    let saga = done(&server, id).await;
    assert_eq!(saga["status"], "COMPENSATED", "{saga:#}");
    assert_eq!(saga["error"], "await_approval: not approved by grace");
    let refunded = keys(&[
        ("reserved:sku-1", 1),
        ("released:sku-1", 1),
        ("reserved:sku-2", 1),
        ("released:sku-2", 1),
        ("reserved:sku-3", 1),
        ("released:sku-3", 1),
        ("charged", 1),
        ("refunded", 1),
    ]);
    assert_eq!(ledger(&db, "f-no").await, refunded);

    let input = order(
        "f-late",
        json!({"needs_approval": true, "approval_timeout_s": 1}),
    );
    let id = server.start("fulfil_order", input).await;
    let saga = done(&server, id).await;
    assert_eq!(saga["status"], "COMPENSATED", "{saga:#}");
    assert_eq!(
        saga["error"],
        "await_approval: no signal \"approval\" came before the timeout"
    );
    assert_eq!(ledger(&db, "f-late").await.get("refunded"), Some(&1));
    server.kill9();
}

#[tokio::test]
async fn a_cancel_during_the_cooling_off_compensates_at_once_and_nothing_ships() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("f-cool", json!({"cooling_off_ms": 3_600_000})),
        )
        .await;
    let sleeping = server
        .wait_for(id, LONG, |s| step(s, "cooling_off")["status"] == "WAITING")
        .await;
    assert!(step(&sleeping, "cooling_off")["wake_at"].is_string());
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/cancel", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let saga = done(&server, id).await;
    assert_eq!(saga["status"], "COMPENSATED");
    let ledger = ledger(&db, "f-cool").await;
    assert_eq!(ledger.get("refunded"), Some(&1));
    assert_eq!(ledger.get("shipped"), None);
    server.kill9();
}

#[tokio::test]
async fn the_cli_and_the_ledger_command_show_it() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let id = server
        .start(
            "fulfil_order",
            order("f-cli", json!({"needs_approval": true})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| {
            step(s, "await_approval")["status"] == "WAITING"
        })
        .await;
    let cwd = db.dir.path();
    let out = saga_suite::run_bin(
        "saga",
        &[
            "signal",
            &id.to_string(),
            "approval",
            "--payload",
            r#"{"approved": true, "by": "cli"}"#,
            "--server",
            &server.base,
        ],
        cwd,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    done(&server, id).await;
    let shop = format!("sqlite://{}", cwd.join("shop.db").display());
    let out = saga_suite::run_bin(
        "example-sagas",
        &["--shop-database-url", &shop, "ledger", "--json"],
        cwd,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all["f-cli"]["reserved:sku-2"], 1, "{all:#}");
    assert_eq!(all["f-cli"]["notified"], 1);
    server.kill9();
}
