//! The outbox published to a real NATS JetStream, and the idempotent `notify-consumer` of it:
//! subjects and message ids, the log id, the stream check at start, and crashes with real
//! processes — the relay killed between the broker's ack and recording it (within and past
//! the duplicate window), the consumer killed between its commit and its ack, and the broker
//! itself killed and started again. Each test runs its own `nats-server` (see
//! `support/nats.rs`); the saga database and the consumer's are SQLite or PostgreSQL as
//! `SAGA_TEST_BACKEND` says.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use saga_suite::nats::{last_sequence, messages, messages_after, NatsServer, Stored};
use saga_suite::{bin_path, run_bin, Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(60);
/// How soon a relay holding a batch for a broker that hung catches up once a broker is back:
/// a few acknowledgement timeouts (5 s) and reconnections, where one timeout per event of
/// the batch would take minutes.
const CATCH_UP: Duration = Duration::from_secs(25);
const TERMINAL: &[&str] = &["saga.completed", "saga.compensated", "saga.failed"];

/// `example-sagas serve` on `db`, publishing to `nats`.
async fn serve(db: &TempDb, nats: &NatsServer, env: &[(&str, &str)], extra: &[&str]) -> Server {
    let url = nats.url();
    let mut args = vec!["--nats-url", url.as_str()];
    args.extend_from_slice(extra);
    Server::spawn(&db.url, db.dir.path(), env, &args).await
}

/// `saga outbox --json` on `db_url`.
async fn outbox(db_url: &str, dir: &Path) -> Value {
    let out = run_bin("saga", &["--database-url", db_url, "outbox", "--json"], dir).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The NATS relay's row of `saga outbox --json`.
fn nats_relay(outbox: &Value) -> Value {
    outbox["relays"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "nats")
        .cloned()
        .unwrap_or_else(|| panic!("no nats relay in {outbox:#}"))
}

/// Every event of the log, by id: (saga id, type).
async fn log_events(db: &TempDb) -> BTreeMap<i64, (Uuid, String)> {
    let stores = db.stores().await;
    let events = stores
        .outbox
        .outbox_after(Default::default(), 100_000)
        .await
        .unwrap();
    events
        .into_iter()
        .map(|e| (e.id(), (e.saga_id, e.kind)))
        .collect()
}

/// Waits until the NATS relay has published everything (lag 0, its cursor at the last event).
async fn wait_published(db: &TempDb) -> Value {
    wait_published_within(db, LONG).await
}

/// [`wait_published`], failing after `limit`.
async fn wait_published_within(db: &TempDb, limit: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // The last event in the relay's reading order (commit order on PostgreSQL), which
        // need not be the largest id.
        let stores = db.stores().await;
        let read = stores.outbox.outbox_after(Default::default(), 100_000);
        let last = read.await.unwrap().last().map_or(0, |e| e.id());
        let outbox = outbox(&db.url, db.dir.path()).await;
        let relay = nats_relay(&outbox);
        if relay["lag_events"] == 0 && relay["event_id"] == last {
            return outbox;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the NATS relay never caught up: {outbox:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks that `stored` is exactly the log's events, once each, with their subjects, ids and
/// bodies.
fn assert_once_each(stored: &[Stored], log: &BTreeMap<i64, (Uuid, String)>, log_id: &str) {
    let ids: Vec<&str> = stored.iter().map(|m| m.message_id.as_str()).collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "a message stored twice: {ids:?}");
    assert_eq!(stored.len(), log.len(), "{stored:#?}");
    for m in stored {
        let id: i64 = m.body["id"].as_i64().unwrap();
        let (saga, kind) = &log[&id];
        assert_eq!(m.message_id, format!("{log_id}:{id}"));
        assert_eq!(m.subject, format!("sagas.place_order.{kind}"));
        assert_eq!(m.body["type"], kind.as_str());
        assert_eq!(m.body["saga_id"], saga.to_string());
        assert_eq!(m.body["saga_name"], "place_order");
        // No exporter and no caller's trace: no context to pass on.
        assert_eq!(m.traceparent, "", "{saga}");
    }
}

fn order(id: &str, simulate: Value) -> Value {
    json!({"order_id": id, "user": "ada", "amount": 1200, "simulate": simulate})
}

/// Starts a `place_order` of order `id` on `server` and waits until it has completed.
async fn complete_order(server: &Server, id: &str) -> Uuid {
    let saga = server.start("place_order", order(id, json!({}))).await;
    server
        .wait_for(saga, LONG, |s| s["status"] == "COMPLETED")
        .await;
    saga
}

/// Completes the orders `<prefix>-0` … `<prefix>-<n - 1>` while the broker takes nothing,
/// then after `settle` returns the NATS relay's row of `saga outbox --json`.
async fn orders_held_back(
    server: &Server,
    db: &TempDb,
    prefix: &str,
    n: usize,
    settle: Duration,
) -> Value {
    for i in 0..n {
        complete_order(server, &format!("{prefix}-{i}")).await;
    }
    tokio::time::sleep(settle).await;
    nats_relay(&outbox(&db.url, db.dir.path()).await)
}

/// Checks that `stream` holds every event of `db`'s log once (see [`assert_once_each`]), given
/// `saga outbox --json` of that database.
async fn assert_stream_holds_the_log(stream: &mut Stream, db: &TempDb, outbox: &Value) {
    let log_id = outbox["log_id"].as_str().unwrap();
    assert_once_each(&messages(stream).await, &log_events(db).await, log_id);
}

/// A running `example-sagas notify-consumer`, killed when dropped.
struct Consumer {
    child: Child,
}

impl Consumer {
    /// The consumer on its own database `notify` (SQLite or PostgreSQL, as the test's backend).
    fn spawn(nats: &NatsServer, notify: &TempDb, env: &[(&str, &str)]) -> Self {
        let child = Command::new(bin_path("example-sagas"))
            .args([
                "notify-consumer",
                "--nats-url",
                &nats.url(),
                "--ack-wait",
                "1s",
            ])
            .arg("--notify-database-url")
            .arg(&notify.url)
            .current_dir(notify.dir.path())
            .envs(env.iter().copied())
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Self { child }
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        saga_suite::wait_exit(&mut self.child, timeout)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `notify-consumer --ledger --json` of the consumer database `notify`.
async fn ledger(notify: &TempDb) -> Value {
    let out = run_bin(
        "example-sagas",
        &[
            "notify-consumer",
            "--ledger",
            "--json",
            "--notify-database-url",
            &notify.url,
        ],
        notify.dir.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until the consumer's ledger has handled `events` notifications.
async fn wait_handled(notify: &TempDb, events: usize) -> Value {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let ledger = ledger(notify).await;
        if ledger["handled"].as_u64() == Some(events as u64) {
            return ledger;
        }
        assert!(
            ledger["handled"].as_u64().unwrap() < events as u64,
            "more notifications than events: {ledger:#}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumer never handled {events} events: {ledger:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each saga of `sagas` has exactly one terminal notification, of its status, and one
/// notification per event of the log.
fn assert_ledger_once(ledger: &Value, log: &BTreeMap<i64, (Uuid, String)>) {
    let mut per_saga: BTreeMap<Uuid, (u64, Vec<String>)> = BTreeMap::new();
    for (saga, kind) in log.values() {
        let entry = per_saga.entry(*saga).or_default();
        entry.0 += 1;
        if TERMINAL.contains(&kind.as_str()) {
            entry.1.push(kind.clone());
        }
    }
    assert_eq!(
        ledger["sagas"].as_object().unwrap().len(),
        per_saga.len(),
        "{ledger:#}"
    );
    for (saga, (events, terminal)) in per_saga {
        let entry = &ledger["sagas"][saga.to_string()];
        assert_eq!(entry["events"], events, "{saga}: {ledger:#}");
        assert_eq!(terminal.len(), 1, "{saga} ended once in the log");
        let expected = json!({ terminal[0].clone(): 1 });
        assert_eq!(entry["terminal"], expected, "{saga}: {ledger:#}");
    }
}

/// Every event reaches the stream once, on `sagas.<name>.<type>`, as `<log id>:<event id>`;
/// the relay's progress is visible in `saga outbox` and `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_jetstream_once_with_its_subject_and_log_scoped_id() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[], &[]).await;
    let ok = server.start("place_order", order("o-1", json!({}))).await;
    let undone = server
        .start(
            "place_order",
            order("o-2", json!({"fail_step": "assign_rider"})),
        )
        .await;
    for id in [ok, undone] {
        server
            .wait_for(id, LONG, |s| {
                s["status"] == "COMPLETED" || s["status"] == "COMPENSATED"
            })
            .await;
    }
    let outbox = wait_published(&db).await;
    let log_id = outbox["log_id"].as_str().unwrap().to_owned();
    Uuid::parse_str(&log_id).unwrap();
    let relay = nats_relay(&outbox);
    assert_eq!(relay["oldest_unread_at"], Value::Null);
    assert_eq!(relay["lag_seconds"], 0.0);

    let mut stream = nats.stream("SAGAS").await;
    let info = stream.info().await.unwrap().clone();
    assert_eq!(info.config.subjects, vec!["sagas.>".to_owned()]);
    assert_eq!(info.config.duplicate_window, Duration::from_secs(120));
    let log = log_events(&db).await;
    assert_once_each(&messages(&mut stream).await, &log, &log_id);
    let kinds: BTreeSet<&str> = log.values().map(|(_, k)| k.as_str()).collect();
    assert!(kinds.contains("saga.completed") && kinds.contains("saga.compensated"));

    // The relays refresh their gauges every second or so.
    let expected = [
        "outbox_lag_events{target=\"nats\"} 0\n".to_owned(),
        "outbox_lag_seconds{target=\"nats\"} 0\n".to_owned(),
        "outbox_lag_events{target=\"webhooks\"} 0\n".to_owned(),
        format!("outbox_published_total{{target=\"nats\"}} {}\n", log.len()),
    ];
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let metrics = server.metrics().await;
        if expected
            .iter()
            .all(|series| metrics.contains(series.as_str()))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{expected:?} in {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.kill9();
}

/// The machine's own NATS server (`SAGA_TEST_NATS_URL`, by default `nats://127.0.0.1:4222`,
/// which `scripts/test.sh` starts when it is down) takes this database's events in the
/// shared `SAGAS` stream, each once under this database's log id, beside whatever other
/// deployments have published there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machines_nats_server_stores_this_databases_events_under_its_log_id() {
    let url =
        std::env::var("SAGA_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("NATS at {url} (SAGA_TEST_NATS_URL) is unreachable: {e}"));
    let js = async_nats::jetstream::new(client);
    let before = match js.get_stream("SAGAS").await {
        Ok(mut stream) => last_sequence(&mut stream).await,
        Err(_) => 0,
    };
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &["--nats-url", &url]).await;
    complete_order(&server, "o-shared").await;
    let outbox = wait_published(&db).await;
    let log_id = outbox["log_id"].as_str().unwrap();
    let mut stream = js.get_stream("SAGAS").await.unwrap();
    let ours: Vec<Stored> = messages_after(&mut stream, before)
        .await
        .into_iter()
        .filter(|m| m.message_id.starts_with(&format!("{log_id}:")))
        .collect();
    assert_once_each(&ours, &log_events(&db).await, log_id);
    server.kill9();
}

/// The log id is made once per database: the same on every read, different for another
/// database, so two deployments publishing to one stream never deduplicate each other.
#[tokio::test]
async fn each_database_has_its_own_log_id_and_keeps_it() {
    let (a, b) = (TempDb::new(), TempDb::new());
    let (sa, sb) = (a.stores().await, b.stores().await);
    let first = sa.outbox.log_id().await.unwrap();
    assert_eq!(sa.outbox.log_id().await.unwrap(), first);
    assert_ne!(sb.outbox.log_id().await.unwrap(), first);
    drop(sa);
    let reopened = a.stores().await;
    assert_eq!(reopened.outbox.log_id().await.unwrap(), first);
}

/// A stream made before the server (by a consumer that started first, or by hand) with a
/// shorter duplicate window than `--nats-dedup-window` is lengthened to it; a longer one is
/// left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_streams_shorter_duplicate_window_is_lengthened_never_shortened() {
    use async_nats::jetstream::stream::Config;
    for (had, wanted) in [(1, 300), (600, 300)] {
        let nats = NatsServer::start();
        let js = nats.jetstream().await;
        js.create_stream(Config {
            name: "SAGAS".to_owned(),
            subjects: vec!["sagas.>".to_owned()],
            duplicate_window: Duration::from_secs(had),
            ..Default::default()
        })
        .await
        .unwrap();
        let db = TempDb::new();
        let window = format!("{wanted}s");
        let server = serve(&db, &nats, &[], &["--nats-dedup-window", &window]).await;
        complete_order(&server, "o-w").await;
        wait_published(&db).await;
        let info = nats
            .stream("SAGAS")
            .await
            .info()
            .await
            .unwrap()
            .config
            .clone();
        assert_eq!(
            info.duplicate_window,
            Duration::from_secs(had.max(wanted)),
            "a stream of {had}s asked for {wanted}s"
        );
        assert_eq!(info.subjects, ["sagas.>"]);
        server.kill9();
    }
}

/// A stream named like the orchestrator's that does not capture its subjects stops the start
/// with an error that says so, and creates nothing; a server without `--nats-url` needs no
/// broker at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_would_not_store_the_events_stops_the_start() {
    let nats = NatsServer::start();
    let js = nats.jetstream().await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "SAGAS".to_owned(),
        subjects: vec!["orders.>".to_owned()],
        ..Default::default()
    })
    .await
    .unwrap();
    let db = TempDb::sqlite();
    let out = Command::new(bin_path("example-sagas"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--nats-url",
            &nats.url(),
        ])
        .arg("--database-url")
        .arg(&db.url)
        .arg("--shop-database-url")
        .arg(format!(
            "sqlite://{}",
            db.dir.path().join("shop.db").display()
        ))
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("JetStream stream SAGAS captures [\"orders.>\"], not \"sagas.>\""),
        "{stderr}"
    );
    assert!(
        !db.dir.path().join("saga.db").exists(),
        "a failed start leaves no database"
    );
}

/// The relay dies after JetStream acknowledged a batch and before it recorded it: started
/// again, it publishes the batch again, JetStream drops the copies (inside its duplicate
/// window) and the consumer handles each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_the_ack_publishes_again_and_jetstream_drops_the_copy() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(
        &db,
        &nats,
        &[("SAGA_CRASH_AT", "after_broker_ack:saga.completed")],
        &[],
    )
    .await;
    server.start("place_order", order("o-1", json!({}))).await;
    assert!(!server.wait_exit(LONG).success(), "the crash point aborts");
    let mut stream = nats.stream("SAGAS").await;
    let before = messages(&mut stream).await;
    assert_eq!(
        before.last().unwrap().body["type"],
        "saga.completed",
        "acknowledged, so stored"
    );
    let outbox = outbox(&db.url, db.dir.path()).await;
    assert!(
        nats_relay(&outbox)["lag_events"].as_i64().unwrap() > 0,
        "not recorded: {outbox:#}"
    );

    let server = serve(&db, &nats, &[], &[]).await;
    let outbox = wait_published(&db).await;
    let log = log_events(&db).await;
    let stored = messages(&mut stream).await;
    assert_once_each(&stored, &log, outbox["log_id"].as_str().unwrap());

    let notify = TempDb::new();
    let _consumer = Consumer::spawn(&nats, &notify, &[]);
    let ledger = wait_handled(&notify, log.len()).await;
    assert_ledger_once(&ledger, &log);
    assert_eq!(ledger["duplicates"], 0, "JetStream dropped the copies");
    server.kill9();
}

/// The same crash, restarted after the stream's duplicate window has passed: JetStream now
/// stores the republished events a second time, and the consumer still applies each once,
/// by the message ids it recorded with its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_duplicate_window_the_consumer_still_applies_each_event_once() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let window = ["--nats-dedup-window", "1s"];
    let server = serve(
        &db,
        &nats,
        &[("SAGA_CRASH_AT", "after_broker_ack:saga.completed")],
        &window,
    )
    .await;
    server.start("place_order", order("o-1", json!({}))).await;
    assert!(!server.wait_exit(LONG).success(), "the crash point aborts");
    let mut stream = nats.stream("SAGAS").await;
    let first = messages(&mut stream).await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let server = serve(&db, &nats, &[], &window).await;
    wait_published(&db).await;
    let log = log_events(&db).await;
    let stored = messages(&mut stream).await;
    assert!(
        stored.len() > log.len(),
        "past the window the copies are stored: {} messages for {} events ({first} before)",
        stored.len(),
        log.len()
    );
    let notify = TempDb::new();
    let _consumer = Consumer::spawn(&nats, &notify, &[]);
    let deadline = tokio::time::Instant::now() + LONG;
    let ledger = loop {
        let ledger = ledger(&notify).await;
        let seen = ledger["handled"].as_u64().unwrap() + ledger["duplicates"].as_u64().unwrap();
        if seen == stored.len() as u64 {
            break ledger;
        }
        assert!(tokio::time::Instant::now() < deadline, "{ledger:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ledger["handled"], log.len(), "{ledger:#}");
    assert_eq!(ledger["duplicates"], stored.len() - log.len(), "{ledger:#}");
    assert_ledger_once(&ledger, &log);
    server.kill9();
}

/// The consumer dies after committing a notification and before acking it: JetStream
/// delivers the message again (after the ack wait) to the consumer started again, which
/// finds it processed and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_after_its_commit_gets_the_message_again_and_skips_it() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[], &[]).await;
    let id = complete_order(&server, "o-1").await;
    wait_published(&db).await;
    let log = log_events(&db).await;

    let notify = TempDb::new();
    let mut crashing = Consumer::spawn(
        &nats,
        &notify,
        &[("SAGA_CRASH_AT", "after_consume_commit:saga.completed")],
    );
    assert!(
        !crashing.wait_exit(LONG).success(),
        "the crash point aborts"
    );
    let committed = ledger(&notify).await;
    assert_eq!(
        committed["sagas"][id.to_string()]["terminal"]["saga.completed"],
        1,
        "committed before the crash: {committed:#}"
    );

    let _consumer = Consumer::spawn(&nats, &notify, &[]);
    let deadline = tokio::time::Instant::now() + LONG;
    let ledger = loop {
        let ledger = ledger(&notify).await;
        if ledger["duplicates"].as_u64().unwrap() >= 1 {
            break ledger;
        }
        assert!(tokio::time::Instant::now() < deadline, "{ledger:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ledger["handled"], log.len(), "{ledger:#}");
    assert_ledger_once(&ledger, &log);
    server.kill9();
}

/// NATS is killed while sagas run: they go on, their events wait in the outbox (the lag
/// shows it), and once NATS is back every event is published, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_nats_is_down_events_wait_and_none_is_lost() {
    let mut nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[], &[]).await;
    complete_order(&server, "o-1").await;
    wait_published(&db).await;

    nats.kill9();
    let waiting = orders_held_back(&server, &db, "o-down", 5, Duration::from_millis(1500)).await;
    assert!(
        waiting["lag_events"].as_i64().unwrap() > 0,
        "the events wait: {waiting:#}"
    );
    assert!(
        waiting["lag_seconds"].as_f64().unwrap() > 0.5,
        "{waiting:#}"
    );

    nats.start_again();
    let outbox = wait_published(&db).await;
    let mut stream = nats.stream("SAGAS").await;
    assert_stream_holds_the_log(&mut stream, &db, &outbox).await;
    server.kill9();
}

/// A stream that is full refuses new messages: the events wait in the outbox (the lag and
/// the failure counter show it) and go out, each once, when the stream has room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_delays_events_and_loses_none() {
    use async_nats::jetstream::stream::{Config, DiscardPolicy};
    let nats = NatsServer::start();
    let js = nats.jetstream().await;
    let small = Config {
        name: "SAGAS".to_owned(),
        subjects: vec!["sagas.>".to_owned()],
        duplicate_window: Duration::from_secs(120),
        max_messages: 3,
        discard: DiscardPolicy::New,
        ..Default::default()
    };
    js.create_stream(small.clone()).await.unwrap();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[], &[]).await;
    complete_order(&server, "o-full").await;
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let metrics = server.metrics().await;
        let failures = metrics
            .lines()
            .find_map(|l| l.strip_prefix("outbox_publish_failures_total{target=\"nats\"} "))
            .map_or(0.0, |v| v.parse::<f64>().unwrap());
        if failures >= 1.0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waiting = nats_relay(&outbox(&db.url, db.dir.path()).await);
    assert!(
        waiting["lag_events"].as_i64().unwrap() > 0,
        "the events wait: {waiting:#}"
    );
    let mut stream = nats.stream("SAGAS").await;
    assert_eq!(
        messages(&mut stream).await.len(),
        3,
        "the stream took what it had room for"
    );

    js.update_stream(Config {
        max_messages: -1,
        ..small
    })
    .await
    .unwrap();
    let outbox = wait_published(&db).await;
    assert_stream_holds_the_log(&mut stream, &db, &outbox).await;
    server.kill9();
}

/// A broker that hangs with the relay's connection open, and is then replaced, costs the
/// relay one acknowledgement timeout for the whole batch it had sent, not one per message:
/// the events it held reach the new broker soon after it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_hangs_holds_a_batch_for_one_timeout_not_one_per_event() {
    let mut nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[], &[]).await;
    complete_order(&server, "o-1").await;
    wait_published(&db).await;

    nats.freeze();
    // Past the first round's timeout (5 s): the relay has sent the whole backlog into the
    // hung connection and waits for its acknowledgements.
    let waiting = orders_held_back(&server, &db, "o-hung", 20, Duration::from_secs(7)).await;
    assert!(
        waiting["lag_events"].as_i64().unwrap() >= 20,
        "the events wait: {waiting:#}"
    );

    nats.kill9();
    nats.start_again();
    let outbox = wait_published_within(&db, CATCH_UP).await;
    let mut stream = nats.stream("SAGAS").await;
    assert_stream_holds_the_log(&mut stream, &db, &outbox).await;
    server.kill9();
}

