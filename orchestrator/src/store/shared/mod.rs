//! The store written once for both databases, over what each one provides ([`SqlBackend`]).
//!
//! [`Store`] and [`OutboxStore`] are implemented here, once, for every [`SqlBackend`]; each
//! backend implements [`IdempotencyStore`] itself (keyed starts differ), calling the shared key
//! sweeper. What is the same on both databases runs the same statements ([`sql`]): the operator
//! commands ([`operator`]), the reads ([`reads`]), most of the outbox ([`outbox`]),
//! releasing leases, deregistering workers, flagging blocked sagas and sweeping expired keys.
//! Each backend keeps only what truly differs: how it connects, its batch writer behind the
//! write queue (the engine's hot path: creates, transitions and, on SQLite, keyed starts), how
//! workers claim sagas and find due ones, and how the outbox is read in commit order.

pub(crate) mod admission;
pub(crate) mod attrs;
pub(crate) mod bulk;
pub(crate) mod children;
pub(crate) mod events;
pub(crate) mod flow;
pub(crate) mod operator;
pub(crate) mod outbox;
pub(crate) mod reads;
pub(crate) mod recovery;
pub(crate) mod retention;
pub(crate) mod schedules;
pub(crate) mod signals;
pub(crate) mod sql;
pub(crate) mod tasks;
pub(crate) mod triggers;

use crate::store::fence::lease_fence;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{broadcast, Notify};
use uuid::Uuid;

use sql::{Arg, Reader, Tx};

use crate::model::{
    Attempt, Event, IdPrefix, ListFilter, Millis, Saga, SagaPage, SagaStatus, WaitingCounts,
};
use crate::store::idempotency::{Callback, IdempotencyStore};
use crate::store::outbox::{
    ClaimedDelivery, Delivery, DeliveryOutcome, NewDelivery, OutboxEvent, OutboxPosition,
    OutboxStore, RelayProgress,
};
use crate::store::rows::{corrupt, LogRow};
use crate::store::signals::{ReceivedSignal, SignalOutcome, SignalRequest};
use crate::store::tasks::{TaskAnswer, TaskOutcome, TaskRef, TaskReport};
use crate::store::{
    Applied, Audit, BulkClaim, BulkLog, BulkTicket, CancelOutcome, ClaimRequest, Claimed,
    EngineLog, Lease, LeaseRequest, LogReads, Maintenance, NewBulkJob, NewFork, NewSaga,
    OperatorLog, PurgeCursor, PurgePage, Result, StoreError, Transition, WorkerInfo,
};

