//! How the writer tasks take their batches from the queue ([`next_batch`]): as many writes as
//! wait, up to [`MAX_BATCH`], and a second writer only beside a busy one once enough wait
//! ([`Tuning::parallel_from`](super::Tuning::parallel_from)).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sqlx::Database;
use tokio::sync::mpsc;

use super::Job;

/// The most writes one transaction carries.
const MAX_BATCH: usize = 512;

/// How many writers are running a batch, and a signal when one finishes.
#[derive(Default)]
struct Turns {
    busy: std::sync::atomic::AtomicUsize,
    finished: tokio::sync::Notify,
}

/// Marks a writer busy with a batch until dropped.
pub(super) struct Busy<'a>(&'a Turns);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
        self.0.finished.notify_one();
    }
}

/// The queue as the writers share it: each writer task holds a clone.
pub(super) struct Queue<DB: Database> {
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Job<DB>>>>,
    turns: Arc<Turns>,
}

impl<DB: Database> Queue<DB> {
    /// The queue of the writes sent to `rx`, with no writer busy yet.
    pub(super) fn new(rx: mpsc::UnboundedReceiver<Job<DB>>) -> Self {
        Self {
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            turns: Arc::new(Turns::default()),
        }
    }

    /// Nothing waits, and no other writer is taking a batch.
    pub(super) fn idle(&self) -> bool {
        self.rx.try_lock().is_ok_and(|rx| rx.is_empty())
    }
}

impl<DB: Database> Clone for Queue<DB> {
    fn clone(&self) -> Self {
        Self {
            rx: self.rx.clone(),
            turns: self.turns.clone(),
        }
    }
}

/// Takes the next batch: the first write to come, then every write already waiting, up to
/// [`MAX_BATCH`]; `None` once the queue is closed. Writers take turns: one waits here while
/// another runs its batch, and starts its own beside it only once `parallel_from` writes
/// wait (else when the other finishes). The batch's writer is busy until the guard drops.
pub(super) async fn next_batch<'q, DB: Database>(
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

#[cfg(all(test, feature = "sqlite"))]
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
        (tx, Queue::new(rx))
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
