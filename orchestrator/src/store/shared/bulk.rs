//! Bulk jobs, written once for both databases (see [`crate::store::bulk`] for the protocol).

use uuid::Uuid;

use super::reads::filter_conditions;
use super::sql::{Arg, Reader, Row, Tx};
use super::SqlBackend;
use crate::model::{BulkJob, BulkJobPage, BulkRefusal, ListFilter, Millis};
use crate::store::bulk::MAX_REFUSALS_SHOWN;
use crate::store::rows::{corrupt, parse_enum, parse_ids, LogRow};
use crate::store::{Audit, BulkClaim, BulkTicket, NewBulkJob, Result, StoreError};

/// The condition "the job's lease is still this claim's" (`$1` the job, `$2` the epoch).
const HELD: &str = "EXISTS (SELECT 1 FROM bulk_jobs j WHERE j.id = $1 AND j.lease_epoch = $2 \
                    AND j.status = 'RUNNING')";

/// Settles the item of the command's saga `saga`, if the command is part of a bulk job, in the
/// command's transaction `tx`: `PENDING` → `DONE`, only while the job's lease is the ticket's.
/// [`StoreError::BulkItemSettled`] otherwise, so that the command rolls back having done
/// nothing.
pub(crate) async fn settle_item(tx: &mut Tx, audit: &Audit<'_>, saga: Uuid) -> Result<()> {
    let Some(ticket) = audit.bulk else {
        return Ok(());
    };
    if !settle(tx, ticket, saga, "DONE", None, None).await? {
        return Err(StoreError::BulkItemSettled {
            job: ticket.job,
            saga,
        });
    }
    Ok(())
}

/// `PENDING` → `state` for `saga`'s item, counted in the job's `done`; whether it was pending.
async fn settle(
    tx: &mut Tx,
    ticket: BulkTicket,
    saga: Uuid,
    state: &str,
    code: Option<&str>,
    message: Option<&str>,
) -> Result<bool> {
    let changed = tx
        .exec(
            &format!(
                "UPDATE bulk_items SET state = $4, code = $5, message = $6 \
                 WHERE job_id = $1 AND saga_id = $3 AND state = 'PENDING' AND {HELD}"
            ),
            &[
                Arg::Id(ticket.job),
                Arg::Int(ticket.epoch),
                Arg::Id(saga),
                Arg::Str(state),
                Arg::OptStr(code),
                Arg::OptStr(message),
            ],
        )
        .await?;
    if changed == 0 {
        return Ok(false);
    }
    let now = tx.now().await?;
    tx.exec(
        "UPDATE bulk_jobs SET done = done + 1, updated_at = $2 WHERE id = $1",
        &[Arg::Id(ticket.job), Arg::Int(now)],
    )
    .await?;
    Ok(true)
}

/// Creates the job and its snapshot of matched sagas in one transaction.
pub(crate) async fn create<B: SqlBackend>(store: &B, job: &NewBulkJob<'_>) -> Result<u64> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    tx.exec(
        "INSERT INTO bulk_jobs (id, action, filter, reason, actor, status, matched, done, \
         created_at, updated_at) VALUES ($1, $2, $3::jsonb, $4, $5, 'RUNNING', 0, 0, $6, $6)",
        &[
            Arg::Id(job.id),
            Arg::Str(job.action.as_str()),
            Arg::Json(job.filter_json),
            Arg::Str(job.reason),
            Arg::Str(job.actor),
            Arg::Int(now),
        ],
    )
    .await?;
    let mut sql = "INSERT INTO bulk_items (job_id, saga_id, state) \
                   SELECT $1::uuid, id, 'PENDING' FROM sagas WHERE TRUE"
        .to_owned();
    let mut args = vec![Arg::Id(job.id)];
    filter_conditions(tx.dialect(), job.filter, &mut sql, &mut args);
    let matched = tx.exec(&sql, &args).await?;
    tx.exec(
        "UPDATE bulk_jobs SET matched = $2, \
         status = CASE WHEN $2 = 0 THEN 'DONE' ELSE 'RUNNING' END WHERE id = $1",
        &[Arg::Id(job.id), Arg::Int(to_i64(matched))],
    )
    .await?;
    store.commit(tx).await?;
    Ok(matched)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// How many sagas `filter` matches, and the first `sample` ids in id order.
