//! Set-based application of many engine transitions at once: the heart of group commit.
//!
//! Applying transitions one by one costs several statements each; on SQLite every statement is a
//! hop to the driver's thread, on PostgreSQL a network round trip. Here a batch becomes a fixed
//! set of statements whatever its size, and whatever its size the SQL text is the same, so each
//! statement is prepared once per connection and reused:
//!
//! - on PostgreSQL the batch is flattened into typed column arrays (`postgres::cols::ApplyCols`,
//!   `postgres::cols::CreateCols`), bound in the binary format and read back as rows by `unnest`;
//! - the fence: a saga's rows are written only if its lease owner and epoch still match (and, for
//!   an action start, no cancel is pending); the `UPDATE sagas` that checks it returns the leases
//!   that passed, `(saga, epoch)`; for the others one `SELECT` tells a lost lease from a cancel;
//! - a writer's `apply` and `create` ([`super::BatchWriter`]) are atomic: on `Err` nothing of
//!   the call remains and the transaction is still usable, so the caller can retry the items one
//!   by one and let the bad one fail alone;
//! - a writer's `whole` writes a batch without closures as a transaction of its own in one round
//!   trip; if it fails, the caller rolls back and takes the long way.
//!
//! The SQL itself is per backend: `postgres::writer` (one statement of data-modifying CTEs) and
//! `sqlite::writer`, where creates and transitions are not flattened at all but bound row by row to
//! statements prepared once and kept on the writer's own handle (`sqlite::writer_rows`,
//! `sqlite::handle`): SQLite
//! runs in-process, so a statement per row costs no round trip, and unpacking a flattened
//! batch cost more than the rows' own writes.

// What follows reads the rows of PostgreSQL's one batch statement; SQLite writes row by row
// (`store::sqlite::writer_rows`) and uses only part of it.
#![cfg_attr(not(feature = "postgres"), allow(dead_code))]

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use crate::store::rows::{corrupt, LogRow};
use crate::store::{Applied, Lease, LeaseRequest, NewSaga, Result, StoreError, Transition};

/// One transition to apply, with its lease.
pub(crate) type Item = (Lease, Transition);

/// A saga to create, optionally already leased by the worker that will drive it.
#[derive(Debug, Clone)]
pub(crate) struct NewItem {
    /// The saga.
    pub(crate) new: NewSaga,
    /// Created with lease epoch 1 as this asks, so its creator drives it at once without a
    /// claim.
    pub(crate) lease: Option<LeaseRequest>,
}

/// The leases the fence let through, `(saga, epoch)`, from the rows the fencing `UPDATE`
/// returned (`id`, `epoch`). By lease, not by saga: a batch may carry a write of a driver that
/// lost its lease beside one of the driver that took the saga over.
fn fenced_leases<R: LogRow>(rows: &[R]) -> Result<HashSet<(Uuid, i64)>> {
    let mut written = HashSet::with_capacity(rows.len());
    for row in rows {
        // A row without a lease carries something else (the batch time, on PostgreSQL).
        let Some(id) = row.get::<Option<String>>("id")? else {
            continue;
        };
        let id = Uuid::parse_str(&id).map_err(|e| corrupt(&id, e))?;
        written.insert((id, row.get("epoch")?));
    }
    Ok(written)
}

/// What the rows of the refused sagas say now (see [`Refused`]).
fn refused_rows<R: LogRow>(rows: &[R]) -> Result<HashMap<Uuid, Refused>> {
    let mut refused = HashMap::with_capacity(rows.len());
    for row in rows {
        let id: String = row.get("id")?;
        let id = Uuid::parse_str(&id).map_err(|e| corrupt(&id, e))?;
        refused.insert(
            id,
            (
                row.get("lease_owner")?,
                row.get("lease_epoch")?,
                row.get("cancel_requested")?,
                row.get("pause_requested")?,
            ),
        );
    }
    Ok(refused)
}

/// A refused saga's row: `(lease owner, lease epoch, cancel requested, pause requested)`.
pub(crate) type Refused = (Option<String>, i64, bool, Option<String>);

/// Each item's result, given the leases the fence let through and, for the others, what their
/// rows say now.
fn outcomes(
    items: &[Item],
    written: &HashSet<(Uuid, i64)>,
    refused: &HashMap<Uuid, Refused>,
) -> Vec<Result<Applied>> {
    items
        .iter()
        .map(|(lease, transition)| {
            if written.contains(&(lease.saga_id, lease.epoch)) {
                return Ok(Applied::Written);
            }
            refusal(lease, transition, refused.get(&lease.saga_id))
        })
        .collect()
}

