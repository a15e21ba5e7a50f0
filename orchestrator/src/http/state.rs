//! What every handler can reach. New concerns add a field here, so handlers keep their
//! signatures.

use std::sync::Arc;

use axum::body::Bytes;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::http::HttpConfig;

/// The shared state of the HTTP API. Cheap to clone (`Arc`s and handles).
#[derive(Clone)]
pub(crate) struct AppState {
    /// The engine: starts sagas and reaches the store (step log, keys and outbox).
    pub(crate) engine: Engine,
    /// The API settings.
    pub(crate) config: Arc<HttpConfig>,
    /// The OpenAPI document, serialized once when the router is built.
    pub(crate) openapi: Bytes,
    /// Renders the process's Prometheus series.
    pub(crate) metrics: PrometheusHandle,
    /// Cancelled when the server shuts down: long waits (`Prefer: wait`) end early, so that
    /// they do not hold a graceful shutdown.
    pub(crate) shutdown: CancellationToken,
    /// The last reading of `GET /v1/counts`, shared by every request.
    pub(crate) counts: Arc<crate::http::counts::CountsCache>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("engine", &self.engine)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
