//! Drives one claimed saga: decide, write ahead, call, write the result, until the saga is
//! terminal, waits on a long retry timer, loses its lease, or the engine shuts down.
//!
//! Every call is preceded by a committed write-ahead record (step status `RUNNING`, attempt
//! number, attempt-log row, `outcome_unknown`), and followed by a committed result. To save a
//! commit per step, the result of one call and the write-ahead of the next share a transaction;
//! saga-level changes that follow from a result (compensating, completed, …) are folded into the
//! same transaction too. The branches of a parallel group run at once ([`super::calls`]): their
//! write-aheads share one transaction, and their results are written as they come, each with
//! whatever the plan starts next. Each stage's turn is decided by its kind, in
//! [`super::stages`], as a value that the effect runner ([`super::effects`]) applies: this loop
//! only hears whether to call, plan again, or stop.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use saga_dsl::{
    Call, Group, InputCache, Phase, SagaDefinition, Step, StepContext, StepError, TaskHandle,
};
use serde_json::{json, Value};
use tokio_retry::strategy::{jitter, ExponentialBackoff};
use tokio_retry::RetryIf;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::calls::{CallFuture, CallResult, InFlight};
use super::decision::Turned;
use super::hook::CallSite;
use super::plan::{self, NextCall};
use super::stages::{self, AfterFailure};
use super::Inner;
use crate::failpoint::crash_if_armed;
use crate::model::task::{TaskRef, TaskToken, TASK_WAIT};
use crate::model::{Millis, PhaseRecord, Saga, SagaStatus, StepStatus};
use crate::store::{
    Applied, AttemptChange, Claimed, Lease, NewEvent, NewStep, SagaUpdate, StepUpdate, StoreError,
    TaskOutcome, Transition,
};
use crate::telemetry::{self, AttemptSpan, SagaAttrs, SagaTrace};

/// Changes made in memory and not yet written.
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    pub(super) new_steps: Vec<NewStep>,
    pub(super) steps: Vec<StepUpdate>,
    pub(super) attempts: Vec<AttemptChange>,
    pub(super) events: Vec<NewEvent>,
}

/// Drives `claimed` until it no longer needs this worker; logs why it stopped. With `ahead`,
/// the saga comes fresh from a create that also wrote its first action ahead: that call is
/// made first, before anything else is written.
pub(super) async fn drive(
    inner: Arc<Inner>,
    claimed: Claimed,
    slot: tokio::sync::OwnedSemaphorePermit,
    stop: CancellationToken,
    ahead: bool,
) {
    let span = tracing::info_span!(
        "saga",
        saga.id = %claimed.saga.id,
        saga.name = %claimed.saga.name,
        lease.epoch = claimed.lease.epoch
    );
    async move {
        // Until this returns (or panics), callers waiting for the saga here are told by it.
        let _driving = super::waiters::Driving::new(&inner.waiters, claimed.saga.id);
        let inner = inner.clone();
        let saga = &claimed.saga;
        let Some(def) = inner
            .registry
            .get(&saga.name, saga.version)
            .filter(|d| d.hash() == saga.definition_hash)
            .cloned()
        else {
            // The claim only returns sagas whose definition key we registered.
            tracing::error!("claimed a saga whose definition is not registered; leaving it");
            return;
        };
        let input = Arc::new(saga.input.clone());
        let trace = inner
            .config
            .telemetry
            .saga_trace(saga.id, saga.traceparent.as_deref());
        let span_attrs = inner.config.telemetry.saga_attrs(saga.id, &saga.name);
        let mut driver = Driver {
            inner,
            lease: claimed.lease,
            saga: claimed.saga,
            def,
            input,
            typed_input: InputCache::new(),
            stop,
            pending: Pending::default(),
            slot: Some(slot),
            elements: HashMap::new(),
            trace,
            span_attrs,
            interrupted: Vec::new(),
            rate_parked: false,
            task_key: None,
        };
        match driver.run(ahead).await {
            Ok(()) => {}
            Err(StoreError::LeaseLost(_)) => tracing::warn!(
                "lease lost (another worker or an operator took the saga over); stopped driving it"
            ),
            Err(e) => {
                tracing::error!(error = %e, "could not write to the step log; giving the saga back");
                give_back(&driver.inner, &driver.lease, &driver.stop).await;
            }
        }
    }
    .instrument(span)
    .await;
}

pub(super) struct Driver {
    pub(super) inner: Arc<Inner>,
    lease: Lease,
    pub(super) saga: Saga,
    def: Arc<SagaDefinition>,
    input: Arc<Value>,
    /// The input's typed forms, deserialised once for all the calls of this run.
    typed_input: InputCache,
    pub(super) stop: CancellationToken,
    pub(super) pending: Pending,
    /// This driver's worker slot, given back as soon as the saga needs nothing more from it.
    pub(super) slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The elements of the branches of mapped groups, by row name, once computed.
    pub(super) elements: HashMap<String, Arc<Value>>,
    /// The saga's place in its trace, derived from its row; none without an exporter, unless
    /// the saga joined a caller's trace.
    pub(super) trace: Option<SagaTrace>,
    /// Attempts closed as interrupted whose spans wait for that recovery's commit.
    interrupted: Vec<(usize, Phase, u32)>,
    /// The attributes of its attempt spans, made once.
    span_attrs: SagaAttrs,
    /// Whether a step waits for a rate limiter's token: the saga is then given back however
    /// short the wait, holding no worker meanwhile.
    pub(super) rate_parked: bool,
    /// The log's task key, for a definition with calls completed by callback.
    task_key: Option<Arc<[u8]>>,
}

