//! Retention and purge, on the backend `SAGA_TEST_BACKEND` selects: finished sagas go with
//! every row that hangs off them (steps, attempts, events, keys, deliveries) and answer `404`;
//! sagas that run, that need a person, whose parent is kept or whose events the outbox still
//! owes are kept; a load that runs meanwhile is untouched; a dry run deletes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use orchestrator::http::HttpConfig;

use orchestrator::retention::{purge_finished_before, PurgeOptions};
use orchestrator::store::outbox::{NewDelivery, OutboxPosition, TargetKind};
use orchestrator::webhooks::RELAY_NAME;
use reqwest::StatusCode;
use saga_dsl::StepKind::{Compensatable, Pivot, Retriable};
use saga_suite::api::{Api, Harness};
use saga_suite::{fixtures, registry_of, scripted_saga, Journal, Outcome, ScriptedStep as S};
use serde_json::{json, Value};
use uuid::Uuid;

/// `s` (succeeds), `fails` (compensated), `stuck_after_pivot` (FAILED, needs attention: a
/// retriable step after the pivot fails for good), `parent` (its one stage is a child `leaf`),
/// `stuck` (a ten-minute step).
fn registry() -> saga_dsl::Registry {
    let journal = Journal::default();
    registry_of([
        fixtures::succeeds(&journal),
        fixtures::fails(&journal),
        scripted_saga(
            "stuck_after_pivot",
            1,
            &[
                S::new("a", Compensatable),
                S::new("p", Pivot),
                S {
                    action: vec![Outcome::Permanent],
                    ..S::new("r", Retriable)
                },
            ],
            &journal,
        ),
        scripted_saga("leaf", 1, &[S::new("x", Compensatable)], &journal),
        scripted_saga("parent", 1, &[S::child("kid", "leaf")], &journal),
        fixtures::stuck(),
    ])
}

async fn start(api: &Api, name: &str, key: Option<&str>) -> Uuid {
    let mut headers = Vec::new();
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    let a = api.start_raw(name, "{}", &headers).await;
    assert!(a.status.is_success(), "{}", a.body);
    a.body["id"].as_str().unwrap().parse().unwrap()
}

