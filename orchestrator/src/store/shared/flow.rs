//! Limits and rate limiters, written once for both databases (see [`crate::store::flow`]).

use saga_dsl::{DeclaredLimit, Rate};
use serde_json::json;

use super::sql::{Arg, Reader, Row, Tx};
use super::SqlBackend;
use crate::model::{DeclaredValue, LimitChange, LimitInfo, LimitKind, Millis};
use crate::store::flow::TokenGrant;
use crate::store::rows::{parse_enum, LogRow};
use crate::store::{Audit, Result, StoreError};

/// A limit's values as the table keeps them (current or declared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Values {
    limit: Option<i64>,
    rate_count: Option<i64>,
    rate_period_ms: Option<i64>,
    burst: Option<i64>,
}

impl Values {
    fn of(limit: &DeclaredLimit) -> Self {
        match limit {
            DeclaredLimit::MaxRunning { limit, .. } => Self {
                limit: Some(i64::from(limit.limit)),
                ..Self::default()
            },
            DeclaredLimit::PerKey { limit, .. } => Self {
                limit: Some(i64::from(limit.limit)),
                ..Self::default()
            },
            DeclaredLimit::Rate(r) => Self::rate(r.rate, r.burst),
        }
    }

    fn rate(rate: Rate, burst: u32) -> Self {
        Self {
            limit: None,
            rate_count: Some(i64::from(rate.count())),
            rate_period_ms: Some(i64::try_from(rate.per().as_millis()).unwrap_or(i64::MAX)),
            burst: Some(i64::from(burst)),
        }
    }

    fn read(row: &Row, prefix: &str) -> Result<Self> {
        Ok(Self {
            limit: row.get(&format!("{prefix}limit{}", suffix(prefix)))?,
            rate_count: row.get(&format!("{prefix}rate_count"))?,
            rate_period_ms: row.get(&format!("{prefix}rate_period_ms"))?,
            burst: row.get(&format!("{prefix}burst"))?,
        })
    }

    /// The rate as written (`20/s`).
    fn rate_text(&self) -> Option<String> {
        let (count, per) = (self.rate_count?, self.rate_period_ms?);
        let count = u32::try_from(count).ok()?;
        Some(
            match per {
                60_000 => Rate::per_minute(count),
                3_600_000 => Rate::per_hour(count),
                _ => Rate::per_second(count),
            }
            .to_string(),
        )
    }

    /// The spacing of two tokens, in microseconds.
    fn interval_us(&self) -> Option<i64> {
        Some(self.rate_period_ms? * 1000 / self.rate_count?.max(1))
    }

    fn json(&self) -> serde_json::Value {
        json!({"limit": self.limit, "rate": self.rate_text(), "burst": self.burst})
    }
}

/// The current value's column is `limit_value`, the declared one's `declared_limit`.
fn suffix(prefix: &str) -> &'static str {
    if prefix.is_empty() {
        "_value"
    } else {
        ""
    }
}

fn kind_of(limit: &DeclaredLimit) -> LimitKind {
    match limit {
        DeclaredLimit::MaxRunning { .. } => LimitKind::MaxRunning,
        DeclaredLimit::PerKey { .. } => LimitKind::PerKey,
        DeclaredLimit::Rate(_) => LimitKind::Rate,
    }
}

