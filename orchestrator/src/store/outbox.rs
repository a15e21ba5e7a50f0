//! The outbox side of the store: reading the events table after a relay's cursor, and the
//! bookkeeping of webhook deliveries.
//!
//! # Why it is shaped this way
//!
//! The events table already is a transactional outbox: the engine writes each event in the
//! same transaction as the step-log change that causes it. What a relay needs on top is
//! (1) a durable cursor, so a restart neither skips nor re-reads the whole history, and (2) one
//! row per (event, target) recording whether it was delivered, so a delivery survives a crash
//! and its state can be shown.
//!
//! A relay *enqueues* deliveries and moves its cursor in one transaction
//! ([`OutboxStore::advance_relay`], a compare-and-set on the cursor, so two relays sharing a
//! database never enqueue twice), then senders *claim* due deliveries
//! ([`OutboxStore::claim_deliveries`]): a claim bumps `attempts` (the fencing token of that
//! attempt) and pushes `next_attempt_at` past a lease, so a sender that dies mid-send leaves a
//! delivery that becomes due again by itself — at least once. A claim never takes event N+1 of
//! a saga for a target while event N is still pending for it: per-saga order.
//!
//! On PostgreSQL, event ids come from a sequence and may become visible out of order; the
//! cursor therefore is a `(transaction id, event id)` pair read only below the oldest running
//! transaction (see `migrations/postgres/0002_idempotency_outbox.sql`). On SQLite writers are
//! serialised, so the event id alone orders the outbox.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::idempotency::Callback;
use super::Result;
use crate::model::Millis;

/// Where a relay has read the outbox up to. `tx` is the PostgreSQL transaction id of the event
/// (always 0 on SQLite); positions order by `(tx, event_id)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct OutboxPosition {
    /// The writing transaction's id (PostgreSQL), or 0.
    pub tx: i64,
    /// The event id.
    pub event_id: i64,
}

/// One event of the outbox, with what a webhook payload needs.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    /// Its position in the outbox.
    pub position: OutboxPosition,
    /// The saga it belongs to.
    pub saga_id: Uuid,
    /// The saga's definition name.
    pub saga_name: String,
    /// `saga.started`, `step.succeeded`, …
    pub kind: String,
    /// The step it is about, if any.
    pub step: Option<String>,
    /// When it was written.
    pub at: Millis,
    /// Its details.
    pub data: Value,
    /// The `traceparent` its saga's trace joins, as its row keeps it.
    pub traceparent: Option<String>,
}

impl OutboxEvent {
    /// The event id (unique across all sagas; receivers deduplicate by it).
    pub fn id(&self) -> i64 {
        self.position.event_id
    }

    /// The `traceparent` its deliveries carry: its saga span's context, sampled as
    /// `sampling` decides for the saga (or as the trace it joined decided); none when its
    /// saga has no trace.
    pub fn trace_header(&self, sampling: crate::telemetry::Sampling) -> Option<String> {
        crate::telemetry::SagaTrace::of(self.saga_id, self.traceparent.as_deref(), sampling)
            .map(|t| t.context.traceparent())
    }
}

/// Who a delivery goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// The callback URL the client registered when it started the saga.
    Callback,
    /// A subscriber the operator configured for every saga.
    Subscriber,
}

impl TargetKind {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Callback => "callback",
            Self::Subscriber => "subscriber",
        }
    }

    /// From the stored text (anything unknown reads as a subscriber).
    pub fn parse(text: &str) -> Self {
        if text == "callback" {
            Self::Callback
        } else {
            Self::Subscriber
        }
    }
}

/// A delivery to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// The event.
    pub event_id: i64,
    /// Its saga.
    pub saga_id: Uuid,
    /// The URL.
    pub target: String,
    /// Callback or subscriber.
    pub kind: TargetKind,
}

/// A delivery a sender has claimed: send it, then report with
/// [`OutboxStore::finish_delivery`] quoting `attempt`.
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    /// The event to send.
    pub event: OutboxEvent,
    /// The URL.
    pub target: String,
    /// Callback or subscriber.
    pub kind: TargetKind,
    /// This attempt's number, from 1 (the fencing token of the claim).
    pub attempt: u32,
    /// The saga's own callback secret, if the client gave one.
    pub callback_secret: Option<String>,
}

/// How an attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The receiver answered `2xx`.
    Delivered {
        /// Its status.
        status: u16,
    },
    /// It did not.
    Failed {
        /// The receiver's status, if it answered.
        status: Option<u16>,
        /// What went wrong.
        error: String,
        /// Try again after this long; `None` gives up.
        retry_in: Option<Duration>,
    },
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet (waiting for its turn, a retry, or in flight).
    Pending,
    /// The receiver answered `2xx`.
    Delivered,
    /// Given up after the last attempt.
    Failed,
}

