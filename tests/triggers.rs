//! Sagas started by NATS JetStream messages (`serve --nats-trigger SUBJECT=SAGA`): one saga per
//! message with the body as input, poison bodies terminated and recorded (and shown by
//! `GET /v1/triggers`, `saga triggers` and `/metrics`), a `kill -9` between a start's commit
//! and the message's acknowledgement, three processes sharing one consumer on PostgreSQL, and
//! the flags refused at start. Each test runs its own `nats-server` (see `support/nats.rs`);
//! the saga database is SQLite or PostgreSQL as `SAGA_TEST_BACKEND` says.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use orchestrator::model::ListFilter;
use saga_suite::nats::NatsServer;
use saga_suite::{run_bin, Server, TempDb};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);
const SUBJECT: &str = "orders.placed";
const TRIGGER: &str = "orders.placed=place_order";

/// `example-sagas serve` on `db`, starting `place_order` for each message on `orders.placed`,
/// with a short `ack_wait` so that a message left unacknowledged comes back soon.
async fn serve(db: &TempDb, nats: &NatsServer, env: &[(&str, &str)]) -> Server {
    let url = nats.url();
    let args = [
        "--nats-url",
        url.as_str(),
        "--nats-trigger",
        TRIGGER,
        "--nats-trigger-ack-wait",
        "2s",
    ];
    Server::spawn(&db.url, db.dir.path(), env, &args).await
}

fn order(id: &str) -> Value {
    json!({"order_id": id, "user": "ada", "amount": 1200})
}

