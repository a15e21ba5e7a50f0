//! One function per endpoint. Each reads its request through the extractors of
//! `extract.rs`, calls the engine or the store, and answers JSON or an [`ApiError`].
//!
//! Each handler's `#[utoipa::path]` attribute is its entry in the OpenAPI document; the router
//! registers the handler through that attribute (`utoipa_axum::routes!`), so the method and path
//! written there are the ones served.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::engine::{StartError, StartKey, StartOutcome, StartRequest, Started};
use crate::http::error::{quote, ApiError};
use crate::http::extract::{saga_id, JsonBody, ListQuery, SagaId, SagaName, SignalPath};
use crate::http::idempotency::{parse_key, StartHeaders, IDEMPOTENT_REPLAYED};
use crate::http::openapi::{
    ErrorBody, Forbidden, MalformedSagaId, SagaNotFound, ServerErrors, Unauthorized,
};
use crate::http::prefer::{applied_headers, Wait};
use crate::http::state::AppState;
use crate::model::{Attempt, Event, Saga, SagaDetail, SagaPage, SagaStatus};
use crate::operations::{self, Operations};
use crate::store::{Delivery, SavedResponse, SignalOutcome, SignalRequest};

/// The body of `GET /v1/sagas/{id}/events`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Events {
    /// The history, oldest first.
    events: Vec<Event>,
}

/// The body of `GET /v1/sagas/{id}/attempts`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Attempts {
    /// Every attempt of every action and compensation, by step, phase and attempt number.
    attempts: Vec<Attempt>,
}

/// The body of `GET /v1/sagas/{id}/deliveries`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Deliveries {
    /// One entry per (event, webhook target), by event id.
    deliveries: Vec<Delivery>,
}

/// How a cancel request was taken.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CancelResult {
    /// The step in flight finishes, then the saga compensates.
    Accepted,
    /// The saga was compensating already.
    AlreadyCompensating,
}

/// The body of `202` to `POST /v1/sagas/{id}/cancel`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Cancelled {
    /// The saga.
    id: Uuid,
    /// Its status as of the answer.
    status: SagaStatus,
    /// How the request was taken.
    cancel: CancelResult,
}

/// How a signal was taken.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SignalResult {
    /// Recorded now: the saga takes it at its signal step.
    Received,
    /// The same signal came before (a repeat, or a replay with the same `Idempotency-Key`).
    AlreadyReceived,
}

/// The body of `202` to `POST /v1/sagas/{id}/signals/{signal}`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SignalAccepted {
    /// The saga.
    id: Uuid,
    /// The signal's name.
    signal: String,
    /// The saga's status as of the answer.
    status: SagaStatus,
    /// How the signal was taken.
    outcome: SignalResult,
}

/// The body of `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok`.
    #[schema(example = "ok")]
    status: &'static str,
}

/// The OpenAPI description of `POST /v1/sagas/{saga}`.
const START_DESCRIPTION: &str = "Starts a saga of the latest registered version of the \
    definition `saga`, with the request body as its input. Answers `202 Accepted` with a \
    `Location` to poll once the saga is durably recorded. With `Prefer: wait=N` the server holds \
    the answer up to N seconds: `200` with the finished saga if it ended in time, else `202`.\n\n\
    **Idempotency-Key** (IETF httpapi draft): send a unique key per logical start and the same \
    key on every retry. A new key is recorded in the same transaction as the saga, and the \
    answer is saved against it. A retry of a finished request replays the saved status and \
    body with `Idempotent-Replayed: true` and starts nothing; a retry while the first request \
    is still running (it waits with `Prefer: wait`) is `409` with `Retry-After`; the same key \
    with a different request (another saga name, callback URL, or body other than in the \
    order of its object keys) is `422`. Keys are 1 to 255 visible ASCII characters, bare or \
    as an RFC 8941 string (`\"key\"`), scoped to the API client (the bearer token), and kept \
    for the server's retention period: **24 hours** by default \
    (`--idempotency-retention-secs`); after that the same key starts a new saga. Errors \
    (`4xx`) are not saved: a corrected retry with the same key is a new request. A server \
    started with `--require-idempotency-key` refuses starts without a key (`400`). If the \
    process answering a waiting request dies, its key is answered like a plain start (`202`) \
    once the longest possible wait plus the request timeout has passed.\n\n\
    **Saga-Callback-Url**: an `http(s)` URL that receives every event of this saga as a \
    signed webhook (see the API description); `Saga-Callback-Secret` signs them with a secret \
    of the client's choosing instead of the server's.";

