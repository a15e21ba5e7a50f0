//! `fork`: a new saga from another's input (or an edited one), optionally taking over the
//! effects of its stages before `from_stage`.

use serde_json::Value;
use uuid::Uuid;

use super::{OperationError, Operations, Reason, Result};
use crate::model::rules::{check_fork, Refusal};
use crate::model::{Saga, SagaStatus};
use crate::store::NewFork;

/// What to fork.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForkRequest {
    /// The new saga's input; `None` takes the original's.
    pub input: Option<Value>,
    /// The stage the new saga starts at, taking over the effects of the stages before it;
    /// `None` for a fresh saga.
    pub from_stage: Option<String>,
}

/// A fork made.
#[derive(Debug, Clone, PartialEq)]
pub struct Forked {
    /// The new saga, as created (the engine runs it like any start).
    pub saga: Saga,
}

impl<'a> Operations<'a> {
    /// Forks saga `id`: a new saga of the same name at its highest registered version, with
    /// the original's input or `request.input` (checked as a start checks it). With
    /// `request.from_stage`, the stages before it are taken over with their recorded outputs
    /// and their compensations' keys (the original's), allowed only while their effects stand
    /// ([`check_fork`]), and the original becomes `ABORTED` with `superseded_by`, all in one
    /// transaction. Audited as `actor`'s with `reason` on both sagas.
    ///
    /// Needs the definitions: through a server ([`Operations::of`]) only.
    pub async fn fork(
        &self,
        id: Uuid,
        request: ForkRequest,
        reason: &'a Reason,
        actor: &'a str,
    ) -> Result<Forked> {
        let Some(engine) = self.engine else {
            return Err(OperationError::NeedsServer(
                "fork needs the saga definitions, which only a server running them has: run \
                 it through the server (`--server URL`, or POST /v1/sagas/{id}/fork)"
                    .to_owned(),
            ));
        };
        let original = self.load(id).await?;
        let input = request.input.unwrap_or_else(|| original.input.clone());
        let new = engine.new_saga(&original.name, input)?;
        let from_stage = request.from_stage.as_deref();
        check_fork(&original, &new.steps, from_stage).map_err(|refusal| match refusal {
            Refusal::Invalid(message) => OperationError::Invalid(message),
            refusal => OperationError::Conflict(refusal.to_string()),
        })?;
        let fork = NewFork {
            original: id,
            new,
            from_stage,
            audit: self.audit(Some(actor), Some(reason.as_str())),
        };
        let saga = self.store.fork(&fork).await?;
        // Committed, not yet handed to the engine nor answered: a crash here must leave the
        // fork whole (one owner per effect) and the new saga to be claimed after a restart.
        crate::failpoint::crash_if_armed("after_fork", &saga.name);
        engine.created_elsewhere(&saga);
        // The original ended here, not in a driver: its span is emitted as an abort's is.
        if from_stage.is_some() && original.status != SagaStatus::Aborted {
            if let Some(telemetry) = self.telemetry {
                if let Some(ended) = self.store.get_saga(id).await? {
                    if let Some(trace) =
                        telemetry.saga_trace(ended.id, ended.traceparent.as_deref())
                    {
                        telemetry.end_saga(&ended, &trace, ended.updated_at);
                    }
                }
            }
        }
        Ok(Forked { saga })
    }
}
