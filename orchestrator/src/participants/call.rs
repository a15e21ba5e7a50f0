//! One request to a participant, declared once and made on every attempt of an action or a
//! compensation.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;
use saga_dsl::{Action, Compensation, StepContext, StepError};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::Endpoint;
use super::{answer, headers, Inner};

/// Builds a request's body from the saga's data, serialised.
type BodyFn = dyn Fn(&StepContext) -> Result<Vec<u8>, StepError> + Send + Sync;

/// A request to a participant: an [`Action`] whose output is the answer's JSON, and a
/// [`Compensation`] that succeeds on any `2xx`. Built by an
/// [`HttpParticipant`](super::HttpParticipant); cheap to clone.
#[derive(Clone)]
pub struct HttpCall {
    inner: Arc<Inner>,
    method: Method,
    endpoint: Endpoint,
    body: Option<Arc<BodyFn>>,
    headers: HeaderMap,
}

impl std::fmt::Debug for HttpCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCall")
            .field("method", &self.method)
            .field("endpoint", &self.endpoint)
            .field("body", &self.body.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpCall {
    pub(super) fn new(inner: Arc<Inner>, method: Method, endpoint: Endpoint) -> Self {
        Self {
            inner,
            method,
            endpoint,
            body: None,
            headers: HeaderMap::new(),
        }
    }

    /// Sends a JSON body that `body` builds from the saga's input and earlier outputs (in a
    /// compensation, `ctx.action_output()` and `ctx.action_key()` find what the action did).
    /// An error it returns fails the call as it says. Without a body builder, the request has
    /// no body.
    pub fn body<F, B>(mut self, body: F) -> Self
    where
        F: Fn(&StepContext) -> Result<B, StepError> + Send + Sync + 'static,
        B: Serialize,
    {
        let body: Arc<BodyFn> = Arc::new(move |ctx| {
            serde_json::to_vec(&body(ctx)?).map_err(|e| {
                StepError::permanent(format!("the request body is not serialisable: {e}"))
            })
        });
        self.body = Some(body);
        self
    }

    /// Sends `name: value` with every request (an `Authorization`, say), besides the headers
    /// every call carries, which take precedence.
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Makes the request for one attempt of `ctx`'s call and returns the answer, whatever its
    /// status.
    async fn send(&self, ctx: &StepContext) -> Result<reqwest::Response, StepError> {
        let (url, client) = self.endpoint.resolve(ctx, &self.inner)?;
        let body = self.body.as_ref().map(|build| build(ctx)).transpose()?;
        let mut headers = self.headers.clone();
        headers.extend(headers::for_call(
            ctx,
            body.as_deref(),
            self.inner.secret.as_deref(),
        )?);
        let mut request = client
            .request(self.method.clone(), url.clone())
            .headers(headers);
        if let Some(body) = body {
            request = request.body(body);
        }
        request
            .send()
            .await
            .map_err(|e| answer::transport(&e, &url))
    }
}

#[async_trait]
impl Action for HttpCall {
    async fn run(&self, ctx: StepContext) -> Result<Value, StepError> {
        answer::output(self.send(&ctx).await?).await
    }
}

#[async_trait]
impl Compensation for HttpCall {
    async fn run(&self, ctx: StepContext) -> Result<(), StepError> {
        answer::acknowledged(self.send(&ctx).await?).await
    }
}
