//! The outbox relay: what every destination of the saga events shares.
//!
//! # Why it works this way
//!
//! The engine writes every lifecycle event (`saga.started`, `step.succeeded`,
//! `saga.compensating`, `saga.completed`, …) in the same transaction as the step-log change
//! that causes it, so the events table is a transactional outbox: an event exists if and only
//! if its change happened. A relay reads it after a durable cursor of its own in
//! `relay_cursors` and moves that cursor only past what its destination has taken in charge,
//! so a destination that is away loses nothing: its events wait in the outbox.
//!
//! Each destination is a module of its own, with its own cursor; none knows the others, and
//! this module knows none of them (they implement its `Destination`):
//!
//! - `webhooks`: HTTP deliveries to the sagas' callbacks and the operator's subscribers, one
//!   delivery row per (event, target), signed, each retried on its own;
//! - `broker`: message brokers (NATS JetStream), a batch published and the cursor moved past
//!   what the broker acknowledged.
//!
//! What they share lives here: the event's JSON document ([`EventPayload`]), the cursor and
//! the lag it reports (`outbox_lag_events` and `outbox_lag_seconds`, labelled by the cursor's
//! name), and the loop that runs a destination's turns until shutdown, pausing when it is idle
//! and backing off after failures.

mod cursor;
mod payload;

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub(crate) use cursor::Cursor;
pub use payload::EventPayload;

/// How a destination's turn went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It did work and more may be waiting: the next turn follows at once.
    Busy,
    /// Nothing more to do for now: the next turn follows after the poll interval.
    Idle,
    /// It failed (and said why): the next turn follows after a backoff that grows with each
    /// failure in a row.
    Failed,
}

/// When a destination's turns follow one another.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pacing {
    /// The pause after an idle turn.
    pub(crate) poll_interval: Duration,
    /// The first pause after a failed turn; each further one doubles, with jitter.
    pub(crate) retry_base: Duration,
    /// The longest pause after failed turns.
    pub(crate) retry_max: Duration,
    /// How often the lag gauges are set.
    pub(crate) report_every: Duration,
}

/// One destination of the outbox, driven by [`run`].
#[async_trait]
pub(crate) trait Destination: Send {
    /// Its durable cursor.
    fn cursor(&self) -> &Cursor;

    /// One turn of work: reads after the cursor, hands the events on, records how far it got.
    /// A turn that fails logs why itself, where it knows what it was doing.
    async fn turn(&mut self) -> Turn;
}

/// Runs `destination`'s turns until `shutdown` is cancelled, reporting its lag as it goes and
/// once more at the end. A turn in flight at shutdown is finished (each destination bounds its
/// own turns by its timeouts).
pub(crate) async fn run(
    destination: &mut dyn Destination,
    pacing: Pacing,
    shutdown: CancellationToken,
) {
    let mut failures = 0u32;
    let mut last_report = None::<tokio::time::Instant>;
    while !shutdown.is_cancelled() {
        let turn = destination.turn().await;
        failures = match turn {
            Turn::Failed => failures.saturating_add(1),
            Turn::Busy | Turn::Idle => 0,
        };
        if last_report.is_none_or(|t| t.elapsed() >= pacing.report_every) {
            last_report = Some(tokio::time::Instant::now());
            destination.cursor().report_progress().await;
        }
        let pause = match turn {
            Turn::Busy => continue,
            Turn::Idle => pacing.poll_interval,
            Turn::Failed => crate::clock::backoff(pacing.retry_base, pacing.retry_max, failures),
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
    destination.cursor().report_progress().await;
}
