//! The step log as the kit sees it: the real SQLite store behind a tap that numbers the writes
//! the engine makes to it, stops the process lifetime just before or just after a chosen one
//! (as a kill -9 there would: nothing later reaches the log), and holds virtual time still
//! while the database works.
//!
//! The writes counted are those that change a saga's log: its creation, every transition (a
//! write-ahead, a result, a wait), a lease given back, a child started, a wait parked, a child
//! compensated and a rate limiter's token. Claims, heartbeats and registrations are not: a
//! crash just before or after one leaves the same log as a crash at the write next to it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use orchestrator::model::{
    Attempt, BulkJob, BulkJobPage, Event, IdPrefix, LimitChange, LimitInfo, ListFilter, Millis,
    Saga, SagaPage, SagaStatus, WaitingCounts, Worker,
};
use orchestrator::store::idempotency::{Callback, IdempotencyKey, IdempotentStart, SavedResponse};
use orchestrator::store::outbox::{
    ClaimedDelivery, Delivery, DeliveryOutcome, NewDelivery, OutboxEvent, OutboxPosition,
    RelayProgress,
};
use orchestrator::store::{
    Applied, Audit, BulkClaim, BulkLog, BulkTicket, CancelOutcome, ClaimRequest, Claimed,
    EngineLog, FlowLog, IdempotencyStore, Lease, LeaseRequest, LogReads, Maintenance, NewBulkJob,
    NewFork, NewSaga, OperatorLog, OutboxStore, PurgeCursor, PurgePage, ReceivedSignal,
    SignalOutcome, SignalRequest, Store, TaskAnswer, TaskOutcome, TaskRef, TaskReport, TokenGrant,
    Transition, UnfinishedOf, WorkerInfo,
};
use orchestrator::StoreError;
use saga_dsl::DeclaredLimit;
use serde_json::Value;
use tokio::sync::Notify;
use uuid::Uuid;

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Where a run is stopped: just before or just after the `n`th write (from 1) the engine makes
/// to the step log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// The write does not reach the log; whatever ran before it (a participant's call) did.
    Before(usize),
    /// The write is committed; nothing after it is.
    After(usize),
}

impl CrashPoint {
    /// The number of the write, from 1.
    pub fn write(self) -> usize {
        match self {
            Self::Before(n) | Self::After(n) => n,
        }
    }
}

impl std::fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Before(n) => write!(f, "before:{n}"),
            Self::After(n) => write!(f, "after:{n}"),
        }
    }
}

impl std::str::FromStr for CrashPoint {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("{s:?} is not a crash point (before:N or after:N, N from 1)");
        let (when, n) = s.split_once(':').ok_or_else(bad)?;
        let n: usize = n.parse().map_err(|_| bad())?;
        if n == 0 {
            return Err(bad());
        }
        match when {
            "before" => Ok(Self::Before(n)),
            "after" => Ok(Self::After(n)),
            _ => Err(bad()),
        }
    }
}

/// What the writes of one test world have been, across its process lifetimes, and the crash
/// still to come.
#[derive(Debug, Default)]
pub(crate) struct Tap {
    plan: Mutex<Option<CrashPoint>>,
    writes: Mutex<Vec<String>>,
    /// Told after every counted write.
    written: Notify,
}

impl Tap {
    /// A tap that stops the run at `plan`, once.
    pub(crate) fn crashing_at(plan: Option<CrashPoint>) -> Self {
        Self {
            plan: Mutex::new(plan),
            writes: Mutex::default(),
            written: Notify::new(),
        }
    }

    /// Completes after the next counted write.
    pub(crate) fn written(&self) -> tokio::sync::futures::Notified<'_> {
        self.written.notified()
    }

    /// Plans a crash at `point` (replacing any planned).
    pub(crate) fn plan(&self, point: CrashPoint) {
        *self.plan.lock().unwrap_or_else(|p| p.into_inner()) = Some(point);
    }

    /// The crash planned and not reached yet.
    pub(crate) fn planned(&self) -> Option<CrashPoint> {
        *self.plan.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writes counted so far, each described.
    pub(crate) fn writes(&self) -> Vec<String> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Counts a write; returns the crash planned at it, if any (taken: it happens once).
    fn count(&self, label: String) -> (usize, Option<CrashPoint>) {
        let n = {
            let mut writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
            writes.push(label);
            writes.len()
        };
        let mut plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        match *plan {
            Some(at) if at.write() == n => {
                *plan = None;
                (n, Some(at))
            }
            _ => (n, None),
        }
    }
}

