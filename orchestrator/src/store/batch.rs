//! Set-based application of many engine transitions at once: the heart of group commit.
//!
//! Applying transitions one by one costs several statements each; on SQLite every statement is a
//! hop to the driver's thread, on PostgreSQL a network round trip. Here a batch of transitions
//! becomes a handful of statements whatever its size:
//!
//! 1. one `UPDATE sagas … FROM (VALUES …)` whose `WHERE` checks each saga's lease owner, epoch and
//!    (for action starts) the cancel flag, `RETURNING` the sagas that passed: the fence;
//! 2. for those only, one `UPDATE steps … FROM (VALUES …)` per phase, one multi-row `INSERT` of
//!    started attempts, one `UPDATE attempts … FROM (VALUES …)` of finished ones, one multi-row
//!    `INSERT` of events (in order, so each saga's history keeps its order);
//! 3. for the sagas that failed the fence, one `SELECT` tells a lost lease from a cancel.
//!
//! Every value goes through a bound parameter with an explicit `CAST`, so the same SQL text
//! serves SQLite and PostgreSQL. If a statement fails (a constraint), the caller falls back to
//! applying the transitions one by one, each in a savepoint, so one bad write fails alone.

use std::collections::HashMap;

use serde_json::Value;
use sqlx::Database;
use uuid::Uuid;

use super::{Lease, NewSaga, StepUpdate, Transition};
use saga_dsl::Phase;

/// Rows per statement, well under both backends' bound-parameter limits.
const CHUNK: usize = 200;

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

/// Pushes `CAST(? AS ty)`.
pub(crate) fn bind_as<'a, DB: Database, T>(
    b: &mut sqlx::query_builder::Separated<'_, 'a, DB, &'static str>,
    v: T,
    ty: &str,
) where
    T: 'a + sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    b.push("CAST(");
    b.push_bind_unseparated(v);
    b.push_unseparated(format!(" AS {ty})"));
}

/// The last update of each (saga, step, phase): a transition may carry a recovery and a new
/// write-ahead of the same phase, and a set-based `UPDATE` must see one row per key.
pub(crate) fn latest_steps<'a>(
    passed: &[&'a Item],
    phase: Phase,
) -> Vec<(Uuid, &'a StepUpdate, Option<&'a Value>)> {
    let mut order: Vec<(Uuid, u32)> = Vec::new();
    let mut latest: HashMap<(Uuid, u32), (&'a StepUpdate, Option<&'a Value>)> = HashMap::new();
    for (lease, t) in passed.iter().copied() {
        for u in t.steps.iter().filter(|u| u.phase == phase) {
            let key = (lease.saga_id, u.index);
            let output = u.output.as_ref().or(latest.get(&key).and_then(|(_, o)| *o));
            if latest.insert(key, (u, output)).is_none() {
                order.push(key);
            }
        }
    }
    order
        .into_iter()
        .filter_map(|k| latest.get(&k).map(|(u, o)| (k.0, *u, *o)))
        .collect()
}