/// Writes the declared limits in one transaction (see
/// [`FlowLog::declare_limits`](crate::store::flow::FlowLog::declare_limits)).
pub(crate) async fn declare<B: SqlBackend>(
    store: &B,
    limits: &[DeclaredLimit],
    sagas: &[String],
) -> Result<()> {
    let mut tx = store.begin().await?;
    // A concurrency limit a definition here no longer declares is gone (a rate limiter may be
    // another definition's too, and stays).
    let names: Vec<String> = limits.iter().map(|l| l.name().to_owned()).collect();
    tx.exec(
        "DELETE FROM flow_limits WHERE kind <> 'rate' AND saga = ANY($1) \
         AND NOT (name = ANY($2))",
        &[Arg::Strs(sagas), Arg::Strs(&names)],
    )
    .await?;
    for limit in limits {
        let v = Values::of(limit);
        let (saga, key) = match limit {
            DeclaredLimit::MaxRunning { saga, .. } => (Some(saga.as_str()), None),
            DeclaredLimit::PerKey { saga, limit } => {
                (Some(saga.as_str()), Some(limit.key.as_str()))
            }
            DeclaredLimit::Rate(_) => (None, None),
        };
        let kind = kind_of(limit).as_str();
        // A new limit takes the declared value; so does one no operator changed, or one whose
        // kind changed in code (an operator's value of the old kind means nothing now).
        tx.exec(
            "INSERT INTO flow_limits (name, kind, saga, key_field, limit_value, rate_count, \
             rate_period_ms, burst, declared_limit, declared_rate_count, \
             declared_rate_period_ms, declared_burst) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $5, $6, $7, $8) \
             ON CONFLICT (name) DO UPDATE SET saga = excluded.saga, \
             key_field = excluded.key_field, declared_limit = excluded.declared_limit, \
             declared_rate_count = excluded.declared_rate_count, \
             declared_rate_period_ms = excluded.declared_rate_period_ms, \
             declared_burst = excluded.declared_burst, \
             limit_value = CASE WHEN flow_limits.updated_at IS NULL \
                 OR flow_limits.kind <> excluded.kind THEN excluded.limit_value \
                 ELSE flow_limits.limit_value END, \
             rate_count = CASE WHEN flow_limits.updated_at IS NULL \
                 OR flow_limits.kind <> excluded.kind THEN excluded.rate_count \
                 ELSE flow_limits.rate_count END, \
             rate_period_ms = CASE WHEN flow_limits.updated_at IS NULL \
                 OR flow_limits.kind <> excluded.kind THEN excluded.rate_period_ms \
                 ELSE flow_limits.rate_period_ms END, \
             burst = CASE WHEN flow_limits.updated_at IS NULL \
                 OR flow_limits.kind <> excluded.kind THEN excluded.burst \
                 ELSE flow_limits.burst END, \
             updated_at = CASE WHEN flow_limits.kind <> excluded.kind THEN NULL \
                 ELSE flow_limits.updated_at END, \
             kind = excluded.kind",
            &[
                Arg::Str(limit.name()),
                Arg::Str(kind),
                Arg::OptStr(saga),
                Arg::OptStr(key),
                Arg::OptInt(v.limit),
                Arg::OptInt(v.rate_count),
                Arg::OptInt(v.rate_period_ms),
                Arg::OptInt(v.burst),
            ],
        )
        .await?;
    }
    // A limit raised in code may let waiting sagas start.
    tx.announce_due().await?;
    store.commit(tx).await
}

const SELECT_LIMITS: &str = concat!(
    "SELECT l.name, l.kind, l.saga, l.key_field, l.limit_value, l.rate_count, \
     l.rate_period_ms, l.burst, l.declared_limit, l.declared_rate_count, \
     l.declared_rate_period_ms, l.declared_burst, l.tat_us, l.updated_at, l.updated_by, \
     CASE WHEN l.kind = 'rate' THEN 0 ELSE (SELECT COUNT(*) FROM sagas s WHERE s.flow = l.saga \
         AND s.gate = 0 AND s.status IN ",
    "('QUEUED', 'RUNNING', 'COMPENSATING', 'PAUSED')",
    " AND (l.kind = 'max_running' OR s.flow_key IS NOT NULL)) END AS in_use, \
     CASE WHEN l.kind = 'rate' THEN (SELECT COUNT(*) FROM sagas s JOIN steps st \
         ON st.saga_id = s.id WHERE s.next_run_at IS NOT NULL AND s.gate = 0 \
         AND s.lease_owner IS NULL AND st.waiting_for = 'rate:' || l.name) \
     ELSE (SELECT COUNT(*) FROM sagas s WHERE s.flow = l.saga AND s.gate = 1 \
         AND s.next_run_at IS NOT NULL) END AS waiting \
     FROM flow_limits l"
);

fn to_u32(n: Option<i64>) -> Option<u32> {
    n.and_then(|n| u32::try_from(n).ok())
}

