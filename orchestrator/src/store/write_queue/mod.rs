//! Group commit: the step-log writes of many in-flight sagas share one database transaction.
//!
//! Every write of the engine goes into a queue. A writer task takes the first write, then
//! every write already waiting (up to a batch limit), opens one transaction, runs them, and
//! commits once. SQLite has one writer; PostgreSQL several, so that one batch forms while
//! another commits (a saga has at most one write in flight, and its rows are fenced by its
//! lease, so concurrent batches never order one saga's writes). So:
//!
//! - with nothing else in flight a write is committed alone, at once: batching adds no latency;
//! - under load one commit (one fsync) carries many sagas' writes;
//! - engine transitions, new sagas and (where the backend has it) idempotent starts are
//!   written set-based (`write_queue::batch`): a handful of statements per batch, each saga's row
//!   still fenced by its own lease owner and epoch; other writes (a claim, a heartbeat) run as
//!   closures, each in its own `SAVEPOINT`;
//! - a write that fails (a lost lease, a constraint) fails alone: its savepoint is rolled back,
//!   or, if a set-based statement fails, the transitions are applied again one by one;
//! - no write is reported done before the commit that carries it returned: a caller that got
//!   `Ok` knows its write is durable.
//!
//! Here the queue's API ([`WriteQueue`]) and what it carries ([`Job`]); how writers take their
//! batches in [`schedule`], how a batch runs in [`execute`]. A backend gives the queue a
//! [`BatchWriter`], which writes the rows, and a [`Tuning`] ([`writer`]); the items both
//! backends' writers share are in [`batch`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sqlx::{Database, Executor, Pool};
use tokio::sync::{mpsc, oneshot};

pub(crate) mod batch;
mod execute;
mod schedule;
mod writer;

pub(crate) use writer::{BatchWriter, Checkpoint, Tuning, Whole};

use crate::clock::Clock;
use crate::model::Millis;
use crate::store::idempotency::{IdempotentStart, KeyedItem};
use crate::store::{
    Applied, Claimed, Lease, LeaseRequest, NewSaga, Result, Saga, StoreError, Transition,
};
use batch::{Item, NewItem};
use schedule::Queue;

/// A boxed future borrowing the writer's connection.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs a closure job's statements; answers whether they succeeded (else its savepoint is
/// rolled back).
type Run<DB> = Box<
    dyn for<'c> FnOnce(&'c mut <DB as Database>::Connection, Millis) -> BoxFuture<'c, bool> + Send,
>;

/// Reports to a closure job's caller once the outcome of the commit carrying it is known.
type Finish = Box<dyn FnOnce(Result<()>) + Send>;

/// A queued write.
// Keyed starts and closures go through the queue on SQLite only; PostgreSQL runs them in
// transactions of their own.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
enum Job<DB: Database> {
    /// An idempotent start, run with the others of its batch.
    Keyed {
        item: KeyedItem,
        reply: oneshot::Sender<Result<IdempotentStart>>,
    },
    /// A new saga, created with the others of its batch.
    Create {
        item: NewItem,
        reply: oneshot::Sender<Result<Saga>>,
    },
    /// Any statements, run in a savepoint.
    Closure { run: Run<DB>, finish: Finish },
    /// An engine transition, applied with the others of its batch.
    Apply {
        item: Item,
        reply: oneshot::Sender<Result<Applied>>,
    },
}

/// A queue of writes committed in groups by the writer tasks.
pub(crate) struct WriteQueue<DB: Database> {
    tx: mpsc::UnboundedSender<Job<DB>>,
    commits: Arc<AtomicU64>,
}

/// What a write hears once the writer tasks have stopped.
fn stopped() -> StoreError {
    StoreError::io("the step-log writer has stopped")
}

impl<DB: Database> WriteQueue<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Starts `tuning.writers` writer tasks over `pool`, each with a writer of its own made by
    /// `new_writer`.
    pub(crate) fn start<W: BatchWriter<DB>>(
        pool: Pool<DB>,
        tuning: Tuning,
        new_writer: impl Fn(&Pool<DB>) -> W,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let commits = Arc::new(AtomicU64::new(0));
        let queue = Queue::new(rx);
        for _ in 0..tuning.writers.max(1) {
            tokio::spawn(execute::writer(
                pool.clone(),
                new_writer(&pool),
                tuning,
                clock.clone(),
                queue.clone(),
                commits.clone(),
            ));
        }
        Self { tx, commits }
    }

    /// Commits made so far.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Applies one engine transition, group-committed with whatever else is queued.
    pub(crate) async fn apply(&self, lease: Lease, transition: Transition) -> Result<Applied> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job::Apply {
                item: (lease, transition),
                reply,
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Creates a saga (leased as `lease` asks, if given), group-committed.
    pub(crate) async fn create(&self, new: NewSaga, lease: Option<LeaseRequest>) -> Result<Saga> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job::Create {
                item: NewItem { new, lease },
                reply,
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Creates a saga already leased as `lease` asks (epoch 1), group-committed, with the
    /// lease granted.
    pub(crate) async fn create_leased(
        &self,
        new: NewSaga,
        lease: &LeaseRequest,
    ) -> Result<Claimed> {
        let saga = self.create(new, Some(lease.clone())).await?;
        Ok(Claimed {
            lease: Lease {
                saga_id: saga.id,
                owner: lease.owner.clone(),
                epoch: saga.lease_epoch,
            },
            saga,
        })
    }

    /// Runs an idempotent start, group-committed with whatever else is queued.
    #[cfg(feature = "sqlite")]
    pub(crate) async fn keyed(&self, item: KeyedItem) -> Result<IdempotentStart> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job::Keyed { item, reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs `f` inside a group-committed transaction and returns its result once committed.
    #[cfg(feature = "sqlite")]
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut DB::Connection, Millis) -> BoxFuture<'c, Result<T>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel();
        // The job's own result waits here until the commit decides what the caller hears.
        let slot = Arc::new(std::sync::Mutex::new(None::<Result<T>>));
        let written = slot.clone();
        let job = Job::<DB>::Closure {
            run: Box::new(move |conn, now| {
                Box::pin(async move {
                    let result = f(conn, now).await;
                    let ok = result.is_ok();
                    *written.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                    ok
                })
            }),
            finish: Box::new(move |commit: Result<()>| {
                let result = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                let answer = match (commit, result) {
                    (Err(e), _) => Err(e),
                    (Ok(()), Some(result)) => result,
                    (Ok(()), None) => Err(StoreError::io("a queued write never ran")),
                };
                let _ = reply.send(answer);
            }),
        };
        self.tx.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}
