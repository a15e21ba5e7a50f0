//! The scheduler every serving process runs: it leases the schedules with a tick due, fires
//! each due tick under the schedule's overlap policy, advances the schedule past it durably,
//! and sleeps until the earliest next tick (at most a second, so that schedules made by other
//! processes are seen; at once when one is made or changed here).
//!
//! A tick is fired by starting its saga ([`super::run_saga_id`], keyed by [`super::tick_key`])
//! and then recording the advance and the tick's run in one transaction that holds only while
//! the lease does and the schedule still stands at that tick. Between the two a crash leaves
//! the tick due; the next firing finds its saga (it exists already, so the tick is recorded as
//! started with it) and never starts another. After downtime, the ticks older than the
//! catch-up window are recorded as missed (the latest [`RUNS_KEPT`] of them), the others fire
//! in order.

use std::collections::VecDeque;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{cadence_of, run_saga_id, tick_key, ScheduleError, CHANGED};
use crate::engine::{Engine, StartError, StartRequest};
use crate::model::{Millis, NewScheduleRun, Overlap, RunOutcome, Schedule, ScheduleRun, RUNS_KEPT};
use crate::operations::Operations;
use crate::store::{ScheduleAdvance, ScheduleCursor, StoreError};

/// How long a process holds a schedule while firing it; a process that dies meanwhile holds
/// it back this long at most.
const LEASE_MS: i64 = 10_000;
/// Schedules leased at once.
const BATCH: u32 = 16;
/// Ticks fired in one pass over one schedule before the lease is given back.
const MAX_TICKS_PER_PASS: usize = 64;
/// The longest sleep: schedules made or resumed by other processes are seen this late at most.
const POLL: Duration = Duration::from_secs(1);
/// The sleep while a due schedule is leased by another process.
const BUSY_ELSEWHERE: Duration = Duration::from_millis(200);

