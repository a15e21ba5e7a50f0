//! The recovery commands of SPEC §13 that change the step log itself, written once for both
//! databases: completing a step by hand, and forking a saga. Each loads the saga inside its
//! write transaction, asks [`crate::model::rules`] again whether the command applies, takes
//! the saga over (lease cleared, epoch bumped: a worker still driving it fails its next write
//! on the fence) and writes its rows and its audit events together.

use serde_json::{json, Value};
use uuid::Uuid;

use super::events::insert_event;
use super::operator::{abandon_running, lock_and_load, reload, TAKE_OVER};
use super::sql::Arg;
use super::SqlBackend;
use crate::model::rules::{check_complete_step, check_fork};
use crate::model::{definition_key, Saga, SagaStatus, StepKind};
use crate::store::rows::comp_status_for;
use crate::store::Audit;
use crate::store::{NewFork, Result};

const ABANDONED_BY_COMPLETE: &str = "abandoned: an operator completed the step by hand while \
                                     this attempt was in flight; its outcome is unknown";
const ABANDONED_BY_FORK: &str = "abandoned: a fork took the saga's effects over while this \
                                 attempt was in flight; its outcome is unknown";

/// Records `output` as the result of step `step`, done by hand by an operator, and lets the
/// saga go on: the action becomes `SUCCEEDED` with that output (which its compensation, if
/// ever needed, receives), an open wait ends, and the saga is due now going forward (a
/// `PAUSED` or `FAILED` saga runs again). Audited with `reason` and `actor`.
pub(crate) async fn complete_step<B: SqlBackend>(
    store: &B,
    id: Uuid,
    step: &str,
    output: &Value,
    audit: &Audit<'_>,
) -> Result<Saga> {
    let mut tx = store.begin().await?;
    let saga = lock_and_load(&mut tx, id).await?;
    let record = check_complete_step(&saga, step)?;
    super::bulk::settle_item(&mut tx, audit, id).await?;
    let now = tx.now().await?;
    // The rule refuses a call in flight; an attempt left open all the same (a row written by
    // an older process) is closed rather than left running for nobody.
    let abandoned = abandon_running(
        &mut tx,
        &saga,
        Some(record.index),
        now,
        ABANDONED_BY_COMPLETE,
    )
    .await?;
    tx.exec(
        "UPDATE steps SET status = 'SUCCEEDED', output = $3::jsonb, outcome_unknown = FALSE, \
         started_at = COALESCE(started_at, $4), ended_at = $4, wake_at = NULL, \
         timeout_at = NULL, retry_at = NULL WHERE saga_id = $1 AND idx = $2",
        &[
            Arg::Id(id),
            Arg::Int(i64::from(record.index)),
            Arg::Json(output),
            Arg::Int(now),
        ],
    )
    .await?;
    tx.exec(
        &format!(
            "UPDATE sagas SET status = CASE WHEN status IN ('PAUSED', 'FAILED') THEN 'RUNNING' \
             ELSE status END, needs_attention = FALSE, next_run_at = $2, {TAKE_OVER}, \
             paused_from = NULL, pause_requested = NULL, updated_at = $2 WHERE id = $1"
        ),
        &[Arg::Id(id), Arg::Int(now)],
    )
    .await?;
    let mut data = audit.data();
    data.insert("step".to_owned(), json!(step));
    data.insert("output".to_owned(), output.clone());
    data.insert("previous_status".to_owned(), json!(saga.status));
    data.insert("abandoned".to_owned(), json!(abandoned));
    insert_event(
        &mut tx,
        id,
        "step.completed_by_operator",
        Some(step),
        &data.into(),
    )
    .await?;
    tx.announce_due().await?;
    store.commit(tx).await?;
    reload(store, id).await
}

