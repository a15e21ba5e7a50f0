//! The bank's HTTP API: `POST /transfers`, `GET /transfers/{payout_id}` and `GET /ledger`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Notify;

use super::store::{BankStore, TransferRequest};
use super::{now_ms, BankError};

/// The longest idempotency key the bank accepts.
const MAX_KEY_LEN: usize = 255;

/// What the handlers share.
#[derive(Debug, Clone)]
pub(super) struct AppState {
    pub store: BankStore,
    pub settle_after_ms: i64,
    /// Wakes the worker when something new may be due.
    pub wake: Arc<Notify>,
}

/// The bank's routes over `state`.
pub(super) fn router(state: AppState) -> Router {
    Router::new()
        .route("/transfers", post(create_transfer))
        .route("/transfers/{payout_id}", get(show_transfers))
        .route("/ledger", get(show_ledger))
        .with_state(state)
}

/// An error answer: its status and `{"error": message}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<BankError> for ApiError {
    fn from(e: BankError) -> Self {
        match e {
            BankError::KeyReused(_) => Self(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            // The cause is logged; the client learns only that the bank failed.
            e => {
                tracing::error!(error = %e, "bank request failed");
                Self(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the bank failed; try again".to_owned(),
                )
            }
        }
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

/// `POST /transfers`: records the transfer under its key and answers `202`.
async fn create_transfer(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = match headers.get("idempotency-key").map(|v| v.to_str()) {
        None => return Err(bad_request("the Idempotency-Key header is required")),
        Some(Err(_)) => return Err(bad_request("the Idempotency-Key header is not text")),
        Some(Ok(key)) if key.trim().is_empty() || key.len() > MAX_KEY_LEN => {
            return Err(bad_request(format!(
                "the Idempotency-Key header must hold 1 to {MAX_KEY_LEN} characters"
            )))
        }
        Some(Ok(key)) => key.to_owned(),
    };
    let task_url = match headers.get("saga-task-url").map(|v| v.to_str()) {
        None => None,
        Some(Err(_)) => return Err(bad_request("the Saga-Task-Url header is not text")),
        Some(Ok(url)) => Some(task_url(url)?),
    };
    let request: TransferRequest = serde_json::from_slice(&body).map_err(|e| {
        bad_request(format!(
            "the body must be {{\"payout_id\": str, \"merchant\": str, \"amount\": int, \
             \"refuse\": bool}}: {e}"
        ))
    })?;
    if request.payout_id.is_empty() || request.merchant.is_empty() {
        return Err(bad_request(
            "the payout_id and the merchant must not be empty",
        ));
    }
    if request.amount < 0 {
        return Err(bad_request("the amount must not be negative"));
    }
    let now = now_ms();
    let accepted = state
        .store
        .accept(
            &key,
            task_url.as_deref(),
            &request,
            now,
            now + state.settle_after_ms,
        )
        .await?;
    if accepted.new_callback {
        state.wake.notify_one();
    }
    let transfer = accepted.transfer;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "transfer_id": transfer.transfer_id,
            "status": transfer.status,
        })),
    )
        .into_response())
}

/// Checks a `Saga-Task-Url`: an absolute `http` or `https` URL with neither query nor
/// fragment, since `/complete` and `/fail` are appended to it; returned without a trailing
/// slash.
fn task_url(url: &str) -> Result<String, ApiError> {
    match reqwest::Url::parse(url) {
        Ok(parsed)
            if matches!(parsed.scheme(), "http" | "https")
                && parsed.has_host()
                && parsed.query().is_none()
                && parsed.fragment().is_none() =>
        {
            Ok(url.trim_end_matches('/').to_owned())
        }
        // The URL itself is not echoed: it carries the task's token.
        _ => Err(bad_request(
            "the Saga-Task-Url header must be an absolute http or https URL without a query",
        )),
    }
}

/// `GET /transfers/{payout_id}`: every transfer held for the payout and what moved; `404` when
/// none.
async fn show_transfers(
    State(state): State<AppState>,
    Path(payout_id): Path<String>,
) -> Result<Response, ApiError> {
    let transfers = state.store.transfers_for(&payout_id).await?;
    if transfers.is_empty() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no transfer for payout {payout_id:?}"),
        ));
    }
    let transferred = state.store.transferred_for(&payout_id).await?;
    Ok(Json(json!({
        "payout_id": payout_id,
        "transferred": transferred,
        "transfers": transfers,
    }))
    .into_response())
}

/// `GET /ledger`: `{"<payout_id>": {"transferred": n}}`.
async fn show_ledger(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(state.store.ledger().await?).into_response())
}