/// What one database provides to the shared store: its connections and transactions, and the
/// operations whose statements or mechanics differ between databases. Each method that shares
/// a name with one of [`Store`]'s has the same contract as that one.
#[async_trait]
pub(crate) trait SqlBackend: IdempotencyStore + SqlOutbox + Send + Sync + 'static {
    /// Where reads outside a transaction go.
    fn reader(&self) -> Reader<'_>;

    /// Opens a write transaction (taking SQLite's write lock up front); [`Tx::now`] is the time
    /// its writes record: the store's clock on SQLite, the database's on PostgreSQL.
    async fn begin(&self) -> Result<Tx>;

    /// Commits a transaction from [`SqlBackend::begin`], counting it in [`Store::commits`](crate::store::EngineLog::commits).
    async fn commit(&self, tx: Tx) -> Result<()>;

    /// As [`Store::migrate`](crate::store::Maintenance::migrate).
    async fn migrate(&self) -> Result<()>;
    /// As [`Store::register_worker`](crate::store::EngineLog::register_worker).
    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()>;
    /// As [`Store::heartbeat`](crate::store::EngineLog::heartbeat).
    async fn heartbeat(&self, worker: &str, lease_ttl_ms: i64) -> Result<()>;
    /// Called once [`Store::deregister_worker`](crate::store::EngineLog::deregister_worker) has committed: what else the backend gives up
    /// (SQLite: the engine lock on the file).
    fn deregistered(&self) {}
    /// As [`Store::create_saga`](crate::store::EngineLog::create_saga).
    async fn create_saga(&self, new: NewSaga) -> Result<Saga>;
    /// As [`Store::create_saga_leased`](crate::store::EngineLog::create_saga_leased).
    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed>;
    /// As [`Store::claim`](crate::store::EngineLog::claim).
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>>;
    /// As [`Store::apply`](crate::store::EngineLog::apply).
    async fn apply(&self, lease: &Lease, transition: &Transition) -> Result<Applied>;
    /// The statement of [`Store::mark_blocked`](crate::store::EngineLog::mark_blocked): flags the due sagas nobody can run (`$1`
    /// the definition keys this process has, `$2` the time) and returns their `id` and
    /// `definition_key`.
    const MARK_BLOCKED: &'static str;
    /// As [`Store::due_now`](crate::store::EngineLog::due_now).
    async fn due_now(&self, definitions: &[String]) -> Result<bool>;
    /// As [`Store::due_signal`](crate::store::EngineLog::due_signal).
    fn due_signal(&self) -> Option<Arc<Notify>> {
        None
    }
    /// As [`Store::finished_signal`](crate::store::EngineLog::finished_signal).
    fn finished_signal(&self) -> Option<broadcast::Receiver<(Uuid, SagaStatus)>> {
        None
    }
    /// As [`Store::commits`](crate::store::EngineLog::commits).
    fn commits(&self) -> u64;
    /// As [`Store::now`](crate::store::LogReads::now).
    async fn now(&self) -> Result<Millis>;
}

/// What a database does its own way in the outbox (see [`OutboxStore`]): reading events in
/// commit order, and enqueuing a relay's deliveries.
#[async_trait]
pub(crate) trait SqlOutbox {
    /// As [`OutboxStore::outbox_after`].
    async fn outbox_after(&self, after: OutboxPosition, limit: u32) -> Result<Vec<OutboxEvent>>;
    /// Enqueues one delivery row per (event, target) inside a relay's cursor move, stamped
    /// due at the transaction's time.
    async fn enqueue_deliveries(&self, tx: &mut Tx, deliveries: &[NewDelivery]) -> Result<()>;
}

#[async_trait]
impl<B: SqlBackend> LogReads for B {
    async fn get_saga(&self, id: Uuid) -> Result<Option<Saga>> {
        reads::get_saga(self.reader(), id).await
    }

    async fn saga_status(&self, id: Uuid) -> Result<Option<SagaStatus>> {
        reads::saga_status(self.reader(), id).await
    }

    async fn list_sagas(&self, filter: &ListFilter) -> Result<SagaPage> {
        reads::list_sagas(self.reader(), filter).await
    }

    async fn saga_ids_with_prefix(&self, prefix: &IdPrefix, limit: u32) -> Result<Vec<Uuid>> {
        reads::saga_ids_with_prefix(self.reader(), prefix, limit).await
    }

    async fn count_by_status(&self) -> Result<Vec<(SagaStatus, u64)>> {
        reads::count_by_status(self.reader()).await
    }

    async fn count_flagged(&self) -> Result<(u64, u64)> {
        reads::count_flagged(self.reader()).await
    }

    async fn unfinished_by_definition(&self) -> Result<Vec<crate::store::UnfinishedOf>> {
        reads::unfinished_by_definition(self.reader()).await
    }

    async fn waiting(&self) -> Result<WaitingCounts> {
        let now = SqlBackend::now(self).await?;
        reads::waiting(self.reader(), now).await
    }

    async fn events(&self, id: Uuid) -> Result<Vec<Event>> {
        reads::events(self.reader(), id).await
    }

    async fn attempts(&self, id: Uuid) -> Result<Vec<Attempt>> {
        reads::attempts(self.reader(), id).await
    }

    async fn received_signal(&self, id: Uuid, name: &str) -> Result<Option<ReceivedSignal>> {
        signals::received(self.reader(), id, name).await
    }

    async fn reported_task(&self, task: &TaskRef) -> Result<Option<TaskOutcome>> {
        tasks::reported(self.reader(), task).await
    }