/// One process lifetime's view of the tap: whether it has crashed. Its store calls block its
/// thread, so none is ever in flight while its tasks run.
#[derive(Debug, Default)]
pub(crate) struct Lifeline {
    dead: AtomicBool,
    changed: Notify,
}

impl Lifeline {
    /// Whether this lifetime has crashed.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Marks the lifetime crashed: no store call starts any more.
    pub(crate) fn die(&self) {
        self.dead.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Waits until the lifetime has crashed.
    pub(crate) async fn stopped(&self) {
        loop {
            let changed = self.changed.notified();
            if self.is_dead() {
                return;
            }
            changed.await;
        }
    }
}

/// The store of one process lifetime: the real one behind the tap.
pub(crate) struct TappedStore {
    inner: Arc<dyn Store>,
    tap: Arc<Tap>,
    life: Arc<Lifeline>,
    /// The runtime the store was opened in, which runs its writer.
    db: tokio::runtime::Handle,
}

impl TappedStore {
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        tap: Arc<Tap>,
        life: Arc<Lifeline>,
        db: tokio::runtime::Handle,
    ) -> Self {
        Self {
            inner,
            tap,
            life,
            db,
        }
    }

    /// Runs a store call, unless the lifetime has crashed: then, like a dead process, it never
    /// returns. Virtual time stands still while the call runs.
    async fn pass<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        if self.life.is_dead() {
            return std::future::pending().await;
        }
        let result = self.forward(call).await;
        if self.life.is_dead() {
            return std::future::pending().await;
        }
        result
    }

    async fn forward<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        // The lifetime's thread waits for the call, running nothing else meanwhile: the call's
        // answer, from the database's threads, then never races the lifetime's other tasks, so
        // a seed fixes the order of every write (and so where a crash planned at one falls),
        // and virtual time cannot move while the database works.
        block_on_in(&self.db, call)
    }

    /// A counted write: the crash point may stop the lifetime just before or just after it.
    async fn write<T>(
        &self,
        label: impl FnOnce() -> String,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        if self.life.is_dead() {
            return std::future::pending().await;
        }
        match self.tap.count(label()).1 {
            None => {
                let result = self.pass(call).await;
                self.tap.written.notify_waiters();
                result
            }
            Some(CrashPoint::Before(_)) => {
                self.life.die();
                std::future::pending().await
            }
            Some(CrashPoint::After(_)) => {
                // Committed (or refused by the store, as it would have been), then the end.
                let _ = self.forward(call).await;
                self.life.die();
                std::future::pending().await
            }
        }
    }
}

/// A transition, described by the events it records (or the status it writes).
fn describe(transition: &Transition) -> String {
    if transition.events.is_empty() {
        return format!("saga {}", transition.saga.status);
    }
    let events: Vec<String> = transition
        .events
        .iter()
        .map(|e| match &e.step {
            Some(step) => format!("{} {step}", e.kind),
            None => e.kind.to_owned(),
        })
        .collect();
    events.join(", ")
}

#[async_trait]
impl LogReads for TappedStore {
    async fn get_saga(&self, id: Uuid) -> Result<Option<Saga>> {
        self.pass(self.inner.get_saga(id)).await
    }
    async fn saga_status(&self, id: Uuid) -> Result<Option<SagaStatus>> {
        self.pass(self.inner.saga_status(id)).await
    }
    async fn list_sagas(&self, filter: &ListFilter) -> Result<SagaPage> {
        self.pass(self.inner.list_sagas(filter)).await
    }
    async fn saga_ids_with_prefix(&self, prefix: &IdPrefix, limit: u32) -> Result<Vec<Uuid>> {
        self.pass(self.inner.saga_ids_with_prefix(prefix, limit))
            .await
    }
    async fn waiting(&self) -> Result<WaitingCounts> {
        self.pass(self.inner.waiting()).await
    }
    async fn count_by_status(&self) -> Result<Vec<(SagaStatus, u64)>> {
        self.pass(self.inner.count_by_status()).await
    }
    async fn count_flagged(&self) -> Result<(u64, u64)> {
        self.pass(self.inner.count_flagged()).await
    }
    async fn unfinished_by_definition(&self) -> Result<Vec<UnfinishedOf>> {
        self.pass(self.inner.unfinished_by_definition()).await
    }
    async fn events(&self, id: Uuid) -> Result<Vec<Event>> {
        self.pass(self.inner.events(id)).await
    }
    async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>> {
        self.pass(self.inner.attempts(id)).await
    }
    async fn received_signal(&self, id: Uuid, name: &str) -> Result<Option<ReceivedSignal>> {
        self.pass(self.inner.received_signal(id, name)).await
    }
    async fn reported_task(&self, task: &TaskRef) -> Result<Option<TaskOutcome>> {
        self.pass(self.inner.reported_task(task)).await
    }
    async fn workers(&self) -> Result<Vec<Worker>> {
        self.pass(self.inner.workers()).await
    }
    async fn now(&self) -> Result<Millis> {
        self.pass(self.inner.now()).await
    }
}