impl Driver {
    /// The lease this driver writes under.
    pub(super) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(super) fn now(&self) -> Millis {
        self.inner.clock.now_ms()
    }

    /// The definition, shared.
    pub(super) fn definition(&self) -> Arc<SagaDefinition> {
        self.def.clone()
    }

    /// The definition's call of row `index`: a stage's, or a branch's of a group (a row named
    /// `group/branch`).
    pub(super) fn call_site(&self, index: usize) -> Option<&Call> {
        let steps = self.def.steps();
        if let Some(step) = steps.get(index) {
            return step.call();
        }
        let (_, branch) = self.saga.steps.get(index)?.branch_of()?;
        let group = steps.get(self.stage_of(index))?.group()?;
        group.branch(branch).map(|b| b.body())
    }

    /// The row of the stage that row `index` belongs to (its group, for a branch).
    fn stage_of(&self, index: usize) -> usize {
        self.saga.steps[index]
            .stage_index
            .map_or(index, |group| group as usize)
    }

    /// The `step` label of a metric about row `index`: its stage's name (a group's for a
    /// branch, whose names come from data and could be many).
    fn metric_step(&self, index: usize) -> String {
        let row = &self.saga.steps[index];
        row.branch_of()
            .map_or_else(|| row.name.clone(), |(group, _)| group.to_owned())
    }

    /// How many branches of the group in row `group` may run at once.
    fn limit(&self, group: usize) -> usize {
        self.def
            .steps()
            .get(group)
            .and_then(Step::group)
            .map_or(usize::MAX, Group::max_concurrency)
    }

    /// Queues the write of row `index`'s `phase` as it is now in memory.
    pub(super) fn push_update(&mut self, index: usize, phase: Phase, output: Option<Value>) {
        let step = &self.saga.steps[index];
        self.pending.steps.push(StepUpdate {
            index: index as u32,
            phase,
            record: phase_record(&self.saga, index, phase).clone(),
            output,
            wake_at: step.wake_at,
            waiting_for: step.waiting_for.clone(),
            timeout_at: step.timeout_at,
            retry_at: step.retry_at,
        });
    }