    async fn workers(&self) -> Result<Vec<crate::model::Worker>> {
        reads::workers(self.reader()).await
    }

    async fn now(&self) -> Result<Millis> {
        SqlBackend::now(self).await
    }
}

#[async_trait]
impl<B: SqlBackend> EngineLog for B {
    async fn register_worker(&self, worker: &WorkerInfo) -> Result<()> {
        SqlBackend::register_worker(self, worker).await
    }

    async fn heartbeat(&self, worker: &str, lease_ttl_ms: i64) -> Result<()> {
        SqlBackend::heartbeat(self, worker, lease_ttl_ms).await
    }

    async fn deregister_worker(&self, worker: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = tx.now().await?;
        tx.exec(
            "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner = $1",
            &[Arg::Str(worker)],
        )
        .await?;
        tx.exec(
            "UPDATE workers SET stopped_at = $2, heartbeat_at = $2 WHERE id = $1",
            &[Arg::Str(worker), Arg::Int(now)],
        )
        .await?;
        // The released sagas are due: another process may take them at once.
        tx.announce_due().await?;
        SqlBackend::commit(self, tx).await?;
        self.deregistered();
        Ok(())
    }

    async fn create_saga(&self, new: NewSaga) -> Result<Saga> {
        SqlBackend::create_saga(self, new).await
    }

    async fn create_saga_leased(&self, new: NewSaga, lease: &LeaseRequest) -> Result<Claimed> {
        SqlBackend::create_saga_leased(self, new, lease).await
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Vec<Claimed>> {
        SqlBackend::claim(self, req).await
    }

    async fn apply(&self, lease: &Lease, transition: &Transition) -> Result<Applied> {
        SqlBackend::apply(self, lease, transition).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let mut tx = self.begin().await?;
        let released = tx
            .exec(
                concat!(
                    "UPDATE sagas SET lease_owner = NULL, lease_expires_at = NULL WHERE id = $1 AND ",
                    lease_fence!("$2", "$3")
                ),
                &[
                    Arg::Id(lease.saga_id),
                    Arg::Str(&lease.owner),
                    Arg::Int(lease.epoch),
                ],
            )
            .await?;
        if released == 0 {
            tx.commit().await?;
            return Err(StoreError::LeaseLost(lease.saga_id));
        }
        tx.announce_due().await?;
        SqlBackend::commit(self, tx).await
    }

    async fn mark_blocked(&self, definitions: &[String]) -> Result<u64> {
        let mut tx = self.begin().await?;
        let now = tx.now().await?;
        let rows = tx
            .all(Self::MARK_BLOCKED, &[Arg::Strs(definitions), Arg::Int(now)])
            .await?;
        for row in &rows {
            let id: String = row.get("id")?;
            let id = Uuid::parse_str(&id).map_err(|e| corrupt(&id, e))?;
            let data = serde_json::json!({
                "definition": row.get::<String>("definition_key")?,
                "reason": "no running orchestrator process has this exact saga definition"
            });
            events::insert_event(&mut tx, id, "saga.blocked", None, &data).await?;
        }
        SqlBackend::commit(self, tx).await?;
        Ok(rows.len() as u64)
    }

    async fn next_due(&self, definitions: &[String]) -> Result<Option<Millis>> {
        let row = self
            .reader()
            .opt(
                // Sagas waiting to be admitted by priority alone are due at their time too;
                // those waiting for a limit wait for room, which the engine polls for.
                "SELECT MIN(due) AS due FROM (SELECT MIN(next_run_at) AS due FROM sagas \
                 WHERE next_run_at IS NOT NULL AND gate = 0 AND lease_owner IS NULL \
                   AND definition_key = ANY($1) \
                 UNION ALL SELECT MIN(next_run_at) AS due FROM sagas \
                 WHERE gate = 1 AND flow IS NULL AND next_run_at IS NOT NULL \
                   AND definition_key = ANY($1)) d",
                &[Arg::Strs(definitions)],
            )
            .await?;
        Ok(match row {
            Some(row) => row.get("due")?,
            None => None,
        })
    }

    async fn due_now(&self, definitions: &[String]) -> Result<bool> {
        SqlBackend::due_now(self, definitions).await
    }

    async fn park_signal_wait(
        &self,
        id: Uuid,
        name: &str,
        written: Millis,
        deadline: Option<Millis>,
    ) -> Result<bool> {
        signals::park(self, id, name, written, deadline).await
    }

    async fn start_child(&self, lease: &Lease, stage: &str, child: &NewSaga) -> Result<bool> {
        children::start(self, lease, stage, child).await
    }

    async fn park_task_wait(
        &self,
        task: &TaskRef,
        written: Millis,
        deadline: Millis,
    ) -> Result<bool> {
        tasks::park(self, task, written, deadline).await
    }

    async fn close_task(&self, task: &TaskRef, closing: &TaskOutcome) -> Result<TaskOutcome> {
        tasks::close(self, task, closing).await
    }

    async fn task_key(&self) -> Result<Vec<u8>> {
        tasks::key_of_log(self).await
    }

    async fn park_child_wait(
        &self,
        id: Uuid,
        child: Uuid,
        seen: SagaStatus,
        written: Millis,
    ) -> Result<bool> {
        children::park(self, id, child, seen, written).await
    }

    fn due_signal(&self) -> Option<Arc<Notify>> {
        SqlBackend::due_signal(self)
    }

    fn finished_signal(&self) -> Option<broadcast::Receiver<(Uuid, SagaStatus)>> {
        SqlBackend::finished_signal(self)
    }

    fn commits(&self) -> u64 {
        SqlBackend::commits(self)
    }
}

#[async_trait]
impl<B: SqlBackend> BulkLog for B {
    async fn create_bulk_job(&self, job: &NewBulkJob<'_>) -> Result<u64> {
        bulk::create(self, job).await
    }