fn info(row: &Row, now: Millis) -> Result<LimitInfo> {
    let name: String = row.get("name")?;
    let kind: String = row.get("kind")?;
    let kind: LimitKind = parse_enum(&name, &kind)?;
    let current = Values::read(row, "")?;
    let declared = Values::read(row, "declared_")?;
    let tat: i64 = row.get("tat_us")?;
    let in_use = match (kind, current.interval_us(), current.burst) {
        // Tokens taken and not yet refilled, at most the bucket's size.
        (LimitKind::Rate, Some(interval), Some(burst)) => {
            let ahead = (tat - now * 1000).max(0);
            (ahead + interval - 1) / interval.max(1)
        }
        .min(burst),
        _ => row.get("in_use")?,
    };
    Ok(LimitInfo {
        name,
        kind,
        saga: row.get("saga")?,
        key: row.get("key_field")?,
        limit: to_u32(current.limit),
        rate: current.rate_text(),
        burst: to_u32(current.burst),
        in_use: u64::try_from(in_use).unwrap_or(0),
        waiting: u64::try_from(row.get::<i64>("waiting")?).unwrap_or(0),
        declared: DeclaredValue {
            limit: to_u32(declared.limit),
            rate: declared.rate_text(),
            burst: to_u32(declared.burst),
        },
        updated_at: row.get("updated_at")?,
        updated_by: row.get("updated_by")?,
    })
}

/// Every limit, by name.
pub(crate) async fn list(reader: Reader<'_>, now: Millis) -> Result<Vec<LimitInfo>> {
    let rows = reader
        .all(&format!("{SELECT_LIMITS} ORDER BY l.name"), &[])
        .await?;
    rows.iter().map(|row| info(row, now)).collect()
}

/// Changes one limit, audited (see
/// [`FlowLog::set_limit`](crate::store::flow::FlowLog::set_limit)).
pub(crate) async fn set<B: SqlBackend>(
    store: &B,
    name: &str,
    change: &LimitChange,
    audit: Audit<'_>,
) -> Result<LimitInfo> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let Some(row) = tx
        .opt(
            &format!("{SELECT_LIMITS} WHERE l.name = $1"),
            &[Arg::Str(name)],
        )
        .await?
    else {
        tx.commit().await?;
        return Err(StoreError::UnknownLimit(name.to_owned()));
    };
    let old = info(&row, now)?;
    let before = Values::read(&row, "")?;
    let after = match (old.kind, change) {
        (LimitKind::Rate, LimitChange::Rate { rate, burst }) => Values::rate(*rate, *burst),
        (LimitKind::MaxRunning | LimitKind::PerKey, LimitChange::Limit(limit)) => Values {
            limit: Some(i64::from(*limit)),
            ..Values::default()
        },
        (LimitKind::Rate, LimitChange::Limit(_)) => {
            tx.commit().await?;
            return Err(StoreError::InvalidValue(format!(
                "{name} is a rate limiter: give it a \"rate\" (and a \"burst\"), not a \"limit\""
            )));
        }
        (_, LimitChange::Rate { .. }) => {
            tx.commit().await?;
            return Err(StoreError::InvalidValue(format!(
                "{name} is a concurrency limit ({}): give it a \"limit\", not a \"rate\"",
                old.kind
            )));
        }
    };
    if let (Some(old_us), Some(new_us)) = (before.interval_us(), after.interval_us()) {
        rescale_waits(&mut tx, name, now, old_us, new_us).await?;
    }
    tx.exec(
        "UPDATE flow_limits SET limit_value = $2, rate_count = $3, rate_period_ms = $4, \
         burst = $5, updated_at = $6, updated_by = $7 WHERE name = $1",
        &[
            Arg::Str(name),
            Arg::OptInt(after.limit),
            Arg::OptInt(after.rate_count),
            Arg::OptInt(after.rate_period_ms),
            Arg::OptInt(after.burst),
            Arg::Int(now),
            Arg::OptStr(audit.actor),
        ],
    )
    .await?;
    let (old_json, new_json) = (before.json(), after.json());
    tx.exec(
        "INSERT INTO limit_changes (name, at, actor, reason, old, new) \
         VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)",
        &[
            Arg::Str(name),
            Arg::Int(now),
            Arg::OptStr(audit.actor),
            Arg::OptStr(audit.reason),
            Arg::Json(&old_json),
            Arg::Json(&new_json),
        ],
    )
    .await?;
    // Engines look again at once: a raised limit has room for waiting sagas.
    tx.announce_due().await?;
    let row = tx
        .opt(
            &format!("{SELECT_LIMITS} WHERE l.name = $1"),
            &[Arg::Str(name)],
        )
        .await?;
    store.commit(tx).await?;
    match row {
        Some(row) => info(&row, now),
        None => Err(StoreError::UnknownLimit(name.to_owned())),
    }
}

