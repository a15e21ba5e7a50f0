//! The effect runner of a stage's turn: it asks the stage's rules ([`super::stages`]) what
//! they need, reads those facts from the store, asks them to decide, and applies the
//! [`Decision`] — the only place a turn changes the saga's record in memory, queues its
//! events, writes, parks a wait or starts a child. The driver's loop calls [`Driver::turn`]
//! and goes on as the [`Turned`] answer says.

use std::sync::Arc;
use std::time::Duration;

use saga_dsl::Phase;
use serde_json::{json, Value};
use uuid::Uuid;

use super::calls::CallResult;
use super::decision::{
    BranchStart, ChildUndo, Decision, End, Facts, Need, Settle, TaskEnd, Turned, Until, Wait,
};
use super::driver::Driver;
use super::plan;
use super::stages::{self, Ahead, Turn};
use crate::failpoint::crash_if_armed;
use crate::model::task::TaskRef;
use crate::model::{Millis, SagaStatus, StepRecord, StepStatus};
use crate::store::rows::pending_row;
use crate::store::{NewEvent, NewSaga, NewStep, StoreError, TaskOutcome};

impl Driver {
    /// The turn of row `index` in `phase`: what its stage's rules decide, applied. Going
    /// forward only a stage's own row is asked; going back, a row the definition does not
    /// name as a stage (a branch) is undone as a call.
    pub(super) async fn turn(
        &mut self,
        index: usize,
        phase: Phase,
        now: Millis,
    ) -> Result<Turned, StoreError> {
        let def = self.definition();
        let step = match phase {
            Phase::Action => &def.steps()[index],
            Phase::Compensation => match def.steps().get(index) {
                Some(step) => step,
                None => return Ok(Turned::Call),
            },
        };
        // The rules see the saga through a `Turn` that lives in one block at a time, so that
        // no borrow of the driver is held across the store's read.
        macro_rules! with_turn {
            ($turn:ident => $body:expr) => {{
                let make = || self.context(index, Phase::Action, 0);
                let $turn = Turn {
                    stage: step.name(),
                    index,
                    now,
                    saga: &self.saga,
                    registry: &self.inner.registry,
                    context: &make,
                };
                $body
            }};
        }
        let ahead = match phase {
            Phase::Action => with_turn!(turn => stages::needs(step, &turn)),
            Phase::Compensation => {
                Ahead::Needs(with_turn!(turn => stages::needs_back(step, &turn)))
            }
        };
        let decision = match ahead {
            Ahead::Decided(decision) => decision,
            Ahead::Needs(need) => {
                let facts = self.facts(need).await?;
                match phase {
                    Phase::Action => with_turn!(turn => stages::advance(step, &turn, facts)),
                    Phase::Compensation => with_turn!(turn => stages::undo(step, &turn, facts)),
                }
            }
        };
        self.apply(index, decision, now).await
    }

    /// Reads the fact a stage's rules asked for.
    async fn facts(&self, need: Need) -> Result<Facts, StoreError> {
        let store = &self.inner.store;
        Ok(match need {
            Need::Nothing => Facts::Nothing,
            Need::Signal(signal) => Facts::Signal(
                store
                    .received_signal(self.saga.id, &signal)
                    .await?
                    .map(|received| received.payload),
            ),
            Need::Child(child) => Facts::Child(store.get_saga(child).await?.map(Box::new)),
            Need::ChildStatus(child) => Facts::ChildStatus(store.saga_status(child).await?),
            Need::Task(task) => Facts::Task(store.reported_task(&task).await?),
        })
    }

