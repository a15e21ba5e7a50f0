//! PostgreSQL going away under a running orchestrator: requests during the outage get a clear
//! `503`, workers reconnect when it is back, and every saga finishes with every effect once.
//!
//! This test stops and starts the local PostgreSQL server (it needs `pg_ctlcluster` and the
//! rights to use it, as in CI), so it lives alone in its own test binary: cargo runs test
//! binaries one after another, and nothing else is using the server meanwhile. The other
//! process-lifecycle tests are in `crash/` and `pg_scaleout`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use example_sagas::shop::Shop;
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};

fn pg_ctl(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("PostgreSQL is installed with pg_ctlcluster")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .unwrap();
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .status()
        .unwrap();
    assert!(status.success(), "pg_ctlcluster {action} failed");
}

fn terminal(s: &Value) -> bool {
    matches!(s["status"].as_str(), Some("COMPLETED" | "COMPENSATED"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarts_mid_run_and_everything_finishes() {
    let db = TempDb::postgres();
    let dir = db.dir.path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let simulate = if i % 2 == 0 {
            json!({"delay_ms": 300})
        } else {
            json!({"delay_ms": 300, "fail_step": "assign_rider"})
        };
        let input =
            json!({"order_id": format!("r{i}"), "user": "ada", "amount": 5, "simulate": simulate});
        ids.push((i, server.start("place_order", input).await));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    pg_ctl("stop");

    // During the outage: a clear 503 with a JSON error, not a hang or a crash.
    let client = reqwest::Client::new();
    let r = client
        .get(format!("{}/healthz", server.base))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let r = client
        .post(format!("{}/v1/sagas/place_order", server.base))
        .json(&json!({"order_id": "during", "user": "ada", "amount": 1}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");

    pg_ctl("start");
    let shop = Shop::open(&format!("sqlite://{}", dir.join("shop.db").display()))
        .await
        .unwrap();
    for (i, id) in &ids {
        let saga = server
            .wait_for(*id, Duration::from_secs(90), terminal)
            .await;
        let l = shop.ledger_for(&format!("r{i}")).await.unwrap();
        if i % 2 == 0 {
            assert_eq!(saga["status"], "COMPLETED");
            assert_eq!(
                (l.reserved, l.charged, l.rider_assigned),
                (1, 1, 1),
                "{l:?}"
            );
        } else {
            assert_eq!(saga["status"], "COMPENSATED");
            assert_eq!(
                (l.reserved, l.released, l.charged, l.refunded),
                (1, 1, 1, 1),
                "{l:?}"
            );
        }
    }
    shop.close().await;
    // The server kept serving through it all.
    let r = client
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}
