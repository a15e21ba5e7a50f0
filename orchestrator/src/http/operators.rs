//! The operator commands over HTTP (SPEC §8, §13): abort, retry, mark-compensated, pause and
//! resume, through the
//! same use cases as the CLI's ([`crate::operations`]), each audited in the saga's events with the
//! token's name as the actor. They need the `operate` scope.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::http::auth::ClientId;
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, SagaId};
use crate::http::openapi::{
    ErrorBody, ForbiddenOperate, MalformedSagaId, SagaNotFound, ServerErrors, Unauthorized,
};
use crate::http::state::AppState;
use crate::model::Saga;
use crate::operations::{Operations, Reason, MAX_REASON};

/// The body of an audited operator command.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OperatorReason {
    /// Why: kept in the audit event, without its surrounding white space. At most 1000
    /// characters as sent, at least one of them not white space.
    // The pattern is one character outside Rust's `char::is_whitespace`, the set `Reason`
    // trims, spelled out so that every regular expression dialect reads the same set.
    #[schema(
        max_length = 1000,
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    reason: String,
}

/// The reason of a command body, checked.
fn reason(JsonBody(body): JsonBody) -> Result<Reason, ApiError> {
    let parsed: OperatorReason = serde_json::from_value(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be {{\"reason\": \"…\"}} (why, for the audit): {e}"
        ))
    })?;
    checked_reason(&parsed.reason)
}

/// A reason as sent in a command's body, checked.
pub(crate) fn checked_reason(text: &str) -> Result<Reason, ApiError> {
    // Counted as sent, as the document's `maxLength` counts it: `Reason` alone would count
    // the trimmed text and take a longer one.
    if text.chars().count() > MAX_REASON {
        return Err(ApiError::bad_request(format!(
            "the reason is {} characters long; at most {MAX_REASON} are allowed, surrounding \
             white space included: shorten it",
            text.chars().count()
        )));
    }
    Ok(Reason::parse(text)?)
}

