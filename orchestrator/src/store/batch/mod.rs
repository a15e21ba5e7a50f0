//! Set-based application of many engine transitions at once: the heart of group commit.
//!
//! Applying transitions one by one costs several statements each; on SQLite every statement is a
//! hop to the driver's thread, on PostgreSQL a network round trip. Here a batch becomes a fixed
//! set of statements whatever its size, and whatever its size the SQL text is the same, so each
//! statement is prepared once per connection and reused:
//!
//! - the batch is flattened into a few JSON arrays ([`ApplyRows`], [`CreateRows`]), one per
//!   statement, each bound as one parameter and unpacked by the database (`json_each` on
//!   SQLite, `json_to_recordset` on PostgreSQL);
//! - the fence: a saga's rows are written only if its lease owner and epoch still match (and, for
//!   an action start, no cancel is pending); the `UPDATE sagas` that checks it returns the leases
//!   that passed, `(saga, epoch)`; for the others one `SELECT` tells a lost lease from a cancel;
//! - a backend's `apply` and `create` are atomic: on `Err` nothing of the call remains and the
//!   transaction is still usable, so the caller can retry the items one by one and let the bad
//!   one fail alone;
//! - a backend's `whole_batch` writes a batch of only creates and transitions as a transaction of
//!   its own in one round trip; if it fails, the caller rolls back and takes the long way.
//!
//! The SQL itself is per backend: [`postgres`] (one statement of data-modifying CTEs) and
//! [`sqlite`], where creates and transitions are not flattened at all but bound row by row to
//! statements prepared once per batch, on the writer's own handle ([`sqlite_rows`]): SQLite
//! runs in-process, so a statement per row costs no round trip, and unpacking JSON cost more
//! than the rows' own writes.

pub(crate) mod postgres;
pub(crate) mod sqlite;
pub(crate) mod sqlite_rows;

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use uuid::Uuid;

use super::{Applied, AttemptChange, Lease, NewSaga, Result, StoreError, Transition};
use crate::model::{definition_key, Millis, PhaseRecord};
use crate::store::rows::{comp_status_for, corrupt, LogRow};
use saga_dsl::Phase;

/// One transition to apply, with its lease.
pub(crate) type Item = (Lease, Transition);

/// A saga to create, optionally already leased by the worker that will drive it.
#[derive(Debug, Clone)]
pub(crate) struct NewItem {
    /// The saga.
    pub(crate) new: NewSaga,
    /// `(owner, lease ttl in ms)`: created with lease epoch 1, so its creator drives it at
    /// once without a claim.
    pub(crate) lease: Option<(String, i64)>,
}

/// The lease a dependent row is written under: its saga's row must still carry it.
#[derive(Serialize)]
struct Fence<'a> {
    saga_id: &'a Uuid,
    owner: &'a str,
    epoch: i64,
    /// Refuse if a cancel is pending (the transition starts an action).
    guard: bool,
}

impl<'a> Fence<'a> {
    fn of((lease, t): &'a Item) -> Self {
        Self {
            saga_id: &lease.saga_id,
            owner: &lease.owner,
            epoch: lease.epoch,
            guard: t.unless_cancelled,
        }
    }
}

#[derive(Serialize)]
struct SagaRow<'a> {
    #[serde(flatten)]
    fence: Fence<'a>,
    status: &'static str,
    next_run_at: Option<Millis>,
    error: Option<&'a str>,
    /// JSON text (a string, so it is stored exactly as serialised here).
    output: Option<String>,
    attention: bool,
    pivot: bool,
    /// Give the lease up.
    rel: bool,
}

/// The new state of one phase of a step.
#[derive(Serialize)]
struct PhaseCols<'a> {
    status: &'static str,
    attempts: u32,
    error: Option<&'a str>,
    unknown: bool,
    started: Option<Millis>,
    ended: Option<Millis>,
}

impl<'a> PhaseCols<'a> {
    fn of(r: &'a PhaseRecord) -> Self {
        Self {
            status: r.status.as_str(),
            attempts: r.attempts,
            error: r.last_error.as_deref(),
            unknown: r.outcome_unknown,
            started: r.started_at,
            ended: r.ended_at,
        }
    }
}

