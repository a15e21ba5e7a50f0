//! What the write queue asks of a backend: a [`BatchWriter`], which writes a batch's rows on a
//! connection, and the [`Tuning`] of the writer tasks that run it.
//!
//! Each backend implements the writer once (the SQLite store in `sqlite/writer.rs`, the
//! PostgreSQL store in `postgres/writer.rs`) and gives its tuning when it starts the queue. The
//! queue itself decides what goes in which transaction, and when a caller hears the result.

use std::future::Future;

use sqlx::Database;

use super::batch::{Item, NewItem};
use crate::model::Millis;
use crate::store::idempotency::{IdempotentStart, KeyedItem};
use crate::store::{Applied, Result, StoreError};

/// What a one-round batch ([`BatchWriter::whole`]) did: each transition's result, each
/// idempotent start's result, and the batch's time.
pub(crate) type Whole = (Vec<Result<Applied>>, Vec<Result<IdempotentStart>>, Millis);

/// Writes the rows of a batch on one connection, set-based (see [`super::batch`]).
///
/// One value per writer task, made when the task starts: it keeps whatever it wants to reuse
/// from one batch to the next on that task's connections (the SQLite store its prepared
/// statements; the PostgreSQL store nothing, its driver caches them). Each method returns a
/// future that is `Send`, for the writer tasks are spawned on the runtime; none is boxed.
pub(crate) trait BatchWriter<DB: Database>: Send + 'static {
    /// Opens the batch's write transaction on `conn` (SQLite: `BEGIN IMMEDIATE`, taking the
    /// write lock up front). Returns the database's time if the batch runs on the database
    /// clock (read in the same round trip), or `None` for the process's clock.
    fn begin(
        &mut self,
        conn: &mut DB::Connection,
    ) -> impl Future<Output = Result<Option<Millis>>> + Send;

    /// Applies transitions at `now` inside the open transaction, atomically: on `Err` nothing
    /// of the call remains and the transaction goes on, so the queue can apply them again one
    /// by one. `shared` says whether other writes share the transaction (if not, the call may
    /// rely on the transaction's rollback instead of a savepoint of its own). One result per
    /// item, in order.
    fn apply(
        &mut self,
        conn: &mut DB::Connection,
        now: Millis,
        items: &[Item],
        shared: bool,
    ) -> impl Future<Output = Result<Vec<Result<Applied>>>> + Send;

    /// Creates sagas at `now` inside the open transaction, atomically like
    /// [`apply`](Self::apply).
    fn create(
        &mut self,
        conn: &mut DB::Connection,
        now: Millis,
        news: &[NewItem],
        shared: bool,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Runs idempotent starts at `now` inside the open transaction, atomically for each start
    /// (its key, saga and callback are written together or not at all); one result per start,
    /// in order. On `Err` nothing of the call remains.
    ///
    /// A backend whose store sends its idempotent starts through the queue implements it (the
    /// SQLite store, whose one writer connection would otherwise run them one by one); by
    /// default each start is refused.
    fn keyed(
        &mut self,
        conn: &mut DB::Connection,
        now: Millis,
        items: &[KeyedItem],
    ) -> impl Future<Output = Result<Vec<Result<IdempotentStart>>>> + Send {
        let _ = (conn, now);
        let refused = items
            .iter()
            .map(|_| {
                Err(StoreError::io(
                    "this store does not queue idempotent starts",
                ))
            })
            .collect();
        std::future::ready(Ok(refused))
    }

    /// Creates `news`, runs the idempotent starts `keyed` and applies `items` in one
    /// transaction of its own, in one round trip, at `now` or (a backend on the database clock)
    /// at its own time. Only for batches without closures.
    ///
    /// `None`: this writer cannot write this batch in one round, and the queue takes the long
    /// way (the default, for every batch). `Some(Err)`: nothing was committed, though a
    /// transaction may still be open; the queue rolls back and takes the long way, which
    /// isolates a write that breaks a statement.
    fn whole(
        &mut self,
        conn: &mut DB::Connection,
        now: Millis,
        items: &[Item],
        news: &[NewItem],
        keyed: &[KeyedItem],
    ) -> impl Future<Output = Option<Result<Whole>>> + Send {
        let _ = (conn, now, items, news, keyed);
        std::future::ready(None)
    }
}

/// How the queue runs a backend's writers: given by each backend when it starts the queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// How many writer tasks take batches from the queue, each with its own connection and its
    /// own [`BatchWriter`].
    pub(crate) writers: usize,
    /// A writer starts a batch while another runs one only once at least this many writes
    /// wait: a second transaction beside the first pays off when the first writer cannot keep
    /// up, and otherwise only splits the batch in two (twice the commits for the same work).
    pub(crate) parallel_from: usize,
    /// Keep the connection between batches instead of returning it to the pool (which may test
    /// it on every acquire); it goes back after a failed batch, so a broken one is replaced.
    /// Only where the pool has connections to spare: SQLite's one writer is shared.
    pub(crate) keep_connection: bool,
    /// A statement the writer runs between batches, outside any transaction (SQLite: a WAL
    /// checkpoint by the writer itself).
    pub(crate) checkpoint: Option<Checkpoint>,
}

/// A statement a writer runs between batches now and then ([`Tuning::checkpoint`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checkpoint {
    /// The statement.
    pub(crate) sql: &'static str,
    /// Run once this many commits were made since the last run and nothing waits, or at four
    /// times as many whether anything waits or not.
    pub(crate) every: u32,
}
