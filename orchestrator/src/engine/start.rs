//! Starting a saga: one use case, whoever asks (the HTTP API, an application, a test).
//!
//! [`Engine::start`] checks the input against the latest definition, then records the saga. A
//! worker slot of this process is lent to the start when one is free (or a place in line for
//! the next): the saga is then created leased to this process and handed straight to a driver,
//! with no claim, and with a free worker its first action's write-ahead rides in the create's
//! commit. The same holds for starts with an idempotency key or a callback, whose rows are
//! written in that one transaction too.
//!
//! An [`IdempotencyKey`](StartKey) follows SPEC §4: a new key is recorded with its saga; a key
//! whose request finished replays its saved answer; a key still in progress is refused (unless
//! it is so old that the process answering it must have died); the same key for another request
//! is refused. The saved answer is the `202` body ([`Started`]), known before the write, unless
//! the caller answers only once the saga ends ([`StartRequest::answered_later`]): then it saves
//! its answer through the [`PendingAnswer`] it gets back.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{Engine, SlotPermit, StartError, StartSlot};
use crate::model::{Millis, Saga, SagaStatus};
use crate::store::{
    Callback, IdempotencyKey, IdempotentStart, NewFlow, NewSaga, SavedResponse, Store, StoreError,
    DEFAULT_PRIORITY,
};

/// A request to start a saga. Build it with [`StartRequest::new`] and the `with_*` methods, so
/// that options added later keep their defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StartRequest {
    /// The definition name; the latest registered version runs.
    pub name: String,
    /// The input, checked against the definition's input type.
    pub input: Value,
    /// An idempotency key: retries with the same key start one saga.
    pub key: Option<StartKey>,
    /// A webhook target for every event of this saga.
    pub callback: Option<Callback>,
    /// Whether the caller answers only when the saga ends (`Prefer: wait`): a keyed start then
    /// stays *in progress* until [`PendingAnswer::save`].
    pub answer_later: bool,
    /// A scheduled start (`Saga-Start-At`): the saga is created `QUEUED` and starts at this
    /// time (milliseconds since the epoch), which must not be in the past.
    pub start_at: Option<Millis>,
    /// The trace the saga joins (the start request's `traceparent`): its spans are children
    /// of this one. Not part of an idempotent start's fingerprint: a retry comes from
    /// another span.
    pub trace: Option<saga_dsl::TraceContext>,
    /// Its priority, 0 to 9 (`Saga-Priority`; [`DEFAULT_PRIORITY`] when `None`): among sagas
    /// waiting to start, higher ones start first.
    pub priority: Option<u8>,
    /// The new saga's id, when the caller derives it (a schedule's tick); a fresh UUIDv7
    /// otherwise. Give it only with a key that names the same saga whenever it is reused:
    /// the key, not the id, decides between two starts of one saga.
    pub id: Option<Uuid>,
}

impl StartRequest {
    /// A plain start of `name` with `input`.
    pub fn new(name: impl Into<String>, input: Value) -> Self {
        Self {
            name: name.into(),
            input,
            key: None,
            callback: None,
            answer_later: false,
            start_at: None,
            trace: None,
            priority: None,
            id: None,
        }
    }

    /// With the id `id` for the new saga (see [`StartRequest::id`]).
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    /// With priority `priority` (0 to 9; [`Engine::start`] refuses more).
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Joining the trace of `parent`: the saga's spans are its children.
    pub fn in_trace(mut self, parent: saga_dsl::TraceContext) -> Self {
        self.trace = Some(parent);
        self
    }

    /// Started at `at` (milliseconds since the epoch) rather than now.
    pub fn at(mut self, at: Millis) -> Self {
        self.start_at = Some(at);
        self
    }

    /// With an idempotency key.
    pub fn with_key(mut self, key: StartKey) -> Self {
        self.key = Some(key);
        self
    }

    /// With a callback that receives the saga's events.
    pub fn with_callback(mut self, callback: Callback) -> Self {
        self.callback = Some(callback);
        self
    }

    /// The caller answers once the saga ends, and saves that answer with
    /// [`PendingAnswer::save`].
    pub fn answered_later(mut self) -> Self {
        self.answer_later = true;
        self
    }
}

