//! Child stages: starting the child saga, waiting for its end without a worker, and undoing it
//! when the parent goes back (cancelling a running child, compensating a completed one).
//!
//! The child's id is derived from the parent's id and the stage's name, and the child is
//! created only after the stage's `WAITING` record is committed, under the parent's lease: a
//! parent resumed after a crash finds the child it started, and a parent going back knows
//! whether a child may exist.

use saga_dsl::{child_saga_id, ChildSaga, Phase};
use serde_json::json;
use uuid::Uuid;

use super::{Decision, StageRules};
use crate::engine::driver::Driver;
use crate::failpoint::crash_if_armed;
use crate::model::{Millis, Saga, SagaStatus, StepRecord, StepStatus};
use crate::store::{CancelOutcome, NewEvent, NewSaga, StoreError};

impl StageRules for ChildSaga {
    async fn advance(
        &self,
        driver: &mut Driver,
        stage: &str,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        driver.decide_child(stage, self, index, now).await
    }

    async fn undo(
        &self,
        driver: &mut Driver,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        driver.undo_child(index, now).await
    }

    /// A child that ended other than completed was undone by its own saga (or waits for a
    /// person there): back, unless the point of no return is behind.
    fn can_go_back(_failed: &StepRecord, saga: &Saga) -> bool {
        !saga.pivot_started
    }
}

impl Driver {
    /// Starts a child stage, or looks at the child it waits for: the stage succeeds with a
    /// completed child's output, fails with a child that ended otherwise, and waits again for
    /// one still running.
    pub(in crate::engine) async fn decide_child(
        &mut self,
        name: &str,
        stage: &ChildSaga,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let child_id = child_saga_id(self.saga.id, name);
        if self.saga.steps[index].action.status == StepStatus::Pending {
            let Some(child) = self.child_of(stage, index, child_id, now) else {
                return Ok(Decision::Decided);
            };
            self.start_waiting(index, now);
            let data = json!({"child_id": child_id, "saga": child.name});
            self.pending
                .events
                .push(NewEvent::step("step.waiting", name, data));
            // The stage is recorded as waiting before its child may exist.
            self.write(false, false).await?;
            return self.start_child(name, &child).await;
        }
        let Some(child) = self.inner.store.get_saga(child_id).await? else {
            // The stage's record was committed, its child not: start it now.
            let Some(child) = self.child_of(stage, index, child_id, now) else {
                return Ok(Decision::Decided);
            };
            return self.start_child(name, &child).await;
        };
        match child.status {
            SagaStatus::Completed => {
                let output = child.output.unwrap_or(serde_json::Value::Null);
                self.settle_without_call(index, StepStatus::Succeeded, Some(output), now);
                let data = json!({"child_id": child_id});
                self.pending
                    .events
                    .push(NewEvent::step("step.succeeded", name, data));
            }
            status if status.is_terminal() => {
                let why = child.error.map(|e| format!(": {e}")).unwrap_or_default();
                let error = format!("child saga {child_id} ({}) ended {status}{why}", child.name);
                self.refuse(index, &error, now);
            }
            status => {
                return Ok(Decision::AwaitChild {
                    child: child_id,
                    seen: status,
                })
            }
        }
        Ok(Decision::Decided)
    }

    /// Creates the child of a stage recorded as waiting, and waits for it.
    async fn start_child(&mut self, stage: &str, child: &NewSaga) -> Result<Decision, StoreError> {
        crash_if_armed("before_child", stage);
        self.inner
            .store
            .start_child(self.lease(), stage, child)
            .await?;
        crash_if_armed("after_child", stage);
        Ok(Decision::AwaitChild {
            child: child.id,
            seen: SagaStatus::Queued,
        })
    }

