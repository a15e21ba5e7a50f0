//! Bulk actions (SPEC §13): [`Operations::bulk`] records a job with the sagas its filter
//! matches, and [`run`], a task of every serving process, works the jobs: it applies the job's
//! command to each matched saga through these same use cases, at most once per saga across
//! crashes and processes (the protocol is [`crate::store::bulk`]'s).

use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{OperationError, Operations, Reason, Result};
use crate::engine::Engine;
use crate::model::{BulkAction, ListFilter};
use crate::store::{BulkClaim, NewBulkJob, StoreError};

/// How many ids a dry run shows.
pub const DRY_RUN_SAMPLE: u32 = 20;

/// How many sagas a worker acts on between two renewals of its lease and two pauses.
const BATCH: u32 = 25;

/// The pause between two batches, so that a large job leaves the database to the engine.
const PACE: Duration = Duration::from_millis(5);

/// How long an idle worker waits before it looks for a job again.
const IDLE: Duration = Duration::from_millis(500);

/// A bulk action to record.
#[derive(Debug, Clone)]
pub struct BulkRequest {
    /// The command.
    pub action: BulkAction,
    /// The sagas it acts on: status, name, needs attention, creation times (no page).
    pub filter: ListFilter,
    /// The filter as given, kept with the job to be shown.
    pub filter_json: Value,
    /// Only count what the filter matches: nothing is recorded.
    pub dry_run: bool,
}

/// What [`Operations::bulk`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BulkCreated {
    /// A job was recorded; it acts on exactly `matched` sagas.
    Job {
        /// The job's id.
        id: Uuid,
        /// How many sagas it matched.
        matched: u64,
    },
    /// A dry run: how many sagas the filter matches now, and the first of them in the order a
    /// job would act on them.
    DryRun {
        /// How many matched.
        matched: u64,
        /// Up to [`DRY_RUN_SAMPLE`] of their ids.
        sample: Vec<Uuid>,
    },
}

impl Operations<'_> {
    /// Records a bulk job applying `request.action` to every saga `request.filter` matches now,
    /// audited as `actor`'s with `reason`; or, for a dry run, only counts them.
    pub async fn bulk(
        &self,
        request: &BulkRequest,
        reason: &Reason,
        actor: &str,
    ) -> Result<BulkCreated> {
        if request.dry_run {
            let (matched, sample) = self
                .store
                .match_sagas(&request.filter, DRY_RUN_SAMPLE)
                .await?;
            return Ok(BulkCreated::DryRun { matched, sample });
        }
        let id = Uuid::now_v7();
        let matched = self
            .store
            .create_bulk_job(&NewBulkJob {
                id,
                action: request.action,
                filter: &request.filter,
                filter_json: &request.filter_json,
                reason: reason.as_str(),
                actor,
            })
            .await?;
        Ok(BulkCreated::Job { id, matched })
    }

    /// Applies a bulk job's command to saga `id` (the job's actor and reason already set with
    /// [`Operations::in_bulk_job`]).
    async fn apply(&self, action: BulkAction, id: Uuid, reason: &Reason) -> Result<()> {
        let actor = self.bulk.map(|(_, actor, _)| actor).unwrap_or_default();
        match action {
            BulkAction::Cancel => self.cancel(id).await.map(drop),
            BulkAction::Retry => self.retry(id, actor).await.map(drop),
            BulkAction::Abort => self.abort(id, reason, actor).await.map(drop),
            BulkAction::Pause => self.pause(id, reason, actor).await.map(drop),
            BulkAction::Resume => self.resume(id, reason, actor).await.map(drop),
            // Each saga forked afresh from its own input: a bulk fork never takes effects over.
            BulkAction::Fork => self
                .fork(id, super::ForkRequest::default(), reason, actor)
                .await
                .map(drop),
        }
    }
}

/// Works bulk jobs until `shutdown`: claims one at a time under a lease (the engine's lease
/// time to live), applies its command to its pending sagas in batches, records each result and
/// marks the job `DONE` at the end. Several processes share the jobs; a job whose worker died
/// is taken over once its lease expires.
pub async fn run(engine: Engine, shutdown: CancellationToken) {
    let owner = engine.config().worker_id.clone();
    let ttl = engine.config().lease_ttl_ms();
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match engine.store().claim_bulk_job(&owner, ttl).await {
            Ok(Some(claim)) => {
                tracing::info!(job = %claim.ticket.job, action = %claim.action, "working a bulk job");
                work(&engine, &claim, ttl, &shutdown).await;
                continue;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "looking for bulk jobs failed; will retry"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(IDLE) => {}
        }
    }
}

/// Works one claimed job until it is done, its lease is lost, or `shutdown`.
async fn work(engine: &Engine, claim: &BulkClaim, ttl: i64, shutdown: &CancellationToken) {
    let store = engine.store();
    let ticket = claim.ticket;
    // Checked when the job was made; a row edited by hand gets a placeholder, not a stall.
    let reason = Reason::parse(&claim.reason)
        .or_else(|_| Reason::parse("bulk job"))
        .ok();
    let Some(reason) = reason else { return };
    let ops = Operations::of(engine).in_bulk_job(ticket, &claim.actor, &claim.reason);
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let batch = match store.pending_bulk_items(ticket, ttl, BATCH).await {
            Ok(batch) => batch,
            Err(StoreError::BulkJobLost(_)) => {
                tracing::info!(job = %ticket.job, "bulk job taken over by another process");
                return;
            }
            Err(e) => {
                tracing::warn!(job = %ticket.job, error = %e, "reading a bulk job failed; will retry");
                tokio::time::sleep(IDLE).await;
                return;
            }
        };
        if batch.is_empty() {
            match store.finish_bulk_job(ticket).await {
                Ok(_) => tracing::info!(job = %ticket.job, "bulk job done"),
                Err(e) => {
                    tracing::warn!(job = %ticket.job, error = %e, "finishing a bulk job failed")
                }
            }
            return;
        }
        for id in batch {
            if shutdown.is_cancelled() {
                return;
            }
            let recorded = match ops.apply(claim.action, id, &reason).await {
                // A command that changed the saga settled its item itself; one that changed
                // nothing (a saga already compensating) is settled here.
                Ok(()) => store.complete_bulk_item(ticket, id).await,
                // Acted on already, or the job is another process's now: nothing was done.
                Err(OperationError::Store(StoreError::BulkItemSettled { .. })) => Ok(()),
                Err(OperationError::Store(e)) if e.is_transient() => {
                    tracing::warn!(job = %ticket.job, saga = %id, error = %e,
                        "a bulk job's command failed; will retry");
                    tokio::time::sleep(IDLE).await;
                    break;
                }
                Err(e) => {
                    store
                        .refuse_bulk_item(ticket, id, e.code(), &e.to_string())
                        .await
                }
            };
            if let Err(e) = recorded {
                tracing::warn!(job = %ticket.job, saga = %id, error = %e,
                    "recording a bulk job's result failed; will retry");
                tokio::time::sleep(IDLE).await;
                break;
            }
        }
        // Between batches the engine's writes get their turn.
        tokio::time::sleep(PACE).await;
    }
}