/// The OpenAPI description of `GET /v1/sagas/{saga}`.
const GET_DESCRIPTION: &str = "The saga with its steps and its attempt log (the same object as \
    `saga show ID --json`). With `Prefer: wait=N`, a saga that has not ended is waited for up \
    to N seconds (a long poll); the answer is the saga as it is then.";

/// The OpenAPI description of `GET /v1/sagas`.
const LIST_DESCRIPTION: &str = "A page of sagas, newest first, with a cursor for the next page \
    (keyset pagination: pages stay stable while new sagas arrive). Also filtered by search \
    attributes: `attr.NAME=VALUE`, once per name, each equal (a name is a lower-case letter, \
    then lower-case letters, digits or `_`; a malformed one is `400`). A server's document \
    lists the attributes its definitions declare as parameters of their own.";

/// The OpenAPI description of `POST /v1/sagas/{saga}/cancel`.
const CANCEL_DESCRIPTION: &str = "Requests cancellation: the step in flight finishes, then the \
    saga compensates. Refused with `409` once the saga has ended or passed its point of no \
    return (its pivot step has started).";

/// Waits up to `wait` for the saga to end and returns it once it has; `None` when the time is
/// up, the server is shutting down (a long wait must not hold a graceful shutdown), or the wait
/// itself failed. A failure is logged, not answered: the saga exists, and a `5xx` would invite
/// a client to start it again.
async fn wait_for_end(state: &AppState, id: Uuid, wait: Duration) -> Option<Saga> {
    let ended = tokio::select! {
        ended = state.engine.wait_terminal(id, wait) => ended,
        _ = state.shutdown.cancelled() => return None,
    };
    match ended {
        Ok(Some(_)) => match state.engine.store().get_saga(id).await {
            Ok(saga) => saga.map(Saga::shown),
            Err(e) => {
                tracing::warn!(saga.id = %id, error = %e, "cannot read the saga after waiting");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(saga.id = %id, error = %e, "waiting for the saga to end failed");
            None
        }
    }
}

/// `POST /v1/sagas/{name}`: starts a saga of the latest registered version of `name` with the
/// body as its input, and answers `202 Accepted` with `Location: /v1/sagas/{id}` and
/// `{"id", "name", "status"}` once the saga is durably recorded: `RUNNING` when a worker of
/// this process took it at once (its first action written ahead in the same commit), else
/// `QUEUED`.
///
/// The checks run in the order a client would fix them: unknown definition `404` (whatever the
/// body), then the headers (`400` for a malformed `Idempotency-Key` or `Saga-Callback-Url`, or
/// a missing key when one is required), then the body (see `JsonBody`: a declared non-JSON
/// `Content-Type` is `415`, a missing one is accepted; `413` over the limit; `400` malformed
/// JSON), then `422 invalid_input` when the JSON does not fit the definition's input type. No
/// saga is created unless every check passes.
///
/// With an `Idempotency-Key` the four rules of SPEC §4 apply (see [`Engine::start`](crate::Engine::start)).
///
/// With `Prefer: wait=N` the answer is held up to N seconds (capped): `200` with the whole saga
/// if it ended in time, else the usual `202`; both say `Preference-Applied: wait=N`.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}",
    tag = "sagas",
    operation_id = "start_saga",
    summary = "Start a saga",
    description = START_DESCRIPTION,
    params(
        ("saga" = String, Path, description = "The saga definition name", example = "place_order"),
        ("Prefer" = Option<String>, Header,
         description = "`wait=N` (RFC 7240): hold the answer up to N seconds for the saga to end"),
        // The key's grammar (`idempotency::parse_key`): 1 to 255 visible ASCII characters,
        // or an RFC 8941 string of 1 to 255 printable ones (`\"` and `\\` escaped).
        ("Idempotency-Key" = Option<String>, Header,
         pattern = r#"^[ \t]*(?:[!#-~][!-~]{0,254}|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")[ \t]*$"#,
         description = "A unique key per logical start, reused on retries: 1 to 255 visible \
                        ASCII characters, bare or as an RFC 8941 string. Kept 24 hours by \
                        default (the server's `--idempotency-retention-secs`)"),
        // An http(s) URL whose host is a name (an address literal, internal or not, is
        // refused `422` all the same, so only names are declared), at most 2048 characters.
        ("Saga-Callback-Url" = Option<String>, Header, max_length = 2048,
         pattern = r#"^[Hh][Tt][Tt][Pp][Ss]?://(?:[A-Za-z0-9][A-Za-z0-9-]{0,62}\.)*[A-Za-z][A-Za-z0-9-]{0,62}(?::[0-9]{1,4})?(?:[/?#][!-~]*)?$"#,
         description = "An http(s) URL that receives this saga's events as signed webhooks. \
                        A host that is or resolves to a loopback, private, link-local or \
                        unspecified address is `422 callback_url_not_allowed` unless the \
                        server allows it (`--allow-callback-host`)"),
        ("Saga-Callback-Secret" = Option<String>, Header,
         pattern = r#"^[ \t]*[!-~]{1,255}[ \t]*$"#,
         description = "Signs this saga's webhooks instead of the server's secret: 1 to 255 \
                        visible ASCII characters. Needs a Saga-Callback-Url (else `422 \
                        callback_secret_without_url`)"),
        // The instants `idempotency::parse_start_at` reads, as a pattern rather than `format:
        // date-time`: client generators type a date-time header as a date object, which some
        // (openapi-python-client) refuse in a header, dropping every start route. Exact, so
        // that a matching value is never refused `400`: real days of the month (29 February
        // in leap years only), hours 00-23, a leap second `60`, any number of fraction
        // digits, offsets up to 23:59, `T` and `Z` in either case.
        ("Saga-Start-At" = Option<String>, Header,
         pattern = r"^[ \t]*(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])[ \t]*$",
         description = "An RFC 3339 instant such as `2026-12-24T18:00:00Z`: the saga is \
                        created `QUEUED` with `scheduled_at` and starts then (a cancel before \
                        that ends it `COMPENSATED` with nothing run). An instant in the past \
                        is `422 start_in_past`"),
        ("Saga-Priority" = Option<String>, Header, pattern = r"^[ \t]*[0-9][ \t]*$",
         description = "One digit, 0 (last) to 9 (first); 5 when left out. Among sagas due \
                        to start, higher priorities are claimed first, and within one \
                        priority the keys of a `per_key` limit take turns. Anything else is \
                        `400 invalid_priority`"),
        ("traceparent" = Option<String>, Header,
         description = "W3C Trace Context: the saga's trace joins this one, its saga span a \
                        child of this span (an invalid value is ignored)"),
    ),
    request_body(
        content = serde_json::Value,
        content_type = "application/json",
        description = "The saga input (any JSON the definition's input type accepts)"
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Ended within the `Prefer: wait` time", body = Saga,
         headers(
             ("Location" = String, description = "/v1/sagas/{id}"),
             ("Preference-Applied" = String, description = "wait=N, the wait applied"),
             ("Idempotent-Replayed" = String,
              description = "`true` when this is the saved answer to an earlier request with \
                             the same Idempotency-Key"),
         )),
        (status = 202, description = "Started: durably recorded, runs in the background",
         body = Started,
         headers(
             ("Location" = String, description = "/v1/sagas/{id}"),
             ("Preference-Applied" = String,
              description = "wait=N, when the request asked to wait"),
             ("Idempotent-Replayed" = String,
              description = "`true` when this is the saved answer to an earlier request with \
                             the same Idempotency-Key"),
         )),
        (status = 400, description = "Malformed JSON body, Idempotency-Key, \
                                      Saga-Callback-Url or Saga-Start-At, a required key \
                                      missing, or a Saga-Priority that is not one digit \
                                      (`invalid_priority`)",
         body = ErrorBody),
        Unauthorized,
        Forbidden,
        (status = 404, description = "No saga definition with this name", body = ErrorBody),
        (status = 409, description = "`request_in_progress`: a request with this \
                                      Idempotency-Key is still running; retry after \
                                      `Retry-After` seconds", body = ErrorBody,
         headers(("Retry-After" = String, description = "Seconds to wait before retrying"))),
        (status = 413, description = "Body over the limit (1 MiB by default)", body = ErrorBody),
        (status = 415, description = "A Content-Type other than JSON", body = ErrorBody),
        (status = 422, description = "`invalid_input`: JSON that does not fit the saga's input \
                                      type; `idempotency_key_reused`: the Idempotency-Key was \
                                      used for a different request; `start_in_past`: a \
                                      Saga-Start-At already past; \
                                      `callback_url_not_allowed`: a Saga-Callback-Url inside \
                                      the server's network, or whose host does not resolve; \
                                      `callback_secret_without_url`: a Saga-Callback-Secret \
                                      without a Saga-Callback-Url",
         body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn start_saga(
    State(state): State<AppState>,
    SagaName(name): SagaName,
    Wait(wait): Wait,
    start_headers: Result<StartHeaders, ApiError>,
    body: Result<JsonBody, ApiError>,
) -> Result<Response, ApiError> {
    // An unknown definition is `404` whatever the headers and body: checked first.
    if state.engine.registry().latest(&name).is_none() {
        return Err(StartError::UnknownDefinition(name).into());
    }
    let headers = start_headers?;
    let JsonBody(input) = body?;
    let mut request = StartRequest::new(name, integral_numbers_as_integers(input));
    if let Some(key) = headers.key {
        request = request.with_key(
            StartKey::new(headers.scope, key)
                .with_retention(state.config.idempotency_retention)
                .with_abandoned_after(state.config.abandoned_after()),
        );
    }
    if let Some(callback) = headers.callback {
        request = request.with_callback(callback);
    }
    if wait.is_some() {
        request = request.answered_later();
    }
    if let Some(at) = headers.start_at {
        request = request.at(at);
    }
    if let Some(trace) = headers.trace {
        request = request.in_trace(trace);
    }
    if let Some(priority) = headers.priority {
        request = request.with_priority(priority);
    }
    let (started, pending) = match state.engine.start(request).await? {
        StartOutcome::Created {
            started, pending, ..
        } => (started, pending),
        StartOutcome::Replayed { saga_id, response } => {
            let status = StatusCode::from_u16(response.status_code).unwrap_or(StatusCode::OK);
            return Ok(json_answer(status, location(saga_id), response.body, true));
        }
    };
    let location = location(started.id);
    let Some(wait) = wait else {
        return Ok(json_answer(
            StatusCode::ACCEPTED,
            location,
            started.to_json(),
            false,
        ));
    };
    let (status, body) = match pending {
        None => final_answer(&state, started, wait).await,
        // The wait and the saving of its answer run in their own task: a client that hangs
        // up does not leave its idempotency key in progress for good.
        Some(pending) => {
            let state = state.clone();
            let task = tokio::spawn(async move {
                let (status, body) = final_answer(&state, started, wait).await;
                let saved = SavedResponse {
                    status_code: status.as_u16(),
                    body,
                };
                if let Err(e) = pending.save(&saved).await {
                    tracing::warn!(error = %e, "cannot save the answer of an idempotent start; \
                                   its key will be answered 202 once abandoned");
                }
                (status, saved.body)
            });
            task.await.map_err(ApiError::internal)?
        }
    };
    let mut response = json_answer(status, location, body, false);
    response.headers_mut().extend(applied_headers(wait));
    Ok(response)
}

/// `value` with every number that has no fractional part (`4.0`, `1e3`) written as an integer.
/// JSON Schema counts such a number as an `integer`, so the input schemas accept it; serde's
/// integer types do not, so the input is stored as the integer it is. Only below 2^53 in
/// magnitude: past it a double no longer tells `4.0`-style integers from integer literals too
/// large for 64 bits, which the parser rounds to doubles (`-9223372036854775809` would become
/// `i64::MIN`) and which an integer field must refuse, as its schema's bounds say.
fn integral_numbers_as_integers(value: Value) -> Value {
    /// 2^53: every integer of smaller magnitude is exact as a double.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::Number(n) => match n.as_f64() {
            // `as` is exact here: the value is integral and well inside `i64`.
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < EXACT => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(integral_numbers_as_integers)
                .collect(),
        ),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k, integral_numbers_as_integers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// `Location: /v1/sagas/{id}`. A UUID is always a valid header value; and once the saga
/// exists, no error may be answered (a client would start it again).
fn location(id: Uuid) -> HeaderValue {
    HeaderValue::from_str(&format!("/v1/sagas/{id}"))
        .unwrap_or_else(|_| HeaderValue::from_static("/v1/sagas"))
}

/// Serialises an answer body once, so that the first answer and its replays are the same bytes.
fn to_body<T: Serialize>(value: &T) -> String {
    // Our own types always serialise; an empty object still is valid JSON should one not.
    serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned())
}

/// The answer to a start that asked to wait: `200` with the saga if it ended within `wait`,
/// else `202` with its status as of now.
async fn final_answer(state: &AppState, started: Started, wait: Duration) -> (StatusCode, String) {
    if let Some(done) = wait_for_end(state, started.id, wait).await {
        return (StatusCode::OK, to_body(&done));
    }
    // Not over yet: the status as of now (a worker has probably picked it up).
    let status = match state.engine.store().get_saga(started.id).await {
        Ok(Some(now)) => now.status,
        _ => started.status,
    };
    (
        StatusCode::ACCEPTED,
        to_body(&Started { status, ..started }),
    )
}

/// A JSON answer with `Location`, marked as a replay when it is one.
fn json_answer(
    status: StatusCode,
    location: HeaderValue,
    body: String,
    replayed: bool,
) -> Response {
    let mut response = (
        status,
        [
            (header::LOCATION, location),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        ],
        body,
    )
        .into_response();
    if replayed {
        response.headers_mut().insert(
            IDEMPOTENT_REPLAYED.clone(),
            HeaderValue::from_static("true"),
        );
    }
    response
}

/// `GET /v1/sagas/{id}`: the saga with its steps, the same object as `saga show ID --json`.
///
/// With `Prefer: wait=N` on a saga that has not ended, the answer is held up to N seconds
/// (capped) for it to end (a long poll); it is `200` with the saga as it is then, either way.
#[utoipa::path(
    get,
    path = "/v1/sagas/{saga}",
    tag = "sagas",
    operation_id = "get_saga",
    summary = "Read a saga",
    description = GET_DESCRIPTION,
    params(
        ("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$"),
        ("Prefer" = Option<String>, Header,
         description = "`wait=N` (RFC 7240): hold the answer up to N seconds for the saga to end"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The saga, with its attempt log", body = SagaDetail,
         headers(("Preference-Applied" = String,
                  description = "wait=N, when the request asked to wait"))),
        MalformedSagaId,
        Unauthorized,
        Forbidden,
        SagaNotFound,
        ServerErrors,
    )
)]
pub(crate) async fn get_saga(
    State(state): State<AppState>,
    SagaName(segment): SagaName,
    Wait(wait): Wait,
) -> Result<Response, ApiError> {
    // `/v1/sagas/<name>` of a registered definition is its start route, which the document
    // gives POST alone: it answers GET (and HEAD) as the start route it is, not as a
    // malformed saga id.
    if is_start_route(&state, &segment) {
        return Ok(start_route_only(Method::GET, &segment));
    }
    let id = saga_id(&state, &segment).await?;
    let saga = find_saga(&state, id).await?;
    let Some(wait) = wait else {
        return Ok(Json(with_attempts(&state, saga).await?).into_response());
    };
    let saga = if saga.status.is_terminal() {
        saga
    } else {
        match wait_for_end(&state, id, wait).await {
            Some(done) => done,
            None => find_saga(&state, id).await?,
        }
    };
    let detail = with_attempts(&state, saga).await?;
    Ok((applied_headers(wait), Json(detail)).into_response())
}