/// `POST /v1/sagas/{id}/abort` `{"reason"}`: stops driving the saga without compensating.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/abort",
    tag = "operators",
    operation_id = "abort_saga",
    summary = "Abort a saga (no compensation)",
    description = "Stops driving a saga that has not finished (or is `FAILED`) without \
                   compensating: it becomes `ABORTED`, audited in its events with the reason \
                   and the token's name. An action or compensation in flight is recorded \
                   `abandoned` with its step `UNKNOWN`: its outcome is unknown, and its result, \
                   when it comes, is refused. Needs the `operate` scope.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    request_body(content = OperatorReason, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Aborted: the saga as the command left it", body = Saga),
        (status = 400, description = "Malformed saga id or body, no reason, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        SagaNotFound,
        (status = 409, description = "The saga has already ended", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn abort_saga(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    SagaId(id): SagaId,
    body: JsonBody,
) -> Result<Json<Saga>, ApiError> {
    let reason = reason(body)?;
    let saga = Operations::of(&state.engine)
        .abort(id, &reason, actor.as_str())
        .await?;
    Ok(Json(saga.shown()))
}

/// `POST /v1/sagas/{id}/retry`: a waiting retry now, or another attempt of a failed step.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/retry",
    tag = "operators",
    operation_id = "retry_saga",
    summary = "Retry now",
    description = "Makes a saga's waiting retry happen now; on a `FAILED` saga, gives its failed \
                   step another attempt (the saga runs again). Audited with the token's name. \
                   Needs the `operate` scope.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Done: the saga as the command left it", body = Saga),
        MalformedSagaId,
        Unauthorized,
        ForbiddenOperate,
        SagaNotFound,
        (status = 409, description = "The saga has ended and has nothing to retry", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn retry_saga(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    SagaId(id): SagaId,
) -> Result<Json<Saga>, ApiError> {
    let saga = Operations::of(&state.engine)
        .retry(id, actor.as_str())
        .await?;
    Ok(Json(saga.shown()))
}

/// `POST /v1/sagas/{id}/steps/{step}/mark-compensated` `{"reason"}`.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/steps/{step}/mark-compensated",
    tag = "operators",
    operation_id = "mark_compensated",
    summary = "Vouch that a stuck compensation was done by hand",
    description = "Records that an operator did a step's compensation by hand (`MANUAL`), so \
                   the saga goes on with the remaining ones; only while it is `COMPENSATING` \
                   and the step still needs compensating. A compensation attempt in flight is \
                   recorded `abandoned`. Audited with the reason and the token's name. Needs \
                   the `operate` scope.",
    params(
        ("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$"),
        ("step" = String, Path, description = "The step's name (a branch is `group/branch`)"),
    ),
    request_body(content = OperatorReason, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Marked: the saga as the command left it", body = Saga),
        (status = 400, description = "Malformed saga id or body, no reason, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "No saga with this id (or prefix), or no such step", body = ErrorBody),
        (status = 409, description = "The saga is not compensating, or the step needs no compensation", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn mark_compensated(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path((saga, step)): Path<(String, String)>,
    body: JsonBody,
) -> Result<Json<Saga>, ApiError> {
    let id = crate::http::extract::saga_id(&state, &saga).await?;
    let reason = reason(body)?;
    let saga = Operations::of(&state.engine)
        .mark_compensated(id, &step, &reason, actor.as_str())
        .await?;
    Ok(Json(saga.shown()))
}

/// `POST /v1/sagas/{id}/pause` `{"reason"}`: stops the saga where it stands.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/pause",
    tag = "operators",
    operation_id = "pause_saga",
    summary = "Pause a saga",
    description = "Pauses a saga that is queued, running or compensating: nothing new is \
                   started for it, its timers (a sleep's end, a signal's timeout) do not fire \
                   and no lease is held until it is resumed; signals sent meanwhile are kept. \
                   A saga no worker holds becomes `PAUSED` at once; one a worker drives is \
                   answered with `pause_requested: true`: its call in flight finishes and is \
                   recorded, then the worker gives it back `PAUSED`. Audited with the reason \
                   and the token's name (`saga.paused`, or `saga.pause_requested` then \
                   `saga.paused`). Needs the `operate` scope.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    request_body(content = OperatorReason, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Paused, or the pause requested: the saga as the command left it", body = Saga),
        (status = 400, description = "Malformed saga id or body, no reason, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        SagaNotFound,
        (status = 409, description = "The saga has ended, is `FAILED` (use retry or abort), is already paused or has a pause pending", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn pause_saga(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    SagaId(id): SagaId,
    body: JsonBody,
) -> Result<Json<Saga>, ApiError> {
    let reason = reason(body)?;
    let saga = Operations::of(&state.engine)
        .pause(id, &reason, actor.as_str())
        .await?;
    Ok(Json(saga.shown()))
}

/// `POST /v1/sagas/{id}/resume` `{"reason"}`: lets a paused saga go on.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/resume",
    tag = "operators",
    operation_id = "resume_saga",
    summary = "Resume a paused saga",
    description = "Lets a `PAUSED` saga go on in the direction it was going (`RUNNING`, \
                   `COMPENSATING`, or `QUEUED` if it had not started), due now: sleeps and \
                   signal timeouts that passed while it was paused fire now, signals it was \
                   sent are taken. A step whose retries ran out gets a fresh budget (attempts \
                   and time counted from now) and the needs-attention flag its pause set is \
                   cleared. On a saga whose pause was requested but not yet applied, withdraws \
                   the request. Audited with the reason and the token's name \
                   (`saga.resumed`). Needs the `operate` scope.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    request_body(content = OperatorReason, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Resumed: the saga as the command left it", body = Saga),
        (status = 400, description = "Malformed saga id or body, no reason, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        SagaNotFound,
        (status = 409, description = "The saga is not paused and has no pause pending", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn resume_saga(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    SagaId(id): SagaId,
    body: JsonBody,
) -> Result<Json<Saga>, ApiError> {
    let reason = reason(body)?;
    let saga = Operations::of(&state.engine)
        .resume(id, &reason, actor.as_str())
        .await?;
    Ok(Json(saga.shown()))
}
