//! Several orchestrator processes on one PostgreSQL database: takeover after a SIGKILL, fencing
//! of a worker paused past its lease, and one owner at a time, proven from the attempt log and
//! the participants' ledger. These tests always run on PostgreSQL, so they are a binary of
//! their own rather than a module of `crash/` (which runs once per backend).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use example_sagas::shop::Shop;
use orchestrator::store::Store;
use saga_suite::{Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(60);
/// `Server::spawn` runs every process with a 2-second lease.
const LEASE: Duration = Duration::from_secs(2);

async fn worker_of(store: &Arc<dyn Store>, server: &Server) -> String {
    for _ in 0..100 {
        let workers = store.workers().await.unwrap();
        if let Some(w) = workers.iter().find(|w| w.pid == i64::from(server.pid())) {
            return w.id.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("worker of pid {} never registered", server.pid());
}

fn order(id: &str, simulate: Value) -> Value {
    json!({"order_id": id, "user": "ada", "amount": 700, "simulate": simulate})
}

fn terminal(s: &Value) -> bool {
    matches!(
        s["status"].as_str(),
        Some("COMPLETED" | "COMPENSATED" | "FAILED" | "ABORTED")
    )
}

/// No two attempts of one saga overlap in time, whoever made them.
async fn assert_one_owner_at_a_time(store: &Arc<dyn Store>, id: Uuid) {
    let mut attempts = store.attempts(id).await.unwrap();
    attempts.sort_by_key(|a| (a.started_at, a.lease_epoch));
    for w in attempts.windows(2) {
        let ended = w[0]
            .ended_at
            .expect("every attempt is closed once the saga is terminal");
        assert!(
            ended <= w[1].started_at,
            "overlapping attempts of saga {id}: {:?} and {:?}",
            w[0],
            w[1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_one_killed_every_saga_finishes_with_effects_once() {
    let db = TempDb::postgres();
    let shop_db = TempDb::postgres();
    let store = db.store().await;
    let env = [("SHOP_DATABASE_URL", shop_db.url.as_str())];
    let dir = db.dir.path();
    let args = ["--workers", "8"];
    let mut servers = vec![
        Server::spawn(&db.url, dir, &env, &args).await,
        Server::spawn(&db.url, dir, &env, &args).await,
        Server::spawn(&db.url, dir, &env, &args).await,
    ];
    let victim_id = worker_of(&store, &servers[0]).await;

    let mut started = Vec::new();
    for i in 0..36 {
        let simulate = match i % 3 {
            0 => json!({"delay_ms": 600}),
            1 => json!({"delay_ms": 600, "fail_step": "assign_rider"}),
            _ => json!({"delay_ms": 400, "transient_failures": {"charge_payment": 1}}),
        };
        let server = &servers[i % 3];
        started.push((
            i,
            server
                .start("place_order", order(&format!("s{i}"), simulate))
                .await,
        ));
    }
    // Let every process take work, then kill one in the middle of its steps.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let held: Vec<Uuid> = {
        let mut held = Vec::new();
        for (_, id) in &started {
            let s = store.get_saga(*id).await.unwrap().unwrap();
            if s.lease_owner.as_deref() == Some(victim_id.as_str()) {
                held.push(*id);
            }
        }
        held
    };
    assert!(!held.is_empty(), "the victim held no saga when killed");
    servers.remove(0).kill9();
    let killed_at = Instant::now();

    // Takeover: every saga the victim held gets another owner within the lease plus a margin
    // (one heartbeat period of staleness and one poll interval).
    for id in &held {
        loop {
            let s = store.get_saga(*id).await.unwrap().unwrap();
            if s.status.is_terminal() || s.lease_owner.as_deref().is_some_and(|o| o != victim_id) {
                break;
            }
            assert!(
                killed_at.elapsed() < LEASE + Duration::from_millis(2500),
                "saga {id} not taken over after {:?}",
                killed_at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let shop = Shop::open(&shop_db.url).await.unwrap();
    for (i, id) in &started {
        let saga = servers[0].wait_for(*id, LONG, terminal).await;
        let l = shop.ledger_for(&format!("s{i}")).await.unwrap();
        if i % 3 == 1 {
            assert_eq!(saga["status"], "COMPENSATED", "{saga:#}");
            assert_eq!(
                (l.reserved, l.released, l.charged, l.refunded),
                (1, 1, 1, 1),
                "{l:?}"
            );
            assert_eq!(l.rider_assigned, 0);
        } else {
            assert_eq!(saga["status"], "COMPLETED", "{saga:#}");
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
        assert_one_owner_at_a_time(&store, *id).await;
    }
    shop.close().await;
    // Work really was spread over the processes.
    let mut owners = std::collections::BTreeSet::new();
    for (_, id) in &started {
        for a in store.attempts(*id).await.unwrap() {
            owners.insert(a.worker);
        }
    }
    assert!(owners.len() >= 3, "attempts by {owners:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_writes_nothing_after_it_resumes() {
    let db = TempDb::postgres();
    let shop_db = TempDb::postgres();
    let store = db.store().await;
    let env = [("SHOP_DATABASE_URL", shop_db.url.as_str())];
    let dir = db.dir.path();
    let a = Server::spawn(&db.url, dir, &env, &[]).await;
    let a_id = worker_of(&store, &a).await;
    let id = a
        .start("place_order", order("fenced", json!({"delay_ms": 2400})))
        .await;
    a.wait_for(id, LONG, |s| s["steps"][0]["status"] == "RUNNING")
        .await;

    // A freezes mid-action (a long GC pause, a stalled VM); B takes the saga over.
    a.signal("STOP");
    let b = Server::spawn(&db.url, dir, &env, &[]).await;
    let b_id = worker_of(&store, &b).await;
    let done = b.wait_for(id, LONG, terminal).await;
    assert_eq!(done["status"], "COMPLETED");

    let snapshot = || async {
        (
            store.get_saga(id).await.unwrap().unwrap(),
            store.events(id).await.unwrap(),
            store.attempts(id).await.unwrap(),
        )
    };
    let before = snapshot().await;
    // A wakes up, finishes the call it was making, and tries to record it.
    a.signal("CONT");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = snapshot().await;
    assert_eq!(
        before, after,
        "the fenced worker wrote to the saga after resuming"
    );

    // A's only attempt is the one it started before the pause, closed by B as interrupted.
    let by_a: Vec<_> = after.2.iter().filter(|x| x.worker == a_id).collect();
    assert_eq!(by_a.len(), 1, "{by_a:?}");
    assert_eq!(by_a[0].outcome.as_deref(), Some("interrupted"));
    assert!(after.2.iter().skip(1).all(|x| x.worker == b_id));
    assert!(after.2.iter().any(|x| x.lease_epoch > by_a[0].lease_epoch));
    assert_one_owner_at_a_time(&store, id).await;

    // And the participants saw each effect once: A's late call carried the same key.
    let shop = Shop::open(&shop_db.url).await.unwrap();
    let l = shop.ledger_for("fenced").await.unwrap();
    assert_eq!(
        (l.reserved, l.charged, l.rider_assigned),
        (1, 1, 1),
        "{l:?}"
    );
    shop.close().await;
    a.kill9();
    b.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_visible_and_graceful_shutdown_releases_leases_at_once() {
    let db = TempDb::postgres();
    let store = db.store().await;
    let dir = db.dir.path();
    let a = Server::spawn(&db.url, dir, &[], &[]).await;
    let a_id = worker_of(&store, &a).await;
    let id = a
        .start("place_order", order("handover", json!({"delay_ms": 900})))
        .await;
    a.wait_for(id, LONG, |s| s["steps"][0]["status"] == "RUNNING")
        .await;
    let workers = store.workers().await.unwrap();
    let me = workers.iter().find(|w| w.id == a_id).unwrap();
    assert_eq!(me.leases, 1);
    assert_eq!(me.stopped_at, None);

    // SIGTERM: A finishes the call in flight, records it, and releases the lease.
    a.signal("TERM");
    let status = a.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "graceful exit: {status:?}");
    let s = store.get_saga(id).await.unwrap().unwrap();
    assert_eq!(
        s.lease_owner, None,
        "released at shutdown, not left to expire"
    );
    assert_ne!(s.steps[0].action.status, orchestrator::StepStatus::Running);
    let workers = store.workers().await.unwrap();
    assert!(workers
        .iter()
        .find(|w| w.id == a_id)
        .unwrap()
        .stopped_at
        .is_some());

    // Another process continues at once (no lease to wait for).
    let b = Server::spawn(&db.url, dir, &[], &[]).await;
    let done = b.wait_for(id, LONG, terminal).await;
    assert_eq!(done["status"], "COMPLETED");
}

/// Two writers of one process (or of two) may lock the same saga rows in opposite orders, say a
/// heartbeat renewing every lease of a worker while a batch updates several of its sagas: the
/// server then aborts one transaction with `deadlock_detected`. That is a transient error, like
/// a serialization failure: the write is retried, not given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_between_two_writers_is_a_transient_error() {
    let db = TempDb::postgres();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    sqlx::query("CREATE TABLE probe (id int PRIMARY KEY, v int NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO probe VALUES (1, 0), (2, 0)")
        .execute(&pool)
        .await
        .unwrap();
    let mut a = pool.begin().await.unwrap();
    let mut b = pool.begin().await.unwrap();
    let bump = "UPDATE probe SET v = v + 1 WHERE id = $1";
    sqlx::query(bump).bind(1).execute(&mut *a).await.unwrap();
    sqlx::query(bump).bind(2).execute(&mut *b).await.unwrap();
    // Each now wants the row the other holds.
    let (ra, rb) = tokio::join!(
        sqlx::query(bump).bind(2).execute(&mut *a),
        sqlx::query(bump).bind(1).execute(&mut *b),
    );
    let failed: Vec<sqlx::Error> = [ra.err(), rb.err()].into_iter().flatten().collect();
    assert_eq!(failed.len(), 1, "the server aborts exactly one of the two");
    let code = failed[0]
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    // The store's error keeps sqlx out of its API, so the code is checked here and its
    // classification as transient by the store's own unit tests (`store::error`).
    assert_eq!(code.as_deref(), Some("40P01"), "{:?}", failed[0]);
    drop((a, b));
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_sent_to_another_process_resumes_a_saga_whose_process_was_killed() {
    let db = TempDb::postgres();
    let a = Server::spawn_stages(&db.url).await;
    let b = Server::spawn_stages(&db.url).await;
    let id = a.start("approval", json!({})).await;
    a.wait_for(id, LONG, |s| s["steps"][1]["status"] == "WAITING")
        .await;
    a.kill9();
    // A is gone; B, sharing the database, takes the signal, and whichever engine is free
    // (B's) finishes the saga.
    let status = reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/signals/approval", b.base))
        .json(&json!({"approved": true, "by": "b"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 202);
    let done = b.wait_for(id, LONG, terminal).await;
    assert_eq!(done["status"], "COMPLETED", "{done:#}");
    assert_eq!(done["steps"][1]["output"]["by"], "b");
    b.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_during_a_parallel_group_writes_nothing_after_it_resumes() {
    let db = TempDb::postgres();
    let shop_db = TempDb::postgres();
    let store = db.store().await;
    let env = [("SHOP_DATABASE_URL", shop_db.url.as_str())];
    let dir = db.dir.path();
    let a = Server::spawn(&db.url, dir, &env, &[]).await;
    let a_id = worker_of(&store, &a).await;
    let input = json!({
        "order_id": "fenced-group", "user": "ada", "amount": 700,
        "items": [{"sku": "s1", "qty": 1}, {"sku": "s2", "qty": 1}, {"sku": "s3", "qty": 1}],
        "simulate": {"delay_ms": 2400},
    });
    let id = a.start("fulfil_order", input).await;
    let running = |s: &Value| {
        s["steps"].as_array().is_some_and(|steps| {
            steps
                .iter()
                .filter(|b| {
                    b["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("reserve_items/"))
                })
                .filter(|b| b["status"] == "RUNNING")
                .count()
                == 3
        })
    };
    a.wait_for(id, LONG, running).await;

    // A freezes with three branches' calls in flight; B takes the saga over.
    a.signal("STOP");
    let b = Server::spawn(&db.url, dir, &env, &[]).await;
    let b_id = worker_of(&store, &b).await;
    let done = b.wait_for(id, LONG, terminal).await;
    assert_eq!(done["status"], "COMPLETED", "{done:#}");

    let snapshot = || async {
        (
            store.get_saga(id).await.unwrap().unwrap(),
            store.events(id).await.unwrap(),
            store.attempts(id).await.unwrap(),
        )
    };
    let before = snapshot().await;
    // A wakes up, its three calls end, and it tries to record them.
    a.signal("CONT");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = snapshot().await;
    assert_eq!(
        before, after,
        "the fenced worker wrote to the saga after resuming"
    );

    // A's attempts are the three branches it started, each closed by B as interrupted.
    let by_a: Vec<_> = after.2.iter().filter(|x| x.worker == a_id).collect();
    assert_eq!(by_a.len(), 3, "{by_a:?}");
    assert!(
        by_a.iter()
            .all(|x| x.outcome.as_deref() == Some("interrupted")),
        "{by_a:?}"
    );
    assert!(after
        .2
        .iter()
        .filter(|x| x.worker != a_id)
        .all(|x| x.worker == b_id));

    // The participants saw each effect once: A's late calls carried the same keys.
    let shop = Shop::open(&shop_db.url).await.unwrap();
    let ledger = shop.fulfilment_ledger_for("fenced-group").await.unwrap();
    for key in [
        "reserved:s1",
        "reserved:s2",
        "reserved:s3",
        "charged",
        "shipped",
        "notified",
    ] {
        assert_eq!(ledger.get(key), Some(&1), "{key}: {ledger:?}");
    }
    assert_eq!(ledger.len(), 6, "{ledger:?}");
    shop.close().await;
    a.kill9();
    b.kill9();
}