/// The statements are the same for both backends; only the connection type and the SQL type
/// names of ids and JSON differ, so one body is stamped out per backend.
macro_rules! batch_writer {
    ($module:ident, $db:ty, $id:literal, $json:literal) => {
        pub(crate) mod $module {
            use std::collections::{HashMap, HashSet};

            use serde_json::Value;
            use sqlx::{Database, QueryBuilder, Row};
            use uuid::Uuid;

            use super::{bind_as, latest_steps, Item, NewItem, CHUNK};
            use crate::model::definition_key;
            use crate::store::rows::comp_status_for;
            use crate::store::group_commit::BoxFuture;
            use crate::model::Millis;
            use crate::store::{Applied, AttemptChange, Result, StoreError};
            use saga_dsl::Phase;

            /// [`insert_sagas`] as a plain function pointer for the write queue.
            pub(crate) fn insert_sagas_boxed<'c>(
                conn: &'c mut <$db as Database>::Connection,
                now: Millis,
                items: &'c [NewItem],
            ) -> BoxFuture<'c, Result<()>> {
                Box::pin(insert_sagas(conn, now, items))
            }

            /// Creates sagas set-based: one multi-row `INSERT` each for sagas, steps and their
            /// `saga.started` events.
            pub(crate) async fn insert_sagas(
                conn: &mut <$db as Database>::Connection,
                now: Millis,
                items: &[NewItem],
            ) -> Result<()> {
                for chunk in items.chunks(CHUNK) {
                    let mut q = QueryBuilder::<$db>::new(
                        "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
                         input, next_run_at, created_at, updated_at, lease_owner, lease_epoch, lease_expires_at) ",
                    );
                    q.push_values(chunk, |mut b, item| {
                        let n = &item.new;
                        bind_as(&mut b, n.id.to_string(), $id);
                        bind_as(&mut b, n.name.clone(), "TEXT");
                        bind_as(&mut b, i64::from(n.version), "BIGINT");
                        bind_as(&mut b, n.definition_hash.clone(), "TEXT");
                        bind_as(&mut b, definition_key(&n.name, n.version, &n.definition_hash), "TEXT");
                        bind_as(&mut b, "QUEUED".to_owned(), "TEXT");
                        bind_as(&mut b, n.input.to_string(), $json);
                        bind_as(&mut b, now, "BIGINT");
                        bind_as(&mut b, now, "BIGINT");
                        bind_as(&mut b, now, "BIGINT");
                        bind_as(&mut b, item.lease.as_ref().map(|(owner, _)| owner.clone()), "TEXT");
                        bind_as(&mut b, i64::from(item.lease.is_some()), "BIGINT");
                        bind_as(&mut b, item.lease.as_ref().map(|(_, ttl)| now + ttl), "BIGINT");
                    });
                    q.build().execute(&mut *conn).await?;
                }
                let steps: Vec<_> = items
                    .iter()
                    .flat_map(|item| {
                        item.new
                            .steps
                            .iter()
                            .enumerate()
                            .map(move |(idx, (name, kind))| (item.new.id, idx, name, *kind))
                    })
                    .collect();
                for chunk in steps.chunks(CHUNK) {
                    let mut q = QueryBuilder::<$db>::new(
                        "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) ",
                    );
                    q.push_values(chunk, |mut b, (saga, idx, name, kind)| {
                        bind_as(&mut b, saga.to_string(), $id);
                        bind_as(&mut b, *idx as i64, "BIGINT");
                        bind_as(&mut b, (*name).clone(), "TEXT");
                        bind_as(&mut b, kind.as_str().to_owned(), "TEXT");
                        bind_as(&mut b, "PENDING".to_owned(), "TEXT");
                        bind_as(&mut b, comp_status_for(*kind).as_str().to_owned(), "TEXT");
                    });
                    q.build().execute(&mut *conn).await?;
                }
                for chunk in items.chunks(CHUNK) {
                    let mut q = QueryBuilder::<$db>::new(
                        "INSERT INTO events (saga_id, at, type, step, data) ",
                    );
                    q.push_values(chunk, |mut b, item| {
                        let n = &item.new;
                        let data = serde_json::json!({"name": n.name, "version": n.version});
                        bind_as(&mut b, n.id.to_string(), $id);
                        bind_as(&mut b, now, "BIGINT");
                        bind_as(&mut b, "saga.started".to_owned(), "TEXT");
                        bind_as(&mut b, None::<String>, "TEXT");
                        bind_as(&mut b, data.to_string(), $json);
                    });
                    q.build().execute(&mut *conn).await?;
                }
                Ok(())
            }

            /// [`apply_batch`] as a plain function pointer for the write queue.
            pub(crate) fn apply_batch_boxed<'c>(
                conn: &'c mut <$db as Database>::Connection,
                now: Millis,
                items: &'c [Item],
            ) -> BoxFuture<'c, Result<Vec<Result<Applied>>>> {
                Box::pin(apply_batch(conn, now, items))
            }

