//! Drives one claimed saga: decide, write ahead, call, write the result, until the saga is
//! terminal, waits on a long retry timer, loses its lease, or the engine shuts down.
//!
//! Every call is preceded by a committed write-ahead record (step status `RUNNING`, attempt
//! number, attempt-log row, `outcome_unknown`), and followed by a committed result. To save a
//! commit per step, the result of one call and the write-ahead of the next share a transaction;
//! saga-level changes that follow from a result (compensating, completed, …) are folded into the
//! same transaction too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use saga_dsl::{Phase, SagaDefinition, Step, StepContext, StepError, StepKind};
use serde_json::{json, Value};
use tokio_retry::strategy::{jitter, ExponentialBackoff};
use tokio_retry::RetryIf;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::plan::{self, NextCall};
use super::Inner;
use crate::failpoint::crash_if_armed;
use crate::model::{rfc3339, Millis, PhaseRecord, Saga, SagaStatus, StepStatus};
use crate::store::{
    Applied, AttemptChange, Claimed, Lease, NewEvent, SagaUpdate, StepUpdate, StoreError,
    Transition,
};

/// Changes made in memory and not yet written.
#[derive(Debug, Clone, Default)]
struct Pending {
    steps: Vec<StepUpdate>,
    attempts: Vec<AttemptChange>,
    events: Vec<NewEvent>,
}

/// The outcome of one call.
enum CallResult {
    Ok(Value),
    Err { error: StepError, unknown: bool },
}

