//! Creates and transitions on SQLite, written row by row through SQLite's own API on the
//! writer's connection.
//!
//! The driver (sqlx) runs every statement on a thread of its own. A batch sent to it as one
//! text costs one hop there, but its rows must then travel as JSON arrays that SQLite unpacks
//! field by field, on the writer thread, the thread that limits throughput (see
//! BENCHMARKS.md). Here the batch's task borrows the connection's handle instead
//! ([`super::handle`]: the driver's thread waits meanwhile) and binds each row's values
//! to a small statement, prepared once on the writer's handle and kept. Each transition's fence
//! is the first statement of its rows, so its result is known without reading anything back.

use crate::store::fence::lease_fence;
use rusqlite::{params, Connection, OptionalExtension};
use uuid::Uuid;

use super::stmt::{exec, from_rusqlite};
use crate::model::{definition_key, Millis, PhaseRecord};
use crate::store::idempotency::Callback;
use crate::store::rows::{comp_status_for, first_attempt};
use crate::store::write_queue::batch::{refusal, Item, NewItem, Refused};
use crate::store::{Applied, AttemptChange, Lease, LeaseRequest, NewSaga, Result};
use saga_dsl::Phase;

/// The fence and the saga's new state: written only while the saga carries the lease (and,
/// for an action start, no cancel is pending); gives the lease up if asked. A running saga
/// given up with a cancel pending before its pivot is due at once, whatever wait its driver
/// wrote (the driver did not know of the cancel; no due time is a wait for a signal): the
/// engine compensates it now.
const FENCE: &str = concat!(
    "UPDATE sagas SET status = ?1, \
     next_run_at = CASE WHEN ?8 AND ?1 = 'RUNNING' AND NOT ?6 AND cancel_requested \
         AND (?2 IS NULL OR ?2 > ?7) THEN ?7 ELSE ?2 END, error = ?3, \
     output = COALESCE(?4, output), needs_attention = ?5, pivot_reached = ?6, updated_at = ?7, \
     lease_owner = CASE WHEN ?8 THEN NULL ELSE lease_owner END, \
     lease_expires_at = CASE WHEN ?8 THEN NULL ELSE lease_expires_at END, \
     pause_requested = CASE WHEN ?8 THEN NULL ELSE pause_requested END, paused_from = ?14 \
     WHERE id = ?9 AND ",
    lease_fence!("?10", "?11", guard "?12", hold "?13")
);

/// The fence of a transition that leaves the saga row's indexed columns as they are (a result
/// and the next write-ahead while the saga runs): its `SET` names no indexed column, so SQLite
/// rewrites none of the row's index entries, and it matches only if the row already holds the
/// transition's status, due time and flag. Where it does not match, [`FENCE`] follows.
const FENCE_IN_PLACE: &str = concat!(
    "UPDATE sagas SET error = ?1, pivot_reached = ?2, updated_at = ?3 WHERE id = ?4 AND ",
    lease_fence!("?5", "?6", guard "?7", hold "?11"),
    " AND status = ?8 AND next_run_at IS ?9 AND needs_attention = ?10"
);

/// What a refused saga's row says now.
const REFUSED: &str = "SELECT lease_owner, lease_epoch, cancel_requested, pause_requested \
     FROM sagas WHERE id = ?1";

const ACTION: &str = "UPDATE steps SET status = ?1, attempts = ?2, last_error = ?3, \
     outcome_unknown = ?4, started_at = ?5, ended_at = ?6, output = COALESCE(?7, output), \
     wake_at = ?10, waiting_for = ?11, timeout_at = ?12, retry_at = ?13 \
     WHERE saga_id = ?8 AND idx = ?9";

const COMPENSATION: &str = "UPDATE steps SET comp_status = ?1, comp_attempts = ?2, \
     comp_last_error = ?3, comp_outcome_unknown = ?4, comp_started_at = ?5, comp_ended_at = ?6, \
     retry_at = ?9 WHERE saga_id = ?7 AND idx = ?8";

const NEW_BRANCH: &str = "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status, \
     stage_index, branch) VALUES (?1, ?2, ?3, ?4, 'PENDING', ?5, ?6, ?7)";

/// Makes saga ?1 (the parent of a child saga that ends) due at ?2 unless it ended or is due
/// already.
const WAKE: &str = "UPDATE sagas SET next_run_at = ?2 WHERE id = ?1 \
     AND status IN ('QUEUED', 'RUNNING', 'COMPENSATING') \
     AND (next_run_at IS NULL OR next_run_at > ?2)";

const ATTEMPT_ENDED: &str = "UPDATE attempts SET ended_at = ?1, outcome = ?2, error = ?3 \
     WHERE saga_id = ?4 AND step_idx = ?5 AND phase = ?6 AND attempt = ?7";