/// Applies `items` on `conn` inside the caller's transaction; one result per item, in order.
/// `Err` means a statement failed and the transaction must be rolled back to before the call.
pub(crate) async fn apply_batch(
    conn: &mut <$db as Database>::Connection,
    now: Millis,
    items: &[Item],
) -> Result<Vec<Result<Applied>>>
{
    // 1. The fence: which sagas may be written.
    let mut written: HashSet<Uuid> = HashSet::new();
    for chunk in items.chunks(CHUNK) {
        let mut q = QueryBuilder::<$db>::new(
            "WITH v(id, owner, epoch, guard, status, next_run_at, error, output, attention, pivot, rel) AS (",
        );
        q.push_values(chunk, |mut b, (lease, t)| {
            let s = &t.saga;
            bind_as(&mut b, lease.saga_id.to_string(), $id);
            bind_as(&mut b, lease.owner.clone(), "TEXT");
            bind_as(&mut b, lease.epoch, "BIGINT");
            bind_as(&mut b, t.unless_cancelled, "BOOLEAN");
            bind_as(&mut b, s.status.as_str().to_owned(), "TEXT");
            bind_as(&mut b, s.next_run_at, "BIGINT");
            bind_as(&mut b, s.error.clone(), "TEXT");
            bind_as(&mut b, s.output.as_ref().map(Value::to_string), $json);
            bind_as(&mut b, s.needs_attention, "BOOLEAN");
            bind_as(&mut b, s.pivot_reached, "BOOLEAN");
            bind_as(&mut b, t.release, "BOOLEAN");
        });
        q.push(
            ") UPDATE sagas SET status = v.status, next_run_at = v.next_run_at, error = v.error, \
             output = COALESCE(v.output, sagas.output), needs_attention = v.attention, \
             pivot_reached = v.pivot, updated_at = ",
        );
        q.push_bind(now);
        q.push(
            ", lease_owner = CASE WHEN v.rel THEN NULL ELSE sagas.lease_owner END, \
             lease_expires_at = CASE WHEN v.rel THEN NULL ELSE sagas.lease_expires_at END \
             FROM v WHERE sagas.id = v.id AND sagas.lease_owner = v.owner \
             AND sagas.lease_epoch = v.epoch AND NOT (v.guard AND sagas.cancel_requested) \
             RETURNING CAST(sagas.id AS TEXT) AS id",
        );
        for row in q.build().fetch_all(&mut *conn).await? {
            let id: String = row.try_get("id")?;
            if let Ok(id) = Uuid::parse_str(&id) {
                written.insert(id);
            }
        }
    }
    let passed: Vec<&Item> = items
        .iter()
        .filter(|(lease, _)| written.contains(&lease.saga_id))
        .collect();

    // 2. The rest of each written transition.
    write_steps(conn, &passed).await?;
    write_attempts(conn, now, &passed).await?;
    write_events(conn, now, &passed).await?;

    // 3. Why the others were refused.
    let refused: Vec<&Item> = items
        .iter()
        .filter(|(lease, _)| !written.contains(&lease.saga_id))
        .collect();
    let mut cancel_pending: HashMap<Uuid, (Option<String>, i64, bool)> = HashMap::new();
    for chunk in refused.chunks(CHUNK) {
        let mut q = QueryBuilder::<$db>::new(
            "SELECT CAST(id AS TEXT) AS id, lease_owner, lease_epoch, cancel_requested FROM sagas WHERE id IN (",
        );
        let mut sep = q.separated(", ");
        for (lease, _) in chunk.iter().copied() {
            bind_as(&mut sep, lease.saga_id.to_string(), $id);
        }
        q.push(")");
        for row in q.build().fetch_all(&mut *conn).await? {
            let id: String = row.try_get("id")?;
            if let Ok(id) = Uuid::parse_str(&id) {
                cancel_pending.insert(
                    id,
                    (
                        row.try_get("lease_owner")?,
                        row.try_get("lease_epoch")?,
                        row.try_get("cancel_requested")?,
                    ),
                );
            }
        }
    }
    Ok(items
        .iter()
        .map(|(lease, _)| {
            if written.contains(&lease.saga_id) {
                return Ok(Applied::Written);
            }
            match cancel_pending.get(&lease.saga_id) {
                Some((Some(owner), epoch, true))
                    if *owner == lease.owner && *epoch == lease.epoch =>
                {
                    Ok(Applied::CancelRequested)
                }
                _ => Err(StoreError::LeaseLost(lease.saga_id)),
            }
        })
        .collect())
}

async fn write_steps(conn: &mut <$db as Database>::Connection, passed: &[&Item]) -> Result<()>
{
    for phase in [Phase::Action, Phase::Compensation] {
        let rows = latest_steps(passed, phase);
        for chunk in rows.chunks(CHUNK) {
            let mut q = QueryBuilder::<$db>::new(
                "WITH v(saga_id, idx, status, attempts, last_error, unknown, started_at, ended_at, output) AS (",
            );
            q.push_values(chunk, |mut b, (saga, u, output)| {
                let r = &u.record;
                bind_as(&mut b, saga.to_string(), $id);
                bind_as(&mut b, i64::from(u.index), "BIGINT");
                bind_as(&mut b, r.status.as_str().to_owned(), "TEXT");
                bind_as(&mut b, i64::from(r.attempts), "BIGINT");
                bind_as(&mut b, r.last_error.clone(), "TEXT");
                bind_as(&mut b, r.outcome_unknown, "BOOLEAN");
                bind_as(&mut b, r.started_at, "BIGINT");
                bind_as(&mut b, r.ended_at, "BIGINT");
                bind_as(&mut b, output.map(Value::to_string), $json);
            });
            q.push(match phase {
                Phase::Action => {
                    ") UPDATE steps SET status = v.status, attempts = v.attempts, \
                     last_error = v.last_error, outcome_unknown = v.unknown, started_at = v.started_at, \
                     ended_at = v.ended_at, output = COALESCE(v.output, steps.output) \
                     FROM v WHERE steps.saga_id = v.saga_id AND steps.idx = v.idx"
                }
                Phase::Compensation => {
                    ") UPDATE steps SET comp_status = v.status, comp_attempts = v.attempts, \
                     comp_last_error = v.last_error, comp_outcome_unknown = v.unknown, \
                     comp_started_at = v.started_at, comp_ended_at = v.ended_at \
                     FROM v WHERE steps.saga_id = v.saga_id AND steps.idx = v.idx"
                }
            });
            q.build().execute(&mut *conn).await?;
        }
    }
    Ok(())
}

