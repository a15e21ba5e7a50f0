//! The one vocabulary of every surface (SPEC §12): a saga as people and clients are shown it.
//!
//! The log keeps what the engine wrote (a compensation is `PENDING` from the start, whatever
//! becomes of the saga); the saga JSON of the HTTP API, `show`, `list` and the console all say
//! what that means now, computed here and nowhere else:
//! - a compensation that has not run is `PENDING` only when it will run: the saga is going back,
//!   or may still go back (it has not ended and its point of no return has not succeeded), and
//!   the step's action took effect or may have ([`needs_compensation`]). Otherwise it is
//!   `NOT_NEEDED`: the saga completed, was aborted, or is `FAILED` (it failed past its point of no
//!   return and waits for a person; a retry goes forward, an abort stops it, neither
//!   compensates), or the action never took effect (not yet run, failed definitively). A step
//!   without a compensation (a pivot, a retriable step, a wait) is always `NOT_NEEDED`;
//! - `pivot_reached` is true once the point of no return *succeeded*;
//! - a saga parked without a worker says on what (`waiting_for`) and until when (`wake_at`).

use uuid::Uuid;

use super::{needs_compensation, Saga, SagaStatus, StepKind, StepRecord, StepStatus};

impl Saga {
    /// The saga as every surface shows it: compensations that will never run as `NOT_NEEDED`,
    /// [`Saga::pivot_reached`], [`Saga::waiting_for`] and [`Saga::wake_at`] computed, and
    /// [`Saga::stages`] from the rows so shown. Showing a shown saga again changes nothing
    /// (a client may show what a server answered).
    pub fn shown(mut self) -> Self {
        self.pivot_reached = pivot_succeeded(&self.steps);
        let may_go_back = self.may_go_back();
        for step in &mut self.steps {
            step.compensation.status = shown_compensation(step, may_go_back);
        }
        self.waiting_for = self.waiting_row().map(|(step, retrying)| {
            wait_word(
                self.id,
                step.kind,
                retrying,
                step.waiting_for.as_deref(),
                &step.name,
            )
        });
        // The engine makes a waiting saga due when its wait ends (never, for a wait without a
        // deadline).
        self.wake_at = self.waiting_for.as_ref().and(self.next_run_at);
        if let Some(limit) = self
            .waiting_limit
            .as_ref()
            .filter(|_| self.status == SagaStatus::Queued)
        {
            // Waiting to start until its limit has room: nothing but that wakes it.
            self.waiting_for = Some(format!("limit:{limit}"));
            self.wake_at = None;
        }
        if self.status == SagaStatus::Paused {
            // It waits for a person: nothing wakes it on its own. Its stages keep their own
            // deadlines, which fire (if passed) only after a resume.
            self.waiting_for = Some(super::PAUSED_WAIT.to_owned());
            self.wake_at = None;
        }
        self.with_stages()
    }

    /// Whether compensations that have not run may still run: the saga is going back, or has
    /// not ended and may still go back (its point of no return has neither succeeded nor, when
    /// it is a retriable step, which fails forward, started).
    fn may_go_back(&self) -> bool {
        match self.status {
            SagaStatus::Compensating => true,
            SagaStatus::Paused if self.paused_from == Some(SagaStatus::Compensating) => true,
            // A paused saga may still be cancelled, and then goes back.
            SagaStatus::Queued | SagaStatus::Running | SagaStatus::Paused => {
                !self.pivot_reached
                    && point_of_no_return(&self.steps).is_none_or(|s| {
                        s.kind != StepKind::Retriable || s.action.status == StepStatus::Pending
                    })
            }
            SagaStatus::Completed
            | SagaStatus::Compensated
            | SagaStatus::Failed
            | SagaStatus::Aborted => false,
        }
    }

