//! Rate limiters (SPEC §14): an action that declares one takes a token before each attempt.
//!
//! The token is reserved in the database ([`FlowLog::take_token`](crate::store::FlowLog)):
//! the call goes at once; or, with its moment at most [`HOLD`] away, the driver waits for it;
//! or its step waits for its reserved moment like a retry on a timer (`RETRYING`, with
//! `rate:<name>` in its row and the moment in `retry_at`), the saga given back to the database
//! meanwhile, holding no worker and no lease, and due again [`HOLD`] before the moment, so that
//! the claim's own delay does not make the call late (a late call would crowd the next
//! second's calls). Claimed again, the step holds its token: the driver waits for the moment
//! and calls without taking another — unless the moment is still more than [`HOLD`] away (a
//! resume or a retry woke it early: it parks again) or more than [`HOLD`] past (its saga was
//! not claimed in time: the reservation lapsed and it takes a new token, so that calls made
//! late never crowd one second). A compensation takes none: undoing is never held back.

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
            let hold = i64::try_from(HOLD.as_millis()).unwrap_or(i64::MAX);
            let step = &mut self.saga.steps[index];
            if step.waiting_for.as_deref() == Some(waited.as_str()) {
                let moment = step.retry_at;
                step.waiting_for = None;
                if step.branch_of().is_none() {
                    step.retry_at = None;
                }
                let now = self.inner.clock.now_ms();
                match moment {
                    // Claimed for its reserved moment: the token is this call's.
                    Some(moment) if moment >= now - hold && moment - now <= hold => {
                        if self.wait_ms(moment - now).await {
                            go.push((index, phase));
                        } else {
                            self.park_for_token(index, &limiter, moment, now);
                        }
                        continue;
                    }
                    // Woken long before it (a resume, a retry asked now, a rate lowered
                    // meanwhile): wait for it again without a worker.
                    Some(moment) if moment - now > hold => {
                        self.park_for_token(index, &limiter, moment, now);
                        continue;
                    }
                    // Long past (its saga was paused, or no worker was free): the reservation
                    // lapsed, and a new token is taken, so that calls made late never crowd
                    // one second.
                    _ => {}
                }
            }
            let grant = self.inner.store.take_token(&limiter).await?;
            // By the database's clock, which reserved the moment.
            let wait = grant.at - grant.now;
            if wait <= hold && self.wait_ms(wait).await {
                go.push((index, phase));
                continue;
            }
            self.park_for_token(index, &limiter, grant.at, grant.now);
        }
        Ok(go)
    }

    /// Waits `ms` milliseconds holding the worker (at most [`HOLD`], as callers ask); `false`
    /// if the engine began to stop meanwhile, and the call must not go.
    async fn wait_ms(&self, ms: crate::model::Millis) -> bool {
        if ms <= 0 {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms as u64)) => true,
            _ = self.stop.cancelled() => false,
        }
    }

    /// Parks row `index`'s action until `moment`, its reserved token's (`now` the clock that
    /// reserved it): `RETRYING` with `rate:<limiter>` and the moment in its row, the saga due
    /// [`HOLD`] before it (a branch at it, by its own timer) and given back.
    fn park_for_token(
        &mut self,
        index: usize,
        limiter: &str,
        moment: crate::model::Millis,
        now: crate::model::Millis,
    ) {
        let hold = i64::try_from(HOLD.as_millis()).unwrap_or(i64::MAX);
        // Admitted and at work: a saga waiting for its first call's token runs.
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let step = &mut self.saga.steps[index];
        step.action.status = StepStatus::Retrying;
        step.waiting_for = Some(format!("{RATE_WAIT}{limiter}"));
        step.retry_at = Some(moment);
        if step.branch_of().is_none() {
            self.saga.next_run_at = Some(moment - hold);
        }
        let name = step.name.clone();
        self.rate_parked = true;
        self.push_update(index, Phase::Action, None);
        self.pending.events.push(NewEvent::step(
            "step.rate_limited",
            &name,
            json!({"limiter": limiter, "until": crate::model::rfc3339(moment),
                   "wait_ms": moment - now}),
        ));
        metrics::counter!("saga_rate_limited_total", "limiter" => limiter.to_owned()).increment(1);
    }
}
