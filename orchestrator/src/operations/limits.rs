//! `set_limit`: an operator changes a limit while sagas run (SPEC §14).

use super::{OperationError, Operations, Reason, Result};
use crate::model::{LimitChange, LimitInfo};
use crate::store::StoreError;

/// The largest concurrency limit or burst accepted: more than any database can run at once.
pub const MAX_LIMIT: u32 = 1_000_000;

impl<'a> Operations<'a> {
    /// Sets the limit `name` to `change`, audited as `actor`'s with `reason` (kept in
    /// `limit_changes`). Every process applies it at its next claim (or, for a rate limiter,
    /// its next token), within a second; a server running the command looks at once. Sagas
    /// already running keep running when a limit is lowered: the limit holds back the next
    /// starts. `NotFound` for an unknown limit; `BadRequest` for a change of the other kind
    /// or out of range.
    pub async fn set_limit(
        &self,
        name: &str,
        change: LimitChange,
        reason: Option<&'a Reason>,
        actor: &'a str,
    ) -> Result<LimitInfo> {
        match &change {
            LimitChange::Limit(n) if *n > MAX_LIMIT => {
                return Err(OperationError::BadRequest(format!(
                    "limit {n} is out of range: 0 to {MAX_LIMIT}"
                )))
            }
            LimitChange::Rate { burst, .. } if *burst == 0 || *burst > MAX_LIMIT => {
                return Err(OperationError::BadRequest(format!(
                    "burst {burst} is out of range: 1 to {MAX_LIMIT}"
                )))
            }
            _ => {}
        }
        let audit = self.audit(Some(actor), reason.map(Reason::as_str));
        let info = self
            .store
            .set_limit(name, &change, audit)
            .await
            .map_err(|e| match e {
                StoreError::UnknownLimit(name) => {
                    OperationError::NotFound(format!("no limit named {name:?}"))
                }
                StoreError::InvalidValue(message) => OperationError::BadRequest(message),
                e => OperationError::Store(e),
            })?;
        if let Some(engine) = self.engine {
            engine.wake();
        }
        Ok(info)
    }
}
