//! The refusals of NATS triggers (`serve --nats-trigger`, see `crate::triggers`): a message
//! whose body cannot start its saga is terminated on the broker and recorded here, so that the
//! refusal outlives the message and every process sees it (`saga triggers`,
//! `GET /v1/triggers`).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::Result;

/// The most bytes of a refused body kept with its refusal: enough to recognise the message,
/// never a copy of a large one.
pub const BODY_EXCERPT_BYTES: usize = 256;

/// A refusal to record.
#[derive(Debug, Clone, Copy)]
pub struct NewRefusal<'a> {
    /// The trigger, `SUBJECT=SAGA` as given to `--nats-trigger`.
    pub trigger: &'a str,
    /// The JetStream stream the message is in.
    pub stream: &'a str,
    /// Its sequence number in that stream.
    pub stream_seq: u64,
    /// The message's own subject (a trigger's subject may have wildcards).
    pub subject: &'a str,
    /// Why it was refused.
    pub error: &'a str,
    /// The body, of which [`BODY_EXCERPT_BYTES`] are kept.
    pub body: &'a [u8],
}

/// A recorded refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct TriggerRefusal {
    /// The trigger, `SUBJECT=SAGA`.
    pub trigger: String,
    /// The JetStream stream the message was in.
    pub stream: String,
    /// Its sequence number in that stream.
    pub stream_seq: i64,
    /// The message's subject.
    pub subject: String,
    /// Why it was refused.
    pub error: String,
    /// The first bytes of the body, as text (invalid UTF-8 replaced).
    pub body_excerpt: String,
    /// The body's whole size in bytes.
    pub body_bytes: i64,
    /// When, RFC 3339.
    pub refused_at: String,
}

/// How many refusals a trigger has recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct RefusalCount {
    /// The trigger, `SUBJECT=SAGA`.
    pub trigger: String,
    /// Its recorded refusals.
    pub refused: i64,
}

/// The first [`BODY_EXCERPT_BYTES`] of `body` as text, cut on a character boundary.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(BODY_EXCERPT_BYTES)]);
    // A multi-byte character cut at the limit reads as one replacement character at the end.
    text.into_owned()
}

/// The refusals of triggers, kept in the log's database.
#[async_trait]
pub trait TriggerLog: Send + Sync + 'static {
    /// Records `refusal`; a message already recorded for its trigger (a redelivery) changes
    /// nothing. Returns whether it was new.
    async fn record_trigger_refusal(&self, refusal: &NewRefusal<'_>) -> Result<bool>;

    /// The latest `limit` refusals, newest first, of `trigger` or of every trigger.
    async fn trigger_refusals(
        &self,
        trigger: Option<&str>,
        limit: u32,
    ) -> Result<Vec<TriggerRefusal>>;

    /// How many refusals each trigger has recorded, by trigger.
    async fn trigger_refusal_counts(&self) -> Result<Vec<RefusalCount>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_bounded_and_text() {
        assert_eq!(excerpt(b"{\"a\":1}"), "{\"a\":1}");
        let long = vec![b'x'; 10_000];
        assert_eq!(excerpt(&long).len(), BODY_EXCERPT_BYTES);
        assert_eq!(excerpt(&[0xff, b'a']), "\u{fffd}a");
    }
}
