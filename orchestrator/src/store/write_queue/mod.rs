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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Executor, Pool};
use tokio::sync::{mpsc, oneshot};

pub(crate) mod batch;
mod writer;

pub(crate) use writer::{BatchWriter, Checkpoint, Tuning, Whole};

use crate::clock::Clock;
use crate::model::Millis;
use crate::store::idempotency::{IdempotentStart, KeyedItem};
use crate::store::rows::new_saga_record;
use crate::store::SqlxResultExt;
use crate::store::{
    Applied, Claimed, Lease, LeaseRequest, NewSaga, Result, Saga, StoreError, Transition,
};
use batch::{Item, NewItem};

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

/// The most writes one transaction carries.
const MAX_BATCH: usize = 512;

/// How many writers are running a batch, and a signal when one finishes.
#[derive(Default)]
struct Turns {
    busy: std::sync::atomic::AtomicUsize,
    finished: tokio::sync::Notify,
}

/// Marks a writer busy with a batch until dropped.
struct Busy<'a>(&'a Turns);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        self.0.finished.notify_one();
    }
}

/// A queue of writes committed in groups by the writer tasks.
pub(crate) struct WriteQueue<DB: Database> {
    tx: mpsc::UnboundedSender<Job<DB>>,
    commits: Arc<AtomicU64>,
}

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
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let turns = Arc::new(Turns::default());
        for _ in 0..tuning.writers.max(1) {
            tokio::spawn(writer(
                pool.clone(),
                new_writer(&pool),
                tuning,
                clock.clone(),
                Queue {
                    rx: rx.clone(),
                    turns: turns.clone(),
                },
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
    pub(crate) async fn keyed(&self, item: KeyedItem) -> Result<IdempotentStart> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job::Keyed { item, reply })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs `f` inside a group-committed transaction and returns its result once committed.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut DB::Connection, Millis) -> BoxFuture<'c, Result<T>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel();
        // The job's own result waits here until the commit decides what the caller hears.
        let slot = Arc::new(Mutex::new(None::<Result<T>>));
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

/// The same failure for every write of a batch (errors are not `Clone`).
fn shared_failure(e: &StoreError) -> StoreError {
    StoreError::commit_failed(e.to_string(), e.is_transient())
}

async fn exec<DB: Database>(conn: &mut DB::Connection, sql: &str) -> Result<()>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    conn.execute(sql).await.db()?;
    Ok(())
}

/// The queue as the writers share it.
struct Queue<DB: Database> {
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Job<DB>>>>,
    turns: Arc<Turns>,
}

/// Takes the next batch: the first write to come, then every write already waiting, up to
/// [`MAX_BATCH`]; `None` once the queue is closed. Writers take turns: one waits here while
/// another runs its batch, and starts its own beside it only once `parallel_from` writes
/// wait (else when the other finishes). The batch's writer is busy until the guard drops.
async fn next_batch<'q, DB: Database>(
    queue: &'q Queue<DB>,
    parallel_from: usize,
) -> Option<(Vec<Job<DB>>, Busy<'q>)> {
    let turns = &*queue.turns;
    let mut rx = queue.rx.lock().await;
    let first = rx.recv().await?;
    let mut jobs = vec![first];
    loop {
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        // A writer finishing between this check and the wait below still wakes us: with
        // nobody waiting yet, `notify_one` keeps its permit for the next wait.
        let finished = turns.finished.notified();
        if turns.busy.load(Ordering::Acquire) == 0
            || jobs.len() >= parallel_from
            || jobs.len() >= MAX_BATCH
        {
            break;
        }
        tokio::select! {
            _ = finished => {}
            job = rx.recv() => match job {
                Some(job) => jobs.push(job),
                None => break,
            },
        }
    }
    turns.busy.fetch_add(1, Ordering::AcqRel);
    Some((jobs, Busy(turns)))
}

