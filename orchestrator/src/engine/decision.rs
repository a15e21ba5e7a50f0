//! What a stage's turn came to: the value the stage kinds ([`super::stages`]) give the
//! driver's loop, which acts on it.

use crate::model::SagaStatus;

/// What a stage's turn came to.
pub(super) enum Decision {
    /// The stage calls its action (or compensation): the driver writes it ahead and calls.
    Call,
    /// The stage was decided without a call.
    Decided,
    /// The stage waits for this signal: give the saga back until it comes.
    AwaitSignal(String),
    /// The stage waits for its child saga, last seen in `seen`, to end: give the saga back
    /// until it does.
    AwaitChild {
        /// The child.
        child: uuid::Uuid,
        /// Its status when last read.
        seen: SagaStatus,
    },
}
