//! Child stages: starting the child saga, waiting for its end without a worker, and undoing it
//! when the parent goes back (cancelling a running child, compensating a completed one).
//!
//! The child's id is derived from the parent's id and the stage's name, and the child is
//! created only after the stage's `WAITING` record is committed, under the parent's lease: a
//! parent resumed after a crash finds the child it started, and a parent going back knows
//! whether a child may exist.

use saga_dsl::{child_saga_id, ChildSaga};
use serde_json::{json, Value};
use uuid::Uuid;

use super::{Decision, Facts, Need, StageRules, Turn};
use crate::engine::decision::{ChildUndo, Until, Wait};
use crate::model::SagaStatus;
use crate::store::{CancelOutcome, NewEvent, NewSaga, StoreError};

impl StageRules for ChildSaga {
    /// Nothing when the saga reaches the stage (its child cannot exist yet); the child's
    /// record when it looks again.
    fn needs(&self, turn: &Turn<'_>) -> Need {
        if turn.reached() {
            Need::Nothing
        } else {
            Need::Child(child_id(turn))
        }
    }

    /// Starts the child, or looks at the child it waits for: the stage succeeds with a
    /// completed child's output, fails with a child that ended otherwise, and waits again for
    /// one still running.
    fn advance(&self, turn: &Turn<'_>, facts: Facts) -> Decision {
        let id = child_id(turn);
        if turn.reached() {
            return match new_child(self, turn, id) {
                Ok(child) => {
                    let data = json!({"child_id": id, "saga": child.name});
                    Decision::StartChild {
                        child: Box::new(child),
                        starts: Some(Wait {
                            until: Until::Child,
                            event: NewEvent::step("step.waiting", turn.stage, data),
                        }),
                    }
                }
                Err(error) => Decision::refuse(turn.stage, error),
            };
        }
        let Facts::Child(Some(child)) = facts else {
            // The stage's record was committed, its child not: start it now.
            return match new_child(self, turn, id) {
                Ok(child) => Decision::StartChild {
                    child: Box::new(child),
                    starts: None,
                },
                Err(error) => Decision::refuse(turn.stage, error),
            };
        };
        match child.status {
            SagaStatus::Completed => Decision::succeed(
                turn.stage,
                child.output.unwrap_or(Value::Null),
                json!({"child_id": id}),
            ),
            status if status.is_terminal() => {
                let why = child.error.map(|e| format!(": {e}")).unwrap_or_default();
                let error = format!("child saga {id} ({}) ended {status}{why}", child.name);
                Decision::refuse(turn.stage, error)
            }
            status => Decision::AwaitChild {
                child: id,
                seen: status,
            },
        }
    }

    /// The child's status, to know how to undo it.
    fn needs_back(&self, turn: &Turn<'_>) -> Need {
        Need::ChildStatus(child_id(turn))
    }

    /// Undoes the stage as the parent goes back: nothing to undo if the child was never
    /// created or ended compensated; a running child is cancelled and a completed one turned
    /// to compensating, and the parent waits for it. A child that cannot go back (it failed,
    /// was aborted, or passed its point of no return) flags the parent for a person, who may
    /// mend the child or mark the stage compensated.
    fn undo(&self, turn: &Turn<'_>, facts: Facts) -> Decision {
        let id = child_id(turn);
        let status = match facts {
            Facts::ChildStatus(status) => status,
            _ => None,
        };
        let undo = match status {
            None | Some(SagaStatus::Compensated) => ChildUndo::Nothing,
            Some(SagaStatus::Completed) => ChildUndo::Compensate,
            Some(status @ (SagaStatus::Queued | SagaStatus::Running)) => ChildUndo::Cancel(status),
            Some(SagaStatus::Compensating) => ChildUndo::Wait {
                seen: SagaStatus::Compensating,
                problem: None,
            },
            Some(status) => ChildUndo::Wait {
                seen: status,
                problem: Some(format!(
                    "child saga {id} ended {status}; mend it, or mark {} compensated",
                    turn.stage
                )),
            },
        };
        Decision::UndoChild { child: id, undo }
    }
}

