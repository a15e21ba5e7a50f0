//! A parallel group: it starts by adding its branches' rows (`PENDING`, called next by the
//! plan, up to its concurrency), and ends once every branch succeeded (its output an object
//! keyed by branch name) or one failed for good with none in flight (the saga then goes back,
//! undoing its branches as calls).

use std::sync::Arc;

use saga_dsl::{Group, Phase};
use serde_json::{json, Value};

use super::{Decision, StageRules};
use crate::engine::driver::Driver;
use crate::engine::plan;
use crate::model::{Millis, PhaseRecord, Saga, SagaStatus, StepKind, StepRecord, StepStatus};
use crate::store::rows::comp_status_for;
use crate::store::{NewEvent, NewStep, StoreError};

impl StageRules for Group {
    async fn advance(
        &self,
        driver: &mut Driver,
        stage: &str,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        driver.decide_group(stage, self, index, now);
        Ok(Decision::Decided)
    }

    /// A group whose branch failed: its other branches are compensated with the stages
    /// before, unless the point of no return is behind.
    fn can_go_back(_failed: &StepRecord, saga: &Saga) -> bool {
        !saga.pivot_started
    }
}

impl Driver {
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
    /// `group/branch`, in the order the definition (or the mapped list) gives. Rows a refused
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
                    kind,
                    action: PhaseRecord::pending(),
                    output: None,
                    wake_at: None,
                    waiting_for: None,
                    timeout_at: None,
                    compensation: PhaseRecord::with_status(comp_status_for(kind)),
                });
                self.pending.new_steps.push(NewStep {
                    index: row,
                    name,
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
}
