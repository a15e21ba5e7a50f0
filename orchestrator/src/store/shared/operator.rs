//! The operator commands (cancel, abort, retry, mark-compensated), written once for both
//! databases: each loads the saga inside its write transaction, asks [`crate::model::rules`]
//! whether the command applies, and writes the saga, its steps and an audit event together.
//!
//! A command that takes a saga over (abort, retry of a failed step, mark-compensated) clears its
//! lease and bumps its epoch: a worker still driving it fails its next write on the fence and
//! stops, and the engine claims it afresh from what the command wrote.

use serde_json::json;
use uuid::Uuid;

use super::events::insert_event;
use super::reads::load_saga;
use super::sql::{Arg, Tx};
use super::SqlBackend;
use crate::model::rules::{
    cancel_refusal, check_abort, check_mark_compensated, plan_pause, plan_resume, plan_retry,
    PausePlan, ResumePlan, RetryPlan,
};
use crate::model::{Saga, SagaStatus, StepKind, StepStatus};
use crate::store::rows::{parse_enum, LogRow};
use crate::store::{Audit, CancelOutcome, Result, StoreError};

/// The saga, locked for the rest of the transaction.
pub(super) async fn lock_and_load(tx: &mut Tx, id: Uuid) -> Result<Saga> {
    if !tx.lock_saga(id).await? {
        return Err(StoreError::NotFound(id));
    }
    load_saga(tx, id).await?.ok_or(StoreError::NotFound(id))
}

/// Clears the lease and bumps the epoch: whoever drove the saga loses it at its next write.
pub(super) const TAKE_OVER: &str =
    "lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1";

/// Requests cancellation: recorded once; refused when terminal, compensating or past the pivot.
/// The first request's event records `audit`.
pub(crate) async fn request_cancel<B: SqlBackend>(
    store: &B,
    id: Uuid,
    audit: &Audit<'_>,
) -> Result<CancelOutcome> {
    let mut tx = store.begin().await?;
    tx.lock_saga(id).await?;
    let row = tx
        .opt(
            "SELECT status, pivot_reached, cancel_requested, paused_from FROM sagas \
             WHERE id = $1",
            &[Arg::Id(id)],
        )
        .await?
        .ok_or(StoreError::NotFound(id))?;
    let status: SagaStatus = parse_enum(&id.to_string(), &row.get::<String>("status")?)?;
    if let Some(refusal) = cancel_refusal(status, row.get("pivot_reached")?) {
        store.commit(tx).await?;
        return Ok(refusal);
    }
    super::bulk::settle_item(&mut tx, audit, id).await?;
    // Due now, so that a worker compensates it; a second request makes it due again (in case
    // it waits on a timer) but records no second event. A cancel ends a pause (a paused saga
    // before its pivot goes back to the status it was paused in, and compensates) and
    // withdraws a pause not yet applied: the saga is to be undone, not held.
    let now = tx.now().await?;
    let paused = status == SagaStatus::Paused;
    let resume_as = match row.get::<Option<String>>("paused_from")? {
        Some(from) => from,
        None => SagaStatus::Running.as_str().to_owned(),
    };
    tx.exec(
        "UPDATE sagas SET cancel_requested = TRUE, updated_at = $2, \
         next_run_at = CASE WHEN next_run_at < $2 THEN next_run_at ELSE $2 END, \
         status = CASE WHEN status = 'PAUSED' THEN $3 ELSE status END, \
         paused_from = NULL, pause_requested = NULL \
         WHERE id = $1",
        &[Arg::Id(id), Arg::Int(now), Arg::Str(&resume_as)],
    )
    .await?;
    if !row.get::<bool>("cancel_requested")? || paused {
        let mut data = audit.data();
        if paused {
            data.insert("was_paused".to_owned(), json!(true));
        }
        let data = data.into();
        insert_event(&mut tx, id, "saga.cancel_requested", None, &data).await?;
    }
    tx.announce_due().await?;
    store.commit(tx).await?;
    Ok(CancelOutcome::Accepted)
}

