//! Steps decided without a call: a condition that is false, a sleep, a wait for a signal, a
//! parallel group that starts or ends. What they change is kept in the driver's memory and
//! written with whatever comes next: nothing outside the log happened.

use std::sync::Arc;
use std::time::Duration;

use saga_dsl::{Group, Phase, SignalWait, Sleep, StageBody, StepError};
use serde_json::{json, Value};

use super::driver::Driver;
use super::plan;
use crate::model::{rfc3339, Millis, PhaseRecord, SagaStatus, StepKind, StepRecord, StepStatus};
use crate::store::rows::comp_status_for;
use crate::store::{NewEvent, NewStep, StoreError};

/// What [`Driver::decide`] found for a step that may not need a call.
pub(super) enum Decision {
    /// The step calls its action.
    Call,
    /// The step was decided without a call.
    Decided,
    /// The step waits for this signal: give the saga back until it comes.
    AwaitSignal(String),
    /// The stage waits for its child saga, last seen in `seen`, to end: give the saga back
    /// until it does.
    AwaitChild {
        /// The child.
        child: uuid::Uuid,
        /// Its status when last read.
        seen: SagaStatus,
    },
}

impl Driver {
    /// Decides a step that needs no call now: a condition that is false (`SKIPPED`), a sleep
    /// that starts (`WAITING` until its wake time) or ends, a signal wait that starts, takes
    /// its signal or times out. Changes are kept in memory, to be written with whatever comes
    /// next. A condition, wake time or timeout that cannot be computed fails the step
    /// permanently: it depends only on the saga's data, so asking again cannot change it.
    pub(super) async fn decide(
        &mut self,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let def = self.definition();
        let step = &def.steps()[index];
        let status = self.saga.steps[index].action.status;
        if status == StepStatus::Pending && step.is_conditional() {
            match step.applies(&self.context(index, Phase::Action, 0)) {
                Ok(true) => {}
                Ok(false) => {
                    self.settle_without_call(index, StepStatus::Skipped, None, now);
                    let event = NewEvent::step("step.skipped", step.name(), json!({}));
                    self.pending.events.push(event);
                    return Ok(Decision::Decided);
                }
                Err(e) => {
                    self.refuse(
                        index,
                        &format!("its condition failed: {}", e.message()),
                        now,
                    );
                    return Ok(Decision::Decided);
                }
            }
        }
        let name = step.name();
        match step.body() {
            StageBody::Sleep(sleep) => self.decide_sleep(name, sleep, index, now),
            StageBody::Signal(wait) => return self.decide_signal(name, wait, index, now).await,
            StageBody::Parallel(group) => self.decide_group(name, group, index, now),
            StageBody::Child(child) => return self.decide_child(name, child, index, now).await,
            _ => return Ok(Decision::Call),
        }
        Ok(Decision::Decided)
    }

    /// Starts a parallel group (its branches' rows are added, `PENDING`, to be called next), or
    /// ends it once every branch succeeded (its output an object keyed by branch name) or one
    /// failed for good with none in flight (the saga then goes back).
    fn decide_group(&mut self, name: &str, group: &Group, index: usize, now: Millis) {
        if self.saga.steps[index].action.status == StepStatus::Pending {
            return self.start_group(name, group, index, now);
        }
        match plan::group_state(&self.saga, index) {
            plan::GroupState::Succeeded => {
                let output: serde_json::Map<String, Value> = plan::branches(&self.saga, index)
                    .map(|b| {
                        let (_, name) = b.branch_of().unwrap_or_default();
                        (name.to_owned(), b.output.clone().unwrap_or(Value::Null))
                    })
                    .collect();
                self.settle_without_call(
                    index,
                    StepStatus::Succeeded,
                    Some(Value::Object(output)),
                    now,
                );
                let event = NewEvent::step("step.succeeded", name, json!({}));
                self.pending.events.push(event);
            }
            plan::GroupState::Failed(error) => self.refuse(index, &error, now),
            // The plan asks only once the group has ended.
            plan::GroupState::Running => {}
        }
    }

    /// Adds the rows of a group's branches: after every row the saga has, named
    /// `group/branch` and pointing at the group's row, in the order the definition (or the mapped list) gives. Rows a refused
    /// write left behind (PostgreSQL inserts them by a statement of their own) are taken as
    /// they are: the list is the same, computed from the same data.
    fn start_group(&mut self, stage: &str, group: &Group, index: usize, now: Millis) {
        let names = match group.branches(stage, &self.context(index, Phase::Action, 0)) {
            Ok(names) => names,
            Err(e) => {
                return self.refuse(index, &format!("its branches failed: {}", e.message()), now)
            }
        };
        let existing = plan::branches(&self.saga, index).count();
        if existing == 0 {
            for (branch, _) in &names {
                let kind = group
                    .branch(branch)
                    .map_or(StepKind::Compensatable, |b| b.kind());
                let row = self.saga.steps.len() as u32;
                let name = format!("{stage}/{branch}");
                self.saga.steps.push(StepRecord {
                    index: row,
                    name: name.clone(),
                    stage_index: Some(index as u32),
                    branch: Some(branch.clone()),
                    kind,
                    action: PhaseRecord::pending(),
                    output: None,
                    wake_at: None,
                    waiting_for: None,
                    timeout_at: None,
                    retry_at: None,
                    compensation: PhaseRecord::with_status(comp_status_for(kind)),
                });
                self.pending.new_steps.push(NewStep {
                    index: row,
                    name,
                    stage_index: index as u32,
                    branch: branch.clone(),
                    kind,
                });
            }
        }
        for (branch, element) in names {
            if let Some(element) = element {
                let name = format!("{stage}/{branch}");
                self.elements.insert(name, Arc::new(element));
            }
        }
        let record = &mut self.saga.steps[index];
        record.action.status = StepStatus::Running;
        record.action.started_at = Some(now);
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        self.push_update(index, Phase::Action, None);
        let branches: Vec<&str> = plan::branches(&self.saga, index)
            .filter_map(|b| b.branch_of().map(|(_, name)| name))
            .collect();
        let data = json!({ "branches": branches });
        self.pending
            .events
            .push(NewEvent::step("group.started", stage, data));
        // An empty list has nothing to wait for.
        if branches.is_empty() {
            let output = Some(Value::Object(serde_json::Map::new()));
            self.settle_without_call(index, StepStatus::Succeeded, output, now);
            let event = NewEvent::step("step.succeeded", stage, json!({}));
            self.pending.events.push(event);
        }
    }