/// One writer task: takes batches from `queue` and runs them on a connection of `pool` with
/// `writer`, until the queue is closed.
async fn writer<DB: Database, W: BatchWriter<DB>>(
    pool: Pool<DB>,
    mut writer: W,
    tuning: Tuning,
    clock: Arc<dyn Clock>,
    queue: Queue<DB>,
    commits: Arc<AtomicU64>,
) where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut held: Option<PoolConnection<DB>> = None;
    let mut since_checkpoint = 0;
    while let Some((jobs, busy)) = next_batch(&queue, tuning.parallel_from).await {
        let mut runs = Vec::new();
        let mut finishes = Vec::new();
        let mut items = Vec::new();
        let mut replies = Vec::new();
        let mut news = Vec::new();
        let mut created = Vec::new();
        let mut keyed = Vec::new();
        let mut keyed_replies = Vec::new();
        for job in jobs {
            match job {
                Job::Keyed { item, reply } => {
                    keyed.push(item);
                    keyed_replies.push(reply);
                }
                Job::Create { item, reply } => {
                    news.push(item);
                    created.push(reply);
                }
                Job::Closure { run, finish } => {
                    runs.push(run);
                    finishes.push(finish);
                }
                Job::Apply { item, reply } => {
                    items.push(item);
                    replies.push(reply);
                }
            }
        }
        let mut conn = match held.take() {
            Some(conn) => Ok(conn),
            None => pool.acquire().await.map_err(StoreError::from_sqlx),
        };
        let batch = Batch {
            runs,
            items: &items,
            news: &news,
            keyed: &keyed,
        };
        let outcome = match &mut conn {
            Ok(conn) => run_batch(conn, &mut writer, &*clock, batch).await,
            Err(e) => Err(shared_failure(e)),
        };
        let ok = outcome.is_ok();
        match outcome {
            Ok(Outcome {
                committed,
                applied,
                creates,
                starts,
            }) => {
                if committed {
                    since_checkpoint += 1;
                    commits.fetch_add(1, Ordering::Relaxed);
                }
                for f in finishes {
                    f(Ok(()));
                }
                for (reply, result) in replies.into_iter().zip(applied) {
                    let _ = reply.send(result);
                }
                for ((reply, item), result) in created.into_iter().zip(news).zip(creates) {
                    let _ = reply.send(result.map(|now| created_record(item, now)));
                }
                for (reply, result) in keyed_replies.into_iter().zip(starts) {
                    let _ = reply.send(result);
                }
            }
            Err(e) => {
                let writes = finishes.len() + replies.len() + created.len() + keyed_replies.len();
                tracing::warn!(error = %e, writes, "group commit failed");
                for f in finishes {
                    f(Err(shared_failure(&e)));
                }
                for reply in replies {
                    let _ = reply.send(Err(shared_failure(&e)));
                }
                for reply in created {
                    let _ = reply.send(Err(shared_failure(&e)));
                }
                for reply in keyed_replies {
                    let _ = reply.send(Err(shared_failure(&e)));
                }
            }
        }
        // Answered: another writer may start a batch of any size.
        drop(busy);
        if let Ok(mut conn) = conn {
            // After the replies: the callers do not wait for it.
            if let Some(Checkpoint { sql, every }) = tuning.checkpoint {
                // Idle: nothing waiting (and no other writer taking a batch).
                let idle = queue.rx.try_lock().is_ok_and(|rx| rx.is_empty());
                if (since_checkpoint >= every && idle) || since_checkpoint >= 4 * every {
                    since_checkpoint = 0;
                    if let Err(e) = exec::<DB>(&mut conn, sql).await {
                        tracing::debug!(error = %e, "checkpoint after a batch failed");
                    }
                }
            }
            if tuning.keep_connection && ok {
                held = Some(conn);
            }
        }
    }
}

/// The writes of one batch, by kind.
struct Batch<'a, DB: Database> {
    runs: Vec<Run<DB>>,
    items: &'a [Item],
    news: &'a [NewItem],
    keyed: &'a [KeyedItem],
}

/// What a batch did.
struct Outcome {
    /// Anything committed.
    committed: bool,
    /// Each transition's result.
    applied: Vec<Result<Applied>>,
    /// Each creation's time, or its error.
    creates: Vec<Result<Millis>>,
    /// Each idempotent start's result.
    starts: Vec<Result<IdempotentStart>>,
}

