//! One statement text for both databases: the small dialect the shared store code is written in,
//! and the connections, transactions and rows it runs on.
//!
//! A statement is written for PostgreSQL, with numbered parameters (`$1`) and the casts
//! PostgreSQL needs (`$1::jsonb`, `id::text`); SQLite runs the same text with the casts removed
//! (it accepts `$1` parameters, `TRUE`/`FALSE` and `RETURNING` as they are). What the two cannot
//! share is not hidden here but kept out of the text: the time of a write is a bound parameter,
//! one per transaction ([`Tx::now`]: the store's clock when a SQLite transaction begins, the
//! database's clock read once on PostgreSQL), row locks are [`Tx::lock_saga`], and wake-ups of other processes are
//! [`Tx::announce_due`] and [`Tx::announce_finished`].
//!
//! Values are bound from [`Arg`]s, each the same type in both databases' columns: ids are
//! `uuid` on PostgreSQL and text on SQLite, JSON `jsonb` and text.

#[cfg(feature = "sqlite")]
use std::borrow::Cow;

use serde_json::Value;
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
#[cfg(feature = "sqlite")]
use sqlx::sqlite::{SqliteArguments, SqliteRow};
#[cfg(feature = "postgres")]
use sqlx::Postgres;
#[cfg(feature = "sqlite")]
use sqlx::Sqlite;
use sqlx::Transaction;
use uuid::Uuid;

use crate::model::{Millis, SagaStatus};
use crate::store::rows::{Column, LogRow};
use crate::store::{Result, SqlxResultExt, StoreError};

/// The PostgreSQL channel that wakes engines when a saga becomes due (the batch statement of
/// `postgres::writer` names it too).
pub(crate) const DUE_CHANNEL: &str = "saga_due";

/// The PostgreSQL channel announcing `ID STATUS` when a saga ends (also named by the batch
/// statement of `postgres::writer`).
pub(crate) const DONE_CHANNEL: &str = "saga_done";

/// Which database a statement runs on, for the few fragments whose text cannot be shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Dialect {
    /// The condition "needs attention", spelt as the partial index `sagas_attention` of each
    /// database's migrations is, so that the planner can use it.
    pub(crate) fn needs_attention(self) -> &'static str {
        match self {
            Dialect::Sqlite => " AND needs_attention = 1",
            Dialect::Postgres => " AND needs_attention",
        }
    }

    /// An event's position among commits, as a 64-bit integer (`e` the events table): its
    /// transaction on PostgreSQL, whose ids can commit out of order; none on SQLite, whose one
    /// writer commits ids in order.
    pub(crate) fn event_tx(self) -> &'static str {
        match self {
            Dialect::Sqlite => "0",
            Dialect::Postgres => "e.tx::text::bigint",
        }
    }

    /// What a claim of rows others may claim at the same time adds to its `SELECT`: skip the
    /// rows they locked (PostgreSQL); SQLite's write lock already serialises claims.
    pub(crate) fn skip_locked(self, table: &str) -> String {
        match self {
            Dialect::Sqlite => String::new(),
            Dialect::Postgres => format!(" FOR UPDATE OF {table} SKIP LOCKED"),
        }
    }
}

