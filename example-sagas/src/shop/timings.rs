//! What the `payout` participants note about themselves, on their own clock: the time of every
//! call the bank receives, and when each payout's work began and ended. Tests read these to
//! measure the rate the bank was called at across processes and to check that two payouts of
//! one merchant never overlap; neither is part of any effect, so they are plain inserts outside
//! the idempotent consumer, one row per call, duplicates included.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::Row;

#[cfg(feature = "postgres")]
use super::POSTGRES;
use super::{Pool, Shop, ShopError, SQLITE};

/// The timing statements of one backend.
pub(super) struct TimingSql {
    /// Creates the two tables (run in `Shop::open`'s transaction).
    pub create: &'static [&'static str],
    insert_call: &'static str,
    insert_mark: &'static str,
    select_calls: &'static str,
    select_marks: &'static str,
}

pub(super) const SQLITE_TIMINGS: TimingSql = TimingSql {
    create: &[
        "CREATE TABLE IF NOT EXISTS bank_calls (id INTEGER PRIMARY KEY AUTOINCREMENT, \
         payout_id TEXT NOT NULL, merchant TEXT NOT NULL, attempt BIGINT NOT NULL, \
         at_ms BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS payout_marks (id INTEGER PRIMARY KEY AUTOINCREMENT, \
         payout_id TEXT NOT NULL, merchant TEXT NOT NULL, mark TEXT NOT NULL, \
         at_ms BIGINT NOT NULL)",
    ],
    insert_call: "INSERT INTO bank_calls (payout_id, merchant, attempt, at_ms) \
                  VALUES (?1, ?2, ?3, ?4)",
    insert_mark: "INSERT INTO payout_marks (payout_id, merchant, mark, at_ms) \
                  VALUES (?1, ?2, ?3, ?4)",
    select_calls: "SELECT payout_id, merchant, attempt, at_ms FROM bank_calls ORDER BY at_ms, id",
    select_marks: "SELECT payout_id, merchant, mark, MIN(at_ms) AS first, MAX(at_ms) AS last \
                   FROM payout_marks GROUP BY payout_id, merchant, mark",
};

#[cfg(feature = "postgres")]
pub(super) const POSTGRES_TIMINGS: TimingSql = TimingSql {
    create: &[
        "CREATE TABLE IF NOT EXISTS bank_calls (id BIGSERIAL PRIMARY KEY, \
         payout_id TEXT NOT NULL, merchant TEXT NOT NULL, attempt BIGINT NOT NULL, \
         at_ms BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS payout_marks (id BIGSERIAL PRIMARY KEY, \
         payout_id TEXT NOT NULL, merchant TEXT NOT NULL, mark TEXT NOT NULL, \
         at_ms BIGINT NOT NULL)",
    ],
    insert_call: "INSERT INTO bank_calls (payout_id, merchant, attempt, at_ms) \
                  VALUES ($1, $2, $3, $4)",
    insert_mark: "INSERT INTO payout_marks (payout_id, merchant, mark, at_ms) \
                  VALUES ($1, $2, $3, $4)",
    select_calls: "SELECT payout_id, merchant, attempt, at_ms FROM bank_calls ORDER BY at_ms, id",
    select_marks: "SELECT payout_id, merchant, mark, MIN(at_ms) AS first, MAX(at_ms) AS last \
                   FROM payout_marks GROUP BY payout_id, merchant, mark",
};

/// The participant's clock: milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// One call the bank received (`send_transfer`), applied or refused as a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BankCall {
    /// The payout it was for.
    pub payout_id: String,
    /// The payout's merchant.
    pub merchant: String,
    /// When the bank received it: milliseconds since the Unix epoch, on the bank's clock.
    pub at: i64,
    /// The orchestrator's attempt number of the call.
    pub attempt: u32,
}

/// A moment in a payout's life that its participants note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayoutMark {
    /// An attempt of `debit_balance` began.
    DebitStarted,
    /// An attempt of `notify_merchant` succeeded.
    NotifyEnded,
    /// An attempt of `credit_balance` succeeded.
    CreditEnded,
}

impl PayoutMark {
    /// The name stored in `payout_marks.mark`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DebitStarted => "debit_started",
            Self::NotifyEnded => "notify_ended",
            Self::CreditEnded => "credit_ended",
        }
    }
}