/// The saga with its attempt log, read after it: every attempt its steps count is there.
async fn with_attempts(state: &AppState, saga: Saga) -> Result<SagaDetail, ApiError> {
    let attempts = state.engine.store().attempts(saga.id).await?;
    Ok(SagaDetail { saga, attempts })
}

/// `rows`, the rows of saga `id`; when there are none, `404` unless the saga exists (the saga
/// is read only then, so a list with rows costs one read).
async fn of_known_saga<T>(state: &AppState, id: Uuid, rows: Vec<T>) -> Result<Vec<T>, ApiError> {
    if rows.is_empty() {
        find_saga(state, id).await?;
    }
    Ok(rows)
}

/// Saga `id` as clients are shown it ([`Saga::shown`]), or `404`.
async fn find_saga(state: &AppState, id: Uuid) -> Result<Saga, ApiError> {
    state
        .engine
        .store()
        .get_saga(id)
        .await?
        .map(Saga::shown)
        .ok_or_else(|| ApiError::not_found(format!("no saga with id {id}")))
}

/// `GET /v1/sagas?status=&name=&needs_attention=&blocked=&created_after=&created_before=&id_prefix=&attr.NAME=&limit=&cursor=`: a page of sagas, newest
/// first, `{"sagas": [...], "next_cursor": id or null}`. `limit` defaults to 50, at most 1000.
#[utoipa::path(
    get,
    path = "/v1/sagas",
    tag = "sagas",
    operation_id = "list_sagas",
    summary = "List sagas",
    description = LIST_DESCRIPTION,
    // The exact schemas of these parameters (an empty value, any case) are set by
    // `openapi::exact_list_query`.
    params(
        ("status" = Option<SagaStatus>, Query,
         description = "Only sagas in this status (any case; empty: any status)"),
        ("name" = Option<String>, Query,
         description = "Only sagas of this definition name (empty: any name)"),
        ("needs_attention" = Option<bool>, Query,
         description = "Only sagas flagged as needing a person (`true` or `1`; `false`, `0` \
                        or empty: all)"),
        ("blocked" = Option<bool>, Query,
         description = "Only unfinished sagas whose definition no running process has (`true` \
                        or `1`; `false`, `0` or empty: all)"),
        ("created_after" = Option<String>, Query,
         description = "Only sagas created at or after this RFC 3339 time (empty: no bound)"),
        ("created_before" = Option<String>, Query,
         description = "Only sagas created before this RFC 3339 time (empty: no bound)"),
        ("id_prefix" = Option<String>, Query,
         description = "Only sagas whose id starts with these 8 to 32 hexadecimal digits \
                        (dashes and surrounding white space ignored; empty: any id)"),
        ("limit" = Option<u32>, Query,
         description = "Page size, 1 to 1000 (default 50, also when empty)"),
        ("cursor" = Option<Uuid>, Query,
         description = "The `next_cursor` of the previous page (empty: the first page)"),
    ),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "A page of sagas", body = SagaPage),
        (status = 400, description = "Malformed or unknown query parameter", body = ErrorBody),
        Unauthorized,
        Forbidden,
        ServerErrors,
    )
)]
pub(crate) async fn list_sagas(
    State(state): State<AppState>,
    ListQuery(filter): ListQuery,
) -> Result<Json<SagaPage>, ApiError> {
    Ok(Json(state.engine.store().list_sagas(&filter).await?))
}

