//! What a console or a dashboard reads about the whole log and about its caller:
//! `GET /v1/counts` (sagas by status, needing attention, blocked) and `GET /v1/whoami` (the
//! caller's token name and scopes, so that a console shows only the actions it may take).
//!
//! Counts are read at most once per [`COUNTS_FRESH_FOR`] however many pages ask
//! ([`crate::http::counts`]), so that the console's live counts cost the database the same at
//! one open page as at fifty.

use axum::extract::State;
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::{CallerScopes, ClientId};
use crate::http::counts::Counts;
#[cfg(doc)]
use crate::http::counts::COUNTS_FRESH_FOR;
use crate::http::error::ApiError;
use crate::http::openapi::{Forbidden, ServerErrors, Unauthorized};
use crate::http::state::AppState;

/// `GET /v1/counts`: how many sagas are in each status, need attention, or are blocked.
#[utoipa::path(
    get,
    path = "/v1/counts",
    tag = "sagas",
    operation_id = "saga_counts",
    summary = "Count sagas by status",
    description = "Sagas per status (every status listed), how many need a person, and how \
        many unfinished ones are blocked (no running process has their definition). Counted \
        at most every two seconds, whoever asks.",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The counts", body = Counts),
        Unauthorized,
        Forbidden,
        ServerErrors,
    )
)]
pub(crate) async fn counts(State(state): State<AppState>) -> Result<Json<Counts>, ApiError> {
    Ok(Json(
        state.counts.read(state.engine.store().as_ref()).await?,
    ))
}

/// The body of `GET /v1/whoami`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct WhoAmI {
    /// The token's name (`anonymous` when the API is open, `token` for `--api-token`).
    name: String,
    /// What it may do: `read`, `start`, `operate`, `admin`.
    scopes: Vec<&'static str>,
    /// Whether the server asks for a token at all.
    auth_required: bool,
}

/// `GET /v1/whoami`: the caller's token name and scopes.
#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "operations",
    operation_id = "whoami",
    summary = "Who the caller is",
    description = "The name and scopes of the bearer token presented (`anonymous` with every \
        scope when the server asks for no token), so that a client offers only what it may do.",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The caller (any valid token, whatever its scopes)",
         body = WhoAmI),
        Unauthorized,
    )
)]
pub(crate) async fn whoami(
    Extension(client): Extension<ClientId>,
    Extension(caller): Extension<CallerScopes>,
) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: client.as_str().to_owned(),
        scopes: caller.scopes.iter().map(|s| s.as_str()).collect(),
        auth_required: caller.auth_required,
    })
}
