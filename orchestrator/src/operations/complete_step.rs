//! `complete-step`: an operator supplies the output of a step done by hand.

use serde_json::Value;
use uuid::Uuid;

use super::{step_refused, OperationError, Operations, Reason, Result};
use crate::model::rules::check_complete_step;
use crate::model::Saga;

/// The largest output an operator may supply, in bytes of compact JSON: the API's default
/// request body limit (1 MiB). Outputs of steps are otherwise bounded only by what the
/// participants return; one typed by a person is held to what a request could carry, so the
/// CLI on a database accepts no more than a server would.
pub const MAX_OUTPUT: usize = 1024 * 1024;

impl<'a> Operations<'a> {
    /// Records `output` as the result of step `step` of saga `id`, done by hand, audited as
    /// `actor`'s with `reason`: the step `SUCCEEDED` with that output (its compensation, if
    /// ever needed, receives it), and the saga goes on (a `PAUSED` or `FAILED` one runs
    /// again). Only on the step the saga is stopped on with no call in flight
    /// ([`check_complete_step`]). Returns the saga as it left it.
    pub async fn complete_step(
        &self,
        id: Uuid,
        step: &str,
        output: Value,
        reason: &'a Reason,
        actor: &'a str,
    ) -> Result<Saga> {
        let size = output.to_string().len();
        if size > MAX_OUTPUT {
            return Err(OperationError::Invalid(format!(
                "the output is {size} bytes of JSON; at most {MAX_OUTPUT} are allowed"
            )));
        }
        let before = self.load(id).await?;
        if let Err(refusal) = check_complete_step(&before, step) {
            return Err(step_refused(&before, step, refusal));
        }
        let audit = self.audit(Some(actor), Some(reason.as_str()));
        Ok(self.store.complete_step(id, step, &output, &audit).await?)
    }
}
