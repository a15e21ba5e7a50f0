//! Reading the step log back, written once for both databases: a saga with its steps, pages of
//! sagas, a saga's events and attempts, the workers.

use uuid::Uuid;

use super::sql::{Arg, Reader, Row, Tx};
use crate::model::{
    Attempt, Event, IdPrefix, ListFilter, Saga, SagaPage, SagaStatus, StepRecord, WaitingCounts,
    Worker,
};
use crate::store::rows::{
    attempt_from_row, event_from_row, page_from_rows, parse_enum, parse_ids, saga_from_row,
    step_from_row, worker_from_row, LogRow,
};
use crate::store::Result;

/// The largest page a list returns.
const MAX_PAGE: u32 = 1000;

/// The concurrency limit a saga waiting to start (`o` the outer row) waits for: its key's, if
/// full, else its definition's running limit, else its key's.
macro_rules! waiting_limit {
    () => {
        "CASE WHEN o.gate = 1 AND o.flow IS NOT NULL AND o.next_run_at IS NOT NULL \
         THEN COALESCE((SELECT l.name FROM flow_limits l WHERE l.saga = o.flow \
         AND l.kind = 'per_key' AND COALESCE(l.limit_value, 0) <= (SELECT COUNT(*) FROM sagas r \
         WHERE r.flow = o.flow AND r.flow_key = o.flow_key AND r.gate = 0 \
         AND r.status IN ('QUEUED', 'RUNNING', 'COMPENSATING', 'PAUSED'))), \
         (SELECT l.name FROM flow_limits l WHERE l.saga = o.flow AND l.kind = 'max_running'), \
         (SELECT l.name FROM flow_limits l WHERE l.saga = o.flow AND l.kind = 'per_key')) END"
    };
}

const SELECT_SAGA: &str = concat!(
    "SELECT id::text AS id, name, version, definition_hash, status, \
     needs_attention, blocked, cancel_requested, pause_requested, paused_from, pivot_reached, input::text AS input, \
     output::text AS output, error, next_run_at, lease_owner, lease_epoch, lease_expires_at, \
     created_at, updated_at, parent_id::text AS parent_id, parent_stage, scheduled_at, \
     traceparent, forked_from::text AS forked_from, forked_from_stage, \
     superseded_by::text AS superseded_by, priority::bigint AS priority, ",
    waiting_limit!(),
    " AS waiting_limit FROM sagas o WHERE id = $1"
);

const SELECT_STEPS: &str = "SELECT saga_id::text AS saga_id, idx, name, kind, status, attempts, \
     last_error, outcome_unknown, output::text AS output, started_at, ended_at, comp_status, \
     comp_attempts, comp_last_error, comp_outcome_unknown, comp_started_at, comp_ended_at, \
     wake_at, waiting_for, timeout_at, retry_at, stage_index, branch, budget_attempts, \
     budget_started_at, keys_saga_id::text AS keys_saga_id FROM steps WHERE saga_id = $1 \
     ORDER BY idx";

/// A saga and its steps, read inside `tx` (whose snapshot pairs the saga with its own steps).
pub(crate) async fn load_saga(tx: &mut Tx, id: Uuid) -> Result<Option<Saga>> {
    let Some(row) = tx.opt(SELECT_SAGA, &[Arg::Id(id)]).await? else {
        return Ok(None);
    };
    let steps = tx.all(SELECT_STEPS, &[Arg::Id(id)]).await?;
    let steps = steps
        .iter()
        .map(step_from_row)
        .collect::<Result<Vec<StepRecord>>>()?;
    let mut saga = saga_from_row(&row, steps)?;
    saga.waiting_limit = row.get("waiting_limit")?;
    Ok(Some(saga))
}

/// A saga and its steps from one snapshot: two separate reads could straddle a commit and pair
/// the saga of one write with the steps of the next.
pub(crate) async fn get_saga(reader: Reader<'_>, id: Uuid) -> Result<Option<Saga>> {
    let mut tx = reader.snapshot().await?;
    let mut saga = load_saga(&mut tx, id).await?;
    if let Some(saga) = &mut saga {
        saga.attrs = super::attrs::of_saga(&mut tx, id).await?;
    }
    tx.commit().await?;
    Ok(saga.map(Saga::with_stages))
}

/// Only a saga's status (one key lookup).
pub(crate) async fn saga_status(reader: Reader<'_>, id: Uuid) -> Result<Option<SagaStatus>> {
    let row = reader
        .opt("SELECT status FROM sagas WHERE id = $1", &[Arg::Id(id)])
        .await?;
    row.map(|row| parse_enum(&id.to_string(), &row.get::<String>("status")?))
        .transpose()
}

