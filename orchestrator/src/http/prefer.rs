//! `Prefer: wait=N` (RFC 7240 §4.3): a client asks the server to hold a request up to N seconds
//! for the saga to end, instead of polling.
//!
//! Preferences are hints: a malformed or unknown one is ignored, never an error (RFC 7240 §2),
//! and the server caps the wait at [`HttpConfig::max_wait`](crate::http::HttpConfig::max_wait).
//! The response says what was applied in `Preference-Applied: wait=N`, and carries
//! `Vary: Prefer` because its status depends on the header.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

use crate::http::state::AppState;

/// The `Prefer` request header (RFC 7240).
pub(crate) static PREFER: HeaderName = HeaderName::from_static("prefer");
/// The `Preference-Applied` response header (RFC 7240).
pub(crate) static PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// The `wait` preference of a request, if any, in whole seconds as the client sent it (not yet
/// capped). Only the first `wait` counts, as RFC 7240 asks; `wait=0` means "do not wait".
pub(crate) fn requested_wait(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all(&PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|preference| {
            // `token [BWS "=" BWS word] *(";" parameter)`: only the head matters here.
            let head = preference.split(';').next().unwrap_or_default();
            let (name, value) = head.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            value.parse::<u64>().ok()
        })
        .filter(|&secs| secs > 0)
}

/// The wait the server grants: the request's `wait`, capped at `max`.
pub(crate) fn granted_wait(headers: &HeaderMap, max: Duration) -> Option<Duration> {
    requested_wait(headers)
        .map(|secs| Duration::from_secs(secs).min(max))
        .filter(|d| !d.is_zero())
}

/// A request's granted `Prefer: wait`, as an extractor (never rejects).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait(pub(crate) Option<Duration>);

impl FromRequestParts<AppState> for Wait {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(Wait(granted_wait(&parts.headers, state.config.max_wait)))
    }
}

/// The headers of an answer to a request that asked to wait: what was applied, and that the
/// answer varies with `Prefer`.
pub(crate) fn applied_headers(wait: Duration) -> [(HeaderName, HeaderValue); 2] {
    let applied = HeaderValue::from_str(&format!("wait={}", wait.as_secs()))
        .unwrap_or_else(|_| HeaderValue::from_static("wait"));
    [
        (PREFERENCE_APPLIED.clone(), applied),
        (header::VARY, HeaderValue::from_static("prefer")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&PREFER, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    #[test]
    fn reads_the_wait_preference() {
        assert_eq!(requested_wait(&headers(&[])), None);
        assert_eq!(requested_wait(&headers(&["wait=5"])), Some(5));
        assert_eq!(requested_wait(&headers(&["WAIT = 7"])), Some(7));
        assert_eq!(requested_wait(&headers(&["wait=\"9\""])), Some(9));
        assert_eq!(
            requested_wait(&headers(&["respond-async, wait=10"])),
            Some(10)
        );
        assert_eq!(
            requested_wait(&headers(&["return=minimal", "wait=3;foo=bar"])),
            Some(3)
        );
        // The first `wait` wins; bad values and zero are ignored, not errors.
        assert_eq!(requested_wait(&headers(&["wait=2, wait=8"])), Some(2));
        assert_eq!(requested_wait(&headers(&["wait=soon"])), None);
        assert_eq!(requested_wait(&headers(&["wait=-1"])), None);
        assert_eq!(requested_wait(&headers(&["wait=0"])), None);
        assert_eq!(requested_wait(&headers(&["waiting=4"])), None);
        assert_eq!(
            requested_wait(&headers(&["wait=99999999999999999999999"])),
            None
        );
    }

    #[test]
    fn the_grant_is_capped() {
        let max = Duration::from_secs(60);
        assert_eq!(
            granted_wait(&headers(&["wait=600"]), max),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            granted_wait(&headers(&["wait=5"]), max),
            Some(Duration::from_secs(5))
        );
        assert_eq!(granted_wait(&headers(&["wait=5"]), Duration::ZERO), None);
    }
}