    /// Applies the decision of row `index`'s turn.
    async fn apply(
        &mut self,
        index: usize,
        decision: Decision,
        now: Millis,
    ) -> Result<Turned, StoreError> {
        match decision {
            Decision::Call => return Ok(Turned::Call),
            Decision::Unchanged => {}
            Decision::Settle(settle) => self.settle(index, settle, now),
            Decision::Wait(wait) => self.start_waiting(index, wait, now),
            Decision::AwaitSignal { signal, starts } => {
                if let Some(wait) = starts {
                    self.start_waiting(index, wait, now);
                }
                self.await_signal(&signal).await?;
                return Ok(Turned::Parked);
            }
            Decision::StartGroup(branches) => self.start_group(index, branches, now),
            Decision::TaskEnded { attempt, end } => self.task_ended(index, attempt, end).await?,
            Decision::AwaitTask { task, deadline } => {
                if let Some(outcome) = self.hold_for_report(&task, deadline, now).await? {
                    self.task_ended(index, task.attempt, TaskEnd::Reported(outcome))
                        .await?;
                    return Ok(Turned::Continue);
                }
                let recheck = now
                    .saturating_add(self.inner.config.lease_ttl_ms())
                    .min(deadline);
                let store = self.inner.store.clone();
                self.give_back_and_park(recheck, || store.park_task_wait(&task, recheck, deadline))
                    .await?;
                return Ok(Turned::Parked);
            }
            Decision::StartChild { mut child, starts } => {
                // The child's trace is its parent's: its saga span a child of the parent's.
                child.traceparent = self.trace.map(|t| t.context.traceparent());
                if let Some(wait) = starts {
                    self.start_waiting(index, wait, now);
                    // The stage is recorded as waiting before its child may exist.
                    self.write(false, false).await?;
                }
                self.start_child(index, &child).await?;
                self.await_child(child.id, SagaStatus::Queued).await?;
                return Ok(Turned::Parked);
            }
            Decision::AwaitChild { child, seen } => {
                self.await_child(child, seen).await?;
                return Ok(Turned::Parked);
            }
            Decision::UndoChild { child, undo } => {
                let store = self.inner.store.clone();
                let (seen, problem) = match undo {
                    ChildUndo::Nothing => {
                        self.child_undone(index, child, now);
                        return Ok(Turned::Continue);
                    }
                    ChildUndo::Compensate => {
                        stages::after_compensate(store.compensate_child(child, self.saga.id).await)?
                    }
                    ChildUndo::Cancel(status) => {
                        let outcome = store
                            .request_cancel(child, &crate::store::Audit::default())
                            .await?;
                        stages::after_cancel(child, status, &outcome)
                    }
                    ChildUndo::Wait { seen, problem } => (seen, problem),
                };
                self.child_going_back(index, child, problem, now);
                self.await_child(child, seen).await?;
                return Ok(Turned::Parked);
            }
        }
        Ok(Turned::Continue)
    }

    /// Before giving back a saga whose call waits for its callback, holds it for as long as a
    /// short retry is held (`hold_backoff_below`), in case its participant reports to this
    /// process meanwhile, as a participant that answers "accepted" and settles at once does:
    /// the saga then goes on without being parked and claimed again. Returns the report, if
    /// one came.
    async fn hold_for_report(
        &self,
        task: &TaskRef,
        deadline: Millis,
        now: Millis,
    ) -> Result<Option<TaskOutcome>, StoreError> {
        let hold = self.inner.config.hold_backoff_below;
        let hold_ms = Millis::try_from(hold.as_millis()).unwrap_or(Millis::MAX);
        if hold.is_zero() || deadline.saturating_sub(now) <= hold_ms || self.stop.is_cancelled() {
            return Ok(None);
        }
        let watch = self.inner.reports.watch(task.saga);
        // A report recorded before the watch began is read; one after it wakes the watch.
        if let Some(outcome) = self.inner.store.reported_task(task).await? {
            return Ok(Some(outcome));
        }
        tokio::select! {
            () = watch.reported() => {}
            () = tokio::time::sleep(hold) => return Ok(None),
            () = self.stop.cancelled() => return Ok(None),
        }
        self.inner.store.reported_task(task).await
    }

    /// Records the end of a call that waited for its participant's callback as the call's own
    /// result would be: its output, its failure (retried or not by the step's policy), or,
    /// past its deadline, an unknown outcome, retried with the same idempotency key. A
    /// deadline is first written as the attempt's outcome, which a report that came meanwhile
    /// wins: either way the attempt has one outcome.
    async fn task_ended(
        &mut self,
        index: usize,
        attempt: u32,
        end: TaskEnd,
    ) -> Result<(), StoreError> {
        let outcome = match end {
            TaskEnd::Reported(outcome) => outcome,
            TaskEnd::TimedOut => {
                let task = TaskRef {
                    saga: self.saga.id,
                    step_index: index as u32,
                    phase: Phase::Action,
                    attempt,
                };
                self.inner
                    .store
                    .close_task(&task, &TaskOutcome::Expired)
                    .await?
            }
        };
        let row = &mut self.saga.steps[index];
        row.waiting_for = None;
        row.timeout_at = None;
        self.record(index, Phase::Action, attempt, CallResult::of_task(outcome));
        Ok(())
    }

    /// Ends a step's action without a call, as `settle` says, and queues its event.
    fn settle(&mut self, index: usize, settle: Settle, now: Millis) {
        let Settle { end, event, taken } = settle;
        if let Some(signal) = taken {
            let row = &mut self.saga.steps[index];
            row.action.started_at = Some(now);
            row.waiting_for = Some(signal);
        }
        match end {
            End::Succeeded(output) => {
                self.settle_without_call(index, StepStatus::Succeeded, Some(output), now);
            }
            End::Skipped => self.settle_without_call(index, StepStatus::Skipped, None, now),
            End::Failed(error) => {
                self.saga.steps[index].action.last_error = Some(error);
                self.settle_without_call(index, StepStatus::Failed, None, now);
            }
        }
        self.pending.events.push(event);
    }

