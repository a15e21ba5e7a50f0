//! Where a call goes: a URL given when the step is declared (trusted), or one built from the
//! saga's data for each call (checked under the callback-safety rules, SPEC §8).

use std::sync::Arc;

use reqwest::Url;
use saga_dsl::{StepContext, StepError};

use super::{Inner, ParticipantError};
use crate::webhooks::{self, CallbackRefusal, WebhookError};

/// Builds a call's URL from the saga's data.
pub(crate) type UrlFn = dyn Fn(&StepContext) -> Result<String, StepError> + Send + Sync;

/// The URL of a call.
#[derive(Clone)]
pub(crate) enum Endpoint {
    /// From configuration: trusted as given.
    Fixed(Url),
    /// Built from the saga's data: checked before each request, and again as the client
    /// resolves its host.
    FromData(Arc<UrlFn>),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed(url) => f.debug_tuple("Fixed").field(&url.as_str()).finish(),
            Self::FromData(_) => f.write_str("FromData"),
        }
    }
}

/// `url` parsed, when it is an absolute `http` or `https` URL with a host; else what is wrong
/// with it.
fn parse(url: &str) -> Result<Url, String> {
    webhooks::check_url(url).map_err(|e| match e {
        WebhookError::InvalidUrl { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// A URL from configuration, parsed.
pub(crate) fn check_fixed(url: &str) -> Result<Url, ParticipantError> {
    parse(url).map_err(|reason| ParticipantError::InvalidUrl {
        url: url.to_owned(),
        reason,
    })
}

impl Endpoint {
    /// The URL of this call and the client that may send to it.
    pub(crate) fn resolve<'a>(
        &self,
        ctx: &StepContext,
        inner: &'a Inner,
    ) -> Result<(Url, &'a reqwest::Client), StepError> {
        match self {
            Self::Fixed(url) => Ok((url.clone(), &inner.trusted)),
            Self::FromData(build) => {
                let text = build(ctx)?;
                let url = parse(&text).map_err(|reason| {
                    StepError::permanent(format!(
                        "the participant URL {text:?} built from the saga's data is not usable: \
                         {reason}"
                    ))
                })?;
                // Names are checked as the guarded client resolves them; a literal address
                // is never resolved, so it is checked here.
                inner
                    .allowed
                    .check_literal(&url)
                    .map_err(|refusal| refused(&url, &refusal))?;
                Ok((url, &inner.guarded))
            }
        }
    }
}

/// The permanent error of a call whose URL, built from the saga's data, names an internal
/// host that was not allowed.
pub(crate) fn refused(url: &Url, refusal: &CallbackRefusal) -> StepError {
    let why = match refusal {
        CallbackRefusal::Internal { host, addr, kind } => format!(
            "its host {host} is {addr}, an internal address ({kind}), which the participant \
             client does not allow"
        ),
        other => other.to_string(),
    };
    StepError::permanent(format!(
        "the participant URL {url} built from the saga's data is refused: {why}"
    ))
}
