//! The rules of the commands that change a saga from outside (cancel, abort, retry,
//! mark-compensated, complete-step, fork), as pure functions over its
//! record: the use cases ([`crate::operations`]) ask them first, so a refusal says what would
//! be accepted, and the store asks them again inside the write transaction that makes the
//! change, so a saga that changed meanwhile is refused there.

use uuid::Uuid;

use super::{needs_compensation, Millis, Saga, SagaStatus, StepKind, StepRecord, StepStatus};

/// Why a command does not apply to a saga as it stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The saga has no step of this name.
    #[error("saga {saga} has no step {step:?}")]
    UnknownStep {
        /// The saga.
        saga: Uuid,
        /// The name given.
        step: String,
    },
    /// The saga's state does not allow the command; the message says why.
    #[error("{0}")]
    Conflict(String),
    /// The command does not fit the saga's definition (a fork from a stage the definition
    /// does not have, or whose earlier stages differ); the message says why. The definition
    /// does not change while a process runs, so a store asked again never meets this one
    /// after the use case's check.
    #[error("{0}")]
    Invalid(String),
}

/// The answer to a cancel request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Accepted: the step in flight finishes, then the saga compensates.
    Accepted,
    /// The saga is already compensating; nothing to do.
    AlreadyCompensating,
    /// Refused: the saga is terminal.
    Terminal(SagaStatus),
    /// Refused: the saga has passed its point of no return.
    PastPivot,
}

/// `None` when a cancel may be recorded; otherwise the answer to give.
pub fn cancel_refusal(status: SagaStatus, pivot_started: bool) -> Option<CancelOutcome> {
    if status.is_terminal() {
        Some(CancelOutcome::Terminal(status))
    } else if status == SagaStatus::Compensating {
        Some(CancelOutcome::AlreadyCompensating)
    } else if pivot_started {
        Some(CancelOutcome::PastPivot)
    } else {
        None
    }
}

/// Whether `abort` applies: anything not finished, and `FAILED` (which waits for a person).
pub fn check_abort(saga: &Saga) -> Result<(), Refusal> {
    if saga.status.is_terminal() && saga.status != SagaStatus::Failed {
        return Err(Refusal::Conflict(format!(
            "saga {} is {}; only a saga that is not finished can be aborted",
            saga.id, saga.status
        )));
    }
    Ok(())
}

/// What `retry` does to a saga.
pub enum RetryPlan<'a> {
    /// A `FAILED` saga: this step gets another attempt and the saga runs again.
    Failed(&'a StepRecord),
    /// A saga still running: its waiting retry (if any) becomes due now.
    DueNow,
}

/// Decides what `retry` does, or why it cannot.
pub fn plan_retry(saga: &Saga) -> Result<RetryPlan<'_>, Refusal> {
    match saga.status {
        SagaStatus::Failed => saga
            .steps
            .iter()
            .find(|s| matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown))
            .map(RetryPlan::Failed)
            .ok_or_else(|| {
                Refusal::Conflict(format!("saga {} is FAILED but no step failed", saga.id))
            }),
        s if s.is_terminal() => Err(Refusal::Conflict(format!(
            "saga {} is {s}; there is nothing to retry",
            saga.id
        ))),
        SagaStatus::Paused => Err(Refusal::Conflict(format!(
            "saga {} is PAUSED; use `resume` to run it again (a step whose retries ran out \
             gets a fresh budget)",
            saga.id
        ))),
        _ => Ok(RetryPlan::DueNow),
    }
}

/// The step `mark-compensated` applies to, or why it cannot.
pub fn check_mark_compensated<'a>(saga: &'a Saga, step: &str) -> Result<&'a StepRecord, Refusal> {
    let id = saga.id;
    let record =
        saga.steps
            .iter()
            .find(|s| s.name == step)
            .ok_or_else(|| Refusal::UnknownStep {
                saga: id,
                step: step.to_owned(),
            })?;
    if saga.status != SagaStatus::Compensating {
        return Err(Refusal::Conflict(format!(
            "saga {id} is {}; a step can be marked compensated only while the saga is \
             COMPENSATING",
            saga.status
        )));
    }
    if !needs_compensation(record) {
        return Err(Refusal::Conflict(format!(
            "step {step} of saga {id} has no compensation pending (action {}, compensation {})",
            record.action.status, record.compensation.status
        )));
    }
    Ok(record)
}