/// One delivery of one event to one target, as `GET /v1/sagas/{id}/deliveries` and
/// `saga show` present it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// The event id (the `Saga-Event-Id` header of the delivery).
    pub event_id: i64,
    /// The event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The URL.
    pub target: String,
    /// Callback or subscriber.
    pub target_kind: TargetKind,
    /// Where it stands.
    pub state: DeliveryState,
    /// Attempts made (or in flight).
    pub attempts: u32,
    /// When the next attempt is due, while pending.
    #[serde(serialize_with = "crate::model::ser_opt_time")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub next_attempt_at: Option<Millis>,
    /// When it was delivered.
    #[serde(serialize_with = "crate::model::ser_opt_time")]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub delivered_at: Option<Millis>,
    /// The receiver's last HTTP status.
    pub last_status: Option<u16>,
    /// The last error.
    pub last_error: Option<String>,
}

/// The outbox relay's and the webhook senders' view of the store. Implemented by
/// `SqliteStore` and `PgStore`.
#[async_trait]
pub trait OutboxStore: Send + Sync + 'static {
    /// The position relay `name` has read up to (the start, for a new relay).
    async fn relay_cursor(&self, name: &str) -> Result<OutboxPosition>;

    /// Up to `limit` events after `after`, in outbox order, each with its saga's name. On
    /// PostgreSQL only events whose order can no longer change are returned.
    async fn outbox_after(&self, after: OutboxPosition, limit: u32) -> Result<Vec<OutboxEvent>>;

    /// The callbacks registered for these sagas.
    async fn saga_callbacks(&self, sagas: &[Uuid]) -> Result<HashMap<Uuid, Callback>>;

    /// In one transaction: moves relay `name` from `from` to `to` and enqueues `deliveries`
    /// (due now; one already enqueued is left alone). Returns `false`, writing nothing, when
    /// the cursor was no longer at `from` (another relay got there first).
    async fn advance_relay(
        &self,
        name: &str,
        from: OutboxPosition,
        to: OutboxPosition,
        deliveries: &[NewDelivery],
    ) -> Result<bool>;

    /// Claims up to `limit` due deliveries, oldest first, each the earliest pending one of its
    /// (saga, target): bumps its attempt count and makes it not due for `lease`.
    async fn claim_deliveries(&self, limit: u32, lease: Duration) -> Result<Vec<ClaimedDelivery>>;

    /// Records how a claimed attempt went. Ignored if the delivery was claimed again since
    /// (its attempt count moved on) or is no longer pending.
    async fn finish_delivery(
        &self,
        event_id: i64,
        target: &str,
        attempt: u32,
        outcome: &DeliveryOutcome,
    ) -> Result<()>;

    /// A saga's deliveries, by event then target.
    async fn deliveries(&self, saga: Uuid) -> Result<Vec<Delivery>>;

    /// How far relay `name` has got (nothing read, for a relay that never ran).
    async fn relay_progress(&self, name: &str) -> Result<RelayProgress>;

    /// The progress of every relay that has a cursor, by name.
    async fn relays(&self) -> Result<Vec<RelayProgress>>;

    /// Gives relay `name` a cursor at the start of the log if it has none: from then on
    /// retention keeps the events it has not read, even while it cannot run.
    async fn open_relay(&self, name: &str) -> Result<()>;

    /// The log's identity: a UUID made once per database (the first time it is asked for), so
    /// that ids built on event ids never collide across databases.
    async fn log_id(&self) -> Result<Uuid>;
}

/// How far one relay has read the outbox, as `saga outbox` and the metrics show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelayProgress {
    /// The relay's name (`webhooks`, `nats`, …).
    pub name: String,
    /// The last event it has read and recorded.
    pub event_id: i64,
    /// When it last recorded progress (`None`: never).
    #[serde(serialize_with = "crate::model::ser_opt_time")]
    pub updated_at: Option<Millis>,
    /// Events written after its cursor, in the order it reads them (on PostgreSQL, counted up
    /// to 100,000).
    pub lag_events: i64,
    /// When the oldest event it has not read was written (`None`: it is up to date).
    #[serde(serialize_with = "crate::model::ser_opt_time")]
    pub oldest_unread_at: Option<Millis>,
}

impl RelayProgress {
    /// How long the oldest unread event has waited at `now`, in seconds (0 when up to date).
    pub fn lag_seconds(&self, now: Millis) -> f64 {
        self.oldest_unread_at
            .map_or(0.0, |at| (now.saturating_sub(at)).max(0) as f64 / 1000.0)
    }
}

/// The state of a delivery row.
pub(super) fn state_of(delivered_at: Option<Millis>, failed_at: Option<Millis>) -> DeliveryState {
    match (delivered_at, failed_at) {
        (Some(_), _) => DeliveryState::Delivered,
        (None, Some(_)) => DeliveryState::Failed,
        (None, None) => DeliveryState::Pending,
    }
}

/// Milliseconds of a duration, saturating.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Longest error text kept per delivery.
pub(super) const MAX_ERROR: usize = 500;

/// `text` cut to [`MAX_ERROR`] characters.
pub(super) fn short_error(text: &str) -> String {
    text.chars().take(MAX_ERROR).collect()
}