/// Publishes `body` on `subject` and waits for JetStream to store it; its stream sequence.
async fn publish(js: &async_nats::jetstream::Context, subject: &str, body: Vec<u8>) -> u64 {
    js.publish(subject.to_owned(), body.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// Publishes orders `o-0` to `o-{n-1}` on the trigger's subject.
async fn publish_orders(js: &async_nats::jetstream::Context, n: usize) {
    for i in 0..n {
        publish(
            js,
            SUBJECT,
            order(&format!("o-{i}")).to_string().into_bytes(),
        )
        .await;
    }
}

/// The inputs of every `place_order` saga in the log, by order id: how many sagas each has.
async fn orders_started(db: &TempDb) -> BTreeMap<String, usize> {
    let store = db.store().await;
    let page = store
        .list_sagas(&ListFilter {
            name: Some("place_order".to_owned()),
            limit: 10_000,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    let mut found = BTreeMap::new();
    for summary in page.sagas {
        let saga = store.get_saga(summary.id).await.unwrap().unwrap();
        let id = saga.input["order_id"].as_str().unwrap().to_owned();
        assert_eq!(saga.input, order(&id), "the body is the input");
        *found.entry(id).or_insert(0) += 1;
    }
    found
}

/// Waits until the log holds `n` `place_order` sagas, then returns them by order id.
async fn wait_sagas(db: &TempDb, n: usize) -> BTreeMap<String, usize> {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let found = orders_started(db).await;
        let total: usize = found.values().sum();
        if total >= n {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {total} of {n} sagas started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /v1/triggers` on `server`.
async fn triggers(server: &Server) -> Value {
    let r = reqwest::get(format!("{}/v1/triggers", server.base))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.unwrap()
}

/// Polls `GET /v1/triggers` until `until` holds for it.
async fn wait_triggers(server: &Server, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let t = triggers(server).await;
        if until(&t) {
            return t;
        }
        assert!(tokio::time::Instant::now() < deadline, "never so: {t:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The trigger's consumer as JetStream sees it: (pending, handed out and not acknowledged,
/// redelivered).
async fn consumer_state(nats: &NatsServer, t: &Value) -> (u64, usize, usize) {
    let js = nats.jetstream().await;
    let stream = js
        .get_stream(t["triggers"][0]["stream"].as_str().unwrap())
        .await
        .unwrap();
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(t["triggers"][0]["consumer"].as_str().unwrap())
        .await
        .unwrap();
    let info = consumer.get_info().await.unwrap();
    (info.num_pending, info.num_ack_pending, info.num_redelivered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_starts_one_saga_with_its_body_as_input() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[]).await;
    let js = nats.jetstream().await;
    let n = 25;
    publish_orders(&js, n).await;
    let found = wait_sagas(&db, n).await;
    let t = wait_triggers(&server, |t| {
        t["triggers"][0]["lag"] == 0 && t["triggers"][0]["started"] == n
    })
    .await;
    assert_eq!(found.len(), n, "{found:?}");
    assert!(found.values().all(|&c| c == 1), "{found:?}");
    let trigger = &t["triggers"][0];
    assert_eq!(trigger["trigger"], TRIGGER);
    assert_eq!(trigger["subject"], SUBJECT);
    assert_eq!(trigger["saga"], "place_order");
    // No stream held the subject: the server made the default one.
    assert_eq!(trigger["stream"], "SAGA_TRIGGERS");
    assert!(trigger["consumer"]
        .as_str()
        .unwrap()
        .starts_with("saga-trigger-orders_placed-place_order-"));
    assert_eq!(trigger["refused"], 0);
    assert_eq!(t["refusals"], json!([]));
    // Every message acknowledged once, none handed out again.
    let (pending, ack_pending, redelivered) = consumer_state(&nats, &t).await;
    assert_eq!((pending, ack_pending, redelivered), (0, 0, 0));
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(&format!(
            "trigger_started_total{{trigger=\"{TRIGGER}\"}} {n}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("trigger_lag_messages{{trigger=\"{TRIGGER}\"}} 0")),
        "{metrics}"
    );
    server.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_terminated_recorded_and_shown_and_the_next_ones_start() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = serve(&db, &nats, &[]).await;
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, order("before").to_string().into_bytes()).await;
    let not_json = publish(&js, SUBJECT, b"order please".to_vec()).await;
    let misfit = publish(&js, SUBJECT, br#"{"order_id": 7}"#.to_vec()).await;
    publish(&js, SUBJECT, order("after").to_string().into_bytes()).await;
    let found = wait_sagas(&db, 2).await;
    assert_eq!(
        found,
        BTreeMap::from([("after".to_owned(), 1), ("before".to_owned(), 1)])
    );
    let t = wait_triggers(&server, |t| {
        t["triggers"][0]["refused"] == 2 && t["triggers"][0]["lag"] == 0
    })
    .await;
    assert_eq!(t["refused"], json!([{"trigger": TRIGGER, "refused": 2}]));
    let refusals = t["refusals"].as_array().unwrap();
    assert_eq!(refusals.len(), 2, "{t:#}");
    let by_seq: BTreeMap<i64, &Value> = refusals
        .iter()
        .map(|r| (r["stream_seq"].as_i64().unwrap(), r))
        .collect();
    let r = by_seq[&(not_json as i64)];
    assert_eq!(r["trigger"], TRIGGER);
    assert_eq!(r["subject"], SUBJECT);
    assert_eq!(r["stream"], "SAGA_TRIGGERS");
    assert_eq!(r["body_excerpt"], "order please");
    assert_eq!(r["body_bytes"], 12);
    assert!(r["error"].as_str().unwrap().contains("not JSON"), "{r:#}");
    let r = by_seq[&(misfit as i64)];
    assert_eq!(r["body_excerpt"], r#"{"order_id": 7}"#);
    assert!(
        r["error"].as_str().unwrap().contains("input does not fit"),
        "{r:#}"
    );
    // Terminated: nothing handed out, nothing redelivered, even past the ack wait.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (pending, ack_pending, redelivered) = consumer_state(&nats, &t).await;
    assert_eq!((pending, ack_pending, redelivered), (0, 0, 0));
    assert_eq!(orders_started(&db).await.len(), 2);
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(&format!("trigger_refused_total{{trigger=\"{TRIGGER}\"}} 2")),
        "{metrics}"
    );
    // `saga triggers`, on the database and through the server.
    let out = run_bin(
        "saga",
        &["--database-url", &db.url, "triggers", "--json"],
        db.dir.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["refusals"], t["refusals"]);
    assert_eq!(listed["triggers"], json!([]));
    let out = run_bin(
        "saga",
        &[
            "--database-url",
            &db.url,
            "triggers",
            "--server",
            &server.base,
        ],
        db.dir.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for text in [
        "orders.placed",
        "place_order",
        "SAGA_TRIGGERS",
        "refused messages: 2",
        "order please",
    ] {
        assert!(table.contains(text), "{text} in:\n{table}");
    }
    server.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_the_start_and_the_ack_finds_the_same_saga_on_redelivery() {
    let nats = NatsServer::start();
    let db = TempDb::new();
    let crashing = serve(
        &db,
        &nats,
        &[("SAGA_CRASH_AT", "after_trigger_start:place_order")],
    )
    .await;
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, order("once").to_string().into_bytes()).await;
    let status = crashing.wait_exit(LONG);
    assert!(!status.success(), "the crash point aborts the process");
    // The start committed before the crash; the message was not acknowledged.
    assert_eq!(
        orders_started(&db).await,
        BTreeMap::from([("once".to_owned(), 1)])
    );
    let server = serve(&db, &nats, &[]).await;
    // Redelivered once its ack wait has passed, the message finds its saga.
    let t = wait_triggers(&server, |t| {
        t["triggers"][0]["replayed"] == 1 && t["triggers"][0]["lag"] == 0
    })
    .await;
    assert_eq!(t["triggers"][0]["started"], 0);
    assert_eq!(
        orders_started(&db).await,
        BTreeMap::from([("once".to_owned(), 1)])
    );
    let (pending, ack_pending, _) = consumer_state(&nats, &t).await;
    assert_eq!((pending, ack_pending), (0, 0));
    server.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_consumer_and_start_each_saga_once_on_postgres() {
    let nats = NatsServer::start();
    let db = TempDb::postgres();
    let shop = TempDb::postgres();
    let env = [("SHOP_DATABASE_URL", shop.url.as_str())];
    let servers = [
        serve(&db, &nats, &env).await,
        serve(&db, &nats, &env).await,
        serve(&db, &nats, &env).await,
    ];
    let js = nats.jetstream().await;
    let n = 300;
    publish_orders(&js, n).await;
    let found = wait_sagas(&db, n).await;
    let mut started = 0;
    let mut consumers = Vec::new();
    for server in &servers {
        let t = wait_triggers(server, |t| t["triggers"][0]["lag"] == 0).await;
        started += t["triggers"][0]["started"].as_u64().unwrap();
        consumers.push(t["triggers"][0]["consumer"].clone());
    }
    assert_eq!(found.len(), n, "{found:?}");
    assert!(
        found.values().all(|&c| c == 1),
        "a message started two sagas"
    );
    assert_eq!(started, n as u64);
    assert!(
        consumers.iter().all(|c| *c == consumers[0]),
        "{consumers:?}"
    );
    for server in servers {
        server.kill9();
    }
}

#[tokio::test]
async fn bad_trigger_flags_are_refused_at_start() {
    let db = TempDb::new();
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "--nats-url",
                "nats://127.0.0.1:1",
                "--nats-trigger",
                "orders.placed",
            ],
            "is not a trigger: no `=`",
        ),
        (
            &[
                "--nats-url",
                "nats://127.0.0.1:1",
                "--nats-trigger",
                "orders..x=place_order",
            ],
            "empty token",
        ),
        (
            &[
                "--nats-url",
                "nats://127.0.0.1:1",
                "--nats-trigger",
                "orders.placed=no_such_saga",
            ],
            "no saga definition named \"no_such_saga\" is registered",
        ),
        (
            &["--nats-trigger", "orders.placed=place_order"],
            "--nats-trigger needs --nats-url",
        ),
    ];
    for (args, message) in cases {
        let mut all = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
        ];
        all.extend_from_slice(args);
        let out = run_bin("example-sagas", &all, db.dir.path()).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("listening on"),
            "{args:?} listened"
        );
    }
}

#[tokio::test]
async fn refusals_are_recorded_once_per_message_and_listed_newest_first() {
    use orchestrator::store::triggers::NewRefusal;
    let db = TempDb::new();
    let store = db.store().await;
    let refusal = |seq: u64, body: &'static [u8]| NewRefusal {
        trigger: TRIGGER,
        stream: "ORDERS",
        stream_seq: seq,
        subject: SUBJECT,
        error: "the body is not JSON",
        body,
    };
    assert!(store
        .record_trigger_refusal(&refusal(1, b"x"))
        .await
        .unwrap());
    // A redelivery of the same message (a crash before its termination) adds nothing.
    assert!(!store
        .record_trigger_refusal(&refusal(1, b"x"))
        .await
        .unwrap());
    let long = vec![b'y'; 10_000].leak();
    assert!(store
        .record_trigger_refusal(&refusal(2, long))
        .await
        .unwrap());
    let other = NewRefusal {
        trigger: "other=place_order",
        ..refusal(1, b"z")
    };
    assert!(store.record_trigger_refusal(&other).await.unwrap());
    let all = store.trigger_refusals(None, 10).await.unwrap();
    let seqs: Vec<(&str, i64)> = all
        .iter()
        .map(|r| (r.trigger.as_str(), r.stream_seq))
        .collect();
    assert_eq!(
        seqs,
        [("other=place_order", 1), (TRIGGER, 2), (TRIGGER, 1)],
        "newest first"
    );
    let mine = store.trigger_refusals(Some(TRIGGER), 1).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].stream_seq, 2);
    assert_eq!(mine[0].body_bytes, 10_000);
    assert_eq!(mine[0].body_excerpt.len(), 256, "a bounded excerpt");
    let counts = store.trigger_refusal_counts().await.unwrap();
    let counts: Vec<(&str, i64)> = counts
        .iter()
        .map(|c| (c.trigger.as_str(), c.refused))
        .collect();
    assert_eq!(
        counts,
        [("orders.placed=place_order", 2), ("other=place_order", 1)]
    );
}