    /// Ends a step's action in `status` at `now` without a call, with `output` if given, and
    /// queues its update.
    fn settle_without_call(
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

    /// Marks a wait that starts now as `WAITING` with what it waits for, and queues its record
    /// and event.
    fn start_waiting(&mut self, index: usize, wait: Wait, now: Millis) {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let row = &mut self.saga.steps[index];
        match wait.until {
            Until::Time(at) => row.wake_at = Some(at),
            Until::Signal { name, timeout_at } => {
                row.waiting_for = Some(name);
                row.timeout_at = timeout_at;
            }
            Until::Child => {}
        }
        let action = &mut row.action;
        action.status = StepStatus::Waiting;
        action.started_at = Some(now);
        action.outcome_unknown = false;
        self.push_update(index, Phase::Action, None);
        self.pending.events.push(wait.event);
    }

    /// Adds the rows of a group's branches: after every row the saga has, named
    /// `group/branch` and pointing at the group's row, in the order given. Rows a refused
    /// write left behind (PostgreSQL inserts them by a statement of their own) are taken as
    /// they are: the list is the same, computed from the same data.
    fn start_group(&mut self, index: usize, branches: Vec<BranchStart>, now: Millis) {
        let stage = self.saga.steps[index].name.clone();
        let existing = plan::branches(&self.saga, index).count();
        if existing == 0 {
            for branch in &branches {
                let row = self.saga.steps.len() as u32;
                let name = format!("{stage}/{}", branch.name);
                self.saga.steps.push(StepRecord {
                    stage_index: Some(index as u32),
                    branch: Some(branch.name.clone()),
                    ..pending_row(row, name.clone(), branch.kind)
                });
                self.pending.new_steps.push(NewStep {
                    index: row,
                    name,
                    stage_index: index as u32,
                    branch: branch.name.clone(),
                    kind: branch.kind,
                });
            }
        }
        for branch in branches {
            if let Some(element) = branch.element {
                let name = format!("{stage}/{}", branch.name);
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
        let names: Vec<&str> = plan::branches(&self.saga, index)
            .filter_map(|b| b.branch_of().map(|(_, name)| name))
            .collect();
        let empty = names.is_empty();
        let data = json!({ "branches": names });
        self.pending
            .events
            .push(NewEvent::step("group.started", &stage, data));
        // An empty list has nothing to wait for.
        if empty {
            let output = Some(Value::Object(serde_json::Map::new()));
            self.settle_without_call(index, StepStatus::Succeeded, output, now);
            let event = NewEvent::step("step.succeeded", &stage, json!({}));
            self.pending.events.push(event);
        }
    }

    /// Creates the child of a stage recorded as waiting, under the saga's lease.
    async fn start_child(&mut self, index: usize, child: &NewSaga) -> Result<(), StoreError> {
        let stage = self.saga.steps[index].name.clone();
        crash_if_armed("before_child", &stage);
        self.inner
            .store
            .start_child(self.lease(), &stage, child)
            .await?;
        crash_if_armed("after_child", &stage);
        Ok(())
    }

    /// A child stage with nothing to undo: its compensation succeeds.
    fn child_undone(&mut self, index: usize, child: Uuid, now: Millis) {
        let comp = &mut self.saga.steps[index].compensation;
        comp.status = StepStatus::Succeeded;
        comp.started_at.get_or_insert(now);
        comp.ended_at = Some(now);
        comp.last_error = None;
        self.push_update(index, Phase::Compensation, None);
        let name = self.saga.steps[index].name.clone();
        let data = json!({"child_id": child});
        self.pending
            .events
            .push(NewEvent::step("step.compensated", &name, data));
    }

    /// A child stage going back waits for its child (`WAITING`), flagging the saga for a
    /// person once if the child cannot go back by itself.
    fn child_going_back(
        &mut self,
        index: usize,
        child: Uuid,
        problem: Option<String>,
        now: Millis,
    ) {
        let name = self.saga.steps[index].name.clone();
        let comp = &mut self.saga.steps[index].compensation;
        let first = comp.status != StepStatus::Waiting;
        comp.status = StepStatus::Waiting;
        comp.started_at.get_or_insert(now);
        comp.last_error.clone_from(&problem);
        self.push_update(index, Phase::Compensation, None);
        if first {
            let data = json!({"child_id": child});
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
    }

    /// Gives back a saga whose signal step waits, in two writes. The first gives the lease up
    /// with the saga due a lease's time to live from now: should this process die before the
    /// second, the saga is looked at again then. The second
    /// ([`Store::park_signal_wait`](crate::store::EngineLog::park_signal_wait)) makes it due at
    /// the timeout (or never), or now if the signal has come meanwhile. A sender locks the
    /// saga's row and makes it due if its step waits: so whichever of the two comes first, the
    /// signal is taken.
    async fn await_signal(&mut self, signal: &str) -> Result<(), StoreError> {
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
    async fn await_child(&mut self, child: Uuid, seen: SagaStatus) -> Result<(), StoreError> {
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
}