/// The record of a saga just created, with the lease it was created under.
fn created_record(item: NewItem, now: Millis) -> Saga {
    new_saga_record(item.new, now, item.lease.map(|l| l.owner))
}

/// Runs one batch in one transaction. On `Err` nothing of the batch was committed.
async fn run_batch<DB: Database, W: BatchWriter<DB>>(
    conn: &mut DB::Connection,
    writer: &mut W,
    clock: &dyn Clock,
    batch: Batch<'_, DB>,
) -> Result<Outcome>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if batch.runs.is_empty() {
        match writer
            .whole(conn, clock.now_ms(), batch.items, batch.news, batch.keyed)
            .await
        {
            None => {}
            Some(Ok((applied, starts, now))) => {
                return Ok(Outcome {
                    committed: true,
                    applied,
                    creates: batch.news.iter().map(|_| Ok(now)).collect(),
                    starts,
                })
            }
            Some(Err(e)) => {
                // Nothing of it committed; the long way isolates the write at fault.
                let _ = exec::<DB>(conn, "ROLLBACK").await;
                tracing::debug!(error = %e, "one-round batch failed; taking the long way");
            }
        }
    }
    let now = match writer.begin(conn).await {
        Ok(db_now) => db_now.unwrap_or_else(|| clock.now_ms()),
        Err(e) => {
            // In case the transaction opened before the failure.
            let _ = exec::<DB>(conn, "ROLLBACK").await;
            return Err(e);
        }
    };
    match run_jobs(conn, writer, now, batch).await {
        Ok(outcome) if outcome.committed => match exec::<DB>(conn, "COMMIT").await {
            Ok(()) => Ok(outcome),
            Err(e) => {
                let _ = exec::<DB>(conn, "ROLLBACK").await;
                Err(e)
            }
        },
        Ok(outcome) => {
            // Nothing succeeded: nothing to commit; each write reports its own error.
            exec::<DB>(conn, "ROLLBACK").await?;
            Ok(outcome)
        }
        Err(e) => {
            let _ = exec::<DB>(conn, "ROLLBACK").await;
            Err(e)
        }
    }
}

/// Runs the creates, the idempotent starts, the closures (each in a savepoint when the batch
/// holds several writes) and the transitions; `committed` in the outcome says whether any of
/// them wrote something.
async fn run_jobs<DB: Database, W: BatchWriter<DB>>(
    conn: &mut DB::Connection,
    writer: &mut W,
    now: Millis,
    batch: Batch<'_, DB>,
) -> Result<Outcome>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let Batch {
        runs,
        items,
        news,
        keyed,
    } = batch;
    let alone = runs.len() + items.len() + news.len() + keyed.len() == 1;
    let mut any_ok = false;
    let creates = create_all(conn, writer, now, news, alone).await?;
    any_ok |= creates.iter().any(Result::is_ok);
    let starts = if keyed.is_empty() {
        Vec::new()
    } else {
        writer.keyed(conn, now, keyed).await?
    };
    any_ok |= starts.iter().any(Result::is_ok);
    for run in runs {
        if !alone {
            exec::<DB>(conn, "SAVEPOINT job").await?;
        }
        let ok = run(conn, now).await;
        any_ok |= ok;
        if !alone {
            if !ok {
                exec::<DB>(conn, "ROLLBACK TO SAVEPOINT job").await?;
            }
            exec::<DB>(conn, "RELEASE SAVEPOINT job").await?;
        }
    }
    if items.is_empty() {
        return Ok(Outcome {
            committed: any_ok,
            applied: Vec::new(),
            creates,
            starts,
        });
    }
    let applied = match writer.apply(conn, now, items, !alone).await {
        Ok(applied) => applied,
        // Alone: its statement error is its own (the transaction is then rolled back, nothing
        // else being in it).
        Err(e) if alone => vec![Err(e)],
        Err(e) => {
            // One transition broke a statement: apply them one by one so it fails alone.
            tracing::debug!(error = %e, "set-based apply failed; applying one by one");
            let mut applied = Vec::with_capacity(items.len());
            for item in items {
                match writer
                    .apply(conn, now, std::slice::from_ref(item), true)
                    .await
                {
                    Ok(mut one) => applied.push(
                        one.pop()
                            .unwrap_or(Err(StoreError::LeaseLost(item.0.saga_id))),
                    ),
                    Err(e) => applied.push(Err(e)),
                }
            }
            applied
        }
    };
    any_ok |= applied.iter().any(|r| matches!(r, Ok(Applied::Written)));
    Ok(Outcome {
        committed: any_ok,
        applied,
        creates,
        starts,
    })
}

