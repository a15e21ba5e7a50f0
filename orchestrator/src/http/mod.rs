//! The HTTP API of the engine (specification §4): start sagas, read them, list them, read their
//! event history, request cancellation, a health check, Prometheus metrics and the OpenAPI
//! document.
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
//! - **Documented from the code.** Each handler carries its `#[utoipa::path]` entry and is
//!   registered through it (`utoipa_axum::routes!`), so the router and [`openapi()`] come from
//!   the same list and cannot drift apart; `GET /openapi.json` serves the document.
//! - **Optional bearer auth, with scopes.** With [`HttpConfig::api_token`] or
//!   [`HttpConfig::api_tokens`] set, `/v1` and `/metrics` need a known token (compared in
//!   constant time; `401` otherwise) with the route's [`Scope`] (`403` otherwise);
//!   `/healthz` and `/openapi.json` stay open. Each request carries its [`ClientId`], the
//!   token's name: the actor of the operator commands and the scope of idempotency keys.
//! - **Waiting instead of polling.** `Prefer: wait=N` (RFC 7240) holds a start or a read up to
//!   N seconds (at most [`HttpConfig::max_wait`]) for the saga to end.
//! - **Idempotent starts.** `Idempotency-Key` on `POST /v1/sagas/{name}` follows the four
//!   rules of SPEC §4; the key is recorded in the saga's own transaction (see
//!   [`IdempotencyStore`](crate::store::IdempotencyStore)), scoped to the [`ClientId`], and
//!   kept for [`HttpConfig::idempotency_retention`]. A client registers a webhook for its saga
//!   with `Saga-Callback-Url` (see [`crate::webhooks`]).
//! - **Room to grow.** Per-request state is `AppState` (in `state.rs`), the cross-cutting
//!   concerns are layers in [`router`] (metrics, request id, timeout, tracing, error shape,
//!   auth, body limit), and each endpoint is one function in `handlers.rs`.
//!
//! # Example: the API inside your own axum app
//!
//! [`crate::Orchestrator`] serves everything in one call. An application with an HTTP server
//! of its own mounts the router instead, and must then run the engine beside it: the router
//! only records sagas, [`Engine::run`] drives them.
//!
//! ```
//! use std::sync::Arc;
//! use orchestrator::http::{router_with_shutdown, HttpConfig};
//! use orchestrator::{Engine, EngineConfig};
//! use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};
//! use tokio_util::sync::CancellationToken;
//!
//! async fn ping(_ctx: StepContext) -> Result<(), StepError> {
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("saga.db").display());
//! let registry = Registry::new()
//!     .with(SagaDefinition::builder("ping", 1).step(Step::retriable("ping", ping)).build()?)?;
//! let store = orchestrator::store::open(&url).await?;
//! let engine = Engine::new(store, Arc::new(registry), EngineConfig::default());
//! let shutdown = CancellationToken::new();
//!
//! // The engine drives the sagas the API records; it stops when `shutdown` is cancelled.
//! let engine_task = tokio::spawn({
//!     let (engine, shutdown) = (engine.clone(), shutdown.clone());
//!     async move { engine.run(shutdown).await }
//! });
//! let api = router_with_shutdown(engine.clone(), HttpConfig::default(), shutdown.clone());
//! let app = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "my app" }))
//!     .merge(api);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = tokio::spawn(orchestrator::http::serve(listener, app, shutdown.clone()));
//!
//! // … later, on SIGTERM: stop both; calls in flight finish and leases are released.
//! shutdown.cancel();
//! server.await??;
//! engine_task.await??;
//! # Ok(())
//! # }
//! ```

mod auth;
mod bulk;
mod console;
mod counts;
mod definitions;
mod error;
mod extract;
mod handlers;
mod idempotency;
mod limits;
mod metrics;
mod middleware;
mod openapi;
mod operators;
mod overview;
mod prefer;
mod recovery;
mod schedules;
mod state;
mod tasks;
pub mod tokens;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::engine::Engine;
pub use auth::ClientId;
pub use definitions::{openapi_for, openapi_json_for};
pub use error::ApiError;
use state::AppState;
pub use tokens::{ApiToken, Scope};