/// Fires the schedules of the log of `engine` until `shutdown`.
pub async fn run(engine: Engine, shutdown: CancellationToken) {
    let owner = format!("{}/scheduler", engine.config().worker_id);
    let store = engine.store().clone();
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let now = engine.clock().now_ms();
        let mut claimed_all = false;
        let mut advanced_any = false;
        match store
            .claim_due_schedules(&owner, now, LEASE_MS, BATCH)
            .await
        {
            Ok(claimed) => {
                claimed_all = claimed.len() == BATCH as usize;
                for s in claimed {
                    let id = s.id.clone();
                    match fire_due(&engine, &owner, s).await {
                        Ok(advanced) => advanced_any |= advanced,
                        Err(e) => {
                            tracing::warn!(schedule = %id, error = %e, "firing a schedule failed; will retry");
                        }
                    }
                    if let Err(e) = store.release_schedule(&id, &owner).await {
                        tracing::debug!(schedule = %id, error = %e, "releasing a schedule failed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "looking for due schedules failed; will retry"),
        }
        // Straight on only after progress: a pass that moved nothing (a store that keeps
        // failing) would otherwise spin.
        if claimed_all && advanced_any {
            continue;
        }
        let now = engine.clock().now_ms();
        let wait = match store.earliest_schedule_fire().await {
            Ok(Some(at)) if at > now => {
                Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(POLL)
            }
            // Still due after a pass that advanced: more ticks to fire here.
            Ok(Some(_)) if advanced_any => Duration::ZERO,
            // Due, but not claimed: another process holds it, or firing it failed.
            Ok(Some(_)) => BUSY_ELSEWHERE,
            Ok(None) | Err(_) => POLL,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = CHANGED.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// A run to record.
fn run_of(
    at: Millis,
    outcome: RunOutcome,
    saga: Option<Uuid>,
    triggered: bool,
    detail: Option<String>,
) -> NewScheduleRun {
    NewScheduleRun {
        scheduled_at: at,
        outcome,
        saga_id: saga,
        triggered,
        detail,
    }
}

/// Whether the schedule's previous run (its saga `last`) has not ended.
async fn running(engine: &Engine, last: Option<Uuid>) -> Result<bool, StoreError> {
    let Some(last) = last else { return Ok(false) };
    Ok(engine
        .store()
        .saga_status(last)
        .await?
        .is_some_and(|status| !status.is_terminal()))
}

/// What firing one tick came to.
struct Fired {
    run: NewScheduleRun,
    /// The saga started.
    saga: Option<Uuid>,
    /// The tick buffered.
    buffered: Option<Millis>,
}

/// Starts the saga of the tick at `at`: its id, or the refusal recorded as the tick's failure.
/// A database failure is returned, so that the tick stays due.
async fn start_tick(
    engine: &Engine,
    s: &Schedule,
    at: Millis,
) -> Result<Result<Uuid, String>, StoreError> {
    let request = StartRequest::new(s.saga.clone(), s.input.clone())
        .with_key(tick_key(s, at))
        .with_id(run_saga_id(s, at));
    match engine.start(request).await {
        Ok(outcome) => {
            let id = outcome.saga_id();
            tracing::info!(schedule = %s.id, saga.id = %id, tick = %crate::model::rfc3339(at), "schedule fired");
            Ok(Ok(id))
        }
        Err(StartError::Store(e)) => Err(e),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// Fires the tick at `at` of `s` under its overlap policy.
async fn fire_tick(
    engine: &Engine,
    s: &Schedule,
    at: Millis,
    triggered: bool,
) -> Result<Fired, StoreError> {
    let started = |id: Uuid, outcome: RunOutcome, detail: Option<String>| Fired {
        run: run_of(at, outcome, Some(id), triggered, detail),
        saga: Some(id),
        buffered: None,
    };
    // A tick that started nothing: skipped, buffered (`buffered` names it) or failed.
    let held = |outcome: RunOutcome, why: String, buffered: Option<Millis>| Fired {
        run: run_of(at, outcome, None, triggered, Some(why)),
        saga: None,
        buffered,
    };
    let failed = |why: String| held(RunOutcome::Failed, why, None);
    // Fired before, and its advance lost to a crash: the saga stands, so the tick ran.
    let own = run_saga_id(s, at);
    if engine.store().saga_status(own).await?.is_some() {
        return Ok(started(own, RunOutcome::Started, None));
    }
    let previous = s.last_saga_id.filter(|id| *id != own);
    let busy = running(engine, previous).await?;
    let prev = previous.map(|id| id.to_string()).unwrap_or_default();
    Ok(match (s.overlap, busy) {
        // A tick already waits: it starts first, and the newer one is not kept.
        (Overlap::BufferOne, _) if s.buffered_at.is_some() => held(
            RunOutcome::Skipped,
            format!("a tick was already buffered behind the previous run, saga {prev}"),
            None,
        ),
        (_, false) | (Overlap::AllowAll, true) => match start_tick(engine, s, at).await? {
            Ok(id) => started(id, RunOutcome::Started, None),
            Err(why) => failed(why),
        },
        (Overlap::Skip, true) => held(
            RunOutcome::Skipped,
            format!("the previous run, saga {prev}, had not ended"),
            None,
        ),
        (Overlap::BufferOne, true) if s.buffered_at.is_none() => held(
            RunOutcome::Buffered,
            format!("waits for the previous run, saga {prev}, to end"),
            Some(at),
        ),
        (Overlap::BufferOne, true) => held(
            RunOutcome::Skipped,
            format!("the previous run, saga {prev}, had not ended and a tick was already buffered"),
            None,
        ),
        (Overlap::CancelOther, true) => {
            let reason = format!(
                "schedule {} started its run of {} (overlap: cancel_other)",
                s.id,
                crate::model::rfc3339(at)
            );
            let actor = format!("schedule:{}", s.id);
            let cancelled = match previous {
                Some(id) => Operations::of(engine)
                    .cancel_audited(id, Some(&actor), Some(&reason))
                    .await
                    .map(|_| ()),
                None => Ok(()),
            };
            let detail = match cancelled {
                Ok(()) => format!("cancelled the previous run, saga {prev}"),
                Err(e) => format!("the previous run, saga {prev}, could not be cancelled: {e}"),
            };
            match start_tick(engine, s, at).await? {
                Ok(id) => started(id, RunOutcome::CancelledOther, Some(detail)),
                Err(why) => failed(format!("{why} ({detail})")),
            }
        }
    })
}

/// Fires what is due of the leased schedule `s`: its buffered tick once the run before it has
/// ended, then its due ticks (at most [`MAX_TICKS_PER_PASS`]), each advance recorded while the
/// lease holds. Whether it advanced the schedule.
async fn fire_due(engine: &Engine, owner: &str, mut s: Schedule) -> Result<bool, ScheduleError> {
    let store = engine.store();
    let mut advanced = false;
    let cadence = match cadence_of(&s) {
        Ok(c) => c,
        Err(e) => {
            // Retrying would fail the same way at every pass: the tick is recorded as failed
            // and the schedule parked, with no next tick, until it is made again.
            tracing::warn!(schedule = %s.id, error = %e, "a schedule whose cadence cannot be read is parked");
            let from = ScheduleCursor {
                next_fire_at: s.next_fire_at,
                buffered_at: s.buffered_at,
            };
            let to = ScheduleAdvance {
                next_fire_at: super::PARKED,
                buffered_at: None,
                last_saga_id: None,
            };
            let run = run_of(
                s.next_fire_at.min(engine.clock().now_ms()),
                RunOutcome::Failed,
                None,
                false,
                Some(format!(
                    "its cadence cannot be read, so it no longer fires: {e}"
                )),
            );
            let now = engine.clock().now_ms();
            return Ok(store
                .advance_schedule(&s.id, owner, from, &to, &[run], now)
                .await?);
        }
    };
    if let Some(at) = s.buffered_at {
        if !running(engine, s.last_saga_id).await? {
            let fired = match start_tick(engine, &s, at).await? {
                Ok(id) => Fired {
                    run: run_of(
                        at,
                        RunOutcome::Started,
                        Some(id),
                        false,
                        Some("buffered until the previous run ended".to_owned()),
                    ),
                    saga: Some(id),
                    buffered: None,
                },
                Err(why) => Fired {
                    run: run_of(at, RunOutcome::Failed, None, false, Some(why)),
                    saga: None,
                    buffered: None,
                },
            };
            let from = ScheduleCursor {
                next_fire_at: s.next_fire_at,
                buffered_at: Some(at),
            };
            let to = ScheduleAdvance {
                next_fire_at: s.next_fire_at,
                buffered_at: None,
                last_saga_id: fired.saga,
            };
            let now = engine.clock().now_ms();
            if !store
                .advance_schedule(&s.id, owner, from, &to, &[fired.run], now)
                .await?
            {
                return Ok(advanced);
            }
            advanced = true;
            s.buffered_at = None;
            s.last_saga_id = fired.saga.or(s.last_saga_id);
        }
    }
    for _ in 0..MAX_TICKS_PER_PASS {
        let now = engine.clock().now_ms();
        let at = s.next_fire_at;
        if at > now {
            break;
        }
        // Bounded as at creation, for a row stored before the bounds were enforced.
        let window = s
            .catchup_window
            .clamp(super::MIN_CATCHUP_WINDOW, super::MAX_CATCHUP_WINDOW);
        let window = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let oldest = now.saturating_sub(window);
        let (runs, to) = if at < oldest {
            // Every process was down at these ticks' time: they never run.
            let mut missed: VecDeque<Millis> = VecDeque::new();
            let mut count: u64 = 0;
            let mut t = at;
            while t < oldest {
                count += 1;
                if missed.len() == RUNS_KEPT {
                    missed.pop_front();
                }
                missed.push_back(t);
                match cadence.next_after(t) {
                    Some(next) => t = next,
                    None => {
                        t = super::PARKED;
                        break;
                    }
                }
            }
            tracing::warn!(schedule = %s.id, missed = count, "ticks older than the catch-up window were missed");
            let detail = format!(
                "every process was down at its time, more than {} ago ({count} missed in all)",
                super::human(s.catchup_window)
            );
            let runs: Vec<NewScheduleRun> = missed
                .into_iter()
                .map(|t| run_of(t, RunOutcome::Missed, None, false, Some(detail.clone())))
                .collect();
            let to = ScheduleAdvance {
                next_fire_at: t,
                buffered_at: s.buffered_at,
                last_saga_id: None,
            };
            (runs, to)
        } else {
            let fired = fire_tick(engine, &s, at, false).await?;
            let to = ScheduleAdvance {
                next_fire_at: cadence.next_after(at).unwrap_or(super::PARKED),
                buffered_at: fired.buffered.or(s.buffered_at),
                last_saga_id: fired.saga,
            };
            (vec![fired.run], to)
        };
        let from = ScheduleCursor {
            next_fire_at: s.next_fire_at,
            buffered_at: s.buffered_at,
        };
        let now = engine.clock().now_ms();
        if !store
            .advance_schedule(&s.id, owner, from, &to, &runs, now)
            .await?
        {
            // Changed meanwhile (paused, deleted, triggered, or taken over): the next pass
            // reads it again.
            return Ok(advanced);
        }
        advanced = true;
        s.next_fire_at = to.next_fire_at;
        s.buffered_at = to.buffered_at;
        s.last_saga_id = to.last_saga_id.or(s.last_saga_id);
    }
    Ok(advanced)
}

/// Fires `s` now, at `at`, as an operator's trigger: under its overlap policy, recorded in its
/// history without moving its next tick.
pub(super) async fn fire_triggered(
    engine: &Engine,
    s: &Schedule,
    at: Millis,
) -> Result<ScheduleRun, ScheduleError> {
    // Recorded only while the schedule stands as it was read and no scheduler holds it, so
    // that its overlap bookkeeping is never overwritten; otherwise read again and fired again
    // at the same instant, which finds the saga already started. After a lease's length of
    // tries the run is recorded anyway: its saga may already stand.
    const TRY_EVERY: Duration = Duration::from_millis(100);
    let tries = LEASE_MS / 100 + 10;
    let mut s = s.clone();
    let mut attempt = 0;
    let fired = loop {
        attempt += 1;
        let fired = fire_tick(engine, &s, at, true).await?;
        let expect = (attempt < tries).then_some({
            (
                ScheduleCursor {
                    next_fire_at: s.next_fire_at,
                    buffered_at: s.buffered_at,
                },
                s.last_saga_id,
            )
        });
        let now = engine.clock().now_ms();
        if engine
            .store()
            .record_schedule_runs(
                &s.id,
                expect,
                std::slice::from_ref(&fired.run),
                fired.saga,
                fired.buffered,
                now,
            )
            .await?
        {
            break fired;
        }
        s = super::get(engine.store().as_ref(), &s.id).await?;
        tokio::time::sleep(TRY_EVERY).await;
    };
    let now = engine.clock().now_ms();
    super::changed();
    let run = fired.run;
    Ok(ScheduleRun {
        scheduled_at: run.scheduled_at,
        outcome: run.outcome,
        saga_id: run.saga_id,
        triggered: run.triggered,
        detail: run.detail,
        recorded_at: now,
    })
}