/// The ids in `prefix`'s range, in id order: ids compare in the order of their hexadecimal
/// digits in both databases (lower-case hyphenated text on SQLite, bytes of a `uuid` on
/// PostgreSQL).
pub(crate) async fn saga_ids_with_prefix(
    reader: Reader<'_>,
    prefix: &IdPrefix,
    limit: u32,
) -> Result<Vec<Uuid>> {
    let rows = reader
        .all(
            "SELECT id::text AS id FROM sagas WHERE id >= $1 AND id <= $2 ORDER BY id LIMIT $3",
            &[
                Arg::Id(prefix.low()),
                Arg::Id(prefix.high()),
                Arg::Int(i64::from(limit)),
            ],
        )
        .await?;
    let ids = rows
        .iter()
        .map(|row| row.get::<String>("id"))
        .collect::<Result<Vec<_>>>()?;
    parse_ids(&ids)
}

/// What a listed saga is parked on (`Saga::shown` asks the same of a saga's rows): for a
/// running or compensating saga, its first row (by position) whose phase in the saga's
/// direction waits or retries, as `kind|phase status|signal or stage name`
/// (`rows::summary_from_row` makes the word). One lookup on the steps' primary key per listed
/// saga, and none for a saga that has ended.
const WAITING: &str = concat!(
    "CASE WHEN status IN ('RUNNING', 'COMPENSATING') THEN (\
     SELECT st.kind || '|' || (CASE WHEN o.status = 'RUNNING' THEN st.status \
     ELSE st.comp_status END) || '|' || (CASE WHEN st.kind = 'signal' \
     OR st.waiting_for LIKE 'rate:%' OR st.waiting_for = 'task' \
     THEN COALESCE(st.waiting_for, '') ELSE st.name END) \
     FROM steps st WHERE st.saga_id = o.id \
     AND (CASE WHEN o.status = 'RUNNING' THEN st.status ELSE st.comp_status END) \
     IN ('WAITING', 'RETRYING') ORDER BY st.idx LIMIT 1) \
     WHEN gate = 1 AND flow IS NOT NULL AND next_run_at IS NOT NULL THEN 'limit||' || (",
    waiting_limit!(),
    ") END AS waiting"
);

/// Appends `AND <condition> $n`, `$n` being `arg`'s place.
fn and<'a>(sql: &mut String, args: &mut Vec<Arg<'a>>, condition: &str, arg: Arg<'a>) {
    args.push(arg);
    sql.push_str(&format!(" AND {condition} ${}", args.len()));
}

/// Appends the conditions `filter` sets (not its page) to a statement over `sagas` ending in
/// `WHERE …`, binding after the `args` already there: the list's filter, which a bulk job's
/// snapshot shares. Only the conditions set are in the text, so each can use its index
/// (`sagas_status`, `sagas_name`, `sagas_attention`).
pub(crate) fn filter_conditions<'a>(
    dialect: super::sql::Dialect,
    filter: &'a ListFilter,
    sql: &mut String,
    args: &mut Vec<Arg<'a>>,
) {
    saga_conditions(dialect, filter, sql, args);
    super::attrs::conditions(&filter.attrs, sql, args);
}

/// The conditions of `filter` on the saga's own columns (all but its attributes).
fn saga_conditions<'a>(
    dialect: super::sql::Dialect,
    filter: &'a ListFilter,
    sql: &mut String,
    args: &mut Vec<Arg<'a>>,
) {
    if let Some(status) = filter.status {
        and(sql, args, "status =", Arg::Str(status.as_str()));
    }
    if let Some(name) = &filter.name {
        and(sql, args, "name =", Arg::Str(name));
    }
    if filter.needs_attention {
        sql.push_str(dialect.needs_attention());
    }
    if filter.blocked {
        // As counted: an unfinished saga nobody can drive (an aborted one keeps its flag).
        sql.push_str(" AND blocked = TRUE AND status IN ('QUEUED', 'RUNNING', 'COMPENSATING')");
    }
    if let Some(after) = filter.created_after {
        and(sql, args, "created_at >=", Arg::Int(after));
    }
    if let Some(before) = filter.created_before {
        and(sql, args, "created_at <", Arg::Int(before));
    }
    if let Some(prefix) = &filter.id_prefix {
        and(sql, args, "id >=", Arg::Id(prefix.low()));
        and(sql, args, "id <=", Arg::Id(prefix.high()));
    }
    if !filter.ids.is_empty() {
        let mut list = Vec::with_capacity(filter.ids.len());
        for id in &filter.ids {
            args.push(Arg::Id(*id));
            list.push(format!("${}", args.len()));
        }
        sql.push_str(&format!(" AND id IN ({})", list.join(", ")));
    }
}

