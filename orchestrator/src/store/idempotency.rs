//! Idempotency keys of saga starts (SPEC §4), kept next to the step log.
//!
//! # Why in the store, and why this way
//!
//! A client that lost the answer to `POST /v1/sagas/{name}` retries with the same
//! `Idempotency-Key`; the retry must not start a second saga. Checking "is the key known?" and
//! then inserting would race: two concurrent retries both see "unknown" and both start a saga.
//! So the key row is inserted **in the same transaction as the saga**, and the primary key
//! `(scope, key)` decides: the transaction that inserts the key creates the saga, every other
//! one rolls back and reads the winner's row. On PostgreSQL that is `INSERT … ON CONFLICT DO
//! NOTHING RETURNING`; on SQLite `BEGIN IMMEDIATE` serialises the writers anyway.
//!
//! The row also keeps the response, so that a retry gets the same status and body. A plain
//! start knows its `202` before the saga is written and saves it in the same transaction; a
//! start that waits for the saga to end (`Prefer: wait`) saves its final answer later with
//! [`IdempotencyStore::complete_idempotent`]; until then the key is *in progress*.
//!
//! This is its own trait rather than part of [`Store`](super::Store) so that the engine's
//! trait stays about the step log; [`super::Stores`] hands out both views of one store.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::{LeaseRequest, NewSaga, Result};
use crate::model::{Millis, Saga};

/// The key of one idempotent start, as the HTTP layer computed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// Who sent it (the API client); keys of different clients never collide.
    pub scope: String,
    /// The key itself (1 to 255 visible ASCII characters).
    pub key: String,
    /// A digest of what the request asks for (saga name, callback, canonical body): the same
    /// key with another fingerprint is a client bug, answered `422`.
    pub fingerprint: String,
    /// How long the key is remembered.
    pub retention: Duration,
}

/// A response saved against a key, replayed to retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedResponse {
    /// The HTTP status.
    pub status_code: u16,
    /// The body, as sent.
    pub body: String,
}

/// The callback URL a client registered when starting a saga: every event of the saga is
/// delivered to it (see `crate::webhooks`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callback {
    /// An `http` or `https` URL.
    pub url: String,
    /// Signs this saga's deliveries instead of the server's webhook secret, if set.
    pub secret: Option<String>,
}

/// One idempotent start as the write queue carries it (see
/// [`IdempotencyStore::create_saga_idempotent`] for what each part means).
#[derive(Debug, Clone)]
// PostgreSQL runs a keyed start in a transaction of its own, never through the queue.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) struct KeyedItem {
    /// The key.
    pub(crate) key: IdempotencyKey,
    /// The saga to create if the key is new.
    pub(crate) new: NewSaga,
    /// Its completion callback.
    pub(crate) callback: Option<Callback>,
    /// The answer saved with the key at once, if known.
    pub(crate) response: Option<SavedResponse>,
    /// Create the saga leased as this asks.
    pub(crate) lease: Option<LeaseRequest>,
}

/// What [`IdempotencyStore::create_saga_idempotent`] did.
#[derive(Debug, Clone)]
pub enum IdempotentStart {
    /// The key was new: the saga was created, with the key, in one transaction.
    Created(Box<Saga>),
    /// The key was used before by the same request, which has finished: replay its answer.
    Replay {
        /// The saga that request started.
        saga_id: Uuid,
        /// Its answer.
        response: SavedResponse,
    },
    /// The key was used before by the same request, which has not answered yet.
    InProgress {
        /// The saga that request started.
        saga_id: Uuid,
        /// When the key was recorded (store clock).
        created_at: Millis,
    },
    /// The key was used before by a different request.
    Mismatch {
        /// The saga the first request started.
        saga_id: Uuid,
    },
}

