//! `signal`: deliver a named signal with a JSON payload to a saga.

use serde_json::Value;
use uuid::Uuid;

use super::{quote, OperationError, Operations, Result};
use crate::store::{SignalOutcome, SignalRequest};

/// A signal to deliver.
#[derive(Debug, Clone, Copy)]
pub struct Signal<'a> {
    /// The saga.
    pub saga: Uuid,
    /// The signal's name.
    pub name: &'a str,
    /// Its payload: the output of the saga's signal stage.
    pub payload: &'a Value,
    /// The sender's idempotency key, if any.
    pub key: Option<&'a str>,
}

impl Operations<'_> {
    /// Delivers `signal`. A saga whose definition this process has and which waits for no
    /// signal of that name refuses it (`NotFound`); one whose definition is elsewhere keeps it,
    /// to be taken if its wait comes.
    pub async fn signal(&self, signal: Signal<'_>) -> Result<SignalOutcome> {
        let id = signal.saga;
        let saga = self.load(id).await?;
        let def = self.registry.and_then(|r| r.get(&saga.name, saga.version));
        if def.is_some_and(|d| d.hash() == saga.definition_hash && !d.waits_for_signal(signal.name))
        {
            return Err(OperationError::NotFound(format!(
                "saga {id} ({}) waits for no signal {}",
                saga.name,
                quote(signal.name)
            )));
        }
        let request = SignalRequest {
            saga: id,
            name: signal.name,
            payload: signal.payload,
            key: signal.key,
        };
        Ok(self.store.send_signal(request).await?)
    }
}
