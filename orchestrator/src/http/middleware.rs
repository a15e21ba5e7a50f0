//! Cross-cutting concerns as `axum::middleware::from_fn` functions: the request id and timeout
//! around every request, and the guarantee that every error answer has the API's JSON shape.
//! Authentication (`auth.rs`) and the request counter (`metrics.rs`) are further layers in
//! `router`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::http::prefer::granted_wait;
use crate::http::HttpConfig;

/// The request-id header: read from the request when a proxy set a sane one, else generated;
/// always sent back.
pub(crate) static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A request id taken from a client is used only when it is short and plain, so it can go into
/// logs and a response header unescaped.
fn acceptable_request_id(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    let plain = !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    plain.then(|| text.to_owned())
}

/// Gives the request an id, runs everything inside a tracing span that carries it (so errors
/// logged deeper, such as a store failure, name the request), enforces
/// [`HttpConfig::request_timeout`], and returns the id in `x-request-id`.
///
/// A request that asks to wait (`Prefer: wait=N`) gets the granted wait on top of the timeout,
/// so the timeout always exceeds the wait and only cuts work that is really stuck.
pub(crate) async fn request_context(
    State(config): State<Arc<HttpConfig>>,
    req: Request,
    next: Next,
) -> Response {
    let id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(acceptable_request_id)
        .unwrap_or_else(|| Uuid::new_v4().to_string());
    let span = tracing::info_span!(
        "http_request",
        request_id = %id,
        method = %req.method(),
        path = %logged_path(req.uri().path()),
    );
    let timeout =
        config.request_timeout + granted_wait(req.headers(), config.max_wait).unwrap_or_default();
    let outcome = tokio::time::timeout(timeout, next.run(req))
        .instrument(span.clone())
        .await;
    let mut response = match outcome {
        Ok(response) => response,
        // The handler's future is dropped here: a store transaction in flight rolls back, or
        // has committed (a saga may exist). A client retries with an idempotency key.
        Err(_) => span.in_scope(|| {
            ApiError::unavailable(
                format!(
                    "the request did not finish within {} ms; retry later",
                    timeout.as_millis()
                ),
                None,
            )
            .into_response()
        }),
    };
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID.clone(), value);
    }
    response
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// Rewrites any error answer that is not JSON (a tower layer's `413`, a rejection some future
/// extractor forgot to map) into `{"error": {"code", "message"}}`, keeping its status and
/// headers such as `Allow`. Handlers' own errors are JSON already and pass untouched.
pub(crate) async fn json_errors(
    State(config): State<Arc<HttpConfig>>,
    req: Request,
    next: Next,
) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&response) {
        return response;
    }
    let (parts, _body) = response.into_parts();
    let mut fresh = ApiError::from_status(status, config.body_limit).into_response();
    let own: Vec<HeaderName> = fresh.headers().keys().cloned().collect();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_LENGTH && !own.contains(name) {
            fresh.headers_mut().append(name.clone(), value.clone());
        }
    }
    fresh
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    use axum::Router;
    use tower::ServiceExt;

    use super::*;

    fn app(config: HttpConfig) -> Router {
        let config = Arc::new(config);
        Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
            .route(
                "/teapot",
                get(|| async { (StatusCode::IM_A_TEAPOT, "short and stout") }),
            )
            .layer(axum::middleware::from_fn_with_state(
                config.clone(),
                json_errors,
            ))
            .layer(axum::middleware::from_fn_with_state(
                config,
                request_context,
            ))
    }

    async fn call(app: Router, path: &str) -> (StatusCode, HeaderMap, serde_json::Value) {
        let req = Request::get(path).body(Body::empty()).expect("request");
        let res = app.oneshot(req).await.expect("infallible");
        let (parts, body) = res.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.expect("body");
        let value = serde_json::from_slice(&bytes).expect("a JSON body");
        (parts.status, parts.headers, value)
    }

    #[tokio::test]
    async fn slow_requests_time_out_with_a_json_503() {
        let config = HttpConfig {
            request_timeout: Duration::from_millis(20),
            ..HttpConfig::default()
        };
        let (status, headers, body) = call(app(config), "/slow").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["code"], "unavailable");
        assert_eq!(headers[header::RETRY_AFTER], "1");
        assert!(headers.contains_key(&REQUEST_ID));
    }

    #[tokio::test]
    async fn a_wait_extends_the_timeout() {
        let config = HttpConfig {
            request_timeout: Duration::from_millis(20),
            ..HttpConfig::default()
        };
        let app = app(config);
        let req = Request::get("/slow")
            .header("prefer", "wait=1")
            .body(Body::empty())
            .expect("request");
        // 5 s of work against 20 ms + 1 s: still cut, but only after the wait.
        let started = std::time::Instant::now();
        let res = app.oneshot(req).await.expect("infallible");
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn plain_text_errors_become_json() {
        let (status, headers, body) = call(app(HttpConfig::default()), "/teapot").await;
        assert_eq!(status, StatusCode::IM_A_TEAPOT);
        assert!(body["error"]["message"].is_string(), "{body}");
        assert!(headers.contains_key(&REQUEST_ID));
    }

    #[test]
    fn request_ids_from_clients_must_be_plain() {
        let ok = HeaderValue::from_static("req-42.a_b:c");
        assert_eq!(acceptable_request_id(&ok).as_deref(), Some("req-42.a_b:c"));
        for bad in ["", "a b", "<script>", &"x".repeat(200)] {
            let v = HeaderValue::from_str(bad).ok();
            assert!(
                v.as_ref().and_then(acceptable_request_id).is_none(),
                "{bad}"
            );
        }
    }
}

/// The path as a log line shows it: a task token (SPEC §16) is a secret, so the routes under
/// `/v1/tasks/` show its place, not the token.
pub(crate) fn logged_path(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/v1/tasks/") {
        Some(rest) => {
            let action = rest.split_once('/').map_or("", |(_, action)| action);
            std::borrow::Cow::Owned(format!("/v1/tasks/{{token}}/{action}"))
        }
        None => std::borrow::Cow::Borrowed(path),
    }
}

#[cfg(test)]
mod logged_path_tests {
    use super::logged_path;

    #[test]
    fn a_task_token_never_reaches_the_log_line() {
        assert_eq!(
            logged_path("/v1/tasks/0123abcd/complete"),
            "/v1/tasks/{token}/complete"
        );
        assert_eq!(logged_path("/v1/tasks/0123abcd"), "/v1/tasks/{token}/");
        assert_eq!(logged_path("/v1/sagas/abc"), "/v1/sagas/abc");
    }
}