impl CallResult {
    /// The outcome as the attempt log names it, for metric labels.
    fn outcome(&self) -> &'static str {
        match self {
            Self::Ok(_) => "succeeded",
            Self::Err { unknown: true, .. } => "timed_out",
            Self::Err { error, .. } if error.is_retryable() => "retryable",
            Self::Err { .. } => "failed",
        }
    }
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
        let mut driver = Driver {
            inner,
            lease: claimed.lease,
            saga: claimed.saga,
            def,
            input,
            stop,
            pending: Pending::default(),
            slot: Some(slot),
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

struct Driver {
    inner: Arc<Inner>,
    lease: Lease,
    saga: Saga,
    def: Arc<SagaDefinition>,
    input: Arc<Value>,
    stop: CancellationToken,
    pending: Pending,
    /// This driver's worker slot, given back as soon as the saga needs nothing more from it.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Driver {
    fn now(&self) -> Millis {
        self.inner.clock.now_ms()
    }

    async fn run(&mut self, ahead: bool) -> Result<(), StoreError> {
        if ahead {
            // The create recorded this call's write-ahead: its step is running, not interrupted.
            let attempt = self.saga.steps[0].action.attempts;
            self.call_and_record(0, Phase::Action, attempt).await;
        } else {
            self.recover_interrupted();
        }
        loop {
            let now = self.now();
            let events = plan::settle(&mut self.saga, now);
            self.pending.events.extend(events);
            match plan::next_call(&self.saga, now) {
                NextCall::Done => {
                    self.write(false, true).await?;
                    // Free the slot before telling waiters: a caller that starts its next saga
                    // on hearing of this one finds a slot and drives it at once.
                    self.slot.take();
                    if self.saga.status.is_terminal() {
                        metrics::counter!("saga_ended_total",
                            "name" => self.saga.name.clone(), "status" => self.saga.status.as_str())
                        .increment(1);
                        self.inner.notify_terminal(self.saga.id, self.saga.status);
                    }
                    return Ok(());
                }
                NextCall::Wait(at) => {
                    let wait = Duration::from_millis((at - now).max(0) as u64);
                    if wait <= self.inner.config.hold_backoff_below && !self.stop.is_cancelled() {
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
                NextCall::Call(index, phase) => {
                    if self.stop.is_cancelled() {
                        self.write(false, true).await?;
                        return Ok(());
                    }
                    if phase == Phase::Action {
                        match self.decide(index, now).await? {
                            Decision::Call => {}
                            // Written with whatever comes next.
                            Decision::Decided => continue,
                            Decision::AwaitSignal(signal) => {
                                self.await_signal(&signal).await?;
                                return Ok(());
                            }
                        }
                    }
                    let undo = Undo::of(self, index, phase);
                    let fresh_start = phase == Phase::Action
                        && matches!(
                            self.saga.steps[index].action.status,
                            StepStatus::Pending | StepStatus::Retrying
                        );
                    let attempt = self.write_ahead(index, phase, now);
                    if self.write(fresh_start, false).await? == Applied::CancelRequested {
                        // A cancel arrived before this action could start: do not start it.
                        undo.apply(self);
                        self.saga.cancel_requested = true;
                        continue;
                    }
                    self.call_and_record(index, phase, attempt).await;
                }
            }
        }
    }

    /// Decides a step that needs no call now: a condition that is false (`SKIPPED`), a sleep
    /// that starts (`WAITING` until its wake time) or ends, a signal wait that starts, takes
    /// its signal or times out. Changes are kept in memory, to be written with whatever comes
    /// next. A condition, wake time or timeout that cannot be computed fails the step
    /// permanently: it depends only on the saga's data, so asking again cannot change it.
    async fn decide(&mut self, index: usize, now: Millis) -> Result<Decision, StoreError> {
        let def = self.def.clone();
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
        match step.kind() {
            StepKind::Sleep => self.decide_sleep(step, index, now),
            StepKind::Signal => return self.decide_signal(step, index, now).await,
            _ => return Ok(Decision::Call),
        }
        Ok(Decision::Decided)
    }

    /// Starts a sleep, or ends it (the plan asks only once its wake time has come).
    fn decide_sleep(&mut self, step: &Step, index: usize, now: Millis) {
        if self.saga.steps[index].action.status != StepStatus::Pending {
            self.settle_without_call(index, StepStatus::Succeeded, Some(Value::Null), now);
            let wake_at = self.saga.steps[index].wake_at.map(rfc3339);
            let data = json!({ "wake_at": wake_at });
            self.pending
                .events
                .push(NewEvent::step("step.succeeded", step.name(), data));
            return;
        }
        let wake = step
            .wake_time(&self.context(index, Phase::Action, 0), system_time(now))
            .unwrap_or_else(|| Err(StepError::permanent("a sleep without a wake time")))
            .and_then(millis);
        match wake {
            Ok(at) => {
                self.saga.steps[index].wake_at = Some(at);
                self.start_waiting(index, now);
                let data = json!({"wake_at": rfc3339(at)});
                self.pending
                    .events
                    .push(NewEvent::step("step.waiting", step.name(), data));
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
        step: &Step,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        let signal = step.signal_name().unwrap_or_default().to_owned();
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
                let deadline = step
                    .signal_deadline(&ctx, system_time(now))
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
                // Due at the timeout, or only when something happens to the saga.
                self.saga.next_run_at = deadline;
                let data = json!({"signal": signal, "timeout_at": deadline.map(rfc3339)});
                self.pending
                    .events
                    .push(NewEvent::step("step.waiting", step.name(), data));
                return Ok(Decision::AwaitSignal(signal));
            }
            None => match self.saga.steps[index].timeout_at {
                Some(at) if at <= now => match step.signal_default() {
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
        match step.accept_signal(&ctx, payload) {
            Ok(output) => {
                self.settle_without_call(index, StepStatus::Succeeded, Some(output), now);
                let data = json!({"signal": signal});
                self.pending
                    .events
                    .push(NewEvent::step("step.succeeded", step.name(), data));
            }
            Err(e) => self.refuse(index, e.message(), now),
        }
        Ok(Decision::Decided)
    }

    /// Marks a wait that starts now as `WAITING` and queues its record.
    fn start_waiting(&mut self, index: usize, now: Millis) {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        let action = &mut self.saga.steps[index].action;
        action.status = StepStatus::Waiting;
        action.started_at = Some(now);
        action.outcome_unknown = false;
        self.push_action(index, None);
    }

    /// Gives back a saga whose signal step waits: a signal, its timeout or a cancel makes it
    /// due again. A signal received while the wait was being written is not lost: its sender
    /// either saw the wait written (and made the saga due) or wrote it before this check, which
    /// then makes the saga due.
    async fn await_signal(&mut self, signal: &str) -> Result<(), StoreError> {
        self.write(false, true).await?;
        self.slot.take();
        self.inner.wake.notify_one();
        let mut delay = Duration::from_millis(50);
        loop {
            match self
                .inner
                .store
                .due_if_signalled(self.saga.id, signal)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_transient() && !self.stop.is_cancelled() => {
                    tracing::warn!(error = %e, "checking for a signal that came meanwhile failed; retrying");
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
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
        self.push_action(index, output);
    }

    /// Fails a step that was never called: permanently, with `error`.
    fn refuse(&mut self, index: usize, error: &str, now: Millis) {
        self.saga.steps[index].action.last_error = Some(error.to_owned());
        self.settle_without_call(index, StepStatus::Failed, None, now);
        let data = json!({"attempt": 0, "error": error, "outcome": "failed"});
        let name = self.saga.steps[index].name.clone();
        self.pending
            .events
            .push(NewEvent::step("step.failed", &name, data));
    }

    /// Queues the write of a step's action record as it is now in memory.
    fn push_action(&mut self, index: usize, output: Option<Value>) {
        let step = &self.saga.steps[index];
        self.pending.steps.push(StepUpdate {
            index: index as u32,
            phase: Phase::Action,
            record: step.action.clone(),
            output,
            wake_at: step.wait_until(),
            waiting_for: step.waiting_for.clone(),
        });
    }

    /// Makes a call whose write-ahead is committed and keeps its result in memory, to be
    /// written with whatever comes next.
    async fn call_and_record(&mut self, index: usize, phase: Phase, attempt: u32) {
        let step_name = self.def.steps()[index].name().to_owned();
        crash_if_armed(before_point(phase), &step_name);
        let started = std::time::Instant::now();
        let result = self.call(index, phase, attempt).await;
        metrics::histogram!("saga_step_duration_seconds",
            "name" => self.saga.name.clone(), "step" => step_name.clone(),
            "phase" => phase.as_str(), "outcome" => result.outcome())
        .record(started.elapsed().as_secs_f64());
        crash_if_armed(after_point(phase), &step_name);
        self.record(index, phase, attempt, result);
    }

    /// A phase left `RUNNING` by a previous owner was interrupted: its outcome is unknown. Close
    /// its attempt and schedule the same call again (same idempotency key), within its budget.
    fn recover_interrupted(&mut self) {
        let now = self.now();
        for index in 0..self.saga.steps.len() {
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
            }
        }
    }

    fn write_ahead(&mut self, index: usize, phase: Phase, now: Millis) -> u32 {
        if self.saga.status == SagaStatus::Queued {
            self.saga.status = SagaStatus::Running;
        }
        // At the pivot or after it (a pivot that was skipped leaves the next step to pass it).
        if phase == Phase::Action && self.def.point_of_no_return().is_some_and(|p| index >= p) {
            self.saga.pivot_reached = true;
        }
        let rec = phase_record_mut(&mut self.saga, index, phase);
        rec.status = StepStatus::Running;
        rec.attempts += 1;
        // Until the result is written, nobody knows what the call did.
        rec.outcome_unknown = true;
        rec.started_at.get_or_insert(now);
        rec.ended_at = None;
        let attempt = rec.attempts;
        let update = StepUpdate {
            index: index as u32,
            phase,
            record: rec.clone(),
            output: None,
            wake_at: None,
            waiting_for: None,
        };
        self.pending.steps.push(update);
        self.pending.attempts.push(AttemptChange::Start {
            step_index: index as u32,
            phase,
            attempt,
        });
        attempt
    }

    /// What a call of step `index` (or its condition, or its wake time) is told.
    fn context(&self, index: usize, phase: Phase, attempt: u32) -> StepContext {
        let mut outputs = BTreeMap::new();
        for s in &self.saga.steps {
            let visible = phase == Phase::Compensation || (s.index as usize) < index;
            if visible && s.action.status == StepStatus::Succeeded {
                if let Some(out) = &s.output {
                    outputs.insert(s.name.clone(), out.clone());
                }
            }
        }
        StepContext::new(
            self.saga.id,
            index,
            self.def.steps()[index].name(),
            phase,
            attempt,
            self.input.clone(),
            Arc::new(outputs),
        )
    }

    async fn call(&self, index: usize, phase: Phase, attempt: u32) -> CallResult {
        let step = &self.def.steps()[index];
        let ctx = self.context(index, phase, attempt);
        let (timeout, mut handle) = match phase {
            Phase::Action => {
                let Some(action) = step.action().cloned() else {
                    // Steps that call nothing are decided without a call (`decide`).
                    return CallResult::Err {
                        error: StepError::permanent("step has no action"),
                        unknown: false,
                    };
                };
                (
                    step.attempt_timeout(),
                    tokio::spawn(async move { action.run(ctx).await }),
                )
            }
            Phase::Compensation => {
                let Some(comp) = step.compensation().cloned() else {
                    // Only compensatable steps are ever compensated (see `needs_compensation`).
                    return CallResult::Err {
                        error: StepError::permanent("step has no compensation"),
                        unknown: false,
                    };
                };
                (
                    step.compensation_attempt_timeout(),
                    tokio::spawn(async move { comp.run(ctx).await.map(|()| Value::Null) }),
                )
            }
        };
        match tokio::time::timeout(timeout, &mut handle).await {
            Ok(Ok(Ok(value))) => CallResult::Ok(value),
            Ok(Ok(Err(error))) => CallResult::Err {
                error,
                unknown: false,
            },
            Ok(Err(join)) => CallResult::Err {
                error: StepError::retryable(format!("the {phase} panicked: {join}")),
                unknown: true,
            },
            Err(_) => {
                handle.abort();
                CallResult::Err {
                    error: StepError::retryable(format!(
                        "timed out after {} ms; outcome unknown",
                        timeout.as_millis()
                    )),
                    unknown: true,
                }
            }
        }
    }

    fn record(&mut self, index: usize, phase: Phase, attempt: u32, result: CallResult) {
        let now = self.now();
        match result {
            CallResult::Ok(value) => {
                let rec = phase_record_mut(&mut self.saga, index, phase);
                rec.status = StepStatus::Succeeded;
                rec.outcome_unknown = false;
                rec.ended_at = Some(now);
                let record = rec.clone();
                let step = &mut self.saga.steps[index];
                let output = (phase == Phase::Action).then(|| {
                    step.output = Some(value.clone());
                    value
                });
                let kind = match phase {
                    Phase::Action => "step.succeeded",
                    Phase::Compensation => "step.compensated",
                };
                if phase == Phase::Compensation {
                    metrics::counter!("saga_compensations_total",
                        "name" => self.saga.name.clone(), "step" => step.name.clone())
                    .increment(1);
                }
                self.pending.events.push(NewEvent::step(
                    kind,
                    &step.name,
                    json!({"attempt": attempt}),
                ));
                self.pending.steps.push(StepUpdate {
                    index: index as u32,
                    phase,
                    record,
                    output,
                    wake_at: None,
                    waiting_for: None,
                });
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
        let step_def = &self.def.steps()[index];
        let policy = match phase {
            Phase::Action => *step_def.retry_policy(),
            Phase::Compensation => *step_def.compensation_retry_policy(),
        };
        let hint = match error {
            StepError::RetryAfter { delay, .. } => *delay,
            _ => Duration::ZERO,
        };
        let delay = policy.delay_after(attempt).max(hint);
        let attention_after = self.inner.config.needs_attention_after;
        let rec = phase_record_mut(&mut self.saga, index, phase);
        rec.last_error = Some(error.message().to_owned());
        rec.outcome_unknown = unknown;
        rec.ended_at = Some(now);
        let retry = match phase {
            Phase::Action => error.is_retryable() && policy.allows_attempt(attempt + 1),
            Phase::Compensation => true,
        };
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
        let record = rec.clone();
        if retry {
            self.saga.next_run_at = Some(now + delay.as_millis() as i64);
            metrics::counter!("saga_step_retries_total",
                "name" => self.saga.name.clone(), "step" => step_name.clone(),
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
        self.pending.events.extend(events);
        self.pending.steps.push(StepUpdate {
            index: index as u32,
            phase,
            record,
            output: None,
            wake_at: None,
            waiting_for: None,
        });
        self.pending.attempts.push(AttemptChange::Finish {
            step_index: index as u32,
            phase,
            attempt,
            outcome: label,
            error: Some(error.message().to_owned()),
        });
    }

    /// Writes the pending changes and the saga's current fields in one fenced transaction,
    /// retrying briefly when the database is away for a moment.
    async fn write(
        &mut self,
        unless_cancelled: bool,
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
                pivot_reached: self.saga.pivot_reached,
            },
            steps: pending.steps,
            attempts: pending.attempts,
            events: pending.events,
            unless_cancelled,
            release,
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
        if applied.is_err()
            || applied
                .as_ref()
                .is_ok_and(|a| *a == Applied::CancelRequested)
        {
            // Nothing was written: keep the changes so the caller can decide.
            self.pending = Pending {
                steps: transition.steps,
                attempts: transition.attempts,
                events: transition.events,
            };
        }
        applied
    }
}

/// What [`Driver::decide`] found for a step that may not need a call.
enum Decision {
    /// The step calls its action.
    Call,
    /// The step was decided without a call.
    Decided,
    /// The step waits for this signal: give the saga back until it comes.
    AwaitSignal(String),
}

/// What a write-ahead changes in the driver's memory, to take it back if the write is refused
/// for a cancel (cheaper than a copy of the whole saga before every call).
struct Undo {
    status: SagaStatus,
    pivot_reached: bool,
    index: usize,
    phase: Phase,
    record: PhaseRecord,
    steps: usize,
    attempts: usize,
}

impl Undo {
    fn of(driver: &Driver, index: usize, phase: Phase) -> Self {
        Self {
            status: driver.saga.status,
            pivot_reached: driver.saga.pivot_reached,
            index,
            phase,
            record: phase_record(&driver.saga, index, phase).clone(),
            steps: driver.pending.steps.len(),
            attempts: driver.pending.attempts.len(),
        }
    }

    /// Puts the saga and the pending changes back as they were before the write-ahead (the
    /// refused write handed the pending changes back, the write-ahead's among them).
    fn apply(self, driver: &mut Driver) {
        driver.saga.status = self.status;
        driver.saga.pivot_reached = self.pivot_reached;
        *phase_record_mut(&mut driver.saga, self.index, self.phase) = self.record;
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