#[async_trait]
impl EngineLog for TappedStore {
    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()> {
        self.pass(self.inner.register_worker(worker)).await
    }
    async fn heartbeat(&self, worker: &str, lease_ttl_ms: i64) -> Result<()> {
        self.pass(self.inner.heartbeat(worker, lease_ttl_ms)).await
    }
    async fn deregister_worker(&self, worker: &str) -> Result<()> {
        self.pass(self.inner.deregister_worker(worker)).await
    }
    async fn create_saga(&self, new: NewSaga) -> Result<Saga> {
        let label = format!("create {}", new.name);
        self.write(|| label, self.inner.create_saga(new)).await
    }
    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed> {
        let label = created(&new);
        self.write(|| label, self.inner.create_saga_leased(new, lease))
            .await
    }
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>> {
        self.pass(self.inner.claim(req)).await
    }
    async fn apply(&self, lease: &Lease, transition: &Transition) -> Result<Applied> {
        self.write(|| describe(transition), self.inner.apply(lease, transition))
            .await
    }
    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        self.write(
            || "release the lease".to_owned(),
            self.inner.release_lease(lease),
        )
        .await
    }
    async fn mark_blocked(&self, definitions: &[String]) -> Result<u64> {
        self.pass(self.inner.mark_blocked(definitions)).await
    }
    async fn next_due(&self, definitions: &[String]) -> Result<Option<Millis>> {
        self.pass(self.inner.next_due(definitions)).await
    }
    async fn due_now(&self, definitions: &[String]) -> Result<bool> {
        self.pass(self.inner.due_now(definitions)).await
    }
    async fn start_child(&self, lease: &Lease, stage: &str, child: &NewSaga) -> Result<bool> {
        self.write(
            || format!("start child {} at {stage}", child.name),
            self.inner.start_child(lease, stage, child),
        )
        .await
    }
    async fn park_child_wait(
        &self,
        id: Uuid,
        child: Uuid,
        seen: SagaStatus,
        written: Millis,
    ) -> Result<bool> {
        self.write(
            || "park waiting for a child".to_owned(),
            self.inner.park_child_wait(id, child, seen, written),
        )
        .await
    }
    async fn park_signal_wait(
        &self,
        id: Uuid,
        name: &str,
        written: Millis,
        deadline: Option<Millis>,
    ) -> Result<bool> {
        self.write(
            || format!("park waiting for signal {name}"),
            self.inner.park_signal_wait(id, name, written, deadline),
        )
        .await
    }
    async fn park_task_wait(
        &self,
        task: &TaskRef,
        written: Millis,
        deadline: Millis,
    ) -> Result<bool> {
        self.write(
            || format!("park waiting for the callback of row {}", task.step_index),
            self.inner.park_task_wait(task, written, deadline),
        )
        .await
    }
    async fn close_task(&self, task: &TaskRef, closing: &TaskOutcome) -> Result<TaskOutcome> {
        self.write(
            || format!("close the wait for the callback of row {}", task.step_index),
            self.inner.close_task(task, closing),
        )
        .await
    }
    async fn task_key(&self) -> Result<Vec<u8>> {
        self.pass(self.inner.task_key()).await
    }
    fn due_signal(&self) -> Option<Arc<Notify>> {
        self.inner.due_signal()
    }
    fn finished_signal(&self) -> Option<tokio::sync::broadcast::Receiver<(Uuid, SagaStatus)>> {
        self.inner.finished_signal()
    }
    fn commits(&self) -> u64 {
        self.inner.commits()
    }
}