/// The child saga `stage` starts, its input computed and checked against the child's
/// definition; why the stage fails when that is impossible.
fn new_child(stage: &ChildSaga, turn: &Turn<'_>, id: Uuid) -> Result<NewSaga, String> {
    let name = stage.saga();
    let input = stage
        .input(&turn.context())
        .map_err(|e| format!("its child's input failed: {}", e.message()))?;
    let Some(def) = turn.registry.latest(name) else {
        return Err(format!("no saga {name:?} is registered"));
    };
    if let Err(message) = def.check_input(&input) {
        return Err(format!(
            "the input of child saga {name} is not valid: {message}"
        ));
    }
    let mut child = NewSaga::with_attrs(def, input)
        .map_err(|e| format!("the input of child saga {name} is not valid: {e}"))?;
    child.id = id;
    Ok(child)
}

/// The id of the child of the stage whose turn it is.
fn child_id(turn: &Turn<'_>) -> Uuid {
    child_saga_id(turn.saga.id, turn.stage)
}

/// Where a completed child stands once asked to compensate: its new status, or, refused, still
/// completed with the refusal as the problem a person must look at.
pub(in crate::engine) fn after_compensate(
    asked: Result<SagaStatus, StoreError>,
) -> Result<(SagaStatus, Option<String>), StoreError> {
    match asked {
        Ok(status) => Ok((status, None)),
        Err(StoreError::Conflict(problem)) => Ok((SagaStatus::Completed, Some(problem))),
        Err(e) => Err(e),
    }
}

/// Where a running child (last seen in `status`) stands once asked to cancel: a child past its
/// point of no return cannot go back, a problem for a person.
pub(in crate::engine) fn after_cancel(
    child: Uuid,
    status: SagaStatus,
    outcome: &CancelOutcome,
) -> (SagaStatus, Option<String>) {
    match outcome {
        CancelOutcome::PastPivot => (
            status,
            Some(format!(
                "child saga {child} passed its point of no return and cannot be cancelled"
            )),
        ),
        _ => (status, None),
    }
}

#[cfg(test)]
mod tests {
    use saga_dsl::{SagaDefinition, Step, StepContext, StepError, StepKind};
    use serde_json::json;

    use super::super::testing::{turn, with_turn};
    use super::*;
    use crate::engine::decision::End;
    use crate::model::fixtures::{saga, step, NOW};
    use crate::model::{Saga, StepStatus};

    fn stage() -> Step<ChildSaga> {
        Step::child("deliver", "rider", |ctx| {
            Ok(json!({"order": ctx.raw_input()["order"]}))
        })
    }

    fn parent(status: StepStatus) -> Saga {
        saga(
            SagaStatus::Running,
            vec![step(0, "deliver", StepKind::Child, status)],
        )
    }

    fn child(status: SagaStatus) -> Box<Saga> {
        let mut child = saga(status, vec![]);
        child.name = "rider".to_owned();
        child.output = (status == SagaStatus::Completed).then(|| json!({"rider": "ann"}));
        child.error = (status == SagaStatus::Failed).then(|| "no rider".to_owned());
        Box::new(child)
    }

    async fn ride(_: StepContext) -> Result<serde_json::Value, StepError> {
        Ok(json!({}))
    }

    fn registry() -> saga_dsl::Registry {
        let rider = SagaDefinition::builder("rider", 1)
            .step(Step::retriable("ride", ride))
            .build()
            .expect("a valid definition");
        saga_dsl::Registry::new().with(rider).expect("registered")
    }

