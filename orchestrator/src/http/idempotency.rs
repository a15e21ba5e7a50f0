//! Reading the headers of an idempotent start: `Idempotency-Key` (IETF httpapi draft "The
//! Idempotency-Key HTTP Header Field"), `Saga-Callback-Url` and `Saga-Callback-Secret`, and
//! the start's own settings, `Saga-Start-At` and `Saga-Priority`.
//!
//! The rules themselves (new key, replay, in progress, mismatch) are the engine's
//! ([`Engine::start`](crate::Engine::start)), and the store records the key in the same
//! transaction as the saga; this module only turns headers into checked values, so that a
//! malformed header is a `400` before anything is read or written.
//!
//! The key may be sent bare (`Idempotency-Key: 8e03978e-…`) or as an RFC 8941 string, as the
//! draft specifies it (`Idempotency-Key: "8e03978e-…"`); both name the same key. A bare key is
//! 1 to 255 visible ASCII characters; a quoted one may also hold spaces and `\"`, `\\`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, StatusCode};

use crate::http::auth::ClientId;
use crate::http::error::{quote, ApiError};
use crate::http::state::AppState;
use crate::model::Millis;
use crate::store::Callback;

/// The `Idempotency-Key` request header.
pub(crate) static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header that marks a replayed answer.
pub(crate) static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The request header registering a saga's callback URL.
pub(crate) static CALLBACK_URL: HeaderName = HeaderName::from_static("saga-callback-url");
/// The request header giving the callback's own signing secret.
pub(crate) static CALLBACK_SECRET: HeaderName = HeaderName::from_static("saga-callback-secret");

/// The request header of a scheduled start: an RFC 3339 instant.
pub(crate) static START_AT: HeaderName = HeaderName::from_static("saga-start-at");

/// The request header of a start's priority: one digit, 0 (last) to 9 (first).
pub(crate) static PRIORITY: HeaderName = HeaderName::from_static("saga-priority");

/// The longest key accepted (SPEC §4).
pub(crate) const MAX_KEY_LEN: usize = 255;
/// The longest callback URL accepted.
pub(crate) const MAX_URL_LEN: usize = 2048;

/// Why a key header is refused (each becomes a `400` naming the problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyError {
    /// The header appears more than once.
    #[error("send one Idempotency-Key header, not several")]
    Repeated,
    /// Empty, bare or quoted.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// Over [`MAX_KEY_LEN`].
    #[error("the Idempotency-Key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
    /// A character outside visible ASCII, or a malformed quoted string.
    #[error(
        "the Idempotency-Key must be visible ASCII characters, bare or as a quoted string \
         (RFC 8941)"
    )]
    Malformed,
}

/// Reads the `Idempotency-Key` header: `Ok(None)` when there is none.
pub(crate) fn parse_key(headers: &HeaderMap) -> Result<Option<String>, KeyError> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    let text = value.to_str().map_err(|_| KeyError::Malformed)?;
    let text = text.trim_matches([' ', '\t']);
    let key = match text.strip_prefix('"') {
        Some(rest) => parse_sf_string(rest)?,
        None => {
            if !text.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(KeyError::Malformed);
            }
            text.to_owned()
        }
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong(key.len()));
    }
    Ok(Some(key))
}

/// The rest of an RFC 8941 sf-string after its opening quote: printable ASCII, `\"` and `\\`
/// escapes, a closing quote and nothing after it.
fn parse_sf_string(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err(KeyError::Malformed),
            },
            '"' => {
                return if chars.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::Malformed)
                };
            }
            ' '..='~' => out.push(c),
            _ => return Err(KeyError::Malformed),
        }
    }
    Err(KeyError::Malformed)
}