/// `GET /v1/sagas/{id}/events`: the saga's event history, oldest first; `404` for an unknown
/// saga (rather than an empty list, which would hide a typo in the id).
#[utoipa::path(
    get,
    path = "/v1/sagas/{saga}/events",
    tag = "sagas",
    operation_id = "saga_events",
    summary = "Read a saga's event history",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The events, oldest first", body = Events),
        MalformedSagaId,
        Unauthorized,
        Forbidden,
        SagaNotFound,
        ServerErrors,
    )
)]
pub(crate) async fn saga_events(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Json<Events>, ApiError> {
    let events = state.engine.store().events(id).await?;
    // Every saga has at least its `saga.started` event: only a typo gets here empty.
    let events = of_known_saga(&state, id, events).await?;
    Ok(Json(Events { events }))
}

/// `GET /v1/sagas/{id}/attempts`: the attempt log of the saga, each call with its worker,
/// times, outcome and error; `404` for an unknown saga.
#[utoipa::path(
    get,
    path = "/v1/sagas/{saga}/attempts",
    tag = "sagas",
    operation_id = "saga_attempts",
    summary = "Read a saga's attempt log",
    description = "Every attempt of every action and compensation: the worker that made it, \
        the lease epoch it held, when it started and ended, and its outcome (`succeeded`, \
        `failed`, `retryable`, `timed_out`, `interrupted`, `abandoned`, or none while it \
        runs) with its error.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The attempts, by step, phase and number", body = Attempts),
        MalformedSagaId,
        Unauthorized,
        Forbidden,
        SagaNotFound,
        ServerErrors,
    )
)]
pub(crate) async fn saga_attempts(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Json<Attempts>, ApiError> {
    let attempts = state.engine.store().attempts(id).await?;
    let attempts = of_known_saga(&state, id, attempts).await?;
    Ok(Json(Attempts { attempts }))
}

/// `GET /v1/sagas/{id}/deliveries`: the saga's webhook deliveries (one per event and target),
/// with their state, attempts and last error; `404` for an unknown saga.
#[utoipa::path(
    get,
    path = "/v1/sagas/{saga}/deliveries",
    tag = "sagas",
    operation_id = "saga_deliveries",
    summary = "Read a saga's webhook deliveries",
    description = "Each event of the saga, for each webhook target (the saga's callback URL, \
        the server's subscribers): `pending`, `delivered` or `failed` (given up), with the \
        attempts made, the next attempt's time and the receiver's last answer. Empty when no \
        webhook is configured for the saga.",
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "The deliveries, by event", body = Deliveries),
        MalformedSagaId,
        Unauthorized,
        Forbidden,
        SagaNotFound,
        ServerErrors,
    )
)]
pub(crate) async fn saga_deliveries(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Json<Deliveries>, ApiError> {
    let deliveries = state.engine.store().deliveries(id).await?;
    let deliveries = of_known_saga(&state, id, deliveries).await?;
    Ok(Json(Deliveries { deliveries }))
}

/// `POST /v1/sagas/{id}/cancel`: requests cancellation. `202` with
/// `{"id", "status", "cancel": "accepted" | "already_compensating"}` when the saga will
/// compensate; `409 conflict` when it is terminal or past its point of no return.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/cancel",
    tag = "sagas",
    operation_id = "cancel_saga",
    summary = "Cancel a saga",
    description = CANCEL_DESCRIPTION,
    params(("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$")),
    security((), ("bearer" = [])),
    responses(
        (status = 202, description = "Accepted: the saga will compensate", body = Cancelled),
        MalformedSagaId,
        Unauthorized,
        Forbidden,
        SagaNotFound,
        (status = 409, description = "The saga has ended or passed its pivot", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn cancel_saga(
    State(state): State<AppState>,
    SagaId(id): SagaId,
) -> Result<Response, ApiError> {
    let cancel = match Operations::of(&state.engine).cancel(id).await? {
        operations::Cancelled::Accepted => CancelResult::Accepted,
        operations::Cancelled::AlreadyCompensating => CancelResult::AlreadyCompensating,
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

const SIGNAL_DESCRIPTION: &str = "Delivers the signal `signal` with a JSON payload (the \
request body) to a saga whose definition waits for it. The payload becomes the output of the \
saga's signal step. A signal sent before the saga reaches its wait is kept and taken when it \
does. The first signal of a name wins: the same payload again is `202` with `outcome` \
`already_received`, another payload is `409 signal_already_received`. With an \
`Idempotency-Key`, a retry replays `202` (and `Idempotent-Replayed: true`); the same key with \
another payload is `422 idempotency_key_reused`. A saga that has ended or is compensating \
takes no signal (`409 conflict`).";

/// `POST /v1/sagas/{id}/signals/{signal}`: delivers a signal. `202` with
/// `{"id", "signal", "status", "outcome": "received" | "already_received"}`.
#[utoipa::path(
    post,
    path = "/v1/sagas/{saga}/signals/{signal}",
    tag = "sagas",
    operation_id = "signal_saga",
    summary = "Send a signal to a saga",
    description = SIGNAL_DESCRIPTION,
    params(
        ("saga" = String, Path,
         description = "The saga id, or a unique prefix of it: its first 8 or more characters",
         pattern = "^[0-9a-fA-F]{8}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-([0-9a-fA-F]{0,3}|[0-9a-fA-F]{4}(-[0-9a-fA-F]{0,12})?))?))?))?$"),
        ("signal" = String, Path, description = "The signal's name, as the definition's signal step names it"),
        ("Idempotency-Key" = Option<String>, Header,
         pattern = r#"^[ \t]*(?:[!#-~][!-~]{0,254}|"(?:[ !#-\[\]-~]|\\["\\]){1,255}")[ \t]*$"#,
         description = "Makes retries of this request safe: a repeat replays 202. 1 to 255 \
                        visible ASCII characters, bare or as an RFC 8941 string"),
    ),
    request_body(content = serde_json::Value, description = "The payload: any JSON", content_type = "application/json"),
    security((), ("bearer" = [])),
    responses(
        (status = 202, description = "Taken: the saga goes on with it at its signal step", body = SignalAccepted),
        (status = 400, description = "Malformed saga id, body or Idempotency-Key, or a saga id prefix of several sagas (`ambiguous_id`)", body = ErrorBody),
        Unauthorized,
        Forbidden,
        (status = 404, description = "No saga with this id (or prefix), or its definition waits for no such signal", body = ErrorBody),
        (status = 409, description = "`signal_already_received`: another payload came first; `conflict`: the saga has ended or is compensating", body = ErrorBody),
        (status = 413, description = "Payload too large", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the key came before with another payload", body = ErrorBody),
        ServerErrors,
    )
)]
pub(crate) async fn signal_saga(
    State(state): State<AppState>,
    SignalPath { saga: id, signal }: SignalPath,
    headers: axum::http::HeaderMap,
    JsonBody(payload): JsonBody,
) -> Result<Response, ApiError> {
    let key = parse_key(&headers).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let request = SignalRequest {
        saga: id,
        name: &signal,
        payload: &payload,
        key: key.as_deref(),
    };
    let outcome = match Operations::of(&state.engine).signal(request).await? {
        SignalOutcome::Received => SignalResult::Received,
        SignalOutcome::AlreadyReceived => SignalResult::AlreadyReceived,
        SignalOutcome::Conflict => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "signal_already_received",
                format!(
                    "saga {id} already received signal {} with another payload; the first \
                     one wins",
                    quote(&signal)
                ),
            ))
        }
        SignalOutcome::KeyReused => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                format!(
                    "this Idempotency-Key came before with another payload for signal {} of \
                     saga {id}",
                    quote(&signal)
                ),
            ))
        }
        SignalOutcome::Refused(status) => {
            return Err(ApiError::conflict(format!(
                "saga {id} is {status}: it takes no signal any more"
            )))
        }
    };
    let replayed = key.is_some() && matches!(outcome, SignalResult::AlreadyReceived);
    let status = state
        .engine
        .store()
        .saga_status(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no saga with id {id}")))?;
    let body = SignalAccepted {
        id,
        signal,
        status,
        outcome,
    };
    let mut response = (StatusCode::ACCEPTED, Json(body)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert(&IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// `GET /healthz`: `200 {"status": "ok"}` when the store answers a trivial query, else
/// `503 unavailable`. Cheap enough for a load balancer to call every second.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "healthz",
    summary = "Health check",
    description = "`200` when the database answers. Never needs a token.",
    responses(
        (status = 200, description = "Healthy", body = Health),
        (status = 503, description = "The database does not answer", body = ErrorBody),
    )
)]
pub(crate) async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    match state.engine.store().now().await {
        Ok(_) => Ok(Json(Health { status: "ok" })),
        Err(e) => Err(ApiError::unavailable(
            "the database does not answer",
            Some(Box::new(e)),
        )),
    }
}