/// An idempotency key of a start, with the rules it is kept by.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartKey {
    /// Who sent it (the API client); keys of different clients never collide.
    pub scope: String,
    /// The key itself (1 to 255 visible ASCII characters).
    pub key: String,
    /// How long the key is remembered; a later retry starts a new saga.
    pub retention: Duration,
    /// A key still in progress this long after it was recorded is taken as abandoned (the
    /// process answering it died): it is then completed with the plain `202` and replayed.
    pub abandoned_after: Duration,
}

impl StartKey {
    /// The default retention of a key: 24 hours.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// The default age at which a key in progress is taken as abandoned.
    pub const DEFAULT_ABANDONED_AFTER: Duration = Duration::from_secs(95);

    /// `key`, sent by `scope`, kept for the defaults.
    pub fn new(scope: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            scope: scope.into(),
            key: key.into(),
            retention: Self::DEFAULT_RETENTION,
            abandoned_after: Self::DEFAULT_ABANDONED_AFTER,
        }
    }

    /// Kept for `retention` instead of the default.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Taken as abandoned after `age` in progress instead of the default.
    pub fn with_abandoned_after(mut self, age: Duration) -> Self {
        self.abandoned_after = age;
        self
    }
}

/// The summary of a started saga: the body of the `202` answer to a start, and what a keyed
/// start saves to replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Started {
    /// The new saga's id; follow `Location` to read it.
    pub id: Uuid,
    /// Its definition name.
    pub name: String,
    /// `RUNNING` when a worker of this process took it at once, else `QUEUED` until one picks
    /// it up.
    pub status: SagaStatus,
    /// For a scheduled start (`Saga-Start-At`): when it starts, RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<String>,
}

impl Started {
    /// The summary as JSON: the exact bytes answered and saved.
    pub fn to_json(&self) -> String {
        // Our own type always serialises; an empty object is still valid JSON should it not.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// The plain `202` answer with this body.
    pub fn accepted(&self) -> SavedResponse {
        SavedResponse {
            status_code: 202,
            body: self.to_json(),
        }
    }
}

/// What a start did.
#[derive(Debug)]
pub enum StartOutcome {
    /// A new saga was recorded.
    Created {
        /// The saga as created.
        saga: Box<Saga>,
        /// Its summary, as saved with a key (the `202` body).
        started: Started,
        /// For a keyed start answered later: where to save that answer.
        pending: Option<PendingAnswer>,
    },
    /// The key's request finished before: nothing was started, and this is its saved answer.
    Replayed {
        /// The saga the first request started.
        saga_id: Uuid,
        /// The answer saved for it.
        response: SavedResponse,
    },
}

impl StartOutcome {
    /// The saga this start created or found.
    pub fn saga_id(&self) -> Uuid {
        match self {
            Self::Created { saga, .. } => saga.id,
            Self::Replayed { saga_id, .. } => *saga_id,
        }
    }
}

/// The key of a start answered later, in progress until its answer is saved.
#[derive(Clone)]
pub struct PendingAnswer {
    store: Arc<dyn Store>,
    scope: String,
    key: String,
}

impl std::fmt::Debug for PendingAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingAnswer")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl PendingAnswer {
    /// Saves the final answer; retries of the key replay it from now on.
    pub async fn save(&self, response: &SavedResponse) -> Result<(), StoreError> {
        self.store
            .complete_idempotent(&self.scope, &self.key, response)
            .await
    }
}

/// A new saga's place in flow control: a saga of a definition with concurrency limits waits
/// to be admitted within them, counted under its definition's name and its key; one of
/// another priority than the default waits for a claim's priority order whenever it cannot
/// start at once (unleased). An input without the per-key limit's field is refused.
fn flow_of(
    def: &saga_dsl::SagaDefinition,
    input: &Value,
    priority: u8,
) -> Result<NewFlow, StartError> {
    let limits = def.flow();
    let key = match &limits.per_key {
        Some(per_key) => Some(
            per_key
                .key_of(input)
                .ok_or_else(|| StartError::InvalidInput {
                    name: def.name().to_owned(),
                    message: format!(
                        "{}: the limit {} counts sagas per value of this field, which must be a \
                     string, number or boolean",
                        per_key.key, per_key.name
                    ),
                })?,
        ),
        None => None,
    };
    let limited = limits.limits_running();
    Ok(NewFlow {
        priority,
        gated: limited || priority != DEFAULT_PRIORITY,
        flow: limited.then(|| def.name().to_owned()),
        key,
    })
}

