//! One store, three views: the step log ([`Store`], what the engine uses), idempotent starts
//! ([`IdempotencyStore`]) and the outbox ([`OutboxStore`]). Every [`Store`] is all three (its
//! supertraits), so [`Stores`] only names the views of one `Arc<dyn Store>` for the code that
//! needs one of them alone (the webhook relay, the key sweeper, tests).

use std::sync::Arc;

use super::idempotency::IdempotencyStore;
use super::outbox::OutboxStore;
#[cfg(feature = "postgres")]
use super::PgStore;
#[cfg(feature = "sqlite")]
use super::SqliteStore;
use super::{Result, Store};

/// The three views of one open store. Cheap to clone.
#[derive(Clone)]
pub struct Stores {
    /// The step log (and, through it, the other two): give this one to `Engine::new`.
    pub log: Arc<dyn Store>,
    /// Idempotent starts (the HTTP API).
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// The outbox and webhook deliveries (the relay, the HTTP API, `saga show`).
    pub outbox: Arc<dyn OutboxStore>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

impl Stores {
    /// The views of one store.
    pub fn of(store: Arc<dyn Store>) -> Self {
        Self {
            idempotency: store.clone(),
            outbox: store.clone(),
            log: store,
        }
    }

    /// The views of an SQLite store.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(store: SqliteStore) -> Self {
        Self::of(Arc::new(store))
    }

    /// The views of a PostgreSQL store.
    #[cfg(feature = "postgres")]
    pub fn postgres(store: PgStore) -> Self {
        Self::of(Arc::new(store))
    }
}

impl From<Arc<dyn Store>> for Stores {
    fn from(store: Arc<dyn Store>) -> Self {
        Self::of(store)
    }
}

/// Opens the store a URL names, like [`super::open`], with all its views.
pub async fn open_full(url: &str) -> Result<Stores> {
    Ok(Stores::of(super::open(url).await?))
}
