//! Flow control (SPEC §14) in one process against a real database (a SQLite file, or
//! PostgreSQL with `SAGA_TEST_BACKEND=postgres`): concurrency limits per definition and per
//! key, checked from the attempt log's intervals; priority and fairness in the order sagas
//! start; rate limiters measured from the participant's own clock; limits changed while sagas
//! run. Several processes sharing PostgreSQL are in `flow_processes.rs`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::model::{LimitChange, SagaStatus};
use orchestrator::store::{Audit, Store};
use orchestrator::{Engine, StartRequest};
use saga_dsl::{Rate, SagaDefinition, Step, StepContext, StepError};
use saga_suite::{registry_of, test_config, wait_for, RunningEngine, TempDb};
use serde_json::json;
use uuid::Uuid;

/// A definition `name` of one pivot step that takes `ms` and records when it ran (the
/// participant's own clock), optionally from the rate limiter `bank`.
fn timed(name: &str, ms: u64, times: &Arc<Mutex<Vec<i64>>>) -> saga_dsl::SagaBuilder {
    let times = times.clone();
    let work = move |_: StepContext| {
        let times = times.clone();
        async move {
            times.lock().unwrap().push(now_ms());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, StepError>(())
        }
    };
    SagaDefinition::builder(name, 1).step(Step::pivot("work", work))
}

/// A definition `name` of one pivot call taking a token from `limiter` (`rate`, `burst`) and
/// recording, on the participant's own clock, when it is called.
fn paced(
    name: &str,
    limiter: &str,
    rate: Rate,
    burst: u32,
) -> (SagaDefinition, Arc<Mutex<Vec<i64>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let recorded = calls.clone();
    let call = move |_: StepContext| {
        let recorded = recorded.clone();
        async move {
            recorded.lock().unwrap().push(now_ms());
            Ok::<_, StepError>(())
        }
    };
    let def = SagaDefinition::builder(name, 1)
        .rate_limiter(limiter, rate, burst)
        .step(Step::pivot("call", call).rate_limited(limiter))
        .build()
        .unwrap();
    (def, calls)
}

