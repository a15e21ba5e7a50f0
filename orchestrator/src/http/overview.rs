//! What a console or a dashboard reads about the whole log and about its caller:
//! `GET /v1/counts` (sagas by status, needing attention, blocked) and `GET /v1/whoami` (the
//! caller's token name and scopes, so that a console shows only the actions it may take).
//!
//! Counts are read at most once per [`COUNTS_FRESH_FOR`] however many pages ask, so that the
//! console's live counts cost the database the same at one open page as at fifty.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::{CallerScopes, ClientId};
use crate::http::error::ApiError;
use crate::http::openapi::{Forbidden, ServerErrors, Unauthorized};
use crate::http::state::AppState;
use crate::model::SagaStatus;

/// How long a reading of the counts is served before the store is asked again.
pub(crate) const COUNTS_FRESH_FOR: Duration = Duration::from_secs(2);

/// The body of `GET /v1/counts`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Counts {
    /// Sagas per status, every status listed.
    #[schema(value_type = std::collections::BTreeMap<String, u64>)]
    by_status: std::collections::BTreeMap<&'static str, u64>,
    /// Sagas flagged as needing a person.
    needs_attention: u64,
    /// Unfinished sagas whose definition no running process has.
    blocked: u64,
    /// When these were counted (RFC 3339); never older than [`COUNTS_FRESH_FOR`].
    counted_at: String,
}

/// The last reading of the counts, shared by every request.
#[derive(Debug, Default)]
pub(crate) struct CountsCache(tokio::sync::Mutex<Option<(Instant, Counts)>>);

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
    // Held while counting: requests arriving meanwhile wait for this reading, not a new one.
    let mut cached = state.counts.0.lock().await;
    if let Some((at, counts)) = cached.as_ref() {
        if at.elapsed() < COUNTS_FRESH_FOR {
            return Ok(Json(counts.clone()));
        }
    }
    let store = state.engine.store();
    let by_status = store.count_by_status().await?;
    let (needs_attention, blocked) = store.count_flagged().await?;
    let counts = Counts {
        by_status: by_status
            .into_iter()
            .map(|(s, n): (SagaStatus, u64)| (s.as_str(), n))
            .collect(),
        needs_attention,
        blocked,
        counted_at: crate::model::rfc3339(store.now().await?),
    };
    *cached = Some((Instant::now(), counts.clone()));
    Ok(Json(counts))
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
