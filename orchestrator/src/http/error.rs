//! [`ApiError`]: the one error every handler, extractor and middleware of the API answers with.
//!
//! Clients get `{"error": {"code": …, "message": …}}` with a stable, machine-readable `code`
//! and a message meant for a person. Messages of `4xx` errors explain what to fix; messages of
//! `5xx` errors are generic on purpose, because the cause may quote SQL, file paths or data: the
//! cause is kept inside the error and logged (in the request's span, so with its request id)
//! when the error becomes a response, and never serialised.

use std::fmt;

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::engine::StartError;
use crate::operations::OperationError;
use crate::store::StoreError;

type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error answer of the HTTP API: a status, a stable code and a message.
///
/// | status | code |
/// |---|---|
/// | 400 | `bad_request`: malformed JSON, id, path or query parameter |
/// | 400 | `ambiguous_id`: a saga id prefix that several sagas' ids start with |
/// | 404 | `not_found`: unknown saga, saga definition or route |
/// | 404 | `unknown_limit`: no limit of this name (`PUT /v1/limits/{name}`) |
/// | 405 | `method_not_allowed`, with `Allow` (`POST` alone on a saga's start route) |
/// | 400 | `idempotency_key_missing`: the server requires an `Idempotency-Key` |
/// | 409 | `conflict`: the saga's state forbids the operation (e.g. cancel after the pivot) |
/// | 409 | `request_in_progress`: a request with this idempotency key is still running |
/// | 422 | `idempotency_key_reused`: the idempotency key was used for a different request |
/// | 413 | `payload_too_large` |
/// | 415 | `unsupported_media_type` |
/// | 422 | `invalid_input`: well-formed JSON that does not fit the saga's input type |
/// | 422 | `unprocessable`: a command that does not fit what it names (a fork from a stage the definition does not have, an operator's output over the limit, a limit changed with a value of the other kind) |
/// | 422 | `callback_secret_without_url`: a `Saga-Callback-Secret` without a `Saga-Callback-Url` |
/// | 400 | `invalid_priority`: a `Saga-Priority` that is not one digit, 0 to 9 |
/// | 422 | `invalid_rate`: a rate limiter's rate that is not `N/s`, `N/m` or `N/h` |
/// | 500 | `internal` (generic message; the cause is logged) |
/// | 503 | `unavailable` (with `Retry-After`): the database is away, or the request timed out |
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    retry_after_secs: Option<u32>,
    /// Logged when the response is built, never sent.
    cause: Option<Cause>,
}

/// What a client learns about a `500`: nothing but where to look.
const INTERNAL_MESSAGE: &str =
    "internal server error; the x-request-id response header identifies it in the server log";

pub(crate) use crate::operations::quote;

