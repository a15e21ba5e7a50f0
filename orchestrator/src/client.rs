//! A typed client for the HTTP API: start a saga, read it, wait for it to end, cancel it, list
//! the definitions the server can start, the operator commands, and flow control's limits.
//!
//! # One key per logical start
//!
//! The mistake this client exists to prevent is the seed's: a client that retries a start after
//! a lost reply with a *new* idempotency key starts a second saga (a second charge). Here
//! [`SagaClient::start`] takes the key once, before the first attempt, and sends that same key
//! on every retry of that start (connection errors, timeouts, `409`, `429`, `5xx`), with capped
//! exponential backoff and full jitter (tokio-retry's strategy), honouring `Retry-After`. A key
//! is generated (a UUIDv4) when the caller gives none, and returned in [`StartedSaga`] so that a
//! caller that gives up can resume the same logical start later.
//!
//! The server records the key with the saga in one transaction, so a retry after a lost reply is
//! answered with the saved answer (`Idempotent-Replayed: true`) and starts nothing; a retry
//! while the first attempt is still waiting (`Prefer: wait`) gets `409`, which this client
//! retries.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use orchestrator::client::SagaClient;
//! # use orchestrator::Orchestrator;
//! # use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! # async fn ship(_ctx: StepContext) -> Result<(), StepError> { Ok(()) }
//! # let dir = tempfile::tempdir()?;
//! # let server = Orchestrator::builder(Registry::new().with(
//! #     SagaDefinition::builder("place_order", 1).step(Step::pivot("ship", ship)).build()?,
//! # )?)
//! # .database_url(format!("sqlite://{}", dir.path().join("saga.db").display()))
//! # .listen("127.0.0.1:0")
//! # .quiet()
//! # .start()
//! # .await?;
//! # let base = format!("http://{}", server.local_addr());
//! // `base` is the server's URL, e.g. "http://127.0.0.1:8080".
//! let client = SagaClient::new(&base, std::env::var("SAGA_API_TOKEN").ok())?;
//! let input = serde_json::json!({"order_id": "o-1", "user": "ada", "amount": 1200});
//! let started = client.start("place_order", &input, None).await?;
//! let saga = client.wait(started.id, Duration::from_secs(30)).await?;
//! println!("{} is {}", saga.id, saga.status);
//! assert!(saga.status.is_terminal());
//! # server.stop().await?;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use tokio_retry::strategy::{jitter, ExponentialBackoff};
use uuid::Uuid;

use crate::model::{
    BulkAction, BulkJob, DefinitionList, LimitChange, LimitInfo, ListFilter, Saga, SagaPage,
    SagaStatus,
};

/// The `Idempotency-Key` request header (IETF httpapi draft).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest idempotency key the API accepts (SPEC §4).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The longest `Prefer: wait` one request asks for; longer waits are several requests.
const MAX_WAIT_PER_REQUEST: Duration = Duration::from_secs(60);

/// The longest `Retry-After` honoured; a server asking for more gets this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error (after any retries): its status and its
    /// `{"error": {"code", "message"}}`.
    #[error("the server answered {status} {code}: {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The API's stable error code (`not_found`, `invalid_input`, …), or `http_<status>`
        /// when the body was not the API's error shape (a proxy's page, say).
        code: String,
        /// The server's message.
        message: String,
    },
    /// The server could not be reached, or the exchange broke off, on every attempt.
    #[error("cannot reach the saga API at {url} after {attempts} attempt(s): {detail}")]
    Transport {
        /// The URL of the request.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The cause, with its chain (connection refused, timed out, …).
        detail: String,
    },
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("invalid server URL {0:?}: expected an absolute http:// or https:// URL")]
    InvalidUrl(String),
    /// An argument cannot be sent (an idempotency key that is empty, too long or not
    /// printable ASCII).
    #[error("{0}")]
    InvalidArgument(String),
    /// The server answered something this client does not understand.
    #[error("unexpected answer from {url}: {detail}")]
    UnexpectedResponse {
        /// The URL of the request.
        url: String,
        /// What was wrong with it.
        detail: String,
    },
}

impl ClientError {
    /// The HTTP status of an [`Api`](ClientError::Api) error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The API error code of an [`Api`](ClientError::Api) error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The answer to a start: the new saga, and the idempotency key that started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedSaga {
    /// The saga id.
    pub id: Uuid,
    /// The definition name.
    pub name: String,
    /// Its status when the server answered: `RUNNING` if a worker took it at once, else `QUEUED`.
    pub status: SagaStatus,
    /// The key sent with every attempt of this start; pass it again to retry the same logical
    /// start later.
    pub idempotency_key: String,
}

