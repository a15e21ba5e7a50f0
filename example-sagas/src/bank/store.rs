//! The bank's own database: transfers under their idempotency keys, the callbacks owed for them,
//! and the ledger of money really moved.
//!
//! Three tables, prefixed `bank_` so that the bank may share a PostgreSQL database with the shop
//! without a clash: `bank_transfers` (one row per idempotency key, with its settlement time, so
//! that a pending settlement survives a restart), `bank_callbacks` (one row per key and task
//! URL, with its delivery state and next attempt) and `bank_ledger` (one `transferred` row per
//! key at most, its primary key being the key). The statements are the same on both backends
//! (`$N` placeholders, integers for booleans and times); only the way a write transaction begins
//! differs.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

use super::BankError;

const CREATE: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS bank_transfers (idempotency_key TEXT PRIMARY KEY, \
     transfer_id TEXT NOT NULL, payout_id TEXT NOT NULL, merchant TEXT NOT NULL, \
     amount BIGINT NOT NULL, refuse BIGINT NOT NULL, status TEXT NOT NULL, \
     received_at BIGINT NOT NULL, settle_at BIGINT NOT NULL, settled_at BIGINT)",
    "CREATE INDEX IF NOT EXISTS bank_transfers_payout_id ON bank_transfers (payout_id)",
    "CREATE INDEX IF NOT EXISTS bank_transfers_due ON bank_transfers (status, settle_at)",
    "CREATE TABLE IF NOT EXISTS bank_callbacks (idempotency_key TEXT NOT NULL, \
     task_url TEXT NOT NULL, state TEXT NOT NULL, attempts BIGINT NOT NULL, \
     next_at BIGINT NOT NULL, last_status BIGINT, PRIMARY KEY (idempotency_key, task_url))",
    "CREATE TABLE IF NOT EXISTS bank_ledger (idempotency_key TEXT PRIMARY KEY, \
     payout_id TEXT NOT NULL, effect TEXT NOT NULL, amount BIGINT NOT NULL, at BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS bank_ledger_payout_id ON bank_ledger (payout_id)",
];

#[cfg(feature = "postgres")]
/// Several processes may open the database at once, and concurrent `CREATE TABLE IF NOT EXISTS`
/// can still collide in the PostgreSQL catalog: serialise them on an advisory lock.
const PG_CREATE_LOCK: &str = "SELECT pg_advisory_xact_lock(7420152)";

const INSERT_TRANSFER: &str = "INSERT INTO bank_transfers (idempotency_key, transfer_id, \
     payout_id, merchant, amount, refuse, status, received_at, settle_at) \
     VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8) ON CONFLICT (idempotency_key) DO NOTHING";
const TRANSFER_COLUMNS: &str = "idempotency_key, transfer_id, payout_id, merchant, amount, \
     refuse, status";
const INSERT_CALLBACK: &str = "INSERT INTO bank_callbacks (idempotency_key, task_url, state, \
     attempts, next_at) VALUES ($1, $2, 'pending', 0, $3) \
     ON CONFLICT (idempotency_key, task_url) DO NOTHING";
const DUE_SETTLEMENTS: &str = "SELECT idempotency_key FROM bank_transfers \
     WHERE status = 'pending' AND settle_at <= $1 ORDER BY settle_at";
const SETTLE: &str = "UPDATE bank_transfers SET status = $2, settled_at = $3 \
     WHERE idempotency_key = $1 AND status = 'pending'";
const INSERT_LEDGER: &str = "INSERT INTO bank_ledger (idempotency_key, payout_id, effect, \
     amount, at) VALUES ($1, $2, 'transferred', $3, $4) ON CONFLICT (idempotency_key) DO NOTHING";
const DUE_CALLBACKS: &str = "SELECT c.idempotency_key, c.task_url, c.attempts, t.transfer_id, \
     t.amount, t.status FROM bank_callbacks c \
     JOIN bank_transfers t ON t.idempotency_key = c.idempotency_key \
     WHERE c.state = 'pending' AND t.status <> 'pending' AND c.next_at <= $1 ORDER BY c.next_at";
const NEXT_SETTLEMENT: &str =
    "SELECT MIN(settle_at) AS at FROM bank_transfers WHERE status = 'pending'";
const NEXT_CALLBACK: &str = "SELECT MIN(c.next_at) AS at FROM bank_callbacks c \
     JOIN bank_transfers t ON t.idempotency_key = c.idempotency_key \
     WHERE c.state = 'pending' AND t.status <> 'pending'";
const UPDATE_CALLBACK: &str = "UPDATE bank_callbacks SET state = $3, attempts = $4, \
     next_at = $5, last_status = $6 WHERE idempotency_key = $1 AND task_url = $2";