impl ApiError {
    /// An error with the given status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after_secs: None,
            cause: None,
        }
    }

    /// `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// `400 ambiguous_id`: a saga id prefix that several sagas' ids start with.
    pub fn ambiguous_id(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "ambiguous_id", message)
    }

    /// `404 not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// `405 method_not_allowed`.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
        )
    }

    /// `409 conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// `413 payload_too_large`.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// `415 unsupported_media_type`.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
        )
    }

    /// `422 invalid_input`.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
    }

    /// `503 unavailable` with `Retry-After: 1`; `cause` is logged, not sent.
    pub fn unavailable(message: impl Into<String>, cause: Option<Cause>) -> Self {
        Self {
            retry_after_secs: Some(1),
            cause,
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }

    /// The same error, answered with `Retry-After: secs`.
    pub(crate) fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// `500 internal` with a generic message; `cause` is logged, not sent.
    pub fn internal(cause: impl Into<Cause>) -> Self {
        Self {
            cause: Some(cause.into()),
            ..Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                INTERNAL_MESSAGE,
            )
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable error code (`not_found`, `invalid_input`, …).
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message sent to the client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A generic error for a bare status (a layer's answer, or an unexpected rejection).
    pub(crate) fn from_status(status: StatusCode, body_limit: usize) -> Self {
        match status {
            StatusCode::BAD_REQUEST => Self::bad_request("malformed request"),
            StatusCode::NOT_FOUND => Self::not_found("no such resource"),
            StatusCode::METHOD_NOT_ALLOWED => {
                Self::method_not_allowed("method not allowed on this resource")
            }
            StatusCode::PAYLOAD_TOO_LARGE => Self::payload_too_large(body_limit),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                Self::unsupported_media_type("unsupported content type")
            }
            StatusCode::REQUEST_TIMEOUT => Self::new(
                status,
                "request_timeout",
                "the request was not received in time",
            ),
            s if s.is_server_error() => Self::new(s, "internal", INTERNAL_MESSAGE),
            s => Self::new(
                s,
                "bad_request",
                s.canonical_reason().unwrap_or("request refused"),
            ),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // Logged here, once, inside the request span (which carries the request id).
        let status = self.status.as_u16();
        match &self.cause {
            Some(cause) if self.status == StatusCode::SERVICE_UNAVAILABLE => {
                tracing::warn!(status, error = %cause, "request failed: service unavailable")
            }
            Some(cause) => tracing::error!(status, error = %cause, "request failed"),
            None if self.status.is_server_error() => {
                tracing::warn!(status, message = %self.message, "request failed")
            }
            None => {
                tracing::debug!(status, code = self.code, message = %self.message, "request refused")
            }
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: &self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => Self::not_found(format!("no saga with id {id}")),
            StoreError::UnknownStep { saga, step } => {
                Self::not_found(format!("saga {saga} has no step {}", quote(&step)))
            }
            StoreError::UnknownLimit(name) => Self::new(
                StatusCode::NOT_FOUND,
                "unknown_limit",
                format!(
                    "no limit named {}: GET /v1/limits lists the limits this server's \
                     definitions declare",
                    quote(&name)
                ),
            ),
            // The store writes these messages for people (e.g. "saga is not FAILED").
            StoreError::Conflict(message) => Self::conflict(message),
            StoreError::InvalidValue(message) => Self::bad_request(format!(
                "the request carries a value that cannot be stored (for example a NUL character): {message}"
            )),
            e if e.is_transient() => Self::unavailable(
                "the database is temporarily unavailable; retry shortly",
                Some(Box::new(e)),
            ),
            e => Self::internal(e),
        }
    }
}

impl From<OperationError> for ApiError {
    fn from(e: OperationError) -> Self {
        match e {
            OperationError::BadRequest(message) => Self::bad_request(message),
            OperationError::NotFound(message) => Self::not_found(message),
            OperationError::Conflict(message) => Self::conflict(message),
            OperationError::Invalid(message) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "unprocessable", message)
            }
            // A server runs every command with its definitions: this is a wiring bug.
            OperationError::NeedsServer(message) => Self::internal(message),
            OperationError::Start(e) => e.into(),
            OperationError::Store(e) => e.into(),
        }
    }
}

impl From<StartError> for ApiError {
    fn from(e: StartError) -> Self {
        match e {
            StartError::UnknownDefinition(name) => {
                Self::not_found(format!("no saga definition named {}", quote(&name)))
            }
            StartError::InvalidInput { name, message } => Self::invalid_input(format!(
                "the input does not fit saga {}: {message}",
                quote(&name)
            )),
            StartError::KeyInProgress { saga_id } => Self::new(
                StatusCode::CONFLICT,
                "request_in_progress",
                format!(
                    "a request with this Idempotency-Key (saga {saga_id}) is still in \
                     progress; retry shortly"
                ),
            )
            .with_retry_after(1),
            StartError::KeyReused { saga_id } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                format!(
                    "this Idempotency-Key was already used (saga {saga_id}) for a different \
                     request: another saga name, callback URL or body; use a new key for a new \
                     start"
                ),
            ),
            e @ StartError::StartInPast { .. } => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "start_in_past",
                format!("{e}; give an instant to come, or no Saga-Start-At to start now"),
            ),
            e @ StartError::InvalidPriority(_) => Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_priority",
                format!("{e}: send Saga-Priority as one digit"),
            ),
            StartError::Store(e) => e.into(),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            // The limit in force is not known here; the extractor that knows it maps this case
            // itself, so this is only a fallback.
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is larger than the limit",
            )
        } else if r.status().is_server_error() {
            Self::internal(r)
        } else {
            Self::bad_request(format!(
                "could not read the request body: {}",
                r.body_text()
            ))
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is larger than the limit",
            ),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::unsupported_media_type(
                "send the body as JSON with Content-Type: application/json",
            ),
            StatusCode::UNPROCESSABLE_ENTITY => Self::invalid_input(r.body_text()),
            s if s.is_server_error() => Self::internal(r),
            _ => Self::bad_request(r.body_text()),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        if r.status().is_server_error() {
            // A route whose parameters do not match its extractor: a bug, not the client's fault.
            Self::internal(r)
        } else {
            Self::bad_request(format!("malformed path: {}", r.body_text()))
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request(format!("malformed query string: {}", r.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_hide_their_cause() {
        let e = ApiError::internal("SELECT * FROM sagas: disk I/O error");
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.code(), "internal");
        assert!(!e.message().contains("SELECT"));
    }

    #[test]
    fn long_client_text_is_shortened() {
        let q = quote(&"x".repeat(10_000));
        assert!(q.len() < 100, "{q}");
    }

    #[test]
    fn store_not_found_is_404() {
        let e = ApiError::from(StoreError::NotFound(uuid::Uuid::nil()));
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
    }
}