async fn write_attempts(
    conn: &mut <$db as Database>::Connection,
    now: Millis,
    passed: &[&Item],
) -> Result<()>
{
    let mut starts = Vec::new();
    let mut finishes = Vec::new();
    for (lease, t) in passed.iter().copied() {
        for change in &t.attempts {
            match change {
                AttemptChange::Start { .. } => starts.push((lease, change)),
                AttemptChange::Finish { .. } => finishes.push((lease, change)),
            }
        }
    }
    // Finishes first: a transition may close attempt n and start attempt n + 1.
    for chunk in finishes.chunks(CHUNK) {
        let mut q = QueryBuilder::<$db>::new(
            "WITH v(saga_id, idx, phase, attempt, outcome, error) AS (",
        );
        q.push_values(chunk, |mut b, (lease, change)| {
            if let AttemptChange::Finish { step_index, phase, attempt, outcome, error } = change {
                bind_as(&mut b, lease.saga_id.to_string(), $id);
                bind_as(&mut b, i64::from(*step_index), "BIGINT");
                bind_as(&mut b, phase.as_str().to_owned(), "TEXT");
                bind_as(&mut b, i64::from(*attempt), "BIGINT");
                bind_as(&mut b, (*outcome).to_owned(), "TEXT");
                bind_as(&mut b, error.clone(), "TEXT");
            }
        });
        q.push(") UPDATE attempts SET ended_at = ");
        q.push_bind(now);
        q.push(
            ", outcome = v.outcome, error = v.error FROM v \
             WHERE attempts.saga_id = v.saga_id AND attempts.step_idx = v.idx \
             AND attempts.phase = v.phase AND attempts.attempt = v.attempt",
        );
        q.build().execute(&mut *conn).await?;
    }
    for chunk in starts.chunks(CHUNK) {
        let mut q = QueryBuilder::<$db>::new(
            "INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, started_at) ",
        );
        q.push_values(chunk, |mut b, (lease, change)| {
            if let AttemptChange::Start { step_index, phase, attempt } = change {
                bind_as(&mut b, lease.saga_id.to_string(), $id);
                bind_as(&mut b, i64::from(*step_index), "BIGINT");
                bind_as(&mut b, phase.as_str().to_owned(), "TEXT");
                bind_as(&mut b, i64::from(*attempt), "BIGINT");
                bind_as(&mut b, lease.owner.clone(), "TEXT");
                bind_as(&mut b, lease.epoch, "BIGINT");
                bind_as(&mut b, now, "BIGINT");
            }
        });
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

async fn write_events(
    conn: &mut <$db as Database>::Connection,
    now: Millis,
    passed: &[&Item],
) -> Result<()>
{
    let events: Vec<_> = passed
        .iter()
        .flat_map(|(lease, t)| t.events.iter().map(move |e| (lease.saga_id, e)))
        .collect();
    for chunk in events.chunks(CHUNK) {
        let mut q = QueryBuilder::<$db>::new("INSERT INTO events (saga_id, at, type, step, data) ");
        q.push_values(chunk, |mut b, (saga, e)| {
            bind_as(&mut b, saga.to_string(), $id);
            bind_as(&mut b, now, "BIGINT");
            bind_as(&mut b, e.kind.to_owned(), "TEXT");
            bind_as(&mut b, e.step.clone(), "TEXT");
            bind_as(&mut b, e.data.to_string(), $json);
        });
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}
        }
    };
}

batch_writer!(sqlite, sqlx::Sqlite, "TEXT", "TEXT");
batch_writer!(postgres, sqlx::Postgres, "UUID", "JSONB");
