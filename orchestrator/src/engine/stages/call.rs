//! A call (a compensatable, pivot or retriable step): the driver writes it ahead and runs it;
//! going back, its compensation is called.

use saga_dsl::Call;

use super::{Decision, Outcome, StageRules, Turn};
use crate::engine::driver::Driver;

impl StageRules for Call {
    async fn advance(&self, _driver: &mut Driver, _turn: Turn<'_>) -> Outcome {
        Ok(Decision::Call)
    }
}