/// The answer to a cancel request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelAccepted {
    /// The saga id.
    pub id: Uuid,
    /// Its status when the server answered.
    pub status: SagaStatus,
    /// `accepted` (the step in flight finishes, then the saga compensates) or
    /// `already_compensating`.
    pub cancel: String,
}

/// The answer to a signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalAccepted {
    /// The saga id.
    pub id: Uuid,
    /// The signal's name.
    pub signal: String,
    /// The saga's status when the server answered.
    pub status: SagaStatus,
    /// `received` (recorded now) or `already_received` (the same signal came before, or this
    /// was a replay of a request with the same idempotency key).
    pub outcome: String,
}

/// What a start answer must hold (a `202` body, or a whole saga).
#[derive(Deserialize)]
struct StartAnswer {
    id: Uuid,
    name: String,
    status: SagaStatus,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

/// Which sagas a bulk action acts on (`POST /v1/bulk`'s `filter`): the fields given combine
/// with AND; at least one is needed unless it is a dry run. Times are RFC 3339.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkFilter {
    /// Only sagas in this status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<SagaStatus>,
    /// Only sagas of this definition name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only sagas flagged as needing attention.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub needs_attention: bool,
    /// Only sagas created at or after this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_after: Option<String>,
    /// Only sagas created before this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_before: Option<String>,
    /// Search attributes, equality on each (none is declared yet: the server refuses them).
    #[serde(skip_serializing_if = "serde_json::Map::is_empty", default)]
    pub attr: serde_json::Map<String, serde_json::Value>,
}

/// The answer to [`SagaClient::bulk`]: the job recorded (`id`, `matched`), or for a dry run no
/// id, the count and the first matched ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkCreated {
    /// The job, or `None` for a dry run.
    pub id: Option<Uuid>,
    /// How many sagas the filter matched.
    pub matched: u64,
    /// For a dry run, the first matched ids.
    #[serde(default)]
    pub sample: Vec<Uuid>,
}

/// How a saga is started, beyond its definition and input ([`SagaClient::start_with`]): each
/// setting left out is the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartOptions {
    /// The idempotency key of this logical start; a UUIDv4 when `None`.
    pub idempotency_key: Option<String>,
    /// When it starts (`Saga-Start-At`), milliseconds since the epoch; now when `None`.
    pub at: Option<crate::model::Millis>,
    /// Its priority (`Saga-Priority`), 0 (last) to 9 (first); the server's default, 5, when
    /// `None`.
    pub priority: Option<u8>,
}

impl StartOptions {
    /// No setting: a new key, now, the default priority.
    pub fn new() -> Self {
        Self::default()
    }

    /// With the idempotency key `key`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Starting at `at`, milliseconds since the epoch.
    pub fn at(mut self, at: crate::model::Millis) -> Self {
        self.at = Some(at);
        self
    }

    /// With priority `priority`, 0 to 9 (a higher one is refused before anything is sent).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }
}

/// The body of `GET /v1/schedules`.
#[derive(Deserialize)]
struct ScheduleList {
    schedules: Vec<crate::model::ScheduleDetail>,
}

/// The body of `GET /v1/limits`.
#[derive(Deserialize)]
struct LimitList {
    limits: Vec<LimitInfo>,
}

/// A client of one orchestrator's HTTP API. Cheap to clone (it shares its connection pool).
#[derive(Clone)]
pub struct SagaClient {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
    max_attempts: u32,
    first_backoff: Duration,
    max_backoff: Duration,
    request_timeout: Duration,
}

