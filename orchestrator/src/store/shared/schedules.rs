//! Schedules, written once for both databases (see [`crate::store::schedules`]).

use std::time::Duration;

use uuid::Uuid;

use super::sql::{Arg, Reader, Row, Tx};
use super::SqlBackend;
use crate::model::{Millis, NewScheduleRun, Overlap, RunOutcome, Schedule, ScheduleRun, RUNS_KEPT};
use crate::store::rows::{corrupt, parse_json, LogRow};
use crate::store::schedules::{ScheduleAdvance, ScheduleCursor};
use crate::store::Result;

const COLUMNS: &str = "id, saga, cron, every_ms, timezone, input::text AS input, overlap, \
     catchup_window_ms, paused, next_fire_at, buffered_at, last_saga_id::text AS last_saga_id, \
     created_at, updated_at";

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn to_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn uuid_of(what: &str, text: Option<String>) -> Result<Option<Uuid>> {
    text.map(|t| Uuid::parse_str(&t).map_err(|e| corrupt(what, e)))
        .transpose()
}

fn schedule(row: &Row) -> Result<Schedule> {
    let id: String = row.get("id")?;
    let overlap: String = row.get("overlap")?;
    let every: Option<i64> = row.get("every_ms")?;
    let input = parse_json(&id, Some(row.get("input")?))?.unwrap_or_default();
    Ok(Schedule {
        saga: row.get("saga")?,
        cron: row.get("cron")?,
        every: every.map(millis),
        timezone: row.get("timezone")?,
        input,
        overlap: Overlap::parse(&overlap)
            .ok_or_else(|| corrupt(&id, format!("unknown overlap policy {overlap:?}")))?,
        catchup_window: millis(row.get("catchup_window_ms")?),
        paused: row.get("paused")?,
        next_fire_at: row.get("next_fire_at")?,
        buffered_at: row.get("buffered_at")?,
        last_saga_id: uuid_of(&id, row.get("last_saga_id")?)?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        id,
    })
}

fn run(row: &Row) -> Result<ScheduleRun> {
    let outcome: String = row.get("outcome")?;
    let id: String = row.get("schedule_id")?;
    Ok(ScheduleRun {
        scheduled_at: row.get("scheduled_at")?,
        outcome: RunOutcome::parse(&outcome)
            .ok_or_else(|| corrupt(&id, format!("unknown run outcome {outcome:?}")))?,
        saga_id: uuid_of(&id, row.get("saga_id")?)?,
        triggered: row.get("triggered")?,
        detail: row.get("detail")?,
        recorded_at: row.get("recorded_at")?,
    })
}

/// Records a new schedule (see [`ScheduleLog::create_schedule`](crate::store::ScheduleLog::create_schedule)).
pub(crate) async fn create<B: SqlBackend>(store: &B, s: &Schedule) -> Result<bool> {
    let mut tx = store.begin().await?;
    let paused = if s.paused { "TRUE" } else { "FALSE" };
    let inserted = tx
        .exec(
            &format!(
                "INSERT INTO schedules (id, saga, cron, every_ms, timezone, input, overlap, \
                 catchup_window_ms, paused, next_fire_at, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, {paused}, $9, $10, $10) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            &[
                Arg::Str(&s.id),
                Arg::Str(&s.saga),
                Arg::OptStr(s.cron.as_deref()),
                Arg::OptInt(s.every.map(to_ms)),
                Arg::Str(&s.timezone),
                Arg::Json(&s.input),
                Arg::Str(s.overlap.as_str()),
                Arg::Int(to_ms(s.catchup_window)),
                Arg::Int(s.next_fire_at),
                Arg::Int(s.created_at),
            ],
        )
        .await?;
    store.commit(tx).await?;
    Ok(inserted == 1)
}

/// Every schedule, by id.
pub(crate) async fn list(reader: Reader<'_>) -> Result<Vec<Schedule>> {
    reader
        .all(&format!("SELECT {COLUMNS} FROM schedules ORDER BY id"), &[])
        .await?
        .iter()
        .map(schedule)
        .collect()
}

/// The schedule `id`.
pub(crate) async fn get(reader: Reader<'_>, id: &str) -> Result<Option<Schedule>> {
    reader
        .opt(
            &format!("SELECT {COLUMNS} FROM schedules WHERE id = $1"),
            &[Arg::Str(id)],
        )
        .await?
        .as_ref()
        .map(schedule)
        .transpose()
}

