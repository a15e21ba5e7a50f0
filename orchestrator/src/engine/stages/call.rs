//! A call (a compensatable, pivot or retriable step): the runner writes it ahead and runs it;
//! going back, its compensation is called. After a failed attempt, [`after_failure`] decides
//! between another attempt, giving up, and pausing the saga.

use std::time::Duration;

use saga_dsl::{Call, Phase, RetryPolicy};

use super::{Decision, Facts, Need, StageRules, Turn};
use crate::engine::decision::TaskEnd;
use crate::model::task::TaskRef;
use crate::model::{Millis, StepRecord};

impl StageRules for Call {
    fn needs(&self, turn: &Turn<'_>) -> Need {
        match waiting_task(turn) {
            Some(task) => Need::Task(task),
            None => Need::Nothing,
        }
    }

    /// A call is made; one whose participant acknowledged it and is to call back waits for
    /// the report until its deadline, then ends as reported or, past the deadline, with an
    /// unknown outcome.
    fn advance(&self, turn: &Turn<'_>, facts: Facts) -> Decision {
        let Some(task) = waiting_task(turn) else {
            return Decision::Call;
        };
        let attempt = task.attempt;
        match (facts, turn.row().timeout_at) {
            (Facts::Task(Some(outcome)), _) => Decision::TaskEnded {
                attempt,
                end: TaskEnd::Reported(outcome),
            },
            (_, Some(deadline)) if deadline > turn.now => Decision::AwaitTask { task, deadline },
            _ => Decision::TaskEnded {
                attempt,
                end: TaskEnd::TimedOut,
            },
        }
    }
}

/// The attempt the stage's action waits for a callback of, if it does.
fn waiting_task(turn: &Turn<'_>) -> Option<TaskRef> {
    turn.row().awaited_task().map(|attempt| TaskRef {
        saga: turn.saga.id,
        step_index: turn.index as u32,
        phase: Phase::Action,
        attempt,
    })
}

/// What follows a failed attempt of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Another attempt, after the delay.
    Retry,
    /// The action failed for good: the saga goes back (or, past its point of no return,
    /// fails).
    GiveUp,
    /// The action's retry budget ran out and its step pauses the saga instead of giving up.
    Pause,
}

/// What follows failed attempt `attempt` of `phase` of `row` (whose call is `call`; `None` for
/// a row the definition does not know), `retryable` or not, at `now`, the next attempt being
/// due after `delay`. A compensation is always tried again. An action is tried again while its
/// budget allows: attempts counted from the budget's base ([`StepRecord::budget`]) and, with
/// a time limit, the next attempt starting before the limit since the budget began. Once the
/// budget is spent on a retryable failure, a step that pauses when exhausted pauses the saga;
/// a permanent failure never pauses.
pub(crate) fn after_failure(
    call: Option<&Call>,
    phase: Phase,
    row: &StepRecord,
    attempt: u32,
    retryable: bool,
    now: Millis,
    delay: Duration,
) -> AfterFailure {
    if phase == Phase::Compensation {
        return AfterFailure::Retry;
    }
    let policy = call.map_or_else(RetryPolicy::no_retry, |c| *c.retry_policy());
    if !retryable {
        return AfterFailure::GiveUp;
    }
    let next = attempt.saturating_sub(row.budget_attempts) + 1;
    let began = row.budget().1.unwrap_or(now);
    let next_at = now.saturating_add(delay.as_millis() as Millis);
    let elapsed = Duration::from_millis(next_at.saturating_sub(began).max(0) as u64);
    if policy.allows_attempt_after(next, elapsed) {
        AfterFailure::Retry
    } else if call.is_some_and(Call::pauses_when_exhausted) {
        AfterFailure::Pause
    } else {
        AfterFailure::GiveUp
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use saga_dsl::{Phase, RetryPolicy, Step, StepContext, StepError};
    use serde_json::Value;

    use super::{after_failure, AfterFailure};
    use crate::model::fixtures::{step, NOW};
    use crate::model::{StepKind, StepStatus};

    async fn act(_: StepContext) -> Result<Value, StepError> {
        Ok(Value::Null)
    }

    async fn undo(_: StepContext) -> Result<(), StepError> {
        Ok(())
    }

    fn call(pause: bool) -> saga_dsl::Call {
        let policy = RetryPolicy::new()
            .with_max_attempts(5)
            .within(Duration::from_secs(10));
        let s = Step::compensatable("charge", act, undo).retry(policy);
        let s = if pause { s.pause_when_exhausted() } else { s };
        s.body().clone()
    }

    fn row(attempts: u32, started: i64) -> crate::model::StepRecord {
        let mut r = step(0, "charge", StepKind::Compensatable, StepStatus::Running);
        r.action.attempts = attempts;
        r.action.started_at = Some(started);
        r
    }

    #[test]
    fn the_budget_ends_at_the_attempts_or_the_time_whichever_comes_first() {
        let c = call(true);
        let ms = Duration::from_millis;
        let go = |r: &crate::model::StepRecord, a, delay| {
            after_failure(Some(&c), Phase::Action, r, a, true, NOW, delay)
        };
        assert_eq!(go(&row(4, NOW - 1_000), 4, ms(100)), AfterFailure::Retry);
        assert_eq!(go(&row(5, NOW - 1_000), 5, ms(100)), AfterFailure::Pause);
        // The time: the next attempt would start 10 s after the budget's first.
        assert_eq!(go(&row(2, NOW - 9_000), 2, ms(1_000)), AfterFailure::Pause);
        assert_eq!(go(&row(2, NOW - 9_000), 2, ms(999)), AfterFailure::Retry);
        // Without pausing, the same budget gives up.
        let plain = call(false);
        let r = row(5, NOW - 1_000);
        assert_eq!(
            after_failure(Some(&plain), Phase::Action, &r, 5, true, NOW, ms(100)),
            AfterFailure::GiveUp
        );
        // A permanent error never pauses; a compensation always retries.
        assert_eq!(
            after_failure(Some(&c), Phase::Action, &row(1, NOW), 1, false, NOW, ms(0)),
            AfterFailure::GiveUp
        );
        assert_eq!(
            after_failure(Some(&c), Phase::Compensation, &r, 9, false, NOW, ms(0)),
            AfterFailure::Retry
        );
    }

    #[test]
    fn a_fresh_budget_counts_from_its_base() {
        let c = call(true);
        // Five attempts spent, then a resume 60 s later: attempts 6 to 10 are the new budget.
        let mut r = row(7, NOW - 60_000);
        r.budget_attempts = 5;
        r.budget_started_at = Some(NOW - 1_000);
        let go = |r: &crate::model::StepRecord, a| {
            after_failure(Some(&c), Phase::Action, r, a, true, NOW, Duration::ZERO)
        };
        assert_eq!(go(&r, 7), AfterFailure::Retry);
        r.action.attempts = 10;
        assert_eq!(go(&r, 10), AfterFailure::Pause);
    }
}