const LEASE_CALLBACK: &str = "UPDATE bank_callbacks SET next_at = $3 \
     WHERE idempotency_key = $1 AND task_url = $2";
const LEDGER: &str = "SELECT payout_id, COUNT(*) AS n FROM bank_ledger \
     WHERE effect = 'transferred' GROUP BY payout_id";
const LEDGER_FOR: &str = "SELECT COUNT(*) AS n FROM bank_ledger \
     WHERE effect = 'transferred' AND payout_id = $1";

/// What a client asks the bank to do: the JSON body of `POST /transfers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRequest {
    /// The payout the money is for.
    pub payout_id: String,
    /// Who receives it.
    pub merchant: String,
    /// How much, in the smallest unit of the currency.
    pub amount: i64,
    /// Whether the bank will reject the transfer when it settles (for demos and tests).
    #[serde(default)]
    pub refuse: bool,
}

/// Where a transfer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferStatus {
    /// Accepted, not settled yet.
    Pending,
    /// Settled: the money moved (one `transferred` ledger row).
    Transferred,
    /// Settled: the bank rejected it; no money moved.
    Refused,
}

impl TransferStatus {
    /// The name stored in the database and shown in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Transferred => "transferred",
            Self::Refused => "refused",
        }
    }
}

impl FromStr for TransferStatus {
    type Err = BankError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Pending, Self::Transferred, Self::Refused]
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| BankError::Corrupt(format!("unknown transfer status {s:?}")))
    }
}

/// A transfer the bank holds, as `GET /transfers/{payout_id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The bank's own id of the transfer.
    pub transfer_id: String,
    /// The key it was asked under.
    pub idempotency_key: String,
    /// The payout it is for.
    pub payout_id: String,
    /// Who receives it.
    pub merchant: String,
    /// How much.
    pub amount: i64,
    /// Whether it was asked to be refused.
    pub refuse: bool,
    /// Where it stands.
    pub status: TransferStatus,
}

impl Transfer {
    /// Whether `request` asks for the same transfer as the one recorded.
    fn matches(&self, request: &TransferRequest) -> bool {
        self.payout_id == request.payout_id
            && self.merchant == request.merchant
            && self.amount == request.amount
            && self.refuse == request.refuse
    }
}

/// A callback owed and due: the outcome of a settled transfer, to report to one task URL.
#[derive(Debug, Clone)]
pub(super) struct DueCallback {
    pub key: String,
    pub task_url: String,
    pub attempts: i64,
    pub transfer_id: String,
    pub amount: i64,
    pub status: TransferStatus,
}

/// Where the delivery of a callback stands once an attempt is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallbackState {
    /// Not delivered yet; tried again at its `next_at`.
    Pending,
    /// The receiver answered `2xx`.
    Delivered,
    /// The receiver answered `404` or `409`: the task is gone or no longer current.
    Stopped,
}

impl CallbackState {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Stopped => "stopped",
        }
    }
}

/// The database pool of one backend.
#[derive(Debug, Clone)]
enum Pool {
    Sqlite(SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the concrete pool and `$begin` to the statement that
/// begins a write transaction: SQLite takes its write lock up front (`BEGIN IMMEDIATE`) so that
/// two writers never deadlock upgrading read locks; PostgreSQL locks rows as it goes.
macro_rules! on_pool {
    ($store:expr, |$pool:ident, $begin:ident| $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($pool) => {
                let $begin = "BEGIN IMMEDIATE";
                $body
            }
            #[cfg(feature = "postgres")]
            Pool::Postgres($pool) => {
                let $begin = "BEGIN";
                $body
            }
        }
    };
}

/// The bank's database: a SQLite file or a PostgreSQL database of its own.
///
/// Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct BankStore {
    pool: Pool,
}

/// What [`BankStore::accept`] did with a request.
#[derive(Debug, Clone)]
pub(super) struct Accepted {
    /// The transfer recorded under the key (new or earlier).
    pub transfer: Transfer,
    /// Whether a callback to a task URL not seen before for this key was added.
    pub new_callback: bool,
}

impl BankStore {
    /// Opens the database at `url`, creating it and its tables if missing.
    ///
    /// `sqlite://PATH` (in WAL mode with `synchronous=FULL`, so that an accepted transfer
    /// survives power loss) or, when built with the `postgres` feature, `postgres://…`.
    pub async fn open(url: &str) -> Result<Self, BankError> {
        Self::connect(url, true).await
    }

    /// Opens the database at `url` as [`BankStore::open`] does, except that a SQLite file that
    /// does not exist is an error rather than created: for reading a bank's ledger.
    pub async fn open_existing(url: &str) -> Result<Self, BankError> {
        Self::connect(url, false).await
    }