/// A creation, described (with the first action's write-ahead when it carries it).
fn created(new: &NewSaga) -> String {
    if new.first_attempt {
        format!("create {} and write its first action ahead", new.name)
    } else {
        format!("create {}", new.name)
    }
}

#[async_trait]
impl OperatorLog for TappedStore {
    async fn request_cancel(&self, id: Uuid, audit: &Audit<'_>) -> Result<CancelOutcome> {
        self.pass(self.inner.request_cancel(id, audit)).await
    }
    async fn abort(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        self.pass(self.inner.abort(id, audit)).await
    }
    async fn pause(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        self.pass(self.inner.pause(id, audit)).await
    }
    async fn resume(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        self.pass(self.inner.resume(id, audit)).await
    }
    async fn retry_now(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        self.pass(self.inner.retry_now(id, audit)).await
    }
    async fn mark_compensated(
        &self,
        id: Uuid,
        step: &str,
        reason: &str,
        actor: &str,
    ) -> Result<Saga> {
        self.pass(self.inner.mark_compensated(id, step, reason, actor))
            .await
    }
    async fn compensate_child(&self, child: Uuid, parent: Uuid) -> Result<SagaStatus> {
        self.write(
            || "compensate a child".to_owned(),
            self.inner.compensate_child(child, parent),
        )
        .await
    }
    async fn complete_step(
        &self,
        id: Uuid,
        step: &str,
        output: &Value,
        audit: &Audit<'_>,
    ) -> Result<Saga> {
        self.pass(self.inner.complete_step(id, step, output, audit))
            .await
    }
    async fn fork(&self, fork: &NewFork<'_>) -> Result<Saga> {
        self.pass(self.inner.fork(fork)).await
    }
    async fn send_signal(&self, request: SignalRequest<'_>) -> Result<SignalOutcome> {
        self.pass(self.inner.send_signal(request)).await
    }
    async fn report_task(&self, task: &TaskRef, report: &TaskReport) -> Result<TaskAnswer> {
        // A participant's report is recorded by the orchestrator's process like its own
        // writes, which may die just before or after it.
        self.write(
            || {
                format!(
                    "report for the callback of row {} attempt {}",
                    task.step_index, task.attempt
                )
            },
            self.inner.report_task(task, report),
        )
        .await
    }
}

#[async_trait]
impl BulkLog for TappedStore {
    async fn create_bulk_job(&self, job: &NewBulkJob<'_>) -> Result<u64> {
        self.pass(self.inner.create_bulk_job(job)).await
    }
    async fn match_sagas(&self, filter: &ListFilter, sample: u32) -> Result<(u64, Vec<Uuid>)> {
        self.pass(self.inner.match_sagas(filter, sample)).await
    }
    async fn bulk_job(&self, id: Uuid) -> Result<Option<BulkJob>> {
        self.pass(self.inner.bulk_job(id)).await
    }
    async fn list_bulk_jobs(&self, limit: u32, cursor: Option<Uuid>) -> Result<BulkJobPage> {
        self.pass(self.inner.list_bulk_jobs(limit, cursor)).await
    }
    async fn claim_bulk_job(&self, owner: &str, ttl_ms: Millis) -> Result<Option<BulkClaim>> {
        self.pass(self.inner.claim_bulk_job(owner, ttl_ms)).await
    }
    async fn pending_bulk_items(
        &self,
        ticket: BulkTicket,
        ttl_ms: Millis,
        limit: u32,
    ) -> Result<Vec<Uuid>> {
        self.pass(self.inner.pending_bulk_items(ticket, ttl_ms, limit))
            .await
    }
    async fn complete_bulk_item(&self, ticket: BulkTicket, saga: Uuid) -> Result<()> {
        self.pass(self.inner.complete_bulk_item(ticket, saga)).await
    }
    async fn refuse_bulk_item(
        &self,
        ticket: BulkTicket,
        saga: Uuid,
        code: &str,
        message: &str,
    ) -> Result<()> {
        self.pass(self.inner.refuse_bulk_item(ticket, saga, code, message))
            .await
    }
    async fn finish_bulk_job(&self, ticket: BulkTicket) -> Result<bool> {
        self.pass(self.inner.finish_bulk_job(ticket)).await
    }
}