/// What `pause` does to a saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausePlan {
    /// No worker holds it (it is queued, or parked on a timer, a signal or a child, or its
    /// worker's lease ran out): it becomes `PAUSED` now.
    Now,
    /// A worker drives it: the pause is recorded as requested; the call in flight finishes
    /// and is recorded, then the worker starts nothing new and gives the saga back `PAUSED`.
    Requested,
}

/// Decides what `pause` does at `now`, or why it cannot: only a saga that is queued, running
/// or compensating, not paused and with no pause pending. A `FAILED` saga already waits for a
/// person: it is refused with a pointer to `retry` and `abort`.
pub fn plan_pause(saga: &Saga, now: Millis) -> Result<PausePlan, Refusal> {
    let id = saga.id;
    match saga.status {
        SagaStatus::Paused => Err(Refusal::Conflict(format!("saga {id} is already PAUSED"))),
        SagaStatus::Failed => Err(Refusal::Conflict(format!(
            "saga {id} is FAILED: it already waits for a person; use `retry` to run its \
             failed step again or `abort` to stop it"
        ))),
        s if s.is_terminal() => Err(Refusal::Conflict(format!(
            "saga {id} is {s}; only a saga that is queued, running or compensating can be paused"
        ))),
        _ if saga.pause_requested => Err(Refusal::Conflict(format!(
            "a pause of saga {id} is already requested: its worker gives it back PAUSED once \
             its call in flight ends"
        ))),
        _ if saga.lease_owner.is_some() && saga.lease_expires_at.is_none_or(|at| at > now) => {
            Ok(PausePlan::Requested)
        }
        _ => Ok(PausePlan::Now),
    }
}

/// What `resume` does to a saga.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumePlan<'a> {
    /// A pause was requested and not yet applied: the request is withdrawn.
    Withdraw,
    /// The `PAUSED` saga goes back to `status`, due now; `exhausted` is the step whose retries
    /// ran out, which gets a fresh budget.
    Resume {
        /// The status it goes on in.
        status: SagaStatus,
        /// The step whose retries ran out, if the saga paused for that.
        exhausted: Option<&'a StepRecord>,
    },
}

/// Decides what `resume` does, or why it cannot: only a `PAUSED` saga, or one with a pause
/// requested.
pub fn plan_resume(saga: &Saga) -> Result<ResumePlan<'_>, Refusal> {
    if saga.status != SagaStatus::Paused {
        if saga.pause_requested && !saga.status.is_terminal() {
            return Ok(ResumePlan::Withdraw);
        }
        return Err(Refusal::Conflict(format!(
            "saga {} is {}; only a PAUSED saga can be resumed",
            saga.id, saga.status
        )));
    }
    let started = saga
        .steps
        .iter()
        .any(|s| s.action.status != StepStatus::Pending);
    let status = saga.paused_from.unwrap_or(if started {
        SagaStatus::Running
    } else {
        SagaStatus::Queued
    });
    let exhausted = (status != SagaStatus::Compensating)
        .then(|| {
            saga.steps.iter().find(|s| {
                s.stage_index.is_none()
                    && matches!(s.action.status, StepStatus::Failed | StepStatus::Unknown)
            })
        })
        .flatten();
    Ok(ResumePlan::Resume { status, exhausted })
}

/// The stage a saga stands on: the first stage row (not a branch) whose action has neither
/// succeeded nor been skipped.
fn current_stage(saga: &Saga) -> Option<&StepRecord> {
    saga.steps.iter().find(|s| {
        s.branch.is_none()
            && !matches!(s.action.status, StepStatus::Succeeded | StepStatus::Skipped)
    })
}