    /// The row the saga is parked on, if it waits without a worker, and whether it retries on
    /// a timer: the first (by position) whose phase in the saga's direction waits (a sleep, a
    /// signal, a child) or retries. The list asks the same of the log in SQL
    /// (`store::shared::reads`).
    fn waiting_row(&self) -> Option<(&StepRecord, bool)> {
        let forward = match self.status {
            SagaStatus::Running => true,
            SagaStatus::Compensating => false,
            _ => return None,
        };
        self.steps.iter().find_map(|s| {
            let phase = if forward { &s.action } else { &s.compensation };
            match phase.status {
                StepStatus::Waiting => Some((s, false)),
                StepStatus::Retrying => Some((s, true)),
                _ => None,
            }
        })
    }
}

/// The stage that is the saga's point of no return: the pivot, or else the first retriable
/// step (as the definition's `point_of_no_return`; the log's rows carry the kinds).
fn point_of_no_return(steps: &[StepRecord]) -> Option<&StepRecord> {
    steps
        .iter()
        .find(|s| matches!(s.kind, StepKind::Pivot | StepKind::Retriable))
}

/// Whether a stage at or after the point of no return succeeded: the pivot itself, or the
/// stage after it when its condition skipped it.
fn pivot_succeeded(steps: &[StepRecord]) -> bool {
    let Some(pivot) = point_of_no_return(steps) else {
        return false;
    };
    steps.iter().any(|s| {
        s.index >= pivot.index
            && s.branch_of().is_none()
            && s.action.status == StepStatus::Succeeded
    })
}

/// The compensation status of `step` as shown. Only a compensation that has not run is
/// interpreted; what ran (or runs, or was done by hand) is shown as the log holds it.
fn shown_compensation(step: &StepRecord, may_go_back: bool) -> StepStatus {
    let stored = step.compensation.status;
    if !matches!(stored, StepStatus::Pending | StepStatus::NotNeeded) {
        return stored;
    }
    // A kind without a compensation never has one to run (the log says `NOT_NEEDED`, or
    // `NONE` in older logs); `needs_compensation` answers for the kinds with one.
    if may_go_back && needs_compensation(step) {
        StepStatus::Pending
    } else {
        StepStatus::NotNeeded
    }
}

/// How a step's `waiting_for` begins while it waits for a rate limiter's token, the
/// limiter's name following.
pub(crate) const RATE_WAIT: &str = "rate:";

/// The `waiting_for` word of saga `id` parked on a row of `kind` (stage `stage`, waiting for
/// `signal` if a signal wait): `retry` when the row's phase in the saga's direction retries on a
/// timer, else what the stage waits for. The list builds it from the same parts read in SQL.
pub(crate) fn wait_word(
    id: Uuid,
    kind: StepKind,
    retrying: bool,
    signal: Option<&str>,
    stage: &str,
) -> String {
    if retrying {
        // A step waiting for a rate limiter's token waits on a timer like a retry, with the
        // limiter's name in its row.
        return match signal {
            Some(rate) if rate.starts_with(RATE_WAIT) => rate.to_owned(),
            _ => "retry".to_owned(),
        };
    }
    match kind {
        // A call whose participant is to call back (SPEC §16).
        kind if kind.calls() && signal == Some(super::task::TASK_WAIT) => {
            signal.unwrap_or_default().to_owned()
        }
        StepKind::Sleep => "sleep".to_owned(),
        StepKind::Signal => format!("signal:{}", signal.unwrap_or_default()),
        StepKind::Child => format!("child:{}", saga_dsl::child_saga_id(id, stage)),
        // A wait of a kind a later build adds: named by the kind itself.
        kind => kind.to_string(),
    }
}

#[cfg(test)]
mod tests {
    //! The vocabulary's rules on hand-built records, one saga shape per case.

    use super::*;
    use crate::model::fixtures::{saga, step, NOW};
    use StepKind::{Compensatable, Pivot, Retriable, Signal};
    use StepStatus::{Failed, NotNeeded, Pending, Succeeded, Unknown, Waiting};

    fn comps(s: &Saga) -> Vec<StepStatus> {
        s.steps.iter().map(|r| r.compensation.status).collect()
    }

    #[test]
    fn a_completed_saga_needs_no_compensation_and_reached_its_pivot() {
        let s = saga(
            SagaStatus::Completed,
            vec![
                step(0, "a", Compensatable, Succeeded),
                step(1, "p", Pivot, Succeeded),
                step(2, "r", Retriable, Succeeded),
            ],
        )
        .shown();
        assert_eq!(comps(&s), [NotNeeded, NotNeeded, NotNeeded]);
        assert!(s.pivot_reached);
        assert_eq!(s.waiting_for, None);
    }

