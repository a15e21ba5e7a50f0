//! The recovery commands over HTTP (SPEC §13): complete a step by hand, and fork a saga,
//! through the use cases of [`crate::operations`], each audited in the events with the
//! token's name as the actor. They need the `operate` scope.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::auth::ClientId;
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, SagaId};
use crate::http::openapi::{ErrorBody, ForbiddenOperate, ServerErrors, Unauthorized};
use crate::http::operators::checked_reason;
use crate::http::state::AppState;
use crate::model::Saga;
use crate::operations::{ForkRequest, Operations};

/// The body of `complete`: the output of the step done by hand, and why.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteStep {
    /// The step's output, as its action would have returned it (any JSON, `null` included; at
    /// most 1 MiB): later steps read it, and its compensation, if ever needed, receives it.
    output: Value,
    /// Why: kept in the audit event, without its surrounding white space. At most 1000
    /// characters as sent, at least one of them not white space.
    #[schema(
        max_length = 1000,
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    reason: String,
}

/// The body of `fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkSaga {
    /// The new saga's input, checked against the definition's input schema as a start's is;
    /// absent (or `null`) to take the original's.
    #[serde(default)]
    input: Option<Value>,
    /// The stage the new saga starts at: the stages before it are taken over from the
    /// original with their outputs and are not run again (their compensations, if ever
    /// needed, use the original's idempotency keys), and the original becomes `ABORTED` with
    /// `superseded_by`. Absent for a fresh saga that runs every stage.
    #[serde(default)]
    from_stage: Option<String>,
    /// Why: kept in the audit events, without its surrounding white space. At most 1000
    /// characters as sent, at least one of them not white space.
    #[schema(
        max_length = 1000,
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    reason: String,
}

/// The body as `T`, or `400` saying what was expected.
fn body<T: serde::de::DeserializeOwned>(
    JsonBody(body): JsonBody,
    expected: &str,
) -> Result<T, ApiError> {
    serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("the body must be {expected}: {e}")))
}

/// `POST /v1/sagas/{id}/steps/{step}/complete` `{"output", "reason"}`.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/steps/{step}/complete",
    tag = "operators",
    operation_id = "complete_step",
    summary = "Complete a step by hand, with its output",
    description = "Records that an operator did a step by hand: its action becomes `SUCCEEDED` \
                   with the given output, and the saga goes on (a `PAUSED` or `FAILED` saga runs \
                   again); the step's compensation, if ever needed, receives this output. Only \
                   the step the saga is stopped on, with no call in flight: of a `PAUSED` saga, \
                   the stage it stands on; of a `FAILED` saga, the failed step; of a running \
                   saga, the stage retrying on a timer or waiting for a signal or a sleep. A \
                   branch of a parallel group (`group/branch`) may be completed, not the group \
                   itself, nor a child stage, nor any step of a `COMPENSATING` saga (see \
                   mark-compensated). The saga is taken over (its lease epoch bumped). Audited \
                   in the event `step.completed_by_operator` with the reason, the token's name \
                   and the output. Needs the `operate` scope.",
    params(
        ("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$"),
        ("step" = String, Path, description = "The step's name (a branch is `group/branch`)"),
    ),
    request_body(content = CompleteStep, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Completed: the saga as the command left it", body = Saga),
        (status = 400, description = "Malformed saga id or body, no reason, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "No saga with this id (or prefix), or no such step", body = ErrorBody),
        (status = 409, description = "The saga is not stopped on this step (finished, compensating, a call in flight, another stage), or the step is a group, a child stage or already done", body = ErrorBody),
        (status = 413, description = "Body over the limit (1 MiB by default)", body = ErrorBody),
        (status = 422, description = "The output is over 1 MiB (`unprocessable`)", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn complete_step(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path((saga, step)): Path<(String, String)>,
    json: JsonBody,
) -> Result<Json<Saga>, ApiError> {
    let id = crate::http::extract::saga_id(&state, &saga).await?;
    let request: CompleteStep = body(json, r#"{"output": <JSON>, "reason": "…"}"#)?;
    let reason = checked_reason(&request.reason)?;
    let saga = Operations::of(&state.engine)
        .complete_step(id, &step, request.output, &reason, actor.as_str())
        .await?;
    Ok(Json(saga.shown()))
}

/// `POST /v1/sagas/{id}/fork` `{"input"?, "from_stage"?, "reason"}`.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/fork",
    tag = "operators",
    operation_id = "fork_saga",
    summary = "Fork a saga: a new one from its input, optionally taking over its effects",
    description = "Creates a new saga of the same name at its highest registered version, with \
                   the original's input or the one given (checked as a start checks it: `422`). \
                   Without `from_stage` the new saga runs every stage with keys of its own and \
                   the original is left as it is. With `from_stage`, the stages before it are \
                   not run again: the new saga takes over their recorded outputs and statuses, \
                   and their compensations, if ever needed, run with the original's idempotency \
                   keys; allowed only while those effects stand (the original `PAUSED`, \
                   `ABORTED` or `COMPLETED`, each earlier stage `SUCCEEDED` or `SKIPPED` with no \
                   compensation run, no child stage among them) and when the definition has the \
                   same stages before `from_stage`. In the same transaction the original becomes \
                   `ABORTED` with `superseded_by`, so every effect has exactly one owner. The new \
                   saga links `forked_from`; both get a `saga.forked` event with the reason and \
                   the token's name. Needs the `operate` scope.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    request_body(content = ForkSaga, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Forked: the new saga as created, `Location` its URL",
         body = Saga,
         headers(("Location" = String, description = "/v1/sagas/{id} of the new saga"))),
        (status = 400, description = "Malformed saga id or body, no reason, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "No saga with this id (or prefix), or its definition is not registered on this server", body = ErrorBody),
        (status = 409, description = "The original was already superseded by a fork, or its state does not let the stages before `from_stage` be taken over (not `PAUSED`, `ABORTED` or `COMPLETED`; a stage not done, compensated, or a child stage)", body = ErrorBody),
        (status = 413, description = "Body over the limit (1 MiB by default)", body = ErrorBody),
        (status = 422, description = "The input does not fit the saga's input schema (`invalid_input`), or `from_stage` is no stage of the definition or its earlier stages differ from the original's (`unprocessable`)", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn fork_saga(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    SagaId(id): SagaId,
    json: JsonBody,
) -> Result<Response, ApiError> {
    let request: ForkSaga = body(
        json,
        r#"{"input"?: <JSON>, "from_stage"?: "<stage>", "reason": "…"}"#,
    )?;
    let reason = checked_reason(&request.reason)?;
    let fork = ForkRequest {
        input: request.input,
        from_stage: request.from_stage,
    };
    let forked = Operations::of(&state.engine)
        .fork(id, fork, &reason, actor.as_str())
        .await?;
    let saga = forked.saga.shown();
    // A UUID is always a valid header value.
    let location = HeaderValue::from_str(&format!("/v1/sagas/{}", saga.id))
        .unwrap_or_else(|_| HeaderValue::from_static("/v1/sagas"));
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(saga),
    )
        .into_response())
}