/// The step `complete-step` applies to, or why it cannot: an operator supplies the output of
/// a step done by hand. The saga must be stopped on that step with no call of it in flight:
///
/// - `PAUSED`: the stage it stands on (the first not done), its action not started, retrying,
///   waiting, failed or of unknown outcome;
/// - `FAILED`: the failed step (action `FAILED` or `UNKNOWN`);
/// - `QUEUED`/`RUNNING` with no cancel pending: the stage it is parked on, retrying on a timer
///   or waiting for a signal or a sleep's end.
///
/// A branch of a parallel group (`group/branch`) of that stage may be completed, the group's
/// own row never (its output is its branches'); nor a child stage (the child is a saga of its
/// own), a step already `SUCCEEDED` or `SKIPPED`, a call in flight (`RUNNING`), or any step
/// of a `COMPENSATING` saga (`mark-compensated` is for a compensation done by hand) or of a
/// finished one.
pub fn check_complete_step<'a>(saga: &'a Saga, step: &str) -> Result<&'a StepRecord, Refusal> {
    let id = saga.id;
    let record =
        saga.steps
            .iter()
            .find(|s| s.name == step)
            .ok_or_else(|| Refusal::UnknownStep {
                saga: id,
                step: step.to_owned(),
            })?;
    let conflict = |message: String| Err(Refusal::Conflict(message));
    match saga.status {
        SagaStatus::Compensating => {
            return conflict(format!(
                "saga {id} is COMPENSATING: its actions are being undone, so no step can be \
                 completed; a compensation done by hand is recorded with mark-compensated"
            ))
        }
        SagaStatus::Paused if saga.paused_from == Some(SagaStatus::Compensating) => {
            return conflict(format!(
                "saga {id} was paused while COMPENSATING: its actions are being undone, so no \
                 step can be completed; a compensation done by hand is recorded with \
                 mark-compensated once it is resumed"
            ))
        }
        SagaStatus::Failed | SagaStatus::Paused => {}
        SagaStatus::Queued | SagaStatus::Running if saga.cancel_requested => {
            return conflict(format!(
                "saga {id} is being cancelled: it compensates after its step in flight, so no \
                 step can be completed"
            ))
        }
        SagaStatus::Queued | SagaStatus::Running => {}
        status => {
            return conflict(format!(
                "saga {id} is {status}; a step can be completed only while the saga is \
                 PAUSED, FAILED or stopped on that step"
            ))
        }
    }
    if record.kind == StepKind::Child {
        return conflict(format!(
            "step {step} of saga {id} is a child stage: its child is a saga of its own; act on \
             the child saga instead"
        ));
    }
    if record.kind == StepKind::Parallel && record.branch.is_none() {
        let branches: Vec<&str> = saga
            .steps
            .iter()
            .filter(|s| s.stage_index == Some(record.index))
            .map(|s| s.name.as_str())
            .collect();
        let named = if branches.is_empty() {
            "none started yet".to_owned()
        } else {
            branches.join(", ")
        };
        return conflict(format!(
            "step {step} of saga {id} is a parallel group: its output is its branches'; \
             complete its branches instead (its branches: {named})"
        ));
    }
    let action = record.action.status;
    if matches!(action, StepStatus::Succeeded | StepStatus::Skipped) {
        return conflict(format!(
            "step {step} of saga {id} is already {action}; there is nothing to complete"
        ));
    }
    if action == StepStatus::Running {
        return conflict(format!(
            "step {step} of saga {id} has a call in flight; wait for its result (or pause the \
             saga) before completing it by hand"
        ));
    }
    let stage = record.stage_index.unwrap_or(record.index);
    let current = current_stage(saga);
    if current.map(|c| c.index) != Some(stage) {
        let on = current.map_or_else(|| "none".to_owned(), |c| c.name.clone());
        return conflict(format!(
            "saga {id} is not stopped on step {step} (it stands on {on}); only the step it \
             stopped on can be completed"
        ));
    }
    let allowed: &[StepStatus] = match saga.status {
        SagaStatus::Failed => &[StepStatus::Failed, StepStatus::Unknown],
        SagaStatus::Paused => &[
            StepStatus::Pending,
            StepStatus::Retrying,
            StepStatus::Waiting,
            StepStatus::Failed,
            StepStatus::Unknown,
        ],
        _ => &[StepStatus::Retrying, StepStatus::Waiting],
    };
    if !allowed.contains(&action) {
        return conflict(format!(
            "step {step} of saga {id} is {action} while the saga is {}: a step can be \
             completed only once the saga stopped on it (retrying, waiting, failed or paused)",
            saga.status
        ));
    }
    Ok(record)
}