    async fn match_sagas(&self, filter: &ListFilter, sample: u32) -> Result<(u64, Vec<Uuid>)> {
        bulk::match_sagas(self.reader(), filter, sample).await
    }

    async fn bulk_job(&self, id: Uuid) -> Result<Option<crate::model::BulkJob>> {
        bulk::get(self.reader(), id).await
    }

    async fn list_bulk_jobs(
        &self,
        limit: u32,
        cursor: Option<Uuid>,
    ) -> Result<crate::model::BulkJobPage> {
        bulk::list(self.reader(), limit, cursor).await
    }

    async fn claim_bulk_job(&self, owner: &str, ttl_ms: Millis) -> Result<Option<BulkClaim>> {
        bulk::claim(self, owner, ttl_ms).await
    }

    async fn pending_bulk_items(
        &self,
        ticket: BulkTicket,
        ttl_ms: Millis,
        limit: u32,
    ) -> Result<Vec<Uuid>> {
        bulk::pending(self, ticket, ttl_ms, limit).await
    }

    async fn complete_bulk_item(&self, ticket: BulkTicket, saga: Uuid) -> Result<()> {
        bulk::settle_alone(self, ticket, saga, None).await
    }

    async fn refuse_bulk_item(
        &self,
        ticket: BulkTicket,
        saga: Uuid,
        code: &str,
        message: &str,
    ) -> Result<()> {
        bulk::settle_alone(self, ticket, saga, Some((code, message))).await
    }

    async fn finish_bulk_job(&self, ticket: BulkTicket) -> Result<bool> {
        bulk::finish(self, ticket).await
    }
}

#[async_trait]
impl<B: SqlBackend> crate::store::FlowLog for B {
    async fn declare_limits(
        &self,
        limits: &[saga_dsl::DeclaredLimit],
        sagas: &[String],
    ) -> Result<()> {
        flow::declare(self, limits, sagas).await
    }

    async fn limits(&self) -> Result<Vec<crate::model::LimitInfo>> {
        let now = SqlBackend::now(self).await?;
        flow::list(self.reader(), now).await
    }

