//! Rate limiters (SPEC §14): an action that declares one takes a token before each attempt.
//!
//! The token is reserved in the database ([`FlowLog::take_token`](crate::store::FlowLog)):
//! the call goes at once, or its step waits for its reserved moment like a retry on a timer
//! (`RETRYING`, with `rate:<name>` in its row), the saga given back to the database meanwhile,
//! holding no worker and no lease. When the timer has passed, the step holds its token and
//! goes without taking another. A compensation takes none: undoing is never held back.

use saga_dsl::Phase;
use serde_json::json;

use super::driver::Driver;
use crate::model::{SagaStatus, StepStatus, RATE_WAIT};
use crate::store::{NewEvent, StoreError};

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
            if self.saga.steps[index].waiting_for.as_deref() == Some(waited.as_str()) {
                // Its reserved moment has come: the token is this call's.
                self.saga.steps[index].waiting_for = None;
                go.push((index, phase));
                continue;
            }
            let grant = self.inner.store.take_token(&limiter).await?;
            if grant.now_ok() {
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
            if step.branch_of().is_some() {
                step.retry_at = Some(grant.at);
            } else {
                self.saga.next_run_at = Some(grant.at);
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
}
