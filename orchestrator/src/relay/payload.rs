//! The JSON document every destination sends for an event.

use serde::Serialize;
use uuid::Uuid;

use crate::model::rfc3339;
use crate::store::outbox::OutboxEvent;

/// The JSON body of an event as it leaves the outbox: a webhook delivery's body and a broker
/// message's payload are this same document.
#[derive(Debug, Clone, Serialize)]
pub struct EventPayload<'a> {
    /// The event id: the same on every attempt; deduplicate by it.
    pub id: i64,
    /// The event type (`saga.started`, `step.succeeded`, …).
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The saga.
    pub saga_id: Uuid,
    /// The saga's definition name.
    pub saga_name: &'a str,
    /// The step the event is about, if any.
    pub step: Option<&'a str>,
    /// When the event was written (RFC 3339).
    pub at: String,
    /// The event's details.
    pub data: &'a serde_json::Value,
}

impl<'a> EventPayload<'a> {
    /// The payload of `event`.
    pub fn of(event: &'a OutboxEvent) -> Self {
        Self {
            id: event.id(),
            kind: &event.kind,
            saga_id: event.saga_id,
            saga_name: &event.saga_name,
            step: event.step.as_deref(),
            at: rfc3339(event.at),
            data: &event.data,
        }
    }

    /// The payload of `event` as JSON bytes.
    pub fn body(event: &OutboxEvent) -> Vec<u8> {
        serde_json::to_vec(&EventPayload::of(event)).unwrap_or_default()
    }
}
