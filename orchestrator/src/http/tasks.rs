//! Completion by callback over HTTP (SPEC §16): a participant handed a task token completes,
//! fails or keeps alive its step with `POST /v1/tasks/{token}/complete`, `…/fail` and
//! `…/heartbeat`, through [`Operations::report_task`]. They need the `start` scope. The token
//! is a secret: the request's log line names the route, not the path
//! ([`crate::http::middleware`]), and no answer repeats it.

use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::http::extract::JsonBody;
use crate::http::openapi::{ErrorBody, Forbidden, ServerErrors, Unauthorized};
use crate::http::state::AppState;
use crate::model::rfc3339;
use crate::operations::{Operations, Report};
use crate::store::TaskAnswer;

/// The body of `complete`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteTask {
    /// The step's output (any JSON; absent is `null`): later steps read it, and its
    /// compensation, if ever needed, receives it.
    #[serde(default)]
    output: Value,
}

/// The body of `fail`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailTask {
    /// What went wrong, kept in the attempt log (at most 1000 characters).
    #[schema(max_length = 1000)]
    error: String,
    /// Whether another attempt may succeed: it is then made (with the same idempotency key)
    /// within the step's retry policy; otherwise the step fails for good.
    #[serde(default)]
    retryable: bool,
}

/// How a report was taken.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TaskResult {
    /// Recorded now: the saga goes on from it.
    Recorded,
    /// The same report came before: nothing changed.
    Repeated,
    /// A heartbeat: the wait's deadline moved.
    Extended,
}

/// The body of `200` to a report.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TaskAccepted {
    /// The saga.
    saga_id: Uuid,
    /// The step.
    step: String,
    /// The attempt the token belongs to.
    attempt: u32,
    /// How the report was taken.
    outcome: TaskResult,
    /// After a heartbeat, when the wait now ends unless the participant reports first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    timeout_at: Option<String>,
}

const TOKEN_PARAM: &str = "The task token the step's call handed its participant \
                           (`Saga-Task-Token`); a secret";

async fn report(
    state: &AppState,
    token: &str,
    report: Report,
) -> Result<Json<TaskAccepted>, ApiError> {
    let (task, answer) = Operations::of(&state.engine)
        .report_task(token, report)
        .await?;
    let (step, outcome, timeout_at) = match answer {
        TaskAnswer::Recorded { step } => (step, TaskResult::Recorded, None),
        TaskAnswer::Repeated { step } => (step, TaskResult::Repeated, None),
        TaskAnswer::Extended { step, timeout_at } => {
            (step, TaskResult::Extended, Some(rfc3339(timeout_at)))
        }
        // Turned into errors by the use case.
        TaskAnswer::NotCurrent | TaskAnswer::NotFound => {
            return Err(ApiError::internal("a refused report reached the route"))
        }
    };
    Ok(Json(TaskAccepted {
        saga_id: task.saga,
        step,
        attempt: task.attempt,
        outcome,
        timeout_at,
    }))
}

/// `POST /v1/tasks/{token}/complete` `{"output"}`.
#[utoipa::path(
    post,
    path = "/v1/tasks/{token}/complete",
    tag = "tasks",
    operation_id = "complete_task",
    summary = "Complete a step waiting for its participant's callback",
    description = "The participant of a call completed by callback reports success: the step \
                   succeeds with `output` and the saga goes on. Only the step's current attempt \
                   may be completed; a repeat of the same completion answers `200` again \
                   (`repeated`). Needs the `start` scope.",
    params(("token" = String, Path, description = TOKEN_PARAM)),
    request_body(content = CompleteTask, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Taken", body = TaskAccepted),
        (status = 400, description = "Malformed body", body = ErrorBody),
        Unauthorized,
        Forbidden,
        (status = 404, description = "No task has this token", body = ErrorBody),
        (status = 409, description = "The token's attempt is no longer current (timed out and retried, the saga ended or went back), or another outcome was reported for it", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn complete_task(
    State(state): State<AppState>,
    Path(token): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<TaskAccepted>, ApiError> {
    let body: CompleteTask = serde_json::from_value(body).map_err(|e| {
        ApiError::bad_request(format!("the body must be {{\"output\": <JSON>}}: {e}"))
    })?;
    report(&state, &token, Report::Complete(body.output)).await
}

/// `POST /v1/tasks/{token}/fail` `{"error", "retryable"}`.
#[utoipa::path(
    post,
    path = "/v1/tasks/{token}/fail",
    tag = "tasks",
    operation_id = "fail_task",
    summary = "Fail a step waiting for its participant's callback",
    description = "The participant of a call completed by callback reports failure: with \
                   `retryable` the call is made again (same idempotency key, a new token) \
                   within the step's retry policy, else the step fails for good and the saga \
                   goes back. Only the step's current attempt; a repeat of the same failure \
                   answers `200` again. Needs the `start` scope.",
    params(("token" = String, Path, description = TOKEN_PARAM)),
    request_body(content = FailTask, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Taken", body = TaskAccepted),
        (status = 400, description = "Malformed body, or an error over 1000 characters", body = ErrorBody),
        Unauthorized,
        Forbidden,
        (status = 404, description = "No task has this token", body = ErrorBody),
        (status = 409, description = "The token's attempt is no longer current, or another outcome was reported for it", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn fail_task(
    State(state): State<AppState>,
    Path(token): Path<String>,
    JsonBody(body): JsonBody,
) -> Result<Json<TaskAccepted>, ApiError> {
    let body: FailTask = serde_json::from_value(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be {{\"error\": \"…\", \"retryable\": true|false}}: {e}"
        ))
    })?;
    if body.error.chars().count() > 1000 {
        return Err(ApiError::bad_request("the error is over 1000 characters"));
    }
    let report_of = Report::Fail {
        error: body.error,
        retryable: body.retryable,
    };
    report(&state, &token, report_of).await
}

/// `POST /v1/tasks/{token}/heartbeat`.
#[utoipa::path(
    post,
    path = "/v1/tasks/{token}/heartbeat",
    tag = "tasks",
    operation_id = "heartbeat_task",
    summary = "Keep a step waiting for its participant's callback alive",
    description = "The participant still works on the call: the step's wait now ends a step's \
                   timeout from now (`timeout_at`) unless it reports first. Only the step's \
                   current attempt, before it reported. Needs the `start` scope.",
    params(("token" = String, Path, description = TOKEN_PARAM)),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The wait's deadline moved", body = TaskAccepted),
        Unauthorized,
        Forbidden,
        (status = 404, description = "No task has this token", body = ErrorBody),
        (status = 409, description = "The token's attempt is no longer current, or it reported already", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn heartbeat_task(
    State(state): State<AppState>,
    Path(token): Path<String>,
) -> Result<Json<TaskAccepted>, ApiError> {
    report(&state, &token, Report::Heartbeat).await
}
