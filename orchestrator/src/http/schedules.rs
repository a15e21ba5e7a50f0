//! Schedules over HTTP (SPEC §17): `POST /v1/schedules` makes one, `GET /v1/schedules` lists
//! them with their next ticks and latest run, `GET|DELETE /v1/schedules/{id}` reads one with
//! its history or deletes it, and `POST /v1/schedules/{id}/pause|resume|trigger` act on it.
//! Reading needs `read`; every change needs `operate` (see [`crate::http::auth`]).

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::auth::ClientId;
use crate::http::error::{quote, ApiError};
use crate::http::extract::JsonBody;
use crate::http::openapi::{ErrorBody, Forbidden, ForbiddenOperate, ServerErrors, Unauthorized};
use crate::http::state::AppState;
use crate::model::{ScheduleDetail, ScheduleRun};
use crate::schedules::{self, NewSchedule, ScheduleError};

/// The body of `GET /v1/schedules`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Schedules {
    /// Every schedule, by id, each with its next ticks and its latest run.
    schedules: Vec<ScheduleDetail>,
}

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> Self {
        let unprocessable = |e: &ScheduleError| {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.code(), e.to_string())
        };
        match e {
            ScheduleError::BadRequest(message) => ApiError::bad_request(message),
            ScheduleError::UnknownSaga(ref name) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                e.code(),
                format!(
                    "no saga definition named {} is registered on this server \
                     (GET /v1/definitions lists them)",
                    quote(name)
                ),
            ),
            ScheduleError::InvalidSchedule(_)
            | ScheduleError::InvalidDuration(_)
            | ScheduleError::InvalidCron(_)
            | ScheduleError::InvalidTimezone(_)
            | ScheduleError::InvalidInterval(_)
            | ScheduleError::InvalidInput { .. } => unprocessable(&e),
            ScheduleError::Exists(_) => {
                ApiError::new(StatusCode::CONFLICT, e.code(), e.to_string())
            }
            ScheduleError::NotFound(ref id) => ApiError::new(
                StatusCode::NOT_FOUND,
                e.code(),
                format!("no schedule with id {}", quote(id)),
            ),
            ScheduleError::Start(e) => e.into(),
            ScheduleError::Store(e) => e.into(),
        }
    }
}

/// `POST /v1/schedules`.
#[utoipa::path(
    post,
    path = "/v1/schedules",
    tag = "schedules",
    operation_id = "create_schedule",
    summary = "Make a schedule",
    description = "Starts the saga `saga` with `input` on a cron expression (`cron`, 5 fields \
                   or 6 with seconds first, read in the IANA `timezone`, `UTC` by default) or \
                   at a fixed interval (`every`, at least `1s`, counted from the Unix epoch): \
                   exactly one of the two. Each tick's saga has an id derived from the \
                   schedule and the tick's instant, so a tick starts one saga across processes \
                   and restarts. `overlap` says what a tick does while the previous run has not \
                   ended (`skip`, the default; `buffer_one`; `allow_all`; `cancel_other`); \
                   ticks missed while every process was down run if they are within \
                   `catchup_window` (`1m` by default, from `15s` to `7d`), and are recorded as \
                   missed otherwise. \
                   Every field is checked (the saga exists, the input fits it) before anything \
                   is written. Needs the `operate` scope.",
    request_body(content = NewSchedule, content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Made; `Location` names it", body = ScheduleDetail,
         headers(("Location" = String, description = "`/v1/schedules/{id}`"))),
        (status = 400, description = "Malformed JSON or body: a missing or unknown field, a \
                                      value of the wrong type, a bad id", body = ErrorBody),
        Unauthorized,
        ForbiddenOperate,
        (status = 409, description = "`conflict`: a schedule has this id", body = ErrorBody),
        (status = 422, description = "`invalid_schedule` (both or neither of `cron` and \
                                      `every`), `invalid_duration` (`every` or \
                                      `catchup_window` does not parse, or the window is \
                                      below 15 s or above 7 days), `unknown_saga`, \
                                      `invalid_cron`, `invalid_timezone`, `invalid_interval` \
                                      (below 1 s) or `invalid_input` (the input does not fit \
                                      the saga)", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn create_schedule(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    JsonBody(body): JsonBody,
) -> Result<impl IntoResponse, ApiError> {
    let new: NewSchedule = serde_json::from_value(body).map_err(|e| {
        ApiError::bad_request(format!(
            "{e}; the body must be {{\"id\", \"saga\", \"cron\" or \"every\", \"timezone\"?, \
             \"input\"?, \"overlap\"?, \"catchup_window\"?, \"paused\"?}}"
        ))
    })?;
    let made = schedules::create(&state.engine, new).await?;
    tracing::info!(schedule = %made.id, actor = actor.as_str(), "schedule made");
    let now = state.engine.clock().now_ms();
    let location = format!("/v1/schedules/{}", made.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(schedules::detail(made, Vec::new(), now)),
    ))
}