/// Runs `sql` on the database at `url` (SQLite or PostgreSQL).
async fn execute(url: &str, sql: &str) {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
}

/// The consumer's database fails under it (here its table is renamed away): it keeps
/// running, acks nothing it could not record, and once the database works again handles
/// every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_database_fails_retries_and_loses_nothing() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[], &[]).await;
    complete_order(&server, "o-1").await;
    wait_published(&db).await;
    let notify = TempDb::new();
    let mut consumer = Consumer::spawn(&nats, &notify, &[]);
    wait_handled(&notify, log_events(&db).await.len()).await;

    execute(
        &notify.url,
        "ALTER TABLE notifications RENAME TO notifications_away",
    )
    .await;
    complete_order(&server, "o-2").await;
    wait_published(&db).await;
    // Long enough for the consumer to have been handed the new events and failed on them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        consumer.child.try_wait().unwrap().is_none(),
        "the consumer keeps running"
    );

    execute(
        &notify.url,
        "ALTER TABLE notifications_away RENAME TO notifications",
    )
    .await;
    let log = log_events(&db).await;
    let ledger = wait_handled(&notify, log.len()).await;
    assert_ledger_once(&ledger, &log);
    assert!(consumer.child.try_wait().unwrap().is_none());
    server.kill9();
}

/// Reading the consumer's ledger creates and changes nothing: before the consumer has made
/// its database the ledger is empty and no file appears (a reader that made the file would
/// hold a lock the starting consumer cannot wait for).
#[tokio::test]
async fn reading_the_ledger_before_the_consumer_starts_creates_nothing() {
    let notify = TempDb::sqlite();
    let ledger = ledger(&notify).await;
    assert_eq!(ledger["handled"], 0);
    assert_eq!(ledger["sagas"], json!({}));
    let file = notify.url.strip_prefix("sqlite://").unwrap();
    assert!(!Path::new(file).exists());
}