/// What a fork takes over from the original: the position of `from_stage` and the rows of the
/// stages before it (their branches included), whose outputs and statuses the new saga
/// starts with.
#[derive(Debug)]
pub struct ForkPlan<'a> {
    /// The stage the new saga starts at, by position; `None` for a fresh fork.
    pub from_index: Option<usize>,
    /// The original's rows the new saga takes over: the stages before `from_stage` and the
    /// branches of the groups among them.
    pub taken: Vec<&'a StepRecord>,
}

/// Decides what a fork of `original` takes over, or why it cannot. `stages` are the new
/// saga's stages (its definition's names and kinds, in order).
///
/// A fork of a saga already superseded by another fork is refused. Without `from_stage` the
/// fork takes nothing over and the original is not touched: any saga may be forked afresh.
/// With `from_stage`, the stages before it are taken over only while their effects stand: the
/// original is `PAUSED`, `ABORTED` or `COMPLETED` and no child saga; each earlier stage
/// `SUCCEEDED` or `SKIPPED` (each branch of a group too) with no compensation run; no child
/// stage among them (its child saga belongs to the original, whose parent link a fork does not
/// move); and the new definition has the same stages before `from_stage`, by name and kind in
/// the same places, so the taken-over rows keep their positions and their keys.
pub fn check_fork<'a>(
    original: &'a Saga,
    stages: &[(String, StepKind)],
    from_stage: Option<&str>,
) -> Result<ForkPlan<'a>, Refusal> {
    let id = original.id;
    if let Some(by) = original.superseded_by {
        return Err(Refusal::Conflict(format!(
            "saga {id} was already superseded by saga {by}, which owns its effects; fork that \
             one instead"
        )));
    }
    let Some(from) = from_stage else {
        return Ok(ForkPlan {
            from_index: None,
            taken: Vec::new(),
        });
    };
    let from_index = stages
        .iter()
        .position(|(name, _)| name == from)
        .ok_or_else(|| {
            let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
            Refusal::Invalid(format!(
                "saga {} has no stage {from:?} to fork from (its stages: {})",
                original.name,
                names.join(", ")
            ))
        })?;
    if !matches!(
        original.status,
        SagaStatus::Paused | SagaStatus::Aborted | SagaStatus::Completed
    ) {
        return Err(Refusal::Conflict(format!(
            "saga {id} is {}; a fork from stage {from} takes over the effects before it only \
             while they stand, once the saga is PAUSED, ABORTED or COMPLETED (pause or abort \
             it first)",
            original.status
        )));
    }
    if let Some(parent) = original.parent_id {
        return Err(Refusal::Conflict(format!(
            "saga {id} is a child of saga {parent}, whose stage waits for it; a fork from a \
             stage cannot take its effects from its parent: fork the parent instead"
        )));
    }
    let own: Vec<&StepRecord> = original
        .steps
        .iter()
        .filter(|s| s.branch.is_none())
        .collect();
    let mut taken = Vec::new();
    for (position, (name, kind)) in stages[..from_index].iter().enumerate() {
        let row = own
            .get(position)
            .filter(|row| row.name == *name && row.kind == *kind)
            .ok_or_else(|| {
                Refusal::Invalid(format!(
                    "stage {name} ({kind}) before {from} is not at the same place in saga {id}, \
                     which was started on version {} of its definition: a fork takes over only \
                     stages that are the same in both",
                    original.version
                ))
            })?;
        if row.kind == StepKind::Child {
            return Err(Refusal::Conflict(format!(
                "stage {name} of saga {id} is a child stage: its child saga belongs to the \
                 original; fork from {name} or an earlier stage instead"
            )));
        }
        let branches = original
            .steps
            .iter()
            .filter(|s| s.stage_index == Some(row.index));
        for taken_row in std::iter::once(*row).chain(branches) {
            let label = &taken_row.name;
            if !matches!(
                taken_row.action.status,
                StepStatus::Succeeded | StepStatus::Skipped
            ) {
                return Err(Refusal::Conflict(format!(
                    "stage {label} of saga {id} is {}, not SUCCEEDED or SKIPPED: a fork from \
                     {from} takes over only stages whose effects stand",
                    taken_row.action.status
                )));
            }
            let comp = &taken_row.compensation;
            if comp.attempts > 0
                || !matches!(comp.status, StepStatus::Pending | StepStatus::NotNeeded)
            {
                return Err(Refusal::Conflict(format!(
                    "the compensation of stage {label} of saga {id} has run ({}): its effect \
                     no longer stands, so a fork cannot take it over; fork from an earlier \
                     stage, or afresh",
                    comp.status
                )));
            }
            taken.push(taken_row);
        }
    }
    Ok(ForkPlan {
        from_index: Some(from_index),
        taken,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::fixtures::{saga, step, NOW};
    use crate::model::StepKind;
    use crate::model::StepKind::{Compensatable, Parallel, Pivot, Retriable, Signal};
    use crate::model::StepStatus::{Pending, Retrying, Skipped, Succeeded, Unknown, Waiting};

    #[test]
    fn pause_applies_to_sagas_that_go_on_and_says_how() {
        let mut s = saga(
            SagaStatus::Running,
            vec![step(0, "a", StepKind::Compensatable, StepStatus::Running)],
        );
        s.lease_expires_at = Some(NOW + 1_000);
        assert_eq!(plan_pause(&s, NOW), Ok(PausePlan::Requested));
        // A lease that ran out is held by nobody.
        assert_eq!(plan_pause(&s, NOW + 1_000), Ok(PausePlan::Now));
        s.lease_owner = None;
        assert_eq!(plan_pause(&s, NOW), Ok(PausePlan::Now));
        s.pause_requested = true;
        assert!(plan_pause(&s, NOW).is_err(), "requested already");
        for status in [
            SagaStatus::Paused,
            SagaStatus::Failed,
            SagaStatus::Completed,
            SagaStatus::Compensated,
            SagaStatus::Aborted,
        ] {
            let s = saga(status, vec![]);
            let Err(Refusal::Conflict(message)) = plan_pause(&s, NOW) else {
                panic!("{status} paused");
            };
            if status == SagaStatus::Failed {
                assert!(
                    message.contains("retry") && message.contains("abort"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn resume_goes_on_in_the_direction_it_was_going_with_a_fresh_budget() {
        let mut s = saga(
            SagaStatus::Paused,
            vec![
                step(0, "a", StepKind::Compensatable, StepStatus::Succeeded),
                step(1, "charge", StepKind::Compensatable, StepStatus::Failed),
            ],
        );
        s.paused_from = Some(SagaStatus::Running);
        let Ok(ResumePlan::Resume { status, exhausted }) = plan_resume(&s) else {
            panic!("not resumed");
        };
        assert_eq!(status, SagaStatus::Running);
        assert_eq!(exhausted.map(|e| e.name.as_str()), Some("charge"));

        s.paused_from = Some(SagaStatus::Compensating);
        assert_eq!(
            plan_resume(&s),
            Ok(ResumePlan::Resume {
                status: SagaStatus::Compensating,
                exhausted: None
            })
        );

        let mut running = saga(SagaStatus::Running, vec![]);
        assert!(plan_resume(&running).is_err(), "not paused");
        running.pause_requested = true;
        assert_eq!(plan_resume(&running), Ok(ResumePlan::Withdraw));
        assert!(
            plan_retry(&s).is_err(),
            "a paused saga is resumed, not retried"
        );
    }

    /// `reserve` (compensatable), `charge` (compensatable), `ship` (pivot), `notify`
    /// (retriable), in the given statuses.
    fn order(status: SagaStatus, actions: [StepStatus; 4]) -> Saga {
        let kinds = [Compensatable, Compensatable, Pivot, Retriable];
        let names = ["reserve", "charge", "ship", "notify"];
        saga(
            status,
            (0..4)
                .map(|i| step(i as u32, names[i], kinds[i], actions[i]))
                .collect(),
        )
    }

    fn conflict<T: std::fmt::Debug>(result: Result<T, Refusal>, words: &str) {
        match result {
            Err(Refusal::Conflict(m)) => assert!(m.contains(words), "{m}"),
            other => panic!("expected a conflict naming {words:?}, got {other:?}"),
        }
    }

    #[test]
    fn complete_step_takes_the_step_a_saga_stopped_on_with_no_call_in_flight() {
        use SagaStatus::*;
        // A failed saga: its failed step, and no other.
        let failed = order(
            Failed,
            [Succeeded, Succeeded, Succeeded, StepStatus::Failed],
        );
        assert_eq!(
            check_complete_step(&failed, "notify").map(|s| s.index),
            Ok(3)
        );
        conflict(check_complete_step(&failed, "ship"), "already SUCCEEDED");
        assert!(matches!(
            check_complete_step(&failed, "nope"),
            Err(Refusal::UnknownStep { .. })
        ));
        // A running saga: only the stage parked on a timer or a wait.
        let retrying = order(Running, [Succeeded, Retrying, Pending, Pending]);
        assert!(check_complete_step(&retrying, "charge").is_ok());
        conflict(check_complete_step(&retrying, "ship"), "stands on charge");
        let in_flight = order(Running, [Succeeded, StepStatus::Running, Pending, Pending]);
        conflict(check_complete_step(&in_flight, "charge"), "in flight");
        let mut cancelling = retrying.clone();
        cancelling.cancel_requested = true;
        conflict(check_complete_step(&cancelling, "charge"), "cancelled");
        // A paused saga: the stage it stands on, even one not started.
        for action in [Pending, Retrying, Unknown, StepStatus::Failed] {
            let paused = order(Paused, [Succeeded, action, Pending, Pending]);
            assert!(check_complete_step(&paused, "charge").is_ok(), "{action}");
            conflict(check_complete_step(&paused, "ship"), "not stopped on");
        }
        // Going back, or finished: never.
        let back = order(
            Compensating,
            [Succeeded, StepStatus::Failed, Pending, Pending],
        );
        conflict(check_complete_step(&back, "charge"), "mark-compensated");
        for status in [Completed, Compensated, Aborted] {
            let ended = order(status, [Succeeded, Pending, Pending, Pending]);
            conflict(check_complete_step(&ended, "charge"), status.as_str());
        }
    }

    #[test]
    fn complete_step_takes_a_branch_but_never_its_group_nor_a_child_stage() {
        let mut steps = vec![
            step(0, "book", Parallel, StepStatus::Running),
            step(1, "approve", Signal, Pending),
        ];
        for (i, (branch, action)) in [("hotel", Retrying), ("car", StepStatus::Running)]
            .into_iter()
            .enumerate()
        {
            steps.push(StepRecord {
                stage_index: Some(0),
                branch: Some(branch.to_owned()),
                ..step(
                    2 + i as u32,
                    &format!("book/{branch}"),
                    Compensatable,
                    action,
                )
            });
        }
        let running = saga(SagaStatus::Running, steps);
        assert!(check_complete_step(&running, "book/hotel").is_ok());
        conflict(check_complete_step(&running, "book/car"), "in flight");
        conflict(
            check_complete_step(&running, "book"),
            "its branches: book/hotel, book/car",
        );
        let child = saga(
            SagaStatus::Running,
            vec![step(0, "payout", StepKind::Child, Waiting)],
        );
        conflict(check_complete_step(&child, "payout"), "child stage");
    }

    fn stages(of: &Saga) -> Vec<(String, StepKind)> {
        of.steps
            .iter()
            .filter(|s| s.branch.is_none())
            .map(|s| (s.name.clone(), s.kind))
            .collect()
    }

    #[test]
    fn a_fork_from_a_stage_takes_over_only_effects_that_stand() {
        use SagaStatus::*;
        let aborted = order(Aborted, [Succeeded, Skipped, Pending, Pending]);
        let plan = check_fork(&aborted, &stages(&aborted), Some("ship")).unwrap();
        assert_eq!(plan.from_index, Some(2));
        let taken: Vec<&str> = plan.taken.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(taken, ["reserve", "charge"]);
        // Afresh: anything, nothing taken over.
        let running = order(Running, [Succeeded, Retrying, Pending, Pending]);
        let plan = check_fork(&running, &stages(&running), None).unwrap();
        assert_eq!((plan.from_index, plan.taken.len()), (None, 0));
        // From a stage: only once its effects can no longer change.
        conflict(
            check_fork(&running, &stages(&running), Some("charge")),
            "RUNNING",
        );
        for status in [Paused, Completed] {
            let s = order(status, [Succeeded, Succeeded, Succeeded, Succeeded]);
            assert!(
                check_fork(&s, &stages(&s), Some("notify")).is_ok(),
                "{status}"
            );
        }
        conflict(
            check_fork(
                &order(Compensated, [Succeeded; 4]),
                &stages(&aborted),
                Some("ship"),
            ),
            "COMPENSATED",
        );
        // Every earlier stage done, and not compensated.
        let stuck = order(Paused, [Succeeded, Retrying, Pending, Pending]);
        conflict(check_fork(&stuck, &stages(&stuck), Some("ship")), "charge");
        let mut undone = aborted.clone();
        undone.steps[0].compensation.status = Succeeded;
        undone.steps[0].compensation.attempts = 1;
        conflict(
            check_fork(&undone, &stages(&undone), Some("ship")),
            "has run",
        );
        // Superseded: never again.
        let mut superseded = aborted.clone();
        superseded.superseded_by = Some(Uuid::nil());
        conflict(
            check_fork(&superseded, &stages(&aborted), None),
            "superseded",
        );
        // A stage the definition lacks, or earlier stages that differ: invalid.
        assert!(matches!(
            check_fork(&aborted, &stages(&aborted), Some("nope")),
            Err(Refusal::Invalid(m)) if m.contains("nope")
        ));
        let mut renamed = stages(&aborted);
        renamed[1].0 = "pay".to_owned();
        renamed[1].1 = Compensatable;
        assert!(matches!(
            check_fork(&aborted, &renamed, Some("ship")),
            Err(Refusal::Invalid(m)) if m.contains("pay")
        ));
        // Output is carried as recorded.
        assert_eq!(
            check_fork(&aborted, &stages(&aborted), Some("ship"))
                .unwrap()
                .taken[0]
                .output,
            Some(json!({"from": "reserve"}))
        );
    }

    #[test]
    fn a_fork_takes_a_group_s_branches_and_refuses_a_child_stage_or_a_child_saga() {
        let mut steps = vec![
            step(0, "book", Parallel, Succeeded),
            step(1, "ship", Pivot, Pending),
        ];
        steps.push(StepRecord {
            stage_index: Some(0),
            branch: Some("hotel".to_owned()),
            ..step(2, "book/hotel", Compensatable, Succeeded)
        });
        let aborted = saga(SagaStatus::Aborted, steps);
        let plan = check_fork(&aborted, &stages(&aborted), Some("ship")).unwrap();
        let taken: Vec<&str> = plan.taken.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(taken, ["book", "book/hotel"]);

        let with_child = saga(
            SagaStatus::Aborted,
            vec![
                step(0, "payout", StepKind::Child, Succeeded),
                step(1, "ship", Pivot, Pending),
            ],
        );
        conflict(
            check_fork(&with_child, &stages(&with_child), Some("ship")),
            "child stage",
        );
        let mut child_saga = aborted.clone();
        child_saga.parent_id = Some(Uuid::nil());
        conflict(
            check_fork(&child_saga, &stages(&aborted), Some("ship")),
            "fork the parent",
        );
    }
}
