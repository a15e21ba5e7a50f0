//! The saga object as clients read it one saga at a time: the saga with its attempt log.

use serde::Serialize;

use super::{Attempt, Saga};

/// A saga with every attempt of its attempt log: the body of `GET /v1/sagas/{id}` and of
/// `saga show ID --json`, one object on both surfaces. The saga's fields are at the top level
/// (the [`Saga`] as shown, [`Saga::shown`]), so a client that reads a [`Saga`] from it still
/// can; `attempts` has the fields of `GET /v1/sagas/{id}/attempts`, in the order they started.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct SagaDetail {
    /// The saga, with its steps.
    #[serde(flatten)]
    pub saga: Saga,
    /// Every attempt of its actions and compensations, in the order they started.
    pub attempts: Vec<Attempt>,
}