/// Stops driving a saga without compensating; audited with `audit`'s reason and actor.
pub(crate) async fn abort<B: SqlBackend>(store: &B, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
    let mut tx = store.begin().await?;
    let saga = lock_and_load(&mut tx, id).await?;
    check_abort(&saga)?;
    super::bulk::settle_item(&mut tx, audit, id).await?;
    let now = tx.now().await?;
    let error = format!("aborted: {}", audit.reason.unwrap_or_default());
    tx.exec(
        &format!(
            "UPDATE sagas SET status = 'ABORTED', next_run_at = NULL, gate = 0, {TAKE_OVER}, \
             pause_requested = NULL, paused_from = NULL, \
             updated_at = $2, error = COALESCE(error, $3) WHERE id = $1"
        ),
        &[Arg::Id(id), Arg::Int(now), Arg::Str(&error)],
    )
    .await?;
    let abandoned = abandon_running(&mut tx, &saga, None, now, ABANDONED_BY_ABORT).await?;
    let mut data = audit.data();
    data.insert("previous_status".into(), json!(saga.status));
    data.insert("abandoned".into(), abandoned.into());
    insert_event(&mut tx, id, "saga.aborted", None, &data.into()).await?;
    tx.announce_finished(id, SagaStatus::Aborted).await?;
    // A child saga's parent waits for its end.
    super::children::wake_parent(&mut tx, id).await?;
    store.commit(tx).await?;
    reload(store, id).await
}

/// Pauses a saga: at once if no worker holds it (not due, no lease, the status it goes on
/// in kept for the resume), else by recording the request, which its worker's fence meets at
/// its next call or give-back; audited with its audit.
pub(crate) async fn pause<B: SqlBackend>(store: &B, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
    let mut tx = store.begin().await?;
    let saga = lock_and_load(&mut tx, id).await?;
    let now = tx.now().await?;
    let plan = plan_pause(&saga, now)?;
    super::bulk::settle_item(&mut tx, audit, id).await?;
    let mut data = audit.data();
    match plan {
        PausePlan::Now => {
            // A lease left to run out is taken over: its worker is gone or lost it.
            tx.exec(
                &format!(
                    "UPDATE sagas SET status = 'PAUSED', paused_from = $3, next_run_at = NULL, \
                     pause_requested = NULL, {TAKE_OVER}, updated_at = $2 WHERE id = $1"
                ),
                &[Arg::Id(id), Arg::Int(now), Arg::Str(saga.status.as_str())],
            )
            .await?;
            data.insert("previous_status".to_owned(), json!(saga.status));
            insert_event(&mut tx, id, "saga.paused", None, &data.into()).await?;
        }
        PausePlan::Requested => {
            let request = serde_json::Value::Object(data.clone()).to_string();
            tx.exec(
                "UPDATE sagas SET pause_requested = $3, updated_at = $2 WHERE id = $1",
                &[Arg::Id(id), Arg::Int(now), Arg::Str(&request)],
            )
            .await?;
            insert_event(&mut tx, id, "saga.pause_requested", None, &data.into()).await?;
        }
    }
    store.commit(tx).await?;
    reload(store, id).await
}

