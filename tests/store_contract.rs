//! The contract of the `Store` trait, the same cases on every backend: a fresh SQLite file, or a
//! fresh PostgreSQL database with `SAGA_TEST_BACKEND=postgres` (see `tests/README.md`). The
//! store is called directly, without an engine: sagas are created from hand-built `NewSaga`
//! values and changed with hand-built `Transition`s, so each case shows one rule of the store.
//!
//! Covered: fencing (a write under a stale, foreign or given-up lease is refused with
//! `LeaseLost` and writes nothing: no saga, step, attempt or event row), a lease lost to a
//! claim once it expired, group commit (concurrent writes of many sagas where some fail, by a
//! lost lease or a broken statement, and the others still commit), cancels against action
//! starts (the guard) and against the pivot's start, paging and filters of `list_sagas`,
//! `create_saga_leased` with and without its first action written ahead, what `claim` takes
//! (due, unleased or expired, known definitions, its limit, blocked sagas) and
//! `saga_ids_with_prefix`.

#![allow(clippy::unwrap_used)]

use orchestrator::store::Audit;
use std::sync::Arc;
use std::time::Duration;

use orchestrator::model::{
    definition_key, Attempt, Event, IdPrefix, ListFilter, PhaseRecord, Saga, SagaStatus, StepKind,
    StepStatus,
};
use orchestrator::store::{
    Applied, AttemptChange, CancelOutcome, ClaimRequest, Claimed, Lease, LeaseRequest, NewEvent,
    NewSaga, Phase, SagaUpdate, StepUpdate, Store, Transition,
};
use orchestrator::StoreError;
use saga_suite::TempDb;
use serde_json::json;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Building blocks: sagas, transitions, claims and snapshots of the log.

/// The definition hash of the sagas these cases create.
const HASH: &str = "h1";

/// The definition key of a saga named `name` (version 1, [`HASH`]).
fn key_of(name: &str) -> String {
    definition_key(name, 1, HASH)
}

/// A new saga `name` (version 1, [`HASH`]) with the given steps, not yet written.
fn new_saga(name: &str, steps: &[(&str, StepKind)]) -> NewSaga {
    NewSaga {
        id: Uuid::now_v7(),
        name: name.to_owned(),
        version: 1,
        definition_hash: HASH.to_owned(),
        input: json!({"n": 1}),
        steps: steps.iter().map(|(n, k)| ((*n).to_owned(), *k)).collect(),
        first_attempt: false,
        start_at: None,
        traceparent: None,
        flow: orchestrator::store::NewFlow::default(),
        attrs: Vec::new(),
    }
}

/// A saga `s` of two compensatable steps, a pivot and a retriable step.
fn four_steps() -> NewSaga {
    new_saga(
        "s",
        &[
            ("a", StepKind::Compensatable),
            ("b", StepKind::Compensatable),
            ("p", StepKind::Pivot),
            ("r", StepKind::Retriable),
        ],
    )
}

/// A saga `s` of one compensatable step.
fn one_step() -> NewSaga {
    new_saga("s", &[("a", StepKind::Compensatable)])
}

/// The saga-level part of a transition: `status`, due since long ago, nothing else set.
fn saga_update(status: SagaStatus) -> SagaUpdate {
    SagaUpdate {
        status,
        next_run_at: Some(0),
        error: None,
        output: None,
        needs_attention: false,
        pivot_started: false,
        paused_from: None,
    }
}

/// The write-ahead of attempt `attempt` of step `index`'s action, as the engine writes it before
/// a call: saga `RUNNING`, the phase `RUNNING` with its outcome unknown, the attempt started, an
/// event, and the cancel guard of a fresh action start.
fn write_ahead(index: u32, attempt: u32) -> Transition {
    Transition {
        saga: saga_update(SagaStatus::Running),
        new_steps: Vec::new(),
        steps: vec![StepUpdate {
            index,
            phase: Phase::Action,
            record: PhaseRecord {
                status: StepStatus::Running,
                attempts: attempt,
                last_error: None,
                outcome_unknown: true,
                started_at: Some(1),
                ended_at: None,
            },
            output: None,
            wake_at: None,
            waiting_for: None,
            timeout_at: None,
            retry_at: None,
        }],
        attempts: vec![AttemptChange::Start {
            step_index: index,
            phase: Phase::Action,
            attempt,
            seq: index + attempt,
        }],
        events: vec![NewEvent::saga("test.started", json!({"step": index}))],
        unless_cancelled: true,
        unless_paused: false,
        release: false,
        wake: None,
    }
}

/// The success of attempt `attempt` of step `index`'s action, without a next write-ahead.
fn succeeded(index: u32, attempt: u32) -> Transition {
    Transition {
        saga: saga_update(SagaStatus::Running),
        new_steps: Vec::new(),
        steps: vec![StepUpdate {
            index,
            phase: Phase::Action,
            record: PhaseRecord {
                status: StepStatus::Succeeded,
                attempts: attempt,
                last_error: None,
                outcome_unknown: false,
                started_at: Some(1),
                ended_at: Some(2),
            },
            output: Some(json!({"done": index})),
            wake_at: None,
            waiting_for: None,
            timeout_at: None,
            retry_at: None,
        }],
        attempts: vec![AttemptChange::Finish {
            step_index: index,
            phase: Phase::Action,
            attempt,
            outcome: "succeeded",
            error: None,
        }],
        events: vec![NewEvent::saga("test.succeeded", json!({"step": index}))],
        unless_cancelled: false,
        unless_paused: false,
        release: false,
        wake: None,
    }
}

/// Claims up to `limit` due sagas of `definitions` for `owner`, with a one-minute lease.
async fn claim(
    store: &Arc<dyn Store>,
    owner: &str,
    definitions: &[String],
    limit: u32,
) -> Vec<Claimed> {
    store
        .claim(ClaimRequest {
            owner,
            limit,
            lease_ttl_ms: 60_000,
            definitions,
            flows: &[],
        })
        .await
        .unwrap()
}

/// Claims every due saga of `key` for `owner`.
async fn claim_all(store: &Arc<dyn Store>, owner: &str, key: &str) -> Vec<Claimed> {
    claim(store, owner, &[key.to_owned()], 100).await
}