    #[test]
    fn a_child_stage_the_saga_reaches_starts_its_child_after_its_wait() {
        let parent = parent(StepStatus::Pending);
        let registry = registry();
        let decision = with_turn(&parent, 0, NOW, &registry, |t| {
            assert_eq!(stage().body().needs(t), Need::Nothing);
            stage().body().advance(t, Facts::Nothing)
        });
        let Decision::StartChild {
            child,
            starts: Some(wait),
        } = decision
        else {
            panic!("expected a child to start, got {decision:?}");
        };
        assert_eq!(child.id, child_saga_id(parent.id, "deliver"));
        assert_eq!(child.name, "rider");
        assert_eq!(child.input, json!({"order": 7}));
        assert_eq!(wait.until, Until::Child);
    }

    #[test]
    fn a_child_stage_whose_child_is_not_registered_fails() {
        let decision = turn(&parent(StepStatus::Pending), 0, |t| {
            stage().body().advance(t, Facts::Nothing)
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a refusal, got {decision:?}");
        };
        assert_eq!(
            settle.end,
            End::Failed("no saga \"rider\" is registered".to_owned())
        );
    }

    #[test]
    fn a_child_that_completed_succeeds_with_its_output() {
        let parent = parent(StepStatus::Waiting);
        let decision = turn(&parent, 0, |t| {
            let id = child_saga_id(parent.id, "deliver");
            assert_eq!(stage().body().needs(t), Need::Child(id));
            stage()
                .body()
                .advance(t, Facts::Child(Some(child(SagaStatus::Completed))))
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a settle, got {decision:?}");
        };
        assert_eq!(settle.end, End::Succeeded(json!({"rider": "ann"})));
        assert_eq!(settle.event.kind, "step.succeeded");
    }

    #[test]
    fn a_child_that_failed_fails_the_stage_with_its_error() {
        let parent = parent(StepStatus::Waiting);
        let decision = turn(&parent, 0, |t| {
            stage()
                .body()
                .advance(t, Facts::Child(Some(child(SagaStatus::Failed))))
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a refusal, got {decision:?}");
        };
        let id = child_saga_id(parent.id, "deliver");
        assert_eq!(
            settle.end,
            End::Failed(format!("child saga {id} (rider) ended FAILED: no rider"))
        );
    }

    #[test]
    fn a_child_still_running_is_waited_for_again() {
        let parent = parent(StepStatus::Waiting);
        let decision = turn(&parent, 0, |t| {
            stage()
                .body()
                .advance(t, Facts::Child(Some(child(SagaStatus::Running))))
        });
        assert!(
            matches!(
                decision,
                Decision::AwaitChild {
                    seen: SagaStatus::Running,
                    ..
                }
            ),
            "{decision:?}"
        );
    }

    #[test]
    fn a_waiting_stage_whose_child_was_never_created_creates_it_now() {
        let parent = parent(StepStatus::Waiting);
        let registry = registry();
        let decision = with_turn(&parent, 0, NOW, &registry, |t| {
            stage().body().advance(t, Facts::Child(None))
        });
        assert!(
            matches!(decision, Decision::StartChild { starts: None, .. }),
            "{decision:?}"
        );
    }

    #[test]
    fn going_back_a_child_is_undone_by_its_status() {
        let parent = parent(StepStatus::Succeeded);
        let undo = |status| {
            turn(&parent, 0, |t| {
                match stage().body().undo(t, Facts::ChildStatus(status)) {
                    Decision::UndoChild { undo, .. } => undo,
                    other => panic!("expected an undo, got {other:?}"),
                }
            })
        };
        assert_eq!(undo(None), ChildUndo::Nothing);
        assert_eq!(undo(Some(SagaStatus::Compensated)), ChildUndo::Nothing);
        assert_eq!(undo(Some(SagaStatus::Completed)), ChildUndo::Compensate);
        assert_eq!(
            undo(Some(SagaStatus::Running)),
            ChildUndo::Cancel(SagaStatus::Running)
        );
        assert!(matches!(
            undo(Some(SagaStatus::Failed)),
            ChildUndo::Wait {
                seen: SagaStatus::Failed,
                problem: Some(_)
            }
        ));
    }
}