/// Settings of the HTTP API. Build one with struct-update syntax so that fields added later keep
/// their defaults: `HttpConfig { body_limit: 64 * 1024, ..HttpConfig::default() }`.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The largest request body accepted, in bytes; a larger one is answered `413`
    /// (`payload_too_large`) before it is parsed. Default: 1 MiB, as the specification says.
    pub body_limit: usize,
    /// How long a request may take before it is answered `503` (`unavailable`, with
    /// `Retry-After`). A request that asks to wait (`Prefer: wait=N`) gets its granted wait on
    /// top, so a wait is never cut short by the timeout. Default: 30 seconds.
    pub request_timeout: Duration,
    /// The bearer token clients must present (`Authorization: Bearer <token>`) on every `/v1`
    /// endpoint and `/metrics`; `None` (or an empty string) leaves the API open. Binaries read
    /// it from `SAGA_API_TOKEN` or `--api-token`. Never printed by `Debug`.
    pub api_token: Option<String>,
    /// Named tokens with scopes (`--api-tokens-file`, see [`tokens`]), beside
    /// [`api_token`](Self::api_token), which has every scope and the name `token`. With any
    /// token configured, a request without a known one is `401` and one whose token lacks the
    /// route's scope `403 forbidden`. Never printed by `Debug`.
    pub api_tokens: Vec<ApiToken>,
    /// The longest `Prefer: wait=N` honoured; longer requests are capped to it (and
    /// `Preference-Applied` says so). `Duration::ZERO` turns waiting off. Default: 60 seconds.
    pub max_wait: Duration,
    /// How long an `Idempotency-Key` is remembered after its first use; a retry after that
    /// starts a new saga. Default: 24 hours (`--idempotency-retention-secs`).
    pub idempotency_retention: Duration,
    /// Refuse starts without an `Idempotency-Key` (`400`). Default: off
    /// (`--require-idempotency-key`).
    pub require_idempotency_key: bool,
    /// Which internal hosts a client's `Saga-Callback-Url` may name (`--allow-callback-host`);
    /// any other host that is or resolves to a loopback, private, link-local or unspecified
    /// address is refused at start (`422 callback_url_not_allowed`). Give the relay the same
    /// policy ([`WebhookConfig::callbacks`](crate::webhooks::WebhookConfig::callbacks)): it
    /// checks again at each delivery.
    pub callbacks: crate::webhooks::CallbackPolicy,
}

impl HttpConfig {
    /// The default body limit: 1 MiB.
    pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
    /// The default request timeout: 30 seconds.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
    /// The default cap on `Prefer: wait`: 60 seconds.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(60);
    /// The default retention of idempotency keys: 24 hours.
    pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

    /// How old a key still in progress must be before it is taken as abandoned: its request
    /// cannot still be running (the longest wait plus the request timeout, and a margin).
    /// Such a key is then answered like a plain start (`202`) and completed with that answer.
    pub fn abandoned_after(&self) -> Duration {
        self.max_wait + self.request_timeout + Duration::from_secs(5)
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            body_limit: Self::DEFAULT_BODY_LIMIT,
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            api_token: None,
            api_tokens: Vec::new(),
            max_wait: Self::DEFAULT_MAX_WAIT,
            idempotency_retention: Self::DEFAULT_IDEMPOTENCY_RETENTION,
            require_idempotency_key: false,
            callbacks: crate::webhooks::CallbackPolicy::default(),
        }
    }
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("body_limit", &self.body_limit)
            .field("request_timeout", &self.request_timeout)
            .field("api_token", &self.api_token.as_ref().map(|_| "<redacted>"))
            .field("api_tokens", &self.api_tokens)
            .field("max_wait", &self.max_wait)
            .field("idempotency_retention", &self.idempotency_retention)
            .field("require_idempotency_key", &self.require_idempotency_key)
            .field("callbacks", &self.callbacks)
            .finish()
    }
}

