//! `set_limit`: an operator changes a limit while sagas run (SPEC §14).

use super::{OperationError, Operations, Reason, Result};
use crate::model::{LimitChange, LimitInfo, LimitKind};
use crate::store::StoreError;

/// The largest concurrency limit or burst accepted: more than any database can run at once.
pub const MAX_LIMIT: u32 = 1_000_000;

impl<'a> Operations<'a> {
    /// Sets the limit `name` to `change`, audited as `actor`'s with `reason` (kept in
    /// `limit_changes`). Every process applies it at its next claim (or, for a rate limiter,
    /// its next token), within a second; a server running the command looks at once. Sagas
    /// already running keep running when a limit is lowered: the limit holds back the next
    /// starts. [`StoreError::UnknownLimit`] for an unknown limit; `BadRequest` for a value out
    /// of range; `Invalid` for a change of the other kind (a rate for a concurrency limit, or
    /// the reverse), which only the limit's kind, not the change itself, makes wrong.
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
            // More calls a period than this would space tokens less than a microsecond apart,
            // the bucket's resolution: it would let every call through.
            LimitChange::Rate { rate, .. } if rate.count() > MAX_LIMIT => {
                return Err(OperationError::BadRequest(format!(
                    "rate {rate} is out of range: 1 to {MAX_LIMIT} calls per second, minute or \
                     hour"
                )))
            }
            _ => {}
        }
        // The kind is checked here so that a change of the other kind is told from a value the
        // database cannot hold (both `InvalidValue` from the store, which checks it again).
        let current = self.limit(name).await?;
        match (current.kind, &change) {
            (LimitKind::Rate, LimitChange::Limit(_)) => {
                return Err(OperationError::Invalid(format!(
                    "{name} is a rate limiter: give it a \"rate\" (and a \"burst\"), not a \
                     \"limit\""
                )))
            }
            (LimitKind::MaxRunning | LimitKind::PerKey, LimitChange::Rate { .. }) => {
                return Err(OperationError::Invalid(format!(
                    "{name} is a concurrency limit ({}): give it a \"limit\", not a \"rate\"",
                    current.kind
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
                StoreError::InvalidValue(message) => OperationError::BadRequest(message),
                e => OperationError::Store(e),
            })?;
        if let Some(engine) = self.engine {
            engine.wake();
        }
        Ok(info)
    }

    /// The limit `name` as it stands, or [`StoreError::UnknownLimit`]: what a change that
    /// leaves a rate limiter's burst out keeps.
    pub async fn limit(&self, name: &str) -> Result<LimitInfo> {
        self.store
            .limits()
            .await?
            .into_iter()
            .find(|l| l.name == name)
            .ok_or_else(|| OperationError::Store(StoreError::UnknownLimit(name.to_owned())))
    }
}