/// Idempotent saga starts. Implemented by `SqliteStore` and `PgStore`.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Creates the saga `new` unless `key` is known, in one transaction with the key row (and
    /// the callback, if any). `response`, when given, is saved with the key at once (the key is
    /// then complete); otherwise the key stays in progress until
    /// [`complete_idempotent`](Self::complete_idempotent). An expired key counts as new.
    ///
    /// Any number of concurrent calls with the same key create exactly one saga.
    ///
    /// With `lease`, a saga created here is created already leased to its owner (epoch 1),
    /// which drives it at once without a claim.
    async fn create_saga_idempotent(
        &self,
        key: &IdempotencyKey,
        new: NewSaga,
        callback: Option<&Callback>,
        response: Option<&SavedResponse>,
        lease: Option<&LeaseRequest>,
    ) -> Result<IdempotentStart>;

    /// Creates a saga with a callback, in one transaction (a start without a key); leased as
    /// in [`IdempotencyStore::create_saga_idempotent`].
    async fn create_saga_with_callback(
        &self,
        new: NewSaga,
        callback: &Callback,
        lease: Option<&LeaseRequest>,
    ) -> Result<Saga>;

    /// Saves the final answer of an in-progress key (a no-op if it is already complete).
    async fn complete_idempotent(
        &self,
        scope: &str,
        key: &str,
        response: &SavedResponse,
    ) -> Result<()>;

    /// Deletes the keys that expired before `now`; returns how many.
    async fn sweep_idempotency(&self, now: Millis) -> Result<u64>;
}

/// Reads a key row into the answer for a request with `fingerprint`.
pub(super) fn judge(
    fingerprint: &str,
    row_fingerprint: &str,
    saga_id: Uuid,
    completed: Option<SavedResponse>,
    created_at: Millis,
) -> IdempotentStart {
    if row_fingerprint != fingerprint {
        return IdempotentStart::Mismatch { saga_id };
    }
    match completed {
        Some(response) => IdempotentStart::Replay { saga_id, response },
        None => IdempotentStart::InProgress {
            saga_id,
            created_at,
        },
    }
}

/// The retention as milliseconds, saturating.
pub(super) fn retention_ms(key: &IdempotencyKey) -> i64 {
    i64::try_from(key.retention.as_millis()).unwrap_or(i64::MAX / 4)
}

/// A key's stored row, as read back.
pub(super) struct StoredKey {
    /// The fingerprint of the request that recorded it.
    pub(super) fingerprint: String,
    /// The saga it names, as text.
    pub(super) saga_id: String,
    /// The saved answer's status, once complete.
    pub(super) status_code: Option<i64>,
    /// The saved answer's body, once complete.
    pub(super) response_body: Option<String>,
    /// When the key was recorded.
    pub(super) created_at: Millis,
    /// When its answer was saved.
    pub(super) completed_at: Option<Millis>,
}

impl StoredKey {
    /// Judges a request with `key` against this row.
    pub(super) fn judge(self, key: &IdempotencyKey) -> Result<IdempotentStart> {
        let saga_id =
            Uuid::parse_str(&self.saga_id).map_err(|e| super::rows::corrupt(&self.saga_id, e))?;
        let completed = match (self.completed_at, self.status_code, self.response_body) {
            (Some(_), Some(code), Some(body)) => Some(SavedResponse {
                status_code: u16::try_from(code)
                    .map_err(|e| super::rows::corrupt(&self.saga_id, e))?,
                body,
            }),
            _ => None,
        };
        Ok(judge(
            &key.fingerprint,
            &self.fingerprint,
            saga_id,
            completed,
            self.created_at,
        ))
    }
}

/// Judges a request against the row its key already has (columns `fingerprint`, `saga_id` as
/// text, `status_code` as a 64-bit integer, `response_body`, `created_at`, `completed_at`).
#[cfg(feature = "postgres")]
pub(super) fn judge_row<R: super::rows::LogRow>(
    row: &R,
    key: &IdempotencyKey,
) -> Result<IdempotentStart> {
    StoredKey {
        fingerprint: row.get("fingerprint")?,
        saga_id: row.get("saga_id")?,
        status_code: row.get("status_code")?,
        response_body: row.get("response_body")?,
        created_at: row.get("created_at")?,
        completed_at: row.get("completed_at")?,
    }
    .judge(key)
}
