//! Reading log rows back, the same way for every backend: each backend's row type implements
//! [`LogRow`], and the decoders here turn rows into model records, reporting a row that does not
//! parse as [`StoreError::Corrupt`] with the saga it belongs to.

use std::str::FromStr;

use serde_json::Value;
use uuid::Uuid;

use super::NewSaga;
use super::{Result, StoreError};
use crate::model::{wait_word, SagaPage};
use crate::model::{
    Attempt, Event, ForkedFrom, Millis, PhaseRecord, Saga, SagaSummary, StepKind, StepRecord,
    StepStatus, Worker,
};
use crate::store::SqlxResultExt;

/// A column value a log row can yield.
pub(super) trait Column: Sized {
    /// Reads column `name` of a SQLite row.
    #[cfg(feature = "sqlite")]
    fn sqlite(row: &sqlx::sqlite::SqliteRow, name: &str) -> Result<Self>;
    /// Reads column `name` of a PostgreSQL row.
    #[cfg(feature = "postgres")]
    fn postgres(row: &sqlx::postgres::PgRow, name: &str) -> Result<Self>;
}

macro_rules! column {
    ($($t:ty),*) => {$(
        impl Column for $t {
            #[cfg(feature = "sqlite")]
            fn sqlite(row: &sqlx::sqlite::SqliteRow, name: &str) -> Result<Self> {
                sqlx::Row::try_get(row, name).db()
            }
            #[cfg(feature = "postgres")]
            fn postgres(row: &sqlx::postgres::PgRow, name: &str) -> Result<Self> {
                sqlx::Row::try_get(row, name).db()
            }
        }
    )*};
}
column!(String, Option<String>, i64, Option<i64>, bool);

/// A row of the step log, from any backend.
pub(super) trait LogRow {
    /// Reads one column.
    fn get<T: Column>(&self, name: &str) -> Result<T>;
}

#[cfg(feature = "sqlite")]
impl LogRow for sqlx::sqlite::SqliteRow {
    fn get<T: Column>(&self, name: &str) -> Result<T> {
        T::sqlite(self, name)
    }
}

#[cfg(feature = "postgres")]
impl LogRow for sqlx::postgres::PgRow {
    fn get<T: Column>(&self, name: &str) -> Result<T> {
        T::postgres(self, name)
    }
}

pub(super) fn corrupt(saga: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        saga: saga.to_owned(),
        detail: detail.to_string(),
    }
}

/// Saga ids read back as text.
pub(super) fn parse_ids(ids: &[String]) -> Result<Vec<Uuid>> {
    ids.iter()
        .map(|t| Uuid::parse_str(t).map_err(|e| corrupt(t, e)))
        .collect()
}

pub(super) fn parse_json(saga: &str, text: Option<String>) -> Result<Option<Value>> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| corrupt(saga, format!("bad JSON: {e}"))))
        .transpose()
}

pub(super) fn parse_enum<T: FromStr>(saga: &str, text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| corrupt(saga, e))
}