impl PayoutMark {
    /// The mark stored as `name`, if this build knows it.
    fn parse(name: &str) -> Option<Self> {
        [Self::DebitStarted, Self::NotifyEnded, Self::CreditEnded]
            .into_iter()
            .find(|m| m.as_str() == name)
    }
}

impl fmt::Display for PayoutMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When one payout's work began and ended, on the participants' clock (milliseconds since the
/// Unix epoch); `None` where it never happened. Its window runs from `debit_started_at` to
/// `notify_ended_at`, or to `credit_ended_at` when it was compensated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PayoutTimes {
    /// The payout's merchant.
    pub merchant: String,
    /// The first attempt of `debit_balance` began.
    pub debit_started_at: Option<i64>,
    /// The last successful attempt of `notify_merchant` ended.
    pub notify_ended_at: Option<i64>,
    /// The last successful attempt of `credit_balance` ended.
    pub credit_ended_at: Option<i64>,
}

/// Everything the payout participants noted: what `example-sagas ledger --timings --json`
/// prints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PayoutTimings {
    /// Every call the bank received, in the order of its clock.
    pub bank_calls: Vec<BankCall>,
    /// Per payout id, when its work began and ended.
    pub payouts: BTreeMap<String, PayoutTimes>,
}

impl Shop {
    /// Notes that the bank received a call for `payout_id` (attempt `attempt`), now; returns the
    /// time noted.
    pub async fn record_bank_call(
        &self,
        payout_id: &str,
        merchant: &str,
        attempt: u32,
    ) -> Result<i64, ShopError> {
        let at = now_ms();
        on_backend!(self, |_consumer, pool, sql| {
            sqlx::query(sql.timings.insert_call)
                .bind(payout_id)
                .bind(merchant)
                .bind(i64::from(attempt))
                .bind(at)
                .execute(pool)
                .await?;
        });
        Ok(at)
    }

    /// Notes `mark` of `payout_id`, now; returns the time noted.
    pub async fn record_payout_mark(
        &self,
        payout_id: &str,
        merchant: &str,
        mark: PayoutMark,
    ) -> Result<i64, ShopError> {
        let at = now_ms();
        on_backend!(self, |_consumer, pool, sql| {
            sqlx::query(sql.timings.insert_mark)
                .bind(payout_id)
                .bind(merchant)
                .bind(mark.as_str())
                .bind(at)
                .execute(pool)
                .await?;
        });
        Ok(at)
    }

    /// Every bank call and every payout's window, as noted.
    pub async fn payout_timings(&self) -> Result<PayoutTimings, ShopError> {
        let (calls, marks) = on_backend!(self, |_consumer, pool, sql| {
            let calls = sqlx::query(sql.timings.select_calls)
                .fetch_all(pool)
                .await?;
            let marks = sqlx::query(sql.timings.select_marks)
                .fetch_all(pool)
                .await?;
            let mut read_calls = Vec::with_capacity(calls.len());
            for row in calls {
                let attempt: i64 = row.try_get("attempt")?;
                read_calls.push(BankCall {
                    payout_id: row.try_get("payout_id")?,
                    merchant: row.try_get("merchant")?,
                    at: row.try_get("at_ms")?,
                    attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
                });
            }
            let mut read_marks = Vec::with_capacity(marks.len());
            for row in marks {
                read_marks.push((
                    row.try_get::<String, _>("payout_id")?,
                    row.try_get::<String, _>("merchant")?,
                    row.try_get::<String, _>("mark")?,
                    row.try_get::<i64, _>("first")?,
                    row.try_get::<i64, _>("last")?,
                ));
            }
            (read_calls, read_marks)
        });
        let mut payouts: BTreeMap<String, PayoutTimes> = BTreeMap::new();
        for (payout, merchant, mark, first, last) in marks {
            let times = payouts.entry(payout).or_default();
            times.merchant = merchant;
            // A payout began at its first debit and ended at its last notice or credit.
            match PayoutMark::parse(&mark) {
                Some(PayoutMark::DebitStarted) => times.debit_started_at = Some(first),
                Some(PayoutMark::NotifyEnded) => times.notify_ended_at = Some(last),
                Some(PayoutMark::CreditEnded) => times.credit_ended_at = Some(last),
                // A mark of a newer build: not one of this one's windows' ends.
                None => {}
            }
        }
        Ok(PayoutTimings {
            bank_calls: calls,
            payouts,
        })
    }
}