/// Creates the fork `fork.new` of saga `fork.original` and, with a `from_stage`, hands it the
/// original's effects, in one transaction: the new saga is created `QUEUED` and due now, its
/// rows for the stages before `from_stage` copied from the original's (status, output, and the
/// saga whose keys they use), and the original becomes `ABORTED` with `superseded_by`, taken
/// over (lease cleared, epoch bumped, open attempts `abandoned`), so every effect has exactly
/// one owner at every commit. Returns the new saga.
pub(crate) async fn fork<B: SqlBackend>(store: &B, fork: &NewFork<'_>) -> Result<Saga> {
    let NewFork {
        original: original_id,
        new,
        from_stage,
        audit,
    } = fork;
    let original_id = *original_id;
    let reason = audit.reason.unwrap_or_default();
    let mut tx = store.begin().await?;
    let original = lock_and_load(&mut tx, original_id).await?;
    let plan = check_fork(&original, &new.steps, *from_stage)?;
    super::bulk::settle_item(&mut tx, audit, original_id).await?;
    let now = tx.now().await?;
    // The point of no return started among the stages taken over: the new saga cannot go
    // back either. (Had every such stage been skipped, the new saga's engine passes the point
    // itself, as the original's would have.)
    let point = new
        .steps
        .iter()
        .position(|(_, kind)| matches!(kind, StepKind::Pivot | StepKind::Retriable));
    let past_pivot = original.pivot_started
        && matches!((plan.from_index, point), (Some(from), Some(point)) if from > point);
    let key = definition_key(&new.name, new.version, &new.definition_hash);
    let greatest = match tx.dialect() {
        super::sql::Dialect::Sqlite => "MAX",
        super::sql::Dialect::Postgres => "GREATEST",
    };
    let fair = super::admission::fair_seq(greatest, "$12 = 1", "$13", "$14", "0");
    tx.exec(
        &format!(
            "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
             input, next_run_at, created_at, updated_at, pivot_reached, forked_from, \
             forked_from_stage, priority, gate, flow, flow_key, fair_seq) \
             VALUES ($1, $2, $3, $4, $5, 'QUEUED', $6::jsonb, $7, $7, $7, $8 = 1, $9, $10, $11, \
             $12, $13, $14, {fair})"
        ),
        &[
            Arg::Id(new.id),
            Arg::Str(&new.name),
            Arg::Int(i64::from(new.version)),
            Arg::Str(&new.definition_hash),
            Arg::Str(&key),
            Arg::Json(&new.input),
            Arg::Int(now),
            Arg::Int(i64::from(past_pivot)),
            Arg::Id(original_id),
            Arg::OptStr(*from_stage),
            Arg::Int(i64::from(new.flow.priority)),
            // The new saga waits for its definition's limits like any start.
            Arg::Int(i64::from(new.flow.gated)),
            Arg::OptStr(new.flow.flow.as_deref()),
            Arg::OptStr(new.flow.key.as_deref()),
        ],
    )
    .await?;
    super::attrs::insert(&mut tx, new.id, &new.attrs).await?;
    let from_index = plan.from_index.unwrap_or(0);
    for (idx, (name, kind)) in new.steps.iter().enumerate().skip(from_index) {
        tx.exec(
            "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
             VALUES ($1, $2, $3, $4, 'PENDING', $5)",
            &[
                Arg::Id(new.id),
                Arg::Int(idx as i64),
                Arg::Str(name),
                Arg::Str(kind.as_str()),
                Arg::Str(comp_status_for(*kind).as_str()),
            ],
        )
        .await?;
    }
    // The rows taken over keep their places (the rule asks the same stages in the same
    // places, so an index-derived key is the same); branch rows follow every stage's row, as
    // the engine appends them. A row the original itself took over keeps its own keys' saga.
    let mut next_branch_row = new.steps.len() as i64;
    for row in &plan.taken {
        let idx = if row.branch.is_some() {
            next_branch_row += 1;
            next_branch_row - 1
        } else {
            i64::from(row.index)
        };
        tx.exec(
            "INSERT INTO steps (saga_id, idx, name, kind, status, attempts, last_error, \
             outcome_unknown, output, started_at, ended_at, comp_status, wake_at, waiting_for, \
             stage_index, branch, keys_saga_id) \
             SELECT $1, $4, name, kind, status, attempts, last_error, outcome_unknown, output, \
             started_at, ended_at, comp_status, wake_at, waiting_for, stage_index, branch, \
             COALESCE(keys_saga_id, $2) FROM steps WHERE saga_id = $2 AND idx = $3",
            &[
                Arg::Id(new.id),
                Arg::Id(original_id),
                Arg::Int(i64::from(row.index)),
                Arg::Int(idx),
            ],
        )
        .await?;
    }
    let started = json!({"name": new.name, "version": new.version,
                         "forked_from": original_id, "from_stage": from_stage});
    insert_event(&mut tx, new.id, "saga.started", None, &started).await?;
    let data = |other: (&str, Uuid)| {
        let mut data = audit.data();
        data.insert("from_stage".to_owned(), json!(from_stage));
        data.insert(other.0.to_owned(), json!(other.1));
        Value::Object(data)
    };
    insert_event(
        &mut tx,
        new.id,
        "saga.forked",
        None,
        &data(("forked_from", original_id)),
    )
    .await?;
    insert_event(
        &mut tx,
        original_id,
        "saga.forked",
        None,
        &data(("new_saga_id", new.id)),
    )
    .await?;
    if plan.from_index.is_some() {
        let error = format!("superseded by saga {}: {reason}", new.id);
        tx.exec(
            &format!(
                "UPDATE sagas SET status = 'ABORTED', superseded_by = $3, next_run_at = NULL, gate = 0, \
                 needs_attention = FALSE, paused_from = NULL, pause_requested = NULL, \
                 {TAKE_OVER}, updated_at = $2, \
                 error = COALESCE(error, $4) WHERE id = $1"
            ),
            &[
                Arg::Id(original_id),
                Arg::Int(now),
                Arg::Id(new.id),
                Arg::Str(&error),
            ],
        )
        .await?;
        let abandoned = abandon_running(&mut tx, &original, None, now, ABANDONED_BY_FORK).await?;
        if original.status != SagaStatus::Aborted {
            let mut aborted = audit.data();
            aborted.insert("previous_status".to_owned(), json!(original.status));
            aborted.insert("abandoned".to_owned(), json!(abandoned));
            aborted.insert("superseded_by".to_owned(), json!(new.id));
            insert_event(&mut tx, original_id, "saga.aborted", None, &aborted.into()).await?;
            tx.announce_finished(original_id, SagaStatus::Aborted)
                .await?;
        }
    }
    tx.announce_due().await?;
    store.commit(tx).await?;
    reload(store, new.id).await
}
