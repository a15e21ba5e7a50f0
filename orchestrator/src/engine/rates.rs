//! Rate limiters (SPEC §14): an action that declares one takes a token before each attempt.
//!
//! The token is reserved in the database ([`FlowLog::take_token`](crate::store::FlowLog)):
//! the call goes at once; or, with its moment at most [`HOLD`] away, the driver waits for it;
//! or its step waits for its reserved moment like a retry on a timer (`RETRYING`, with
//! `rate:<name>` in its row and the moment in `retry_at`), the saga given back to the database
//! meanwhile, holding no worker and no lease, and due again [`HOLD`] before the moment, so that
//! the claim's own delay does not make the call late (a late call would crowd the next
//! second's calls). Claimed again, the step holds its token: the driver waits for the moment
//! and calls without taking another. A compensation takes none: undoing is never held back.

use std::time::Duration;

use saga_dsl::Phase;
use serde_json::json;

use super::driver::Driver;
use crate::model::{SagaStatus, StepStatus, RATE_WAIT};
use crate::store::{NewEvent, StoreError};

/// How long before its reserved moment a waiting call's saga is due again, and the longest
/// wait for a moment a driver makes holding its worker.
pub(super) const HOLD: Duration = Duration::from_millis(100);

impl Driver {
    /// The calls of `starts` that may go now: each action of a rate-limited step takes its
    /// token, and one whose token is for later is parked until then instead (and left out).
    pub(super) async fn take_tokens(
        &mut self,
        starts: Vec<(usize, Phase)>,
    ) -> Result<Vec<(usize, Phase)>, StoreError> {
        let mut go = Vec::with_capacity(starts.len());
        for (index, phase) in starts {
            let limiter = match (phase, self.call_site(index).and_then(|c| c.rate_limiter())) {
                (Phase::Action, Some(limiter)) => limiter.to_owned(),
                _ => {
                    go.push((index, phase));
                    continue;
                }
            };
            let waited = format!("{RATE_WAIT}{limiter}");
            let step = &mut self.saga.steps[index];
            if step.waiting_for.as_deref() == Some(waited.as_str()) {
                // Claimed for its reserved moment: the token is this call's.
                step.waiting_for = None;
                let moment = step.retry_at;
                if step.branch_of().is_none() {
                    step.retry_at = None;
                }
                if let Some(moment) = moment {
                    self.wait_until(moment).await;
                }
                go.push((index, phase));
                continue;
            }
            let grant = self.inner.store.take_token(&limiter).await?;
            let hold = i64::try_from(HOLD.as_millis()).unwrap_or(i64::MAX);
            if grant.at - grant.now <= hold {
                self.wait_until(grant.at).await;
                go.push((index, phase));
                continue;
            }
            // Admitted and at work: a saga waiting for its first call's token runs.
            if self.saga.status == SagaStatus::Queued {
                self.saga.status = SagaStatus::Running;
            }
            let step = &mut self.saga.steps[index];
            step.action.status = StepStatus::Retrying;
            step.waiting_for = Some(waited);
            step.retry_at = Some(grant.at);
            if step.branch_of().is_none() {
                self.saga.next_run_at = Some(grant.at - hold);
            }
            let name = step.name.clone();
            self.rate_parked = true;
            self.push_update(index, phase, None);
            self.pending.events.push(NewEvent::step(
                "step.rate_limited",
                &name,
                json!({"limiter": limiter, "until": crate::model::rfc3339(grant.at),
                       "wait_ms": grant.at - grant.now}),
            ));
            metrics::counter!("saga_rate_limited_total", "limiter" => limiter).increment(1);
        }
        Ok(go)
    }

    /// Waits, holding the worker, until `moment` (milliseconds since the epoch) by this
    /// engine's clock; at most [`HOLD`] and a little, as callers ask.
    async fn wait_until(&self, moment: crate::model::Millis) {
        let wait = moment - self.inner.clock.now_ms();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
    }
}