/// Creates `n` one-step sagas `s`, unleased; returns their definition key.
async fn start_unclaimed(store: &Arc<dyn Store>, n: usize) -> String {
    for _ in 0..n {
        store.create_saga(one_step()).await.unwrap();
    }
    key_of("s")
}

/// Everything the log holds about one saga: its row with its steps, its attempts, its events.
async fn log_of(store: &Arc<dyn Store>, id: Uuid) -> (Saga, Vec<Attempt>, Vec<Event>) {
    (
        store.get_saga(id).await.unwrap().unwrap(),
        store.attempts(id).await.unwrap(),
        store.events(id).await.unwrap(),
    )
}

/// The kinds of a saga's events, oldest first.
async fn event_kinds(store: &Arc<dyn Store>, id: Uuid) -> Vec<String> {
    store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// Awaits every future concurrently, each in a task of its own (a small `join_all`).
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futs: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A saga created leased to `owner` for one millisecond, then left until that lease has expired.
async fn created_with_an_expired_lease(store: &Arc<dyn Store>, owner: &str) -> Claimed {
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new(owner, 1))
        .await
        .unwrap();
    // Past the lease on the store's clock (the database's, on PostgreSQL).
    let deadline = store.now().await.unwrap() + 50;
    while store.now().await.unwrap() <= deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    created
}

// ---------------------------------------------------------------------------------------------
// Fencing: a write is applied only under the lease the saga holds now.

#[tokio::test]
async fn a_lease_lost_to_a_claim_writes_nothing_more() {
    let db = TempDb::new();
    let store = db.store().await;
    let old = created_with_an_expired_lease(&store, "paused").await;
    let taken = claim_all(&store, "successor", &key_of("s")).await;
    assert_eq!(taken.len(), 1, "an expired lease is claimable by anyone");
    let new = &taken[0].lease;
    assert_eq!(new.epoch, old.lease.epoch + 1, "a claim bumps the epoch");
    assert_eq!(taken[0].saga.lease_owner.as_deref(), Some("successor"));

    let before = log_of(&store, old.saga.id).await;
    let stale = store.apply(&old.lease, &write_ahead(0, 1)).await;
    assert!(
        matches!(stale, Err(StoreError::LeaseLost(id)) if id == old.saga.id),
        "{stale:?}"
    );
    assert_eq!(
        log_of(&store, old.saga.id).await,
        before,
        "no saga, step, attempt or event row of the stale write"
    );
    assert!(matches!(
        store.release_lease(&old.lease).await,
        Err(StoreError::LeaseLost(_))
    ));

    // The same write under the new lease lands whole.
    assert_eq!(
        store.apply(new, &write_ahead(0, 1)).await.unwrap(),
        Applied::Written
    );
    let (saga, attempts, events) = log_of(&store, old.saga.id).await;
    assert_eq!(saga.status, SagaStatus::Running);
    assert_eq!(saga.steps[0].action.status, StepStatus::Running);
    assert_eq!(saga.steps[0].action.attempts, 1);
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(
        (attempts[0].worker.as_str(), attempts[0].lease_epoch),
        ("successor", new.epoch),
        "an attempt row names the lease it was made under"
    );
    assert_eq!(events.last().unwrap().kind, "test.started");
}