pub(crate) async fn match_sagas(
    reader: Reader<'_>,
    filter: &ListFilter,
    sample: u32,
) -> Result<(u64, Vec<Uuid>)> {
    let mut sql = "SELECT COUNT(*) AS n FROM sagas WHERE TRUE".to_owned();
    let mut args = Vec::new();
    filter_conditions(reader.dialect(), filter, &mut sql, &mut args);
    let n: i64 = match reader.opt(&sql, &args).await? {
        Some(row) => row.get("n")?,
        None => 0,
    };
    let mut sql = "SELECT id::text AS id FROM sagas WHERE TRUE".to_owned();
    let mut args = Vec::new();
    filter_conditions(reader.dialect(), filter, &mut sql, &mut args);
    args.push(Arg::Int(i64::from(sample)));
    sql.push_str(&format!(" ORDER BY id LIMIT ${}", args.len()));
    let ids = reader
        .all(&sql, &args)
        .await?
        .iter()
        .map(|row| row.get::<String>("id"))
        .collect::<Result<Vec<_>>>()?;
    Ok((to_u64(n), parse_ids(&ids)?))
}

const SELECT_JOB: &str = "SELECT id::text AS id, action, filter::text AS filter, reason, actor, \
     status, matched, done, created_at, updated_at FROM bulk_jobs";

fn job_from_row(row: &Row) -> Result<BulkJob> {
    let id: String = row.get("id")?;
    let filter: String = row.get("filter")?;
    Ok(BulkJob {
        id: Uuid::parse_str(&id).map_err(|e| corrupt(&id, e))?,
        action: parse_enum(&id, &row.get::<String>("action")?)?,
        status: parse_enum(&id, &row.get::<String>("status")?)?,
        matched: to_u64(row.get("matched")?),
        done: to_u64(row.get("done")?),
        refused: Vec::new(),
        filter: serde_json::from_str(&filter).map_err(|e| corrupt(&id, e))?,
        reason: row.get("reason")?,
        actor: row.get("actor")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
    })
}

/// A job with its first refusals, from one snapshot.
pub(crate) async fn get(reader: Reader<'_>, id: Uuid) -> Result<Option<BulkJob>> {
    let mut tx = reader.snapshot().await?;
    let Some(row) = tx
        .opt(&format!("{SELECT_JOB} WHERE id = $1"), &[Arg::Id(id)])
        .await?
    else {
        tx.commit().await?;
        return Ok(None);
    };
    let mut job = job_from_row(&row)?;
    let rows = tx
        .all(
            "SELECT saga_id::text AS saga_id, code, message FROM bulk_items \
             WHERE job_id = $1 AND state = 'REFUSED' ORDER BY saga_id LIMIT $2",
            &[Arg::Id(id), Arg::Int(i64::from(MAX_REFUSALS_SHOWN))],
        )
        .await?;
    tx.commit().await?;
    for row in &rows {
        let saga: String = row.get("saga_id")?;
        job.refused.push(BulkRefusal {
            saga_id: Uuid::parse_str(&saga).map_err(|e| corrupt(&saga, e))?,
            code: row.get::<Option<String>>("code")?.unwrap_or_default(),
            message: row.get::<Option<String>>("message")?.unwrap_or_default(),
        });
    }
    Ok(Some(job))
}

