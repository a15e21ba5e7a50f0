//! Callers in this process waiting for sagas to end, and which sagas this process drives.
//!
//! A caller waiting for a saga this process drives needs no read of the log: the driver tells
//! it the terminal status when it writes it, or wakes it to read the log if it stops driving
//! the saga short of an end (a long retry wait, a lost lease, shutdown).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;
use uuid::Uuid;

use crate::model::SagaStatus;

#[derive(Default)]
struct State {
    /// Per saga, the callers waiting for it to end.
    waiting: HashMap<Uuid, Vec<oneshot::Sender<SagaStatus>>>,
    /// Sagas a driver of this process holds, or is about to: their end is announced here.
    driven: HashSet<Uuid>,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Waiters(Mutex<State>);

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a waiter for `id`; returns its receiver and whether a driver of this process
    /// holds the saga (it will then be told, with no need to read the log).
    pub(crate) fn register(&self, id: Uuid) -> (oneshot::Receiver<SagaStatus>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        state.waiting.entry(id).or_default().push(tx);
        (rx, state.driven.contains(&id))
    }

    /// Drops the waiters of `id` whose callers stopped waiting.
    pub(crate) fn prune(&self, id: Uuid) {
        let mut state = self.lock();
        if let Some(list) = state.waiting.get_mut(&id) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                state.waiting.remove(&id);
            }
        }
    }

    /// A driver of this process is about to hold `id`.
    pub(crate) fn driving(&self, id: Uuid) {
        self.lock().driven.insert(id);
    }

    /// `id` reached `status`, a terminal status: tells its waiters.
    pub(crate) fn ended(&self, id: Uuid, status: SagaStatus) {
        let waiting = {
            let mut state = self.lock();
            state.driven.remove(&id);
            state.waiting.remove(&id)
        };
        for tx in waiting.into_iter().flatten() {
            let _ = tx.send(status);
        }
    }

    /// The store announced that `id` reached `status` (it may have ended in another process):
    /// tells its waiters, unless a driver of this process holds it. That driver tells them
    /// itself once it has its commit's answer and has freed its worker slot, which the
    /// announcement may overtake: a caller that starts its next saga on hearing of this one
    /// then finds the slot free. (A driver that stops short of telling wakes them anyway.)
    pub(crate) fn announced(&self, id: Uuid, status: SagaStatus) {
        if !self.lock().driven.contains(&id) {
            self.ended(id, status);
        }
    }

    /// No driver of this process holds `id` any more: its waiters are woken (their channel
    /// closes) to read the log and wait on.
    pub(crate) fn released(&self, id: Uuid) {
        let mut state = self.lock();
        if state.driven.remove(&id) {
            state.waiting.remove(&id);
        }
    }
}

/// Marks a saga as driven here while it lives (see [`Waiters::driving`]); its drop says the
/// driver stopped, whether it returned or panicked.
pub(crate) struct Driving<'a> {
    waiters: &'a Waiters,
    id: Uuid,
}

impl<'a> Driving<'a> {
    /// Marks `id` as driven here until the guard drops.
    pub(crate) fn new(waiters: &'a Waiters, id: Uuid) -> Self {
        waiters.driving(id);
        Self { waiters, id }
    }
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.waiters.released(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_is_left_to_the_driver_of_a_saga_driven_here() {
        let waiters = Waiters::default();
        let (here, other) = (Uuid::now_v7(), Uuid::now_v7());
        waiters.driving(here);
        let (mut rx_here, driven) = waiters.register(here);
        assert!(driven);
        let (mut rx_other, driven) = waiters.register(other);
        assert!(!driven);
        waiters.announced(here, SagaStatus::Completed);
        waiters.announced(other, SagaStatus::Compensated);
        assert!(
            rx_here.try_recv().is_err(),
            "the driver tells, not the store"
        );
        assert_eq!(rx_other.try_recv().unwrap(), SagaStatus::Compensated);
        waiters.ended(here, SagaStatus::Completed);
        assert_eq!(rx_here.try_recv().unwrap(), SagaStatus::Completed);
    }
}