/// Every documented route, registered from its handler's `#[utoipa::path]`.
fn api_routes() -> OpenApiRouter<AppState> {
    // `/v1/sagas/{saga}` is a definition name for POST and a saga id for GET: the router needs
    // one parameter name per path position, so the handlers decide how to read it.
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(handlers::healthz))
        .routes(routes!(metrics::metrics))
        .routes(routes!(handlers::openapi))
        .routes(routes!(handlers::list_sagas))
        .routes(routes!(handlers::get_saga, handlers::start_saga))
        .routes(routes!(handlers::saga_events))
        .routes(routes!(handlers::saga_attempts))
        .routes(routes!(handlers::cancel_saga))
        .routes(routes!(handlers::signal_saga))
        .routes(routes!(handlers::saga_deliveries))
        .routes(routes!(operators::abort_saga))
        .routes(routes!(operators::retry_saga))
        .routes(routes!(operators::mark_compensated))
        .routes(routes!(bulk::create_bulk, bulk::list_bulk))
        .routes(routes!(bulk::get_bulk))
        .routes(routes!(operators::pause_saga))
        .routes(routes!(operators::resume_saga))
        .routes(routes!(recovery::complete_step))
        .routes(routes!(recovery::fork_saga))
        .routes(routes!(tasks::complete_task))
        .routes(routes!(tasks::fail_task))
        .routes(routes!(tasks::heartbeat_task))
        .routes(routes!(limits::list_limits))
        .routes(routes!(limits::set_limit))
        .routes(routes!(
            schedules::create_schedule,
            schedules::list_schedules
        ))
        .routes(routes!(schedules::get_schedule, schedules::delete_schedule))
        .routes(routes!(schedules::pause_schedule))
        .routes(routes!(schedules::resume_schedule))
        .routes(routes!(schedules::trigger_schedule))
        .routes(routes!(definitions::list_definitions))
        .routes(routes!(overview::counts))
        .routes(routes!(overview::whoami))
}

/// The OpenAPI document of the API, without any application's sagas: `GET /openapi.json`
/// serves it with a start route per registered saga added ([`openapi_for`]). Generated from
/// the handlers, so it always matches the router; `docs/openapi.json` is a copy of it
/// (regenerate with `UPDATE_OPENAPI=1 cargo test -p saga-suite --test http openapi::`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut doc = api_routes().into_openapi();
    openapi::exact_parameters(&mut doc);
    doc
}

/// [`openapi()`] as pretty-printed JSON with a final newline, with the links from a start's
/// answers to the operations on its saga (which utoipa's typed model cannot write): the exact
/// text of `docs/openapi.json` (a server's `GET /openapi.json` is [`openapi_json_for`] its
/// registry).
pub fn openapi_json() -> String {
    openapi_json_for(&saga_dsl::Registry::new())
}