impl std::fmt::Debug for SagaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaClient")
            .field("base", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl SagaClient {
    /// The default number of attempts per call (the first and four retries).
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
    /// The default time one attempt may take (a `wait` adds its wait).
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

    /// A client of the API at `base_url` (`http://127.0.0.1:8080`, or with a path prefix behind
    /// a proxy), presenting `token` as a bearer token when given.
    pub fn new(base_url: &str, token: Option<String>) -> Result<Self, ClientError> {
        let base = Url::parse(base_url.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base())
            .ok_or_else(|| ClientError::InvalidUrl(base_url.to_owned()))?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| ClientError::Transport {
                url: base.to_string(),
                attempts: 0,
                detail: chain(&e),
            })?;
        Ok(Self {
            http,
            base,
            token: token.filter(|t| !t.is_empty()),
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Attempts per call, at least 1 (default 5).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The backoff between attempts: `first`, doubling up to `max`, each with full jitter
    /// (default 100 ms up to 5 s).
    pub fn with_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first.max(Duration::from_millis(1));
        self.max_backoff = max.max(self.first_backoff);
        self
    }

    /// How long one attempt may take before it counts as timed out (default 30 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The API's base URL.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    /// Starts a saga of definition `name` with `input`.
    ///
    /// `idempotency_key` names this logical start; when `None` a UUIDv4 is generated. Either
    /// way the same key goes with every attempt, and comes back in [`StartedSaga`].
    pub async fn start(
        &self,
        name: &str,
        input: &impl Serialize,
        idempotency_key: Option<String>,
    ) -> Result<StartedSaga, ClientError> {
        self.start_at(name, input, idempotency_key, None).await
    }

    /// [`SagaClient::start`], scheduled (`Saga-Start-At`) to start at `at`, milliseconds since
    /// the epoch, when given: the saga is created `QUEUED` and starts then.
    pub async fn start_at(
        &self,
        name: &str,
        input: &impl Serialize,
        idempotency_key: Option<String>,
        at: Option<crate::model::Millis>,
    ) -> Result<StartedSaga, ClientError> {
        let options = StartOptions {
            idempotency_key,
            at,
            priority: None,
        };
        self.start_with(name, input, &options).await
    }

    /// [`SagaClient::start`] with every setting of a start: its idempotency key, when it starts
    /// and its priority (`Saga-Priority`: among sagas due to start, higher ones first).
    pub async fn start_with(
        &self,
        name: &str,
        input: &impl Serialize,
        options: &StartOptions,
    ) -> Result<StartedSaga, ClientError> {
        if let Some(p) = options.priority.filter(|p| *p > 9) {
            return Err(ClientError::InvalidArgument(format!(
                "priority {p} is out of range: 0 (last) to 9 (first)"
            )));
        }
        let key = options
            .idempotency_key
            .clone()
            .unwrap_or_else(|| Uuid::new_v4().to_string());
        let start_at = options.at.map(crate::model::rfc3339);
        let priority = options.priority.map(|p| p.to_string());
        let key_header = check_key(&key)?;
        let body = serde_json::to_vec(input)
            .map_err(|e| ClientError::InvalidArgument(format!("the input is not JSON: {e}")))?;
        let url = self.url(&["v1", "sagas", name])?;
        let response = self
            .send(Method::POST, &url, |req| {
                let req = req
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .header(HeaderName::from_static(IDEMPOTENCY_KEY), key_header.clone())
                    .body(body.clone());
                let req = match &start_at {
                    Some(at) => req.header("saga-start-at", at.as_str()),
                    None => req,
                };
                match &priority {
                    Some(p) => req.header("saga-priority", p.as_str()),
                    None => req,
                }
            })
            .await?;
        let answer: StartAnswer = decode(&url, response).await?;
        Ok(StartedSaga {
            id: answer.id,
            name: answer.name,
            status: answer.status,
            idempotency_key: key,
        })
    }

    /// Reads a saga (`GET /v1/sagas/{id}`). Here and in every method that names a saga, `id`
    /// is its id or a unique prefix of it (its first 8 or more characters), which the server
    /// resolves: a prefix of several sagas is a `400` [`ClientError::Api`] with code
    /// `ambiguous_id`, naming some of them; a prefix of none a `404`.
    pub async fn get(&self, id: impl std::fmt::Display) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string()])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        decode(&url, response).await
    }

    /// A page of sagas, newest first (`GET /v1/sagas`), filtered as `filter` says: its status,
    /// name, needs-attention flag, creation times, search attributes (`attr.<name>=…`), page
    /// size and cursor (its `id_prefix` and `ids` are not sent).
    pub async fn list(&self, filter: &ListFilter) -> Result<SagaPage, ClientError> {
        let url = self.url(&["v1", "sagas"])?;
        let mut query: Vec<(String, String)> = Vec::new();
        if let Some(status) = filter.status {
            query.push(("status".to_owned(), status.as_str().to_owned()));
        }
        if let Some(name) = &filter.name {
            query.push(("name".to_owned(), name.clone()));
        }
        if filter.needs_attention {
            query.push(("needs_attention".to_owned(), "true".to_owned()));
        }
        if let Some(after) = filter.created_after {
            query.push(("created_after".to_owned(), crate::model::rfc3339(after)));
        }
        if let Some(before) = filter.created_before {
            query.push(("created_before".to_owned(), crate::model::rfc3339(before)));
        }
        for (name, value) in &filter.attrs {
            query.push((format!("attr.{name}"), value.clone()));
        }
        if filter.limit > 0 {
            query.push(("limit".to_owned(), filter.limit.to_string()));
        }
        if let Some(cursor) = filter.cursor {
            query.push(("cursor".to_owned(), cursor.to_string()));
        }
        let response = self
            .send(Method::GET, &url, |req| req.query(&query))
            .await?;
        decode(&url, response).await
    }

    /// Waits up to `timeout` for the saga to end, with long polls (`Prefer: wait`) rather than
    /// a busy loop, and returns it as it is then: check [`SagaStatus::is_terminal`] to tell an
    /// end from a timeout.
    pub async fn wait(
        &self,
        id: impl std::fmt::Display,
        timeout: Duration,
    ) -> Result<Saga, ClientError> {
        let id = id.to_string();
        let url = self.url(&["v1", "sagas", &id])?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = remaining.min(MAX_WAIT_PER_REQUEST).as_secs();
            if wait == 0 {
                return self.get(&id).await;
            }
            let asked = tokio::time::Instant::now();
            let response = self
                .send_with_timeout(
                    Method::GET,
                    &url,
                    self.request_timeout + Duration::from_secs(wait),
                    |req| req.header("prefer", format!("wait={wait}")),
                )
                .await?;
            // A server (or proxy) that ignores `Prefer` answers at once: poll gently then.
            let honoured = response.headers().contains_key("preference-applied");
            let saga: Saga = decode(&url, response).await?;
            if saga.status.is_terminal() {
                return Ok(saga);
            }
            if !honoured && asked.elapsed() < Duration::from_secs(wait) {
                let pause = Duration::from_millis(250).min(remaining);
                tokio::time::sleep(pause).await;
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(saga);
            }
        }
    }

    /// Requests cancellation (`POST /v1/sagas/{id}/cancel`): the step in flight finishes, then
    /// the saga compensates. A saga that has ended or passed its pivot is a `409`
    /// [`ClientError::Api`], returned at once (an answer, not a request in progress).
    pub async fn cancel(&self, id: impl std::fmt::Display) -> Result<CancelAccepted, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "cancel"])?;
        self.command(&url, None).await
    }

    /// Sends the signal `name` with `payload` to a saga (`POST /v1/sagas/{id}/signals/{name}`),
    /// under `idempotency_key` (a fresh one if `None`), so that the retries this client makes
    /// after a lost answer are replays. Another payload after the first is a `409`
    /// [`ClientError::Api`] with code `signal_already_received`; an unknown saga or signal a
    /// `404`; a saga that has ended a `409` with code `conflict`.
    pub async fn signal(
        &self,
        id: impl std::fmt::Display,
        name: &str,
        payload: &impl Serialize,
        idempotency_key: Option<String>,
    ) -> Result<SignalAccepted, ClientError> {
        let key = idempotency_key.unwrap_or_else(|| Uuid::new_v4().to_string());
        let key_header = check_key(&key)?;
        let body = serde_json::to_vec(payload)
            .map_err(|e| ClientError::InvalidArgument(format!("the payload is not JSON: {e}")))?;
        let url = self.url(&["v1", "sagas", &id.to_string(), "signals", name])?;
        let response = self
            .send(Method::POST, &url, |req| {
                req.header(reqwest::header::CONTENT_TYPE, "application/json")
                    .header(HeaderName::from_static(IDEMPOTENCY_KEY), key_header.clone())
                    .body(body.clone())
            })
            .await?;
        decode(&url, response).await
    }

    /// Aborts a saga (`POST /v1/sagas/{id}/abort`): it stops without compensating, audited with
    /// `reason` and this client's token name; a call in flight is recorded `abandoned`. Needs
    /// a token with the `operate` scope; a saga that has ended is a `409` [`ClientError::Api`].
    pub async fn abort(
        &self,
        id: impl std::fmt::Display,
        reason: &str,
    ) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "abort"])?;
        self.operate(&url, Some(reason)).await
    }

    /// Pauses a saga (`POST /v1/sagas/{id}/pause`), audited with `reason` and this client's
    /// token name: at once if no worker holds it, else once its call in flight is recorded
    /// (the answer then has `pause_requested`). Needs the `operate` scope; a saga that has
    /// ended, is `FAILED` or is paused is a `409` [`ClientError::Api`].
    pub async fn pause(
        &self,
        id: impl std::fmt::Display,
        reason: &str,
    ) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "pause"])?;
        self.operate(&url, Some(reason)).await
    }

    /// Resumes a `PAUSED` saga (`POST /v1/sagas/{id}/resume`), audited with `reason`: it goes
    /// on in the direction it was going, and a step whose retries ran out gets a fresh budget.
    /// Needs the `operate` scope; a saga that is not paused is a `409` [`ClientError::Api`].
    pub async fn resume(
        &self,
        id: impl std::fmt::Display,
        reason: &str,
    ) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "resume"])?;
        self.operate(&url, Some(reason)).await
    }

    /// Makes a waiting retry happen now, or gives a `FAILED` saga's failed step another
    /// attempt (`POST /v1/sagas/{id}/retry`). Needs the `operate` scope.
    pub async fn retry(&self, id: impl std::fmt::Display) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "retry"])?;
        self.operate(&url, None).await
    }

    /// Vouches that `step`'s compensation was done by hand
    /// (`POST /v1/sagas/{id}/steps/{step}/mark-compensated`), audited with `reason`. Needs the
    /// `operate` scope; a saga that is not compensating is a `409` [`ClientError::Api`].
    pub async fn mark_compensated(
        &self,
        id: impl std::fmt::Display,
        step: &str,
        reason: &str,
    ) -> Result<Saga, ClientError> {
        let url = self.url(&[
            "v1",
            "sagas",
            &id.to_string(),
            "steps",
            step,
            "mark-compensated",
        ])?;
        self.operate(&url, Some(reason)).await
    }

    /// Records a bulk action (`POST /v1/bulk`): `action` applied to every saga `filter` matches
    /// now, audited with `reason`, as a durable job the server works; with `dry_run`, only
    /// counts them. Needs the `operate` scope. A `409` is not retried; a lost connection or a
    /// `5xx` is, as for the other commands, so an answer lost after the job was recorded may
    /// record a second job (which finds the sagas the first acted on refusing or unchanged):
    /// [`bulk_jobs`](Self::bulk_jobs) shows them.
    pub async fn bulk(
        &self,
        action: BulkAction,
        filter: &BulkFilter,
        reason: &str,
        dry_run: bool,
    ) -> Result<BulkCreated, ClientError> {
        let url = self.url(&["v1", "bulk"])?;
        let body = serde_json::json!({
            "action": action, "filter": filter, "reason": reason, "dry_run": dry_run,
        })
        .to_string();
        let response = self
            .send_attempts(Method::POST, &url, self.request_timeout, false, |req| {
                req.header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        decode(&url, response).await
    }

    /// A bulk job's progress and refusals (`GET /v1/bulk/{id}`).
    pub async fn bulk_job(&self, id: Uuid) -> Result<BulkJob, ClientError> {
        let url = self.url(&["v1", "bulk", &id.to_string()])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        decode(&url, response).await
    }

    /// The most recent bulk jobs, newest first (`GET /v1/bulk`), without their refusals.
    pub async fn bulk_jobs(&self) -> Result<crate::model::BulkJobPage, ClientError> {
        let url = self.url(&["v1", "bulk"])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        decode(&url, response).await
    }

    /// Records `output` as the result of `step`, done by hand
    /// (`POST /v1/sagas/{id}/steps/{step}/complete`), audited with `reason`; the saga goes on.
    /// Needs the `operate` scope; a saga not stopped on that step is a `409`
    /// [`ClientError::Api`]. Returns the saga as the command left it.
    pub async fn complete_step(
        &self,
        id: impl std::fmt::Display,
        step: &str,
        output: &serde_json::Value,
        reason: &str,
    ) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "steps", step, "complete"])?;
        let body = serde_json::json!({ "output": output, "reason": reason }).to_string();
        self.command(&url, Some(body)).await
    }

    /// Forks saga `id` (`POST /v1/sagas/{id}/fork`), audited with `reason`: a new saga of the
    /// same name from the original's input or `input`, taking over the effects of the stages
    /// before `from_stage` if given (the original then `ABORTED` with `superseded_by`). Needs
    /// the `operate` scope. Returns the new saga.
    ///
    /// Sent once, never retried: a fresh fork whose answer was lost would otherwise be made
    /// twice. After a transport error, the original's `saga.forked` events say whether it was.
    pub async fn fork(
        &self,
        id: impl std::fmt::Display,
        input: Option<&serde_json::Value>,
        from_stage: Option<&str>,
        reason: &str,
    ) -> Result<Saga, ClientError> {
        let url = self.url(&["v1", "sagas", &id.to_string(), "fork"])?;
        let mut body = serde_json::json!({ "reason": reason });
        if let Some(input) = input {
            body["input"] = input.clone();
        }
        if let Some(stage) = from_stage {
            body["from_stage"] = serde_json::json!(stage);
        }
        self.post_once(url, Some(body.to_string())).await
    }

    /// POSTs `body` (JSON) to `url` once, never retried: a request whose answer was lost may
    /// have made something (a fork, a schedule's run) that a second request would make again.
    async fn post_once<T: serde::de::DeserializeOwned>(
        &self,
        url: Url,
        body: Option<String>,
    ) -> Result<T, ClientError> {
        let mut req = self
            .http
            .request(Method::POST, url.clone())
            .timeout(self.request_timeout);
        if let Some(body) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let response = req.send().await.map_err(|e| ClientError::Transport {
            url: url.to_string(),
            attempts: 1,
            detail: chain(&e),
        })?;
        if !response.status().is_success() {
            return Err(api_error(&url, response).await);
        }
        decode(&url, response).await
    }

    /// An operator command: `POST` with `{"reason"}` if given, answered with the saga.
    async fn operate(&self, url: &Url, reason: Option<&str>) -> Result<Saga, ClientError> {
        let body = reason.map(|r| serde_json::json!({ "reason": r }).to_string());
        self.command(url, body).await
    }

    /// A command: `POST` with `body` (JSON) if given, its answer decoded. Retried as
    /// [`send`](Self::send) is, but a `409` is an answer (the saga's state forbids it), not a
    /// request in progress: that is returned at once.
    async fn command<T: serde::de::DeserializeOwned>(
        &self,
        url: &Url,
        body: Option<String>,
    ) -> Result<T, ClientError> {
        let response = self
            .send_attempts(
                Method::POST,
                url,
                self.request_timeout,
                false,
                |req| match &body {
                    Some(body) => req
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(body.clone()),
                    None => req,
                },
            )
            .await?;
        decode(url, response).await
    }

    /// Every limit (`GET /v1/limits`), by name: concurrency limits and rate limiters, each with
    /// its value, the declared one, who changed it last, and how many sagas hold and wait for it.
    pub async fn limits(&self) -> Result<Vec<LimitInfo>, ClientError> {
        let url = self.url(&["v1", "limits"])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        let list: LimitList = decode(&url, response).await?;
        Ok(list.limits)
    }

    /// The server's NATS triggers with their lag and counts, and the latest `limit` refusals
    /// recorded in the log (`GET /v1/triggers`).
    pub async fn triggers(&self, limit: u32) -> Result<crate::triggers::TriggerList, ClientError> {
        let mut url = self.url(&["v1", "triggers"])?;
        url.query_pairs_mut()
            .append_pair("limit", &limit.to_string());
        let response = self.send(Method::GET, &url, |req| req).await?;
        decode(&url, response).await
    }

    /// Changes the limit `name` (`PUT /v1/limits/{name}`): a concurrency limit's value, or a
    /// rate limiter's rate and burst, audited with `reason` (if any) and this client's token
    /// name. Needs the `operate` scope. An unknown name is a `404` [`ClientError::Api`] with
    /// code `unknown_limit`; a change of the other kind a `422` (`unprocessable`). Returns the
    /// limit as it now stands. A retry after a lost answer sets the same value again (and is
    /// audited again).
    pub async fn set_limit(
        &self,
        name: &str,
        change: &LimitChange,
        reason: Option<&str>,
    ) -> Result<LimitInfo, ClientError> {
        let url = self.url(&["v1", "limits", name])?;
        let mut body = match change {
            LimitChange::Limit(limit) => serde_json::json!({ "limit": limit }),
            LimitChange::Rate { rate, burst } => {
                serde_json::json!({ "rate": rate.to_string(), "burst": burst })
            }
        };
        if let Some(reason) = reason {
            body["reason"] = serde_json::json!(reason);
        }
        let body = body.to_string();
        let response = self
            .send_attempts(Method::PUT, &url, self.request_timeout, false, |req| {
                req.header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        decode(&url, response).await
    }

    /// The saga definitions the server can start (`GET /v1/definitions`): every registered
    /// version, by name then version, with its stages and its input as JSON Schema.
    pub async fn definitions(&self) -> Result<DefinitionList, ClientError> {
        let url = self.url(&["v1", "definitions"])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        decode(&url, response).await
    }

    /// Makes a schedule (`POST /v1/schedules`); needs the `operate` scope. A refusal is a
    /// [`ClientError::Api`] (`409 conflict` for a taken id, `422` for an unknown saga, a bad
    /// cron expression, time zone, interval or input). Not retried on `409`: a schedule made
    /// by a lost answer's request is then reported as taken.
    pub async fn create_schedule(
        &self,
        new: &crate::schedules::NewSchedule,
    ) -> Result<crate::model::ScheduleDetail, ClientError> {
        let url = self.url(&["v1", "schedules"])?;
        let body = serde_json::to_string(new).unwrap_or_default();
        self.command(&url, Some(body)).await
    }

    /// Every schedule (`GET /v1/schedules`), each with its next ticks and latest run.
    pub async fn schedules(&self) -> Result<Vec<crate::model::ScheduleDetail>, ClientError> {
        let url = self.url(&["v1", "schedules"])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        let list: ScheduleList = decode(&url, response).await?;
        Ok(list.schedules)
    }

    /// One schedule with its history (`GET /v1/schedules/{id}`).
    pub async fn schedule(&self, id: &str) -> Result<crate::model::ScheduleDetail, ClientError> {
        let url = self.url(&["v1", "schedules", id])?;
        let response = self.send(Method::GET, &url, |req| req).await?;
        decode(&url, response).await
    }

    /// Pauses or resumes a schedule (`POST /v1/schedules/{id}/pause|resume`): the schedule as
    /// it now stands.
    pub async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
    ) -> Result<crate::model::ScheduleDetail, ClientError> {
        let action = if paused { "pause" } else { "resume" };
        let url = self.url(&["v1", "schedules", id, action])?;
        self.command(&url, None).await
    }

    /// Fires a schedule now (`POST /v1/schedules/{id}/trigger`): what happened to the tick.
    ///
    /// Sent once, never retried: each trigger is a tick of its own, so a retry after a lost
    /// answer would start a second saga. After a transport error, the schedule's runs say
    /// whether it fired.
    pub async fn trigger_schedule(
        &self,
        id: &str,
    ) -> Result<crate::model::ScheduleRun, ClientError> {
        let url = self.url(&["v1", "schedules", id, "trigger"])?;
        self.post_once(url, None).await
    }

    /// Deletes a schedule and its history (`DELETE /v1/schedules/{id}`).
    pub async fn delete_schedule(&self, id: &str) -> Result<(), ClientError> {
        let url = self.url(&["v1", "schedules", id])?;
        self.send_attempts(Method::DELETE, &url, self.request_timeout, false, |req| req)
            .await?;
        Ok(())
    }

    /// `base` + path segments, each percent-encoded.
    fn url(&self, segments: &[&str]) -> Result<Url, ClientError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| ClientError::InvalidUrl(self.base.to_string()))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    async fn send(
        &self,
        method: Method,
        url: &Url,
        decorate: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        self.send_with_timeout(method, url, self.request_timeout, decorate)
            .await
    }

    /// Sends a request, retrying connection errors, timeouts, `409`, `429` and `5xx` with
    /// backoff; `decorate` adds the same headers and body to every attempt. Returns the first
    /// success, or the last failure as a [`ClientError`].
    async fn send_with_timeout(
        &self,
        method: Method,
        url: &Url,
        timeout: Duration,
        decorate: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        self.send_attempts(method, url, timeout, true, decorate)
            .await
    }

    /// The attempts of [`send_with_timeout`](Self::send_with_timeout); `retry_conflicts` says
    /// whether a `409` is worth another attempt.
    async fn send_attempts(
        &self,
        method: Method,
        url: &Url,
        timeout: Duration,
        retry_conflicts: bool,
        decorate: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        // `from_millis(2).factor(f)` gives f·2, f·4, …: a first delay of 2·f ms, doubling.
        let factor = (self.first_backoff.as_millis() as u64 / 2).max(1);
        let mut delays = ExponentialBackoff::from_millis(2)
            .factor(factor)
            .max_delay(self.max_backoff)
            .map(jitter)
            .take(self.max_attempts.saturating_sub(1) as usize);
        let mut attempt = 1u32;
        loop {
            let mut req = self
                .http
                .request(method.clone(), url.clone())
                .timeout(timeout);
            if let Some(token) = &self.token {
                req = req.bearer_auth(token);
            }
            let outcome = decorate(req).send().await;
            let retry_hint = match &outcome {
                Ok(r) if r.status() == StatusCode::CONFLICT && !retry_conflicts => None,
                Ok(r) if retryable_status(r.status()) => Some(retry_after(r)),
                Ok(_) => None,
                Err(e) if retryable_transport(e) => Some(None),
                Err(_) => None,
            };
            let next = match retry_hint {
                Some(hint) => delays.next().map(|d| hint.map_or(d, |h| h.max(d))),
                None => None,
            };
            let Some(delay) = next else {
                return match outcome {
                    Ok(r) if r.status().is_success() => Ok(r),
                    Ok(r) => Err(api_error(url, r).await),
                    Err(e) => Err(ClientError::Transport {
                        url: url.to_string(),
                        attempts: attempt,
                        detail: chain(&e),
                    }),
                };
            };
            match &outcome {
                Ok(r) => tracing::debug!(%url, attempt, status = r.status().as_u16(),
                                         retry_in_ms = delay.as_millis() as u64, "retrying"),
                Err(e) => tracing::debug!(%url, attempt, error = %chain(e),
                                          retry_in_ms = delay.as_millis() as u64, "retrying"),
            }
            // Free the connection of a failed answer before sleeping.
            drop(outcome);
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

/// Statuses worth another attempt with the same key: the request may not have been processed
/// (`5xx`, `429`), or is being processed (`409`, the idempotency rule for a request in
/// progress; a `409` that means a state conflict costs a few harmless retries).
fn retryable_status(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
}

/// Transport failures worth another attempt: nothing was sent (connect), or the answer was
/// lost (timeout, reset). Not a request that could not even be built.
fn retryable_transport(e: &reqwest::Error) -> bool {
    !e.is_builder() && !e.is_redirect() && !e.is_decode()
}

/// A `Retry-After` in seconds (the HTTP-date form is ignored), capped.
fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

fn check_key(key: &str) -> Result<HeaderValue, ClientError> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err(ClientError::InvalidArgument(format!(
            "an idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters, got {}",
            key.len()
        )));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ClientError::InvalidArgument(
            "an idempotency key must be printable ASCII without spaces".to_owned(),
        ));
    }
    HeaderValue::from_str(key).map_err(|e| ClientError::InvalidArgument(e.to_string()))
}

