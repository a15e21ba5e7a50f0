//! A wait for a signal: it takes the signal if it has come, or starts waiting (`WAITING`,
//! with its timeout) and gives the saga back until the signal or the timeout comes; a timeout
//! takes the default payload or fails the stage. Nothing to undo.

use saga_dsl::{Phase, SignalWait};
use serde_json::json;

use super::{millis, system_time, Decision, Outcome, StageRules, Turn};
use crate::engine::driver::Driver;
use crate::model::{rfc3339, Millis, StepStatus};
use crate::store::{NewEvent, StoreError};

impl StageRules for SignalWait {
    async fn advance(&self, driver: &mut Driver, turn: Turn<'_>) -> Outcome {
        driver
            .decide_signal(turn.stage, self, turn.index, turn.now)
            .await
    }
}

impl Driver {
    /// Takes the signal a signal step waits for if it has come; otherwise starts waiting, or
    /// ends the wait when its timeout has passed (with the default payload, or failing).
    async fn decide_signal(
        &mut self,
        name: &str,
        wait: &SignalWait,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let signal = wait.signal().to_owned();
        let ctx = self.context(index, Phase::Action, 0);
        let pending = self.saga.steps[index].action.status == StepStatus::Pending;
        let received = self
            .inner
            .store
            .received_signal(self.saga.id, &signal)
            .await?;
        let payload = match received {
            Some(received) => received.payload,
            None if pending => {
                let deadline = wait
                    .deadline(&ctx, system_time(now))
                    .map(|d| d.and_then(millis))
                    .transpose();
                let deadline = match deadline {
                    Ok(deadline) => deadline,
                    Err(e) => {
                        let error = format!("its timeout failed: {}", e.message());
                        self.refuse(index, &error, now);
                        return Ok(Decision::Decided);
                    }
                };
                let record = &mut self.saga.steps[index];
                record.waiting_for = Some(signal.clone());
                record.timeout_at = deadline;
                self.start_waiting(index, now);
                let data = json!({"signal": signal, "timeout_at": deadline.map(rfc3339)});
                self.pending
                    .events
                    .push(NewEvent::step("step.waiting", name, data));
                return Ok(Decision::AwaitSignal(signal));
            }
            None => match self.saga.steps[index].timeout_at {
                Some(at) if at <= now => match wait.default_payload() {
                    Some(default) => default.clone(),
                    None => {
                        let error = format!("no signal {signal:?} came before the timeout");
                        self.refuse(index, &error, now);
                        return Ok(Decision::Decided);
                    }
                },
                // Woken for another reason; the signal has not come.
                _ => return Ok(Decision::AwaitSignal(signal)),
            },
        };
        if pending {
            self.saga.steps[index].action.started_at = Some(now);
            self.saga.steps[index].waiting_for = Some(signal.clone());
        }
        match wait.accept(&ctx, payload) {
            Ok(output) => {
                self.settle_without_call(index, StepStatus::Succeeded, Some(output), now);
                let data = json!({"signal": signal});
                self.pending
                    .events
                    .push(NewEvent::step("step.succeeded", name, data));
            }
            Err(e) => self.refuse(index, e.message(), now),
        }
        Ok(Decision::Decided)
    }

    /// Gives back a saga whose signal step waits, in two writes. The first gives the lease up
    /// with the saga due a lease's time to live from now: should this process die before the
    /// second, the saga is looked at again then. The second
    /// ([`Store::park_signal_wait`](crate::store::EngineLog::park_signal_wait)) makes it due at
    /// the timeout (or never), or now if the signal has come meanwhile. A sender locks the
    /// saga's row and makes it due if its step waits: so whichever of the two comes first, the
    /// signal is taken.
    pub(in crate::engine) async fn await_signal(&mut self, signal: &str) -> Result<(), StoreError> {
        let now = self.now();
        let deadline = self.saga.steps.iter().find_map(|s| {
            (s.action.status == StepStatus::Waiting && s.waiting_for.as_deref() == Some(signal))
                .then_some(s.timeout_at)
                .flatten()
        });
        let ttl = self.inner.config.lease_ttl_ms();
        let recheck = now.saturating_add(ttl);
        let recheck = deadline.map_or(recheck, |d| d.min(recheck));
        let (store, id) = (self.inner.store.clone(), self.saga.id);
        self.give_back_and_park(recheck, || {
            store.park_signal_wait(id, signal, recheck, deadline)
        })
        .await
    }
}