/// Builds the HTTP API over `engine` (and its store: the step log, idempotency keys and
/// webhook deliveries).
///
/// | route | handler |
/// |---|---|
/// | `POST /v1/sagas/{name}` | start a saga: `202` with `Location` |
/// | `GET /v1/sagas/{id}` | the saga with its steps |
/// | `GET /v1/sagas?status=&name=&needs_attention=&blocked=&created_after=&created_before=&id_prefix=&limit=&cursor=` | a page of sagas, newest first |
/// | `GET /v1/sagas/{id}/events` | the saga's event history |
/// | `GET /v1/sagas/{id}/attempts` | the saga's attempt log |
/// | `POST /v1/sagas/{id}/cancel` | request cancellation: `202`, or `409` when too late |
/// | `POST /v1/sagas/{id}/signals/{signal}` | deliver a signal with a JSON payload: `202` |
/// | `GET /v1/sagas/{id}/deliveries` | the saga's webhook deliveries |
/// | `POST /v1/sagas/{id}/abort` | an operator stops the saga without compensating (audited) |
/// | `POST /v1/sagas/{id}/retry` | an operator makes a waiting or failed step retry now (audited) |
/// | `POST /v1/sagas/{id}/steps/{step}/mark-compensated` | an operator vouches for a compensation done by hand (audited) |
/// | `POST /v1/bulk` | an operator applies a command to every saga a filter matches, as a durable job (audited) |
/// | `GET /v1/bulk`, `GET /v1/bulk/{id}` | recent bulk jobs; one job's progress and refusals |
/// | `GET /v1/limits` | every concurrency limit and rate limiter: its value, what holds it and what waits for it |
/// | `PUT /v1/limits/{name}` | an operator changes a limit or a rate limiter's rate and burst (audited) |
/// | `POST /v1/schedules`, `GET /v1/schedules` | make a schedule (a saga started on a cron expression or an interval); list them |
/// | `GET /v1/schedules/{id}`, `DELETE /v1/schedules/{id}` | a schedule with its next ticks and history; delete it |
/// | `POST /v1/schedules/{id}/pause`, `/resume`, `/trigger` | pause, resume, or fire a schedule now |
/// | `GET /v1/definitions` | the registered definitions: stages, hash, input schema |
/// | `GET /v1/counts` | sagas by status, needing attention, blocked |
/// | `GET /v1/whoami` | the caller's token name and scopes |
/// | `GET /healthz` | `200` when the store answers, else `503` |
/// | `GET /metrics` | Prometheus text |
/// | `GET /openapi.json` | the OpenAPI document, with a start route per saga ([`openapi_for`]) |
/// | `GET /ui/` | the web console (its files need no token; what it reads does) |
///
/// Every error, including an unknown route (`404`) and a wrong method (`405`), is JSON
/// `{"error": {"code": …, "message": …}}`, and every response carries an `x-request-id` header.
///
/// The router does not run the engine: call [`Engine::run`] next to it (a `202` only records
/// the saga; some process sharing the database must drive it). Building a router installs the
/// process's Prometheus recorder if none is installed yet.
///
/// A server that shuts down gracefully should use [`router_with_shutdown`], so that requests
/// waiting on `Prefer: wait` answer at once instead of holding the shutdown.
pub fn router(engine: Engine, config: HttpConfig) -> Router {
    router_with_shutdown(engine, config, CancellationToken::new())
}

/// [`router`], with waits (`Prefer: wait`) cut short when `shutdown` is cancelled: they answer
/// as if their time were up (`202`, or the saga as it is), so the server's graceful shutdown
/// only waits for real work. Pass the token given to [`serve`].
pub fn router_with_shutdown(
    engine: Engine,
    config: HttpConfig,
    shutdown: CancellationToken,
) -> Router {
    let config = Arc::new(config);
    let auth = Arc::new(auth::Auth::new(
        config.api_token.as_deref(),
        &config.api_tokens,
    ));
    if config.api_token.as_deref() == Some("") {
        tracing::warn!("the API token is empty: authentication is off");
    }
    let (routes, mut api) = api_routes().split_for_parts();
    openapi::exact_parameters(&mut api);
    // The served document also has each registered saga's own start route and input schema.
    let doc = definitions::with_start_routes(&api, engine.registry());
    let state = AppState {
        metrics: metrics::handle(),
        engine,
        config: config.clone(),
        openapi: Bytes::from(definitions::to_json(&doc)),
        shutdown,
        counts: Arc::default(),
    };
    // After the recorder is installed (by `handle`), so that the zeros reach it.
    metrics::zero_series(state.engine.registry(), &api);
    routes
        .merge(console::routes())
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(state)
        // Layers, innermost first. The body limit is enforced twice on purpose: tower-http
        // refuses a too-large `Content-Length` before any byte is read, axum's limit caps a
        // streamed (chunked) body while the extractor buffers it.
        .layer(DefaultBodyLimit::max(config.body_limit))
        .layer(RequestBodyLimitLayer::new(config.body_limit))
        // Authentication before the body is read: a refused request costs nothing and
        // creates nothing.
        .layer(axum::middleware::from_fn_with_state(
            auth,
            auth::authenticate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            config.clone(),
            middleware::json_errors,
        ))
        // Its span names the path as the request's log line does: never a task token.
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &axum::extract::Request| {
                tracing::debug_span!(
                    "request",
                    method = %req.method(),
                    uri = %middleware::logged_path(req.uri().path()),
                )
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            config,
            middleware::request_context,
        ))
        // Outermost, so that timeouts and refusals are counted too.
        .layer(axum::middleware::from_fn(metrics::track_requests))
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