    async fn run(&mut self, ahead: bool) -> Result<(), StoreError> {
        let mut calls = InFlight::default();
        let by_callback = |step: &Step| step.call().is_some_and(Call::completed_by_callback);
        if self.def.steps().iter().any(by_callback) {
            self.task_key = Some(self.inner.task_key().await?);
        }
        if ahead {
            // The create recorded this call's write-ahead: its step is running, not interrupted.
            let attempt = self.saga.steps[0].action.attempts;
            self.start_call(&mut calls, 0, Phase::Action, attempt);
        } else {
            self.take_reports_of_interrupted().await?;
            self.interrupted = self.recover_interrupted();
            if self.saga.pause_requested {
                // Claimed with a pause pending (its last driver stopped before it could
                // apply it): give it back, which the pause guard turns into `PAUSED`.
                let now = self.now();
                let events = plan::settle(&mut self.saga, now);
                self.pending.events.extend(events);
                self.write(false, true).await?;
                return Ok(());
            }
        }
        loop {
            if !calls.is_empty() {
                // Results are kept in memory, to be written with whatever comes next.
                for done in calls.next_batch().await {
                    self.finish_call(done).await?;
                }
            }
            let now = self.now();
            let events = plan::settle(&mut self.saga, now);
            self.pending.events.extend(events);
            if self.saga.status == SagaStatus::Compensating {
                self.abandon_callback_waits(now).await?;
            }
            let limit = |group: usize| self.limit(group);
            let next = plan::next_call_limited(&self.saga, now, &limit);
            if !calls.is_empty() && matches!(next, NextCall::Done | NextCall::Wait(_)) {
                // Calls still in flight are waited for before anything ends or waits.
                continue;
            }
            let starts = match next {
                NextCall::Done => {
                    // A cancel recorded while the last call ran is found only by a guarded
                    // write: the completion is then refused, and the saga goes back instead.
                    let completing =
                        self.saga.status == SagaStatus::Completed && !self.saga.pivot_started;
                    if self.write(completing, true).await? == Applied::CancelRequested {
                        self.saga.status = SagaStatus::Running;
                        self.saga.output = None;
                        self.saga.cancel_requested = true;
                        self.pending.events.retain(|e| e.kind != "saga.completed");
                        continue;
                    }
                    // Free the slot before telling waiters: a caller that starts its next saga
                    // on hearing of this one finds a slot and drives it at once.
                    self.slot.take();
                    if self.saga.parent_id.is_some() {
                        // Its parent, made due by that write, may wait here.
                        self.inner.wake.notify_one();
                    }
                    if self.saga.status.is_terminal() {
                        if self.def.flow().limits_running() {
                            // Its slot is free: a saga waiting for it may start.
                            self.inner.wake.notify_one();
                        }
                        metrics::counter!("saga_ended_total",
                            "name" => self.saga.name.clone(), "status" => self.saga.status.as_str())
                        .increment(1);
                        let lived = (now - self.saga.created_at).max(0) as f64 / 1000.0;
                        metrics::histogram!("saga_duration_seconds",
                            "name" => self.saga.name.clone(), "status" => self.saga.status.as_str())
                        .record(lived);
                        self.inner.notify_terminal(self.saga.id, self.saga.status);
                        if let Some(trace) = &self.trace {
                            self.inner.config.telemetry.end_saga(&self.saga, trace, now);
                        }
                    }
                    return Ok(());
                }
                NextCall::Wait(at) => {
                    let wait = Duration::from_millis((at - now).max(0) as u64);
                    if wait <= self.inner.config.hold_backoff_below
                        && !self.stop.is_cancelled()
                        && !self.rate_parked
                    {
                        self.write(false, false).await?;
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => continue,
                            _ = self.stop.cancelled() => {}
                        }
                    }
                    // A long wait: give the saga back; whichever worker is free when it is due
                    // picks it up again. The run loop is told, so it times its next look by
                    // this saga's timer rather than by its poll interval.
                    self.write(false, true).await?;
                    self.inner.wake.notify_one();
                    return Ok(());
                }
                NextCall::Busy if calls.is_empty() => {
                    // Nothing in flight to wait for: the record is not what this driver made.
                    tracing::error!(
                        "the plan waits for calls that are not in flight; giving the saga back"
                    );
                    self.write(false, true).await?;
                    return Ok(());
                }
                NextCall::Busy => continue,
                NextCall::Call(index, phase) => {
                    if self.stop.is_cancelled() && calls.is_empty() {
                        self.write(false, true).await?;
                        return Ok(());
                    }
                    match self.turn(index, phase, now).await? {
                        Turned::Call => {}
                        // Written with whatever comes next.
                        Turned::Continue => continue,
                        Turned::Parked => return Ok(()),
                    }
                    vec![(index, phase)]
                }
                NextCall::Branches(list) => list,
            };
            if self.stop.is_cancelled() {
                if calls.is_empty() {
                    self.write(false, true).await?;
                    return Ok(());
                }
                // Shutting down: start nothing more, finish what is in flight.
                continue;
            }
            let starts = self.take_tokens(starts).await?;
            if starts.is_empty() {
                // Each waits for its token's moment: the plan now says how long.
                continue;
            }
            let undo = Undo::of(self, &starts);
            let fresh_start = starts.iter().any(|&(index, phase)| {
                phase == Phase::Action
                    && matches!(
                        self.saga.steps[index].action.status,
                        StepStatus::Pending | StepStatus::Retrying
                    )
            });
            let attempts: Vec<u32> = starts
                .iter()
                .map(|&(index, phase)| self.write_ahead(index, phase, now))
                .collect();
            match self.write(fresh_start, false).await? {
                Applied::Written => {}
                Applied::CancelRequested => {
                    // A cancel arrived before these actions could start: do not start them.
                    undo.apply(self);
                    self.saga.cancel_requested = true;
                    continue;
                }
                Applied::PauseRequested(request) => {
                    // An operator paused the saga: start nothing; once the calls in flight
                    // are recorded, the plan ends and the saga is given back `PAUSED`.
                    undo.apply(self);
                    self.pause_for(&request);
                    continue;
                }
            }
            for (&(index, phase), attempt) in starts.iter().zip(attempts) {
                self.start_call(&mut calls, index, phase, attempt);
            }
        }
    }

    /// Starts a call whose write-ahead is committed.
    fn start_call(&mut self, calls: &mut InFlight, index: usize, phase: Phase, attempt: u32) {
        crash_if_armed(before_point(phase), &self.saga.steps[index].name);
        let telemetry = &self.inner.config.telemetry;
        let (span, run_in) = match &self.trace {
            Some(trace) if telemetry.is_enabled() => {
                telemetry.start_attempt(trace, self.attempt_span(index, phase, attempt))
            }
            _ => (None, None),
        };
        let mut ctx = self.context(index, phase, attempt);
        if let Some(span) = &span {
            ctx = ctx.with_trace(telemetry::context_of(span));
        }
        if let Some(task) = self.task_handle(index, phase, attempt) {
            ctx = ctx.with_task(task);
        }
        let (timeout, run): (Duration, CallFuture) = match (self.call_site(index), phase) {
            // A row the definition does not know (a branch of a renamed group): fail it.
            (None, _) => {
                let name = &self.saga.steps[index].name;
                let error = StepError::permanent(format!("the definition has no step {name}"));
                (Duration::ZERO, Box::pin(async move { Err(error) }))
            }
            (Some(call), Phase::Action) => {
                let action = call.action().clone();
                (
                    call.attempt_timeout(),
                    Box::pin(async move { action.run(ctx).await }),
                )
            }
            (Some(call), Phase::Compensation) => match call.compensation().cloned() {
                Some(comp) => (
                    call.compensation_attempt_timeout()
                        .unwrap_or(saga_dsl::DEFAULT_ATTEMPT_TIMEOUT),
                    Box::pin(async move { comp.run(ctx).await.map(|()| Value::Null) }),
                ),
                // Only compensatable steps are ever compensated (`needs_compensation`).
                None => (
                    saga_dsl::DEFAULT_ATTEMPT_TIMEOUT,
                    Box::pin(async { Err(StepError::permanent("step has no compensation")) }),
                ),
            },
        };
        let run = match &self.inner.config.call_hook {
            Some(hook) => hook.wrap(
                &CallSite {
                    saga: self.saga.id,
                    saga_name: &self.saga.name,
                    step: &self.saga.steps[index].name,
                    phase,
                    attempt,
                    timeout,
                },
                run,
            ),
            None => run,
        };
        calls.start(index, phase, attempt, timeout, span, run_in, run);
    }

    /// What the span of an attempt of row `index` names.
    fn attempt_span(&self, index: usize, phase: Phase, attempt: u32) -> AttemptSpan<'_> {
        AttemptSpan {
            saga: &self.span_attrs,
            step: &self.saga.steps[index].name,
            phase,
            attempt,
        }
    }

    /// Records a call that ended, in memory, to be written with whatever comes next.
    async fn finish_call(&mut self, done: super::calls::Finished) -> Result<(), StoreError> {
        let mut call = done.call;
        if let Some(mut span) = call.span.take() {
            let error = match &done.result {
                CallResult::Ok(_) => None,
                CallResult::Err { error, .. } => Some(error.message()),
            };
            telemetry::end_attempt(&mut span, done.result.outcome(), error);
        }
        metrics::histogram!("saga_step_duration_seconds",
            "name" => self.saga.name.clone(), "step" => self.metric_step(call.index),
            "phase" => call.phase.as_str(), "outcome" => done.result.outcome())
        .record(call.started.elapsed().as_secs_f64());
        crash_if_armed(after_point(call.phase), &self.saga.steps[call.index].name);
        match done.result {
            // The participant acknowledged the request: the outcome comes by callback.
            CallResult::Ok(answer) if self.completed_by_callback(call.index, call.phase) => {
                self.await_callback(call.index, call.attempt, answer);
            }
            // Its answer was lost, but the participant may have reported already: a report
            // that stands is the attempt's outcome; otherwise none is taken after this.
            result @ CallResult::Err { .. }
                if self.completed_by_callback(call.index, call.phase) =>
            {
                let standing = self.close_unanswered(call.index, call.attempt).await?;
                let result = standing.map_or(result, CallResult::of_task);
                self.record(call.index, call.phase, call.attempt, result);
            }
            result => self.record(call.index, call.phase, call.attempt, result),
        }
        Ok(())
    }

    /// Closes attempt `attempt` of row `index`'s call completed by callback, whose answer was
    /// lost (an error, a timeout, its process stopped), as abandoned, unless its participant
    /// reported first: returns that report, if it stands. A later report is refused.
    async fn close_unanswered(
        &self,
        index: usize,
        attempt: u32,
    ) -> Result<Option<TaskOutcome>, StoreError> {
        let task = TaskRef {
            saga: self.saga.id,
            step_index: index as u32,
            phase: Phase::Action,
            attempt,
        };
        let standing = self
            .inner
            .store
            .close_task(&task, &TaskOutcome::Abandoned)
            .await?;
        Ok(match standing {
            TaskOutcome::Completed(_) | TaskOutcome::Failed { .. } => Some(standing),
            TaskOutcome::Expired | TaskOutcome::Abandoned => None,
        })
    }

    /// Whether row `index`'s call in `phase` is completed by its participant's callback.
    fn completed_by_callback(&self, index: usize, phase: Phase) -> bool {
        phase == Phase::Action
            && self.saga.steps[index].branch_of().is_none()
            && self
                .call_site(index)
                .is_some_and(Call::completed_by_callback)
    }

    /// The task token and URL of attempt `attempt` of row `index`'s call in `phase`, if it is
    /// completed by callback.
    fn task_handle(&self, index: usize, phase: Phase, attempt: u32) -> Option<TaskHandle> {
        if !self.completed_by_callback(index, phase) {
            return None;
        }
        let key = self.task_key.as_ref()?;
        let timeout = self.call_site(index)?.attempt_timeout();
        let token = TaskToken {
            task: TaskRef {
                saga: self.saga.id,
                step_index: index as u32,
                phase,
                attempt,
            },
            extend_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }
        .encode(key);
        let base = self.inner.config.task_url.trim_end_matches('/');
        Some(TaskHandle::new(
            token.clone(),
            format!("{base}/v1/tasks/{token}"),
        ))
    }

    /// The participant of row `index` acknowledged attempt `attempt`: the action waits, holding
    /// no worker, for its report until a step's timeout from now. The attempt stays open and
    /// its outcome unknown until then.
    fn await_callback(&mut self, index: usize, attempt: u32, answer: Value) {
        let now = self.now();
        let timeout = self
            .call_site(index)
            .map_or(saga_dsl::DEFAULT_ATTEMPT_TIMEOUT, Call::attempt_timeout);
        let deadline =
            now.saturating_add(Millis::try_from(timeout.as_millis()).unwrap_or(Millis::MAX / 4));
        let row = &mut self.saga.steps[index];
        row.action.status = StepStatus::Waiting;
        row.waiting_for = Some(TASK_WAIT.to_owned());
        row.timeout_at = Some(deadline);
        let data = json!({"attempt": attempt, "waiting_for": TASK_WAIT,
                          "timeout_at": crate::model::rfc3339(deadline), "answer": answer});
        let name = row.name.clone();
        self.pending
            .events
            .push(NewEvent::step("step.waiting", &name, data));
        self.push_update(index, Phase::Action, None);
    }

    /// Going back, a call still waiting for its callback will not be waited for: unless its
    /// participant reported first (then that stands), its attempt is closed as abandoned and
    /// its outcome is unknown, so that its compensation runs (with the action's key, undoing
    /// the effect if it happened). A later report is refused.
    async fn abandon_callback_waits(&mut self, now: Millis) -> Result<(), StoreError> {
        for index in 0..self.saga.steps.len() {
            let row = &self.saga.steps[index];
            if row.action.status != StepStatus::Waiting
                || row.waiting_for.as_deref() != Some(TASK_WAIT)
            {
                continue;
            }
            let attempt = row.action.attempts;
            let standing = self.close_unanswered(index, attempt).await?;
            let row = &mut self.saga.steps[index];
            row.waiting_for = None;
            row.timeout_at = None;
            match standing {
                Some(TaskOutcome::Completed(output)) => {
                    self.record(index, Phase::Action, attempt, CallResult::Ok(output));
                    continue;
                }
                // Going back, a failure is final: the action is not tried again.
                Some(TaskOutcome::Failed { error, .. }) => {
                    let result = CallResult::Err {
                        error: StepError::permanent(error),
                        unknown: false,
                    };
                    self.record(index, Phase::Action, attempt, result);
                    continue;
                }
                _ => {}
            }
            let error = "abandoned: the saga went back while the step waited for its callback; \
                         its outcome is unknown";
            row.action.status = StepStatus::Unknown;
            row.action.outcome_unknown = true;
            row.action.ended_at = Some(now);
            row.action.last_error = Some(error.to_owned());
            let name = row.name.clone();
            self.pending.events.push(NewEvent::step(
                "step.failed",
                &name,
                json!({"attempt": attempt, "error": error, "outcome": "abandoned"}),
            ));
            self.push_update(index, Phase::Action, None);
            self.pending.attempts.push(AttemptChange::Finish {
                step_index: index as u32,
                phase: Phase::Action,
                attempt,
                outcome: "abandoned",
                error: Some(error.to_owned()),
            });
        }
        Ok(())
    }

    /// A call completed by callback whose process stopped before it recorded the participant's
    /// answer may have been reported meanwhile (the participant called back at once): that
    /// report is the attempt's outcome, rather than an interruption and a second call; without
    /// one, the attempt is closed first, so that a report for it coming later is refused.
    async fn take_reports_of_interrupted(&mut self) -> Result<(), StoreError> {
        for index in 0..self.saga.steps.len() {
            let rec = &self.saga.steps[index].action;
            if rec.status != StepStatus::Running
                || !self.completed_by_callback(index, Phase::Action)
            {
                continue;
            }
            let attempt = rec.attempts;
            if let Some(outcome) = self.close_unanswered(index, attempt).await? {
                self.record(index, Phase::Action, attempt, CallResult::of_task(outcome));
            }
        }
        Ok(())
    }

    /// A phase left `RUNNING` by a previous owner was interrupted: its outcome is unknown. Close
    /// its attempt and schedule the same call again (same idempotency key), within its budget.
    /// Returns the attempts it closed.
    fn recover_interrupted(&mut self) -> Vec<(usize, Phase, u32)> {
        let now = self.now();
        let mut interrupted = Vec::new();
        for index in 0..self.saga.steps.len() {
            // A stage that calls nothing (a group's own row is `RUNNING` while its branches
            // are) has no attempt to recover.
            if !self.saga.steps[index].kind.calls() {
                continue;
            }
            for phase in [Phase::Action, Phase::Compensation] {
                let rec = phase_record(&self.saga, index, phase);
                if rec.status != StepStatus::Running {
                    continue;
                }
                let attempt = rec.attempts;
                tracing::warn!(
                    step = %self.saga.steps[index].name,
                    %phase,
                    attempt,
                    "attempt interrupted by a stopped process; its outcome is unknown"
                );
                let error = StepError::retryable(
                    "interrupted: the process making this attempt stopped before recording its outcome",
                );
                self.fail_phase(index, phase, attempt, &error, true, "interrupted", now);
                // The same call is made again at once.
                self.saga.next_run_at = Some(now);
                interrupted.push((index, phase, attempt));
            }
        }
        interrupted
    }

    /// Emits the spans of attempts a stopped process began (it could not): from their start in
    /// the attempt log to now, interrupted.
    async fn trace_interrupted(&self, interrupted: &[(usize, Phase, u32)]) {
        let Some(trace) = self.trace.filter(|t| t.context.sampled) else {
            return;
        };
        if !self.inner.config.telemetry.is_enabled() {
            return;
        }
        let attempts = match self.inner.store.attempts(self.saga.id).await {
            Ok(attempts) => attempts,
            Err(e) => {
                tracing::debug!(error = %e, "no spans for the interrupted attempts");
                return;
            }
        };
        for &(index, phase, attempt) in interrupted {
            let started = attempts.iter().find(|a| {
                a.step_index as usize == index && a.phase == phase.as_str() && a.attempt == attempt
            });
            if let Some(a) = started {
                self.inner.config.telemetry.interrupted_attempt(
                    &trace,
                    self.attempt_span(index, phase, attempt),
                    a.started_at,
                );
            }
        }
    }

    fn write_ahead(&mut self, index: usize, phase: Phase, now: Millis) -> u32 {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        // At the pivot or after it (a pivot that was skipped leaves the next step to pass it;
        // a branch passes it where its group stands).
        let stage = self.stage_of(index);
        if phase == Phase::Action && self.def.point_of_no_return().is_some_and(|p| stage >= p) {
            self.saga.pivot_started = true;
        }
        if self.saga.steps[index].branch_of().is_some() {
            // A branch's retry timer is over once its next attempt starts.
            self.saga.steps[index].retry_at = None;
        }
        // Every attempt started so far is counted on its phase's record, across crashes.
        let seq = 1 + self
            .saga
            .steps
            .iter()
            .map(|s| s.action.attempts + s.compensation.attempts)
            .sum::<u32>();
        let rec = phase_record_mut(&mut self.saga, index, phase);
        rec.status = StepStatus::Running;
        rec.attempts += 1;
        // Until the result is written, nobody knows what the call did.
        rec.outcome_unknown = true;
        rec.started_at.get_or_insert(now);
        rec.ended_at = None;
        let attempt = rec.attempts;
        self.push_update(index, phase, None);
        self.pending.attempts.push(AttemptChange::Start {
            step_index: index as u32,
            phase,
            attempt,
            seq,
        });
        attempt
    }

    /// What a call of row `index` (or its condition, its wait, its group's list) is told: the
    /// outputs of the stages before its own (for a compensation, of every row that succeeded,
    /// branches included, so that each finds its own action's), and, for a branch, its name
    /// and element.
    pub(super) fn context(&self, index: usize, phase: Phase, attempt: u32) -> StepContext {
        let stage = self.stage_of(index);
        let mut outputs = BTreeMap::new();
        let visible = match phase {
            Phase::Compensation => &self.saga.steps[..],
            // Branch rows are appended after every stage's row: the rows before the stage's
            // own are the earlier stages.
            Phase::Action => &self.saga.steps[..stage.min(self.saga.steps.len())],
        };
        for s in visible {
            if s.action.status == StepStatus::Succeeded {
                if let Some(out) = &s.output {
                    outputs.insert(s.name.clone(), out.clone());
                }
            }
        }
        let row = &self.saga.steps[index];
        let ctx = StepContext::new(
            self.saga.id,
            index,
            row.name.as_str(),
            phase,
            attempt,
            self.input.clone(),
            Arc::new(outputs),
        )
        .with_state(self.def.state().cloned())
        .with_input_cache(self.typed_input.clone());
        // A row a fork took over undoes the original's effect with the original's key.
        let ctx = match row.keys_saga_id {
            Some(saga) => ctx.with_keys_of(saga),
            None => ctx,
        };
        let ctx = match &self.trace {
            Some(trace) => ctx.with_trace(trace.context),
            None => ctx,
        };
        match row.branch_of() {
            Some((group, branch)) => {
                let element = self.element_of(index);
                ctx.for_branch(group, branch, element)
            }
            None => ctx,
        }
    }

    /// The element of a branch of a mapped group: remembered from its group's start, or
    /// computed again from the same data (after a restart).
    fn element_of(&self, index: usize) -> Option<Arc<Value>> {
        let name = &self.saga.steps[index].name;
        if let Some(element) = self.elements.get(name) {
            return Some(element.clone());
        }
        let stage = self.stage_of(index);
        let step = self.def.steps().get(stage)?;
        let group = step.group().filter(|g| g.is_mapped())?;
        let (_, branch) = self.saga.steps[index].branch_of()?;
        let ctx = self.context(stage, Phase::Action, 0);
        let names = group.branches(step.name(), &ctx).ok()?;
        names
            .into_iter()
            .find(|(n, _)| n == branch)
            .and_then(|(_, element)| element.map(Arc::new))
    }

    pub(super) fn record(&mut self, index: usize, phase: Phase, attempt: u32, result: CallResult) {
        let now = self.now();
        match result {
            CallResult::Ok(value) => {
                let rec = phase_record_mut(&mut self.saga, index, phase);
                rec.status = StepStatus::Succeeded;
                rec.outcome_unknown = false;
                rec.ended_at = Some(now);
                let step = &mut self.saga.steps[index];
                let output = (phase == Phase::Action).then(|| {
                    step.output = Some(value.clone());
                    value
                });
                let kind = match phase {
                    Phase::Action => "step.succeeded",
                    Phase::Compensation => "step.compensated",
                };
                let name = step.name.clone();
                if phase == Phase::Compensation {
                    metrics::counter!("saga_compensations_total",
                        "name" => self.saga.name.clone(), "step" => self.metric_step(index))
                    .increment(1);
                }
                self.pending
                    .events
                    .push(NewEvent::step(kind, &name, json!({"attempt": attempt})));
                self.push_update(index, phase, output);
                self.pending.attempts.push(AttemptChange::Finish {
                    step_index: index as u32,
                    phase,
                    attempt,
                    outcome: "succeeded",
                    error: None,
                });
            }
            CallResult::Err { error, unknown } => {
                let label = if unknown {
                    "timed_out"
                } else if error.is_retryable() {
                    "retryable"
                } else {
                    "failed"
                };
                self.fail_phase(index, phase, attempt, &error, unknown, label, now);
            }
        }
    }

    /// Records a failed attempt and decides between another attempt and giving up (actions
    /// only: compensations never give up).
    #[allow(clippy::too_many_arguments)]
    fn fail_phase(
        &mut self,
        index: usize,
        phase: Phase,
        attempt: u32,
        error: &StepError,
        unknown: bool,
        label: &'static str,
        now: Millis,
    ) {
        let policy = match (self.call_site(index), phase) {
            (Some(call), Phase::Action) => *call.retry_policy(),
            (Some(call), Phase::Compensation) => call
                .compensation_retry_policy()
                .copied()
                .unwrap_or_else(saga_dsl::RetryPolicy::forever),
            // A row the definition does not know: its failure is final.
            (None, _) => saga_dsl::RetryPolicy::new().with_max_attempts(1),
        };
        let hint = match error {
            StepError::RetryAfter { delay, .. } => *delay,
            _ => Duration::ZERO,
        };
        let delay = policy.delay_after(attempt).max(hint);
        let attention_after = self.inner.config.needs_attention_after;
        let verdict = stages::after_failure(
            self.call_site(index),
            phase,
            &self.saga.steps[index],
            attempt,
            error.is_retryable(),
            now,
            delay,
        );
        let rec = phase_record_mut(&mut self.saga, index, phase);
        rec.last_error = Some(error.message().to_owned());
        rec.outcome_unknown = unknown;
        rec.ended_at = Some(now);
        let retry = verdict == AfterFailure::Retry;
        let step_name = self.saga.steps[index].name.clone();
        let mut events = Vec::new();
        let rec = phase_record_mut(&mut self.saga, index, phase);
        if retry {
            rec.status = StepStatus::Retrying;
            let kind = match phase {
                Phase::Action => "step.retrying",
                Phase::Compensation => "step.compensation_retrying",
            };
            events.push(NewEvent::step(
                kind,
                &step_name,
                json!({"attempt": attempt, "error": error.message(), "outcome": label,
                       "retry_in_ms": delay.as_millis() as u64}),
            ));
        } else {
            rec.status = if unknown {
                StepStatus::Unknown
            } else {
                StepStatus::Failed
            };
            events.push(NewEvent::step(
                "step.failed",
                &step_name,
                json!({"attempt": attempt, "error": error.message(), "outcome": label}),
            ));
        }
        if retry {
            let at = now + delay.as_millis() as i64;
            if self.saga.steps[index].branch_of().is_some() {
                // Branches retry each on a timer of its own, kept in their rows.
                self.saga.steps[index].retry_at = Some(at);
            } else {
                self.saga.next_run_at = Some(at);
            }
            metrics::counter!("saga_step_retries_total",
                "name" => self.saga.name.clone(), "step" => self.metric_step(index),
                "phase" => phase.as_str())
            .increment(1);
        }
        if phase == Phase::Compensation
            && !self.saga.needs_attention
            && (attempt >= attention_after || !error.is_retryable())
        {
            self.saga.needs_attention = true;
            events.push(NewEvent::step(
                "saga.needs_attention",
                &step_name,
                json!({"attempts": attempt, "error": error.message()}),
            ));
            tracing::error!(step = %step_name, attempts = attempt, error = %error, "compensation keeps failing; saga needs attention (still retrying)");
        }
        if verdict == AfterFailure::Pause {
            let in_budget = attempt.saturating_sub(self.saga.steps[index].budget_attempts);
            events.extend(plan::pause_exhausted(
                &mut self.saga,
                &step_name,
                in_budget,
                error.message(),
            ));
            tracing::warn!(step = %step_name, attempts = attempt, error = %error, "retries ran out; saga paused for a person");
        }
        self.pending.events.extend(events);
        self.push_update(index, phase, None);
        self.pending.attempts.push(AttemptChange::Finish {
            step_index: index as u32,
            phase,
            attempt,
            outcome: label,
            error: Some(error.message().to_owned()),
        });
    }

    /// Pauses the saga in memory for the operator's request `request` (its audit data as JSON
    /// text), to be written (giving the lease up) once the calls in flight are recorded.
    fn pause_for(&mut self, request: &str) {
        let request: Value = serde_json::from_str(request).unwrap_or(Value::Null);
        self.pending
            .events
            .extend(plan::pause_requested(&mut self.saga, &request));
    }

    /// Writes the pending changes and the saga's current fields in one fenced transaction,
    /// retrying briefly when the database is away for a moment.
    ///
    /// A write that starts a call, or gives back a saga that has not ended, is refused if an
    /// operator asked for a pause: one that starts a call answers
    /// [`Applied::PauseRequested`] (its caller takes the starts back and pauses); one that
    /// gives the saga back is made again here, the saga `PAUSED`.
    pub(super) async fn write(
        &mut self,
        unless_cancelled: bool,
        release: bool,
    ) -> Result<Applied, StoreError> {
        let starts = self
            .pending
            .attempts
            .iter()
            .any(|a| matches!(a, AttemptChange::Start { .. }));
        let open = !self.saga.status.is_terminal() && self.saga.status != SagaStatus::Paused;
        let unless_paused = starts || (release && open);
        match self
            .write_guarded(unless_cancelled, unless_paused, release)
            .await?
        {
            Applied::PauseRequested(request) if !starts => {
                self.pause_for(&request);
                self.write_guarded(false, false, release).await
            }
            applied => Ok(applied),
        }
    }

    /// [`Driver::write`] with the guards given.
    async fn write_guarded(
        &mut self,
        unless_cancelled: bool,
        unless_paused: bool,
        release: bool,
    ) -> Result<Applied, StoreError> {
        let pending = std::mem::take(&mut self.pending);
        let transition = Transition {
            saga: SagaUpdate {
                status: self.saga.status,
                next_run_at: self.saga.next_run_at,
                error: self.saga.error.clone(),
                output: (self.saga.status == SagaStatus::Completed)
                    .then(|| self.saga.output.clone())
                    .flatten(),
                needs_attention: self.saga.needs_attention,
                pivot_started: self.saga.pivot_started,
                paused_from: self
                    .saga
                    .paused_from
                    .filter(|_| self.saga.status == SagaStatus::Paused),
            },
            new_steps: pending.new_steps,
            steps: pending.steps,
            attempts: pending.attempts,
            events: pending.events,
            unless_cancelled,
            unless_paused,
            release,
            // A child saga that ends makes its parent due.
            wake: self
                .saga
                .parent_id
                .filter(|_| self.saga.status.is_terminal()),
        };
        let store = &self.inner.store;
        let backoff = ExponentialBackoff::from_millis(2)
            .factor(10)
            .max_delay(Duration::from_secs(2))
            .map(jitter)
            .take(8);
        let applied = RetryIf::start(
            backoff,
            || store.apply(&self.lease, &transition),
            |e: &StoreError| {
                let transient = e.is_transient();
                if transient {
                    tracing::warn!(error = %e, "step log write failed; retrying");
                }
                transient
            },
        )
        .await;
        if matches!(applied, Ok(Applied::Written)) && !self.interrupted.is_empty() {
            let interrupted = std::mem::take(&mut self.interrupted);
            self.trace_interrupted(&interrupted).await;
        }
        if !matches!(applied, Ok(Applied::Written)) {
            // Nothing was written: keep the changes so the caller can decide.
            self.pending = Pending {
                new_steps: transition.new_steps,
                steps: transition.steps,
                attempts: transition.attempts,
                events: transition.events,
            };
        }
        applied
    }
}

