//! Process lifecycle with real processes: `example-sagas serve` on a temporary database is
//! killed with SIGKILL in each window that matters ([`kill9`]), aborts itself at an armed crash
//! point ([`crash_points`]) or is stopped with SIGTERM ([`sigterm`]), then restarted, and must
//! bring every saga to the right terminal status with every effect in the participants' ledger
//! exactly once (net zero for compensated orders). Runs on both backends.
//!
//! Two more suites of processes dying or pausing live in binaries of their own because they
//! always run on PostgreSQL (here they would run twice in `scripts/test.sh`, once per half):
//! `pg_scaleout` (several `serve` processes on one database, one killed, one paused, one
//! stopped) and `pg_restart`, which stops and starts the PostgreSQL server itself and so must
//! run while no other test binary uses that server.
//!
//! Needs the workspace's binaries: `cargo build --workspace --bins` first.

#![allow(clippy::unwrap_used)]

mod callbacks;
mod crash_points;
mod fulfil;
mod kill9;
mod sigterm;
mod stages;

use std::time::Duration;

use example_sagas::shop::{LedgerEntry, Shop};
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(30);

fn step<'a>(saga: &'a Value, name: &str) -> &'a Value {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

async fn ledger(dir: &std::path::Path, order: &str) -> LedgerEntry {
    let shop = Shop::open(&format!("sqlite://{}", dir.join("shop.db").display()))
        .await
        .unwrap();
    let entry = shop.ledger_for(order).await.unwrap();
    shop.close().await;
    entry
}

fn order(id: &str, simulate: Value) -> Value {
    json!({"order_id": id, "user": "ada", "amount": 1200, "simulate": simulate})
}

async fn restart_and_finish(db: &TempDb, id: uuid::Uuid, want: &str) -> Value {
    let dir = db.dir.path();
    let server = Server::spawn(&db.url, dir, &[], &[]).await;
    let saga = server
        .wait_for(id, LONG, |s| {
            s["status"] != "RUNNING" && s["status"] != "COMPENSATING" && s["status"] != "QUEUED"
        })
        .await;
    assert_eq!(saga["status"], want, "{saga:#}");
    server.kill9();
    saga
}

fn assert_completed_once(l: &LedgerEntry) {
    assert_eq!(
        (l.reserved, l.charged, l.rider_assigned),
        (1, 1, 1),
        "{l:?}"
    );
    assert_eq!(
        (l.released, l.refunded, l.rider_unassigned),
        (0, 0, 0),
        "{l:?}"
    );
}

fn assert_net_zero(l: &LedgerEntry) {
    assert_eq!(l.reserved, 1, "{l:?}");
    assert_eq!(l.released, 1, "{l:?}");
    assert_eq!(l.charged, 1, "{l:?}");
    assert_eq!(l.refunded, 1, "{l:?}");
    assert_eq!((l.rider_assigned, l.rider_unassigned), (0, 0), "{l:?}");
}
