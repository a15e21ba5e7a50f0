//! The fake bank over real HTTP on loopback, with a database of its own per test: a SQLite file,
//! or with `SAGA_TEST_BACKEND=postgres` (and `--features postgres`) a fresh PostgreSQL database
//! on the server `SAGA_TEST_PG_URL` names (default `postgres://postgres@127.0.0.1:5432/postgres`),
//! dropped again at the test's end. A small axum server stands in for the orchestrator's `/v1/tasks/{token}/…` routes: it records every
//! callback and answers each with the status the test scripted for its token (`200` when none).

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use example_sagas::bank::{BankConfig, BankHandle, FakeBank, REFUSED_ERROR};
use serde_json::{json, Value};

const TOKEN: &str = "callback-secret";

/// One callback the receiver got.
#[derive(Debug, Clone)]
struct Call {
    token: String,
    /// `complete` or `fail`.
    kind: String,
    body: Value,
    authorization: Option<String>,
}

/// The stand-in for the orchestrator's task routes.
#[derive(Debug, Clone, Default)]
struct Receiver {
    calls: Arc<Mutex<Vec<Call>>>,
    /// Per token, the statuses to answer in turn before answering `200`.
    answers: Arc<Mutex<HashMap<String, VecDeque<u16>>>>,
    base: String,
}

impl Receiver {
    async fn spawn() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = Self {
            base: format!("http://{}", listener.local_addr().unwrap()),
            ..Self::default()
        };
        let app = Router::new()
            .route("/v1/tasks/{token}/{kind}", post(task_callback))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        receiver
    }

    /// The task URL of `token`, as the orchestrator would hand it out.
    fn task_url(&self, token: &str) -> String {
        format!("{}/v1/tasks/{token}", self.base)
    }

    fn answer(&self, token: &str, statuses: &[u16]) {
        self.answers
            .lock()
            .unwrap()
            .insert(token.to_owned(), statuses.iter().copied().collect());
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Waits until at least `n` callbacks have come; fails the test after five seconds.
    async fn wait_for(&self, n: usize) -> Vec<Call> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let calls = self.calls();
            if calls.len() >= n {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} callbacks within 5 s, got {calls:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn task_callback(
    State(receiver): State<Receiver>,
    Path((token, kind)): Path<(String, String)>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    receiver.calls.lock().unwrap().push(Call {
        token: token.clone(),
        kind,
        body,
        authorization: headers
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned()),
    });
    let status = receiver
        .answers
        .lock()
        .unwrap()
        .get_mut(&token)
        .and_then(VecDeque::pop_front)
        .unwrap_or(200);
    StatusCode::from_u16(status).unwrap()
}

/// The bank's database for one test, on the backend `SAGA_TEST_BACKEND` selects.
struct BankDb {
    /// The SQLite file's directory, and the working directory of the `ledger` command.
    dir: tempfile::TempDir,
    url: String,
    /// The PostgreSQL database to drop at the end, if any.
    pg_name: Option<String>,
}

fn backend_is_postgres() -> bool {
    std::env::var("SAGA_TEST_BACKEND").is_ok_and(|b| b == "postgres")
}

impl BankDb {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        if !backend_is_postgres() {
            let url = format!("sqlite://{}", dir.path().join("bank.db").display());
            return Self {
                dir,
                url,
                pg_name: None,
            };
        }
        let name = format!("bank_test_{}", uuid::Uuid::new_v4().simple());
        let url = pg::create(&name);
        Self {
            dir,
            url,
            pg_name: Some(name),
        }
    }
}

impl Drop for BankDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            pg::drop(name);
        }
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use sqlx::{Connection, Executor};

    fn admin_url() -> String {
        std::env::var("SAGA_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
    }

    /// Runs `statement` on the server's admin database from a thread of its own, so that a
    /// `Drop` inside a test's runtime can run it too.
    fn execute(statement: String) {
        std::thread::spawn(move || {
            let admin = admin_url();
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let mut conn = sqlx::PgConnection::connect(&admin)
                        .await
                        .unwrap_or_else(|e| {
                            panic!("PostgreSQL at {admin} (SAGA_TEST_PG_URL) is unreachable: {e}")
                        });
                    conn.execute(statement.as_str()).await.unwrap();
                });
        })
        .join()
        .unwrap();
    }

    /// Creates the database `name`; returns its URL.
    pub fn create(name: &str) -> String {
        execute(format!("CREATE DATABASE {name}"));
        let admin = admin_url();
        let server = admin.rsplit_once('/').map_or(admin.as_str(), |(s, _)| s);
        format!("{server}/{name}")
    }

    pub fn drop(name: String) {
        execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}

