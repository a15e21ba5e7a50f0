//! Keeping the log to a retention (SPEC §8): finished sagas older than a bound are deleted with
//! everything that hangs off them, in small pages that each hold the write path only briefly
//! (`saga purge --finished-before D`, and `serve --retention D` on a timer).
//!
//! What is never deleted: a saga that has not finished, one that waits for a person
//! (`needs_attention`, a `FAILED` saga nobody has looked at), a child saga while its parent is
//! kept, and a saga whose events the outbox has not relayed or delivered yet. A purged saga's
//! id answers `404` like one that never was.
//!
//! The refusals of NATS triggers recorded before the same bound go too, in one statement, so
//! that table does not grow forever either.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::model::Millis;
use crate::store::{PurgeCursor, Store, StoreError};

/// How a purge goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeOptions {
    /// Sagas looked at (and deleted) per transaction. Default: 200.
    pub page: u32,
    /// The pause between two pages, which lets the engine's writes through. Default: 5 ms.
    pub pause: Duration,
    /// Count what would go instead of deleting it.
    pub dry_run: bool,
    /// Only sagas with every one of these search attributes (name, value), as a list selects
    /// them; empty: any saga.
    pub attrs: Vec<(String, String)>,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        Self {
            page: 200,
            pause: Duration::from_millis(5),
            dry_run: false,
            attrs: Vec::new(),
        }
    }
}

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Sagas deleted (or, in a dry run, that would be).
    pub purged: u64,
    /// Pages (transactions) it took.
    pub pages: u64,
    /// Trigger refusals deleted (or, in a dry run, that would be).
    pub refusals: u64,
    /// How long it took.
    pub took: Duration,
}

/// Deletes every saga finished before `before` that may go (see the [module](self)), then the
/// trigger refusals recorded before `before`. It walks
/// the finished sagas until a walk deletes nothing more, since a child saga can go only once
/// its parent has; a dry run walks once (children of sagas it would delete are not counted).
/// `progress` hears the running total after each page that deleted something.
pub async fn purge_finished_before(
    store: &dyn Store,
    before: Millis,
    options: &PurgeOptions,
    mut progress: impl FnMut(u64),
) -> Result<PurgeReport, StoreError> {
    let started = Instant::now();
    let mut report = PurgeReport::default();
    loop {
        let mut cursor = Some(PurgeCursor::default());
        let mut this_walk = 0;
        while let Some(at) = cursor {
            let page = store
                .purge_page(before, at, options.page, options.dry_run, &options.attrs)
                .await?;
            report.pages += 1;
            if !page.purged.is_empty() {
                this_walk += page.purged.len() as u64;
                report.purged += page.purged.len() as u64;
                if !options.dry_run {
                    metrics::counter!("saga_purged_total").increment(page.purged.len() as u64);
                }
                progress(report.purged);
            }
            cursor = page.next;
            if cursor.is_some() && !options.pause.is_zero() {
                tokio::time::sleep(options.pause).await;
            }
        }
        if options.dry_run || this_walk == 0 {
            break;
        }
    }
    report.refusals = store
        .purge_trigger_refusals(before, options.dry_run)
        .await?;
    report.took = started.elapsed();
    Ok(report)
}

/// The bound of "finished `age` ago or more": the store's now minus `age`.
pub async fn finished_before(store: &dyn Store, age: Duration) -> Result<Millis, StoreError> {
    let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    Ok(store.now().await?.saturating_sub(age))
}

/// How often `serve --retention` purges: a quarter of the retention, between a second and ten
/// minutes.
pub fn purge_interval(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(600))
}

/// Purges sagas finished more than `retention` ago, now and then every
/// [`purge_interval`], until `shutdown` is cancelled. A failed round is logged and tried again
/// at the next.
pub async fn run(store: Arc<dyn Store>, retention: Duration, shutdown: CancellationToken) {
    let every = purge_interval(retention);
    tracing::info!(retention = ?retention, every = ?every, "retention: purging finished sagas");
    loop {
        let round = async {
            let before = finished_before(store.as_ref(), retention).await?;
            purge_finished_before(store.as_ref(), before, &PurgeOptions::default(), |_| {}).await
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            done = round => match done {
                Ok(report) if report.purged > 0 || report.refusals > 0 => tracing::info!(
                    purged = report.purged, refusals = report.refusals,
                    pages = report.pages, took = ?report.took,
                    "retention: purged finished sagas"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "retention: purging failed; will retry"),
            },
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Reads a retention or an age: a duration such as `30d`, `12h`, `90m` or `1h 30m`
/// (humantime's syntax).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration such as 30d, 12h or 90m: {e}"))
}