const ATTEMPT_STARTED: &str = "INSERT INTO attempts \
     (saga_id, step_idx, phase, attempt, worker, lease_epoch, started_at, seq) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

const EVENT: &str =
    "INSERT INTO events (saga_id, at, type, step, data) VALUES (?1, ?2, ?3, ?4, ?5)";

static NEW_SAGA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO sagas (id, name, version, definition_hash, definition_key, \
         status, input, next_run_at, created_at, updated_at, lease_owner, lease_epoch, \
         lease_expires_at, pivot_reached, scheduled_at, traceparent, priority, gate, flow, \
         flow_key, fair_seq) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?11, ?6, COALESCE(?13, ?7), ?7, ?7, ?8, ?9, ?10, ?12, ?13, \
         ?14, ?15, ?16, ?17, ?18, {})",
        crate::store::shared::admission::fair_seq("MAX", "?16", "?17", "?18", "0")
    )
});

const NEW_ATTR: &str = "INSERT INTO saga_attrs (saga_id, attr, value) VALUES (?1, ?2, ?3)";

const NEW_CALLBACK: &str = "INSERT INTO saga_callbacks (saga_id, url, secret) VALUES (?1, ?2, ?3)";

const NEW_STEP: &str = "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status, \
     attempts, outcome_unknown, started_at) VALUES (?1, ?2, ?3, ?4, ?6, ?5, ?7, ?8, ?9)";

/// Creates sagas, their steps and their `saga.started` events. Not atomic by itself: run it in
/// a transaction or a savepoint.
pub(crate) fn create(db: &Connection, now: Millis, items: &[NewItem]) -> Result<()> {
    for item in items {
        create_saga(db, now, &item.new, item.lease.as_ref())?;
    }
    Ok(())
}

/// Creates one saga, its steps and its `saga.started` event, leased as `lease` asks if given, with its first action written ahead if [`NewSaga::first_attempt`] asks.
pub(crate) fn create_saga(
    db: &Connection,
    now: Millis,
    n: &NewSaga,
    lease: Option<&LeaseRequest>,
) -> Result<()> {
    let mut buf = Uuid::encode_buffer();
    let id: &str = n.id.hyphenated().encode_lower(&mut buf);
    let (owner, expires) = match lease {
        Some(l) => (Some(l.owner.as_str()), Some(now.saturating_add(l.ttl_ms))),
        None => (None, None),
    };
    let ahead = n.starts_first_action(lease.is_some());
    let status = n.initial_status(lease.is_some());
    exec(
        db,
        &NEW_SAGA,
        params![
            id,
            n.name,
            n.version,
            n.definition_hash,
            definition_key(&n.name, n.version, &n.definition_hash),
            n.input.to_string(),
            now,
            owner,
            i64::from(lease.is_some()),
            expires,
            status.as_str(),
            ahead && n.first_is_point_of_no_return(),
            n.start_at,
            n.traceparent,
            n.flow.priority,
            // A saga created leased is driven at once: it waits for nothing.
            n.flow.gated && lease.is_none(),
            n.flow.flow,
            n.flow.key,
        ],
    )?;
    let mut step = db.prepare_cached(NEW_STEP).map_err(from_rusqlite)?;
    let (first, pending) = (first_attempt(now), PhaseRecord::pending());
    for (idx, (name, kind)) in n.steps.iter().enumerate() {
        let action = if ahead && idx == 0 { &first } else { &pending };
        step.execute(params![
            id,
            idx,
            name,
            kind.as_str(),
            comp_status_for(*kind).as_str(),
            action.status.as_str(),
            action.attempts,
            action.outcome_unknown,
            action.started_at,
        ])
        .map_err(from_rusqlite)?;
    }
    // A saga without attributes prepares and runs nothing more.
    if !n.attrs.is_empty() {
        let mut attr = db.prepare_cached(NEW_ATTR).map_err(from_rusqlite)?;
        for (name, value) in &n.attrs {
            attr.execute(params![id, name, value])
                .map_err(from_rusqlite)?;
        }
    }
    if let (true, Some(owner)) = (ahead, owner) {
        exec(
            db,
            ATTEMPT_STARTED,
            params![id, 0, Phase::Action.as_str(), 1, owner, 1, now, 1],
        )?;
    }
    let data = serde_json::json!({ "name": n.name, "version": n.version });
    exec(
        db,
        EVENT,
        params![id, now, "saga.started", None::<&str>, data.to_string()],
    )?;
    Ok(())
}