pub(super) fn saga_from_row<R: LogRow>(row: &R, steps: Vec<StepRecord>) -> Result<Saga> {
    let id_text: String = row.get("id")?;
    let id = Uuid::parse_str(&id_text).map_err(|e| corrupt(&id_text, e))?;
    let status: String = row.get("status")?;
    let version: i64 = row.get("version")?;
    Ok(Saga {
        id,
        name: row.get("name")?,
        version: u32::try_from(version).map_err(|e| corrupt(&id_text, e))?,
        definition_hash: row.get("definition_hash")?,
        status: parse_enum(&id_text, &status)?,
        needs_attention: row.get("needs_attention")?,
        blocked: row.get("blocked")?,
        cancel_requested: row.get("cancel_requested")?,
        pause_requested: row.get::<Option<String>>("pause_requested")?.is_some(),
        paused_from: row
            .get::<Option<String>>("paused_from")?
            .map(|s| parse_enum(&id_text, &s))
            .transpose()?,
        pivot_started: row.get("pivot_reached")?,
        // The vocabulary's fields are computed when the saga is shown (`Saga::shown`).
        pivot_reached: false,
        waiting_for: None,
        priority: u8::try_from(row.get::<i64>("priority")?).map_err(|e| corrupt(&id_text, e))?,
        waiting_limit: None,
        wake_at: None,
        // Read for the API and the CLI only (`shared::reads::get_saga`), not by the engine.
        attrs: std::collections::BTreeMap::new(),
        input: parse_json(&id_text, Some(row.get("input")?))?.unwrap_or(Value::Null),
        output: parse_json(&id_text, row.get("output")?)?,
        error: row.get("error")?,
        next_run_at: row.get("next_run_at")?,
        lease_owner: row.get("lease_owner")?,
        lease_epoch: row.get("lease_epoch")?,
        lease_expires_at: row.get("lease_expires_at")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        parent_id: row
            .get::<Option<String>>("parent_id")?
            .map(|p| Uuid::parse_str(&p).map_err(|e| corrupt(&id_text, e)))
            .transpose()?,
        parent_stage: row.get("parent_stage")?,
        forked_from: match row.get::<Option<String>>("forked_from")? {
            Some(from) => Some(ForkedFrom {
                saga_id: Uuid::parse_str(&from).map_err(|e| corrupt(&id_text, e))?,
                stage: row.get("forked_from_stage")?,
            }),
            None => None,
        },
        superseded_by: row
            .get::<Option<String>>("superseded_by")?
            .map(|p| Uuid::parse_str(&p).map_err(|e| corrupt(&id_text, e)))
            .transpose()?,
        scheduled_at: row.get("scheduled_at")?,
        traceparent: row.get("traceparent")?,
        steps,
        stages: Vec::new(),
    })
}

pub(super) fn step_from_row<R: LogRow>(row: &R) -> Result<StepRecord> {
    let saga: String = row.get("saga_id")?;
    let kind: String = row.get("kind")?;
    let status: String = row.get("status")?;
    let comp_status: String = row.get("comp_status")?;
    let idx: i64 = row.get("idx")?;
    let attempts: i64 = row.get("attempts")?;
    let comp_attempts: i64 = row.get("comp_attempts")?;
    let stage_index: Option<i64> = row.get("stage_index")?;
    Ok(StepRecord {
        index: u32::try_from(idx).map_err(|e| corrupt(&saga, e))?,
        name: row.get("name")?,
        stage_index: stage_index
            .map(|i| u32::try_from(i).map_err(|e| corrupt(&saga, e)))
            .transpose()?,
        branch: row.get("branch")?,
        kind: parse_enum(&saga, &kind)?,
        action: PhaseRecord {
            status: parse_enum(&saga, &status)?,
            attempts: u32::try_from(attempts).map_err(|e| corrupt(&saga, e))?,
            last_error: row.get("last_error")?,
            outcome_unknown: row.get("outcome_unknown")?,
            started_at: row.get("started_at")?,
            ended_at: row.get("ended_at")?,
        },
        output: parse_json(&saga, row.get("output")?)?,
        wake_at: row.get("wake_at")?,
        waiting_for: row.get("waiting_for")?,
        timeout_at: row.get("timeout_at")?,
        retry_at: row.get("retry_at")?,
        compensation: PhaseRecord {
            status: parse_enum(&saga, &comp_status)?,
            attempts: u32::try_from(comp_attempts).map_err(|e| corrupt(&saga, e))?,
            last_error: row.get("comp_last_error")?,
            outcome_unknown: row.get("comp_outcome_unknown")?,
            started_at: row.get("comp_started_at")?,
            ended_at: row.get("comp_ended_at")?,
        },
        budget_attempts: u32::try_from(row.get::<i64>("budget_attempts")?)
            .map_err(|e| corrupt(&saga, e))?,
        budget_started_at: row.get("budget_started_at")?,
        keys_saga_id: row
            .get::<Option<String>>("keys_saga_id")?
            .map(|k| Uuid::parse_str(&k).map_err(|e| corrupt(&saga, e)))
            .transpose()?,
    })
}

