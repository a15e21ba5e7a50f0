//! `payout` across two processes (SPEC §16): `send_transfer` calls the fake bank, a process of
//! its own (`example-sagas bank`), which answers `202` and reports by calling back the
//! orchestrator's task URL. The orchestrator is killed while the step waits for the callback,
//! and between the bank's answer and its record; either way the transfer happens once.

use std::io::BufRead;
use std::time::Duration;

use example_sagas::bank::BankStore;
use example_sagas::shop::Shop;
use saga_suite::{bin_path, Server, TempDb};
use serde_json::{json, Value};

use crate::{step, LONG};

/// The fake bank in a process of its own, on `bank.db` in `dir`, settling `settle_ms` after a
/// transfer is accepted.
struct Bank {
    child: std::process::Child,
    url: String,
    db_url: String,
}

impl Bank {
    fn spawn(dir: &std::path::Path, settle_ms: u64) -> Self {
        let db_url = format!("sqlite://{}", dir.join("bank.db").display());
        let mut child = std::process::Command::new(bin_path("example-sagas"))
            .args(["bank", "--listen", "127.0.0.1:0", "--database", &db_url])
            .args(["--settle-after-ms", &settle_ms.to_string()])
            .stdout(std::process::Stdio::piped())
            .env("RUST_LOG", "error")
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        let url = lines
            .find_map(|l| {
                l.ok()?
                    .strip_prefix("bank listening on ")
                    .map(str::to_owned)
            })
            .expect("the bank never said where it listens");
        Self { child, url, db_url }
    }

    async fn transferred(&self, payout: &str) -> u64 {
        let bank = BankStore::open_existing(&self.db_url).await.unwrap();
        let n = bank.transferred_for(payout).await.unwrap();
        bank.close().await;
        n
    }
}

impl Drop for Bank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback address, for a server restarted where the bank calls back.
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn payout(id: &str) -> Value {
    json!({"payout_id": id, "merchant": "m-1", "amount": 700})
}

async fn assert_paid_once(dir: &std::path::Path, bank: &Bank, payout: &str) {
    assert_eq!(bank.transferred(payout).await, 1, "the bank's ledger");
    let shop = Shop::open(&format!("sqlite://{}", dir.join("shop.db").display()))
        .await
        .unwrap();
    let entry = shop.payout_ledger_for(payout).await.unwrap();
    shop.close().await;
    assert_eq!(
        (
            entry.debited,
            entry.notified,
            entry.credited,
            entry.transferred
        ),
        (1, 1, 0, 0),
        "the shop's ledger (the transfer is the bank's): {entry:?}"
    );
}

#[tokio::test]
async fn killed_while_a_step_waits_for_its_callback_the_callback_after_the_restart_completes_it() {
    let db = TempDb::new();
    let dir = db.dir.path();
    // The bank settles after the kill: its callback finds no server, and tries again.
    let bank = Bank::spawn(dir, 2_500);
    let listen = free_address();
    let env = [("SAGA_LISTEN", listen.as_str())];
    let args = ["--bank-url", bank.url.as_str()];
    let server = Server::spawn(&db.url, dir, &env, &args).await;
    let id = server.start("payout", payout("pk-wait")).await;
    let waiting = server
        .wait_for(id, LONG, |s| {
            step(s, "send_transfer")["status"] == "WAITING"
        })
        .await;
    assert_eq!(waiting["waiting_for"], "task", "{waiting:#}");
    server.kill9();
    let server = Server::spawn(&db.url, dir, &env, &args).await;
    let saga = server
        .wait_for(id, LONG, |s| {
            s["status"] == "COMPLETED" || s["status"] == "FAILED"
        })
        .await;
    assert_eq!(saga["status"], "COMPLETED", "{saga:#}");
    let sent = step(&saga, "send_transfer");
    assert_eq!(
        sent["attempts"], 1,
        "the callback completed the attempt it was handed for"
    );
    assert_eq!(sent["output"]["amount"], 700);
    server.kill9();
    assert_paid_once(dir, &bank, "pk-wait").await;
}

#[tokio::test]
async fn killed_between_the_bank_s_answer_and_its_record_the_transfer_happens_once() {
    let db = TempDb::new();
    let dir = db.dir.path();
    let bank = Bank::spawn(dir, 300);
    let listen = free_address();
    let args = ["--bank-url", bank.url.as_str()];
    let crash = [
        ("SAGA_LISTEN", listen.as_str()),
        ("SAGA_CRASH_AT", "after_action:send_transfer"),
    ];
    let server = Server::spawn(&db.url, dir, &crash, &args).await;
    let id = server.start("payout", payout("pk-answer")).await;
    let status = server.wait_exit(LONG);
    assert!(!status.success(), "the crash point aborts the process");
    // Its first token's callback is refused or finds nobody; the retry, with the same key and
    // a new token, hears the transfer the bank recorded.
    let server = Server::spawn(&db.url, dir, &[("SAGA_LISTEN", listen.as_str())], &args).await;
    let saga = server
        .wait_for(id, LONG, |s| {
            s["status"] == "COMPLETED" || s["status"] == "FAILED"
        })
        .await;
    assert_eq!(saga["status"], "COMPLETED", "{saga:#}");
    // Either the bank's callback for the first attempt reached the restarted server before it
    // took the saga over (that report is the attempt's outcome), or the attempt was
    // interrupted and made again with the same key, which the bank answered from its record.
    let attempts = step(&saga, "send_transfer")["attempts"].as_u64();
    assert!(matches!(attempts, Some(1 | 2)), "{saga:#}");
    server.kill9();
    // Time for a late callback of the first attempt, which must change nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_paid_once(dir, &bank, "pk-answer").await;
}