#[async_trait]
impl FlowLog for TappedStore {
    async fn declare_limits(&self, limits: &[DeclaredLimit], sagas: &[String]) -> Result<()> {
        self.pass(self.inner.declare_limits(limits, sagas)).await
    }
    async fn limits(&self) -> Result<Vec<LimitInfo>> {
        self.pass(self.inner.limits()).await
    }
    async fn set_limit(
        &self,
        name: &str,
        change: &LimitChange,
        audit: Audit<'_>,
    ) -> Result<LimitInfo> {
        self.pass(self.inner.set_limit(name, change, audit)).await
    }
    async fn take_token(&self, name: &str) -> Result<TokenGrant> {
        self.write(
            || format!("take a token of {name}"),
            self.inner.take_token(name),
        )
        .await
    }
}

#[async_trait]
impl orchestrator::store::ScheduleLog for TappedStore {
    async fn create_schedule(&self, schedule: &orchestrator::model::Schedule) -> Result<bool> {
        self.pass(self.inner.create_schedule(schedule)).await
    }
    async fn schedules(&self) -> Result<Vec<orchestrator::model::Schedule>> {
        self.pass(self.inner.schedules()).await
    }
    async fn schedule(&self, id: &str) -> Result<Option<orchestrator::model::Schedule>> {
        self.pass(self.inner.schedule(id)).await
    }
    async fn schedule_runs(
        &self,
        id: &str,
        limit: u32,
    ) -> Result<Vec<orchestrator::model::ScheduleRun>> {
        self.pass(self.inner.schedule_runs(id, limit)).await
    }
    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        self.pass(self.inner.delete_schedule(id)).await
    }
    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<orchestrator::model::Schedule>> {
        self.pass(
            self.inner
                .set_schedule_paused(id, paused, next_fire_at, now),
        )
        .await
    }
    async fn claim_due_schedules(
        &self,
        owner: &str,
        now: Millis,
        ttl_ms: i64,
        limit: u32,
    ) -> Result<Vec<orchestrator::model::Schedule>> {
        self.pass(self.inner.claim_due_schedules(owner, now, ttl_ms, limit))
            .await
    }
    async fn advance_schedule(
        &self,
        id: &str,
        owner: &str,
        from: orchestrator::store::ScheduleCursor,
        to: &orchestrator::store::ScheduleAdvance,
        runs: &[orchestrator::model::NewScheduleRun],
        now: Millis,
    ) -> Result<bool> {
        self.pass(self.inner.advance_schedule(id, owner, from, to, runs, now))
            .await
    }
    async fn record_schedule_runs(
        &self,
        id: &str,
        expect: Option<(orchestrator::store::ScheduleCursor, Option<Uuid>)>,
        runs: &[orchestrator::model::NewScheduleRun],
        last_saga_id: Option<Uuid>,
        buffer: Option<Millis>,
        now: Millis,
    ) -> Result<bool> {
        self.pass(
            self.inner
                .record_schedule_runs(id, expect, runs, last_saga_id, buffer, now),
        )
        .await
    }
    async fn release_schedule(&self, id: &str, owner: &str) -> Result<()> {
        self.pass(self.inner.release_schedule(id, owner)).await
    }
    async fn earliest_schedule_fire(&self) -> Result<Option<Millis>> {
        self.pass(self.inner.earliest_schedule_fire()).await
    }
}

#[async_trait]
impl Maintenance for TappedStore {
    async fn migrate(&self) -> Result<()> {
        self.pass(self.inner.migrate()).await
    }
    async fn purge_page(
        &self,
        before: Millis,
        cursor: PurgeCursor,
        limit: u32,
        dry_run: bool,
        attrs: &[(String, String)],
    ) -> Result<PurgePage> {
        self.pass(self.inner.purge_page(before, cursor, limit, dry_run, attrs))
            .await
    }
    async fn purge_trigger_refusals(&self, before: Millis, dry_run: bool) -> Result<u64> {
        self.pass(self.inner.purge_trigger_refusals(before, dry_run))
            .await
    }
}

