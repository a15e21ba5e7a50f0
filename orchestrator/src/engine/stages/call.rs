//! A call (a compensatable, pivot or retriable step): the driver writes it ahead and runs it;
//! going back, its compensation is called.

use saga_dsl::Call;

use super::{Decision, StageRules};
use crate::engine::driver::Driver;
use crate::model::{Millis, Saga, StepKind, StepRecord, StepStatus};
use crate::store::StoreError;

impl StageRules for Call {
    async fn advance(
        &self,
        _driver: &mut Driver,
        _stage: &str,
        _index: usize,
        _now: Millis,
    ) -> Result<Decision, StoreError> {
        Ok(Decision::Call)
    }

    fn can_go_back(failed: &StepRecord, _saga: &Saga) -> bool {
        match failed.kind {
            StepKind::Compensatable => true,
            // A pivot that failed definitively never took effect: go back. One whose
            // outcome is unknown may have: neither way is safe without a person.
            StepKind::Pivot => failed.action.status == StepStatus::Failed,
            // Retriable steps come after the point of no return.
            _ => false,
        }
    }
}
