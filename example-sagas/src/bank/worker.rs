//! The bank's background work: settling transfers when their time comes, and reporting each
//! outcome to the task URLs that asked for it, with backoff until one answers.
//!
//! Everything it works from is in the database (a transfer's `settle_at`, a callback's
//! `next_at`), so a restarted bank resumes where the last one stopped. A callback being sent is
//! leased (its `next_at` pushed past the request's timeout) so that it is not sent twice at once;
//! a bank stopped mid-request sends it again once the lease runs out.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::now_ms;
use super::store::{BankStore, CallbackState, DueCallback, TransferStatus};

/// How long one callback request may take.
pub(super) const CALLBACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The first delay before a callback is sent again; it doubles with each failure.
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest delay between two attempts of a callback.
const MAX_RETRY: Duration = Duration::from_secs(5);
/// How long the worker sleeps at most, so that a failed database read is tried again soon.
const MAX_IDLE: Duration = Duration::from_secs(1);

/// The error a refused transfer reports to its task.
pub const REFUSED_ERROR: &str = "the bank rejected the transfer";

/// What the worker needs.
pub(super) struct Worker {
    pub store: BankStore,
    pub client: reqwest::Client,
    pub callback_token: Option<String>,
    pub wake: Arc<Notify>,
}

impl Worker {
    /// Settles and calls back until `shutdown`; callbacks in flight then are dropped, to be
    /// sent again by the next bank on this database.
    pub async fn run(self, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let mut in_flight: HashSet<(String, String)> = HashSet::new();
        let mut sending = JoinSet::new();
        loop {
            let now = now_ms();
            if let Err(e) = this.store.settle_due(now).await {
                tracing::warn!(error = %e, "the bank cannot settle its due transfers");
            }
            let lease_until = now + millis(CALLBACK_TIMEOUT) + millis(FIRST_RETRY);
            match this.store.take_due_callbacks(now, lease_until).await {
                Ok(due) => {
                    for callback in due {
                        let id = (callback.key.clone(), callback.task_url.clone());
                        if in_flight.insert(id.clone()) {
                            let this = this.clone();
                            sending.spawn(async move {
                                this.deliver(&callback).await;
                                id
                            });
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "the bank cannot read its due callbacks"),
            }
            let idle = match this.store.next_due().await {
                Ok(Some(at)) => {
                    Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)).min(MAX_IDLE)
                }
                Ok(None) => MAX_IDLE,
                Err(e) => {
                    tracing::warn!(error = %e, "the bank cannot read when work is next due");
                    MAX_IDLE
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = this.wake.notified() => {}
                () = tokio::time::sleep(idle) => {}
                Some(done) = sending.join_next() => {
                    if let Ok(id) = done {
                        in_flight.remove(&id);
                    }
                }
            }
        }
        sending.abort_all();
    }

    /// Sends one callback and records how it went.
    async fn deliver(&self, callback: &DueCallback) {
        let (path, body) = match callback.status {
            TransferStatus::Refused => (
                "fail",
                json!({ "error": REFUSED_ERROR, "retryable": false }),
            ),
            // Only settled transfers are due; a pending one is never sent.
            TransferStatus::Transferred | TransferStatus::Pending => (
                "complete",
                json!({ "output": {
                    "transfer_id": callback.transfer_id,
                    "amount": callback.amount,
                } }),
            ),
        };
        let mut request = self
            .client
            .post(format!("{}/{path}", callback.task_url))
            .timeout(CALLBACK_TIMEOUT)
            .json(&body);
        if let Some(token) = &self.callback_token {
            request = request.bearer_auth(token);
        }
        let (state, status) = match request.send().await {
            Ok(response) if response.status().is_success() => {
                (CallbackState::Delivered, Some(response.status().as_u16()))
            }
            Ok(response) if matches!(response.status().as_u16(), 404 | 409) => {
                // The task is unknown or its attempt is no longer current: no answer will
                // ever be taken, so sending again would only knock on a closed door.
                (CallbackState::Stopped, Some(response.status().as_u16()))
            }
            Ok(response) => (CallbackState::Pending, Some(response.status().as_u16())),
            // The task URL is not logged: it carries the task's token.
            Err(e) => {
                tracing::debug!(key = %callback.key, error = %e.without_url(), "callback failed");
                (CallbackState::Pending, None)
            }
        };
        let next_at = now_ms() + millis(retry_delay(callback.attempts));
        match state {
            CallbackState::Pending => {
                tracing::debug!(key = %callback.key, ?status, "callback not taken; sent again later");
            }
            CallbackState::Delivered | CallbackState::Stopped => {
                tracing::info!(key = %callback.key, ?state, ?status, "callback over");
            }
        }
        if let Err(e) = self
            .store
            .record_callback(callback, state, next_at, status)
            .await
        {
            // The lease runs out and the callback is sent again: at least once, never lost.
            tracing::warn!(key = %callback.key, error = %e, "cannot record a callback's outcome");
        }
        self.wake.notify_one();
    }
}

/// The delay after the failed attempt number `attempts` (0 for the first).
fn retry_delay(attempts: i64) -> Duration {
    let doublings = u32::try_from(attempts.clamp(0, 16)).unwrap_or(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_from_the_first_up_to_the_cap() {
        assert_eq!(retry_delay(0), FIRST_RETRY);
        assert_eq!(retry_delay(1), FIRST_RETRY * 2);
        assert_eq!(retry_delay(3), FIRST_RETRY * 8);
        assert_eq!(retry_delay(40), MAX_RETRY);
    }
}