/// What write-aheads change in the driver's memory, to take them back if the write is refused
/// for a cancel (cheaper than a copy of the whole saga before every call).
struct Undo {
    status: SagaStatus,
    pivot_started: bool,
    /// Each call's row, phase, record and wait time before its write-ahead.
    records: Vec<(usize, Phase, PhaseRecord, Option<Millis>)>,
    steps: usize,
    attempts: usize,
}

impl Undo {
    fn of(driver: &Driver, calls: &[(usize, Phase)]) -> Self {
        Self {
            status: driver.saga.status,
            pivot_started: driver.saga.pivot_started,
            records: calls
                .iter()
                .map(|&(index, phase)| {
                    let record = phase_record(&driver.saga, index, phase).clone();
                    (index, phase, record, driver.saga.steps[index].retry_at)
                })
                .collect(),
            steps: driver.pending.steps.len(),
            attempts: driver.pending.attempts.len(),
        }
    }

    /// Puts the saga and the pending changes back as they were before the write-aheads (the
    /// refused write handed the pending changes back, the write-aheads' among them).
    fn apply(self, driver: &mut Driver) {
        driver.saga.status = self.status;
        driver.saga.pivot_started = self.pivot_started;
        for (index, phase, record, retry_at) in self.records {
            *phase_record_mut(&mut driver.saga, index, phase) = record;
            driver.saga.steps[index].retry_at = retry_at;
        }
        driver.pending.steps.truncate(self.steps);
        driver.pending.attempts.truncate(self.attempts);
    }
}

