//! The HTTP API of the engine (specification §4): start sagas, read them, list them, read their
//! event history, request cancellation, and a health check.
//!
//! # Why it is shaped this way
//!
//! - **One router from one function.** [`router`] builds the whole API from an [`Engine`] and an
//!   [`HttpConfig`], so tests drive it over a real loopback socket (or in process with
//!   `tower::ServiceExt::oneshot`) and a binary only binds it and calls [`serve`].
//! - **One error shape, everywhere.** Clients script against `{"error": {"code", "message"}}`, so
//!   no answer may be axum's plain-text default: handlers and extractors return [`ApiError`], the
//!   unknown-route and wrong-method fallbacks do too, and a last middleware rewrites any non-JSON
//!   error that still slips through (a layer's `413`, for instance) into the same shape.
//! - **Database text never reaches a client.** A store failure becomes a generic `500 internal`
//!   (or `503 unavailable` with `Retry-After` when it is transient); the real cause is logged
//!   inside the request's tracing span, whose `request_id` is echoed in the `x-request-id`
//!   response header, so an operator can find it from a client's bug report.
//! - **Room to grow.** Per-request state is `AppState` (in `state.rs`), the cross-cutting
//!   concerns are layers in [`router`] (request id, timeout, tracing, body limit, error shape),
//!   and each endpoint is one function in `handlers.rs`. Idempotency keys, bearer-token auth,
//!   `/metrics`, `/openapi.json` and webhooks add a field to the state, a layer or a route here
//!   without touching the existing handlers.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(engine: orchestrator::Engine) -> std::io::Result<()> {
//! use orchestrator::http::{router, serve, HttpConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let shutdown = CancellationToken::new();
//! serve(listener, router(engine, HttpConfig::default()), shutdown).await
//! # }
//! ```

mod error;
mod extract;
mod handlers;
mod middleware;
mod state;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;

use crate::engine::Engine;
pub use error::ApiError;
use state::AppState;

/// Settings of the HTTP API. Build one with struct-update syntax so that fields added later keep
/// their defaults: `HttpConfig { body_limit: 64 * 1024, ..HttpConfig::default() }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The largest request body accepted, in bytes; a larger one is answered `413`
    /// (`payload_too_large`) before it is parsed. Default: 1 MiB, as the specification says.
    pub body_limit: usize,
    /// How long a request may take before it is answered `503` (`unavailable`, with
    /// `Retry-After`). Default: 30 seconds.
    pub request_timeout: Duration,
}

impl HttpConfig {
    /// The default body limit: 1 MiB.
    pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
    /// The default request timeout: 30 seconds.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            body_limit: Self::DEFAULT_BODY_LIMIT,
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

/// Builds the HTTP API over `engine`.
///
/// | route | handler |
/// |---|---|
/// | `POST /v1/sagas/{name}` | start a saga: `202` with `Location` |
/// | `GET /v1/sagas/{id}` | the saga with its steps |
/// | `GET /v1/sagas?status=&name=&needs_attention=&limit=&cursor=` | a page of sagas, newest first |
/// | `GET /v1/sagas/{id}/events` | the saga's event history |
/// | `POST /v1/sagas/{id}/cancel` | request cancellation: `202`, or `409` when too late |
/// | `GET /healthz` | `200` when the store answers, else `503` |
///
/// Every error, including an unknown route (`404`) and a wrong method (`405`), is JSON
/// `{"error": {"code": …, "message": …}}`, and every response carries an `x-request-id` header.
///
/// The router does not run the engine: call [`Engine::run`] next to it (a `202` only records
/// the saga; some process sharing the database must drive it).
pub fn router(engine: Engine, config: HttpConfig) -> Router {
    let config = Arc::new(config);
    let state = AppState {
        engine,
        config: config.clone(),
    };
    // `/v1/sagas/{saga}` is a definition name for POST and a saga id for GET: the router needs
    // one parameter name per path position, so the handlers decide how to read it.
    Router::new()
        .route("/healthz", get(handlers::healthz))
        .route("/v1/sagas", get(handlers::list_sagas))
        .route(
            "/v1/sagas/{saga}",
            get(handlers::get_saga).post(handlers::start_saga),
        )
        .route("/v1/sagas/{saga}/events", get(handlers::saga_events))
        .route("/v1/sagas/{saga}/cancel", post(handlers::cancel_saga))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(state)
        // Layers, innermost first. The body limit is enforced twice on purpose: tower-http
        // refuses a too-large `Content-Length` before any byte is read, axum's limit caps a
        // streamed (chunked) body while the extractor buffers it.
        .layer(DefaultBodyLimit::max(config.body_limit))
        .layer(RequestBodyLimitLayer::new(config.body_limit))
        .layer(axum::middleware::from_fn_with_state(
            config.clone(),
            middleware::json_errors,
        ))
        .layer(TraceLayer::new_for_http())
        .layer(axum::middleware::from_fn_with_state(
            config,
            middleware::request_context,
        ))
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops accepting
/// connections and waits for the requests in flight to finish (graceful shutdown).
///
/// Returns an error only when the listener fails.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "HTTP API listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await?;
    tracing::info!("HTTP API stopped");
    Ok(())
}