/// `GET /openapi.json`: this API's OpenAPI document (generated from the code at start).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    summary = "This document",
    description = "The OpenAPI 3.1 document of the API. Never needs a token.",
    responses(
        (status = 200, description = "The OpenAPI document", content_type = "application/json",
         body = Object),
    )
)]
pub(crate) async fn openapi(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        state.openapi.clone(),
    )
        .into_response()
}

/// The fallback for paths no route matches: `404 not_found` in the API's error shape, except
/// the server's bare address, which a person opens in a browser to find the console: `GET /`
/// is redirected to `/ui/`. A fallback rather than a route, so that an application that
/// mounts the API beside a `/` of its own keeps it.
pub(crate) async fn not_found(method: Method, uri: Uri) -> Response {
    if uri.path() == "/" && (method == Method::GET || method == Method::HEAD) {
        return axum::response::Redirect::temporary("/ui/").into_response();
    }
    ApiError::not_found(format!("no route for {method} {}", quote(uri.path()))).into_response()
}

/// The fallback for a known path with a method it does not serve: `405` in the API's error
/// shape. axum adds the `Allow` header of the route, except on a registered definition's start
/// route, whose only method is POST although the router serves it through `/v1/sagas/{saga}`.
pub(crate) async fn method_not_allowed(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
) -> Response {
    if let Some(name) = uri.path().strip_prefix("/v1/sagas/") {
        if is_start_route(&state, name) {
            return start_route_only(method, name);
        }
    }
    ApiError::method_not_allowed(format!(
        "method {method} is not allowed on {}",
        quote(uri.path())
    ))
    .into_response()
}

/// Whether `/v1/sagas/<segment>` is the start route of a registered definition.
fn is_start_route(state: &AppState, segment: &str) -> bool {
    state.engine.registry().latest(segment).is_some()
}

/// `405` with `Allow: POST` for `method` on the start route of definition `name`.
fn start_route_only(method: Method, name: &str) -> Response {
    let mut response = ApiError::method_not_allowed(format!(
        "method {method} is not allowed on {}: it starts a {name} saga, with POST; read a \
         saga with GET /v1/sagas/<id>",
        quote(&format!("/v1/sagas/{name}"))
    ))
    .into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}