/// The most of the sorted `times` in any one-second window, and where that window starts.
fn busiest_second(times: &[i64]) -> (usize, i64) {
    times
        .iter()
        .enumerate()
        .map(|(i, &t)| (times[i..].iter().take_while(|&&u| u < t + 1000).count(), t))
        .max_by_key(|&(n, _)| n)
        .unwrap_or((0, 0))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Each saga's running interval from the attempt log: its first attempt's start to its last
/// attempt's end.
async fn intervals(store: &Arc<dyn Store>, ids: &[Uuid]) -> Vec<(Uuid, i64, i64)> {
    let mut out = Vec::new();
    for &id in ids {
        let attempts = store.attempts(id).await.unwrap();
        let start = attempts.iter().map(|a| a.started_at).min().unwrap();
        let end = attempts.iter().filter_map(|a| a.ended_at).max().unwrap();
        out.push((id, start, end));
    }
    out
}

/// The most intervals open at once.
fn most_at_once(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    // An end and a start at the same millisecond do not overlap.
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    most as usize
}

async fn wait_all(store: &Arc<dyn Store>, ids: &[Uuid], timeout: Duration) {
    for &id in ids {
        let saga = wait_for(store, id, timeout, |s| s.status.is_terminal()).await;
        assert_eq!(saga.status, SagaStatus::Completed, "{id}");
    }
}

async fn start_many(engine: &Engine, name: &str, inputs: Vec<serde_json::Value>) -> Vec<Uuid> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, input) in inputs.into_iter().enumerate() {
        let engine = engine.clone();
        let name = name.to_owned();
        tasks.spawn(async move { (i, engine.start_saga(&name, input).await.unwrap().id) });
    }
    let mut ids = tasks.join_all().await;
    ids.sort_unstable();
    ids.into_iter().map(|(_, id)| id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_key_and_max_running_limits_hold_from_the_attempt_log() {
    let db = TempDb::new();
    let store = db.store().await;
    let times = Arc::new(Mutex::new(Vec::new()));
    let def = timed("payout_like", 30, &times)
        .per_key("per_merchant", "merchant", 1)
        .max_running("running", 3)
        .build()
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let inputs = (0..60)
        .map(|i| json!({"merchant": format!("m{}", i % 5), "n": i}))
        .collect();
    let ids = start_many(&eng.engine, "payout_like", inputs).await;
    // Waiting sagas say on what.
    let waiting = store
        .get_saga(*ids.last().unwrap())
        .await
        .unwrap()
        .unwrap()
        .shown();
    if waiting.status == SagaStatus::Queued {
        let word = waiting.waiting_for.unwrap_or_default();
        assert!(
            word == "limit:per_merchant" || word == "limit:running",
            "{word}"
        );
    }
    wait_all(&store, &ids, Duration::from_secs(60)).await;
    let all = intervals(&store, &ids).await;
    let mut by_key: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for (i, (_, s, e)) in all.iter().enumerate() {
        by_key
            .entry(format!("m{}", i % 5))
            .or_default()
            .push((*s, *e));
    }
    for (key, spans) in &by_key {
        assert_eq!(most_at_once(spans), 1, "two sagas of {key} ran at once");
    }
    let spans: Vec<_> = all.iter().map(|&(_, s, e)| (s, e)).collect();
    let most = most_at_once(&spans);
    assert!(most <= 3, "{most} ran at once under a limit of 3");
    assert!(most >= 2, "the limit of 3 let only {most} run at once");
    let limits = store.limits().await.unwrap();
    let running = limits.iter().find(|l| l.name == "running").unwrap();
    assert_eq!((running.in_use, running.waiting), (0, 0));
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_without_the_key_field_is_refused_and_creates_nothing() {
    let db = TempDb::new();
    let store = db.store().await;
    let times = Arc::new(Mutex::new(Vec::new()));
    let def = timed("keyed", 1, &times)
        .per_key("per_merchant", "merchant", 1)
        .build()
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let err = eng
        .engine
        .start_saga("keyed", json!({"merchant": {"nested": 1}}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("merchant"), "{err}");
    let page = store
        .list_sagas(&orchestrator::model::ListFilter::default())
        .await
        .unwrap();
    assert!(page.sagas.is_empty());
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn higher_priority_sagas_start_before_a_queue_of_lower_ones() {
    let db = TempDb::new();
    let store = db.store().await;
    let times = Arc::new(Mutex::new(Vec::new()));
    let def = timed("batch", 2, &times).build().unwrap();
    let mut config = test_config();
    config.workers = 2;
    // Sagas are created before the engine runs: every one of them waits in the database.
    let eng = Engine::new(store.clone(), Arc::new(registry_of([def])), config);
    let mut low = Vec::new();
    for i in 0..2000 {
        low.push(eng.start_saga("batch", json!({"i": i})).await.unwrap().id);
    }
    let mut high = Vec::new();
    for i in 0..3 {
        let request = StartRequest::new("batch", json!({"high": i})).with_priority(9);
        let outcome = eng.start(request).await.unwrap();
        let orchestrator::StartOutcome::Created { saga, .. } = outcome else {
            panic!("a plain start creates");
        };
        assert_eq!(saga.priority, 9);
        high.push(saga.id);
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = {
        let (eng, shutdown) = (eng.clone(), shutdown.clone());
        tokio::spawn(async move { eng.run(shutdown).await })
    };
    wait_all(&store, &high, Duration::from_secs(60)).await;
    let high_started = intervals(&store, &high).await;
    let last_high = high_started.iter().map(|&(_, s, _)| s).max().unwrap();
    // Count the low ones that started before the last high one: at most the workers' worth
    // claimed in the same first claim.
    let mut before = 0;
    for &id in &low {
        let attempts = store.attempts(id).await.unwrap();
        if attempts.iter().any(|a| a.started_at < last_high) {
            before += 1;
        }
    }
    assert!(
        before <= 2,
        "{before} priority-5 sagas started before the priority-9 ones"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_with_a_long_queue_delays_another_keys_saga_by_one_turn_at_most() {
    let db = TempDb::new();
    let store = db.store().await;
    let times = Arc::new(Mutex::new(Vec::new()));
    let def = timed("fair", 5, &times)
        .per_key("per_customer", "customer", 100)
        .max_running("one_at_a_time", 1)
        .build()
        .unwrap();
    let eng = Engine::new(store.clone(), Arc::new(registry_of([def])), test_config());
    let mut crowd = Vec::new();
    for i in 0..1000 {
        let input = json!({"customer": "busy", "i": i});
        crowd.push(eng.start_saga("fair", input).await.unwrap().id);
    }
    let single = eng
        .start_saga("fair", json!({"customer": "quiet"}))
        .await
        .unwrap()
        .id;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = {
        let (eng, shutdown) = (eng.clone(), shutdown.clone());
        tokio::spawn(async move { eng.run(shutdown).await })
    };
    wait_all(&store, &[single], Duration::from_secs(60)).await;
    let quiet = intervals(&store, &[single]).await[0].1;
    let mut before = 0;
    for &id in crowd.iter().take(20) {
        let attempts = store.attempts(id).await.unwrap();
        if attempts.iter().any(|a| a.started_at < quiet) {
            before += 1;
        }
    }
    assert!(before <= 1, "{before} of the busy key's sagas went first");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limiter_lets_no_more_than_its_rate_and_burst_through_in_any_second() {
    let db = TempDb::new();
    let store = db.store().await;
    let (def, calls) = paced("paced", "bank", Rate::per_second(20), 5);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let ids = start_many(
        &eng.engine,
        "paced",
        (0..80).map(|i| json!({"i": i})).collect(),
    )
    .await;
    // While they wait, steps say on what.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let page = store
        .list_sagas(&orchestrator::model::ListFilter::default())
        .await
        .unwrap();
    assert!(
        page.sagas
            .iter()
            .any(|s| s.waiting_for.as_deref() == Some("rate:bank")),
        "no saga shows rate:bank"
    );
    wait_all(&store, &ids, Duration::from_secs(60)).await;
    let mut times = calls.lock().unwrap().clone();
    times.sort_unstable();
    assert_eq!(times.len(), 80);
    // In any one-second window, at most the rate plus the burst: the token bucket's bound,
    // whichever second it is (one after a pause gets the whole burst).
    let (most, from) = busiest_second(&times);
    assert!(most <= 25, "{most} calls in the second from {from}");
    let span = times.last().unwrap() - times.first().unwrap();
    assert!(
        span >= 74 * 50,
        "80 calls at 20/s with a burst of 5 took only {span} ms"
    );
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lowering_a_limit_holds_back_new_starts_without_stopping_running_ones() {
    let db = TempDb::new();
    let store = db.store().await;
    let times = Arc::new(Mutex::new(Vec::new()));
    let def = timed("slow", 400, &times)
        .max_running("slow_running", 4)
        .build()
        .unwrap();
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let ids = start_many(
        &eng.engine,
        "slow",
        (0..16).map(|i| json!({"i": i})).collect(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let changed_at = now_ms();
    let info = store
        .set_limit(
            "slow_running",
            &LimitChange::Limit(1),
            Audit::by("ops").because("the bank is slow"),
        )
        .await
        .unwrap();
    assert_eq!(info.limit, Some(1));
    assert_eq!(info.updated_by.as_deref(), Some("ops"));
    wait_all(&store, &ids, Duration::from_secs(60)).await;
    let all = intervals(&store, &ids).await;
    // The ones running when it changed finished; from a second later, one at a time.
    let spans: Vec<_> = all
        .iter()
        .filter(|&&(_, s, _)| s > changed_at + 1000)
        .map(|&(_, s, e)| (s, e))
        .collect();
    assert!(!spans.is_empty());
    let running_then: Vec<_> = all.iter().filter(|&&(_, s, _)| s < changed_at).collect();
    assert!(running_then.len() >= 2, "{running_then:?}");
    let later: Vec<_> = all
        .iter()
        .map(|&(_, s, e)| (s, e))
        .filter(|&(_, e)| e > changed_at + 1000)
        .collect();
    assert!(
        most_at_once(&later) <= 1,
        "more than one ran after the limit fell to 1"
    );
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_of_sagas_paused_past_their_moment_lapse_and_never_crowd_a_second() {
    let db = TempDb::new();
    let store = db.store().await;
    let (def, calls) = paced("slow_bank", "trickle", Rate::per_second(2), 1);
    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    eng.ready().await;
    let ids = start_many(
        &eng.engine,
        "slow_bank",
        (0..8).map(|i| json!({"i": i})).collect(),
    )
    .await;
    // Every one but the first waits for its moment, up to 3.5 s ahead; pause them all there.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ops = orchestrator::operations::Operations::new(store.as_ref());
    let reason = orchestrator::operations::Reason::parse("the bank is down").unwrap();
    let mut paused = Vec::new();
    for &id in &ids {
        if ops.pause(id, &reason, "ops").await.is_ok() {
            paused.push(id);
        }
    }
    assert!(paused.len() >= 6, "only {} paused", paused.len());
    // Past every reserved moment, resumed at once: the lapsed reservations must not all go.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for &id in &paused {
        wait_for(&store, id, Duration::from_secs(10), |s| {
            s.status == SagaStatus::Paused
        })
        .await;
        ops.resume(id, &reason, "ops").await.unwrap();
    }
    wait_all(&store, &ids, Duration::from_secs(60)).await;
    let mut times = calls.lock().unwrap().clone();
    times.sort_unstable();
    assert_eq!(times.len(), 8);
    let (most, from) = busiest_second(&times);
    assert!(
        most <= 3,
        "{most} calls in the second from {from}: {times:?}"
    );
    eng.stop().await;
}
