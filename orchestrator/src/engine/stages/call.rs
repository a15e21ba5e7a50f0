//! A call (a compensatable, pivot or retriable step): the runner writes it ahead and runs it;
//! going back, its compensation is called.

use saga_dsl::Call;

use super::{Decision, Facts, StageRules, Turn};

impl StageRules for Call {
    fn advance(&self, _turn: &Turn<'_>, _facts: Facts) -> Decision {
        Decision::Call
    }
}