#[cfg(not(feature = "postgres"))]
mod pg {
    pub fn create(_name: &str) -> String {
        panic!("SAGA_TEST_BACKEND=postgres needs example-sagas built with --features postgres")
    }

    pub fn drop(_name: String) {}
}

/// A bank on `db`.
struct Bank {
    url: String,
    client: reqwest::Client,
    handle: Option<BankHandle>,
    database_url: String,
}

impl Bank {
    async fn spawn(db: &BankDb, settle_after: Duration) -> Self {
        let mut bank = Self {
            url: String::new(),
            client: reqwest::Client::new(),
            handle: None,
            database_url: db.url.clone(),
        };
        bank.start(settle_after).await;
        bank
    }

    async fn start(&mut self, settle_after: Duration) {
        let config = BankConfig {
            database_url: self.database_url.clone(),
            callback_token: Some(TOKEN.to_owned()),
            settle_after,
            ..BankConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
        };
        let (addr, handle) = FakeBank::spawn(config).await.unwrap();
        self.url = format!("http://{addr}");
        self.handle = Some(handle);
    }

    async fn stop(&mut self) {
        self.handle.take().unwrap().shutdown().await.unwrap();
    }

    /// `POST /transfers` with the key and task URL given; the status and JSON answer.
    async fn transfer(
        &self,
        key: Option<&str>,
        task_url: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .post(format!("{}/transfers", self.url))
            .json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(url) = task_url {
            request = request.header("Saga-Task-Url", url);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }
}

fn payout(id: &str, amount: i64) -> Value {
    json!({ "payout_id": id, "merchant": "m-1", "amount": amount })
}

#[tokio::test]
async fn an_accepted_transfer_answers_202_then_completes_the_task_with_its_output() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(50)).await;

    let (status, body) = bank
        .transfer(
            Some("key-1"),
            Some(&receiver.task_url("t-1")),
            &payout("p-1", 1250),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["status"], "pending");
    let transfer_id = body["transfer_id"].as_str().unwrap().to_owned();

    let calls = receiver.wait_for(1).await;
    assert_eq!(calls[0].token, "t-1");
    assert_eq!(calls[0].kind, "complete");
    assert_eq!(
        calls[0].body,
        json!({ "output": { "transfer_id": transfer_id, "amount": 1250 } })
    );
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        bank.get("/ledger").await,
        (StatusCode::OK, json!({ "p-1": { "transferred": 1 } }))
    );
    let (status, held) = bank.get("/transfers/p-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(held["transferred"], 1);
    assert_eq!(held["transfers"][0]["transfer_id"], transfer_id.as_str());
    assert_eq!(held["transfers"][0]["status"], "transferred");
}

#[tokio::test]
async fn a_refused_transfer_fails_the_task_and_moves_no_money() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(50)).await;
    let mut body = payout("p-2", 900);
    body["refuse"] = json!(true);

    let (status, _) = bank
        .transfer(Some("key-2"), Some(&receiver.task_url("t-2")), &body)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let calls = receiver.wait_for(1).await;
    assert_eq!(calls[0].kind, "fail");
    assert_eq!(
        calls[0].body,
        json!({ "error": REFUSED_ERROR, "retryable": false })
    );
    assert_eq!(
        calls[0].body["error"], "the bank rejected the transfer",
        "the error is part of the protocol"
    );
    assert_eq!(bank.get("/ledger").await, (StatusCode::OK, json!({})));
    let (_, held) = bank.get("/transfers/p-2").await;
    assert_eq!(held["transferred"], 0);
    assert_eq!(held["transfers"][0]["status"], "refused");
}