#[tokio::test]
async fn a_lease_needs_both_its_owner_and_its_epoch() {
    let db = TempDb::new();
    let store = db.store().await;
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let lease = created.lease.clone();
    assert_eq!((lease.owner.as_str(), lease.epoch), ("w", 1));
    let before = log_of(&store, lease.saga_id).await;
    let forged = [
        Lease {
            owner: "someone-else".to_owned(),
            ..lease.clone()
        },
        Lease {
            epoch: lease.epoch - 1,
            ..lease.clone()
        },
        Lease {
            epoch: lease.epoch + 1,
            ..lease.clone()
        },
    ];
    for bad in &forged {
        let r = store.apply(bad, &write_ahead(0, 1)).await;
        assert!(matches!(r, Err(StoreError::LeaseLost(_))), "{bad:?}: {r:?}");
        assert!(
            matches!(
                store.release_lease(bad).await,
                Err(StoreError::LeaseLost(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(log_of(&store, lease.saga_id).await, before);
    assert_eq!(
        store.apply(&lease, &write_ahead(0, 1)).await.unwrap(),
        Applied::Written
    );
}

#[tokio::test]
async fn a_lease_given_up_in_a_write_is_gone_and_the_saga_claimable() {
    let db = TempDb::new();
    let store = db.store().await;
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let lease = created.lease.clone();
    store.apply(&lease, &write_ahead(0, 1)).await.unwrap();
    let mut done = succeeded(0, 1);
    done.release = true;
    assert_eq!(store.apply(&lease, &done).await.unwrap(), Applied::Written);
    let (saga, _, _) = log_of(&store, lease.saga_id).await;
    assert_eq!(saga.lease_owner, None, "released in the same write");
    assert_eq!(saga.steps[0].action.status, StepStatus::Succeeded);
    assert_eq!(saga.steps[0].output, Some(json!({"done": 0})));

    let before = log_of(&store, lease.saga_id).await;
    let again = store.apply(&lease, &write_ahead(1, 1)).await;
    assert!(matches!(again, Err(StoreError::LeaseLost(_))), "{again:?}");
    assert!(matches!(
        store.release_lease(&lease).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert_eq!(log_of(&store, lease.saga_id).await, before);

    let next = claim_all(&store, "w2", &key_of("s")).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].lease.epoch, 2);
    assert_eq!(
        next[0].saga.steps, before.0.steps,
        "the next owner resumes from the log"
    );
}

#[tokio::test]
async fn release_lease_frees_the_saga_without_changing_it() {
    let db = TempDb::new();
    let store = db.store().await;
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    store
        .apply(&created.lease, &write_ahead(0, 1))
        .await
        .unwrap();
    let (before, attempts_before, events_before) = log_of(&store, created.saga.id).await;
    store.release_lease(&created.lease).await.unwrap();
    let (after, attempts, events) = log_of(&store, created.saga.id).await;
    assert_eq!(after.lease_owner, None);
    assert_eq!(
        after.lease_epoch, before.lease_epoch,
        "a release bumps nothing"
    );
    assert_eq!(
        (after.status, &after.steps, after.next_run_at),
        (before.status, &before.steps, before.next_run_at)
    );
    assert_eq!((attempts, events), (attempts_before, events_before));
    let next = claim_all(&store, "w2", &key_of("s")).await;
    assert_eq!(next.len(), 1, "claimable at once");
    assert_eq!(next[0].lease.epoch, 2);
}

#[tokio::test]
async fn an_unexpired_lease_is_not_claimed() {
    let db = TempDb::new();
    let store = db.store().await;
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    assert!(claim_all(&store, "other", &key_of("s")).await.is_empty());
    let saga = store.get_saga(created.saga.id).await.unwrap().unwrap();
    assert_eq!(
        (saga.lease_owner.as_deref(), saga.lease_epoch),
        (Some("w"), 1)
    );
}

// ---------------------------------------------------------------------------------------------
// Group commit: concurrent writes share commits, and each fails or succeeds on its own.

#[tokio::test]
async fn group_commit_fails_only_the_writes_whose_lease_is_lost() {
    let db = TempDb::new();
    let store = db.store().await;
    let key = start_unclaimed(&store, 60).await;
    let claimed = claim_all(&store, "w", &key).await;
    assert_eq!(claimed.len(), 60);
    // An operator takes every third saga over: those leases are gone.
    for c in claimed.iter().step_by(3) {
        store
            .abort(c.saga.id, &Audit::by("ops@test").because("test"))
            .await
            .unwrap();
    }
    let commits_before = store.commits();
    let writes = claimed.iter().map(|c| {
        let store = store.clone();
        let lease = c.lease.clone();
        async move {
            let t = Transition {
                saga: SagaUpdate {
                    status: SagaStatus::Running,
                    next_run_at: Some(0),
                    error: Some("written".to_owned()),
                    output: None,
                    needs_attention: false,
                    pivot_started: false,
                    paused_from: None,
                },
                new_steps: Vec::new(),
                steps: vec![],
                attempts: vec![],
                events: vec![NewEvent::saga("test.written", json!({}))],
                unless_cancelled: false,
                unless_paused: false,
                release: false,
                wake: None,
            };
            store.apply(&lease, &t).await
        }
    });
    let results = futures_join_all(writes).await;
    let commits = store.commits() - commits_before;
    for (i, (c, r)) in claimed.iter().zip(&results).enumerate() {
        let saga = store.get_saga(c.saga.id).await.unwrap().unwrap();
        if i % 3 == 0 {
            assert!(matches!(r, Err(StoreError::LeaseLost(_))), "{r:?}");
            assert_eq!(
                saga.status,
                SagaStatus::Aborted,
                "nothing of the stale write landed"
            );
        } else {
            assert_eq!(r.as_ref().unwrap(), &Applied::Written);
            assert_eq!(saga.error.as_deref(), Some("written"));
            let events = store.events(c.saga.id).await.unwrap();
            assert_eq!(events.last().unwrap().kind, "test.written");
        }
    }
    assert!(
        commits < 60,
        "60 concurrent writes took {commits} commits: no grouping"
    );
}

#[tokio::test]
async fn a_stale_write_sharing_a_batch_with_the_new_owners_write_fails_alone() {
    // The driver that lost a saga and the one that took it over may write in the same group
    // commit: the fence is per lease, not per saga, so nothing of the stale write lands.
    let db = TempDb::new();
    let store = db.store().await;
    let key = start_unclaimed(&store, 20).await;
    let stale = claim_all(&store, "old", &key).await;
    assert_eq!(stale.len(), 20);
    for c in &stale {
        store.release_lease(&c.lease).await.unwrap();
    }
    let current = claim_all(&store, "new", &key).await;
    assert_eq!(current.len(), 20);
    let write = |lease: Lease, kind: &'static str, start_step: bool| {
        let store = store.clone();
        async move {
            let record = PhaseRecord {
                status: StepStatus::Running,
                attempts: 1,
                last_error: None,
                outcome_unknown: true,
                started_at: Some(0),
                ended_at: None,
            };
            let t = Transition {
                saga: SagaUpdate {
                    status: SagaStatus::Running,
                    next_run_at: Some(0),
                    error: Some(kind.to_owned()),
                    output: None,
                    needs_attention: false,
                    pivot_started: false,
                    paused_from: None,
                },
                new_steps: Vec::new(),
                steps: if start_step {
                    vec![StepUpdate {
                        index: 0,
                        phase: Phase::Action,
                        record,
                        output: None,
                        wake_at: None,
                        waiting_for: None,
                        timeout_at: None,
                        retry_at: None,
                    }]
                } else {
                    vec![]
                },
                attempts: if start_step {
                    vec![AttemptChange::Start {
                        step_index: 0,
                        phase: Phase::Action,
                        attempt: 1,
                        seq: 1,
                    }]
                } else {
                    vec![]
                },
                events: vec![NewEvent::saga(kind, json!({}))],
                unless_cancelled: false,
                unless_paused: false,
                release: false,
                wake: None,
            };
            store.apply(&lease, &t).await
        }
    };
    let writes = stale.iter().zip(&current).flat_map(|(old, new)| {
        [
            write(old.lease.clone(), "test.stale", true),
            write(new.lease.clone(), "test.current", false),
        ]
    });
    let results = futures_join_all(writes).await;
    for (i, c) in current.iter().enumerate() {
        let (old, new) = (&results[2 * i], &results[2 * i + 1]);
        assert!(matches!(old, Err(StoreError::LeaseLost(_))), "{old:?}");
        assert_eq!(new.as_ref().unwrap(), &Applied::Written);
        let saga = store.get_saga(c.saga.id).await.unwrap().unwrap();
        assert_eq!(saga.error.as_deref(), Some("test.current"));
        assert_eq!(
            saga.steps[0].action.status,
            StepStatus::Pending,
            "the stale step write did not land"
        );
        assert!(store.attempts(c.saga.id).await.unwrap().is_empty());
        let kinds = event_kinds(&store, c.saga.id).await;
        assert!(kinds.contains(&"test.current".to_owned()), "{kinds:?}");
        assert!(!kinds.contains(&"test.stale".to_owned()), "{kinds:?}");
    }
}

#[tokio::test]
async fn a_write_that_breaks_a_statement_fails_alone_and_the_others_commit() {
    // Every saga is created with its first attempt written ahead. One write starts that same
    // attempt again (the attempt log's key refuses it); written concurrently with the others'
    // results, it fails by itself, nothing of it lands, and its lease still holds.
    let db = TempDb::new();
    let store = db.store().await;
    let mut created = Vec::new();
    for _ in 0..30 {
        let mut new = four_steps();
        new.first_attempt = true;
        created.push(
            store
                .create_saga_leased(new, &LeaseRequest::new("w", 60_000))
                .await
                .unwrap(),
        );
    }
    const BAD: usize = 17;
    let before_bad = log_of(&store, created[BAD].saga.id).await;
    let commits_before = store.commits();
    let writes = created.iter().enumerate().map(|(i, c)| {
        let store = store.clone();
        let lease = c.lease.clone();
        async move {
            let t = if i == BAD {
                write_ahead(0, 1)
            } else {
                succeeded(0, 1)
            };
            store.apply(&lease, &t).await
        }
    });
    let results = futures_join_all(writes).await;
    let commits = store.commits() - commits_before;
    assert!(
        commits < 30,
        "30 concurrent writes took {commits} commits: no grouping"
    );
    for (i, (c, r)) in created.iter().zip(&results).enumerate() {
        let (saga, attempts, events) = log_of(&store, c.saga.id).await;
        if i == BAD {
            assert!(
                matches!(r, Err(e) if !matches!(e, StoreError::LeaseLost(_))),
                "a broken statement is an error of its own: {r:?}"
            );
            assert_eq!(
                (saga, attempts, events),
                before_bad,
                "nothing of the failed write landed"
            );
        } else {
            assert_eq!(r.as_ref().unwrap(), &Applied::Written, "saga {i}");
            assert_eq!(saga.steps[0].action.status, StepStatus::Succeeded);
            assert_eq!(attempts.len(), 1);
            assert_eq!(attempts[0].outcome.as_deref(), Some("succeeded"));
            assert_eq!(events.last().unwrap().kind, "test.succeeded");
        }
    }
    // The failed write cost nothing but itself: the lease is still good.
    assert_eq!(
        store
            .apply(&created[BAD].lease, &succeeded(0, 1))
            .await
            .unwrap(),
        Applied::Written
    );
}

// ---------------------------------------------------------------------------------------------
// Cancels: ordered against action starts by the guard, and against the pivot by the database.

#[tokio::test]
async fn a_cancel_refuses_the_next_action_start_and_nothing_of_it_is_written() {
    let db = TempDb::new();
    let store = db.store().await;
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let lease = created.lease.clone();
    store.apply(&lease, &write_ahead(0, 1)).await.unwrap();
    store.apply(&lease, &succeeded(0, 1)).await.unwrap();
    assert_eq!(
        store
            .request_cancel(lease.saga_id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted
    );
    let before = log_of(&store, lease.saga_id).await;
    assert!(before.0.cancel_requested);
    assert_eq!(
        before.2.last().unwrap().kind,
        "saga.cancel_requested",
        "the cancel is in the history"
    );

    // The next action's start carries the guard: refused, not written, the lease kept.
    assert_eq!(
        store.apply(&lease, &write_ahead(1, 1)).await.unwrap(),
        Applied::CancelRequested
    );
    assert_eq!(log_of(&store, lease.saga_id).await, before);

    // A write without the guard (the compensation that follows) goes through.
    let compensate = Transition {
        saga: SagaUpdate {
            error: Some("cancelled on request".to_owned()),
            ..saga_update(SagaStatus::Compensating)
        },
        new_steps: Vec::new(),
        steps: vec![],
        attempts: vec![AttemptChange::Start {
            step_index: 0,
            phase: Phase::Compensation,
            attempt: 1,
            seq: 2,
        }],
        events: vec![NewEvent::saga("saga.compensating", json!({}))],
        unless_cancelled: false,
        unless_paused: false,
        release: false,
        wake: None,
    };
    assert_eq!(
        store.apply(&lease, &compensate).await.unwrap(),
        Applied::Written
    );
    let saga = store.get_saga(lease.saga_id).await.unwrap().unwrap();
    assert_eq!(saga.status, SagaStatus::Compensating);
    assert_eq!(
        store
            .request_cancel(lease.saga_id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::AlreadyCompensating
    );
}

#[tokio::test]
async fn a_cancel_after_the_pivot_started_is_refused_and_not_recorded() {
    let db = TempDb::new();
    let store = db.store().await;
    let created = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let lease = created.lease.clone();
    for i in 0..2 {
        store.apply(&lease, &write_ahead(i, 1)).await.unwrap();
        store.apply(&lease, &succeeded(i, 1)).await.unwrap();
    }
    let mut pivot = write_ahead(2, 1);
    pivot.saga.pivot_started = true;
    assert_eq!(store.apply(&lease, &pivot).await.unwrap(), Applied::Written);
    let before = log_of(&store, lease.saga_id).await;
    assert!(before.0.pivot_started);
    assert_eq!(
        store
            .request_cancel(lease.saga_id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::PastPivot
    );
    let after = log_of(&store, lease.saga_id).await;
    assert!(!after.0.cancel_requested);
    assert_eq!(after, before, "a refused cancel writes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_the_pivot_start_is_ordered_by_the_database() {
    // Each saga's first step is its pivot. Its start and a cancel are sent at the same moment:
    // either the cancel wins (accepted, the start refused and not written) or the start does
    // (written, the cancel refused as past the pivot); never both, never neither.
    let db = TempDb::new();
    let store = db.store().await;
    let mut leases = Vec::new();
    for _ in 0..24 {
        let new = new_saga("s", &[("p", StepKind::Pivot), ("r", StepKind::Retriable)]);
        leases.push(
            store
                .create_saga_leased(new, &LeaseRequest::new("w", 60_000))
                .await
                .unwrap()
                .lease,
        );
    }
    let races = leases.iter().map(|lease| {
        let (store, lease) = (store.clone(), lease.clone());
        async move {
            let mut start = write_ahead(0, 1);
            start.saga.pivot_started = true;
            let cancel = tokio::spawn({
                let store = store.clone();
                let id = lease.saga_id;
                async move { store.request_cancel(id, &Audit::default()).await.unwrap() }
            });
            let started = store.apply(&lease, &start).await.unwrap();
            (started, cancel.await.unwrap())
        }
    });
    let outcomes = futures_join_all(races).await;
    for (lease, (started, cancelled)) in leases.iter().zip(outcomes) {
        let (saga, attempts, events) = log_of(&store, lease.saga_id).await;
        let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
        match (started, cancelled) {
            (Applied::CancelRequested, CancelOutcome::Accepted) => {
                assert!(saga.cancel_requested && !saga.pivot_started, "{saga:?}");
                assert_eq!(saga.steps[0].action.status, StepStatus::Pending);
                assert!(attempts.is_empty(), "{attempts:?}");
                assert!(!kinds.contains(&"test.started"), "{kinds:?}");
            }
            (Applied::Written, CancelOutcome::PastPivot) => {
                assert!(saga.pivot_started && !saga.cancel_requested, "{saga:?}");
                assert_eq!(saga.steps[0].action.status, StepStatus::Running);
                assert_eq!(attempts.len(), 1);
                assert!(!kinds.contains(&"saga.cancel_requested"), "{kinds:?}");
            }
            other => panic!("the start and the cancel disagree: {other:?}, {saga:?}"),
        }
    }
}

#[tokio::test]
async fn a_cancel_answers_by_the_state_of_the_saga() {
    let db = TempDb::new();
    let store = db.store().await;
    let queued = store.create_saga(four_steps()).await.unwrap();
    assert_eq!(
        store
            .request_cancel(queued.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Accepted,
        "a saga nobody drives yet"
    );
    let saga = store.get_saga(queued.id).await.unwrap().unwrap();
    assert!(saga.cancel_requested);
    assert!(
        saga.next_run_at.unwrap() <= store.now().await.unwrap(),
        "due, so that a worker compensates it"
    );

    let aborted = store.create_saga(four_steps()).await.unwrap();
    store
        .abort(aborted.id, &Audit::by("ops@test").because("test"))
        .await
        .unwrap();
    assert_eq!(
        store
            .request_cancel(aborted.id, &Audit::default())
            .await
            .unwrap(),
        CancelOutcome::Terminal(SagaStatus::Aborted)
    );
    let unknown = Uuid::now_v7();
    assert!(matches!(
        store.request_cancel(unknown, &Audit::default()).await,
        Err(StoreError::NotFound(id)) if id == unknown
    ));
}

#[tokio::test]
async fn a_second_cancel_is_accepted_and_records_nothing_more() {
    let db = TempDb::new();
    let store = db.store().await;
    let saga = store.create_saga(four_steps()).await.unwrap();
    for _ in 0..2 {
        assert_eq!(
            store
                .request_cancel(saga.id, &Audit::default())
                .await
                .unwrap(),
            CancelOutcome::Accepted
        );
    }
    let requested = event_kinds(&store, saga.id)
        .await
        .into_iter()
        .filter(|kind| kind == "saga.cancel_requested")
        .count();
    assert_eq!(
        requested, 1,
        "one request recorded, however often it is made"
    );
}

// ---------------------------------------------------------------------------------------------
// Creating sagas, leased or not.

#[tokio::test]
async fn create_saga_leased_without_first_attempt_is_queued_under_epoch_one() {
    let db = TempDb::new();
    let store = db.store().await;
    let new = four_steps();
    let id = new.id;
    let created = store
        .create_saga_leased(new, &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    assert_eq!(
        created.lease,
        Lease {
            saga_id: id,
            owner: "w".to_owned(),
            epoch: 1
        }
    );
    let (saga, attempts, events) = log_of(&store, id).await;
    assert_eq!(saga.status, SagaStatus::Queued);
    assert_eq!(
        (saga.lease_owner.as_deref(), saga.lease_epoch),
        (Some("w"), 1)
    );
    assert!(saga.lease_expires_at.is_some());
    assert!(!saga.pivot_started && !saga.cancel_requested && !saga.blocked);
    assert!(saga
        .steps
        .iter()
        .all(|s| s.action == PhaseRecord::pending()));
    let comp: Vec<_> = saga.steps.iter().map(|s| s.compensation.status).collect();
    assert_eq!(
        comp,
        [
            StepStatus::Pending,
            StepStatus::Pending,
            StepStatus::NotNeeded,
            StepStatus::NotNeeded
        ],
        "only compensatable steps have a compensation"
    );
    assert!(attempts.is_empty(), "{attempts:?}");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "saga.started");
    assert_eq!(events[0].data, json!({"name": "s", "version": 1}));
    // The record handed back is what the log holds.
    assert_eq!(
        created.saga,
        Saga {
            lease_expires_at: None,
            // A view computed for readers (`Saga::with_stages`), not part of the record.
            stages: Vec::new(),
            ..saga
        }
    );
}

#[tokio::test]
async fn create_saga_leased_with_first_attempt_writes_the_first_action_ahead() {
    let db = TempDb::new();
    let store = db.store().await;
    let mut new = four_steps();
    new.first_attempt = true;
    let id = new.id;
    let created = store
        .create_saga_leased(new, &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let (saga, attempts, events) = log_of(&store, id).await;
    assert_eq!(saga.status, SagaStatus::Running);
    assert!(!saga.pivot_started, "the first step is compensatable");
    let first = &saga.steps[0].action;
    assert_eq!(
        (first.status, first.attempts, first.outcome_unknown),
        (StepStatus::Running, 1, true)
    );
    assert!(first.started_at.is_some() && first.ended_at.is_none());
    assert!(saga.steps[1..]
        .iter()
        .all(|s| s.action == PhaseRecord::pending()));
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let a = &attempts[0];
    assert_eq!(
        (
            a.step_index,
            a.phase.as_str(),
            a.attempt,
            a.worker.as_str(),
            a.lease_epoch
        ),
        (0, "action", 1, "w", 1)
    );
    assert_eq!((a.ended_at, a.outcome.as_deref()), (None, None));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "saga.started");
    assert_eq!(
        created.saga,
        Saga {
            lease_expires_at: None,
            // A view computed for readers (`Saga::with_stages`), not part of the record.
            stages: Vec::new(),
            ..saga
        }
    );
    // A cancel before the pivot is still accepted.
    assert_eq!(
        store.request_cancel(id, &Audit::default()).await.unwrap(),
        CancelOutcome::Accepted
    );
    // The driver closes the attempt written ahead under the create's lease.
    assert_eq!(
        store.apply(&created.lease, &succeeded(0, 1)).await.unwrap(),
        Applied::Written
    );
    let attempts = store.attempts(id).await.unwrap();
    assert_eq!(attempts[0].outcome.as_deref(), Some("succeeded"));
}

#[tokio::test]
async fn a_first_attempt_of_a_pivot_passes_the_point_of_no_return_in_the_create() {
    let db = TempDb::new();
    let store = db.store().await;
    let mut new = new_saga("s", &[("p", StepKind::Pivot), ("r", StepKind::Retriable)]);
    new.first_attempt = true;
    let id = new.id;
    let created = store
        .create_saga_leased(new, &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    assert!(created.saga.pivot_started);
    let saga = store.get_saga(id).await.unwrap().unwrap();
    assert!(saga.pivot_started);
    assert_eq!(saga.status, SagaStatus::Running);
    assert_eq!(
        store.request_cancel(id, &Audit::default()).await.unwrap(),
        CancelOutcome::PastPivot
    );
}

#[tokio::test]
async fn create_saga_without_a_lease_ignores_first_attempt() {
    let db = TempDb::new();
    let store = db.store().await;
    let mut new = four_steps();
    new.first_attempt = true;
    let id = new.id;
    let created = store.create_saga(new).await.unwrap();
    let (saga, attempts, events) = log_of(&store, id).await;
    assert_eq!(saga.status, SagaStatus::Queued);
    assert_eq!((saga.lease_owner, saga.lease_epoch), (None, 0));
    assert!(!saga.pivot_started);
    assert!(saga
        .steps
        .iter()
        .all(|s| s.action == PhaseRecord::pending()));
    assert!(attempts.is_empty(), "{attempts:?}");
    assert_eq!(events.len(), 1);
    assert_eq!(created.status, SagaStatus::Queued);
    assert_eq!(created.lease_epoch, 0);
    // Due at once: the next claim takes it, as epoch 1.
    let claimed = claim_all(&store, "w", &key_of("s")).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].lease.epoch, 1);
}

// ---------------------------------------------------------------------------------------------
// Claims: due, unleased (or expired) sagas of known definitions, up to a limit.

#[tokio::test]
async fn claim_takes_only_due_sagas_of_the_definitions_it_is_given() {
    let db = TempDb::new();
    let store = db.store().await;
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(store.create_saga(one_step()).await.unwrap().id);
    }
    let mut other_hash = one_step();
    other_hash.definition_hash = "h2".to_owned();
    let other_hash = store.create_saga(other_hash).await.unwrap().id;
    let other_name = store
        .create_saga(new_saga("t", &[("a", StepKind::Compensatable)]))
        .await
        .unwrap()
        .id;

    assert!(
        claim(&store, "w", &[], 10).await.is_empty(),
        "no definitions, nothing claimed"
    );
    let claimed = claim(&store, "w", &[key_of("s")], 10).await;
    let mut ids: Vec<_> = claimed.iter().map(|c| c.saga.id).collect();
    ids.sort();
    mine.sort();
    assert_eq!(ids, mine);
    for c in &claimed {
        assert_eq!(c.lease.saga_id, c.saga.id);
        assert_eq!((c.lease.owner.as_str(), c.lease.epoch), ("w", 1));
        assert_eq!(
            (c.saga.lease_owner.as_deref(), c.saga.lease_epoch),
            (Some("w"), 1)
        );
    }
    for id in [other_hash, other_name] {
        let saga = store.get_saga(id).await.unwrap().unwrap();
        assert_eq!((saga.lease_owner, saga.lease_epoch), (None, 0), "untouched");
    }
    assert!(
        claim(&store, "w2", &[key_of("s")], 10).await.is_empty(),
        "every due saga of s is leased now"
    );
    let both = claim(
        &store,
        "w2",
        &[key_of("t"), definition_key("s", 1, "h2")],
        10,
    )
    .await;
    assert_eq!(both.len(), 2);
}

#[tokio::test]
async fn claim_honours_its_limit_and_never_hands_a_saga_out_twice() {
    let db = TempDb::new();
    let store = db.store().await;
    let key = start_unclaimed(&store, 5).await;
    let mut seen = std::collections::BTreeSet::new();
    for (owner, expected) in [("w1", 2), ("w2", 2), ("w3", 1), ("w4", 0)] {
        let claimed = claim(&store, owner, std::slice::from_ref(&key), 2).await;
        assert_eq!(claimed.len(), expected, "{owner}");
        for c in claimed {
            assert!(seen.insert(c.saga.id), "{} claimed twice", c.saga.id);
        }
    }
    assert_eq!(seen.len(), 5);
}

#[tokio::test]
async fn a_saga_waiting_on_a_timer_or_ended_is_not_claimed() {
    let db = TempDb::new();
    let store = db.store().await;
    let key = key_of("s");
    let waiting = store
        .create_saga_leased(four_steps(), &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let due = store.now().await.unwrap() + 60_000;
    let park = Transition {
        saga: SagaUpdate {
            next_run_at: Some(due),
            ..saga_update(SagaStatus::Running)
        },
        new_steps: Vec::new(),
        steps: vec![],
        attempts: vec![],
        events: vec![],
        unless_cancelled: false,
        unless_paused: false,
        release: true,
        wake: None,
    };
    store.apply(&waiting.lease, &park).await.unwrap();
    let ended = store.create_saga(four_steps()).await.unwrap();
    store
        .abort(ended.id, &Audit::by("ops@test").because("test"))
        .await
        .unwrap();

    assert!(claim_all(&store, "w2", &key).await.is_empty());
    assert_eq!(
        store.next_due(std::slice::from_ref(&key)).await.unwrap(),
        Some(due)
    );
    assert!(!store.due_now(std::slice::from_ref(&key)).await.unwrap());

    // Made due now by an operator: claimable.
    store
        .retry_now(waiting.saga.id, &Audit::by("ops@test"))
        .await
        .unwrap();
    assert!(store.due_now(std::slice::from_ref(&key)).await.unwrap());
    let claimed = claim_all(&store, "w2", &key).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].saga.id, waiting.saga.id);
    assert_eq!(claimed[0].lease.epoch, 2);
}

#[tokio::test]
async fn blocked_sagas_are_flagged_once_and_claimed_by_a_process_that_has_their_definition() {
    let db = TempDb::new();
    let store = db.store().await;
    let known = store.create_saga(one_step()).await.unwrap().id;
    let mut changed = one_step();
    changed.definition_hash = "h2".to_owned();
    let unknown = store.create_saga(changed).await.unwrap().id;
    let unknown_key = definition_key("s", 1, "h2");

    assert_eq!(store.mark_blocked(&[key_of("s")]).await.unwrap(), 1);
    assert_eq!(
        store.mark_blocked(&[key_of("s")]).await.unwrap(),
        0,
        "flagged once"
    );
    let blocked = store.get_saga(unknown).await.unwrap().unwrap();
    assert!(blocked.blocked);
    assert_eq!(blocked.status, SagaStatus::Queued);
    assert!(!store.get_saga(known).await.unwrap().unwrap().blocked);
    let events = store.events(unknown).await.unwrap();
    let flags: Vec<_> = events.iter().filter(|e| e.kind == "saga.blocked").collect();
    assert_eq!(flags.len(), 1, "{events:?}");
    assert_eq!(flags[0].data["definition"], unknown_key);
    // Listed and counted as blocked (the console's filter and counts).
    let only_blocked = ListFilter {
        blocked: true,
        limit: 10,
        ..ListFilter::default()
    };
    let page = store.list_sagas(&only_blocked).await.unwrap();
    let ids: Vec<Uuid> = page.sagas.iter().map(|s| s.id).collect();
    assert_eq!(ids, [unknown]);
    assert_eq!(store.count_flagged().await.unwrap(), (0, 1));

    // A process without the definition never takes it.
    let claimed = claim_all(&store, "w", &key_of("s")).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].saga.id, known);
    let still = store.get_saga(unknown).await.unwrap().unwrap();
    assert!(still.blocked);
    assert_eq!((still.lease_owner, still.lease_epoch), (None, 0));

    // One that has it does, and the flag goes.
    let claimed = claim_all(&store, "w2", &unknown_key).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].saga.id, unknown);
    assert!(!claimed[0].saga.blocked);
    assert!(!store.get_saga(unknown).await.unwrap().unwrap().blocked);
    assert_eq!(store.count_flagged().await.unwrap(), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// Reading the log: pages of `list_sagas`, ids by prefix.

#[tokio::test]
async fn list_sagas_pages_newest_first_with_a_cursor_stable_while_sagas_arrive() {
    let db = TempDb::new();
    let store = db.store().await;
    let mut first = Vec::new();
    for _ in 0..7 {
        first.push(store.create_saga(one_step()).await.unwrap().id);
    }
    let mut newest_first = first.clone();
    newest_first.sort();
    newest_first.reverse();
    let page = |cursor: Option<Uuid>, limit: u32| {
        let store = store.clone();
        async move {
            store
                .list_sagas(&ListFilter {
                    limit,
                    cursor,
                    ..Default::default()
                })
                .await
                .unwrap()
        }
    };
    let ids = |p: &orchestrator::model::SagaPage| p.sagas.iter().map(|s| s.id).collect::<Vec<_>>();

    let p1 = page(None, 3).await;
    assert_eq!(ids(&p1), newest_first[..3]);
    assert_eq!(p1.next_cursor, Some(newest_first[2]));

    // New sagas arrive between pages: they are newer than the cursor, so the pages that
    // follow it still hold exactly the older ones.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let mut later = Vec::new();
    for _ in 0..4 {
        later.push(store.create_saga(one_step()).await.unwrap().id);
    }
    assert!(later.iter().all(|l| first.iter().all(|f| l > f)));

    let p2 = page(p1.next_cursor, 3).await;
    assert_eq!(ids(&p2), newest_first[3..6]);
    let p3 = page(p2.next_cursor, 3).await;
    assert_eq!(ids(&p3), newest_first[6..]);
    assert_eq!(p3.next_cursor, None, "the last page says so");

    // A page that ends exactly at the last saga has no next page either.
    let exact = page(p1.next_cursor, 4).await;
    assert_eq!(ids(&exact), newest_first[3..]);
    assert_eq!(exact.next_cursor, None);

    // A fresh first page starts with the newcomers.
    let fresh = page(None, 4).await;
    let mut newcomers = later.clone();
    newcomers.sort();
    newcomers.reverse();
    assert_eq!(ids(&fresh), newcomers);
    let summary = &p1.sagas[0];
    assert_eq!(
        (summary.name.as_str(), summary.version, summary.status),
        ("s", 1, SagaStatus::Queued)
    );
}

#[tokio::test]
async fn list_sagas_filters_by_status_name_and_attention_and_pages_within_them() {
    let db = TempDb::new();
    let store = db.store().await;
    let mut a = Vec::new();
    for _ in 0..4 {
        a.push(
            store
                .create_saga(new_saga("a", &[("x", StepKind::Compensatable)]))
                .await
                .unwrap()
                .id,
        );
    }
    let mut b = Vec::new();
    for _ in 0..2 {
        b.push(
            store
                .create_saga(new_saga("b", &[("x", StepKind::Compensatable)]))
                .await
                .unwrap()
                .id,
        );
    }
    let flagged = store
        .create_saga_leased(
            new_saga("b", &[("x", StepKind::Compensatable)]),
            &LeaseRequest::new("w", 60_000),
        )
        .await
        .unwrap();
    let flag = Transition {
        saga: SagaUpdate {
            needs_attention: true,
            error: Some("x: stuck".to_owned()),
            ..saga_update(SagaStatus::Compensating)
        },
        new_steps: Vec::new(),
        steps: vec![],
        attempts: vec![],
        events: vec![],
        unless_cancelled: false,
        unless_paused: false,
        release: false,
        wake: None,
    };
    store.apply(&flagged.lease, &flag).await.unwrap();
    b.push(flagged.saga.id);
    for id in &a[..2] {
        store
            .abort(*id, &Audit::by("ops@test").because("test"))
            .await
            .unwrap();
    }

    let list = |filter: ListFilter| {
        let store = store.clone();
        async move {
            let page = store.list_sagas(&filter).await.unwrap();
            page.sagas.into_iter().map(|s| s.id).collect::<Vec<_>>()
        }
    };
    let desc = |ids: &[Uuid]| {
        let mut v = ids.to_vec();
        v.sort();
        v.reverse();
        v
    };
    let all = ListFilter {
        limit: 100,
        ..Default::default()
    };
    let aborted = ListFilter {
        status: Some(SagaStatus::Aborted),
        ..all.clone()
    };
    assert_eq!(list(aborted).await, desc(&a[..2]));
    let name_b = ListFilter {
        name: Some("b".to_owned()),
        ..all.clone()
    };
    assert_eq!(list(name_b).await, desc(&b));
    let attention = ListFilter {
        needs_attention: true,
        ..all.clone()
    };
    assert_eq!(list(attention).await, [flagged.saga.id]);
    assert_eq!(
        store.count_flagged().await.unwrap(),
        (1, 0),
        "counted as the filter lists"
    );
    let queued_a = ListFilter {
        name: Some("a".to_owned()),
        status: Some(SagaStatus::Queued),
        ..all.clone()
    };
    assert_eq!(list(queued_a).await, desc(&a[2..]));
    let nothing = ListFilter {
        name: Some("b".to_owned()),
        status: Some(SagaStatus::Aborted),
        ..all.clone()
    };
    assert!(list(nothing).await.is_empty());

    // Paging one at a time within a filter visits exactly its sagas, newest first.
    let mut cursor = None;
    let mut visited = Vec::new();
    loop {
        let page = store
            .list_sagas(&ListFilter {
                name: Some("a".to_owned()),
                limit: 1,
                cursor,
                ..Default::default()
            })
            .await
            .unwrap();
        visited.extend(page.sagas.iter().map(|s| s.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(visited.len() <= a.len(), "the pages never end: {visited:?}");
    }
    assert_eq!(visited, desc(&a));

    let listed = store
        .list_sagas(&ListFilter {
            needs_attention: true,
            ..all.clone()
        })
        .await
        .unwrap();
    let s = &listed.sagas[0];
    assert_eq!(
        (
            s.name.as_str(),
            s.status,
            s.needs_attention,
            s.error.as_deref()
        ),
        ("b", SagaStatus::Compensating, true, Some("x: stuck"))
    );
}

#[tokio::test]
async fn saga_ids_with_prefix_is_a_range_of_the_ids_in_order() {
    let db = TempDb::new();
    let store = db.store().await;
    let id = |text: &str| Uuid::parse_str(text).unwrap();
    let inside = [
        id("0a1b2c3d-4e5f-7000-8000-000000000001"),
        id("0a1b2c3d-4e5f-7000-8000-000000000002"),
        id("0a1b2c3d-ffff-7fff-bfff-ffffffffffff"),
    ];
    let outside = [
        id("0a1b2c3c-ffff-7fff-bfff-ffffffffffff"),
        id("0a1b2c3e-0000-7000-8000-000000000000"),
    ];
    // Created out of order: the answer is in id order regardless.
    for saga_id in [inside[2], outside[0], inside[0], outside[1], inside[1]] {
        let mut new = one_step();
        new.id = saga_id;
        store.create_saga(new).await.unwrap();
    }
    let find = |prefix: &str, limit: u32| {
        let store = store.clone();
        let prefix = IdPrefix::parse(prefix).unwrap();
        async move { store.saga_ids_with_prefix(&prefix, limit).await.unwrap() }
    };
    assert_eq!(find("0a1b2c3d", 10).await, inside);
    assert_eq!(find("0a1b2c3d", 2).await, inside[..2], "the limit holds");
    assert_eq!(
        find("0A1B2C3D-4E5F-7000-8000-00000000000", 10).await,
        inside[..2],
        "any case, dashes anywhere"
    );
    assert_eq!(
        find("0a1b2c3d-4e5f-7000-8000-000000000002", 10).await,
        [inside[1]],
        "a whole id finds itself"
    );
    assert_eq!(find("0a1b2c3c", 10).await, [outside[0]]);
    assert!(find("ffffffff", 10).await.is_empty());
}

/// The trace context a saga was started in is kept with it, on every create path (plain,
/// leased with its first action written ahead), and read back with the saga and with its
/// outbox events, which carry it to webhooks and brokers.
#[tokio::test]
async fn a_saga_keeps_the_trace_context_it_was_started_in() {
    let db = TempDb::new();
    let stores = db.stores().await;
    let store = stores.log.clone();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut plain = one_step();
    plain.traceparent = Some(tp.to_owned());
    let plain = store.create_saga(plain).await.unwrap();
    let mut ahead = four_steps();
    ahead.traceparent = Some(tp.to_owned());
    ahead.first_attempt = true;
    let ahead = store
        .create_saga_leased(ahead, &LeaseRequest::new("w", 60_000))
        .await
        .unwrap();
    let untraced = store.create_saga(one_step()).await.unwrap();
    for id in [plain.id, ahead.saga.id] {
        let saga = store.get_saga(id).await.unwrap().unwrap();
        assert_eq!(saga.traceparent.as_deref(), Some(tp));
    }
    let saga = store.get_saga(untraced.id).await.unwrap().unwrap();
    assert_eq!(saga.traceparent, None);
    // On PostgreSQL the outbox shows events once no older transaction of the cluster (another
    // test's, say) is still open.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let events = loop {
        let events = stores
            .outbox
            .outbox_after(Default::default(), 100)
            .await
            .unwrap();
        if events.len() == 3 || std::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(events.len(), 3);
    for e in events {
        let expected = (e.saga_id != untraced.id).then_some(tp);
        assert_eq!(e.traceparent.as_deref(), expected, "{e:?}");
    }
}
