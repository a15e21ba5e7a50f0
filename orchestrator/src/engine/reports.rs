//! Drivers of this process holding a saga whose call waits for its participant's callback, for
//! a moment before they give it back: a report that reaches this process's API meanwhile wakes
//! the driver, which goes on at once instead of parking the saga and claiming it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use uuid::Uuid;

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Reports(Mutex<HashMap<Uuid, Arc<Notify>>>);

impl Reports {
    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Arc<Notify>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches for a report for `saga` until the returned guard is dropped.
    pub(crate) fn watch(&self, saga: Uuid) -> Watch<'_> {
        let notify = self.lock().entry(saga).or_default().clone();
        Watch {
            reports: self,
            saga,
            notify,
        }
    }

    /// A report for `saga` was recorded: wakes its driver if one here watches.
    pub(crate) fn reported(&self, saga: Uuid) {
        if let Some(notify) = self.lock().get(&saga) {
            // Kept for a watch that has not started waiting yet.
            notify.notify_one();
        }
    }
}

/// A driver's watch for a report for its saga.
pub(crate) struct Watch<'a> {
    reports: &'a Reports,
    saga: Uuid,
    notify: Arc<Notify>,
}

impl Watch<'_> {
    /// Resolves once a report for the saga was recorded after the watch began.
    pub(crate) async fn reported(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.reports.lock().remove(&self.saga);
    }
}