#[tokio::test]
async fn the_same_key_twice_is_one_transfer_with_one_ledger_entry_and_one_callback() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(50)).await;
    let task = receiver.task_url("t-3");

    let (first, a) = bank
        .transfer(Some("key-3"), Some(&task), &payout("p-3", 10))
        .await;
    let (second, b) = bank
        .transfer(Some("key-3"), Some(&task), &payout("p-3", 10))
        .await;
    assert_eq!(
        (first, second),
        (StatusCode::ACCEPTED, StatusCode::ACCEPTED)
    );
    assert_eq!(a["transfer_id"], b["transfer_id"]);

    receiver.wait_for(1).await;
    // Long enough for a second settlement or callback, were there one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, after) = bank
        .transfer(Some("key-3"), Some(&task), &payout("p-3", 10))
        .await;
    assert_eq!(after["transfer_id"], a["transfer_id"]);
    assert_eq!(after["status"], "transferred");
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert_eq!(receiver.calls().len(), 1, "{:?}", receiver.calls());
    assert_eq!(
        bank.get("/ledger").await.1,
        json!({ "p-3": { "transferred": 1 } })
    );
    let (_, held) = bank.get("/transfers/p-3").await;
    assert_eq!(held["transfers"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_same_key_with_a_different_body_is_refused_with_422_and_changes_nothing() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(50)).await;

    let (status, _) = bank
        .transfer(
            Some("key-4"),
            Some(&receiver.task_url("t-4")),
            &payout("p-4", 10),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = bank
        .transfer(
            Some("key-4"),
            Some(&receiver.task_url("t-4b")),
            &payout("p-4", 11),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body["error"].as_str().unwrap().contains("key-4"), "{body}");

    receiver.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = receiver.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].token, "t-4",
        "the refused request's task URL is not kept"
    );
    assert_eq!(calls[0].body["output"]["amount"], 10);
}

#[tokio::test]
async fn the_same_key_with_a_new_task_url_reports_the_outcome_to_the_new_url() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(50)).await;

    let (_, first) = bank
        .transfer(
            Some("key-5"),
            Some(&receiver.task_url("attempt-1")),
            &payout("p-5", 70),
        )
        .await;
    let calls = receiver.wait_for(1).await;
    assert_eq!(calls[0].token, "attempt-1");

    // The orchestrator tried again with a new attempt's token.
    let (status, again) = bank
        .transfer(
            Some("key-5"),
            Some(&receiver.task_url("attempt-2")),
            &payout("p-5", 70),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(again["transfer_id"], first["transfer_id"]);

    let calls = receiver.wait_for(2).await;
    assert_eq!(calls[1].token, "attempt-2");
    assert_eq!(calls[1].kind, "complete");
    assert_eq!(calls[1].body, calls[0].body);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(receiver.calls().len(), 2);
    assert_eq!(
        bank.get("/ledger").await.1,
        json!({ "p-5": { "transferred": 1 } })
    );
}

#[tokio::test]
async fn a_409_or_404_from_the_receiver_stops_the_callback() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(20)).await;
    // Were they not stopped, each would be answered 200 on its next attempt.
    receiver.answer("stale", &[409]);
    receiver.answer("unknown", &[404]);

    bank.transfer(
        Some("key-6"),
        Some(&receiver.task_url("stale")),
        &payout("p-6", 1),
    )
    .await;
    bank.transfer(
        Some("key-7"),
        Some(&receiver.task_url("unknown")),
        &payout("p-7", 1),
    )
    .await;

    receiver.wait_for(2).await;
    // Backoff from 50 ms would have tried each again three times by now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut tokens: Vec<String> = receiver.calls().into_iter().map(|c| c.token).collect();
    tokens.sort();
    assert_eq!(tokens, ["stale", "unknown"]);
    // The transfers themselves stand.
    assert_eq!(
        bank.get("/ledger").await.1,
        json!({ "p-6": { "transferred": 1 }, "p-7": { "transferred": 1 } })
    );
}

#[tokio::test]
async fn a_callback_is_sent_again_until_the_receiver_answers_2xx() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(20)).await;
    receiver.answer("busy", &[503, 500, 429]);

    bank.transfer(
        Some("key-8"),
        Some(&receiver.task_url("busy")),
        &payout("p-8", 5),
    )
    .await;

    let calls = receiver.wait_for(4).await;
    assert!(calls
        .iter()
        .all(|c| c.kind == "complete" && c.body == calls[0].body));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.calls().len(), 4, "no callback after the 200");
}