    async fn connect(url: &str, create: bool) -> Result<Self, BankError> {
        let pool = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(create)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(10));
            // Every connection to `:memory:` is its own database: keep one.
            let max = if url.contains(":memory:") { 1 } else { 4 };
            Pool::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(max)
                    .connect_with(options)
                    .await?,
            )
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(not(feature = "postgres"))]
            return Err(BankError::NotBuilt(orchestrator::store::redact_url(url)));
            #[cfg(feature = "postgres")]
            Pool::Postgres(PgPoolOptions::new().max_connections(4).connect(url).await?)
        } else {
            return Err(BankError::UnsupportedUrl(orchestrator::store::redact_url(
                url,
            )));
        };
        let store = Self { pool };
        store.create_tables().await?;
        Ok(store)
    }

    async fn create_tables(&self) -> Result<(), BankError> {
        on_pool!(self, |pool, begin| {
            let mut tx = pool.begin_with(begin).await?;
            #[cfg(feature = "postgres")]
            if matches!(self.pool, Pool::Postgres(_)) {
                sqlx::query(PG_CREATE_LOCK).execute(&mut *tx).await?;
            }
            for statement in CREATE {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// Closes the pool, waiting for its connections to finish.
    pub async fn close(&self) {
        on_pool!(self, |pool, _begin| pool.close().await)
    }

    /// Records `request` under `key`, in one transaction, and the callback owed to `task_url`.
    ///
    /// A new key gets a new pending transfer, settled at `settle_at` (milliseconds since the
    /// Unix epoch). A known key with the same request answers the transfer recorded then; with
    /// a different one, [`BankError::KeyReused`].
    pub(super) async fn accept(
        &self,
        key: &str,
        task_url: Option<&str>,
        request: &TransferRequest,
        now: i64,
        settle_at: i64,
    ) -> Result<Accepted, BankError> {
        let transfer_id = uuid::Uuid::now_v7().to_string();
        let select =
            format!("SELECT {TRANSFER_COLUMNS} FROM bank_transfers WHERE idempotency_key = $1");
        let accepted = on_pool!(self, |pool, begin| {
            let mut tx = pool.begin_with(begin).await?;
            sqlx::query(INSERT_TRANSFER)
                .bind(key)
                .bind(&transfer_id)
                .bind(&request.payout_id)
                .bind(&request.merchant)
                .bind(request.amount)
                .bind(i64::from(request.refuse))
                .bind(now)
                .bind(settle_at)
                .execute(&mut *tx)
                .await?;
            let row = sqlx::query(&select).bind(key).fetch_one(&mut *tx).await?;
            let transfer = transfer_from_row(&row)?;
            if !transfer.matches(request) {
                // Rolled back on drop: nothing of this request is kept.
                return Err(BankError::KeyReused(key.to_owned()));
            }
            let new_callback = match task_url {
                Some(url) => {
                    sqlx::query(INSERT_CALLBACK)
                        .bind(key)
                        .bind(url)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1
                }
                None => false,
            };
            tx.commit().await?;
            Accepted {
                transfer,
                new_callback,
            }
        });
        Ok(accepted)
    }

    /// Settles every pending transfer due by `now`; returns how many it settled.
    ///
    /// Each in a transaction of its own that moves it out of `pending` only if it still is and,
    /// unless it is to be refused, appends its `transferred` ledger row: so the money moves once
    /// per key however often this runs.
    pub(super) async fn settle_due(&self, now: i64) -> Result<usize, BankError> {
        let select = format!(
            "SELECT {TRANSFER_COLUMNS} FROM bank_transfers \
             WHERE idempotency_key = $1 AND status = 'pending'"
        );
        let settled = on_pool!(self, |pool, begin| {
            let keys: Vec<String> = sqlx::query(DUE_SETTLEMENTS)
                .bind(now)
                .fetch_all(pool)
                .await?
                .iter()
                .map(|row| row.try_get("idempotency_key"))
                .collect::<Result<_, _>>()?;
            let mut settled = 0;
            for key in keys {
                let mut tx = pool.begin_with(begin).await?;
                let Some(row) = sqlx::query(&select)
                    .bind(&key)
                    .fetch_optional(&mut *tx)
                    .await?
                else {
                    continue;
                };
                let transfer = transfer_from_row(&row)?;
                let status = if transfer.refuse {
                    TransferStatus::Refused
                } else {
                    TransferStatus::Transferred
                };
                let updated = sqlx::query(SETTLE)
                    .bind(&key)
                    .bind(status.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if updated == 1 && status == TransferStatus::Transferred {
                    sqlx::query(INSERT_LEDGER)
                        .bind(&key)
                        .bind(&transfer.payout_id)
                        .bind(transfer.amount)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                if updated == 1 {
                    tracing::info!(
                        key = %key,
                        payout_id = %transfer.payout_id,
                        status = status.as_str(),
                        "transfer settled"
                    );
                }
                settled += usize::try_from(updated).unwrap_or(0);
            }
            settled
        });
        Ok(settled)
    }

    /// The callbacks of settled transfers due by `now`, each leased until `lease_until` so that
    /// it is not started twice while its request is in flight.
    pub(super) async fn take_due_callbacks(
        &self,
        now: i64,
        lease_until: i64,
    ) -> Result<Vec<DueCallback>, BankError> {
        let due = on_pool!(self, |pool, _begin| {
            let rows = sqlx::query(DUE_CALLBACKS).bind(now).fetch_all(pool).await?;
            let mut due = Vec::with_capacity(rows.len());
            for row in rows {
                let callback = DueCallback {
                    key: row.try_get("idempotency_key")?,
                    task_url: row.try_get("task_url")?,
                    attempts: row.try_get("attempts")?,
                    transfer_id: row.try_get("transfer_id")?,
                    amount: row.try_get("amount")?,
                    status: row.try_get::<String, _>("status")?.parse()?,
                };
                sqlx::query(LEASE_CALLBACK)
                    .bind(&callback.key)
                    .bind(&callback.task_url)
                    .bind(lease_until)
                    .execute(pool)
                    .await?;
                due.push(callback);
            }
            due
        });
        Ok(due)
    }

    /// Records how an attempt to deliver a callback ended.
    pub(super) async fn record_callback(
        &self,
        callback: &DueCallback,
        state: CallbackState,
        next_at: i64,
        status: Option<u16>,
    ) -> Result<(), BankError> {
        on_pool!(self, |pool, _begin| {
            sqlx::query(UPDATE_CALLBACK)
                .bind(&callback.key)
                .bind(&callback.task_url)
                .bind(state.as_str())
                .bind(callback.attempts + 1)
                .bind(next_at)
                .bind(status.map(i64::from))
                .execute(pool)
                .await?;
        });
        Ok(())
    }

    /// When something next falls due: a settlement or a callback of a settled transfer.
    pub(super) async fn next_due(&self) -> Result<Option<i64>, BankError> {
        let next = on_pool!(self, |pool, _begin| {
            let mut next: Option<i64> = None;
            for statement in [NEXT_SETTLEMENT, NEXT_CALLBACK] {
                let at: Option<i64> = sqlx::query(statement)
                    .fetch_one(pool)
                    .await?
                    .try_get("at")?;
                next = match (next, at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            next
        });
        Ok(next)
    }

    /// Every transfer held for `payout_id`, oldest first.
    pub async fn transfers_for(&self, payout_id: &str) -> Result<Vec<Transfer>, BankError> {
        let select = format!(
            "SELECT {TRANSFER_COLUMNS} FROM bank_transfers WHERE payout_id = $1 \
             ORDER BY received_at, idempotency_key"
        );
        let rows = on_pool!(self, |pool, _begin| {
            sqlx::query(&select)
                .bind(payout_id)
                .fetch_all(pool)
                .await?
                .iter()
                .map(transfer_from_row)
                .collect::<Result<Vec<_>, _>>()?
        });
        Ok(rows)
    }

    /// How many transfers really moved money for `payout_id`.
    pub async fn transferred_for(&self, payout_id: &str) -> Result<u64, BankError> {
        let n: i64 = on_pool!(self, |pool, _begin| {
            sqlx::query(LEDGER_FOR)
                .bind(payout_id)
                .fetch_one(pool)
                .await?
                .try_get("n")?
        });
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Per payout id, how many transfers really moved money.
    pub async fn ledger(&self) -> Result<BTreeMap<String, BankLedgerEntry>, BankError> {
        let ledger = on_pool!(self, |pool, _begin| {
            let mut ledger = BTreeMap::new();
            for row in sqlx::query(LEDGER).fetch_all(pool).await? {
                let n: i64 = row.try_get("n")?;
                ledger.insert(
                    row.try_get("payout_id")?,
                    BankLedgerEntry {
                        transferred: u64::try_from(n).unwrap_or(0),
                    },
                );
            }
            ledger
        });
        Ok(ledger)
    }
}

/// What the bank's ledger holds for one payout: `{"transferred": n}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BankLedgerEntry {
    /// Transfers settled (money moved) for the payout.
    pub transferred: u64,
}

/// A row of `bank_transfers` selected with [`TRANSFER_COLUMNS`], on either backend.
fn transfer_from_row<R>(row: &R) -> Result<Transfer, BankError>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(Transfer {
        transfer_id: row.try_get("transfer_id")?,
        idempotency_key: row.try_get("idempotency_key")?,
        payout_id: row.try_get("payout_id")?,
        merchant: row.try_get("merchant")?,
        amount: row.try_get("amount")?,
        refuse: row.try_get::<i64, _>("refuse")? != 0,
        status: row.try_get::<String, _>("status")?.parse()?,
    })
}