/// How the list's column `waiting` begins for a saga waiting for a concurrency limit to start,
/// the limit's name following.
pub(crate) const LIMIT_WAIT: &str = "limit||";

/// A row of the list, with a column `waiting`: `kind|phase status|signal or stage name` of the
/// row a running or compensating saga is parked on, or `NULL` (see `store::shared::reads`).
pub(super) fn summary_from_row<R: LogRow>(row: &R) -> Result<SagaSummary> {
    let id_text: String = row.get("id")?;
    let id = Uuid::parse_str(&id_text).map_err(|e| corrupt(&id_text, e))?;
    let status: String = row.get("status")?;
    let version: i64 = row.get("version")?;
    let waiting_for = match row.get::<Option<String>>("waiting")? {
        Some(parts) if parts.starts_with(LIMIT_WAIT) => {
            Some(format!("limit:{}", &parts[LIMIT_WAIT.len()..]))
        }
        Some(parts) => {
            let mut parts = parts.splitn(3, '|');
            let (kind, phase, what) = (parts.next(), parts.next(), parts.next());
            let kind: StepKind = parse_enum(&id_text, kind.unwrap_or_default())?;
            let retrying = phase == Some(StepStatus::Retrying.as_str());
            let what = what.unwrap_or_default();
            Some(wait_word(id, kind, retrying, Some(what), what))
        }
        None => None,
    };
    let status: crate::model::SagaStatus = parse_enum(&id_text, &status)?;
    // A paused saga waits for a person, with no deadline (SPEC §12).
    let waiting_for = if status == crate::model::SagaStatus::Paused {
        Some(crate::model::PAUSED_WAIT.to_owned())
    } else {
        waiting_for
    };
    let next_run_at: Option<Millis> = row.get("next_run_at")?;
    Ok(SagaSummary {
        id,
        name: row.get("name")?,
        version: u32::try_from(version).map_err(|e| corrupt(&id_text, e))?,
        status,
        needs_attention: row.get("needs_attention")?,
        blocked: row.get("blocked")?,
        error: row.get("error")?,
        // A saga waiting for a limit is woken by room in it, not by a time.
        wake_at: waiting_for
            .as_ref()
            .filter(|w| !w.starts_with("limit:"))
            .and(next_run_at),
        attrs: match row.get::<Option<String>>("attrs")? {
            // SQLite's `json_group_object` of no rows is `{}`, PostgreSQL's aggregate `NULL`.
            Some(text) => serde_json::from_str(&text).map_err(|e| corrupt(&id_text, e))?,
            None => std::collections::BTreeMap::new(),
        },
        waiting_for,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
    })
}

pub(super) fn worker_from_row<R: LogRow>(row: &R) -> Result<Worker> {
    Ok(Worker {
        id: row.get("id")?,
        host: row.get("host")?,
        pid: row.get("pid")?,
        started_at: row.get("started_at")?,
        heartbeat_at: row.get("heartbeat_at")?,
        stopped_at: row.get("stopped_at")?,
        leases: row.get("leases")?,
    })
}

/// The record of row `index`, a stage or branch named `name` of `kind` that has not started.
pub(crate) fn pending_row(index: u32, name: String, kind: StepKind) -> StepRecord {
    StepRecord {
        index,
        name,
        stage_index: None,
        branch: None,
        kind,
        action: PhaseRecord::pending(),
        output: None,
        wake_at: None,
        waiting_for: None,
        timeout_at: None,
        retry_at: None,
        compensation: PhaseRecord::with_status(comp_status_for(kind)),
        budget_attempts: 0,
        budget_started_at: None,
        keys_saga_id: None,
    }
}

/// The compensation status a new step starts with.
pub(crate) fn comp_status_for(kind: StepKind) -> StepStatus {
    if matches!(kind, StepKind::Compensatable | StepKind::Child) {
        StepStatus::Pending
    } else {
        StepStatus::NotNeeded
    }
}