/// A new saga of `def` with `input` and its search attributes; a value that cannot be
/// computed or is too long refuses the start as an input that does not fit, naming the
/// attribute.
fn with_attrs(def: &saga_dsl::SagaDefinition, input: Value) -> Result<NewSaga, StartError> {
    NewSaga::with_attrs(def, input).map_err(|e| StartError::InvalidInput {
        name: def.name().to_owned(),
        message: e.to_string(),
    })
}

/// The highest priority a start may ask for.
pub const MAX_PRIORITY: u8 = 9;

impl Engine {
    /// Starts a saga on the latest registered version of `request.name`: checks the input and
    /// records the saga, with its key and callback, in one transaction. With a free worker
    /// here, the saga is created leased to it, `RUNNING`, its first action written ahead in the
    /// same commit, and driven at once. Otherwise it is created `QUEUED`, due now, and runs
    /// once a worker of this process frees or [`Engine::run`] (here or in another process
    /// sharing the database) claims it.
    ///
    /// With a key, SPEC §4's rules apply: see the `engine::start` module and the errors
    /// [`StartError::KeyInProgress`] and [`StartError::KeyReused`].
    pub async fn start(&self, request: StartRequest) -> Result<StartOutcome, StartError> {
        let StartRequest {
            name,
            input,
            key,
            callback,
            answer_later,
            start_at,
            trace,
            priority,
            id,
        } = request;
        let def = self.checked_definition(&name, &input)?;
        let priority = priority.unwrap_or(DEFAULT_PRIORITY);
        if priority > MAX_PRIORITY {
            return Err(StartError::InvalidPriority(priority));
        }
        let flow = flow_of(def, &input, priority)?;
        let fingerprint = key
            .as_ref()
            .map(|_| fingerprint(def.name(), callback.as_ref(), start_at, &input));
        if let Some(at) = start_at {
            let now = self.inner.clock.now_ms();
            if at < now {
                return Err(StartError::StartInPast { at, now });
            }
        }
        let mut new = with_attrs(def, input)?;
        if let Some(id) = id {
            new.id = id;
        }
        new.start_at = start_at;
        new.traceparent = trace.map(|t| t.traceparent());
        // A saga of a definition with limits waits to be admitted by a claim, within them.
        let admitted_by_claim = flow.flow.is_some();
        new.flow = flow;
        // With a free worker here, the saga is created already leased to this process and
        // driven at once: no claim, no wait for the run loop, and no commit of its own for the
        // first write-ahead. Freed unused unless this start creates the saga.
        // A scheduled saga waits for its time unleased, like any saga not due yet.
        let slot = (start_at.is_none() && !admitted_by_claim)
            .then(|| self.reserve_slot())
            .flatten();
        // A first step that may not call (a sleep, a condition, a rate limiter's token) is
        // decided by the driver.
        let plain_first = def.steps().first().is_some_and(|s| {
            s.kind().calls()
                && !s.is_conditional()
                && s.call().is_some_and(|c| c.rate_limiter().is_none())
        });
        new.first_attempt = plain_first && slot.as_ref().is_some_and(StartSlot::runs_at_once);
        let started = Started {
            id: new.id,
            name: new.name.clone(),
            status: new.initial_status(slot.is_some()),
            scheduled_at: start_at.map(crate::model::rfc3339),
        };
        let store = &self.inner.store;
        let lease = slot.as_ref().map(StartSlot::lease);
        let saga = match (key, fingerprint) {
            (Some(key), Some(fingerprint)) => {
                let abandoned_after = key.abandoned_after;
                let key = IdempotencyKey {
                    scope: key.scope,
                    key: key.key,
                    fingerprint,
                    retention: key.retention,
                };
                // A plain start knows its answer before writing: it is saved with the key.
                let answer = (!answer_later).then(|| started.accepted());
                let outcome = store
                    .create_saga_idempotent(&key, new, callback.as_ref(), answer.as_ref(), lease)
                    .await?;
                match outcome {
                    IdempotentStart::Created(saga) => {
                        let pending = answer_later.then(|| PendingAnswer {
                            store: store.clone(),
                            scope: key.scope,
                            key: key.key,
                        });
                        return Ok(self.started(*saga, started, slot, pending));
                    }
                    IdempotentStart::Replay { saga_id, response } => {
                        metrics::counter!("idempotent_replays_total").increment(1);
                        return Ok(StartOutcome::Replayed { saga_id, response });
                    }
                    IdempotentStart::InProgress {
                        saga_id,
                        created_at,
                    } => {
                        return self
                            .in_progress(&key, abandoned_after, saga_id, created_at, started)
                            .await
                    }
                    IdempotentStart::Mismatch { saga_id } => {
                        return Err(StartError::KeyReused { saga_id })
                    }
                }
            }
            _ => match (&callback, slot.as_ref()) {
                (Some(callback), _) => {
                    store
                        .create_saga_with_callback(new, callback, lease)
                        .await?
                }
                (None, Some(slot)) => store.create_saga_leased(new, slot.lease()).await?.saga,
                (None, None) => store.create_saga(new).await?,
            },
        };
        Ok(self.started(saga, started, slot, None))
    }

