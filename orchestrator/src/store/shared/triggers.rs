//! The refusals of NATS triggers, the same statements on both databases.

use super::sql::{Arg, Row};
use super::SqlBackend;
use crate::model::rfc3339;
use crate::store::rows::LogRow;
use crate::store::triggers::{excerpt, NewRefusal, RefusalCount, TriggerRefusal};
use crate::store::Result;

/// As [`TriggerLog::record_trigger_refusal`](crate::store::triggers::TriggerLog::record_trigger_refusal).
pub(crate) async fn record<B: SqlBackend>(store: &B, refusal: &NewRefusal<'_>) -> Result<bool> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let body = excerpt(refusal.body);
    let seq = i64::try_from(refusal.stream_seq).unwrap_or(i64::MAX);
    let bytes = i64::try_from(refusal.body.len()).unwrap_or(i64::MAX);
    let inserted = tx
        .exec(
            "INSERT INTO trigger_refusals (trigger_name, stream, stream_seq, subject, error, \
             body_excerpt, body_bytes, refused_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (trigger_name, stream, stream_seq) DO NOTHING",
            &[
                Arg::Str(refusal.trigger),
                Arg::Str(refusal.stream),
                Arg::Int(seq),
                Arg::Str(refusal.subject),
                Arg::Str(refusal.error),
                Arg::Str(&body),
                Arg::Int(bytes),
                Arg::Int(now),
            ],
        )
        .await?;
    store.commit(tx).await?;
    Ok(inserted > 0)
}

/// As [`TriggerLog::trigger_refusals`](crate::store::triggers::TriggerLog::trigger_refusals).
pub(crate) async fn refusals<B: SqlBackend>(
    store: &B,
    trigger: Option<&str>,
    limit: u32,
) -> Result<Vec<TriggerRefusal>> {
    let rows = store
        .reader()
        .all(
            "SELECT trigger_name, stream, stream_seq, subject, error, body_excerpt, body_bytes, \
             refused_at FROM trigger_refusals WHERE ($1::text IS NULL OR trigger_name = $1::text) \
             ORDER BY refused_at DESC, id DESC LIMIT $2",
            &[Arg::OptStr(trigger), Arg::Int(i64::from(limit))],
        )
        .await?;
    rows.iter().map(refusal_of).collect()
}

fn refusal_of(row: &Row) -> Result<TriggerRefusal> {
    Ok(TriggerRefusal {
        trigger: row.get("trigger_name")?,
        stream: row.get("stream")?,
        stream_seq: row.get("stream_seq")?,
        subject: row.get("subject")?,
        error: row.get("error")?,
        body_excerpt: row.get("body_excerpt")?,
        body_bytes: row.get("body_bytes")?,
        refused_at: rfc3339(row.get("refused_at")?),
    })
}

/// As [`TriggerLog::trigger_refusal_counts`](crate::store::triggers::TriggerLog::trigger_refusal_counts).
pub(crate) async fn counts<B: SqlBackend>(store: &B) -> Result<Vec<RefusalCount>> {
    let rows = store
        .reader()
        .all(
            "SELECT trigger_name, COUNT(*) AS refused FROM trigger_refusals \
             GROUP BY trigger_name ORDER BY trigger_name",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(RefusalCount {
                trigger: row.get("trigger_name")?,
                refused: row.get("refused")?,
            })
        })
        .collect()
}
