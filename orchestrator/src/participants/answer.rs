//! How a participant's answer becomes a step's result (SPEC §16): `2xx` succeeds with the
//! body's JSON; `408`, `429`, `5xx` and failures to get an answer are worth another attempt
//! with the same key, not before a `Retry-After`; any other status is final.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use reqwest::{Response, StatusCode, Url};
use saga_dsl::StepError;
use serde_json::Value;

use crate::webhooks::CallbackRefusal;

/// The most of a body a failure's message carries, in bytes.
pub(crate) const EXCERPT_BYTES: usize = 512;

/// The largest `2xx` answer read, in bytes: a step's output is held to what an operator's
/// completion of it may carry ([`crate::operations::MAX_OUTPUT`]), and a participant cannot
/// make the engine read without end.
pub(crate) const MAX_ANSWER_BYTES: usize = crate::operations::MAX_OUTPUT;

/// The longest `Retry-After` honoured: a participant cannot hold a saga back for longer at a
/// time (its retry policy still bounds the attempts).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// An action's output: the JSON of a `2xx` answer (`null` for an empty body), or the error
/// its status or body calls for.
pub(crate) async fn output(mut response: Response) -> Result<Value, StepError> {
    let status = response.status();
    if !status.is_success() {
        return Err(failure(response).await);
    }
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let too_large = || {
        StepError::permanent(format!(
            "{}: the answer is over {} bytes, the most a step's output may be",
            describe(status),
            MAX_ANSWER_BYTES
        ))
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    loop {
        // The answer was given: a body cut short is an answer lost, worth another attempt.
        let chunk = response.chunk().await.map_err(|e| {
            StepError::retryable(format!(
                "{}: reading the answer failed: {}",
                describe(status),
                crate::webhooks::error_chain(&e)
            ))
        })?;
        let Some(chunk) = chunk else { break };
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    parse_output(status, content_type.as_deref(), &body)
}

/// A compensation's result: any `2xx` answer undid it, whatever its body.
pub(crate) async fn acknowledged(response: Response) -> Result<(), StepError> {
    if response.status().is_success() {
        Ok(())
    } else {
        Err(failure(response).await)
    }
}

/// The output of a `2xx` answer with `body`.
fn parse_output(
    status: StatusCode,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Value, StepError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    let not_json = |why: String| {
        StepError::permanent(format!(
            "{}: the answer is not JSON ({why}): {}",
            describe(status),
            excerpt(body)
        ))
    };
    if let Some(ct) = content_type.filter(|ct| !is_json(ct)) {
        return Err(not_json(format!("content type {ct}")));
    }
    serde_json::from_slice(body).map_err(|e| {
        let ct = content_type.unwrap_or("no content type");
        not_json(format!("content type {ct}, {e}"))
    })
}

/// Whether a media type is JSON: `application/json` or a `+json` type, any parameters aside.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// The error a non-`2xx` answer calls for, with the start of its body.
async fn failure(mut response: Response) -> StepError {
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    // Only as much as the message keeps: an error page may be large, or never end.
    while body.len() <= EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    classify(status, &headers, &body, SystemTime::now())
}

/// The error of an answer with `status`, `headers` and (the start of) `body`, received at `now`.
fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8], now: SystemTime) -> StepError {
    let mut message = describe(status);
    if status.is_redirection() {
        let location = headers
            .get(LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        message.push_str(", a redirect, not followed");
        if let Some(location) = location {
            message.push_str(&format!(" (to {})", excerpt(location.as_bytes())));
        }
    }
    let excerpt = excerpt(body);
    if !excerpt.is_empty() {
        message.push_str(": ");
        message.push_str(&excerpt);
    }
    let retryable = status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error();
    if !retryable {
        return StepError::permanent(message);
    }
    match retry_after(headers, now) {
        Some(delay) => StepError::retry_after(delay, message),
        None => StepError::retryable(message),
    }
}

/// `HTTP 503 Service Unavailable`.
fn describe(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

/// The wait a `Retry-After` header asks for at `now`, in either form: delta-seconds, or an
/// HTTP-date (IMF-fixdate, the form senders must use). `None` without one, for one that cannot
/// be read, or for a date already past; capped at [`MAX_RETRY_AFTER`].
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(text).ok()?;
            let at = SystemTime::from(at);
            at.duration_since(now).ok()?
        }
    };
    (!delay.is_zero()).then_some(delay.min(MAX_RETRY_AFTER))
}

/// At most [`EXCERPT_BYTES`] of `body` as one line of text, cut on a character boundary
/// (marked `…`), control characters as spaces.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES + 4)]);
    let line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.len() <= EXCERPT_BYTES && body.len() <= EXCERPT_BYTES + 4 {
        return line;
    }
    let mut cut = EXCERPT_BYTES - '…'.len_utf8();
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &line[..cut])
}