    async fn set_limit(
        &self,
        name: &str,
        change: &crate::model::LimitChange,
        audit: Audit<'_>,
    ) -> Result<crate::model::LimitInfo> {
        flow::set(self, name, change, audit).await
    }

    async fn take_token(&self, name: &str) -> Result<crate::store::TokenGrant> {
        flow::take(self, name).await
    }
}

#[async_trait]
impl<B: SqlBackend> crate::store::ScheduleLog for B {
    async fn create_schedule(&self, schedule: &crate::model::Schedule) -> Result<bool> {
        schedules::create(self, schedule).await
    }

    async fn schedules(&self) -> Result<Vec<crate::model::Schedule>> {
        schedules::list(self.reader()).await
    }

    async fn schedule(&self, id: &str) -> Result<Option<crate::model::Schedule>> {
        schedules::get(self.reader(), id).await
    }

    async fn schedule_runs(&self, id: &str, limit: u32) -> Result<Vec<crate::model::ScheduleRun>> {
        schedules::runs(self.reader(), id, limit).await
    }

    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        schedules::delete(self, id).await
    }

    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<crate::model::Schedule>> {
        schedules::set_paused(self, id, paused, next_fire_at, now).await
    }

    async fn claim_due_schedules(
        &self,
        owner: &str,
        now: Millis,
        ttl_ms: i64,
        limit: u32,
    ) -> Result<Vec<crate::model::Schedule>> {
        schedules::claim(self, owner, now, ttl_ms, limit).await
    }

    async fn advance_schedule(
        &self,
        id: &str,
        owner: &str,
        from: crate::store::ScheduleCursor,
        to: &crate::store::ScheduleAdvance,
        runs: &[crate::model::NewScheduleRun],
        now: Millis,
    ) -> Result<bool> {
        schedules::advance(self, id, owner, from, to, runs, now).await
    }

    async fn record_schedule_runs(
        &self,
        id: &str,
        expect: Option<(crate::store::ScheduleCursor, Option<Uuid>)>,
        runs: &[crate::model::NewScheduleRun],
        last_saga_id: Option<Uuid>,
        buffer: Option<Millis>,
        now: Millis,
    ) -> Result<bool> {
        schedules::record_runs(self, id, expect, runs, last_saga_id, buffer, now).await
    }

    async fn release_schedule(&self, id: &str, owner: &str) -> Result<()> {
        schedules::release(self, id, owner).await
    }

    async fn earliest_schedule_fire(&self) -> Result<Option<Millis>> {
        schedules::earliest(self.reader()).await
    }
}

#[async_trait]
impl<B: SqlBackend> OperatorLog for B {
    async fn request_cancel(&self, id: Uuid, audit: &Audit<'_>) -> Result<CancelOutcome> {
        operator::request_cancel(self, id, audit).await
    }

    async fn abort(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        operator::abort(self, id, audit).await
    }

    async fn pause(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        operator::pause(self, id, audit).await
    }

    async fn resume(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        operator::resume(self, id, audit).await
    }

    async fn retry_now(&self, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
        operator::retry_now(self, id, audit).await
    }

    async fn send_signal(&self, request: SignalRequest<'_>) -> Result<SignalOutcome> {
        signals::send(self, request).await
    }

    async fn report_task(&self, task: &TaskRef, report: &TaskReport) -> Result<TaskAnswer> {
        tasks::report(self, task, report).await
    }

    async fn mark_compensated(
        &self,
        id: Uuid,
        step: &str,
        reason: &str,
        actor: &str,
    ) -> Result<Saga> {
        operator::mark_compensated(self, id, step, reason, actor).await
    }

    async fn compensate_child(&self, child: Uuid, parent: Uuid) -> Result<SagaStatus> {
        children::compensate(self, child, parent).await
    }

    async fn complete_step(
        &self,
        id: Uuid,
        step: &str,
        output: &serde_json::Value,
        audit: &Audit<'_>,
    ) -> Result<Saga> {
        recovery::complete_step(self, id, step, output, audit).await
    }

