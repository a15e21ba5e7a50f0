//! One function per endpoint. Each reads its request through the extractors of
//! `extract.rs`, calls the engine or the store, and answers JSON or an [`ApiError`].

use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use uuid::Uuid;

use crate::http::error::{quote, ApiError};
use crate::http::extract::{JsonBody, ListQuery, SagaId, SagaName};
use crate::http::state::AppState;
use crate::model::{Event, Saga, SagaPage, SagaStatus};
use crate::store::CancelOutcome;

/// The body of `202` to `POST /v1/sagas/{name}`.
#[derive(Debug, Serialize)]
pub(crate) struct Started {
    id: Uuid,
    name: String,
    status: SagaStatus,
}

/// The body of `GET /v1/sagas/{id}/events`.
#[derive(Debug, Serialize)]
pub(crate) struct Events {
    events: Vec<Event>,
}

/// How a cancel request was taken.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CancelResult {
    /// The step in flight finishes, then the saga compensates.
    Accepted,
    /// The saga was compensating already.
    AlreadyCompensating,
}

/// The body of `202` to `POST /v1/sagas/{id}/cancel`.
#[derive(Debug, Serialize)]
pub(crate) struct Cancelled {
    id: Uuid,
    status: SagaStatus,
    cancel: CancelResult,
}

/// The body of `GET /healthz`.
#[derive(Debug, Serialize)]
pub(crate) struct Health {
    status: &'static str,
}

/// `POST /v1/sagas/{name}`: starts a saga of the latest registered version of `name` with the
/// body as its input, and answers `202 Accepted` with `Location: /v1/sagas/{id}` and
/// `{"id", "name", "status": "QUEUED"}` once the saga is durably recorded.
///
/// The checks run in the order a client would fix them: unknown definition `404` (whatever the
/// body), then the body (see `JsonBody`: a declared non-JSON `Content-Type` is `415`, a missing
/// one is accepted; `413` over the limit; `400` malformed JSON), then `422 invalid_input` when
/// the JSON does not fit the definition's input type. No saga is created unless every check
/// passes.
pub(crate) async fn start_saga(
    State(state): State<AppState>,
    SagaName(name): SagaName,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    if state.engine.registry().latest(&name).is_none() {
        return Err(ApiError::not_found(format!(
            "no saga definition named {}",
            quote(&name)
        )));
    }
    let JsonBody(input) = body?;
    let saga = state.engine.start(&name, input).await?;
    let location = format!("/v1/sagas/{}", saga.id);
    let body = Started {
        id: saga.id,
        name: saga.name,
        status: saga.status,
    };
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response())
}

/// `GET /v1/sagas/{id}`: the saga with its steps, the same object as `saga show ID --json`.
pub(crate) async fn get_saga(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Json<Saga>, ApiError> {
    find_saga(&state, id).await.map(Json)
}

async fn find_saga(state: &AppState, id: Uuid) -> Result<Saga, ApiError> {
    state
        .engine
        .store()
        .get_saga(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no saga with id {id}")))
}

/// `GET /v1/sagas?status=&name=&needs_attention=&limit=&cursor=`: a page of sagas, newest
/// first, `{"sagas": [...], "next_cursor": id or null}`. `limit` defaults to 50, at most 1000.
pub(crate) async fn list_sagas(
    State(state): State<AppState>,
    ListQuery(filter): ListQuery,
) -> Result<Json<SagaPage>, ApiError> {
    Ok(Json(state.engine.store().list_sagas(&filter).await?))
}

/// `GET /v1/sagas/{id}/events`: the saga's event history, oldest first; `404` for an unknown
/// saga (rather than an empty list, which would hide a typo in the id).
pub(crate) async fn saga_events(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Json<Events>, ApiError> {
    let events = state.engine.store().events(id).await?;
    // Every saga has at least its `saga.started` event, so only an empty history needs the
    // extra read that tells "unknown saga" apart.
    if events.is_empty() {
        find_saga(&state, id).await?;
    }
    Ok(Json(Events { events }))
}

/// `POST /v1/sagas/{id}/cancel`: requests cancellation. `202` with
/// `{"id", "status", "cancel": "accepted" | "already_compensating"}` when the saga will
/// compensate; `409 conflict` when it is terminal or past its point of no return.
pub(crate) async fn cancel_saga(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Response, ApiError> {
    let cancel = match state.engine.store().request_cancel(id).await? {
        CancelOutcome::Accepted => CancelResult::Accepted,
        CancelOutcome::AlreadyCompensating => CancelResult::AlreadyCompensating,
        CancelOutcome::Terminal(status) => {
            return Err(ApiError::conflict(format!(
                "saga {id} is {status}: a finished saga cannot be cancelled"
            )))
        }
        CancelOutcome::PastPivot => {
            return Err(ApiError::conflict(format!(
                "saga {id} has passed its point of no return (its pivot step has started): it \
                 can no longer be cancelled and runs forward to the end"
            )))
        }
    };
    // The status as of now (the engine may already have started compensating).
    let saga = find_saga(&state, id).await?;
    let body = Cancelled {
        id,
        status: saga.status,
        cancel,
    };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// `GET /healthz`: `200 {"status": "ok"}` when the store answers a trivial query, else
/// `503 unavailable`. Cheap enough for a load balancer to call every second.
pub(crate) async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    match state.engine.store().now().await {
        Ok(_) => Ok(Json(Health { status: "ok" })),
        Err(e) => Err(ApiError::unavailable(
            "the database does not answer",
            Some(Box::new(e)),
        )),
    }
}

/// The fallback for paths no route matches: `404 not_found` in the API's error shape.
pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", quote(uri.path())))
}

/// The fallback for a known path with a method it does not serve: `405` in the API's error
/// shape (axum still adds the `Allow` header).
pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(format!(
        "method {method} is not allowed on {}",
        quote(uri.path())
    ))
}
