//! The write queue's calls on SQLite: creates and transitions, written row by row on the
//! writer's handle ([`super::writer_rows`], [`super::keyed`]) with its kept statements,
//! atomically.

use sqlx::SqliteConnection;

use super::handle::{exec, in_savepoint, with_statements, Statements};
use super::keyed::keyed_rows;
use super::writer_rows;
use crate::model::Millis;
use crate::store::idempotency::{IdempotentStart, KeyedItem};
use crate::store::write_queue::batch::{Item, NewItem};
use crate::store::write_queue::{BoxFuture, Whole};
use crate::store::{Applied, Result};

/// [`apply_batch`] as a plain function pointer for the write queue (always in its own
/// savepoint: on SQLite that costs nothing measurable).
pub(crate) fn apply_batch_boxed<'c>(
    conn: &'c mut SqliteConnection,
    statements: &'c mut Statements,
    now: Millis,
    items: &'c [Item],
    _guarded: bool,
) -> BoxFuture<'c, Result<Vec<Result<Applied>>>> {
    Box::pin(apply_batch(conn, statements, now, items))
}

/// Applies `items` inside the caller's transaction, atomically; one result per item, in order.
pub(crate) async fn apply_batch(
    conn: &mut SqliteConnection,
    statements: &mut Statements,
    now: Millis,
    items: &[Item],
) -> Result<Vec<Result<Applied>>> {
    with_statements(conn, statements, |db| {
        in_savepoint(db, "apply", |db| writer_rows::apply(db, now, items))
    })
    .await
}

/// [`insert_sagas`] as a plain function pointer for the write queue (always in its own
/// savepoint, as [`apply_batch_boxed`]).
pub(crate) fn insert_sagas_boxed<'c>(
    conn: &'c mut SqliteConnection,
    statements: &'c mut Statements,
    now: Millis,
    items: &'c [NewItem],
    _guarded: bool,
) -> BoxFuture<'c, Result<()>> {
    Box::pin(insert_sagas(conn, statements, now, items))
}

/// Creates sagas, their steps and their `saga.started` events, atomically.
pub(crate) async fn insert_sagas(
    conn: &mut SqliteConnection,
    statements: &mut Statements,
    now: Millis,
    items: &[NewItem],
) -> Result<()> {
    with_statements(conn, statements, |db| {
        in_savepoint(db, "create_sagas", |db| writer_rows::create(db, now, items))
    })
    .await
}

/// [`keyed_starts`] as a plain function pointer for the write queue.
pub(crate) fn keyed_starts_boxed<'c>(
    conn: &'c mut SqliteConnection,
    statements: &'c mut Statements,
    now: Millis,
    items: &'c [KeyedItem],
) -> BoxFuture<'c, Result<Vec<Result<IdempotentStart>>>> {
    Box::pin(keyed_starts(conn, statements, now, items))
}

/// Runs a batch of idempotent starts inside the writer's transaction, in batch order (of two
/// starts with one key the first wins), each in a savepoint of its own: its key, saga and
/// callback are written together or not at all, and a start that fails (a saga id collision)
/// fails alone.
async fn keyed_starts(
    conn: &mut SqliteConnection,
    statements: &mut Statements,
    now: Millis,
    items: &[KeyedItem],
) -> Result<Vec<Result<IdempotentStart>>> {
    with_statements(conn, statements, |db| Ok(keyed_rows(db, now, items))).await
}

/// [`whole_batch`] as a plain function pointer for the write queue.
pub(crate) fn whole_batch_boxed<'c>(
    conn: &'c mut SqliteConnection,
    statements: &'c mut Statements,
    now: Millis,
    items: &'c [Item],
    news: &'c [NewItem],
    keyed: &'c [KeyedItem],
) -> BoxFuture<'c, Result<Whole>> {
    Box::pin(whole_batch(conn, statements, now, items, news, keyed))
}

/// Creates `news`, runs the idempotent starts `keyed` (each in a savepoint, so that one that
/// fails fails alone, as on the long way) and applies `items` in one transaction of its own, in
/// one borrowing of the handle: `BEGIN`, the rows, `COMMIT`. On `Err` nothing was committed;
/// the caller rolls back and takes the long way, which isolates a write that breaks a
/// statement.
pub(crate) async fn whole_batch(
    conn: &mut SqliteConnection,
    statements: &mut Statements,
    now: Millis,
    items: &[Item],
    news: &[NewItem],
    keyed: &[KeyedItem],
) -> Result<Whole> {
    with_statements(conn, statements, |db| {
        exec(db, "BEGIN IMMEDIATE", [])?;
        writer_rows::create(db, now, news)?;
        let starts = keyed_rows(db, now, keyed);
        let applied = writer_rows::apply(db, now, items)?;
        exec(db, "COMMIT", [])?;
        Ok((applied, starts, now))
    })
    .await
}