/// A page of jobs, newest first.
pub(crate) async fn list(
    reader: Reader<'_>,
    limit: u32,
    cursor: Option<Uuid>,
) -> Result<BulkJobPage> {
    let limit = limit.clamp(1, 1000);
    let rows = match cursor {
        Some(cursor) => {
            reader
                .all(
                    &format!("{SELECT_JOB} WHERE id < $1 ORDER BY id DESC LIMIT $2"),
                    &[Arg::Id(cursor), Arg::Int(i64::from(limit) + 1)],
                )
                .await?
        }
        None => {
            reader
                .all(
                    &format!("{SELECT_JOB} ORDER BY id DESC LIMIT $1"),
                    &[Arg::Int(i64::from(limit) + 1)],
                )
                .await?
        }
    };
    let mut jobs = rows.iter().map(job_from_row).collect::<Result<Vec<_>>>()?;
    let next_cursor = if jobs.len() > limit as usize {
        jobs.truncate(limit as usize);
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    Ok(BulkJobPage { jobs, next_cursor })
}

/// Claims the oldest running job nobody holds, or whose lease expired.
pub(crate) async fn claim<B: SqlBackend>(
    store: &B,
    owner: &str,
    ttl_ms: Millis,
) -> Result<Option<BulkClaim>> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let free = "status = 'RUNNING' AND (lease_owner IS NULL OR lease_expires_at < $1)";
    let found = tx
        .opt(
            &format!(
                "SELECT id::text AS id FROM bulk_jobs WHERE {free} ORDER BY id LIMIT 1{}",
                tx.dialect().skip_locked("bulk_jobs")
            ),
            &[Arg::Int(now)],
        )
        .await?;
    let Some(found) = found else {
        store.commit(tx).await?;
        return Ok(None);
    };
    let id: String = found.get("id")?;
    let id = Uuid::parse_str(&id).map_err(|e| corrupt(&id, e))?;
    let row = tx
        .opt(
            &format!(
                "UPDATE bulk_jobs SET lease_owner = $3, lease_expires_at = $4, \
                 lease_epoch = lease_epoch + 1 WHERE id = $2 AND {free} \
                 RETURNING lease_epoch, action, reason, actor"
            ),
            &[
                Arg::Int(now),
                Arg::Id(id),
                Arg::Str(owner),
                Arg::Int(now.saturating_add(ttl_ms)),
            ],
        )
        .await?;
    store.commit(tx).await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let job = id.to_string();
    Ok(Some(BulkClaim {
        ticket: BulkTicket {
            job: id,
            epoch: row.get("lease_epoch")?,
        },
        action: parse_enum(&job, &row.get::<String>("action")?)?,
        reason: row.get("reason")?,
        actor: row.get("actor")?,
    }))
}

/// Renews the claim's lease and reads its next pending sagas.
pub(crate) async fn pending<B: SqlBackend>(
    store: &B,
    ticket: BulkTicket,
    ttl_ms: Millis,
    limit: u32,
) -> Result<Vec<Uuid>> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let renewed = tx
        .exec(
            "UPDATE bulk_jobs SET lease_expires_at = $3 \
             WHERE id = $1 AND lease_epoch = $2 AND status = 'RUNNING'",
            &[
                Arg::Id(ticket.job),
                Arg::Int(ticket.epoch),
                Arg::Int(now.saturating_add(ttl_ms)),
            ],
        )
        .await?;
    if renewed == 0 {
        return Err(StoreError::BulkJobLost(ticket.job));
    }
    let rows = tx
        .all(
            "SELECT saga_id::text AS saga_id FROM bulk_items \
             WHERE job_id = $1 AND state = 'PENDING' ORDER BY saga_id LIMIT $2",
            &[Arg::Id(ticket.job), Arg::Int(i64::from(limit))],
        )
        .await?;
    store.commit(tx).await?;
    let ids = rows
        .iter()
        .map(|row| row.get::<String>("saga_id"))
        .collect::<Result<Vec<_>>>()?;
    parse_ids(&ids)
}

/// Settles an item outside a command (done with nothing changed, or refused).
pub(crate) async fn settle_alone<B: SqlBackend>(
    store: &B,
    ticket: BulkTicket,
    saga: Uuid,
    refusal: Option<(&str, &str)>,
) -> Result<()> {
    let mut tx = store.begin().await?;
    let state = if refusal.is_some() { "REFUSED" } else { "DONE" };
    settle(
        &mut tx,
        ticket,
        saga,
        state,
        refusal.map(|r| r.0),
        refusal.map(|r| r.1),
    )
    .await?;
    store.commit(tx).await?;
    Ok(())
}

/// `DONE` once nothing is pending, the lease released.
pub(crate) async fn finish<B: SqlBackend>(store: &B, ticket: BulkTicket) -> Result<bool> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let changed = tx
        .exec(
            "UPDATE bulk_jobs SET status = 'DONE', lease_owner = NULL, lease_expires_at = NULL, \
             updated_at = $3 WHERE id = $1 AND lease_epoch = $2 AND status = 'RUNNING' \
             AND NOT EXISTS (SELECT 1 FROM bulk_items i \
                             WHERE i.job_id = $1 AND i.state = 'PENDING')",
            &[Arg::Id(ticket.job), Arg::Int(ticket.epoch), Arg::Int(now)],
        )
        .await?;
    store.commit(tx).await?;
    Ok(changed == 1)
}
