//! How a writer task runs a batch: one transaction, the one-round path where the backend's
//! writer has one, savepoints for closures, the one-by-one fallback when a set-based statement
//! fails, and the replies once the commit returned.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{Database, Executor, Pool};

use super::batch::{Item, NewItem};
use super::schedule::{next_batch, Queue};
use super::{BatchWriter, Checkpoint, Job, Run, Tuning};
use crate::clock::Clock;
use crate::model::Millis;
use crate::store::idempotency::{IdempotentStart, KeyedItem};
use crate::store::rows::new_saga_record;
use crate::store::SqlxResultExt;
use crate::store::{Applied, Result, Saga, StoreError};

/// One writer task: takes batches from `queue` and runs them on a connection of `pool` with
/// `writer`, until the queue is closed.
pub(super) async fn writer<DB: Database, W: BatchWriter<DB>>(
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
                let idle = queue.idle();
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

/// The same failure for every write of a batch (errors are not `Clone`).
fn shared_failure(e: &StoreError) -> StoreError {
    StoreError::commit_failed(e.to_string(), e.is_transient())
}

/// Runs one of the queue's own statements (transaction control, savepoints, the checkpoint).
async fn exec<DB: Database>(conn: &mut DB::Connection, sql: &str) -> Result<()>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    conn.execute(sql).await.db()?;
    Ok(())
}
