//! The headers every request to a participant carries: the call's idempotency key, the trace
//! context, the signature over the body, the body's type, and a callback's task token.

use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use saga_dsl::{StepContext, StepError};

use crate::webhooks::{sign, SIGNATURE_HEADER};

/// The header holding the call's idempotency key, the same on every attempt.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// The header holding the task token of a call completed by callback.
pub const TASK_TOKEN_HEADER: &str = "saga-task-token";
/// The header holding the URL under which a call completed by callback is completed.
pub const TASK_URL_HEADER: &str = "saga-task-url";

/// The headers of one request of `ctx`'s call, with `body` (already serialised) if it has
/// one, signed with `secret` if there is one.
pub(crate) fn for_call(
    ctx: &StepContext,
    body: Option<&[u8]>,
    secret: Option<&str>,
) -> Result<HeaderMap, StepError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static(IDEMPOTENCY_KEY_HEADER),
        value(ctx.idempotency_key().to_string())?,
    );
    if let Some(trace) = ctx.trace() {
        headers.insert(
            HeaderName::from_static("traceparent"),
            value(trace.traceparent())?,
        );
    }
    if let Some(secret) = secret {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|t| t.as_secs() as i64)
            .unwrap_or(0);
        headers.insert(
            HeaderName::from_static(SIGNATURE_HEADER),
            value(sign(secret, now, body.unwrap_or_default()))?,
        );
    }
    if body.is_some() {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(task) = ctx.task() {
        // Both hold the token (the URL ends with it): kept out of the Debug output of the
        // request, and out of HTTP/2 header tables.
        for (name, text) in [
            (TASK_TOKEN_HEADER, task.token()),
            (TASK_URL_HEADER, task.url()),
        ] {
            let mut secret = HeaderValue::from_str(text).map_err(|_| {
                StepError::permanent(format!("the task's {name} cannot be sent in a header"))
            })?;
            secret.set_sensitive(true);
            headers.insert(HeaderName::from_static(name), secret);
        }
    }
    Ok(headers)
}

/// A header value of text this module built.
fn value(text: String) -> Result<HeaderValue, StepError> {
    HeaderValue::try_from(text)
        .map_err(|e| StepError::permanent(format!("a request header cannot be sent: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use saga_dsl::{Phase, TaskHandle, TraceContext};
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::webhooks::verify_signature;

    fn ctx(phase: Phase) -> StepContext {
        StepContext::new(
            Uuid::new_v4(),
            2,
            "reserve",
            phase,
            1,
            Arc::new(json!({})),
            Arc::new(BTreeMap::new()),
        )
    }

    fn text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
        headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn a_plain_call_carries_its_key_and_nothing_it_has_not() {
        let ctx = ctx(Phase::Action);
        let headers = for_call(&ctx, None, None).expect("headers");
        assert_eq!(
            text(&headers, "idempotency-key"),
            Some(ctx.idempotency_key().to_string().as_str())
        );
        for absent in [
            "traceparent",
            "saga-signature",
            "content-type",
            "saga-task-token",
            "saga-task-url",
        ] {
            assert!(headers.get(absent).is_none(), "{absent}");
        }
    }

    #[test]
    fn a_compensation_carries_its_own_key() {
        let ctx = ctx(Phase::Compensation);
        let headers = for_call(&ctx, None, None).expect("headers");
        let key = ctx.idempotency_key().to_string();
        assert_eq!(text(&headers, "idempotency-key"), Some(key.as_str()));
        assert_ne!(key, ctx.action_key().to_string());
    }

    #[test]
    fn the_body_is_typed_and_signed_and_the_trace_and_task_go_along() {
        let trace = TraceContext {
            trace_id: [7; 16],
            span_id: [9; 8],
            sampled: true,
        };
        let ctx = ctx(Phase::Action)
            .with_trace(trace)
            .with_task(TaskHandle::new("tok-123", "http://orch/v1/tasks/tok-123"));
        let body = br#"{"sku":"a"}"#;
        let headers = for_call(&ctx, Some(body), Some("whsec")).expect("headers");
        assert_eq!(text(&headers, "content-type"), Some("application/json"));
        assert_eq!(
            text(&headers, "traceparent"),
            Some(trace.traceparent().as_str())
        );
        let signature = text(&headers, "saga-signature").expect("a signature");
        assert!(verify_signature("whsec", signature, body, Duration::from_secs(60)).is_ok());
        assert_eq!(text(&headers, "saga-task-token"), Some("tok-123"));
        assert!(headers
            .get("saga-task-token")
            .is_some_and(|v| v.is_sensitive()));
        assert!(!format!("{headers:?}").contains("tok-123"));
        assert_eq!(
            text(&headers, "saga-task-url"),
            Some("http://orch/v1/tasks/tok-123")
        );
    }

    #[test]
    fn a_call_without_a_body_is_signed_over_nothing() {
        let headers = for_call(&ctx(Phase::Action), None, Some("s")).expect("headers");
        let signature = text(&headers, "saga-signature").expect("a signature");
        assert!(verify_signature("s", signature, b"", Duration::from_secs(60)).is_ok());
        assert!(headers.get("content-type").is_none());
    }
}