#[async_trait]
impl IdempotencyStore for TappedStore {
    async fn create_saga_idempotent(
        &self,
        key: &IdempotencyKey,
        new: NewSaga,
        callback: Option<&Callback>,
        response: Option<&SavedResponse>,
        lease: Option<&LeaseRequest>,
    ) -> Result<IdempotentStart> {
        let label = created(&new);
        self.write(
            || label,
            self.inner
                .create_saga_idempotent(key, new, callback, response, lease),
        )
        .await
    }
    async fn create_saga_with_callback(
        &self,
        new: NewSaga,
        callback: &Callback,
        lease: Option<&LeaseRequest>,
    ) -> Result<Saga> {
        let label = created(&new);
        self.write(
            || label,
            self.inner.create_saga_with_callback(new, callback, lease),
        )
        .await
    }
    async fn complete_idempotent(
        &self,
        scope: &str,
        key: &str,
        response: &SavedResponse,
    ) -> Result<()> {
        self.pass(self.inner.complete_idempotent(scope, key, response))
            .await
    }
    async fn sweep_idempotency(&self, now: Millis) -> Result<u64> {
        self.pass(self.inner.sweep_idempotency(now)).await
    }
}

#[async_trait]
impl OutboxStore for TappedStore {
    async fn relay_cursor(&self, name: &str) -> Result<OutboxPosition> {
        self.pass(self.inner.relay_cursor(name)).await
    }
    async fn outbox_after(&self, after: OutboxPosition, limit: u32) -> Result<Vec<OutboxEvent>> {
        self.pass(self.inner.outbox_after(after, limit)).await
    }
    async fn saga_callbacks(&self, sagas: &[Uuid]) -> Result<HashMap<Uuid, Callback>> {
        self.pass(self.inner.saga_callbacks(sagas)).await
    }
    async fn advance_relay(
        &self,
        name: &str,
        from: OutboxPosition,
        to: OutboxPosition,
        deliveries: &[NewDelivery],
    ) -> Result<bool> {
        self.pass(self.inner.advance_relay(name, from, to, deliveries))
            .await
    }
    async fn claim_deliveries(&self, limit: u32, lease: Duration) -> Result<Vec<ClaimedDelivery>> {
        self.pass(self.inner.claim_deliveries(limit, lease)).await
    }
    async fn finish_delivery(
        &self,
        event_id: i64,
        target: &str,
        attempt: u32,
        outcome: &DeliveryOutcome,
    ) -> Result<()> {
        self.pass(
            self.inner
                .finish_delivery(event_id, target, attempt, outcome),
        )
        .await
    }
    async fn deliveries(&self, saga: Uuid) -> Result<Vec<Delivery>> {
        self.pass(self.inner.deliveries(saga)).await
    }
    async fn relay_progress(&self, name: &str) -> Result<RelayProgress> {
        self.pass(self.inner.relay_progress(name)).await
    }
    async fn relays(&self) -> Result<Vec<RelayProgress>> {
        self.pass(self.inner.relays()).await
    }
    async fn open_relay(&self, name: &str) -> Result<()> {
        self.pass(self.inner.open_relay(name)).await
    }
    async fn log_id(&self) -> Result<Uuid> {
        self.pass(self.inner.log_id()).await
    }
}

#[async_trait]
impl orchestrator::store::TriggerLog for TappedStore {
    async fn record_trigger_refusal(
        &self,
        refusal: &orchestrator::store::triggers::NewRefusal<'_>,
    ) -> Result<bool> {
        self.pass(self.inner.record_trigger_refusal(refusal)).await
    }
    async fn trigger_refusals(
        &self,
        trigger: Option<&str>,
        limit: u32,
    ) -> Result<Vec<orchestrator::store::triggers::TriggerRefusal>> {
        self.pass(self.inner.trigger_refusals(trigger, limit)).await
    }
    async fn trigger_refusal_counts(
        &self,
    ) -> Result<Vec<orchestrator::store::triggers::RefusalCount>> {
        self.pass(self.inner.trigger_refusal_counts()).await
    }
}

/// Runs `future` to its end on this thread, in the context of the runtime `db` (whose tasks,
/// timers and I/O it uses), blocking the thread meanwhile.
fn block_on_in<F: Future>(db: &tokio::runtime::Handle, future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let _context = db.enter();
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
