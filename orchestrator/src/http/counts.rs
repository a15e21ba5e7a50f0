//! The counts of the log by status and flag (`GET /v1/counts`), read at most once per
//! [`COUNTS_FRESH_FOR`] whatever the number of callers.

use std::time::{Duration, Instant};

use serde::Serialize;
use utoipa::ToSchema;

use crate::model::SagaStatus;
use crate::store::{Store, StoreError};

/// How long a reading of the counts is served before the store is asked again.
pub(crate) const COUNTS_FRESH_FOR: Duration = Duration::from_secs(2);

/// The body of `GET /v1/counts`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Counts {
    /// Sagas per status, every status listed.
    #[schema(value_type = std::collections::BTreeMap<String, u64>)]
    by_status: std::collections::BTreeMap<&'static str, u64>,
    /// Sagas flagged as needing a person.
    needs_attention: u64,
    /// Unfinished sagas whose definition no running process has.
    blocked: u64,
    /// When these were counted (RFC 3339); never older than [`COUNTS_FRESH_FOR`].
    counted_at: String,
}

/// The last reading of the counts, shared by every request.
#[derive(Debug, Default)]
pub(crate) struct CountsCache(tokio::sync::Mutex<Option<(Instant, Counts)>>);

impl CountsCache {
    /// The counts: the last reading while it is fresh, else a new one from `store`.
    pub(crate) async fn read(&self, store: &dyn Store) -> Result<Counts, StoreError> {
        // Held while counting: requests arriving meanwhile wait for this reading, not a new one.
        let mut cached = self.0.lock().await;
        if let Some((at, counts)) = cached.as_ref() {
            if at.elapsed() < COUNTS_FRESH_FOR {
                return Ok(counts.clone());
            }
        }
        let by_status = store.count_by_status().await?;
        let (needs_attention, blocked) = store.count_flagged().await?;
        let counts = Counts {
            by_status: by_status
                .into_iter()
                .map(|(s, n): (SagaStatus, u64)| (s.as_str(), n))
                .collect(),
            needs_attention,
            blocked,
            counted_at: crate::model::rfc3339(store.now().await?),
        };
        *cached = Some((Instant::now(), counts.clone()));
        Ok(counts)
    }
}
