//! `signal`: deliver a named signal with a JSON payload to a saga.

use super::{quote, OperationError, Operations, Result};
use crate::store::{SignalOutcome, SignalRequest};

impl Operations<'_> {
    /// Delivers `signal`. A saga whose definition this process has and which waits for no
    /// signal of that name refuses it (`NotFound`); one whose definition is elsewhere keeps it,
    /// to be taken if its wait comes.
    pub async fn signal(&self, signal: SignalRequest<'_>) -> Result<SignalOutcome> {
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
        Ok(self.store.send_signal(signal).await?)
    }
}
