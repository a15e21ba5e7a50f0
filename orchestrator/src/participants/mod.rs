//! Participants over HTTP: a step's action or compensation declared as a request to a service
//! (SPEC §16).
//!
//! An [`HttpParticipant`] is a client shared by the steps that call one participant (or
//! several): it holds the signing secret, the hosts that URLs built from a saga's data may
//! reach although they are internal, and the HTTP clients. Each of its requests is an
//! [`HttpCall`], which is both a [`saga_dsl::Action`] and a [`saga_dsl::Compensation`]:
//!
//! ```no_run
//! use orchestrator::participants::{HttpParticipant, ParticipantConfig};
//! use saga_dsl::{SagaDefinition, Step};
//! use serde_json::json;
//!
//! # fn main() -> anyhow::Result<()> {
//! let stock = HttpParticipant::new(ParticipantConfig::default())?;
//! let saga = SagaDefinition::builder("order", 1)
//!     .step(Step::compensatable(
//!         "reserve",
//!         stock
//!             .post("http://stock.internal/reserve")?
//!             .body(|ctx| Ok(json!({"sku": ctx.raw_input()["sku"]}))),
//!         stock
//!             .post("http://stock.internal/release")?
//!             .body(|ctx| Ok(json!({"reservation": ctx.action_key()}))),
//!     ))
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! # What a request carries
//!
//! `Idempotency-Key` (the call's own key: a compensation's differs from its action's, which
//! the body builder finds in `ctx.action_key()`), `traceparent` when the saga has a trace,
//! `Saga-Signature` over the body as webhooks are signed (when the client has a secret),
//! `Content-Type: application/json` with a body, and for a step completed by callback
//! `Saga-Task-Token` and `Saga-Task-Url`. The token is a secret: nothing here logs it.
//!
//! # How the answer is read
//!
//! `2xx` succeeds, its JSON the action's output (no body is `null`); `408`, `429`, `5xx`,
//! connection errors and the client's own timeouts are retried with the same key, not before a
//! `Retry-After`; any other status fails permanently, `3xx` included, since a redirect is not
//! followed (it could point inside the network). A failure's message names the status and
//! carries the start of the answer's body (at most 512 bytes), as in `HTTP 503 Service
//! Unavailable: database is restarting`: the attempt log keeps it.
//!
//! # Where a request may go
//!
//! A URL given when the step is declared ([`HttpParticipant::request`]) is configuration and
//! trusted, as an operator's `--webhook-url` is. A URL built from the saga's data
//! ([`HttpParticipant::request_to`]) is not: under the callback-safety rules of SPEC §8, a host
//! that is or resolves to an internal address is refused, permanently, unless the
//! configuration allows it ([`ParticipantConfig::allowed`]), and the check is made again as the
//! client connects, against DNS rebinding ([`crate::webhooks::guard`]).

mod answer;
mod call;
mod endpoint;
mod headers;

use std::sync::Arc;
use std::time::Duration;

pub use call::HttpCall;
pub use headers::{IDEMPOTENCY_KEY_HEADER, TASK_TOKEN_HEADER, TASK_URL_HEADER};
/// The HTTP method of a request; header names and values for [`HttpCall::header`].
pub use reqwest::{header, Method};

use crate::webhooks::guard::GuardedResolver;
use crate::webhooks::CallbackPolicy;
use endpoint::{Endpoint, UrlFn};

/// Settings of an [`HttpParticipant`]. Build one with struct-update syntax:
/// `ParticipantConfig { secret: Some(secret), ..ParticipantConfig::default() }`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ParticipantConfig {
    /// Signs every request's body (`Saga-Signature`, as webhooks are signed); `None` sends
    /// them unsigned.
    pub secret: Option<String>,
    /// Which internal hosts a URL built from a saga's data may reach. URLs given when the
    /// step is declared are trusted and not checked.
    pub allowed: CallbackPolicy,
    /// How long connecting may take; `None` for [`DEFAULT_CONNECT_TIMEOUT`]. A connection that
    /// is not made in time is retried.
    pub connect_timeout: Option<Duration>,
    /// How long a whole request may take, a timeout of the client's own, retried; `None` for
    /// none but the step's, past which the engine records the outcome as unknown (and retries
    /// it with the same key).
    pub timeout: Option<Duration>,
}

