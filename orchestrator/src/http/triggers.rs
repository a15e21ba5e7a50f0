//! `GET /v1/triggers` (scope `read`): the NATS triggers of this process (`serve
//! --nats-trigger`) with their consumers' lag and counts, and the latest refusals recorded in
//! the log by any process ([`crate::triggers`]).

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;

use crate::http::error::{quote, ApiError};
use crate::http::openapi::{ErrorBody, Forbidden, ServerErrors, Unauthorized};
use crate::http::state::AppState;
use crate::triggers::TriggerList;

/// The most refusals one answer lists.
const MAX_REFUSALS: u32 = 1000;

/// The query of `GET /v1/triggers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TriggersQuery {
    limit: Option<String>,
}

/// `GET /v1/triggers`: this process's triggers and the recorded refusals.
#[utoipa::path(
    get,
    path = "/v1/triggers",
    tag = "operations",
    operation_id = "list_triggers",
    summary = "NATS triggers and their refusals",
    description = "The triggers of the process that answers (`serve --nats-trigger \
        SUBJECT=SAGA`): subject, saga, stream, durable consumer, lag (messages pending plus \
        handed out and not acknowledged, read every few seconds), and the sagas started, \
        redeliveries replayed and messages refused by this process since it started; then \
        the refusals recorded in the log by every process: per trigger, and the latest ones \
        with the error and an excerpt of the body.",
    params(
        ("limit" = Option<u32>, Query, minimum = 0, maximum = 1000, description = "How many of the latest refusals to list, 0 to 1000 (default 20)"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The triggers and refusals", body = TriggerList),
        (status = 400, description = "Malformed or unknown query parameter", body = ErrorBody),
        Unauthorized,
        Forbidden,
        ServerErrors,
    )
)]
pub(crate) async fn list_triggers(
    State(state): State<AppState>,
    Query(query): Query<TriggersQuery>,
) -> Result<Json<TriggerList>, ApiError> {
    let limit = match query.limit {
        None => 20,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if n <= MAX_REFUSALS && n.to_string() == text => n,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "limit must be an integer from 0 to {MAX_REFUSALS}, got {}",
                    quote(&text)
                )))
            }
        },
    };
    let store = state.engine.store();
    Ok(Json(TriggerList {
        triggers: state.config.triggers.views(),
        refused: store.trigger_refusal_counts().await?,
        refusals: store.trigger_refusals(None, limit).await?,
    }))
}
