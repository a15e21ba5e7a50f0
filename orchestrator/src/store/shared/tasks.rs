//! Task tokens' reports, written once for both databases: recording a participant's
//! completion, failure or heartbeat for the attempt its token names, reading it back for the
//! step's driver, parking a saga whose step waits for one, and the log's task key.

use serde_json::{json, Value};
use uuid::Uuid;

use super::events::insert_event;
use super::sql::{Arg, Reader, Tx};
use super::SqlBackend;
use crate::model::task::{TaskRef, TASK_WAIT};
use crate::model::{Millis, SagaStatus, StepStatus};
use crate::store::rows::{parse_enum, parse_json, LogRow};
use crate::store::tasks::{TaskAnswer, TaskOutcome, TaskReport};
use crate::store::Result;

/// The row an attempt's end is kept in, by `key`'s parameters.
const REPORTED: &str = "SELECT outcome, result::text AS result FROM tasks \
     WHERE saga_id = $1 AND step_idx = $2 AND phase = $3 AND attempt = $4";

/// The `secrets` row of the key task tokens are signed with.
const TASK_KEY: &str = "task_key";

/// The columns of a step's phase: status and attempts.
fn phase_columns(task: &TaskRef) -> (&'static str, &'static str) {
    match task.phase {
        saga_dsl::Phase::Action => ("status", "attempts"),
        saga_dsl::Phase::Compensation => ("comp_status", "comp_attempts"),
    }
}

/// Records what a participant reported for `task`, under the saga's row lock: the first
/// completion or failure of an attempt that is still its step's current one wins, a repeat of
/// it is answered the same, anything else is refused; a heartbeat moves the wait's deadline.
pub(crate) async fn report<B: SqlBackend>(
    store: &B,
    task: &TaskRef,
    report: &TaskReport,
) -> Result<TaskAnswer> {
    let mut tx = store.begin().await?;
    let answer = report_in(&mut tx, task, report).await?;
    store.commit(tx).await?;
    Ok(answer)
}

async fn report_in(tx: &mut Tx, task: &TaskRef, report: &TaskReport) -> Result<TaskAnswer> {
    let id = task.saga;
    if !tx.lock_saga(id).await? {
        return Ok(TaskAnswer::NotFound);
    }
    let Some(saga) = tx
        .opt("SELECT status FROM sagas WHERE id = $1", &[Arg::Id(id)])
        .await?
    else {
        return Ok(TaskAnswer::NotFound);
    };
    let saga_status: SagaStatus = parse_enum(&id.to_string(), &saga.get::<String>("status")?)?;
    let (status_col, attempts_col) = phase_columns(task);
    let sql = format!(
        "SELECT name, {status_col} AS status, {attempts_col} AS attempts, waiting_for, \
         timeout_at FROM steps WHERE saga_id = $1 AND idx = $2"
    );
    let Some(step) = tx
        .opt(&sql, &[Arg::Id(id), Arg::Int(task.step_index.into())])
        .await?
    else {
        return Ok(TaskAnswer::NotFound);
    };
    let name: String = step.get("name")?;
    let status: StepStatus = parse_enum(&name, &step.get::<String>("status")?)?;
    let attempts: i64 = step.get("attempts")?;
    let parked = status == StepStatus::Waiting
        && step.get::<Option<String>>("waiting_for")?.as_deref() == Some(TASK_WAIT);
    let before = tx.opt(REPORTED, &key(task)).await?;
    let current = !saga_status.is_terminal()
        && attempts == i64::from(task.attempt)
        && (status == StepStatus::Running || parked);
    let (outcome, result) = match report {
        TaskReport::Heartbeat { extend_ms } => {
            let now = tx.now().await?;
            // A wait whose deadline has passed is the driver's to close: too late to extend.
            let ran_out = parked
                && step
                    .get::<Option<i64>>("timeout_at")?
                    .is_some_and(|at| at <= now);
            if before.is_some() || !current || ran_out {
                return Ok(TaskAnswer::NotCurrent);
            }
            let timeout_at = now.saturating_add(*extend_ms);
            if parked {
                tx.exec(
                    "UPDATE steps SET timeout_at = $3 WHERE saga_id = $1 AND idx = $2",
                    &[
                        Arg::Id(id),
                        Arg::Int(task.step_index.into()),
                        Arg::Int(timeout_at),
                    ],
                )
                .await?;
            }
            // A step whose participant answers before its driver recorded the call's answer
            // has no deadline yet: the driver sets one, a timeout from then.
            return Ok(TaskAnswer::Extended {
                step: name,
                timeout_at,
            });
        }
        TaskReport::Complete(output) => ("completed", output.clone()),
        TaskReport::Fail { error, retryable } => {
            ("failed", json!({"error": error, "retryable": retryable}))
        }
    };
    if let Some(before) = before {
        let same_outcome = before.get::<String>("outcome")? == outcome;
        let same_result = parse_json(&name, before.get("result")?)?.as_ref() == Some(&result);
        return Ok(if same_outcome && same_result {
            TaskAnswer::Repeated { step: name }
        } else {
            TaskAnswer::NotCurrent
        });
    }
    if !current {
        return Ok(TaskAnswer::NotCurrent);
    }
    let now = tx.now().await?;
    let mut args = key(task).to_vec();
    args.extend([Arg::Str(outcome), Arg::Json(&result), Arg::Int(now)]);
    tx.exec(
        "INSERT INTO tasks (saga_id, step_idx, phase, attempt, outcome, result, reported_at) \
         VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)",
        &args,
    )
    .await?;
    let data = json!({"attempt": task.attempt, "phase": task.phase.as_str()});
    insert_event(tx, id, &format!("task.{outcome}"), Some(&name), &data).await?;
    // A saga parked on the wait goes on now; one whose driver still holds it takes the report
    // at its next turn, and a paused one once resumed.
    if parked && saga_status != SagaStatus::Paused {
        let due = tx
            .exec(
                "UPDATE sagas SET next_run_at = $2, updated_at = $2 WHERE id = $1 \
                 AND lease_owner IS NULL AND (next_run_at IS NULL OR next_run_at > $2)",
                &[Arg::Id(id), Arg::Int(now)],
            )
            .await?;
        if due > 0 {
            tx.announce_due().await?;
        }
    }
    Ok(TaskAnswer::Recorded { step: name })
}