/// Reads `Saga-Callback-Url` (and `Saga-Callback-Secret`): an absolute URL with a host that
/// the relay can deliver to (see [`crate::webhooks::check_url`]), at most 2048 characters; the secret, if any, 1 to 255 visible ASCII characters.
pub(crate) fn parse_callback(headers: &HeaderMap) -> Result<Option<Callback>, ApiError> {
    let one = |name: &HeaderName| -> Result<Option<String>, ApiError> {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(ApiError::bad_request(format!(
                "send one {name} header, not several"
            )));
        }
        let text = value.to_str().map_err(|_| {
            ApiError::bad_request(format!("the {name} header must be visible ASCII"))
        })?;
        Ok(Some(text.trim().to_owned()))
    };
    let secret = one(&CALLBACK_SECRET)?;
    let Some(url) = one(&CALLBACK_URL)? else {
        if secret.is_some() {
            // Each header is well formed (a `400` would say which is not): the pair is what
            // does not hold together, which a document's per-header schemas cannot say.
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "callback_secret_without_url",
                "Saga-Callback-Secret needs a Saga-Callback-Url to sign for: send both, or \
                 neither",
            ));
        }
        return Ok(None);
    };
    if url.len() > MAX_URL_LEN {
        return Err(ApiError::bad_request(format!(
            "the Saga-Callback-Url is longer than {MAX_URL_LEN} characters"
        )));
    }
    let parsed = crate::webhooks::check_url(&url).map_err(|e| {
        ApiError::bad_request(format!(
            "the Saga-Callback-Url {} cannot be used: {}",
            quote(&url),
            match e {
                crate::webhooks::WebhookError::InvalidUrl { reason, .. } => reason,
                other => other.to_string(),
            }
        ))
    })?;
    if let Some(secret) = &secret {
        if secret.is_empty()
            || secret.len() > MAX_KEY_LEN
            || !secret.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ApiError::bad_request(
                "the Saga-Callback-Secret must be 1 to 255 visible ASCII characters",
            ));
        }
    }
    Ok(Some(Callback {
        url: parsed.to_string(),
        secret,
    }))
}

/// Refuses a callback URL that points inside the server's network (SPEC §8).
async fn check_callback(
    policy: &crate::webhooks::CallbackPolicy,
    url: &str,
) -> Result<(), ApiError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ApiError::bad_request(format!("the Saga-Callback-Url is not a URL: {e}")))?;
    policy.check(&parsed).await.map_err(|refusal| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "callback_url_not_allowed",
            format!(
                "the Saga-Callback-Url {} is not allowed: {refusal}",
                quote(url)
            ),
        )
    })
}

/// The idempotency-related headers of a start, checked, with who sent it.
#[derive(Debug, Clone)]
pub(crate) struct StartHeaders {
    /// The key, if any.
    pub(crate) key: Option<String>,
    /// The callback, if any.
    pub(crate) callback: Option<Callback>,
    /// The client the key is scoped to.
    pub(crate) scope: String,
    /// `Saga-Start-At`, in milliseconds since the epoch.
    pub(crate) start_at: Option<Millis>,
    /// `traceparent`: the trace the saga joins.
    pub(crate) trace: Option<saga_dsl::TraceContext>,
    /// `Saga-Priority`, 0 to 9.
    pub(crate) priority: Option<u8>,
}

/// Reads `traceparent` (W3C Trace Context). As the recommendation says, a missing, repeated or
/// invalid one is ignored, never refused: the saga then starts a trace of its own.
pub(crate) fn parse_trace(headers: &HeaderMap) -> Option<saga_dsl::TraceContext> {
    let mut values = headers.get_all("traceparent").iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    crate::telemetry::parse_traceparent(value.to_str().ok()?)
}

/// Reads `Saga-Start-At`: one RFC 3339 instant (`2026-12-24T18:00:00Z`, or with an offset).
pub(crate) fn parse_start_at(headers: &HeaderMap) -> Result<Option<Millis>, ApiError> {
    let mut values = headers.get_all(&START_AT).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_request(
            "send one Saga-Start-At header, not several",
        ));
    }
    let text = value.to_str().unwrap_or_default().trim();
    crate::http::extract::rfc3339_millis(text)
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Saga-Start-At {} is not an RFC 3339 time such as 2026-12-24T18:00:00Z",
                quote(text)
            ))
        })
}

/// Reads `Saga-Priority`: one digit, 0 (last) to 9 (first), with optional white space around
/// it; anything else, or the header twice, is `400 invalid_priority`.
pub(crate) fn parse_priority(headers: &HeaderMap) -> Result<Option<u8>, ApiError> {
    let refused = |why: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_priority",
            format!("{why}: send Saga-Priority as one digit, 0 (last) to 9 (first; 5 by default)"),
        )
    };
    let mut values = headers.get_all(&PRIORITY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(refused("Saga-Priority is given more than once".to_owned()));
    }
    let text = value.to_str().unwrap_or_default().trim_matches([' ', '\t']);
    match text.as_bytes() {
        [digit @ b'0'..=b'9'] => Ok(Some(digit - b'0')),
        _ => Err(refused(format!(
            "Saga-Priority {} is not a priority",
            quote(&String::from_utf8_lossy(value.as_bytes()))
        ))),
    }
}