    #[test]
    fn a_compensating_saga_undoes_what_took_effect_and_not_a_definitive_failure() {
        let s = saga(
            SagaStatus::Compensating,
            vec![
                step(0, "a", Compensatable, Succeeded),
                step(1, "b", Compensatable, Unknown),
                step(2, "c", Compensatable, Failed),
                step(3, "p", Pivot, Pending),
            ],
        )
        .shown();
        assert_eq!(comps(&s), [Pending, Pending, NotNeeded, NotNeeded]);
        assert!(!s.pivot_reached);
    }

    #[test]
    fn a_failed_pivot_is_not_reached_and_a_running_saga_may_still_go_back() {
        let mut pivot = step(1, "p", Pivot, Failed);
        pivot.compensation.status = NotNeeded;
        let s = saga(
            SagaStatus::Compensated,
            vec![step(0, "a", Compensatable, Succeeded), pivot],
        )
        .shown();
        assert!(!s.pivot_reached, "a pivot that failed was never reached");

        let running = saga(
            SagaStatus::Running,
            vec![
                step(0, "a", Compensatable, Succeeded),
                step(1, "p", Pivot, Pending),
            ],
        )
        .shown();
        assert_eq!(comps(&running), [Pending, NotNeeded]);
    }

    #[test]
    fn aborted_and_failed_sagas_run_no_compensation() {
        for status in [SagaStatus::Aborted, SagaStatus::Failed] {
            let s = saga(
                status,
                vec![
                    step(0, "a", Compensatable, Succeeded),
                    step(1, "p", Pivot, Unknown),
                ],
            )
            .shown();
            assert_eq!(comps(&s), [NotNeeded, NotNeeded], "{status}");
        }
    }

    #[test]
    fn a_parked_saga_says_what_it_waits_for_and_until_when() {
        let mut wait = step(1, "approve", Signal, Waiting);
        wait.waiting_for = Some("approval".to_owned());
        let mut s = saga(
            SagaStatus::Running,
            vec![step(0, "a", Compensatable, Succeeded), wait],
        );
        s.next_run_at = Some(NOW + 60_000);
        let s = s.shown();
        assert_eq!(s.waiting_for.as_deref(), Some("signal:approval"));
        assert_eq!(s.wake_at, Some(NOW + 60_000));

        let mut retrying = step(0, "a", Compensatable, StepStatus::Retrying);
        retrying.action.attempts = 2;
        let s = saga(SagaStatus::Running, vec![retrying]).shown();
        assert_eq!(s.waiting_for.as_deref(), Some("retry"));
    }

    #[test]
    fn showing_a_shown_saga_changes_nothing() {
        let s = saga(
            SagaStatus::Compensating,
            vec![
                step(0, "a", Compensatable, Succeeded),
                step(1, "b", Compensatable, Failed),
            ],
        )
        .shown();
        assert_eq!(s.clone().shown(), s);
    }

    #[test]
    fn a_paused_saga_waits_for_a_resume_with_no_deadline_and_keeps_its_stages_deadlines() {
        let mut nap = step(1, "nap", StepKind::Sleep, StepStatus::Waiting);
        nap.wake_at = Some(NOW + 60_000);
        let mut s = saga(
            SagaStatus::Paused,
            vec![
                step(0, "a", StepKind::Compensatable, StepStatus::Succeeded),
                nap,
            ],
        );
        s.paused_from = Some(SagaStatus::Running);
        s.next_run_at = None;
        let s = s.shown();
        assert_eq!(s.waiting_for.as_deref(), Some("resume"));
        assert_eq!(s.wake_at, None);
        assert_eq!(
            s.steps[1].wake_at,
            Some(NOW + 60_000),
            "the stage keeps its own"
        );
        assert_eq!(
            s.steps[0].compensation.status,
            StepStatus::Pending,
            "it may still go back (a cancel compensates it)"
        );
    }
}