/// A page of sagas, newest first, after the filter's cursor.
pub(crate) async fn list_sagas(reader: Reader<'_>, filter: &ListFilter) -> Result<SagaPage> {
    let limit = filter.limit.clamp(1, MAX_PAGE);
    let attrs = super::attrs::as_json(reader.dialect());
    let mut sql = format!(
        "SELECT id::text AS id, name, version, status, needs_attention, blocked, error, \
         next_run_at, created_at, updated_at, {WAITING}, {attrs} FROM "
    );
    let mut args = Vec::new();
    // By an attribute, the walk is the attribute's index newest first from the cursor, each
    // saga found by its key: a page reads about as many rows as it shows, however many sagas
    // the log holds. Further attributes are conditions on the sagas found.
    let (order, more) = match filter.attrs.split_first() {
        Some(((name, value), more)) => {
            sql.push_str("saga_attrs a0 JOIN sagas o ON o.id = a0.saga_id WHERE TRUE");
            and(&mut sql, &mut args, "a0.attr =", Arg::Str(name));
            and(&mut sql, &mut args, "a0.value =", Arg::Str(value));
            ("a0.saga_id", more)
        }
        None => {
            sql.push_str("sagas o WHERE TRUE");
            ("id", &[][..])
        }
    };
    saga_conditions(reader.dialect(), filter, &mut sql, &mut args);
    super::attrs::conditions(more, &mut sql, &mut args);
    if let Some(cursor) = filter.cursor {
        and(&mut sql, &mut args, &format!("{order} <"), Arg::Id(cursor));
    }
    args.push(Arg::Int(i64::from(limit) + 1));
    sql.push_str(&format!(" ORDER BY {order} DESC LIMIT ${}", args.len()));
    let rows: Vec<Row> = reader.all(&sql, &args).await?;
    page_from_rows(&rows, limit)
}

/// Sagas per status, every status listed (counted on the `sagas_status` index).
pub(crate) async fn count_by_status(reader: Reader<'_>) -> Result<Vec<(SagaStatus, u64)>> {
    let rows = reader
        .all(
            "SELECT status, COUNT(*) AS n FROM sagas GROUP BY status",
            &[],
        )
        .await?;
    let mut counts: Vec<(SagaStatus, u64)> = SagaStatus::ALL.iter().map(|s| (*s, 0)).collect();
    for row in &rows {
        let status: String = row.get("status")?;
        let n = u64::try_from(row.get::<i64>("n")?).unwrap_or(0);
        if let Some(slot) = counts.iter_mut().find(|(s, _)| s.as_str() == status) {
            slot.1 = n;
        }
    }
    Ok(counts)
}

/// Sagas needing attention (on the partial index `sagas_attention`) and unfinished sagas that
/// are blocked (on `sagas_status`: finished ones are never looked at).
pub(crate) async fn count_flagged(reader: Reader<'_>) -> Result<(u64, u64)> {
    let count = |row: Option<Row>| -> Result<u64> {
        Ok(match row {
            Some(row) => u64::try_from(row.get::<i64>("n")?).unwrap_or(0),
            None => 0,
        })
    };
    let attention = reader
        .opt(
            &format!(
                "SELECT COUNT(*) AS n FROM sagas WHERE TRUE{}",
                reader.dialect().needs_attention()
            ),
            &[],
        )
        .await?;
    let blocked = reader
        .opt(
            "SELECT COUNT(*) AS n FROM sagas \
             WHERE status IN ('QUEUED', 'RUNNING', 'COMPENSATING') AND blocked = TRUE",
            &[],
        )
        .await?;
    Ok((count(attention)?, count(blocked)?))
}

/// Unfinished sagas per definition key (on `sagas_status`: finished ones are never looked at).
pub(crate) async fn unfinished_by_definition(
    reader: Reader<'_>,
) -> Result<Vec<crate::store::UnfinishedOf>> {
    let rows = reader
        .all(
            "SELECT name, version, definition_hash, COUNT(*) AS n FROM sagas \
             WHERE status IN ('QUEUED', 'RUNNING', 'COMPENSATING', 'PAUSED') \
             GROUP BY name, version, definition_hash",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(crate::store::UnfinishedOf {
                name: row.get("name")?,
                version: u32::try_from(row.get::<i64>("version")?).unwrap_or_default(),
                hash: row.get("definition_hash")?,
                sagas: u64::try_from(row.get::<i64>("n")?).unwrap_or(0),
            })
        })
        .collect()
}