/// Resumes a `PAUSED` saga in the status it was paused in, due now; a step whose retries ran
/// out gets a fresh budget (its attempts so far and now as the budget's base) and the flag
/// and error its pause set are cleared. A pause not yet applied is withdrawn. Audited with
/// `reason` and `actor`.
pub(crate) async fn resume<B: SqlBackend>(store: &B, id: Uuid, audit: &Audit<'_>) -> Result<Saga> {
    let mut tx = store.begin().await?;
    let saga = lock_and_load(&mut tx, id).await?;
    let now = tx.now().await?;
    let plan = plan_resume(&saga)?;
    super::bulk::settle_item(&mut tx, audit, id).await?;
    let mut data = audit.data();
    match plan {
        ResumePlan::Withdraw => {
            tx.exec(
                "UPDATE sagas SET pause_requested = NULL, updated_at = $2 WHERE id = $1",
                &[Arg::Id(id), Arg::Int(now)],
            )
            .await?;
            data.insert("withdrawn".to_owned(), json!(true));
            insert_event(&mut tx, id, "saga.resumed", None, &data.into()).await?;
        }
        ResumePlan::Resume { status, exhausted } => {
            if let Some(step) = exhausted {
                tx.exec(
                    "UPDATE steps SET status = 'RETRYING', budget_attempts = attempts, \
                     budget_started_at = $3 WHERE saga_id = $1 AND idx = $2",
                    &[Arg::Id(id), Arg::Int(i64::from(step.index)), Arg::Int(now)],
                )
                .await?;
                data.insert("step".to_owned(), json!(step.name));
            }
            // The flag and the error of a pause for spent retries were the pause's own.
            let cleared = if exhausted.is_some() {
                "needs_attention = FALSE, error = NULL, "
            } else {
                ""
            };
            tx.exec(
                &format!(
                    // A saga paused before its scheduled start waits for that start again.
                    "UPDATE sagas SET status = $3, paused_from = NULL, pause_requested = NULL, \
                     next_run_at = CASE WHEN $3 = 'QUEUED' AND scheduled_at > $2 \
                     THEN scheduled_at ELSE $2 END, {cleared}updated_at = $2 WHERE id = $1"
                ),
                &[Arg::Id(id), Arg::Int(now), Arg::Str(status.as_str())],
            )
            .await?;
            data.insert("status".to_owned(), json!(status));
            let step = exhausted.map(|s| s.name.as_str());
            insert_event(&mut tx, id, "saga.resumed", step, &data.into()).await?;
            tx.announce_due().await?;
        }
    }
    store.commit(tx).await?;
    reload(store, id).await
}

/// Makes a waiting retry happen now; on a `FAILED` saga, gives the failed step another attempt.
pub(crate) async fn retry_now<B: SqlBackend>(
    store: &B,
    id: Uuid,
    audit: &Audit<'_>,
) -> Result<Saga> {
    let mut tx = store.begin().await?;
    let saga = lock_and_load(&mut tx, id).await?;
    let now = tx.now().await?;
    let plan = plan_retry(&saga)?;
    super::bulk::settle_item(&mut tx, audit, id).await?;
    match plan {
        RetryPlan::Failed(failed) => {
            tx.exec(
                "UPDATE steps SET status = 'RETRYING' WHERE saga_id = $1 AND idx = $2",
                &[Arg::Id(id), Arg::Int(i64::from(failed.index))],
            )
            .await?;
            tx.exec(
                &format!(
                    "UPDATE sagas SET status = 'RUNNING', next_run_at = $2, \
                     needs_attention = FALSE, {TAKE_OVER}, updated_at = $2 WHERE id = $1"
                ),
                &[Arg::Id(id), Arg::Int(now)],
            )
            .await?;
            let mut data = audit.data();
            data.insert("step".into(), failed.name.clone().into());
            insert_event(
                &mut tx,
                id,
                "saga.retried",
                Some(&failed.name),
                &data.into(),
            )
            .await?;
        }
        RetryPlan::DueNow => {
            tx.exec(
                "UPDATE sagas SET next_run_at = $2, updated_at = $2 \
                 WHERE id = $1 AND (next_run_at IS NULL OR next_run_at > $2)",
                &[Arg::Id(id), Arg::Int(now)],
            )
            .await?;
            let data = audit.data().into();
            insert_event(&mut tx, id, "saga.retry_requested", None, &data).await?;
        }
    }
    tx.announce_due().await?;
    store.commit(tx).await?;
    reload(store, id).await
}