/// A rate limiter's new spacing applied to what it has promised already: the bucket's
/// reservations ahead of now, and the calls parked until their reserved moment, are spread
/// at the new rate from now (sooner for a raised rate, later for a lowered one).
async fn rescale_waits(
    tx: &mut Tx,
    name: &str,
    now: Millis,
    old_us: i64,
    new_us: i64,
) -> Result<()> {
    if old_us == new_us || old_us <= 0 {
        return Ok(());
    }
    let now_us = now * 1000;
    tx.exec(
        "UPDATE flow_limits SET tat_us = $2 + (tat_us - $2) / $4 * $3 \
         WHERE name = $1 AND tat_us > $2",
        &[
            Arg::Str(name),
            Arg::Int(now_us),
            Arg::Int(new_us),
            Arg::Int(old_us),
        ],
    )
    .await?;
    // The calls parked for a token are among the sagas parked on a timer (the due-time
    // index's future).
    let wait = format!("{}{name}", crate::model::RATE_WAIT);
    let parked = "SELECT st.saga_id FROM sagas s JOIN steps st ON st.saga_id = s.id \
         WHERE s.next_run_at IS NOT NULL AND s.gate = 0 AND s.next_run_at > $2 \
         AND s.lease_owner IS NULL AND st.waiting_for = $1";
    let args = [
        Arg::Str(&wait),
        Arg::Int(now),
        Arg::Int(new_us),
        Arg::Int(old_us),
    ];
    tx.exec(
        &format!(
            "UPDATE steps SET retry_at = $2 + (retry_at - $2) * $3 / $4 \
             WHERE saga_id IN ({parked}) AND waiting_for = $1 AND retry_at > $2"
        ),
        &args,
    )
    .await?;
    tx.exec(
        &format!(
            "UPDATE sagas SET next_run_at = $2 + (next_run_at - $2) * $3 / $4 \
             WHERE id IN ({parked})"
        ),
        &args,
    )
    .await?;
    Ok(())
}

/// Reserves the next token of the limiter `name` (see
/// [`FlowLog::take_token`](crate::store::flow::FlowLog::take_token)): the generic cell rate
/// algorithm, whose one number per limiter, the theoretical arrival time, moves by one
/// spacing per call from whichever is later, itself or now; the call may go once that time is
/// no more than the bucket's size ahead of now.
pub(crate) async fn take<B: SqlBackend>(store: &B, name: &str) -> Result<TokenGrant> {
    let mut tx = store.begin().await?;
    let now = tx.now().await?;
    let now_us = now * 1000;
    let row = tx
        .opt(
            "UPDATE flow_limits SET tat_us = (CASE WHEN tat_us > $2 THEN tat_us ELSE $2 END) \
             + rate_period_ms * 1000 / rate_count \
             WHERE name = $1 AND kind = 'rate' AND rate_count > 0 \
             RETURNING tat_us, rate_period_ms * 1000 / rate_count AS interval_us, burst",
            &[Arg::Str(name), Arg::Int(now_us)],
        )
        .await?;
    store.commit(tx).await?;
    let Some(row) = row else {
        return Ok(TokenGrant { at: now, now });
    };
    let tat: i64 = row.get("tat_us")?;
    let interval: i64 = row.get("interval_us")?;
    let burst: i64 = row.get("burst")?;
    let allowed_us = tat - burst.max(1) * interval;
    let at = if allowed_us <= now_us {
        now
    } else {
        // Rounded up: a call never goes before its moment.
        (allowed_us + 999).div_euclid(1000)
    };
    Ok(TokenGrant { at, now })
}
