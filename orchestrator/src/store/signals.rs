//! Signals: a JSON payload sent to a saga from outside (`POST /v1/sagas/{id}/signals/{name}`),
//! kept in the log until the saga's signal step takes it.

use serde_json::Value;
use uuid::Uuid;

use crate::model::{Millis, SagaStatus};

/// A signal as sent.
#[derive(Debug, Clone, Copy)]
pub struct SignalRequest<'a> {
    /// The saga.
    pub saga: Uuid,
    /// The signal's name.
    pub name: &'a str,
    /// Its payload.
    pub payload: &'a Value,
    /// The sender's idempotency key, if it gave one.
    pub key: Option<&'a str>,
}

/// What became of a signal sent to a saga.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalOutcome {
    /// Recorded now: the saga takes it at its signal step (made due at once if it waits there).
    Received,
    /// This signal had come before with the same payload (a repeat, or the replay of a request
    /// with the same idempotency key): nothing changed.
    AlreadyReceived,
    /// A signal of this name had come before with another payload: the first one wins.
    Conflict,
    /// The idempotency key was used before for this signal with another payload.
    KeyReused,
    /// The saga is terminal or compensating: no signal step of it will run any more.
    Refused(SagaStatus),
}

/// A signal the log holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSignal {
    /// Its payload.
    pub payload: Value,
    /// When it was received, on the store's clock.
    pub received_at: Millis,
}
