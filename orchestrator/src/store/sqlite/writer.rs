//! The write queue's writer on SQLite: creates, idempotent starts and transitions, written row
//! by row on the writer's handle ([`super::writer_rows`], [`super::keyed`]) with the
//! statements it keeps, atomically.

use sqlx::{Executor, Sqlite, SqliteConnection, SqlitePool};

use super::handle::{with_statements, Statements};
use super::keyed::keyed_rows;
use super::stmt::{exec, in_savepoint};
use super::writer_rows;
use crate::model::Millis;
use crate::store::idempotency::{IdempotentStart, KeyedItem};
use crate::store::write_queue::batch::{Item, NewItem};
use crate::store::write_queue::{BatchWriter, Whole};
use crate::store::SqlxResultExt;
use crate::store::{Applied, Result};

/// The batch writer of one writer task, with the statements it prepared on the writer's handle
/// and keeps from one batch to the next.
pub(crate) struct SqliteWriter {
    statements: Statements,
}

impl SqliteWriter {
    /// A writer for the connections of `pool`, with no statement prepared yet.
    pub(crate) fn new(pool: &SqlitePool) -> Self {
        Self {
            statements: Statements::new(pool),
        }
    }
}

/// Each call runs in its own savepoint, shared or not: on SQLite that costs nothing measurable.
impl BatchWriter<Sqlite> for SqliteWriter {
    /// `BEGIN IMMEDIATE`: the write lock up front; the batch runs on the process's clock.
    async fn begin(&mut self, conn: &mut SqliteConnection) -> Result<Option<Millis>> {
        conn.execute("BEGIN IMMEDIATE").await.db()?;
        Ok(None)
    }

    async fn apply(
        &mut self,
        conn: &mut SqliteConnection,
        now: Millis,
        items: &[Item],
        _shared: bool,
    ) -> Result<Vec<Result<Applied>>> {
        with_statements(conn, &mut self.statements, |db| {
            in_savepoint(db, "apply", |db| writer_rows::apply(db, now, items))
        })
        .await
    }

    async fn create(
        &mut self,
        conn: &mut SqliteConnection,
        now: Millis,
        news: &[NewItem],
        _shared: bool,
    ) -> Result<()> {
        with_statements(conn, &mut self.statements, |db| {
            in_savepoint(db, "create_sagas", |db| writer_rows::create(db, now, news))
        })
        .await
    }

    /// In batch order (of two starts with one key the first wins), each in a savepoint of its
    /// own ([`keyed_rows`]).
    async fn keyed(
        &mut self,
        conn: &mut SqliteConnection,
        now: Millis,
        items: &[KeyedItem],
    ) -> Result<Vec<Result<IdempotentStart>>> {
        with_statements(conn, &mut self.statements, |db| {
            Ok(keyed_rows(db, now, items))
        })
        .await
    }

    /// Every batch without closures, in one borrowing of the handle: `BEGIN`, the rows,
    /// `COMMIT`. Each idempotent start is in a savepoint, so that one that fails fails alone,
    /// as on the long way.
    async fn whole(
        &mut self,
        conn: &mut SqliteConnection,
        now: Millis,
        items: &[Item],
        news: &[NewItem],
        keyed: &[KeyedItem],
    ) -> Option<Result<Whole>> {
        let whole = with_statements(conn, &mut self.statements, |db| {
            exec(db, "BEGIN IMMEDIATE", [])?;
            writer_rows::create(db, now, news)?;
            let starts = keyed_rows(db, now, keyed);
            let applied = writer_rows::apply(db, now, items)?;
            exec(db, "COMMIT", [])?;
            Ok((applied, starts, now))
        })
        .await;
        Some(whole)
    }
}