/// Its `limit` latest runs, latest first.
pub(crate) async fn runs(reader: Reader<'_>, id: &str, limit: u32) -> Result<Vec<ScheduleRun>> {
    reader
        .all(
            "SELECT schedule_id, scheduled_at, outcome, saga_id::text AS saga_id, triggered, \
             detail, recorded_at FROM schedule_runs WHERE schedule_id = $1 \
             ORDER BY scheduled_at DESC LIMIT $2",
            &[Arg::Str(id), Arg::Int(i64::from(limit))],
        )
        .await?
        .iter()
        .map(run)
        .collect()
}

/// Deletes a schedule and its runs.
pub(crate) async fn delete<B: SqlBackend>(store: &B, id: &str) -> Result<bool> {
    let mut tx = store.begin().await?;
    tx.exec(
        "DELETE FROM schedule_runs WHERE schedule_id = $1",
        &[Arg::Str(id)],
    )
    .await?;
    let deleted = tx
        .exec("DELETE FROM schedules WHERE id = $1", &[Arg::Str(id)])
        .await?;
    store.commit(tx).await?;
    Ok(deleted == 1)
}

/// Pauses or resumes a schedule.
pub(crate) async fn set_paused<B: SqlBackend>(
    store: &B,
    id: &str,
    paused: bool,
    next_fire_at: Option<Millis>,
    now: Millis,
) -> Result<Option<Schedule>> {
    let mut tx = store.begin().await?;
    let flag = if paused { "TRUE" } else { "FALSE" };
    let row = tx
        .opt(
            &format!(
                "UPDATE schedules SET paused = {flag}, \
                 next_fire_at = COALESCE($2, next_fire_at), updated_at = $3 \
                 WHERE id = $1 RETURNING {COLUMNS}"
            ),
            &[Arg::Str(id), Arg::OptInt(next_fire_at), Arg::Int(now)],
        )
        .await?;
    let schedule = row.as_ref().map(schedule).transpose()?;
    store.commit(tx).await?;
    Ok(schedule)
}

/// Leases the due schedules to `owner`.
pub(crate) async fn claim<B: SqlBackend>(
    store: &B,
    owner: &str,
    now: Millis,
    ttl_ms: i64,
    limit: u32,
) -> Result<Vec<Schedule>> {
    let mut tx = store.begin().await?;
    let lock = tx.dialect().skip_locked("schedules");
    // A buffered tick is due once the run before it has ended (its saga terminal, or gone).
    let rows = tx
        .all(
            &format!(
                "UPDATE schedules SET lease_owner = $1, lease_expires_at = $2 + $3 \
                 WHERE id IN (SELECT id FROM schedules WHERE NOT paused \
                   AND (lease_expires_at IS NULL OR lease_expires_at < $2 OR lease_owner = $1) \
                   AND (next_fire_at <= $2 OR (buffered_at IS NOT NULL AND NOT EXISTS \
                     (SELECT 1 FROM sagas s WHERE s.id = schedules.last_saga_id \
                      AND s.status IN ('QUEUED', 'RUNNING', 'COMPENSATING', 'PAUSED')))) \
                   ORDER BY next_fire_at LIMIT $4{lock}) \
                 RETURNING {COLUMNS}"
            ),
            &[
                Arg::Str(owner),
                Arg::Int(now),
                Arg::Int(ttl_ms),
                Arg::Int(i64::from(limit)),
            ],
        )
        .await?;
    let claimed = rows.iter().map(schedule).collect::<Result<Vec<_>>>()?;
    store.commit(tx).await?;
    Ok(claimed)
}

/// Inserts `runs` and trims the schedule's history to the latest [`RUNS_KEPT`].
async fn record(tx: &mut Tx, id: &str, runs: &[NewScheduleRun], now: Millis) -> Result<()> {
    for r in runs {
        let saga = r.saga_id.map(|u| u.to_string());
        let triggered = if r.triggered { "TRUE" } else { "FALSE" };
        tx.exec(
            &format!(
                "INSERT INTO schedule_runs (schedule_id, scheduled_at, outcome, saga_id, \
                 triggered, detail, recorded_at) VALUES ($1, $2, $3, $4::uuid, {triggered}, $5, $6) \
                 ON CONFLICT (schedule_id, scheduled_at) DO UPDATE SET outcome = excluded.outcome, \
                 saga_id = excluded.saga_id, detail = excluded.detail, \
                 recorded_at = excluded.recorded_at"
            ),
            &[
                Arg::Str(id),
                Arg::Int(r.scheduled_at),
                Arg::Str(r.outcome.as_str()),
                Arg::OptStr(saga.as_deref()),
                Arg::OptStr(r.detail.as_deref()),
                Arg::Int(now),
            ],
        )
        .await?;
    }
    if !runs.is_empty() {
        tx.exec(
            "DELETE FROM schedule_runs WHERE schedule_id = $1 AND scheduled_at < \
             (SELECT scheduled_at FROM schedule_runs WHERE schedule_id = $1 \
              ORDER BY scheduled_at DESC LIMIT 1 OFFSET $2)",
            &[
                Arg::Str(id),
                Arg::Int(i64::try_from(RUNS_KEPT).unwrap_or(100) - 1),
            ],
        )
        .await?;
    }
    Ok(())
}