/// Creates the batch's new sagas set-based; if that fails (an id collision), one by one so the
/// bad one fails alone. Each result is the creation time.
async fn create_all<DB: Database, W: BatchWriter<DB>>(
    conn: &mut DB::Connection,
    writer: &mut W,
    now: Millis,
    news: &[NewItem],
    alone: bool,
) -> Result<Vec<Result<Millis>>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if news.is_empty() {
        return Ok(Vec::new());
    }
    if alone {
        // Its error is its own; the transaction is then rolled back.
        return Ok(vec![writer
            .create(conn, now, news, false)
            .await
            .map(|()| now)]);
    }
    match writer.create(conn, now, news, true).await {
        Ok(()) => Ok(news.iter().map(|_| Ok(now)).collect()),
        Err(e) => {
            tracing::debug!(error = %e, "set-based create failed; creating one by one");
            let mut out = Vec::with_capacity(news.len());
            for item in news {
                let one = writer
                    .create(conn, now, std::slice::from_ref(item), true)
                    .await;
                out.push(one.map(|()| now));
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that does nothing, for the queue's bookkeeping alone.
    fn job() -> Job<sqlx::Sqlite> {
        Job::Closure {
            run: Box::new(|_, _| Box::pin(async { true })),
            finish: Box::new(|_| {}),
        }
    }

    fn queue() -> (
        mpsc::UnboundedSender<Job<sqlx::Sqlite>>,
        Queue<sqlx::Sqlite>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queue = Queue {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            turns: Arc::new(Turns::default()),
        };
        (tx, queue)
    }

    #[tokio::test]
    async fn an_idle_queue_hands_over_whatever_waits() {
        let (tx, queue) = queue();
        for _ in 0..3 {
            tx.send(job()).ok().unwrap();
        }
        let (jobs, _busy) = next_batch(&queue, 32).await.unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!(queue.turns.busy.load(Ordering::Acquire), 1);
    }

    #[tokio::test]
    async fn a_second_writer_waits_for_the_first_unless_enough_writes_wait() {
        let (tx, queue) = queue();
        tx.send(job()).ok().unwrap();
        let (_, first) = next_batch(&queue, 4).await.unwrap();
        // While the first writer runs its batch, a small batch does not start beside it...
        for _ in 0..2 {
            tx.send(job()).ok().unwrap();
        }
        let second = next_batch(&queue, 4);
        tokio::pin!(second);
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), &mut second).await;
        assert!(early.is_err(), "a batch of 2 started beside a busy writer");
        // ...but one of `parallel_from` writes does.
        for _ in 0..2 {
            tx.send(job()).ok().unwrap();
        }
        let (jobs, _second) = second.await.unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!(queue.turns.busy.load(Ordering::Acquire), 2);
        drop(first);
    }

    #[tokio::test]
    async fn a_waiting_writer_takes_its_small_batch_once_the_other_finishes() {
        let (tx, queue) = queue();
        tx.send(job()).ok().unwrap();
        let (_, first) = next_batch(&queue, 32).await.unwrap();
        tx.send(job()).ok().unwrap();
        let second = next_batch(&queue, 32);
        tokio::pin!(second);
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), &mut second).await;
        assert!(early.is_err());
        drop(first);
        let (jobs, _second) = second.await.unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(queue.turns.busy.load(Ordering::Acquire), 1);
    }
}
