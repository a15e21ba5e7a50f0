//! A call (a compensatable, pivot or retriable step): the driver writes it ahead and runs it;
//! going back, its compensation is called.

use saga_dsl::Call;

use super::{Decision, StageRules};
use crate::engine::driver::Driver;
use crate::model::Millis;
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
}