/// The waiting stages of unfinished sagas by kind, and the scheduled starts still ahead. Walks
/// `sagas_status` for the unfinished sagas and their steps' keys, never the finished log.
pub(crate) async fn waiting(reader: Reader<'_>, now: i64) -> Result<WaitingCounts> {
    let rows = reader
        .all(
            "SELECT CASE WHEN st.waiting_for = 'task' THEN 'task' ELSE st.kind END AS kind, \
             COUNT(*) AS n FROM sagas s JOIN steps st ON st.saga_id = s.id \
             WHERE s.status IN ('RUNNING', 'COMPENSATING') \
             AND (st.status = 'WAITING' OR st.comp_status = 'WAITING') \
             AND (st.kind IN ('sleep', 'signal', 'child') OR st.waiting_for = 'task') \
             GROUP BY 1",
            &[],
        )
        .await?;
    let mut counts = WaitingCounts::default();
    for row in &rows {
        let n = u64::try_from(row.get::<i64>("n")?).unwrap_or(0);
        match row.get::<String>("kind")?.as_str() {
            "sleep" => counts.sleep = n,
            "signal" => counts.signal = n,
            "task" => counts.task = n,
            _ => counts.child = n,
        }
    }
    let scheduled = reader
        .opt(
            "SELECT COUNT(*) AS n FROM sagas WHERE status = 'QUEUED' \
             AND scheduled_at IS NOT NULL AND next_run_at > $1",
            &[Arg::Int(now)],
        )
        .await?;
    if let Some(row) = scheduled {
        counts.scheduled = u64::try_from(row.get::<i64>("n")?).unwrap_or(0);
    }
    // Sagas waiting to start, on their index; steps waiting for a token, among the sagas
    // parked on a timer.
    let flow = reader
        .opt(
            "SELECT (SELECT COUNT(*) FROM sagas WHERE gate = 1 AND next_run_at IS NOT NULL \
             AND flow IS NOT NULL) AS limit_n, (SELECT COUNT(*) FROM sagas s \
             JOIN steps st ON st.saga_id = s.id WHERE s.next_run_at IS NOT NULL AND s.gate = 0 \
             AND s.lease_owner IS NULL AND st.waiting_for LIKE 'rate:%') AS rate_n",
            &[],
        )
        .await?;
    if let Some(row) = flow {
        counts.limit = u64::try_from(row.get::<i64>("limit_n")?).unwrap_or(0);
        counts.rate = u64::try_from(row.get::<i64>("rate_n")?).unwrap_or(0);
    }
    Ok(counts)
}

/// A saga's event history, oldest first.
pub(crate) async fn events(reader: Reader<'_>, id: Uuid) -> Result<Vec<Event>> {
    let rows = reader
        .all(
            "SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS seq, at, type, step, \
             data::text AS data FROM events WHERE saga_id = $1 ORDER BY id",
            &[Arg::Id(id)],
        )
        .await?;
    let saga = id.to_string();
    rows.iter().map(|row| event_from_row(row, &saga)).collect()
}

/// A saga's attempt log, in the order attempts started.
pub(crate) async fn attempts(reader: Reader<'_>, id: Uuid) -> Result<Vec<Attempt>> {
    let rows = reader
        .all(
            "SELECT a.step_idx, s.name, a.phase, a.attempt, a.worker, a.lease_epoch, \
             a.started_at, a.ended_at, a.outcome, a.error FROM attempts a \
             JOIN steps s ON s.saga_id = a.saga_id AND s.idx = a.step_idx \
             WHERE a.saga_id = $1 \
             ORDER BY a.seq IS NOT NULL, a.seq, a.started_at, a.step_idx, a.phase, a.attempt",
            &[Arg::Id(id)],
        )
        .await?;
    rows.iter().map(attempt_from_row).collect()
}

/// The orchestrator processes, newest first, with the leases each holds.
pub(crate) async fn workers(reader: Reader<'_>) -> Result<Vec<Worker>> {
    let rows = reader
        .all(
            "SELECT w.id, w.host, w.pid, w.started_at, w.heartbeat_at, w.stopped_at, \
             (SELECT COUNT(*) FROM sagas s WHERE s.lease_owner = w.id) AS leases \
             FROM workers w ORDER BY w.started_at DESC LIMIT 100",
            &[],
        )
        .await?;
    rows.iter().map(worker_from_row).collect()
}