/// Both phases of one step in one row (absent when unchanged): a transition may touch the
/// action and the compensation of the same step (an unknown outcome compensated at once).
#[derive(Serialize)]
struct StepRow<'a> {
    #[serde(flatten)]
    fence: Fence<'a>,
    idx: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    a: Option<PhaseCols<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    c: Option<PhaseCols<'a>>,
    /// JSON text of a succeeded action's output.
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<String>,
}

#[derive(Serialize)]
struct AttemptRow<'a> {
    #[serde(flatten)]
    fence: Fence<'a>,
    idx: u32,
    phase: &'static str,
    attempt: u32,
    outcome: Option<&'static str>,
    error: Option<&'a str>,
}

#[derive(Serialize)]
struct EventRow<'a> {
    #[serde(flatten)]
    fence: Fence<'a>,
    kind: &'static str,
    step: Option<&'a str>,
    /// JSON text.
    data: String,
}

/// A batch of transitions as the JSON arrays its statements read, in batch order.
pub(crate) struct ApplyRows {
    /// Saga rows (the fence), one per transition.
    pub(crate) sagas: String,
    /// Step rows, the latest state of each touched (saga, step).
    pub(crate) steps: String,
    /// Attempts that ended.
    pub(crate) finishes: String,
    /// Attempts about to start (write-ahead).
    pub(crate) starts: String,
    /// Events, in order.
    pub(crate) events: String,
    /// The sagas of the batch.
    pub(crate) ids: Vec<String>,
}

/// `rows` as one JSON array, the form every batch statement reads.
pub(crate) fn to_json<T: Serialize>(rows: &[T]) -> Result<String> {
    serde_json::to_string(rows).map_err(|e| StoreError::Io(format!("encoding a batch: {e}")))
}

impl ApplyRows {
    /// Flattens `items`.
    pub(crate) fn of(items: &[Item]) -> Result<Self> {
        let sagas: Vec<SagaRow> = items
            .iter()
            .map(|item| {
                let s = &item.1.saga;
                SagaRow {
                    fence: Fence::of(item),
                    status: s.status.as_str(),
                    next_run_at: s.next_run_at,
                    error: s.error.as_deref(),
                    output: s.output.as_ref().map(ToString::to_string),
                    attention: s.needs_attention,
                    pivot: s.pivot_reached,
                    rel: item.1.release,
                }
            })
            .collect();
        let mut finishes = Vec::new();
        let mut starts = Vec::new();
        for item in items {
            for change in &item.1.attempts {
                let row = match change {
                    AttemptChange::Start {
                        step_index,
                        phase,
                        attempt,
                    } => (&mut starts, *step_index, *phase, *attempt, None, None),
                    AttemptChange::Finish {
                        step_index,
                        phase,
                        attempt,
                        outcome,
                        error,
                    } => (
                        &mut finishes,
                        *step_index,
                        *phase,
                        *attempt,
                        Some(*outcome),
                        error.as_deref(),
                    ),
                };
                row.0.push(AttemptRow {
                    fence: Fence::of(item),
                    idx: row.1,
                    phase: row.2.as_str(),
                    attempt: row.3,
                    outcome: row.4,
                    error: row.5,
                });
            }
        }
        let events: Vec<EventRow> = items
            .iter()
            .flat_map(|item| {
                item.1.events.iter().map(move |e| EventRow {
                    fence: Fence::of(item),
                    kind: e.kind,
                    step: e.step.as_deref(),
                    data: e.data.to_string(),
                })
            })
            .collect();
        Ok(Self {
            sagas: to_json(&sagas)?,
            steps: to_json(&step_rows(items))?,
            finishes: to_json(&finishes)?,
            starts: to_json(&starts)?,
            events: to_json(&events)?,
            ids: items.iter().map(|(l, _)| l.saga_id.to_string()).collect(),
        })
    }
}