/// Releases the lease of a saga this driver could not finish writing, so that it is claimed
/// again (by this process or another) and resumed from what the log says, not from this
/// driver's memory. Retried while the database is away: the heartbeat would otherwise keep an
/// abandoned lease alive for as long as the process lives.
async fn give_back(inner: &Inner, lease: &Lease, stop: &CancellationToken) {
    let mut delay = Duration::from_millis(100);
    loop {
        match inner.store.release_lease(lease).await {
            Ok(()) => return,
            Err(StoreError::LeaseLost(_)) => return,
            Err(e) => tracing::warn!(error = %e, "releasing the lease failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            // At shutdown, deregistration releases every lease of this worker anyway.
            _ = stop.cancelled() => return,
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

fn before_point(phase: Phase) -> &'static str {
    match phase {
        Phase::Action => "before_action",
        Phase::Compensation => "before_compensation",
    }
}

fn after_point(phase: Phase) -> &'static str {
    match phase {
        Phase::Action => "after_action",
        Phase::Compensation => "after_compensation",
    }
}

fn phase_record(saga: &Saga, index: usize, phase: Phase) -> &PhaseRecord {
    match phase {
        Phase::Action => &saga.steps[index].action,
        Phase::Compensation => &saga.steps[index].compensation,
    }
}

fn phase_record_mut(saga: &mut Saga, index: usize, phase: Phase) -> &mut PhaseRecord {
    match phase {
        Phase::Action => &mut saga.steps[index].action,
        Phase::Compensation => &mut saga.steps[index].compensation,
    }
}
