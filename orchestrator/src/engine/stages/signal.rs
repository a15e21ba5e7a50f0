//! A wait for a signal: it takes the signal if it has come, or starts waiting (`WAITING`,
//! with its timeout) and gives the saga back until the signal or the timeout comes; a timeout
//! takes the default payload or fails the stage. Nothing to undo.

use saga_dsl::SignalWait;
use serde_json::json;

use super::{millis, system_time, Decision, Facts, Need, StageRules, Turn};
use crate::engine::decision::{Until, Wait};
use crate::model::rfc3339;
use crate::store::NewEvent;

impl StageRules for SignalWait {
    /// Whether the signal has come, read at every turn: it may have come before the saga
    /// reached the stage.
    fn needs(&self, _turn: &Turn<'_>) -> Need {
        Need::Signal(self.signal().to_owned())
    }

    /// Takes the signal if it has come; otherwise starts waiting, or ends the wait when its
    /// timeout has passed (with the default payload, or failing).
    fn advance(&self, turn: &Turn<'_>, facts: Facts) -> Decision {
        let signal = self.signal();
        let reached = turn.reached();
        let received = match facts {
            Facts::Signal(received) => received,
            _ => None,
        };
        let payload = match received {
            Some(payload) => payload,
            None if reached => {
                let deadline = self
                    .deadline(&turn.context(), system_time(turn.now))
                    .map(|d| d.and_then(millis))
                    .transpose();
                let deadline = match deadline {
                    Ok(deadline) => deadline,
                    Err(e) => {
                        let error = format!("its timeout failed: {}", e.message());
                        return Decision::refuse(turn.stage, error);
                    }
                };
                let data = json!({"signal": signal, "timeout_at": deadline.map(rfc3339)});
                return Decision::AwaitSignal {
                    signal: signal.to_owned(),
                    starts: Some(Wait {
                        until: Until::Signal {
                            name: signal.to_owned(),
                            timeout_at: deadline,
                        },
                        event: NewEvent::step("step.waiting", turn.stage, data),
                    }),
                };
            }
            None => match turn.row().timeout_at {
                Some(at) if at <= turn.now => match self.default_payload() {
                    Some(default) => default.clone(),
                    None => {
                        let error = format!("no signal {signal:?} came before the timeout");
                        return Decision::refuse(turn.stage, error);
                    }
                },
                // Woken for another reason; the signal has not come.
                _ => {
                    return Decision::AwaitSignal {
                        signal: signal.to_owned(),
                        starts: None,
                    }
                }
            },
        };
        let decision = match self.accept(&turn.context(), payload) {
            Ok(output) => Decision::succeed(turn.stage, output, json!({"signal": signal})),
            Err(e) => Decision::refuse(turn.stage, e.message()),
        };
        match decision {
            // Taken on the turn the saga reached the stage: recorded as waited for, begun now.
            Decision::Settle(settle) if reached => {
                Decision::Settle(settle.taken(signal.to_owned()))
            }
            decision => decision,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use saga_dsl::{Step, StepError, StepKind};
    use serde_json::json;

    use super::super::testing::turn;
    use super::*;
    use crate::engine::decision::End;
    use crate::model::fixtures::{saga, step, NOW};
    use crate::model::{Saga, SagaStatus, StepStatus};

    fn waiting(status: StepStatus, timeout_at: Option<i64>) -> Saga {
        let mut record = saga(
            SagaStatus::Running,
            vec![step(0, "approve", StepKind::Signal, status)],
        );
        if status == StepStatus::Waiting {
            record.steps[0].waiting_for = Some("approval".to_owned());
            record.steps[0].timeout_at = timeout_at;
        }
        record
    }

    #[test]
    fn a_signal_wait_asks_whether_its_signal_came() {
        let stage = Step::signal("approve", "approval");
        let need = turn(&waiting(StepStatus::Pending, None), 0, |t| {
            stage.body().needs(t)
        });
        assert_eq!(need, Need::Signal("approval".to_owned()));
    }

    #[test]
    fn a_signal_wait_reached_with_no_signal_waits_until_its_timeout() {
        let stage = Step::signal("approve", "approval").signal_timeout(Duration::from_secs(60));
        let decision = turn(&waiting(StepStatus::Pending, None), 0, |t| {
            stage.body().advance(t, Facts::Signal(None))
        });
        let Decision::AwaitSignal {
            signal,
            starts: Some(wait),
        } = decision
        else {
            panic!("expected a wait that starts, got {decision:?}");
        };
        assert_eq!(signal, "approval");
        assert_eq!(
            wait.until,
            Until::Signal {
                name: "approval".to_owned(),
                timeout_at: Some(NOW + 60_000)
            }
        );
        assert_eq!(wait.event.kind, "step.waiting");
    }

    #[test]
    fn a_signal_that_came_before_the_wait_is_taken_at_once() {
        let stage = Step::signal("approve", "approval");
        let decision = turn(&waiting(StepStatus::Pending, None), 0, |t| {
            stage
                .body()
                .advance(t, Facts::Signal(Some(json!({"ok": true}))))
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a settle, got {decision:?}");
        };
        assert_eq!(settle.end, End::Succeeded(json!({"ok": true})));
        assert_eq!(settle.event.data, json!({"signal": "approval"}));
        assert_eq!(settle.taken.as_deref(), Some("approval"));
    }

    #[test]
    fn a_signal_wait_with_no_signal_and_a_passed_timeout_and_a_default_payload_settles_with_the_default(
    ) {
        let stage = Step::signal("approve", "approval")
            .signal_timeout(Duration::from_secs(60))
            .default_payload(json!({"approved": false}));
        let decision = turn(&waiting(StepStatus::Waiting, Some(NOW - 1)), 0, |t| {
            stage.body().advance(t, Facts::Signal(None))
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a settle, got {decision:?}");
        };
        assert_eq!(settle.end, End::Succeeded(json!({"approved": false})));
        assert_eq!(settle.event.kind, "step.succeeded");
        assert_eq!(settle.taken, None);
    }

    #[test]
    fn a_signal_wait_with_no_signal_and_a_passed_timeout_and_no_default_fails() {
        let stage = Step::signal("approve", "approval").signal_timeout(Duration::from_secs(60));
        let decision = turn(&waiting(StepStatus::Waiting, Some(NOW)), 0, |t| {
            stage.body().advance(t, Facts::Signal(None))
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a refusal, got {decision:?}");
        };
        assert_eq!(
            settle.end,
            End::Failed("no signal \"approval\" came before the timeout".to_owned())
        );
    }

    #[test]
    fn a_signal_wait_woken_before_its_timeout_without_its_signal_waits_on() {
        let stage = Step::signal("approve", "approval").signal_timeout(Duration::from_secs(60));
        let decision = turn(&waiting(StepStatus::Waiting, Some(NOW + 1)), 0, |t| {
            stage.body().advance(t, Facts::Signal(None))
        });
        assert!(
            matches!(decision, Decision::AwaitSignal { ref signal, starts: None } if signal == "approval"),
            "{decision:?}"
        );
    }

    #[test]
    fn a_payload_its_acceptor_refuses_fails_the_wait() {
        let stage = Step::signal("approve", "approval")
            .accept(|_, _| Err(StepError::permanent("not approved")));
        let decision = turn(&waiting(StepStatus::Waiting, None), 0, |t| {
            stage.body().advance(t, Facts::Signal(Some(json!({}))))
        });
        let Decision::Settle(settle) = decision else {
            panic!("expected a refusal, got {decision:?}");
        };
        assert_eq!(settle.end, End::Failed("not approved".to_owned()));
        assert_eq!(settle.taken, None);
    }
}