impl FromRequestParts<AppState> for StartHeaders {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let key = parse_key(&parts.headers).map_err(|e| ApiError::bad_request(e.to_string()))?;
        if key.is_none() && state.config.require_idempotency_key {
            return Err(ApiError::bad_request(
                "this server requires an Idempotency-Key header on every start (any unique \
                 string of 1 to 255 visible ASCII characters, reused on retries)",
            ));
        }
        let callback = parse_callback(&parts.headers)?;
        if let Some(callback) = &callback {
            check_callback(&state.config.callbacks, &callback.url).await?;
        }
        let start_at = parse_start_at(&parts.headers)?;
        let priority = parse_priority(&parts.headers)?;
        let scope = parts
            .extensions
            .get::<ClientId>()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| ClientId::ANONYMOUS.to_owned());
        Ok(Self {
            key,
            callback,
            scope,
            start_at,
            trace: parse_trace(&parts.headers),
            priority,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn key(values: &[&str]) -> Result<Option<String>, KeyError> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                &IDEMPOTENCY_KEY,
                HeaderValue::from_str(v).expect("header value"),
            );
        }
        parse_key(&h)
    }

    #[test]
    fn reads_bare_and_quoted_keys() {
        assert_eq!(key(&[]), Ok(None));
        assert_eq!(key(&["abc-1"]), Ok(Some("abc-1".into())));
        assert_eq!(key(&["\"abc-1\""]), Ok(Some("abc-1".into())));
        assert_eq!(key(&[" \"a b\" "]), Ok(Some("a b".into())));
        assert_eq!(key(&[r#""q\"x\\""#]), Ok(Some(r#"q"x\"#.into())));
        assert_eq!(key(&[&"k".repeat(255)]), Ok(Some("k".repeat(255))));
    }

    #[test]
    fn refuses_bad_keys() {
        assert_eq!(key(&[""]), Err(KeyError::Empty));
        assert_eq!(key(&["\"\""]), Err(KeyError::Empty));
        assert_eq!(key(&[&"k".repeat(256)]), Err(KeyError::TooLong(256)));
        assert_eq!(key(&["a b"]), Err(KeyError::Malformed));
        assert_eq!(key(&["\"abc"]), Err(KeyError::Malformed));
        assert_eq!(key(&["\"abc\"x"]), Err(KeyError::Malformed));
        assert_eq!(key(&[r#""a\n""#]), Err(KeyError::Malformed));
        assert_eq!(key(&["a", "b"]), Err(KeyError::Repeated));
        let mut h = HeaderMap::new();
        h.insert(
            &IDEMPOTENCY_KEY,
            HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque bytes"),
        );
        assert_eq!(parse_key(&h), Err(KeyError::Malformed));
    }

    #[test]
    fn reads_one_digit_priorities() {
        let priority = |values: &[&[u8]]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(&PRIORITY, HeaderValue::from_bytes(v).expect("header value"));
            }
            parse_priority(&h).map_err(|e| e.code())
        };
        assert_eq!(priority(&[]), Ok(None));
        assert_eq!(priority(&[b"0"]), Ok(Some(0)));
        assert_eq!(priority(&[b" 9\t"]), Ok(Some(9)));
        for bad in [&b""[..], b"10", b"-1", b"+5", b"5.0", b"five", b"\xc3\xa9"] {
            assert_eq!(priority(&[bad]), Err("invalid_priority"), "{bad:?}");
        }
        assert_eq!(priority(&[b"1", b"2"]), Err("invalid_priority"));
    }

    #[test]
    fn reads_callbacks() {
        let mut h = HeaderMap::new();
        assert!(matches!(parse_callback(&h), Ok(None)));
        h.insert(&CALLBACK_URL, HeaderValue::from_static("ftp://x/"));
        assert!(parse_callback(&h).is_err());
        h.insert(&CALLBACK_URL, HeaderValue::from_static("not a url"));
        assert!(parse_callback(&h).is_err());
        h.insert(
            &CALLBACK_URL,
            HeaderValue::from_static("http://hooks.example/x?y=1"),
        );
        let cb = parse_callback(&h).expect("valid").expect("present");
        assert_eq!(cb.url, "http://hooks.example/x?y=1");
        h.remove(&CALLBACK_URL);
        h.insert(&CALLBACK_SECRET, HeaderValue::from_static("s"));
        assert!(parse_callback(&h).is_err(), "a secret needs a URL");
    }
}
