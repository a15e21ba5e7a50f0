//! Group commit: the step-log writes of many in-flight sagas share one database transaction.
//!
//! Every write of the engine goes into a queue as a *job* (a closure that runs its statements
//! on a connection it is lent). One writer task takes the first job, then every job already
//! waiting (up to a batch limit), opens one transaction, runs each job inside its own
//! `SAVEPOINT`, and commits once. So:
//!
//! - with nothing else in flight a job is committed alone, at once: batching adds no latency;
//! - under load one commit (one fsync) carries many sagas' transitions;
//! - a job that fails (a lost lease, a constraint) is rolled back to its savepoint and reported
//!   to its caller alone; the others in the batch still commit;
//! - no job is reported done before the commit that carries it returned: a caller that got
//!   `Ok` knows its write is durable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use sqlx::{Database, Executor, Pool};
use tokio::sync::{mpsc, oneshot};

use super::{Result, StoreError};
use crate::clock::Clock;
use crate::model::Millis;

/// A boxed future borrowing the writer's connection.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs a job's statements; answers whether they succeeded (else its savepoint is rolled back).
type Run<DB> = Box<
    dyn for<'c> FnOnce(&'c mut <DB as Database>::Connection, Millis) -> BoxFuture<'c, bool> + Send,
>;

/// Reports to the job's caller once the outcome of the commit carrying it is known.
type Finish = Box<dyn FnOnce(Result<()>) + Send>;

/// A queued write.
struct Job<DB: Database> {
    run: Run<DB>,
    finish: Finish,
}

/// The most jobs one transaction carries.
const MAX_BATCH: usize = 256;

/// A queue of writes committed in groups by one writer task.
pub(crate) struct WriteQueue<DB: Database> {
    tx: mpsc::UnboundedSender<Job<DB>>,
    commits: Arc<AtomicU64>,
}

impl<DB: Database> WriteQueue<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// Starts the writer task over `pool`; `begin` opens a write transaction (`BEGIN IMMEDIATE`
    /// on SQLite, so the write lock is taken up front).
    pub(crate) fn start(pool: Pool<DB>, begin: &'static str, clock: Arc<dyn Clock>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let commits = Arc::new(AtomicU64::new(0));
        tokio::spawn(writer(pool, begin, clock, rx, commits.clone()));
        Self { tx, commits }
    }

    /// Commits made so far.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
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
        let job = Job::<DB> {
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
                    (Ok(()), None) => Err(StoreError::Io("a queued write never ran".to_owned())),
                };
                let _ = reply.send(answer);
            }),
        };
        self.tx
            .send(job)
            .map_err(|_| StoreError::Io("the step-log writer has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| StoreError::Io("the step-log writer has stopped".to_owned()))?
    }
}

/// The same failure for every job of a batch (errors are not `Clone`).
fn shared_failure(e: &StoreError) -> StoreError {
    StoreError::CommitFailed {
        message: e.to_string(),
        transient: e.is_transient(),
    }
}

async fn exec<DB: Database>(conn: &mut DB::Connection, sql: &str) -> Result<()>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    conn.execute(sql).await?;
    Ok(())
}

async fn writer<DB: Database>(
    pool: Pool<DB>,
    begin: &'static str,
    clock: Arc<dyn Clock>,
    mut rx: mpsc::UnboundedReceiver<Job<DB>>,
    commits: Arc<AtomicU64>,
) where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut finishes = Vec::with_capacity(batch.len());
        let mut runs = Vec::with_capacity(batch.len());
        for job in batch {
            finishes.push(job.finish);
            runs.push(job.run);
        }
        match run_batch(&pool, begin, clock.now_ms(), runs).await {
            Ok(committed) => {
                if committed {
                    commits.fetch_add(1, Ordering::Relaxed);
                }
                for f in finishes {
                    f(Ok(()));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, jobs = finishes.len(), "group commit failed");
                for f in finishes {
                    f(Err(shared_failure(&e)));
                }
            }
        }
    }
}

/// Runs one batch in one transaction; `Ok(true)` if something was committed. A lone job runs
/// without a savepoint: if it fails, the transaction is rolled back and the job reports its own
/// error. On `Err`, nothing of the batch was committed.
async fn run_batch<DB: Database>(
    pool: &Pool<DB>,
    begin: &'static str,
    now: Millis,
    runs: Vec<Run<DB>>,
) -> Result<bool>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    let conn: &mut DB::Connection = &mut conn;
    exec::<DB>(conn, begin).await?;
    let result = run_jobs::<DB>(conn, now, runs).await;
    match result {
        Ok(true) => match exec::<DB>(conn, "COMMIT").await {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = exec::<DB>(conn, "ROLLBACK").await;
                Err(e)
            }
        },
        Ok(false) => {
            // Every job failed on its own: nothing to commit; each reports its own error.
            exec::<DB>(conn, "ROLLBACK").await?;
            Ok(false)
        }
        Err(e) => {
            let _ = exec::<DB>(conn, "ROLLBACK").await;
            Err(e)
        }
    }
}

/// Runs the jobs, each in its own savepoint when there are several; `Ok(any succeeded)`.
async fn run_jobs<DB: Database>(
    conn: &mut DB::Connection,
    now: Millis,
    runs: Vec<Run<DB>>,
) -> Result<bool>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let alone = runs.len() == 1;
    let mut any_ok = false;
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
    Ok(any_ok)
}