/// `GET /v1/schedules`.
#[utoipa::path(
    get,
    path = "/v1/schedules",
    tag = "schedules",
    operation_id = "list_schedules",
    summary = "List the schedules",
    description = "Every schedule by id, with its next ticks and its latest run.",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The schedules", body = Schedules),
        Unauthorized,
        Forbidden,
        ServerErrors,
    )
)]
pub(crate) async fn list_schedules(
    State(state): State<AppState>,
) -> Result<Json<Schedules>, ApiError> {
    let now = state.engine.clock().now_ms();
    let schedules = schedules::list(state.engine.store().as_ref(), now).await?;
    Ok(Json(Schedules { schedules }))
}

/// `GET /v1/schedules/{id}`.
#[utoipa::path(
    get,
    path = "/v1/schedules/{id}",
    tag = "schedules",
    operation_id = "get_schedule",
    summary = "Read a schedule",
    description = "The schedule with its next ticks and its history: its latest 100 runs, \
                   latest first, each with what happened to the tick (`started`, `skipped`, \
                   `buffered`, `cancelled_other`, `missed`, `failed`) and its saga.",
    params(("id" = String, Path, description = "The schedule's id", example = "nightly-settlement")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The schedule", body = ScheduleDetail),
        Unauthorized,
        Forbidden,
        (status = 404, description = "`unknown_schedule`: no schedule has this id", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn get_schedule(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleDetail>, ApiError> {
    let now = state.engine.clock().now_ms();
    Ok(Json(
        schedules::show(state.engine.store().as_ref(), &id, now).await?,
    ))
}

/// `DELETE /v1/schedules/{id}`.
#[utoipa::path(
    delete,
    path = "/v1/schedules/{id}",
    tag = "schedules",
    operation_id = "delete_schedule",
    summary = "Delete a schedule",
    description = "Deletes the schedule and its history; the sagas it started keep running. \
                   Needs the `operate` scope.",
    params(("id" = String, Path, description = "The schedule's id", example = "nightly-settlement")),
    security((), ("bearer" = [])),
    responses(
        (status = 204, description = "Deleted"),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "`unknown_schedule`: no schedule has this id", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn delete_schedule(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    schedules::delete(state.engine.store().as_ref(), &id).await?;
    tracing::info!(schedule = %id, actor = actor.as_str(), "schedule deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/schedules/{id}/pause`.
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/pause",
    tag = "schedules",
    operation_id = "pause_schedule",
    summary = "Pause a schedule",
    description = "No tick fires until it is resumed; sagas already started keep running. \
                   Needs the `operate` scope.",
    params(("id" = String, Path, description = "The schedule's id", example = "nightly-settlement")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Paused: the schedule as it now stands", body = ScheduleDetail),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "`unknown_schedule`: no schedule has this id", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn pause_schedule(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleDetail>, ApiError> {
    let now = state.engine.clock().now_ms();
    let s = schedules::pause(state.engine.store().as_ref(), &id, now).await?;
    tracing::info!(schedule = %id, actor = actor.as_str(), "schedule paused");
    Ok(Json(schedules::detail(s, Vec::new(), now)))
}

/// `POST /v1/schedules/{id}/resume`.
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/resume",
    tag = "schedules",
    operation_id = "resume_schedule",
    summary = "Resume a schedule",
    description = "Its next tick is the first after now: the ticks while it was paused are \
                   not caught up. Needs the `operate` scope.",
    params(("id" = String, Path, description = "The schedule's id", example = "nightly-settlement")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Resumed: the schedule as it now stands", body = ScheduleDetail),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "`unknown_schedule`: no schedule has this id", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn resume_schedule(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleDetail>, ApiError> {
    let now = state.engine.clock().now_ms();
    let s = schedules::resume(state.engine.store().as_ref(), &id, now).await?;
    tracing::info!(schedule = %id, actor = actor.as_str(), "schedule resumed");
    Ok(Json(schedules::detail(s, Vec::new(), now)))
}

/// `POST /v1/schedules/{id}/trigger`.
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/trigger",
    tag = "schedules",
    operation_id = "trigger_schedule",
    summary = "Fire a schedule now",
    description = "Fires a tick at this instant, under the schedule's overlap policy, even \
                   while it is paused; its next tick does not move. The answer is the tick's \
                   run, recorded in the schedule's history with `triggered: true`. Needs the \
                   `operate` scope.",
    params(("id" = String, Path, description = "The schedule's id", example = "nightly-settlement")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Fired: what happened to the tick", body = ScheduleRun),
        Unauthorized,
        ForbiddenOperate,
        (status = 404, description = "`unknown_schedule`: no schedule has this id", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn trigger_schedule(
    State(state): State<AppState>,
    Extension(actor): Extension<ClientId>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleRun>, ApiError> {
    let run = schedules::trigger(&state.engine, &id).await?;
    tracing::info!(schedule = %id, actor = actor.as_str(), outcome = run.outcome.as_str(), "schedule triggered");
    Ok(Json(run))
}