/// The connect timeout of a [`ParticipantConfig`] that sets none.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for ParticipantConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParticipantConfig")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("allowed", &self.allowed)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why a participant client or one of its calls could not be declared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParticipantError {
    /// A URL given when a step is declared is not an absolute `http` or `https` URL.
    #[error("participant URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (the cause is in the message).
    #[error("cannot build the participant HTTP client: {0}")]
    Client(reqwest::Error),
}

/// A client of participants over HTTP, shared by the steps that call them. Cheap to clone.
#[derive(Clone)]
pub struct HttpParticipant {
    inner: Arc<Inner>,
}

/// What every call of a participant client shares.
pub(crate) struct Inner {
    /// Sends to URLs given when a step is declared.
    pub(crate) trusted: reqwest::Client,
    /// Sends to URLs built from a saga's data: refuses to resolve a name to an internal
    /// address.
    pub(crate) guarded: reqwest::Client,
    pub(crate) allowed: CallbackPolicy,
    pub(crate) secret: Option<String>,
}

impl std::fmt::Debug for HttpParticipant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpParticipant")
            .field("allowed", &self.inner.allowed)
            .field("signed", &self.inner.secret.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpParticipant {
    /// A client with `config`'s secret, allowed hosts and timeouts.
    pub fn new(config: ParticipantConfig) -> Result<Self, ParticipantError> {
        let builder = || {
            let connect = config.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
            let builder = reqwest::Client::builder()
                .use_rustls_tls()
                .connect_timeout(connect)
                // A participant cannot send the orchestrator elsewhere, inside the network
                // least of all.
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!(
                    "saga-orchestrator-participants/",
                    env!("CARGO_PKG_VERSION")
                ));
            match config.timeout {
                Some(timeout) => builder.timeout(timeout),
                None => builder,
            }
        };
        let trusted = builder().build().map_err(ParticipantError::Client)?;
        let guarded = builder()
            .dns_resolver(Arc::new(GuardedResolver::new(Arc::new(
                config.allowed.clone(),
            ))))
            // A proxy would resolve the name itself, out of the resolver's sight.
            .no_proxy()
            .build()
            .map_err(ParticipantError::Client)?;
        Ok(Self {
            inner: Arc::new(Inner {
                trusted,
                guarded,
                allowed: config.allowed,
                secret: config.secret,
            }),
        })
    }

    /// A `method` request to `url`, a URL from configuration, trusted as given. Fails when
    /// `url` is not an absolute `http` or `https` URL.
    pub fn request(&self, method: Method, url: &str) -> Result<HttpCall, ParticipantError> {
        let url = endpoint::check_fixed(url)?;
        Ok(HttpCall::new(
            self.inner.clone(),
            method,
            Endpoint::Fixed(url),
        ))
    }

    /// A `method` request to the URL `url` builds from the saga's data, checked before each
    /// request under the callback-safety rules (see the [module](self) documentation). An
    /// error `url` returns fails the call as it says; a URL that does not parse, or whose host
    /// is internal and not allowed, fails it permanently.
    pub fn request_to<F>(&self, method: Method, url: F) -> HttpCall
    where
        F: Fn(&saga_dsl::StepContext) -> Result<String, saga_dsl::StepError>
            + Send
            + Sync
            + 'static,
    {
        let url: Arc<UrlFn> = Arc::new(url);
        HttpCall::new(self.inner.clone(), method, Endpoint::FromData(url))
    }

    /// A `GET` request to a URL from configuration; see [`request`](Self::request).
    pub fn get(&self, url: &str) -> Result<HttpCall, ParticipantError> {
        self.request(Method::GET, url)
    }

    /// A `POST` request to a URL from configuration; see [`request`](Self::request).
    pub fn post(&self, url: &str) -> Result<HttpCall, ParticipantError> {
        self.request(Method::POST, url)
    }

    /// A `PUT` request to a URL from configuration; see [`request`](Self::request).
    pub fn put(&self, url: &str) -> Result<HttpCall, ParticipantError> {
        self.request(Method::PUT, url)
    }

    /// A `PATCH` request to a URL from configuration; see [`request`](Self::request).
    pub fn patch(&self, url: &str) -> Result<HttpCall, ParticipantError> {
        self.request(Method::PATCH, url)
    }

    /// A `DELETE` request to a URL from configuration; see [`request`](Self::request).
    pub fn delete(&self, url: &str) -> Result<HttpCall, ParticipantError> {
        self.request(Method::DELETE, url)
    }
}