    /// The child saga a stage starts, its input computed and checked against the child's
    /// definition; `None` (the stage failed permanently) when that is impossible.
    fn child_of(
        &mut self,
        stage: &ChildSaga,
        index: usize,
        id: Uuid,
        now: Millis,
    ) -> Option<NewSaga> {
        let name = stage.saga();
        let ctx = self.context(index, Phase::Action, 0);
        let input = match stage.input(&ctx) {
            Ok(input) => input,
            Err(e) => {
                let error = format!("its child's input failed: {}", e.message());
                self.refuse(index, &error, now);
                return None;
            }
        };
        let Some(def) = self.inner.registry.latest(name).cloned() else {
            self.refuse(index, &format!("no saga {name:?} is registered"), now);
            return None;
        };
        if let Err(message) = def.check_input(&input) {
            let error = format!("the input of child saga {name} is not valid: {message}");
            self.refuse(index, &error, now);
            return None;
        }
        let mut child = NewSaga::of(&def, input);
        child.id = id;
        // The child's trace is its parent's: its saga span a child of the parent's.
        child.traceparent = self.trace.map(|t| t.context.traceparent());
        Some(child)
    }

    /// Undoes a child stage as the parent goes back: nothing to undo if the child was never
    /// created or ended compensated; a running child is cancelled and a completed one turned
    /// to compensating, and the parent waits for it. A child that cannot go back (it failed,
    /// was aborted, or passed its point of no return) flags the parent for a person, who may
    /// mend the child or mark the stage compensated.
    pub(in crate::engine) async fn undo_child(
        &mut self,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let name = self.saga.steps[index].name.clone();
        let child_id = child_saga_id(self.saga.id, &name);
        let child = self.inner.store.saga_status(child_id).await?;
        let (status, problem) = match child {
            None | Some(SagaStatus::Compensated) => {
                let comp = &mut self.saga.steps[index].compensation;
                comp.status = StepStatus::Succeeded;
                comp.started_at.get_or_insert(now);
                comp.ended_at = Some(now);
                comp.last_error = None;
                self.push_update(index, Phase::Compensation, None);
                let data = json!({"child_id": child_id});
                self.pending
                    .events
                    .push(NewEvent::step("step.compensated", &name, data));
                return Ok(Decision::Decided);
            }
            Some(SagaStatus::Completed) => {
                match self
                    .inner
                    .store
                    .compensate_child(child_id, self.saga.id)
                    .await
                {
                    Ok(status) => (status, None),
                    Err(StoreError::Conflict(problem)) => (SagaStatus::Completed, Some(problem)),
                    Err(e) => return Err(e),
                }
            }
            Some(status @ (SagaStatus::Queued | SagaStatus::Running)) => {
                match self.inner.store.request_cancel(child_id).await? {
                    CancelOutcome::PastPivot => (
                        status,
                        Some(format!(
                            "child saga {child_id} passed its point of no return and cannot be \
                             cancelled"
                        )),
                    ),
                    _ => (status, None),
                }
            }
            Some(SagaStatus::Compensating) => (SagaStatus::Compensating, None),
            Some(status) => (
                status,
                Some(format!(
                    "child saga {child_id} ended {status}; mend it, or mark {name} compensated"
                )),
            ),
        };
        let comp = &mut self.saga.steps[index].compensation;
        let first = comp.status != StepStatus::Waiting;
        comp.status = StepStatus::Waiting;
        comp.started_at.get_or_insert(now);
        comp.last_error.clone_from(&problem);
        self.push_update(index, Phase::Compensation, None);
        if first {
            let data = json!({"child_id": child_id});
            self.pending
                .events
                .push(NewEvent::step("step.compensating", &name, data));
        }
        if let Some(problem) = problem {
            if !self.saga.needs_attention {
                self.saga.needs_attention = true;
                let data = json!({"error": problem});
                self.pending
                    .events
                    .push(NewEvent::step("saga.needs_attention", &name, data));
            }
        }
        Ok(Decision::AwaitChild {
            child: child_id,
            seen: status,
        })
    }

    /// Gives back a saga whose child stage waits for its child, last seen in `seen`, to end:
    /// in two writes, as [`Driver::await_signal`] does; the child's end makes the parent due,
    /// and the second write sees a child that ended between the two.
    pub(in crate::engine) async fn await_child(
        &mut self,
        child: uuid::Uuid,
        seen: SagaStatus,
    ) -> Result<(), StoreError> {
        let recheck = self.now().saturating_add(self.inner.config.lease_ttl_ms());
        let (store, id) = (self.inner.store.clone(), self.saga.id);
        self.give_back_and_park(recheck, || store.park_child_wait(id, child, seen, recheck))
            .await
    }
}