/// The record of a saga just created, as `create_saga` returns it; leased to `owner` (epoch 1)
/// if given, its first action written ahead if [`NewSaga::first_attempt`] asks for it.
pub(super) fn new_saga_record(new: NewSaga, now: Millis, owner: Option<String>) -> Saga {
    let ahead = new.starts_first_action(owner.is_some());
    let status = new.initial_status(owner.is_some());
    let pivot_started = ahead && new.first_is_point_of_no_return();
    let mut steps: Vec<StepRecord> = new
        .steps
        .iter()
        .enumerate()
        .map(|(idx, (name, kind))| pending_row(idx as u32, name.clone(), *kind))
        .collect();
    if ahead {
        steps[0].action = first_attempt(now);
    }
    Saga {
        id: new.id,
        name: new.name,
        version: new.version,
        definition_hash: new.definition_hash,
        status,
        needs_attention: false,
        blocked: false,
        cancel_requested: false,
        pause_requested: false,
        paused_from: None,
        pivot_started,
        pivot_reached: false,
        waiting_for: None,
        priority: new.flow.priority,
        waiting_limit: None,
        wake_at: None,
        attrs: new.attrs.into_iter().collect(),
        input: new.input,
        output: None,
        error: None,
        next_run_at: Some(new.start_at.unwrap_or(now)),
        lease_epoch: i64::from(owner.is_some()),
        lease_owner: owner,
        // Known to the writer only: the lease runs on the store's clock from the commit.
        lease_expires_at: None,
        created_at: now,
        updated_at: now,
        parent_id: None,
        parent_stage: None,
        forked_from: None,
        superseded_by: None,
        scheduled_at: new.start_at,
        traceparent: new.traceparent,
        steps,
        stages: Vec::new(),
    }
}

/// The first action's phase as its create writes it ahead: attempt 1 running since `now`, its
/// outcome unknown until the driver records it.
pub(super) fn first_attempt(now: Millis) -> PhaseRecord {
    PhaseRecord {
        status: StepStatus::Running,
        attempts: 1,
        last_error: None,
        outcome_unknown: true,
        started_at: Some(now),
        ended_at: None,
    }
}

pub(super) fn attempt_from_row<R: LogRow>(row: &R) -> Result<Attempt> {
    let idx: i64 = row.get("step_idx")?;
    let attempt: i64 = row.get("attempt")?;
    Ok(Attempt {
        step_index: idx as u32,
        step: row.get("name")?,
        phase: row.get("phase")?,
        attempt: attempt as u32,
        worker: row.get("worker")?,
        lease_epoch: row.get("lease_epoch")?,
        started_at: row.get("started_at")?,
        ended_at: row.get("ended_at")?,
        outcome: row.get("outcome")?,
        error: row.get("error")?,
    })
}

/// An event row; `data` is its JSON as text.
pub(super) fn event_from_row<R: LogRow>(row: &R, saga: &str) -> Result<Event> {
    let data: String = row.get("data")?;
    Ok(Event {
        seq: row.get("seq")?,
        id: row.get("id")?,
        at: row.get("at")?,
        kind: row.get("type")?,
        step: row.get("step")?,
        data: parse_json(saga, Some(data))?.unwrap_or(Value::Null),
    })
}

/// A page of a list fetched with `LIMIT limit + 1`: the extra row, if any, says there is a next
/// page, whose cursor is the last saga kept.
pub(super) fn page_from_rows<R: LogRow>(rows: &[R], limit: u32) -> Result<SagaPage> {
    let mut sagas = rows
        .iter()
        .map(summary_from_row)
        .collect::<Result<Vec<_>>>()?;
    let next_cursor = if sagas.len() > limit as usize {
        sagas.truncate(limit as usize);
        sagas.last().map(|s| s.id)
    } else {
        None
    };
    Ok(SagaPage { sagas, next_cursor })
}
