//! Flow control (SPEC §14) across three `example-sagas serve` processes sharing one PostgreSQL
//! saga database and one shop database, with the `payout` example: one payout per merchant at
//! a time, the bank's rate limiter shared by every process, a process killed while it holds
//! slots, the bank's rate raised while payouts run, and priority across processes. Every limit
//! is checked twice where it can be: from the attempt log, and from the participants' own
//! clock (the bank's call times and each payout's window). Like `pg_scaleout`, these tests
//! always run on PostgreSQL.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use example_sagas::bank::BankStore;
use example_sagas::payout::{BANK, RUNNING};
use example_sagas::shop::{PayoutLedgerEntry, PayoutTimings, Shop};
use orchestrator::model::{LimitChange, SagaStatus};
use orchestrator::store::{Audit, Store};
use orchestrator::{Engine, StartOutcome, StartRequest};
use saga_dsl::Rate;
use saga_suite::{test_config, Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

/// `Server::spawn` runs every process with a 2-second lease.
const LEASE: Duration = Duration::from_secs(2);

/// One cluster at a time: three servers per test would exhaust the PostgreSQL server's
/// connections, and measured rates are only meaningful without another test's load.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Three processes on one saga database and one shop database.
struct Cluster {
    servers: Vec<Server>,
    store: Arc<dyn Store>,
    shop: Shop,
    // Dropped last: the servers are killed before their databases go.
    shop_db: TempDb,
    _db: TempDb,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    async fn start() -> Self {
        let turn = ONE_AT_A_TIME.lock().await;
        let db = TempDb::postgres();
        let shop_db = TempDb::postgres();
        let store = db.store().await;
        let env = [("SHOP_DATABASE_URL", shop_db.url.as_str())];
        let dir = db.dir.path();
        let mut servers = Vec::new();
        for _ in 0..3 {
            servers.push(Server::spawn(&db.url, dir, &env, &[]).await);
        }
        let shop = Shop::open(&shop_db.url).await.unwrap();
        Self {
            servers,
            store,
            shop,
            shop_db,
            _db: db,
            _turn: turn,
        }
    }

    /// Starts every input as a `payout`, all at once, spread over the servers in turn; the ids
    /// in the order of `inputs`.
    async fn start_all(&self, inputs: Vec<Value>) -> Vec<Uuid> {
        let client = reqwest::Client::new();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, input) in inputs.into_iter().enumerate() {
            let url = format!(
                "{}/v1/sagas/payout",
                self.servers[i % self.servers.len()].base
            );
            let client = client.clone();
            tasks.spawn(async move {
                let r = client.post(url).json(&input).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 202, "{:?}", r.text().await);
                let body: Value = r.json().await.unwrap();
                (i, body["id"].as_str().unwrap().parse::<Uuid>().unwrap())
            });
        }
        let mut ids = tasks.join_all().await;
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Waits until every saga of `ids` has ended, and checks each completed.
    async fn wait_completed(&self, ids: &[Uuid], timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        for &id in ids {
            loop {
                let saga = self.store.get_saga(id).await.unwrap().unwrap();
                if saga.status.is_terminal() {
                    assert_eq!(saga.status, SagaStatus::Completed, "saga {id}: {saga:?}");
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "saga {id} still {:?} (waiting for {:?}) after {timeout:?}",
                    saga.status,
                    saga.waiting_for
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    }

    /// Each saga's running interval from the attempt log: its first attempt's start to its
    /// last attempt's end (every attempt is closed once the saga has ended).
    async fn intervals(&self, ids: &[Uuid]) -> Vec<(i64, i64)> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let attempts = self.store.attempts(id).await.unwrap();
            let start = attempts.iter().map(|a| a.started_at).min().unwrap();
            let mut end = start;
            for a in &attempts {
                let ended = a
                    .ended_at
                    .unwrap_or_else(|| panic!("attempt left open in ended saga {id}: {a:?}"));
                end = end.max(ended);
            }
            out.push((start, end));
        }
        out
    }

    /// For a failure's message: each bank call in the second from `from`, with its payout's
    /// reserved moment (`step.rate_limited`'s `until`, if it waited) and its attempt's start
    /// and worker in the attempt log.
    async fn explain_calls(
        &self,
        ids: &[Uuid],
        payout_ids: &[String],
        timings: &PayoutTimings,
        from: i64,
    ) -> String {
        let mut out = String::new();
        for call in timings
            .bank_calls
            .iter()
            .filter(|b| b.at >= from && b.at < from + 1000)
        {
            let i = payout_ids
                .iter()
                .position(|p| *p == call.payout_id)
                .unwrap();
            let until: Vec<String> = self
                .store
                .events(ids[i])
                .await
                .unwrap()
                .into_iter()
                .filter(|e| e.kind == "step.rate_limited")
                .map(|e| format!("{}@{}", e.data["until"], e.at))
                .collect();
            let attempt: Vec<String> = self
                .store
                .attempts(ids[i])
                .await
                .unwrap()
                .into_iter()
                .filter(|a| a.step == "send_transfer")
                .map(|a| format!("#{} {} by {}", a.attempt, a.started_at, a.worker))
                .collect();
            out.push_str(&format!(
                "  {} saga {} call at +{} (attempt {}): waited {until:?}; attempts {attempt:?}\n",
                call.payout_id,
                ids[i],
                call.at - from,
                call.attempt
            ));
        }
        out
    }

    /// Every payout of `payout_ids` debited, transferred and notified exactly once, never
    /// credited back: the shop's ledger, with the transfers from the ledger of the bank the
    /// servers run in-process on the shop's database.
    async fn assert_effects_once(&self, payout_ids: &[String]) {
        let bank = BankStore::open_existing(&self.shop_db.url).await.unwrap();
        for p in payout_ids {
            let mut entry = self.shop.payout_ledger_for(p).await.unwrap();
            entry.transferred += bank.transferred_for(p).await.unwrap();
            assert_eq!(
                entry,
                PayoutLedgerEntry {
                    debited: 1,
                    transferred: 1,
                    notified: 1,
                    credited: 0,
                },
                "payout {p}"
            );
        }
    }
}

fn payout(payout_id: &str, merchant: &str, simulate: Value) -> Value {
    json!({"payout_id": payout_id, "merchant": merchant, "amount": 100, "simulate": simulate})
}

fn now_ms() -> i64 {
    example_sagas::shop::now_ms()
}

/// The most intervals open at once; an end and a start at the same millisecond do not overlap.
fn most_at_once(intervals: &[(i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = intervals
        .iter()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    edges.sort_unstable();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    usize::try_from(most).unwrap()
}

/// Per merchant, no two payout windows overlap, on the participants' clock; every payout of
/// `payout_ids` has a whole window.
fn assert_participant_windows_apart(timings: &PayoutTimings, payout_ids: &[String]) {
    let mut by_merchant: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for p in payout_ids {
        let t = timings
            .payouts
            .get(p)
            .unwrap_or_else(|| panic!("no timings for {p}"));
        let start = t.debit_started_at.unwrap();
        let end = t
            .notify_ended_at
            .unwrap_or_else(|| panic!("payout {p} never told its merchant: {t:?}"));
        by_merchant
            .entry(&t.merchant)
            .or_default()
            .push((start, end));
    }
    for (merchant, spans) in &by_merchant {
        assert_eq!(
            most_at_once(spans),
            1,
            "two payouts of {merchant} overlapped on the participants' clock: {spans:?}"
        );
    }
}

/// The most of `times` (sorted) within any one second from one of them at or after `from`.
fn most_in_a_second(times: &[i64], from: i64) -> (usize, i64) {
    let mut most = (0, 0);
    for (i, &t) in times.iter().enumerate().filter(|&(_, &t)| t >= from) {
        let n = times[i..].iter().take_while(|&&u| u < t + 1000).count();
        if n > most.0 {
            most = (n, t);
        }
    }
    most
}

fn bank_times(timings: &PayoutTimings) -> Vec<i64> {
    let mut times: Vec<i64> = timings.bank_calls.iter().map(|c| c.at).collect();
    times.sort_unstable();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payouts_of_one_merchant_never_overlap_across_three_processes() {
    let c = Cluster::start().await;
    let payout_ids: Vec<String> = (0..200).map(|i| format!("p{i}")).collect();
    let inputs = payout_ids
        .iter()
        .enumerate()
        .map(|(i, p)| payout(p, &format!("m{}", i % 5), json!({})))
        .collect();
    let ids = c.start_all(inputs).await;
    c.wait_completed(&ids, Duration::from_secs(25)).await;

    // From the attempt log.
    let spans = c.intervals(&ids).await;
    let mut by_merchant: BTreeMap<usize, Vec<(i64, i64)>> = BTreeMap::new();
    for (i, span) in spans.iter().enumerate() {
        by_merchant.entry(i % 5).or_default().push(*span);
    }
    for (m, spans) in &by_merchant {
        assert_eq!(
            most_at_once(spans),
            1,
            "two payouts of m{m} overlapped in the attempt log"
        );
    }
    // From the participants.
    let timings = c.shop.payout_timings().await.unwrap();
    assert_participant_windows_apart(&timings, &payout_ids);
    c.assert_effects_once(&payout_ids).await;
    // Every merchant had a payout running while the others did: the limit is per key.
    assert!(
        most_at_once(&spans) >= 2,
        "payouts of different merchants never ran at once"
    );
    // The processes shared the work.
    let mut workers = BTreeSet::new();
    for &id in &ids {
        for a in c.store.attempts(id).await.unwrap() {
            workers.insert(a.worker);
        }
    }
    assert!(workers.len() >= 2, "attempts by {workers:?} only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bank_limiter_holds_across_three_processes() {
    let c = Cluster::start().await;
    let n = 150;
    let payout_ids: Vec<String> = (0..n).map(|i| format!("b{i}")).collect();
    let inputs = payout_ids
        .iter()
        .map(|p| payout(p, &format!("merchant-{p}"), json!({})))
        .collect();
    let ids = c.start_all(inputs).await;
    c.wait_completed(&ids, Duration::from_secs(25)).await;
    c.assert_effects_once(&payout_ids).await;

    let timings = c.shop.payout_timings().await.unwrap();
    let times = bank_times(&timings);
    assert_eq!(times.len(), n, "one bank call per payout");
    // The token bucket's bound: in any one second at most the rate plus the burst.
    let (most, at) = most_in_a_second(&times, i64::MIN);
    if most > 25 {
        let why = c.explain_calls(&ids, &payout_ids, &timings, at).await;
        panic!("{most} bank calls in the second from {at}:\n{why}");
    }
    // After the burst, the whole run at 20/s at most.
    let span = times.last().unwrap() - times.first().unwrap();
    let paced = i64::try_from(n - 1 - 5).unwrap();
    assert!(
        span >= paced * 50,
        "{n} calls at 20/s with a burst of 5 took only {span} ms: {:?}",
        times.iter().map(|t| t - times[0]).collect::<Vec<_>>()
    );
    // The calls came from every process's workers, not from one.
    let mut workers = BTreeSet::new();
    for &id in &ids {
        for a in c.store.attempts(id).await.unwrap() {
            if a.step == "send_transfer" {
                workers.insert(a.worker);
            }
        }
    }
    assert!(workers.len() >= 2, "bank calls by {workers:?} only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_process_s_payouts_are_taken_over_and_its_merchants_wait_for_them() {
    let mut c = Cluster::start().await;
    let victim_pid = i64::from(c.servers[0].pid());
    let victim = loop {
        let workers = c.store.workers().await.unwrap();
        if let Some(w) = workers.iter().find(|w| w.pid == victim_pid) {
            break w.id.clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Twenty merchants, five payouts each; every step takes 300 ms so that the victim is in
    // the middle of payouts when it dies.
    let merchant_of = |i: usize| format!("k{}", i % 20);
    let payout_ids: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let inputs = payout_ids
        .iter()
        .enumerate()
        .map(|(i, p)| payout(p, &merchant_of(i), json!({"delay_ms": 300})))
        .collect();
    let ids = c.start_all(inputs).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.servers.remove(0).kill9();
    let killed_at = tokio::time::Instant::now();
    // What it held when it died: read afterwards, when nothing can change it any more.
    let mut held = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let s = c.store.get_saga(id).await.unwrap().unwrap();
        if s.lease_owner.as_deref() == Some(victim.as_str()) && !s.status.is_terminal() {
            held.push(i);
        }
    }
    assert!(!held.is_empty(), "the victim held no payout when killed");

    // Taken over within the lease and a margin (a heartbeat's staleness and a poll).
    for &i in &held {
        loop {
            let s = c.store.get_saga(ids[i]).await.unwrap().unwrap();
            if s.status.is_terminal() || s.lease_owner.as_deref().is_some_and(|o| o != victim) {
                break;
            }
            assert!(
                killed_at.elapsed() < LEASE + Duration::from_millis(2500),
                "payout {} (saga {}) not taken over after {:?}",
                payout_ids[i],
                ids[i],
                killed_at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    c.wait_completed(&ids, Duration::from_secs(30)).await;
    c.assert_effects_once(&payout_ids).await;

    let spans = c.intervals(&ids).await;
    let mut by_merchant: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for (i, span) in spans.iter().enumerate() {
        by_merchant.entry(merchant_of(i)).or_default().push(*span);
    }
    for (m, spans) in &by_merchant {
        assert_eq!(
            most_at_once(spans),
            1,
            "two payouts of {m} overlapped in the attempt log"
        );
    }
    // The merchant's next payout after one taken over began only once that one had ended.
    for &h in &held {
        let (start, end) = spans[h];
        for (j, &(s, _)) in spans.iter().enumerate() {
            if j != h && merchant_of(j) == merchant_of(h) && s > start {
                assert!(
                    s >= end,
                    "payout {} of {} began at {s}, before the taken-over {} ended at {end}",
                    payout_ids[j],
                    merchant_of(h),
                    payout_ids[h]
                );
            }
        }
    }
    let timings = c.shop.payout_timings().await.unwrap();
    assert_participant_windows_apart(&timings, &payout_ids);
    // The taken-over payouts were finished by the survivors.
    for &h in &held {
        let attempts = c.store.attempts(ids[h]).await.unwrap();
        let last = attempts.iter().max_by_key(|a| a.started_at).unwrap();
        assert_ne!(last.worker, victim, "{attempts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raising_the_bank_s_rate_at_run_time_speeds_every_process_up() {
    let c = Cluster::start().await;
    let payout_ids: Vec<String> = (0..260).map(|i| format!("r{i}")).collect();
    let inputs = payout_ids
        .iter()
        .map(|p| payout(p, &format!("merchant-{p}"), json!({})))
        .collect();
    let ids = c.start_all(inputs).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let changed_at = now_ms();
    let change = LimitChange::Rate {
        rate: Rate::per_second(40),
        burst: 5,
    };
    let info = c
        .store
        .set_limit(
            BANK,
            &change,
            Audit::by("ops").because("the bank allows more"),
        )
        .await
        .unwrap();
    assert_eq!(
        (info.rate.as_deref(), info.burst),
        (Some("40/s"), Some(5)),
        "{info:?}"
    );
    c.wait_completed(&ids, Duration::from_secs(25)).await;
    c.assert_effects_once(&payout_ids).await;

    let times = bank_times(&c.shop.payout_timings().await.unwrap());
    assert_eq!(times.len(), payout_ids.len(), "one bank call per payout");
    let before: Vec<i64> = times.iter().copied().filter(|&t| t < changed_at).collect();
    assert!(
        before.len() >= 20,
        "only {} calls before the change",
        before.len()
    );
    // The limiter bounds the tokens granted in any second to rate + burst; the bank sees each
    // call a write-ahead's commit after its grant, so a second of the bank's clock can also
    // hold the grants of up to `GRANT_TO_CALL_MS` before it.
    let (most, at) = most_in_a_second(&before, i64::MIN);
    assert!(
        most <= bound(20, 5),
        "{most} calls in the second from {at}, before the change"
    );
    // From a second after the change: faster than the old rate, within the new bound.
    let from = changed_at + 1000;
    let after: Vec<i64> = times.iter().copied().filter(|&t| t >= from).collect();
    assert!(
        after.len() >= 40,
        "only {} calls a second after the change",
        after.len()
    );
    let span = after.last().unwrap() - from;
    let pace = (after.len() - 1) as f64 * 1000.0 / span as f64;
    assert!(
        pace > 20.0,
        "{} calls in {span} ms after the change: {pace:.1}/s",
        after.len()
    );
    let (most, at) = most_in_a_second(&times, from);
    assert!(most <= bound(40, 5), "{most} calls in the second from {at}");
}

/// How long after its token is granted a call may reach the bank: its write-ahead's commit
/// (a group commit on PostgreSQL) and the hand-over to the call.
const GRANT_TO_CALL_MS: usize = 50;

/// The most calls the bank may see in one second of its clock under a limiter of `rate`/s and
/// `burst`: the grants of one second and of the `GRANT_TO_CALL_MS` before it.
fn bound(rate: usize, burst: usize) -> usize {
    rate + burst + (rate * GRANT_TO_CALL_MS).div_ceil(1000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn priority_nine_payouts_overtake_a_queue_started_over_three_processes() {
    let c = Cluster::start().await;
    c.store
        .set_limit(RUNNING, &LimitChange::Limit(1), Audit::by("ops"))
        .await
        .unwrap();
    let low_payouts: Vec<String> = (0..300).map(|i| format!("q{i}")).collect();
    let inputs = low_payouts
        .iter()
        .map(|p| payout(p, &format!("merchant-{p}"), json!({})))
        .collect();
    let low = c.start_all(inputs).await;
    // Let the queue move before the priority-9 ones arrive.
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // The priority-9 starts, through an engine on the same database that only starts them (it
    // does not run: the three servers drive them).
    let registry =
        example_sagas::registry(Arc::new(Shop::open(&c.shop_db.url).await.unwrap())).unwrap();
    let starter = Engine::new(c.store.clone(), Arc::new(registry), test_config());
    let mut high = Vec::new();
    let mut created_at = i64::MAX;
    for i in 0..3 {
        let input = payout(&format!("h{i}"), &format!("vip-{i}"), json!({}));
        let request = StartRequest::new("payout", input).with_priority(9);
        let StartOutcome::Created { saga, .. } = starter.start(request).await.unwrap() else {
            panic!("a plain start creates");
        };
        assert_eq!(saga.priority, 9);
        created_at = created_at.min(saga.created_at);
        high.push(saga.id);
    }
    c.wait_completed(&high, Duration::from_secs(20)).await;
    let last_high = c
        .intervals(&high)
        .await
        .iter()
        .map(|&(s, _)| s)
        .max()
        .unwrap();

    // The priority-5 payouts still waiting when the priority-9 ones arrived (no attempt yet):
    // at most one of them started before the last priority-9 one (admitted in the moment of
    // their starts).
    let mut waiting = 0;
    let mut overtook = Vec::new();
    for &id in &low {
        let first = c
            .store
            .attempts(id)
            .await
            .unwrap()
            .iter()
            .map(|a| a.started_at)
            .min();
        if first.is_none_or(|s| s >= created_at) {
            waiting += 1;
            if first.is_some_and(|s| s < last_high) {
                overtook.push(id);
            }
        }
    }
    assert!(
        waiting >= 100,
        "only {waiting} were waiting: the queue was too short to show anything"
    );
    assert!(
        overtook.len() <= 1,
        "{} queued priority-5 payouts started before the priority-9 ones: {overtook:?}",
        overtook.len()
    );
}
