//! A durable sleep: it starts by writing its wake time (`WAITING`), which the plan makes the
//! saga's due time, so the saga waits like a long retry, leased by nobody; once the time has
//! come it ends `SUCCEEDED`. Nothing to undo.

use saga_dsl::Sleep;
use serde_json::{json, Value};

use super::{millis, system_time, Decision, Facts, StageRules, Turn};
use crate::engine::decision::{Until, Wait};
use crate::model::rfc3339;
use crate::store::NewEvent;

impl StageRules for Sleep {
    /// Starts the sleep, or ends it (the plan asks only once its wake time has come).
    fn advance(&self, turn: &Turn<'_>, _facts: Facts) -> Decision {
        if !turn.reached() {
            let data = json!({ "wake_at": turn.row().wake_at.map(rfc3339) });
            return Decision::succeed(turn.stage, Value::Null, data);
        }
        match self
            .wake_time(&turn.context(), system_time(turn.now))
            .and_then(millis)
        {
            Ok(at) => Decision::Wait(Wait {
                until: Until::Time(at),
                event: NewEvent::step("step.waiting", turn.stage, json!({"wake_at": rfc3339(at)})),
            }),
            Err(e) => {
                Decision::refuse(turn.stage, format!("its wake time failed: {}", e.message()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use saga_dsl::{Step, StepKind};
    use serde_json::{json, Value};

    use super::super::testing::turn;
    use super::*;
    use crate::engine::decision::{End, Settle};
    use crate::model::fixtures::{saga, step, NOW};
    use crate::model::{SagaStatus, StepStatus};

    fn sleep(status: StepStatus) -> crate::model::Saga {
        saga(
            SagaStatus::Running,
            vec![step(0, "nap", StepKind::Sleep, status)],
        )
    }

    #[test]
    fn a_sleep_the_saga_reaches_waits_until_its_wake_time() {
        let stage = Step::sleep("nap", Duration::from_secs(5));
        let decision = turn(&sleep(StepStatus::Pending), 0, |t| {
            stage.body().advance(t, Facts::Nothing)
        });
        let Decision::Wait(wait) = decision else {
            panic!("expected a wait, got {decision:?}");
        };
        assert_eq!(wait.until, Until::Time(NOW + 5_000));
        assert_eq!(wait.event.kind, "step.waiting");
        assert_eq!(wait.event.data, json!({"wake_at": rfc3339(NOW + 5_000)}));
    }

    #[test]
    fn a_sleep_looked_at_again_after_its_wake_time_succeeds_with_null() {
        let mut record = sleep(StepStatus::Waiting);
        record.steps[0].wake_at = Some(NOW - 1);
        let stage = Step::sleep("nap", Duration::from_secs(5));
        let decision = turn(&record, 0, |t| stage.body().advance(t, Facts::Nothing));
        let Decision::Settle(Settle { end, event, taken }) = decision else {
            panic!("expected a settle, got {decision:?}");
        };
        assert_eq!(end, End::Succeeded(Value::Null));
        assert_eq!(event.kind, "step.succeeded");
        assert_eq!(event.data, json!({"wake_at": rfc3339(NOW - 1)}));
        assert_eq!(taken, None);
    }

    #[test]
    fn a_wake_time_that_cannot_be_computed_fails_the_sleep() {
        let stage = Step::sleep_for("nap", |_| Err(saga_dsl::StepError::permanent("no date")));
        let decision = turn(&sleep(StepStatus::Pending), 0, |t| {
            stage.body().advance(t, Facts::Nothing)
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a refusal, got {decision:?}");
        };
        assert_eq!(
            settle.end,
            End::Failed("its wake time failed: no date".to_owned())
        );
        assert_eq!(settle.event.kind, "step.failed");
    }
}