    /// The latest registered definition of `name`, once `input` was checked against it: the
    /// first rule of every start ([`Engine::start`], and a fork's new saga).
    fn checked_definition(
        &self,
        name: &str,
        input: &Value,
    ) -> Result<&saga_dsl::SagaDefinition, StartError> {
        let def = self
            .inner
            .registry
            .latest(name)
            .ok_or_else(|| StartError::UnknownDefinition(name.to_owned()))?;
        def.check_input(input)
            .map_err(|message| StartError::InvalidInput {
                name: name.to_owned(),
                message,
            })?;
        Ok(def)
    }

    /// A new saga of the latest version of `name` with `input`, checked as a start checks it,
    /// for a caller that records it in a transaction of its own (a fork, with the original's
    /// change); once committed, [`Engine::created_elsewhere`] hands it to the engine.
    pub(crate) fn new_saga(&self, name: &str, input: Value) -> Result<NewSaga, StartError> {
        let def = self.checked_definition(name, &input)?;
        let flow = flow_of(def, &input, DEFAULT_PRIORITY)?;
        let mut new = with_attrs(def, input)?;
        new.flow = flow;
        Ok(new)
    }

    /// A saga [`Engine::new_saga`] made and another transaction committed, unleased and due
    /// now: counted as started, and the engine woken to claim it (here or in another process
    /// sharing the database).
    pub(crate) fn created_elsewhere(&self, saga: &Saga) {
        self.wake();
        tracing::debug!(saga.id = %saga.id, saga.name = %saga.name, "saga started");
        metrics::counter!("saga_started_total", "name" => saga.name.clone()).increment(1);
    }

    /// [`Engine::start`] of `name` with `input` and no options, which always creates a saga:
    /// the saga as created.
    pub async fn start_saga(&self, name: &str, input: Value) -> Result<Saga, StartError> {
        match self.start(StartRequest::new(name, input)).await? {
            StartOutcome::Created { saga, .. } => Ok(*saga),
            // Only a keyed start replays; should one ever, the saga it names is the answer.
            StartOutcome::Replayed { saga_id, .. } => self
                .inner
                .store
                .get_saga(saga_id)
                .await?
                .ok_or(StartError::Store(StoreError::NotFound(saga_id))),
        }
    }

    /// A saga just created: handed to a driver in its slot, counted, and answered.
    fn started(
        &self,
        saga: Saga,
        started: Started,
        slot: Option<StartSlot>,
        pending: Option<PendingAnswer>,
    ) -> StartOutcome {
        self.drive_started(&saga, slot);
        tracing::debug!(saga.id = %saga.id, saga.name = %saga.name, "saga started");
        metrics::counter!("saga_started_total", "name" => saga.name.clone()).increment(1);
        StartOutcome::Created {
            saga: Box::new(saga),
            started,
            pending,
        }
    }