/// Records a completion callback for a saga.
pub(crate) fn create_callback(db: &Connection, saga: &Uuid, callback: &Callback) -> Result<()> {
    exec(
        db,
        NEW_CALLBACK,
        params![saga.to_string(), callback.url, callback.secret],
    )?;
    Ok(())
}

/// Applies transitions, each only if its fence passes; one result per item, in order. Not
/// atomic by itself: run it in a transaction or a savepoint; on `Err` (a statement failed) the
/// caller undoes the whole call.
pub(crate) fn apply(db: &Connection, now: Millis, items: &[Item]) -> Result<Vec<Result<Applied>>> {
    items.iter().map(|item| apply_one(db, now, item)).collect()
}

/// One transition: the fence, then (if it passed) the step, attempt and event rows.
fn apply_one(db: &Connection, now: Millis, (lease, t): &Item) -> Result<Result<Applied>> {
    let mut buf = Uuid::encode_buffer();
    let id: &str = lease.saga_id.hyphenated().encode_lower(&mut buf);
    let s = &t.saga;
    // A completion's output and a lease given up are changes of their own: no in-place try.
    let in_place = !t.release
        && s.output.is_none()
        && exec(
            db,
            FENCE_IN_PLACE,
            params![
                s.error,
                s.pivot_started,
                now,
                id,
                lease.owner,
                lease.epoch,
                t.unless_cancelled,
                s.status.as_str(),
                s.next_run_at,
                s.needs_attention,
                t.unless_paused,
            ],
        )? == 1;
    let fenced = if in_place {
        1
    } else {
        exec(
            db,
            FENCE,
            params![
                s.status.as_str(),
                s.next_run_at,
                s.error,
                s.output.as_ref().map(ToString::to_string),
                s.needs_attention,
                s.pivot_started,
                now,
                t.release,
                id,
                lease.owner,
                lease.epoch,
                t.unless_cancelled,
                t.unless_paused,
                s.paused_from.map(|p| p.as_str()),
            ],
        )?
    };
    if fenced == 0 {
        return refused(db, id, lease, t);
    }
    if let Some(parent) = t.wake {
        exec(db, WAKE, params![parent.to_string(), now])?;
    }
    for n in &t.new_steps {
        exec(
            db,
            NEW_BRANCH,
            params![
                id,
                n.index,
                n.name,
                n.kind.as_str(),
                comp_status_for(n.kind).as_str(),
                n.stage_index,
                n.branch,
            ],
        )?;
    }
    for u in &t.steps {
        let r = &u.record;
        let written = match u.phase {
            Phase::Action => exec(
                db,
                ACTION,
                params![
                    r.status.as_str(),
                    r.attempts,
                    r.last_error,
                    r.outcome_unknown,
                    r.started_at,
                    r.ended_at,
                    u.output.as_ref().map(ToString::to_string),
                    id,
                    u.index,
                    u.wake_at,
                    u.waiting_for,
                    u.timeout_at,
                    u.retry_at,
                ],
            ),
            Phase::Compensation => exec(
                db,
                COMPENSATION,
                params![
                    r.status.as_str(),
                    r.attempts,
                    r.last_error,
                    r.outcome_unknown,
                    r.started_at,
                    r.ended_at,
                    id,
                    u.index,
                    u.retry_at,
                ],
            ),
        };
        written?;
    }
    // Ends first: a transition may close attempt n and start attempt n + 1.
    for change in &t.attempts {
        if let AttemptChange::Finish {
            step_index,
            phase,
            attempt,
            outcome,
            error,
        } = change
        {
            exec(
                db,
                ATTEMPT_ENDED,
                params![now, outcome, error, id, step_index, phase.as_str(), attempt],
            )?;
        }
    }
    for change in &t.attempts {
        if let AttemptChange::Start {
            step_index,
            phase,
            attempt,
            seq,
        } = change
        {
            exec(
                db,
                ATTEMPT_STARTED,
                params![
                    id,
                    step_index,
                    phase.as_str(),
                    attempt,
                    lease.owner,
                    lease.epoch,
                    now,
                    seq
                ],
            )?;
        }
    }
    for e in &t.events {
        exec(
            db,
            EVENT,
            params![id, now, e.kind, e.step, e.data.to_string()],
        )?;
    }
    Ok(Ok(Applied::Written))
}

/// Why the fence refused a write, read from the saga's row now ([`refusal`]).
fn refused(
    db: &Connection,
    id: &str,
    lease: &Lease,
    t: &crate::store::Transition,
) -> Result<Result<Applied>> {
    let row: Option<Refused> = db
        .prepare_cached(REFUSED)
        .and_then(|mut st| {
            st.query_row(params![id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(from_rusqlite)?;
    Ok(refusal(lease, t, row.as_ref()))
}
