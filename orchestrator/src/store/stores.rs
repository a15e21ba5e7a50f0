//! One store, three views: the step log ([`Store`], what the engine uses), idempotent starts
//! ([`IdempotencyStore`]) and the outbox ([`OutboxStore`]). [`open_full`] opens a database and
//! hands out all three; the HTTP API and the webhook relay need the last two, and `Engine`
//! keeps only the first.
//!
//!
//! A saga created by an idempotent start is written outside `Engine::start`; whoever writes it
//! calls `Engine::wake` so that this process's engine looks at once (other processes hear the
//! `NOTIFY` on PostgreSQL, or poll).

use std::sync::Arc;

use super::idempotency::IdempotencyStore;
use super::outbox::OutboxStore;
use super::{PgStore, Result, SqliteStore, Store, StoreError};

/// The three views of one open store. Cheap to clone.
#[derive(Clone)]
pub struct Stores {
    /// The step log: give this one to `Engine::new`.
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
    /// The views of an SQLite store.
    pub fn sqlite(store: SqliteStore) -> Self {
        let store = Arc::new(store);
        Self {
            log: store.clone(),
            idempotency: store.clone(),
            outbox: store,
        }
    }

    /// The views of a PostgreSQL store.
    pub fn postgres(store: PgStore) -> Self {
        let store = Arc::new(store);
        Self {
            log: store.clone(),
            idempotency: store.clone(),
            outbox: store,
        }
    }
}

/// Opens the store a URL names, like [`super::open`], with all its views.
pub async fn open_full(url: &str) -> Result<Stores> {
    if url.starts_with("sqlite:") {
        Ok(Stores::sqlite(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Stores::postgres(PgStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl(super::redact_url(url)))
    }
}