/// The error of a request that got no answer: retried with the same key, except a host that
/// the client refused to connect to, which no retry changes.
pub(crate) fn transport(e: &reqwest::Error, url: &Url) -> StepError {
    if let Some(refusal) = cause::<CallbackRefusal>(e) {
        if matches!(refusal, CallbackRefusal::Internal { .. }) {
            return super::endpoint::refused(url, refusal);
        }
    }
    let origin = url.origin().ascii_serialization();
    if e.is_builder() {
        return StepError::permanent(format!(
            "the request to {origin} cannot be built: {}",
            crate::webhooks::error_chain(e)
        ));
    }
    if e.is_timeout() {
        return StepError::retryable(format!("the request to {origin} timed out"));
    }
    StepError::retryable(format!(
        "the request to {origin} failed: {}",
        crate::webhooks::error_chain(e)
    ))
}

/// The first error of type `E` among `e` and its causes.
fn cause<'a, E: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("a header value"));
        }
        map
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).expect("a status")
    }

    #[test]
    fn timeouts_rate_limits_and_server_errors_are_retried_and_the_rest_is_final() {
        let none = HeaderMap::new();
        for code in [408, 429, 500, 502, 503, 504] {
            let e = classify(status(code), &none, b"", SystemTime::now());
            assert!(e.is_retryable(), "{code}: {e}");
        }
        for code in [300, 301, 302, 307, 400, 401, 403, 404, 409, 410, 422] {
            let e = classify(status(code), &none, b"", SystemTime::now());
            assert!(!e.is_retryable(), "{code}: {e}");
        }
    }

    #[test]
    fn the_message_names_the_status_and_carries_the_body() {
        let e = classify(
            status(503),
            &HeaderMap::new(),
            b"database\nrestarting\n",
            SystemTime::now(),
        );
        assert_eq!(
            e.message(),
            "HTTP 503 Service Unavailable: database restarting"
        );
        let e = classify(status(404), &HeaderMap::new(), b"", SystemTime::now());
        assert_eq!(e.message(), "HTTP 404 Not Found");
        let e = classify(
            status(302),
            &headers(&[("location", "http://10.0.0.1/")]),
            b"",
            SystemTime::now(),
        );
        assert_eq!(
            e.message(),
            "HTTP 302 Found, a redirect, not followed (to http://10.0.0.1/)"
        );
    }

    #[test]
    fn retry_after_is_read_in_both_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let at = |text: &str| retry_after(&headers(&[("retry-after", text)]), now);
        assert_eq!(at("1"), Some(Duration::from_secs(1)));
        assert_eq!(at(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(
            at("Sun, 06 Nov 1994 08:50:07 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(at("Sun, 06 Nov 1994 08:49:00 GMT"), None, "a date past");
        assert_eq!(at("0"), None);
        assert_eq!(at("soon"), None);
        assert_eq!(at("99999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
        let e = classify(
            status(429),
            &headers(&[("retry-after", "2")]),
            b"slow down",
            now,
        );
        assert_eq!(
            e,
            StepError::retry_after(
                Duration::from_secs(2),
                "HTTP 429 Too Many Requests: slow down"
            )
        );
    }

    #[test]
    fn an_excerpt_is_bounded_and_cut_on_a_character_boundary() {
        assert_eq!(excerpt(b"  short  "), "short");
        let long = "é".repeat(600);
        let cut = excerpt(long.as_bytes());
        assert!(cut.len() <= EXCERPT_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
        let exact = "a".repeat(EXCERPT_BYTES);
        assert_eq!(excerpt(exact.as_bytes()), exact);
        // Bytes that are not UTF-8 are replaced, not refused.
        assert_eq!(excerpt(&[b'o', b'k', 0xff]), "ok\u{fffd}");
    }

    #[test]
    fn a_success_is_its_json_or_null_and_anything_else_is_final() {
        let ok = StatusCode::OK;
        assert_eq!(
            parse_output(ok, Some("application/json"), br#"{"id":7}"#),
            Ok(serde_json::json!({"id": 7}))
        );
        assert_eq!(
            parse_output(ok, Some("application/problem+json; charset=utf-8"), b"[1]"),
            Ok(serde_json::json!([1]))
        );
        assert_eq!(
            parse_output(StatusCode::NO_CONTENT, None, b""),
            Ok(Value::Null)
        );
        assert_eq!(parse_output(ok, Some("text/plain"), b""), Ok(Value::Null));
        assert_eq!(parse_output(ok, None, b"true"), Ok(Value::Bool(true)));
        let e = parse_output(ok, Some("text/html"), b"<p>hi</p>").expect_err("not JSON");
        assert!(!e.is_retryable());
        assert_eq!(
            e.message(),
            "HTTP 200 OK: the answer is not JSON (content type text/html): <p>hi</p>"
        );
        let e = parse_output(ok, Some("application/json"), b"{oops").expect_err("not JSON");
        assert!(!e.is_retryable());
        assert!(
            e.message().starts_with(
                "HTTP 200 OK: the answer is not JSON (content type application/json, "
            ),
            "{}",
            e.message()
        );
    }
}