/// One row per touched (saga, step): the last update of each phase (a transition may carry a
/// recovery and a new write-ahead of the same phase), and the action's output if any update of
/// it carried one.
fn step_rows(items: &[Item]) -> Vec<StepRow<'_>> {
    let mut rows: Vec<StepRow> = Vec::new();
    let mut at: HashMap<(Uuid, u32), usize> = HashMap::new();
    for item in items {
        for u in &item.1.steps {
            let i = *at.entry((item.0.saga_id, u.index)).or_insert_with(|| {
                rows.push(StepRow {
                    fence: Fence::of(item),
                    idx: u.index,
                    a: None,
                    c: None,
                    output: None,
                });
                rows.len() - 1
            });
            let row = &mut rows[i];
            let cols = Some(PhaseCols::of(&u.record));
            match u.phase {
                Phase::Action => {
                    row.a = cols;
                    if let Some(out) = &u.output {
                        row.output = Some(out.to_string());
                    }
                }
                Phase::Compensation => row.c = cols,
            }
        }
    }
    rows
}

#[derive(Serialize)]
struct NewSagaRow<'a> {
    id: &'a Uuid,
    name: &'a str,
    version: u32,
    hash: &'a str,
    key: String,
    /// JSON text.
    input: String,
    owner: Option<&'a str>,
    epoch: i64,
    /// Lease length: the lease expires this long after the creation time.
    ttl: Option<Millis>,
}

#[derive(Serialize)]
struct NewStepRow<'a> {
    saga_id: &'a Uuid,
    idx: usize,
    name: &'a str,
    kind: &'static str,
    comp_status: &'static str,
}

/// New sagas as the JSON arrays their statements read.
pub(crate) struct CreateRows {
    /// Saga rows (also the source of each `saga.started` event).
    pub(crate) sagas: String,
    /// Their steps.
    pub(crate) steps: String,
}

impl CreateRows {
    /// Flattens `items`.
    pub(crate) fn of(items: &[NewItem]) -> Result<Self> {
        let sagas: Vec<NewSagaRow> = items
            .iter()
            .map(|item| {
                let n = &item.new;
                NewSagaRow {
                    id: &n.id,
                    name: &n.name,
                    version: n.version,
                    hash: &n.definition_hash,
                    key: definition_key(&n.name, n.version, &n.definition_hash),
                    input: n.input.to_string(),
                    owner: item.lease.as_ref().map(|(owner, _)| owner.as_str()),
                    epoch: i64::from(item.lease.is_some()),
                    ttl: item.lease.as_ref().map(|(_, ttl)| *ttl),
                }
            })
            .collect();
        let steps: Vec<NewStepRow> = items
            .iter()
            .flat_map(|item| {
                item.new
                    .steps
                    .iter()
                    .enumerate()
                    .map(move |(idx, (name, kind))| NewStepRow {
                        saga_id: &item.new.id,
                        idx,
                        name,
                        kind: kind.as_str(),
                        comp_status: comp_status_for(*kind).as_str(),
                    })
            })
            .collect();
        Ok(Self {
            sagas: to_json(&sagas)?,
            steps: to_json(&steps)?,
        })
    }
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

/// What the rows of the refused sagas say now: `(lease owner, lease epoch, cancel requested)`.
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
            ),
        );
    }
    Ok(refused)
}

/// A refused saga's row: `(lease owner, lease epoch, cancel requested)`.
pub(crate) type Refused = (Option<String>, i64, bool);

/// Each item's result, given the leases the fence let through and, for the others, what their
/// rows say now.
fn outcomes(
    items: &[Item],
    written: &HashSet<(Uuid, i64)>,
    refused: &HashMap<Uuid, Refused>,
) -> Vec<Result<Applied>> {
    items
        .iter()
        .map(|(lease, _)| {
            if written.contains(&(lease.saga_id, lease.epoch)) {
                return Ok(Applied::Written);
            }
            refusal(lease, refused.get(&lease.saga_id))
        })
        .collect()
}

/// Why the fence refused a write under `lease`, from what its saga's row says now: a cancel
/// met by an action start under a lease still held, or else the lease is gone.
pub(crate) fn refusal(lease: &Lease, row: Option<&Refused>) -> Result<Applied> {
    match row {
        Some((Some(owner), epoch, true)) if *owner == lease.owner && *epoch == lease.epoch => {
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
            .map_err(StoreError::from)
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
                Err(StoreError::CommitFailed {
                    message: format!("not written, and reading why failed: {e}"),
                    transient: true,
                })
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
            Err(StoreError::CommitFailed {
                message: format!("committed, but its result could not be read: {e}"),
                transient: false,
            })
        })
        .collect()
}