/// Why the fence refused a write under `lease`, from what its saga's row says now: a cancel
/// met by an action start under a lease still held, or else the lease is gone.
pub(crate) fn refusal(
    lease: &Lease,
    transition: &Transition,
    row: Option<&Refused>,
) -> Result<Applied> {
    match row {
        // A write guarded against a cancel and not a pause (a completion) was refused by the
        // cancel: saying "pause" would let the saga complete paused, the cancel lost.
        Some((Some(owner), epoch, true, Some(_)))
            if *owner == lease.owner
                && *epoch == lease.epoch
                && transition.unless_cancelled
                && !transition.unless_paused =>
        {
            Ok(Applied::CancelRequested)
        }
        // A pause comes first: a cancel recorded with it cleared it, so both are never set
        // unless the pause came after.
        Some((Some(owner), epoch, _, Some(request)))
            if *owner == lease.owner && *epoch == lease.epoch =>
        {
            Ok(Applied::PauseRequested(request.clone()))
        }
        Some((Some(owner), epoch, true, None))
            if *owner == lease.owner && *epoch == lease.epoch =>
        {
            Ok(Applied::CancelRequested)
        }
        _ => Err(StoreError::LeaseLost(lease.saga_id)),
    }
}

/// The ids of the items the fence refused, as a JSON array, if any.
fn refused_ids(items: &[Item], written: &HashSet<(Uuid, i64)>) -> Option<String> {
    let ids: Vec<&Uuid> = items
        .iter()
        .filter(|(lease, _)| !written.contains(&(lease.saga_id, lease.epoch)))
        .map(|(lease, _)| &lease.saga_id)
        .collect();
    (!ids.is_empty()).then(|| serde_json::to_string(&ids).unwrap_or_else(|_| "[]".to_owned()))
}

/// Each item's result from the rows the fence returned: the refused sagas' rows are read with
/// `refused_sql` (one parameter: their ids as a JSON array); see [`explain`].
pub(crate) async fn results<DB: sqlx::Database>(
    conn: &mut DB::Connection,
    refused_sql: &'static str,
    items: &[Item],
    fenced: &[DB::Row],
) -> Result<Vec<Result<Applied>>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    DB::Row: LogRow,
{
    let written = fenced_leases(fenced)?;
    let refused = match refused_ids(items, &written) {
        Some(ids) => Some(
            sqlx::query::<DB>(refused_sql)
                .bind(ids)
                .fetch_all(&mut *conn)
                .await,
        ),
        None => None,
    };
    Ok(explain(items, &written, refused))
}

/// Each item's result, from the leases the fence let through and, if some were refused, the
/// refused sagas' rows read afterwards (a lease lost stays lost, so they may be read after the
/// commit); if those could not be read, the refused writes come back as retryable.
fn explain<R: LogRow>(
    items: &[Item],
    written: &HashSet<(Uuid, i64)>,
    refused: Option<std::result::Result<Vec<R>, sqlx::Error>>,
) -> Vec<Result<Applied>> {
    let refused = match refused {
        None => Ok(HashMap::new()),
        Some(rows) => rows
            .map_err(StoreError::from_sqlx)
            .and_then(|r| refused_rows(&r)),
    };
    match refused {
        Ok(refused) => outcomes(items, written, &refused),
        Err(e) => unexplained(items, written, &e),
    }
}

/// The results when the fence is known but not why it refused some writes: those wrote
/// nothing, so they may simply be tried again.
fn unexplained(
    items: &[Item],
    written: &HashSet<(Uuid, i64)>,
    e: &StoreError,
) -> Vec<Result<Applied>> {
    items
        .iter()
        .map(|(lease, _)| {
            if written.contains(&(lease.saga_id, lease.epoch)) {
                Ok(Applied::Written)
            } else {
                Err(StoreError::commit_failed(
                    format!("not written, and reading why failed: {e}"),
                    true,
                ))
            }
        })
        .collect()
}

/// The results of a committed batch whose fence rows could not be read: nobody can tell what
/// was written, so nothing may be retried; each driver gives its saga back and it resumes
/// from the log.
pub(crate) fn unreadable(items: &[Item], e: &StoreError) -> Vec<Result<Applied>> {
    items
        .iter()
        .map(|_| {
            Err(StoreError::commit_failed(
                format!("committed, but its result could not be read: {e}"),
                false,
            ))
        })
        .collect()
}
