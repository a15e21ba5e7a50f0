//! The store's part of bulk actions (SPEC §13): a job and the sagas it matched, kept durable so
//! that a job resumes after a crash and acts on each saga at most once.
//!
//! The protocol: a job's matched sagas are snapshot as `PENDING` items in the transaction that
//! creates it. A process works a job while it holds the job's lease ([`BulkLog::claim_bulk_job`]
//! bumps its epoch; [`BulkLog::pending_bulk_items`] renews it). The command on a saga settles
//! its item (`PENDING` → `DONE`, under the epoch of the [`BulkTicket`] its [`Audit`] carries) in
//! the command's own transaction, so a command that committed has settled its item, and one
//! whose item was settled already (or whose job another process took over) is rolled back with
//! [`StoreError::BulkItemSettled`]. A crash anywhere therefore leaves each item either settled
//! with its command, or pending with nothing done.

use async_trait::async_trait;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::model::{BulkAction, BulkJob, BulkJobPage, ListFilter, Millis};
use crate::store::Result;
#[allow(unused_imports)] // named by the documentation
use crate::store::StoreError;

/// The job a command is part of, and the epoch of the lease its worker holds on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkTicket {
    /// The bulk job.
    pub job: Uuid,
    /// The job's lease epoch when its worker claimed it.
    pub epoch: i64,
}

/// Who changes a saga from outside, and why: what the command's audit event records, built in
/// one place for every command ([`Audit::data`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Audit<'a> {
    /// The actor (a token's name), if known.
    pub actor: Option<&'a str>,
    /// The reason given, if any.
    pub reason: Option<&'a str>,
    /// The bulk job the command is part of, if any: its item is settled in the command's
    /// transaction, and its id is in the event as `bulk_id`.
    pub bulk: Option<BulkTicket>,
}

impl<'a> Audit<'a> {
    /// A command by `actor`.
    pub fn by(actor: &'a str) -> Self {
        Self {
            actor: Some(actor),
            ..Self::default()
        }
    }

    /// With a reason.
    pub fn because(mut self, reason: &'a str) -> Self {
        self.reason = Some(reason);
        self
    }

    /// As part of a bulk job.
    pub fn in_bulk(mut self, ticket: Option<BulkTicket>) -> Self {
        self.bulk = ticket;
        self
    }

    /// The event data: `actor`, `reason` and `bulk_id`, those known.
    pub fn data(&self) -> Map<String, Value> {
        let mut data = Map::new();
        if let Some(actor) = self.actor {
            data.insert("actor".into(), actor.into());
        }
        if let Some(reason) = self.reason {
            data.insert("reason".into(), reason.into());
        }
        if let Some(bulk) = self.bulk {
            data.insert("bulk_id".into(), bulk.job.to_string().into());
        }
        data
    }
}

/// A bulk job to create.
#[derive(Debug, Clone)]
pub struct NewBulkJob<'a> {
    /// Its id (a UUIDv7).
    pub id: Uuid,
    /// The command.
    pub action: BulkAction,
    /// The sagas it acts on (its status, name, flag and creation times; no page).
    pub filter: &'a ListFilter,
    /// The filter as given, kept to be shown.
    pub filter_json: &'a Value,
    /// Why.
    pub reason: &'a str,
    /// Who asked.
    pub actor: &'a str,
}

/// A job a process claimed to work.
#[derive(Debug, Clone)]
pub struct BulkClaim {
    /// The job and the epoch of this claim.
    pub ticket: BulkTicket,
    /// The command.
    pub action: BulkAction,
    /// Why.
    pub reason: String,
    /// Who asked.
    pub actor: String,
}

/// Bulk jobs: created with their snapshot of matched sagas, read, and worked under a lease.
#[async_trait]
pub trait BulkLog: Send + Sync + 'static {
    /// Creates `job` with one `PENDING` item per saga its filter matches now, in one
    /// transaction; how many matched. A job that matched nothing is created `DONE`.
    async fn create_bulk_job(&self, job: &NewBulkJob<'_>) -> Result<u64>;

    /// How many sagas `filter` matches now, and the first `sample` of their ids in the order a
    /// job would act on them (id order): a dry run.
    async fn match_sagas(&self, filter: &ListFilter, sample: u32) -> Result<(u64, Vec<Uuid>)>;

    /// A job with its refusals (the first [`MAX_REFUSALS_SHOWN`] in saga id order).
    async fn bulk_job(&self, id: Uuid) -> Result<Option<BulkJob>>;

    /// Up to `limit` jobs, newest first, after `cursor`; without their refusals.
    async fn list_bulk_jobs(&self, limit: u32, cursor: Option<Uuid>) -> Result<BulkJobPage>;

    /// Takes the oldest `RUNNING` job nobody holds (or whose lease expired) for `owner`, for
    /// `ttl_ms`, bumping its epoch.
    async fn claim_bulk_job(&self, owner: &str, ttl_ms: Millis) -> Result<Option<BulkClaim>>;

    /// Renews the lease of `ticket` for `ttl_ms` and returns up to `limit` of its pending
    /// sagas, in id order. [`StoreError::BulkJobLost`] if the lease is no longer this claim's.
    async fn pending_bulk_items(
        &self,
        ticket: BulkTicket,
        ttl_ms: Millis,
        limit: u32,
    ) -> Result<Vec<Uuid>>;

    /// Settles `saga`'s item as `DONE` after a command that changed nothing (one that changed
    /// the saga settled it in its own transaction); nothing if it is settled already.
    async fn complete_bulk_item(&self, ticket: BulkTicket, saga: Uuid) -> Result<()>;

    /// Settles `saga`'s item as `REFUSED` with the command's error; nothing if it is settled
    /// already or the claim is stale.
    async fn refuse_bulk_item(
        &self,
        ticket: BulkTicket,
        saga: Uuid,
        code: &str,
        message: &str,
    ) -> Result<()>;

    /// Marks the job `DONE` and releases it once no item is pending; whether it did.
    async fn finish_bulk_job(&self, ticket: BulkTicket) -> Result<bool>;
}

/// How many refusals a job's answer lists.
pub const MAX_REFUSALS_SHOWN: u32 = 1000;
