//! A durable sleep: it starts by writing its wake time (`WAITING`), which the plan makes the
//! saga's due time, so the saga waits like a long retry, leased by nobody; once the time has
//! come it ends `SUCCEEDED`. Nothing to undo.

use saga_dsl::{Phase, Sleep};
use serde_json::{json, Value};

use super::{millis, system_time, Decision, StageRules};
use crate::engine::driver::Driver;
use crate::model::{rfc3339, Millis, Saga, StepRecord, StepStatus};
use crate::store::{NewEvent, StoreError};

impl StageRules for Sleep {
    async fn advance(
        &self,
        driver: &mut Driver,
        stage: &str,
        index: usize,
        now: Millis,
    ) -> Result<Decision, StoreError> {
        driver.decide_sleep(stage, self, index, now);
        Ok(Decision::Decided)
    }

    /// A sleep whose wake time could not be computed changed nothing: back, unless the point
    /// of no return is behind.
    fn can_go_back(_failed: &StepRecord, saga: &Saga) -> bool {
        !saga.pivot_started
    }
}

impl Driver {
    /// Starts a sleep, or ends it (the plan asks only once its wake time has come).
    fn decide_sleep(&mut self, name: &str, sleep: &Sleep, index: usize, now: Millis) {
        if self.saga.steps[index].action.status != StepStatus::Pending {
            self.settle_without_call(index, StepStatus::Succeeded, Some(Value::Null), now);
            let wake_at = self.saga.steps[index].wake_at.map(rfc3339);
            let data = json!({ "wake_at": wake_at });
            self.pending
                .events
                .push(NewEvent::step("step.succeeded", name, data));
            return;
        }
        let wake = sleep
            .wake_time(&self.context(index, Phase::Action, 0), system_time(now))
            .and_then(millis);
        match wake {
            Ok(at) => {
                self.saga.steps[index].wake_at = Some(at);
                self.start_waiting(index, now);
                let data = json!({"wake_at": rfc3339(at)});
                self.pending
                    .events
                    .push(NewEvent::step("step.waiting", name, data));
            }
            Err(e) => self.refuse(
                index,
                &format!("its wake time failed: {}", e.message()),
                now,
            ),
        }
    }
}