async fn wait_status(api: &Api, id: Uuid, status: &str) -> Value {
    api.wait_status(&id.to_string(), status).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_deletes_finished_sagas_and_everything_of_theirs_and_keeps_the_rest() {
    let harness = Harness::new(registry()).await;
    let log = harness.stores.log.clone();
    let outbox = harness.stores.outbox.clone();
    let api = harness.serve(HttpConfig::default()).await;

    let mut done = Vec::new();
    for i in 0..30 {
        done.push(start(&api, "s", Some(&format!("key-{i}"))).await);
    }
    for _ in 0..5 {
        done.push(start(&api, "fails", None).await);
    }
    let parent = start(&api, "parent", None).await;
    let attention = start(&api, "stuck_after_pivot", None).await;
    let running = start(&api, "stuck", None).await;
    for &id in &done {
        api.wait(&id.to_string(), |s| {
            matches!(s["status"].as_str(), Some("COMPLETED" | "COMPENSATED"))
        })
        .await;
    }
    let parent_saga = wait_status(&api, parent, "COMPLETED").await;
    let child: Uuid = parent_saga["stages"][0]["child_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    wait_status(&api, attention, "FAILED").await;
    // One finished saga whose delivery is still pending, and whose events come after the
    // relay's cursor: the outbox still owes it something.
    let owed = start(&api, "s", None).await;
    wait_status(&api, owed, "COMPLETED").await;
    let owed_events = log.events(owed).await.unwrap();
    let first = owed_events.first().unwrap().id;
    let delivery = NewDelivery {
        event_id: first,
        target: "http://127.0.0.1:9/hook".to_owned(),
        saga_id: owed,
        kind: TargetKind::Subscriber,
    };
    let to = outbox
        .outbox_after(OutboxPosition::default(), 100_000)
        .await
        .unwrap();
    let at_first = to.iter().find(|e| e.id() == first).unwrap().position;
    assert!(outbox
        .advance_relay(RELAY_NAME, OutboxPosition::default(), at_first, &[delivery])
        .await
        .unwrap());
    // One finished after the cursor: its events are not relayed yet.
    let late = start(&api, "s", None).await;
    wait_status(&api, late, "COMPLETED").await;

    let before = log.now().await.unwrap() + 1;
    let options = PurgeOptions {
        page: 7,
        ..PurgeOptions::default()
    };
    let dry = purge_finished_before(
        log.as_ref(),
        before,
        &PurgeOptions {
            dry_run: true,
            ..options.clone()
        },
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(
        api.saga_count().await,
        done.len() + 6,
        "a dry run deletes nothing"
    );
    // Every finished saga before the cursor and the parent; its child only once the parent
    // has gone, `late` and `owed` not while the outbox owes them.
    assert_eq!(dry.purged as usize, done.len() + 1, "{dry:?}");

    // The relay's cursor is at `owed`'s first event: everything finished after it is owed.
    // Move it to the end, except for `owed`'s pending delivery.
    let all = outbox.outbox_after(at_first, 100_000).await.unwrap();
    let end = all.last().unwrap().position;
    assert!(outbox
        .advance_relay(RELAY_NAME, at_first, end, &[])
        .await
        .unwrap());

    // A load runs meanwhile: it finishes, whole, after `before`.
    let load: Vec<Uuid> = {
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(start(&api, "s", None).await);
        }
        ids
    };
    let report = purge_finished_before(log.as_ref(), before, &options, |_| {})
        .await
        .unwrap();
    // Every finished saga, `late`, the parent and its child (the child on a second walk).
    assert_eq!(report.purged as usize, done.len() + 3, "{report:?}");
    for &id in done.iter().chain([&late, &parent, &child]) {
        let (status, body) = api.get(&format!("/v1/sagas/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        let (status, _) = api.get(&format!("/v1/sagas/{id}/events")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(log.attempts(id).await.unwrap().is_empty());
        assert!(log.events(id).await.unwrap().is_empty());
    }
    // Their keys went with them: the same key starts a new saga.
    let again = api
        .start_raw("s", "{}", &[("idempotency-key", "key-0")])
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert!(!again.replayed());
    assert_ne!(again.body["id"], json!(done[0].to_string()));

    // Kept: the one that needs a person, the running one, the owed one, the load.
    for (id, status) in [
        (attention, "FAILED"),
        (running, "RUNNING"),
        (owed, "COMPLETED"),
    ] {
        let (code, saga) = api.get(&format!("/v1/sagas/{id}")).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(saga["status"], status);
    }
    assert!(!outbox.deliveries(owed).await.unwrap().is_empty());
    for &id in &load {
        let saga = wait_status(&api, id, "COMPLETED").await;
        assert_eq!(saga["steps"].as_array().unwrap().len(), 3);
        assert_eq!(
            log.events(id).await.unwrap().last().unwrap().kind,
            "saga.completed"
        );
    }
    // New events still get ids above everything before (the relay's cursor must not skip
    // them).
    let newest = outbox.outbox_after(end, 100_000).await.unwrap();
    assert!(!newest.is_empty());
    assert!(newest.iter().all(|e| e.position > end));

    // Nothing more to do.
    let second = purge_finished_before(log.as_ref(), before, &options, |_| {})
        .await
        .unwrap();
    assert_eq!(second.purged, 0);
    api.shut_down();
    harness.engine.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_deletes_trigger_refusals_recorded_before_the_bound_and_keeps_later_ones() {
    use orchestrator::store::triggers::NewRefusal;
    let harness = Harness::new(registry()).await;
    let log = harness.stores.log.clone();
    let refusal = |seq: u64| NewRefusal {
        trigger: "orders.placed=s",
        stream: "ORDERS",
        stream_seq: seq,
        subject: "orders.placed",
        error: "the body is not JSON",
        body: b"not json",
    };
    for seq in 1..=3 {
        assert!(log.record_trigger_refusal(&refusal(seq)).await.unwrap());
    }
    let before = log.now().await.unwrap() + 1;
    // The store's clock counts milliseconds: wait until it has passed the bound.
    while log.now().await.unwrap() <= before {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(log.record_trigger_refusal(&refusal(4)).await.unwrap());

    let dry = purge_finished_before(
        log.as_ref(),
        before,
        &PurgeOptions {
            dry_run: true,
            ..PurgeOptions::default()
        },
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(dry.refusals, 3, "{dry:?}");
    assert_eq!(
        log.trigger_refusals(None, 10).await.unwrap().len(),
        4,
        "a dry run deletes nothing"
    );

    let report = purge_finished_before(log.as_ref(), before, &PurgeOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(report.refusals, 3, "{report:?}");
    let kept: Vec<i64> = log
        .trigger_refusals(None, 10)
        .await
        .unwrap()
        .iter()
        .map(|r| r.stream_seq)
        .collect();
    assert_eq!(
        kept,
        [4],
        "only the refusal recorded after the bound is kept"
    );
    let counts = log.trigger_refusal_counts().await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(counts[0].refused, 1);

    let again = purge_finished_before(log.as_ref(), before, &PurgeOptions::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(again.refusals, 0);
    harness.engine.shutdown.cancel();
}
