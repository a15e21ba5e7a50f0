//! The store's part of flow control (SPEC §14): the limits kept in the database, where every
//! process reads them and operators change them, and the rate limiters' buckets.
//!
//! Concurrency limits are enforced by the claim itself (each backend's `claim`): a saga of a
//! definition with limits is created waiting (`sagas.gate`), out of the due-time index every
//! other claim walks, and the claim admits waiting sagas only while their definition's and
//! their key's running counts stay within the limits, in the statement that leases them.

use async_trait::async_trait;
use saga_dsl::DeclaredLimit;

use crate::model::{LimitChange, LimitInfo, Millis};
use crate::store::{Audit, Result};

/// The answer of a rate limiter to one call: when it may go. The token is the caller's
/// (reserved) whether it goes now or later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenGrant {
    /// When the call may go (milliseconds since the epoch, the database's clock).
    pub at: Millis,
    /// The database's time when the token was taken.
    pub now: Millis,
}

impl TokenGrant {
    /// Whether the call may go at once.
    pub fn now_ok(&self) -> bool {
        self.at <= self.now
    }
}

/// Limits and rate limiters, kept in the database.
#[async_trait]
pub trait FlowLog: Send + Sync {
    /// Writes the limits the definitions `sagas` (by name) declare: a new one is inserted;
    /// one no operator has changed takes the declared value; an operator's value is kept (the
    /// declared one is shown beside it); a concurrency limit of one of `sagas` that it no
    /// longer declares is removed.
    async fn declare_limits(&self, limits: &[DeclaredLimit], sagas: &[String]) -> Result<()>;

    /// Every limit, ordered by name, with what holds and what waits for it.
    async fn limits(&self) -> Result<Vec<LimitInfo>>;

    /// Changes the limit `name` (scope `operate`), recorded with who and why in
    /// `limit_changes`; every process applies it at its next claim or token.
    /// [`StoreError::UnknownLimit`](crate::store::StoreError::UnknownLimit) for an unknown
    /// name, [`StoreError::InvalidValue`](crate::store::StoreError::InvalidValue) for a change
    /// of the other kind (a rate for a concurrency limit, or the reverse).
    async fn set_limit(
        &self,
        name: &str,
        change: &LimitChange,
        audit: Audit<'_>,
    ) -> Result<LimitInfo>;

    /// Takes a token from the rate limiter `name` for a call, reserving the next one free:
    /// the call goes at [`TokenGrant::at`]. An unknown limiter lets every call go.
    async fn take_token(&self, name: &str) -> Result<TokenGrant>;
}