/// The primary key of `task`'s row in `tasks`, as the first four parameters.
fn key(task: &TaskRef) -> [Arg<'static>; 4] {
    [
        Arg::Id(task.saga),
        Arg::Int(task.step_index.into()),
        Arg::Str(task.phase.as_str()),
        Arg::Int(task.attempt.into()),
    ]
}

/// What a participant reported for `task`, if it has.
pub(crate) async fn reported(reader: Reader<'_>, task: &TaskRef) -> Result<Option<TaskOutcome>> {
    let row = reader.opt(REPORTED, &key(task)).await?;
    row.map(|row| outcome_of(task, &row)).transpose()
}

/// The outcome a `tasks` row holds.
fn outcome_of(task: &TaskRef, row: &impl LogRow) -> Result<TaskOutcome> {
    let what = task.saga.to_string();
    let result = parse_json(&what, row.get("result")?)?.unwrap_or_default();
    Ok(match row.get::<String>("outcome")?.as_str() {
        "completed" => TaskOutcome::Completed(result),
        "expired" => TaskOutcome::Expired,
        "abandoned" => TaskOutcome::Abandoned,
        _ => TaskOutcome::Failed {
            error: result
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("the participant reported a failure")
                .to_owned(),
            retryable: result
                .get("retryable")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        },
    })
}

/// Closes the wait of `task` as `closing` (expired or abandoned) unless the participant
/// reported first: returns the outcome that stands, the report's or `closing`.
pub(crate) async fn close<B: SqlBackend>(
    store: &B,
    task: &TaskRef,
    closing: &TaskOutcome,
) -> Result<TaskOutcome> {
    let mut tx = store.begin().await?;
    // Under the saga's row lock, as a report is: the two never cross.
    tx.lock_saga(task.saga).await?;
    let now = tx.now().await?;
    let mut args = key(task).to_vec();
    let empty = json!({});
    args.extend([Arg::Str(closing.word()), Arg::Json(&empty), Arg::Int(now)]);
    tx.exec(
        "INSERT INTO tasks (saga_id, step_idx, phase, attempt, outcome, result, reported_at) \
         VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7) \
         ON CONFLICT (saga_id, step_idx, phase, attempt) DO NOTHING",
        &args,
    )
    .await?;
    let row = tx.opt(REPORTED, &key(task)).await?;
    store.commit(tx).await?;
    match row {
        Some(row) => outcome_of(task, &row),
        None => Ok(closing.clone()),
    }
}

/// Parks a saga given back while its step waits for `task`'s report: due now if it has come,
/// else at the wait's deadline; only if nothing changed its row since `written` (as
/// [`super::signals::park`]).
pub(crate) async fn park<B: SqlBackend>(
    store: &B,
    task: &TaskRef,
    written: Millis,
    deadline: Millis,
) -> Result<bool> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let reported = tx
        .opt(
            "SELECT 1 AS found FROM tasks \
             WHERE saga_id = $1 AND step_idx = $2 AND phase = $3 AND attempt = $4",
            &key(task),
        )
        .await?
        .is_some();
    let due = if reported { now } else { deadline };
    let changed = tx
        .exec(
            "UPDATE sagas SET next_run_at = $2 WHERE id = $1 AND next_run_at = $3 \
             AND lease_owner IS NULL",
            &[Arg::Id(task.saga), Arg::Int(due), Arg::Int(written)],
        )
        .await?;
    let woken = reported && changed > 0;
    if woken {
        tx.announce_due().await?;
    }
    store.commit(tx).await?;
    Ok(woken)
}

/// The log's task key, made by the first process that asks (every process of the log signs
/// and checks tokens with the same one).
pub(crate) async fn key_of_log<B: SqlBackend>(store: &B) -> Result<Vec<u8>> {
    let found = store
        .reader()
        .opt(
            "SELECT value FROM secrets WHERE name = $1",
            &[Arg::Str(TASK_KEY)],
        )
        .await?;
    if let Some(row) = found {
        return Ok(row.get::<String>("value")?.into_bytes());
    }
    // Two random UUIDs: 244 bits from the operating system's generator.
    let fresh = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    let mut tx = store.begin().await?;
    tx.exec(
        "INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[Arg::Str(TASK_KEY), Arg::Str(&fresh)],
    )
    .await?;
    let row = tx
        .opt(
            "SELECT value FROM secrets WHERE name = $1",
            &[Arg::Str(TASK_KEY)],
        )
        .await?;
    store.commit(tx).await?;
    match row {
        Some(row) => Ok(row.get::<String>("value")?.into_bytes()),
        None => Ok(fresh.into_bytes()),
    }
}