/// Records that an operator did a stuck compensation by hand, and lets the engine carry on
/// with the remaining ones; audited with `reason` and `actor`.
pub(crate) async fn mark_compensated<B: SqlBackend>(
    store: &B,
    id: Uuid,
    step: &str,
    reason: &str,
    actor: &str,
) -> Result<Saga> {
    let mut tx = store.begin().await?;
    let saga = lock_and_load(&mut tx, id).await?;
    let record = check_mark_compensated(&saga, step)?;
    let now = tx.now().await?;
    // Its compensation may be in flight: that attempt's result is no longer wanted.
    let abandoned =
        abandon_running(&mut tx, &saga, Some(record.index), now, ABANDONED_BY_MARK).await?;
    tx.exec(
        "UPDATE steps SET comp_status = 'MANUAL', comp_ended_at = $3 \
         WHERE saga_id = $1 AND idx = $2",
        &[
            Arg::Id(id),
            Arg::Int(i64::from(record.index)),
            Arg::Int(now),
        ],
    )
    .await?;
    tx.exec(
        &format!(
            "UPDATE sagas SET needs_attention = FALSE, next_run_at = $2, {TAKE_OVER}, \
             updated_at = $2 WHERE id = $1"
        ),
        &[Arg::Id(id), Arg::Int(now)],
    )
    .await?;
    let data = json!({"reason": reason, "actor": actor, "abandoned": abandoned});
    insert_event(&mut tx, id, "step.marked_compensated", Some(step), &data).await?;
    tx.announce_due().await?;
    store.commit(tx).await?;
    reload(store, id).await
}

pub(super) const ABANDONED_BY_ABORT: &str =
    "abandoned: the saga was aborted while this attempt was in flight; its outcome is unknown";
const ABANDONED_BY_MARK: &str = "abandoned: an operator marked the step compensated while this \
                                 attempt was in flight; its outcome is unknown";

/// Closes the attempts a command takes away from whoever was making them (every running one
/// of the saga, or those of row `only`): each phase left `RUNNING` becomes `UNKNOWN` and its
/// open attempt-log row `abandoned`, so the log never shows a call as running that nobody will
/// finish. The worker making it loses its lease with the same command, so its result, when
/// it comes, is refused. Returns `{step, phase, attempt}` for each, for the audit event.
pub(super) async fn abandon_running(
    tx: &mut Tx,
    saga: &Saga,
    only: Option<u32>,
    now: i64,
    why: &str,
) -> Result<Vec<serde_json::Value>> {
    let mut abandoned = Vec::new();
    for step in saga
        .steps
        .iter()
        .filter(|s| only.is_none_or(|i| i == s.index))
    {
        for (phase, record, cols) in [
            ("action", &step.action, ("status", "ended_at", "last_error")),
            (
                "compensation",
                &step.compensation,
                ("comp_status", "comp_ended_at", "comp_last_error"),
            ),
        ] {
            // A call waiting for its participant's callback is in flight too.
            let waits_for_callback = record.status == StepStatus::Waiting
                && step.waiting_for.as_deref() == Some(crate::model::task::TASK_WAIT);
            if record.status != StepStatus::Running && !waits_for_callback {
                continue;
            }
            let (status, ended, error) = cols;
            tx.exec(
                &format!(
                    "UPDATE steps SET {status} = 'UNKNOWN', {ended} = $3, {error} = $4 \
                     WHERE saga_id = $1 AND idx = $2"
                ),
                &[
                    Arg::Id(saga.id),
                    Arg::Int(i64::from(step.index)),
                    Arg::Int(now),
                    Arg::Str(why),
                ],
            )
            .await?;
            // A group's own row is running while its branches are; it has no attempts.
            if step.kind == StepKind::Parallel {
                continue;
            }
            tx.exec(
                "UPDATE attempts SET ended_at = $4, outcome = 'abandoned', error = $5 \
                 WHERE saga_id = $1 AND step_idx = $2 AND phase = $3 AND ended_at IS NULL",
                &[
                    Arg::Id(saga.id),
                    Arg::Int(i64::from(step.index)),
                    Arg::Str(phase),
                    Arg::Int(now),
                    Arg::Str(why),
                ],
            )
            .await?;
            abandoned.push(json!({"step": step.name, "phase": phase, "attempt": record.attempts}));
        }
    }
    Ok(abandoned)
}

/// The saga as the command left it.
pub(super) async fn reload<B: SqlBackend>(store: &B, id: Uuid) -> Result<Saga> {
    super::reads::get_saga(store.reader(), id)
        .await?
        .ok_or(StoreError::NotFound(id))
}
