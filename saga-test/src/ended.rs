//! A saga as a test reads it once it has ended: its record, its attempt log and its events.

use orchestrator::model::{Attempt, Event, Saga, SagaStatus};
use serde_json::Value;

/// A saga's record, attempt log and events, read from the step log.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The saga with its steps.
    pub saga: Saga,
    /// Every attempt of every action and compensation, in the order they started.
    pub attempts: Vec<Attempt>,
    /// Its events, in order.
    pub events: Vec<Event>,
    /// The calls of its actions and compensations that began, in order, as `step:phase`
    /// (`phase` being `action` or `compensation`), across crashes: the kit's own record, in
    /// which calls that started in the same millisecond keep their order.
    pub calls: Vec<String>,
}

impl Ended {
    /// The saga's status.
    pub fn status(&self) -> SagaStatus {
        self.saga.status
    }

    /// The saga's output (a completed saga's), if any.
    pub fn output(&self) -> Option<&Value> {
        self.saga.output.as_ref()
    }

    /// The attempts of `step`'s `phase` (`"action"` or `"compensation"`), in order.
    pub fn attempts_of<'a>(
        &'a self,
        step: &'a str,
        phase: &'a str,
    ) -> impl Iterator<Item = &'a Attempt> {
        self.attempts
            .iter()
            .filter(move |a| a.step == step && a.phase == phase)
    }

    /// The events' kinds, in order (`saga.started`, `step.succeeded`, …).
    pub fn event_kinds(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.kind.as_str()).collect()
    }

    /// The output `step`'s action recorded, if it succeeded.
    pub fn step_output(&self, step: &str) -> Option<&Value> {
        self.saga
            .steps
            .iter()
            .find(|s| s.name == step)
            .and_then(|s| s.output.as_ref())
    }
}