/// An error and its causes on one line (reqwest's own message is only "error sending request").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

async fn decode<T: serde::de::DeserializeOwned>(
    url: &Url,
    response: reqwest::Response,
) -> Result<T, ClientError> {
    let unexpected = |detail: String| ClientError::UnexpectedResponse {
        url: url.to_string(),
        detail,
    };
    let bytes = response
        .bytes()
        .await
        .map_err(|e| unexpected(format!("cannot read the body: {}", chain(&e))))?;
    serde_json::from_slice(&bytes).map_err(|e| unexpected(format!("not the expected JSON: {e}")))
}

/// The server's `{"error": {"code", "message"}}`, or a stand-in for a body without it.
async fn api_error(url: &Url, response: reqwest::Response) -> ClientError {
    let status = response.status();
    let bytes = response.bytes().await.unwrap_or_default();
    match serde_json::from_slice::<ErrorAnswer>(&bytes) {
        Ok(ErrorAnswer { error }) => ClientError::Api {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(&bytes);
            let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let text: String = text.chars().take(200).collect();
            ClientError::Api {
                status: status.as_u16(),
                code: format!("http_{}", status.as_u16()),
                message: if text.is_empty() {
                    format!(
                        "{} from {url}",
                        status.canonical_reason().unwrap_or("error")
                    )
                } else {
                    text
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_paths_encoded() {
        assert!(matches!(
            SagaClient::new("localhost:8080", None),
            Err(ClientError::InvalidUrl(_))
        ));
        assert!(matches!(
            SagaClient::new("ftp://x", None),
            Err(ClientError::InvalidUrl(_))
        ));
        let c = SagaClient::new("http://127.0.0.1:8080/api/", None).expect("valid");
        let url = c.url(&["v1", "sagas", "a b/c"]).expect("url");
        assert_eq!(url.as_str(), "http://127.0.0.1:8080/api/v1/sagas/a%20b%2Fc");
        let c = SagaClient::new("http://127.0.0.1:8080", None).expect("valid");
        let url = c.url(&["v1", "sagas"]).expect("url");
        assert_eq!(url.as_str(), "http://127.0.0.1:8080/v1/sagas");
    }

    #[test]
    fn keys_are_checked() {
        assert!(check_key("k-1").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key("has space").is_err());
        assert!(check_key(&"x".repeat(256)).is_err());
        assert!(check_key(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn what_is_retried() {
        for s in [409, 429, 500, 502, 503, 504] {
            assert!(
                retryable_status(StatusCode::from_u16(s).expect("status")),
                "{s}"
            );
        }
        for s in [200, 202, 400, 401, 404, 413, 422] {
            assert!(
                !retryable_status(StatusCode::from_u16(s).expect("status")),
                "{s}"
            );
        }
    }

    #[test]
    fn the_token_is_not_printed() {
        let c = SagaClient::new("http://127.0.0.1:1", Some("s3cret".into())).expect("valid");
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