    async fn fork(&self, fork: &NewFork<'_>) -> Result<Saga> {
        recovery::fork(self, fork).await
    }
}

#[async_trait]
impl<B: SqlBackend> Maintenance for B {
    async fn migrate(&self) -> Result<()> {
        SqlBackend::migrate(self).await
    }

    async fn purge_page(
        &self,
        before: Millis,
        cursor: PurgeCursor,
        limit: u32,
        dry_run: bool,
        attrs: &[(String, String)],
    ) -> Result<PurgePage> {
        retention::purge_page(self, before, cursor, limit, dry_run, attrs).await
    }

    async fn purge_trigger_refusals(&self, before: Millis, dry_run: bool) -> Result<u64> {
        retention::purge_trigger_refusals(self, before, dry_run).await
    }
}

/// [`IdempotencyStore::sweep_idempotency`], the same on every database (the rest of keyed
/// starts is each backend's own: through the write queue on SQLite, a transaction of its own on
/// PostgreSQL).
pub(crate) async fn sweep_idempotency<B: SqlBackend>(store: &B, now: Millis) -> Result<u64> {
    let mut tx = store.begin().await?;
    let deleted = tx
        .exec(
            "DELETE FROM idempotency_keys WHERE expires_at <= $1",
            &[Arg::Int(now)],
        )
        .await?;
    tx.commit().await?;
    Ok(deleted)
}

#[async_trait]
impl<B: SqlBackend> crate::store::TriggerLog for B {
    async fn record_trigger_refusal(
        &self,
        refusal: &crate::store::triggers::NewRefusal<'_>,
    ) -> Result<bool> {
        triggers::record(self, refusal).await
    }

    async fn trigger_refusals(
        &self,
        trigger: Option<&str>,
        limit: u32,
    ) -> Result<Vec<crate::store::triggers::TriggerRefusal>> {
        triggers::refusals(self, trigger, limit).await
    }

    async fn trigger_refusal_counts(&self) -> Result<Vec<crate::store::triggers::RefusalCount>> {
        triggers::counts(self).await
    }
}

#[async_trait]
impl<B: SqlBackend> OutboxStore for B {
    async fn relay_cursor(&self, name: &str) -> Result<OutboxPosition> {
        outbox::relay_cursor(self.reader(), name).await
    }

    async fn outbox_after(&self, after: OutboxPosition, limit: u32) -> Result<Vec<OutboxEvent>> {
        SqlOutbox::outbox_after(self, after, limit).await
    }

    async fn saga_callbacks(&self, sagas: &[Uuid]) -> Result<HashMap<Uuid, Callback>> {
        outbox::saga_callbacks(self.reader(), sagas).await
    }

    async fn advance_relay(
        &self,
        name: &str,
        from: OutboxPosition,
        to: OutboxPosition,
        deliveries: &[NewDelivery],
    ) -> Result<bool> {
        outbox::advance_relay(self, name, from, to, deliveries).await
    }

    async fn claim_deliveries(&self, limit: u32, lease: Duration) -> Result<Vec<ClaimedDelivery>> {
        outbox::claim_deliveries(self, limit, lease).await
    }

    async fn finish_delivery(
        &self,
        event_id: i64,
        target: &str,
        attempt: u32,
        outcome: &DeliveryOutcome,
    ) -> Result<()> {
        outbox::finish_delivery(self, event_id, target, attempt, outcome).await
    }

    async fn deliveries(&self, saga: Uuid) -> Result<Vec<Delivery>> {
        outbox::deliveries(self.reader(), saga).await
    }

    async fn relay_progress(&self, name: &str) -> Result<RelayProgress> {
        outbox::relay_progress(self.reader(), name).await
    }

    async fn relays(&self) -> Result<Vec<RelayProgress>> {
        outbox::relays(self.reader()).await
    }

    async fn open_relay(&self, name: &str) -> Result<()> {
        outbox::open_relay(self, name).await
    }

    async fn log_id(&self) -> Result<Uuid> {
        outbox::log_id(self).await
    }
}