#[tokio::test]
async fn a_restarted_bank_settles_a_pending_transfer_and_calls_back() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let mut bank = Bank::spawn(&db, Duration::from_millis(3000)).await;

    let accepted_at = Instant::now();
    let (status, body) = bank
        .transfer(
            Some("key-9"),
            Some(&receiver.task_url("t-9")),
            &payout("p-9", 42),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    bank.stop().await;
    assert!(
        accepted_at.elapsed() < Duration::from_millis(2500),
        "the bank stopped too late to prove anything"
    );
    assert!(receiver.calls().is_empty());

    // Another bank on the same database, which settles what its database says.
    bank.start(Duration::from_millis(50)).await;
    let (_, held) = bank.get("/transfers/p-9").await;
    assert_eq!(held["transfers"][0]["status"], "pending");
    let calls = receiver.wait_for(1).await;
    assert!(
        accepted_at.elapsed() >= Duration::from_millis(3000),
        "settled at the time recorded when it was accepted"
    );
    assert_eq!(calls[0].token, "t-9");
    assert_eq!(
        calls[0].body,
        json!({ "output": { "transfer_id": body["transfer_id"], "amount": 42 } })
    );
    assert_eq!(
        bank.get("/ledger").await.1,
        json!({ "p-9": { "transferred": 1 } })
    );
}

#[tokio::test]
async fn a_transfer_without_an_idempotency_key_is_refused_with_400_and_recorded_nowhere() {
    let db = BankDb::new();
    let receiver = Receiver::spawn().await;
    let bank = Bank::spawn(&db, Duration::from_millis(20)).await;

    let (status, body) = bank
        .transfer(None, Some(&receiver.task_url("t-10")), &payout("p-10", 3))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().contains("Idempotency-Key"),
        "{body}"
    );
    let (status, _) = bank
        .transfer(Some("key-10"), Some("not a url"), &payout("p-10", 3))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = bank
        .transfer(Some("key-10"), None, &json!({ "payout_id": "p-10" }))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = bank
        .transfer(Some("key-10"), None, &payout("p-10", -3))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(receiver.calls().is_empty());
    assert_eq!(bank.get("/transfers/p-10").await.0, StatusCode::NOT_FOUND);
    assert_eq!(bank.get("/ledger").await.1, json!({}));
}

#[tokio::test]
async fn ledger_json_shows_the_banks_transferred_beside_the_shops_counters() {
    let db = BankDb::new();
    let dir = &db.dir;
    let mut bank = Bank::spawn(&db, Duration::from_millis(10)).await;
    let (status, _) = bank
        .transfer(Some("key-11"), None, &payout("p-11", 8))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let deadline = Instant::now() + Duration::from_secs(5);
    while bank.get("/ledger").await.1 != json!({ "p-11": { "transferred": 1 } }) {
        assert!(Instant::now() < deadline, "the transfer never settled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bank.stop().await;

    // On SQLite, `bank.db` beside the shop's database is read without being named.
    let mut ledger = tokio::process::Command::new(env!("CARGO_BIN_EXE_example-sagas"));
    ledger.current_dir(dir.path()).args([
        "--shop-database-url",
        "sqlite://shop.db",
        "ledger",
        "--json",
    ]);
    if db.pg_name.is_some() {
        ledger.args(["--bank-database", &db.url]);
    }
    let output = ledger.output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let ledger: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        ledger,
        json!({ "p-11": { "debited": 0, "credited": 0, "transferred": 1, "notified": 0 } })
    );

    // A bank database named explicitly that does not exist is an error, not a new file.
    let missing = dir.path().join("elsewhere.db");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_example-sagas"))
        .current_dir(dir.path())
        .args([
            "--shop-database-url",
            "sqlite://shop.db",
            "ledger",
            "--json",
        ])
        .arg("--bank-database")
        .arg(format!("sqlite://{}", missing.display()))
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("bank"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!missing.exists());
}