/// Advances a schedule past fired ticks (see
/// [`ScheduleLog::advance_schedule`](crate::store::ScheduleLog::advance_schedule)).
pub(crate) async fn advance<B: SqlBackend>(
    store: &B,
    id: &str,
    owner: &str,
    from: ScheduleCursor,
    to: &ScheduleAdvance,
    runs: &[NewScheduleRun],
    now: Millis,
) -> Result<bool> {
    let mut tx = store.begin().await?;
    let last = to.last_saga_id.map(|u| u.to_string());
    let moved = tx
        .exec(
            "UPDATE schedules SET next_fire_at = $4, buffered_at = $5, \
             last_saga_id = COALESCE($6::uuid, last_saga_id), updated_at = $7 \
             WHERE id = $1 AND lease_owner = $2 AND next_fire_at = $3 \
             AND COALESCE(buffered_at, -1) = $8",
            &[
                Arg::Str(id),
                Arg::Str(owner),
                Arg::Int(from.next_fire_at),
                Arg::Int(to.next_fire_at),
                Arg::OptInt(to.buffered_at),
                Arg::OptStr(last.as_deref()),
                Arg::Int(now),
                Arg::Int(from.buffered_at.unwrap_or(-1)),
            ],
        )
        .await?;
    if moved == 0 {
        return Ok(false);
    }
    record(&mut tx, id, runs, now).await?;
    store.commit(tx).await?;
    Ok(true)
}

/// Records a trigger's runs (see
/// [`ScheduleLog::record_schedule_runs`](crate::store::ScheduleLog::record_schedule_runs)).
pub(crate) async fn record_runs<B: SqlBackend>(
    store: &B,
    id: &str,
    expect: Option<(ScheduleCursor, Option<Uuid>)>,
    runs: &[NewScheduleRun],
    last_saga_id: Option<Uuid>,
    buffer: Option<Millis>,
    now: Millis,
) -> Result<bool> {
    let mut tx = store.begin().await?;
    let last = last_saga_id.map(|u| u.to_string());
    let mut sql = "UPDATE schedules SET last_saga_id = COALESCE($2::uuid, last_saga_id), \
                   buffered_at = COALESCE(buffered_at, $3), updated_at = $4 WHERE id = $1"
        .to_owned();
    let (cursor, previous) = expect.unwrap_or((
        ScheduleCursor {
            next_fire_at: 0,
            buffered_at: None,
        },
        None,
    ));
    let previous = previous.map(|u| u.to_string()).unwrap_or_default();
    if expect.is_some() {
        sql.push_str(
            " AND next_fire_at = $5 AND COALESCE(buffered_at, -1) = $6 \
             AND COALESCE(last_saga_id::text, '') = $7 \
             AND (lease_owner IS NULL OR lease_expires_at < $4)",
        );
    }
    let mut args = vec![
        Arg::Str(id),
        Arg::OptStr(last.as_deref()),
        Arg::OptInt(buffer),
        Arg::Int(now),
    ];
    if expect.is_some() {
        args.extend([
            Arg::Int(cursor.next_fire_at),
            Arg::Int(cursor.buffered_at.unwrap_or(-1)),
            Arg::Str(&previous),
        ]);
    }
    let found = tx.exec(&sql, &args).await?;
    if found == 0 {
        return Ok(false);
    }
    record(&mut tx, id, runs, now).await?;
    store.commit(tx).await?;
    Ok(true)
}

/// Gives up a lease.
pub(crate) async fn release<B: SqlBackend>(store: &B, id: &str, owner: &str) -> Result<()> {
    let mut tx = store.begin().await?;
    tx.exec(
        "UPDATE schedules SET lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = $1 AND lease_owner = $2",
        &[Arg::Str(id), Arg::Str(owner)],
    )
    .await?;
    store.commit(tx).await
}

/// The earliest next tick of a schedule not paused.
pub(crate) async fn earliest(reader: Reader<'_>) -> Result<Option<Millis>> {
    let row = reader
        .opt(
            "SELECT MIN(next_fire_at) AS at FROM schedules WHERE NOT paused",
            &[],
        )
        .await?;
    match row {
        Some(row) => row.get("at"),
        None => Ok(None),
    }
}
