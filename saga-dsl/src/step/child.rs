//! A child stage: another registered saga, started with an input computed from this one and
//! waited for.

use serde_json::Value;

use super::Rule;
use crate::{StepContext, StepError};

/// What a child stage starts: [`Step::child`](super::Step::child).
#[derive(Clone)]
pub struct ChildSaga {
    /// The registered saga it starts (its latest version).
    saga: String,
    /// The child's input, computed from this saga's input and earlier outputs.
    input: Rule<Value>,
}

impl ChildSaga {
    pub(super) fn new(saga: String, input: Rule<Value>) -> Self {
        Self { saga, input }
    }

    /// The name of the saga it starts.
    pub fn saga(&self) -> &str {
        &self.saga
    }

    /// The child's input, computed for the saga `ctx` describes.
    pub fn input(&self, ctx: &StepContext) -> Result<Value, StepError> {
        (self.input)(ctx)
    }
}
