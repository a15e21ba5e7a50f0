//! Child sagas, written once for both databases: starting one under its parent's lease,
//! parking a parent until its child ends, making a parent due when its child ends, and turning
//! a completed child back when its parent goes back.

use crate::store::fence::lease_fence;
use serde_json::json;
use uuid::Uuid;

use super::events::insert_event;
use super::sql::{Arg, Tx};
use super::SqlBackend;
use crate::model::{definition_key, Millis, SagaStatus};
use crate::store::rows::{comp_status_for, parse_enum, LogRow};
use crate::store::{Lease, NewSaga, Result, StoreError};

/// The statuses of a saga that has ended, as SQL.
const TERMINAL: &str = "('COMPLETED', 'COMPENSATED', 'FAILED', 'ABORTED')";

/// Makes the parent of saga $1 due at $2, if it has one that has not ended and is not due
/// already. A parent woken for nothing looks at its child and parks again.
pub(crate) const WAKE_PARENT: &str = "UPDATE sagas SET next_run_at = $2 \
     WHERE id = (SELECT parent_id FROM sagas WHERE id = $1) \
     AND status IN ('QUEUED', 'RUNNING', 'COMPENSATING') \
     AND (next_run_at IS NULL OR next_run_at > $2)";

/// Makes the parent of `child` due now, inside the transaction that ends the child.
pub(crate) async fn wake_parent(tx: &mut Tx, child: Uuid) -> Result<()> {
    let now = tx.now().await?;
    if tx
        .exec(WAKE_PARENT, &[Arg::Id(child), Arg::Int(now)])
        .await?
        > 0
    {
        tx.announce_due().await?;
    }
    Ok(())
}

/// Creates `child`, started by the stage `stage` of the saga `lease` is for, only while that
/// lease holds (so a worker that lost its parent never starts a child the new owner does not
/// know of). A child already there (a parent resumed after a crash) is left as it is. Returns
/// whether this call created it.
pub(crate) async fn start<B: SqlBackend>(
    store: &B,
    lease: &Lease,
    stage: &str,
    child: &NewSaga,
) -> Result<bool> {
    let parent = lease.saga_id;
    let mut tx = store.begin().await?;
    if !tx.lock_saga(parent).await? {
        return Err(StoreError::NotFound(parent));
    }
    let holds = tx
        .opt(
            concat!(
                "SELECT 1 AS found FROM sagas WHERE id = $1 AND ",
                lease_fence!("$2", "$3")
            ),
            &[
                Arg::Id(parent),
                Arg::Str(&lease.owner),
                Arg::Int(lease.epoch),
            ],
        )
        .await?
        .is_some();
    if !holds {
        store.commit(tx).await?;
        return Err(StoreError::LeaseLost(parent));
    }
    let now = tx.now().await?;
    let key = definition_key(&child.name, child.version, &child.definition_hash);
    let created = tx
        .exec(
            "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
             input, next_run_at, created_at, updated_at, parent_id, parent_stage, traceparent) \
             VALUES ($1, $2, $3, $4, $5, 'QUEUED', $6::jsonb, $7, $7, $7, $8, $9, $10) \
             ON CONFLICT (id) DO NOTHING",
            &[
                Arg::Id(child.id),
                Arg::Str(&child.name),
                Arg::Int(i64::from(child.version)),
                Arg::Str(&child.definition_hash),
                Arg::Str(&key),
                Arg::Json(&child.input),
                Arg::Int(now),
                Arg::Id(parent),
                Arg::Str(stage),
                Arg::OptStr(child.traceparent.as_deref()),
            ],
        )
        .await?
        > 0;
    if created {
        super::attrs::insert(&mut tx, child.id, &child.attrs).await?;
        for (idx, (name, kind)) in child.steps.iter().enumerate() {
            tx.exec(
                "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
                 VALUES ($1, $2, $3, $4, 'PENDING', $5)",
                &[
                    Arg::Id(child.id),
                    Arg::Int(idx as i64),
                    Arg::Str(name),
                    Arg::Str(kind.as_str()),
                    Arg::Str(comp_status_for(*kind).as_str()),
                ],
            )
            .await?;
        }
        let started = json!({
            "name": child.name, "version": child.version,
            "parent_id": parent, "parent_stage": stage,
        });
        insert_event(&mut tx, child.id, "saga.started", None, &started).await?;
        let data = json!({"child_id": child.id, "saga": child.name});
        insert_event(&mut tx, parent, "child.started", Some(stage), &data).await?;
        tx.announce_due().await?;
    }
    store.commit(tx).await?;
    Ok(created)
}

/// Parks `parent`, given back (no lease) due at `written` while it waits for `child` to end
/// after seeing it in `seen`: due now if the child has ended in another status since, else
/// only when something happens to it. Changes nothing if the parent's due time is no longer
/// `written` or it is leased. Returns whether it made the parent due now.
pub(crate) async fn park<B: SqlBackend>(
    store: &B,
    parent: Uuid,
    child: Uuid,
    seen: SagaStatus,
    written: Millis,
) -> Result<bool> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let ended = tx
        .opt(
            &format!("SELECT status FROM sagas WHERE id = $1 AND status IN {TERMINAL}"),
            &[Arg::Id(child)],
        )
        .await?
        .map(|row| row.get::<String>("status"))
        .transpose()?
        .is_some_and(|status| status != seen.as_str());
    let due = ended.then_some(now);
    let changed = tx
        .exec(
            "UPDATE sagas SET next_run_at = $2 WHERE id = $1 AND next_run_at = $3 \
             AND lease_owner IS NULL",
            &[Arg::Id(parent), Arg::OptInt(due), Arg::Int(written)],
        )
        .await?;
    let woken = ended && changed > 0;
    if woken {
        tx.announce_due().await?;
    }
    store.commit(tx).await?;
    Ok(woken)
}

/// Turns the completed child `child` back because its parent `parent` goes back: the child
/// becomes `COMPENSATING`, due now, and its engine runs its compensations. A child that has
/// not completed is left as it is; one past a point of no return cannot go back
/// ([`StoreError::Conflict`]).
pub(crate) async fn compensate<B: SqlBackend>(
    store: &B,
    child: Uuid,
    parent: Uuid,
) -> Result<SagaStatus> {
    let mut tx = store.begin().await?;
    if !tx.lock_saga(child).await? {
        return Err(StoreError::NotFound(child));
    }
    let row = tx
        .opt(
            "SELECT status, pivot_reached FROM sagas WHERE id = $1",
            &[Arg::Id(child)],
        )
        .await?
        .ok_or(StoreError::NotFound(child))?;
    let status: SagaStatus = parse_enum(&child.to_string(), &row.get::<String>("status")?)?;
    if status != SagaStatus::Completed {
        store.commit(tx).await?;
        return Ok(status);
    }
    if row.get::<bool>("pivot_reached")? {
        store.commit(tx).await?;
        return Err(StoreError::Conflict(format!(
            "child saga {child} passed its point of no return; it cannot be compensated"
        )));
    }
    let now = tx.now().await?;
    let reason = format!("its parent saga {parent} goes back");
    tx.exec(
        "UPDATE sagas SET status = 'COMPENSATING', output = NULL, error = $3, \
         next_run_at = $2, updated_at = $2 WHERE id = $1",
        &[Arg::Id(child), Arg::Int(now), Arg::Str(&reason)],
    )
    .await?;
    let data = json!({"reason": reason});
    insert_event(&mut tx, child, "saga.compensating", None, &data).await?;
    tx.announce_due().await?;
    store.commit(tx).await?;
    Ok(SagaStatus::Compensating)
}
