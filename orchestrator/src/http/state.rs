//! What every handler can reach. A later change adds the idempotency-key store, the API token
//! and the metrics handle here, as fields, so handlers keep their signatures.

use std::sync::Arc;

use crate::engine::Engine;
use crate::http::HttpConfig;

/// The shared state of the HTTP API. Cheap to clone (two `Arc`s).
#[derive(Clone, Debug)]
pub(crate) struct AppState {
    /// The engine: starts sagas and reaches the store.
    pub(crate) engine: Engine,
    /// The API settings.
    pub(crate) config: Arc<HttpConfig>,
}