    /// A key whose first request has not answered yet: refused while that request may still
    /// run; once it cannot (its process died), completed with the plain `202` and replayed.
    async fn in_progress(
        &self,
        key: &IdempotencyKey,
        abandoned_after: Duration,
        saga_id: Uuid,
        created_at: i64,
        started: Started,
    ) -> Result<StartOutcome, StartError> {
        let store = &self.inner.store;
        let now = store.now().await?;
        let age = Duration::from_millis(u64::try_from(now - created_at).unwrap_or(0));
        if age < abandoned_after {
            return Err(StartError::KeyInProgress { saga_id });
        }
        let status = match store.saga_status(saga_id).await? {
            Some(status) => status,
            None => SagaStatus::Queued,
        };
        let response = Started {
            id: saga_id,
            status,
            ..started
        }
        .accepted();
        store
            .complete_idempotent(&key.scope, &key.key, &response)
            .await?;
        metrics::counter!("idempotent_replays_total").increment(1);
        Ok(StartOutcome::Replayed { saga_id, response })
    }

    /// Drives `saga`, created leased with `slot`'s lease (epoch 1), in the slot; a saga created
    /// without a slot, or not under its lease, is left to the claim loop (and the engine woken).
    fn drive_started(&self, saga: &Saga, slot: Option<StartSlot>) {
        let Some(slot) = slot.filter(|slot| {
            saga.lease_owner.as_deref() == Some(slot.lease.owner.as_str()) && saga.lease_epoch == 1
        }) else {
            self.wake();
            return;
        };
        let lease = crate::store::Lease {
            saga_id: saga.id,
            owner: slot.lease.owner.clone(),
            epoch: 1,
        };
        self.hand_over(
            crate::store::Claimed {
                lease,
                saga: saga.clone(),
            },
            slot,
        );
    }

    /// Whether a start made now would be driven at once by a free worker of this process: the
    /// run loop is accepting work and a worker is free.
    pub fn has_free_worker(&self) -> bool {
        self.reserve_slot()
            .is_some_and(|slot| matches!(slot.permit, SlotPermit::Worker(_)))
    }
}

/// The fingerprint of a start: SHA-256 (hex) over the saga name, the callback URL and the
/// canonical JSON of the input (object keys sorted at every level, no insignificant
/// whitespace), so the order of the keys in the body does not matter and any other
/// difference does.
pub fn fingerprint(
    name: &str,
    callback: Option<&Callback>,
    start_at: Option<Millis>,
    input: &Value,
) -> String {
    let mut hasher = Sha256::new();
    hasher.update(name.as_bytes());
    hasher.update([0]);
    hasher.update(callback.map(|c| c.url.as_str()).unwrap_or_default());
    hasher.update([0]);
    // Only when given, so that the fingerprints of keys saved before scheduled starts stay.
    if let Some(at) = start_at {
        hasher.update(format!("at:{at}"));
        hasher.update([0]);
    }
    let mut text = String::new();
    canonical_json(input, &mut text);
    hasher.update(text.as_bytes());
    hex::encode(hasher.finalize())
}

/// Writes `value` as JSON with the keys of every object sorted (serde_json sorts them already
/// unless its `preserve_order` feature is on; this does not depend on that).
pub fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_fingerprint_ignores_key_order_only() {
        let a = json!({"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}});
        let b: Value =
            serde_json::from_str(r#"{"a": {"x": null, "y": [1, {"c": 3, "d": 2}]}, "b": 1}"#)
                .expect("json");
        assert_eq!(
            fingerprint("s", None, None, &a),
            fingerprint("s", None, None, &b)
        );
        assert_ne!(
            fingerprint("s", None, None, &a),
            fingerprint("t", None, None, &a)
        );
        assert_ne!(
            fingerprint("s", None, None, &json!({"a": 1})),
            fingerprint("s", None, None, &json!({"a": 2}))
        );
        let cb = Callback {
            url: "http://x/".into(),
            secret: None,
        };
        assert_ne!(
            fingerprint("s", None, None, &a),
            fingerprint("s", Some(&cb), None, &a)
        );
        let mut text = String::new();
        canonical_json(&a, &mut text);
        assert_eq!(text, r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#);
    }
}
