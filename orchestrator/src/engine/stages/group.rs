//! A parallel group: it starts by adding its branches' rows (`PENDING`, called next by the
//! plan, up to its concurrency), and ends once every branch succeeded (its output an object
//! keyed by branch name) or one failed for good with none in flight (the saga then goes back,
//! undoing its branches as calls).

use saga_dsl::Group;
use serde_json::{json, Value};

use super::{Decision, Facts, StageRules, Turn};
use crate::engine::decision::BranchStart;
use crate::engine::plan;
use crate::model::StepKind;

impl StageRules for Group {
    /// Starts the group (its branches, in the order the definition or the mapped list gives),
    /// or ends it once every branch succeeded or one failed for good with none in flight.
    fn advance(&self, turn: &Turn<'_>, _facts: Facts) -> Decision {
        if turn.reached() {
            return match self.branches(turn.stage, &turn.context()) {
                Ok(names) => Decision::StartGroup(
                    names
                        .into_iter()
                        .map(|(name, element)| BranchStart {
                            kind: self
                                .branch(&name)
                                .map_or(StepKind::Compensatable, |b| b.kind()),
                            name,
                            element,
                        })
                        .collect(),
                ),
                Err(e) => {
                    Decision::refuse(turn.stage, format!("its branches failed: {}", e.message()))
                }
            };
        }
        match plan::group_state(turn.saga, turn.index) {
            plan::GroupState::Succeeded => {
                let output: serde_json::Map<String, Value> = plan::branches(turn.saga, turn.index)
                    .map(|b| {
                        let (_, name) = b.branch_of().unwrap_or_default();
                        (name.to_owned(), b.output.clone().unwrap_or(Value::Null))
                    })
                    .collect();
                Decision::succeed(turn.stage, Value::Object(output), json!({}))
            }
            plan::GroupState::Failed(error) => Decision::refuse(turn.stage, error),
            // The plan asks only once the group has ended.
            plan::GroupState::Running => Decision::Unchanged,
        }
    }
}

#[cfg(test)]
mod tests {
    use saga_dsl::{Step, StepContext, StepError, StepKind};
    use serde_json::json;

    use super::super::testing::turn;
    use super::*;
    use crate::engine::decision::End;
    use crate::model::fixtures::{saga, step};
    use crate::model::{Saga, SagaStatus, StepRecord, StepStatus};

    async fn hold(_: StepContext) -> Result<(), StepError> {
        Ok(())
    }

    fn book() -> Step<Group> {
        Step::parallel(
            "book",
            [
                Step::compensatable("hotel", hold, hold),
                Step::compensatable("flight", hold, hold),
            ],
        )
    }

    fn branch(index: u32, name: &str, status: StepStatus) -> StepRecord {
        StepRecord {
            stage_index: Some(0),
            branch: Some(name.to_owned()),
            ..step(
                index,
                &format!("book/{name}"),
                StepKind::Compensatable,
                status,
            )
        }
    }

    fn group(status: StepStatus, branches: Vec<StepRecord>) -> Saga {
        let mut steps = vec![step(0, "book", StepKind::Parallel, status)];
        steps.extend(branches);
        saga(SagaStatus::Running, steps)
    }

    #[test]
    fn a_group_the_saga_reaches_starts_its_branches_in_order() {
        let decision = turn(&group(StepStatus::Pending, vec![]), 0, |t| {
            book().body().advance(t, Facts::Nothing)
        });
        let Decision::StartGroup(branches) = decision else {
            panic!("expected a start, got {decision:?}");
        };
        let names: Vec<_> = branches.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["hotel", "flight"]);
        assert!(branches
            .iter()
            .all(|b| b.kind == StepKind::Compensatable && b.element.is_none()));
    }

    #[test]
    fn a_mapped_group_starts_a_branch_per_element_with_its_element() {
        let stage = Step::map(
            "book",
            |_| Ok(vec![json!({"sku": "a"}), json!({"sku": "b"})]),
            |e| Ok(e["sku"].as_str().unwrap_or_default().to_owned()),
            Step::compensatable("reserve", hold, hold),
        );
        let decision = turn(&group(StepStatus::Pending, vec![]), 0, |t| {
            stage.body().advance(t, Facts::Nothing)
        });
        let Decision::StartGroup(branches) = decision else {
            panic!("expected a start, got {decision:?}");
        };
        assert_eq!(branches[1].name, "b");
        assert_eq!(branches[1].element, Some(json!({"sku": "b"})));
    }

    #[test]
    fn a_group_whose_branches_all_succeeded_succeeds_with_their_outputs_by_name() {
        let record = group(
            StepStatus::Running,
            vec![
                branch(1, "hotel", StepStatus::Succeeded),
                branch(2, "flight", StepStatus::Succeeded),
            ],
        );
        let decision = turn(&record, 0, |t| book().body().advance(t, Facts::Nothing));
        let Decision::Settle(settle) = decision else {
            panic!("expected a settle, got {decision:?}");
        };
        assert_eq!(
            settle.end,
            End::Succeeded(json!({
                "hotel": {"from": "book/hotel"},
                "flight": {"from": "book/flight"},
            }))
        );
    }

    #[test]
    fn a_group_with_a_branch_failed_for_good_and_none_in_flight_fails() {
        let record = group(
            StepStatus::Running,
            vec![
                branch(1, "hotel", StepStatus::Succeeded),
                branch(2, "flight", StepStatus::Failed),
            ],
        );
        let decision = turn(&record, 0, |t| book().body().advance(t, Facts::Nothing));
        let Decision::Settle(settle) = decision else {
            panic!("expected a refusal, got {decision:?}");
        };
        assert_eq!(settle.end, End::Failed("branch flight: boom".to_owned()));
    }
}