    /// Starts a sleep, or ends it (the plan asks only once its wake time has come).
    fn decide_sleep(&mut self, name: &str, sleep: &Sleep, index: usize, now: Millis) {
        if self.saga.steps[index].action.status != StepStatus::Pending {
            self.settle_without_call(index, StepStatus::Succeeded, Some(Value::Null), now);
            let wake_at = self.saga.steps[index].wake_at.map(rfc3339);
            let data = json!({ "wake_at": wake_at });
            self.pending
                .events
                .push(NewEvent::step("step.succeeded", name, data));
            return;
        }
        let wake = sleep
            .wake_time(&self.context(index, Phase::Action, 0), system_time(now))
            .and_then(millis);
        match wake {
            Ok(at) => {
                self.saga.steps[index].wake_at = Some(at);
                self.start_waiting(index, now);
                let data = json!({"wake_at": rfc3339(at)});
                self.pending
                    .events
                    .push(NewEvent::step("step.waiting", name, data));
            }
            Err(e) => self.refuse(
                index,
                &format!("its wake time failed: {}", e.message()),
                now,
            ),
        }
    }

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

    /// Marks a wait that starts now as `WAITING` and queues its record.
    pub(super) fn start_waiting(&mut self, index: usize, now: Millis) {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let action = &mut self.saga.steps[index].action;
        action.status = StepStatus::Waiting;
        action.started_at = Some(now);
        action.outcome_unknown = false;
        self.push_update(index, Phase::Action, None);
    }

    /// Gives back a saga whose signal step waits, in two writes. The first gives the lease up
    /// with the saga due a lease's time to live from now: should this process die before the
    /// second, the saga is looked at again then. The second
    /// ([`Store::park_signal_wait`](crate::store::Store::park_signal_wait)) makes it due at
    /// the timeout (or never), or now if the signal has come meanwhile. A sender locks the
    /// saga's row and makes it due if its step waits: so whichever of the two comes first, the
    /// signal is taken.
    pub(super) async fn await_signal(&mut self, signal: &str) -> Result<(), StoreError> {
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

    /// Gives back a saga whose child stage waits for its child, last seen in `seen`, to end:
    /// in two writes, as [`Driver::await_signal`] does; the child's end makes the parent due,
    /// and the second write sees a child that ended between the two.
    pub(super) async fn await_child(
        &mut self,
        child: uuid::Uuid,
        seen: SagaStatus,
    ) -> Result<(), StoreError> {
        let recheck = self.now().saturating_add(self.inner.config.lease_ttl_ms());
        let (store, id) = (self.inner.store.clone(), self.saga.id);
        self.give_back_and_park(recheck, || store.park_child_wait(id, child, seen, recheck))
            .await
    }

    /// Gives the saga back due at `recheck`, then parks it with `park` (retried while the
    /// database is away for a moment; the first write stands meanwhile, so the saga is looked
    /// at again at `recheck` whatever happens).
    async fn give_back_and_park<F, Fut>(
        &mut self,
        recheck: Millis,
        park: F,
    ) -> Result<(), StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        self.saga.next_run_at = Some(recheck);
        self.write(false, true).await?;
        self.slot.take();
        self.inner.wake.notify_one();
        let mut delay = Duration::from_millis(50);
        loop {
            match park().await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_transient() && !self.stop.is_cancelled() => {
                    tracing::warn!(error = %e, "parking a wait failed; retrying");
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Ends a step's action in `status` at `now` without a call, with `output` if given, and
    /// queues its update.
    pub(super) fn settle_without_call(
        &mut self,
        index: usize,
        status: StepStatus,
        output: Option<Value>,
        now: Millis,
    ) {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let step = &mut self.saga.steps[index];
        step.action.status = status;
        step.action.outcome_unknown = false;
        step.action.ended_at = Some(now);
        if output.is_some() {
            step.output.clone_from(&output);
        }
        self.push_update(index, Phase::Action, output);
    }

    /// Fails a step that was never called: permanently, with `error`.
    pub(super) fn refuse(&mut self, index: usize, error: &str, now: Millis) {
        self.saga.steps[index].action.last_error = Some(error.to_owned());
        self.settle_without_call(index, StepStatus::Failed, None, now);
        let data = json!({"attempt": 0, "error": error, "outcome": "failed"});
        let name = self.saga.steps[index].name.clone();
        self.pending
            .events
            .push(NewEvent::step("step.failed", &name, data));
    }
}

/// The engine's clock reading as a `SystemTime`, for a sleep's wake time rule.
fn system_time(now: Millis) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_millis(now.max(0) as u64)
}

/// A wake time in milliseconds since the epoch; an instant before the epoch, or too far to
/// count, is a permanent error.
fn millis(at: std::time::SystemTime) -> Result<Millis, StepError> {
    at.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| Millis::try_from(d.as_millis()).ok())
        .ok_or_else(|| StepError::permanent(format!("{at:?} is not a time to wake at")))
}