/// A value bound to a statement's parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    /// A saga id.
    Id(Uuid),
    /// Text.
    Str(&'a str),
    /// Text or `NULL`.
    OptStr(Option<&'a str>),
    /// An integer (times are milliseconds).
    Int(i64),
    /// An integer or `NULL`.
    OptInt(Option<i64>),
    /// A JSON document (the parameter carries a `::jsonb` cast in the text).
    Json(&'a Value),
    /// A list of ids, for `= ANY($n)`.
    Ids(&'a [Uuid]),
    /// A list of texts, for `= ANY($n)`.
    Strs(&'a [String]),
}

/// The statement text for SQLite: the PostgreSQL text without its `::type` casts, and each
/// `= ANY($n)` over a list parameter as `IN (SELECT value FROM json_each($n))` (SQLite has no
/// arrays: a list is bound as a JSON array).
#[cfg(feature = "sqlite")]
fn sqlite_text(sql: &str) -> Cow<'_, str> {
    if !sql.contains("::") && !sql.contains("= ANY(") {
        return Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find("::") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let skip = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '[' || c == ']'))
            .unwrap_or(after.len());
        rest = &after[skip..];
    }
    out.push_str(rest);
    while let Some(at) = out.find("= ANY($") {
        let param_end = out[at..].find(')').map_or(out.len(), |end| at + end);
        let param = out[at + "= ANY(".len()..param_end].to_owned();
        out.replace_range(
            at..=param_end.min(out.len() - 1),
            &format!("IN (SELECT value FROM json_each({param}))"),
        );
    }
    Cow::Owned(out)
}

/// A list as SQLite binds it: a JSON array of its items as text.
#[cfg(feature = "sqlite")]
fn json_list<T: ToString>(items: &[T]) -> String {
    let texts: Vec<String> = items.iter().map(ToString::to_string).collect();
    serde_json::Value::from(texts).to_string()
}

#[cfg(feature = "sqlite")]
fn sqlite_query<'q>(sql: &'q str, args: &[Arg<'q>]) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    let mut q = sqlx::query(sql);
    for arg in args {
        q = match *arg {
            Arg::Id(id) => q.bind(id.to_string()),
            Arg::Str(s) => q.bind(s),
            Arg::OptStr(s) => q.bind(s),
            Arg::Int(i) => q.bind(i),
            Arg::OptInt(i) => q.bind(i),
            Arg::Json(v) => q.bind(v.to_string()),
            Arg::Ids(ids) => q.bind(json_list(ids)),
            Arg::Strs(texts) => q.bind(json_list(texts)),
        };
    }
    q
}

#[cfg(feature = "postgres")]
fn pg_query<'q>(sql: &'q str, args: &[Arg<'q>]) -> Query<'q, Postgres, PgArguments> {
    let mut q = sqlx::query(sql);
    for arg in args {
        q = match *arg {
            Arg::Id(id) => q.bind(id),
            Arg::Str(s) => q.bind(s),
            Arg::OptStr(s) => q.bind(s),
            Arg::Int(i) => q.bind(i),
            Arg::OptInt(i) => q.bind(i),
            Arg::Json(v) => q.bind(v.to_string()),
            Arg::Ids(ids) => q.bind(ids),
            Arg::Strs(texts) => q.bind(texts),
        };
    }
    q
}

/// A row of either database.
pub(crate) enum Row {
    /// From SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteRow),
    /// From PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(PgRow),
}

impl LogRow for Row {
    fn get<T: Column>(&self, name: &str) -> Result<T> {
        match self {
            #[cfg(feature = "sqlite")]
            Row::Sqlite(row) => row.get(name),
            #[cfg(feature = "postgres")]
            Row::Postgres(row) => row.get(name),
        }
    }
}

/// A pool to read from outside any transaction.
#[derive(Clone, Copy)]
pub(crate) enum Reader<'a> {
    /// SQLite's read-only pool.
    #[cfg(feature = "sqlite")]
    Sqlite(&'a sqlx::SqlitePool),
    /// The PostgreSQL pool.
    #[cfg(feature = "postgres")]
    Postgres(&'a sqlx::PgPool),
}

impl Reader<'_> {
    /// The database it reads.
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "sqlite")]
            Reader::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Reader::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Every row `sql` returns.
    pub(crate) async fn all(&self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        Ok(match *self {
            #[cfg(feature = "sqlite")]
            Reader::Sqlite(pool) => {
                let text = sqlite_text(sql);
                let rows = sqlite_query(&text, args).fetch_all(pool).await.db()?;
                rows.into_iter().map(Row::Sqlite).collect()
            }
            #[cfg(feature = "postgres")]
            Reader::Postgres(pool) => {
                let rows = pg_query(sql, args).fetch_all(pool).await.db()?;
                rows.into_iter().map(Row::Postgres).collect()
            }
        })
    }

    /// The row `sql` returns, if any.
    pub(crate) async fn opt(&self, sql: &str, args: &[Arg<'_>]) -> Result<Option<Row>> {
        Ok(self.all(sql, args).await?.into_iter().next())
    }

    /// A read transaction: its statements see one snapshot.
    pub(crate) async fn snapshot(&self) -> Result<Tx> {
        Ok(match *self {
            #[cfg(feature = "sqlite")]
            Reader::Sqlite(p) => Tx::sqlite(p.begin().await.db()?, None),
            #[cfg(feature = "postgres")]
            Reader::Postgres(p) => Tx::postgres(
                p.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await
                    .db()?,
            ),
        })
    }
}

enum TxConn {
    #[cfg(feature = "sqlite")]
    Sqlite(Transaction<'static, Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(Transaction<'static, Postgres>),
}

/// An open transaction of either database, with the time its writes record.
pub(crate) struct Tx {
    conn: TxConn,
    /// The time its writes record, once known (see [`Tx::now`]).
    now: Option<Millis>,
    /// Whether it made a saga due that engines of this process should hear of once it
    /// commits (SQLite has no notifications; PostgreSQL's are sent by the statement itself).
    due: bool,
}

impl Tx {
    /// A SQLite transaction whose writes record `now` (`None` for a read transaction).
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(tx: Transaction<'static, Sqlite>, now: Option<Millis>) -> Self {
        Self {
            conn: TxConn::Sqlite(tx),
            now,
            due: false,
        }
    }

    /// A PostgreSQL transaction, whose writes record the database's time (read when first
    /// needed, so a transaction that records none pays no round trip for it).
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(tx: Transaction<'static, Postgres>) -> Self {
        Self {
            conn: TxConn::Postgres(tx),
            now: None,
            due: false,
        }
    }

    /// The database it runs on.
    pub(crate) fn dialect(&self) -> Dialect {
        match self.conn {
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            TxConn::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The time this transaction's writes record: the same for all of them. On PostgreSQL the
    /// database's clock, read on first use (or when [`Tx::lock_saga`] takes its lock).
    // A build with SQLite alone never reads a clock here.
    #[cfg_attr(not(feature = "postgres"), allow(unreachable_code, unused_variables))]
    pub(crate) async fn now(&mut self) -> Result<Millis> {
        if let Some(now) = self.now {
            return Ok(now);
        }
        let now = match self.conn {
            #[cfg(feature = "postgres")]
            TxConn::Postgres(_) => self
                .opt("SELECT saga_now_ms() AS now", &[])
                .await?
                .ok_or_else(|| StoreError::io("saga_now_ms() returned no row"))?
                .get("now")?,
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(_) => {
                return Err(StoreError::io("a read transaction records no time"));
            }
        };
        self.now = Some(now);
        Ok(now)
    }

    /// Every row `sql` returns.
    pub(crate) async fn all(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>> {
        Ok(match &mut self.conn {
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(tx) => {
                let text = sqlite_text(sql);
                sqlite_query(&text, args)
                    .fetch_all(&mut **tx)
                    .await
                    .db()?
                    .into_iter()
                    .map(Row::Sqlite)
                    .collect()
            }
            #[cfg(feature = "postgres")]
            TxConn::Postgres(tx) => pg_query(sql, args)
                .fetch_all(&mut **tx)
                .await
                .db()?
                .into_iter()
                .map(Row::Postgres)
                .collect(),
        })
    }

    /// The row `sql` returns, if any.
    pub(crate) async fn opt(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Option<Row>> {
        Ok(self.all(sql, args).await?.into_iter().next())
    }

    /// Runs `sql`; how many rows it changed.
    pub(crate) async fn exec(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64> {
        Ok(match &mut self.conn {
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(tx) => {
                let text = sqlite_text(sql);
                sqlite_query(&text, args)
                    .execute(&mut **tx)
                    .await
                    .db()?
                    .rows_affected()
            }
            #[cfg(feature = "postgres")]
            TxConn::Postgres(tx) => pg_query(sql, args)
                .execute(&mut **tx)
                .await
                .db()?
                .rows_affected(),
        })
    }

    /// The SQLite connection under the transaction, for a backend's own statements.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite_conn(&mut self) -> Option<&mut sqlx::SqliteConnection> {
        match &mut self.conn {
            TxConn::Sqlite(tx) => Some(&mut **tx),
            #[cfg(feature = "postgres")]
            TxConn::Postgres(_) => None,
        }
    }

    /// The PostgreSQL connection under the transaction, for a backend's own statements.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres_conn(&mut self) -> Option<&mut sqlx::PgConnection> {
        match &mut self.conn {
            TxConn::Postgres(tx) => Some(&mut **tx),
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(_) => None,
        }
    }

    /// Whether it runs on PostgreSQL, whose wake-ups are `NOTIFY`s.
    fn on_postgres(&self) -> bool {
        self.dialect() == Dialect::Postgres
    }

    /// Locks the saga's row until the end of the transaction (PostgreSQL; a SQLite write
    /// transaction holds the database's one write lock already); whether the saga exists. On
    /// PostgreSQL the transaction's time is read again once the lock is held, so that what it
    /// writes is not older than the write it waited for.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn lock_saga(&mut self, id: Uuid) -> Result<bool> {
        match self.conn {
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(_) => Ok(true),
            #[cfg(feature = "postgres")]
            TxConn::Postgres(_) => {
                let row = self
                    .opt(
                        "SELECT saga_now_ms() AS now FROM sagas WHERE id = $1 FOR UPDATE",
                        &[Arg::Id(id)],
                    )
                    .await?;
                match row {
                    Some(row) => {
                        self.now = Some(row.get("now")?);
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
        }
    }

    /// Wakes the engines of other processes on commit: a saga became due (PostgreSQL's
    /// `NOTIFY`; SQLite has one engine, which polls).
    pub(crate) async fn announce_due(&mut self) -> Result<()> {
        if self.on_postgres() {
            self.exec("SELECT pg_notify($1, '')", &[Arg::Str(DUE_CHANNEL)])
                .await?;
        }
        self.due = true;
        Ok(())
    }

    /// Tells waiters in other processes, on commit, that saga `id` ended with `status`.
    pub(crate) async fn announce_finished(&mut self, id: Uuid, status: SagaStatus) -> Result<()> {
        if self.on_postgres() {
            let payload = format!("{id} {status}");
            self.exec(
                "SELECT pg_notify($1, $2)",
                &[Arg::Str(DONE_CHANNEL), Arg::Str(&payload)],
            )
            .await?;
        }
        Ok(())
    }

    /// Commits.
    /// Commits; returns whether it made a saga due ([`Tx::announce_due`]).
    pub(crate) async fn commit(self) -> Result<bool> {
        match self.conn {
            #[cfg(feature = "sqlite")]
            TxConn::Sqlite(tx) => tx.commit().await.db()?,
            #[cfg(feature = "postgres")]
            TxConn::Postgres(tx) => tx.commit().await.db()?,
        }
        Ok(self.due)
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::sqlite_text;

    #[test]
    fn sqlite_text_drops_casts_and_keeps_the_rest() {
        assert_eq!(
            sqlite_text(
                "SELECT id::text AS id FROM s WHERE id = ANY($1::uuid[]) AND d = $2::jsonb"
            ),
            "SELECT id AS id FROM s WHERE id IN (SELECT value FROM json_each($1)) AND d = $2"
        );
        assert_eq!(sqlite_text("SELECT 1"), "SELECT 1");
        assert_eq!(
            sqlite_text("SELECT a FROM t WHERE k = ANY($1) AND j = ANY($2::uuid[]) LIMIT $3"),
            "SELECT a FROM t WHERE k IN (SELECT value FROM json_each($1)) \
             AND j IN (SELECT value FROM json_each($2)) LIMIT $3"
        );
    }
}
