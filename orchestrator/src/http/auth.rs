//! Bearer-token authentication (SPEC §4): when [`HttpConfig::api_token`] is set, every `/v1`
//! endpoint and `/metrics` need `Authorization: Bearer <token>`; `/healthz` and
//! `/openapi.json` stay open so that load balancers and tooling need no secret.
//!
//! The check runs before the request body is read and before any handler, so a refused request
//! creates nothing. Tokens are compared as SHA-256 digests in constant time: hashing first makes
//! the comparison independent of the presented token's length, and `subtle` keeps it
//! independent of where the first differing byte is.
//!
//! Every request that passes carries a [`ClientId`] in its extensions, so that per-client state
//! (idempotency keys, later) can be scoped to who sent it.
//!
//! [`HttpConfig::api_token`]: crate::http::HttpConfig::api_token

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::http::error::ApiError;
use crate::http::tokens::{ApiToken, Scope};

/// Who sent a request, as far as authentication can tell; found in the request's extensions
/// (`Extension<ClientId>` in a handler).
///
/// With a token configured, a request that presented it is [`ClientId::TOKEN`]; without one
/// (or on an open endpoint without credentials) it is [`ClientId::ANONYMOUS`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientId(pub String);

impl ClientId {
    /// The client of a server without a token, or of an open endpoint.
    pub const ANONYMOUS: &'static str = "anonymous";
    /// The client that presented the configured API token.
    pub const TOKEN: &'static str = "token";

    fn anonymous() -> Self {
        Self(Self::ANONYMOUS.to_owned())
    }

    /// The identity as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the caller of a request may do: the scopes of its token, or every scope when the API
/// is open. Found in the request's extensions beside its [`ClientId`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallerScopes {
    /// The scopes, as its token grants them.
    pub(crate) scopes: Vec<Scope>,
    /// Whether the server asks for tokens at all.
    pub(crate) auth_required: bool,
}

/// One accepted token, kept only as its digest, with its name and scopes.
#[derive(Clone)]
struct Known {
    digest: [u8; 32],
    name: String,
    scopes: Vec<Scope>,
}

impl Known {
    fn allows(&self, scope: Scope) -> bool {
        crate::http::tokens::grants(&self.scopes, scope)
    }
}

/// The accepted tokens; none leaves the API open.
#[derive(Clone)]
pub(crate) struct Auth {
    known: Vec<Known>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.known.iter().map(|k| k.name.as_str()).collect();
        f.debug_struct("Auth").field("tokens", &names).finish()
    }
}

impl Auth {
    /// Authentication with the single `token` (every scope, named [`ClientId::TOKEN`]) and the
    /// named `tokens`; with neither (or an empty single token) it is off.
    pub(crate) fn new(token: Option<&str>, tokens: &[ApiToken]) -> Self {
        let single = token.filter(|t| !t.is_empty()).map(|t| Known {
            digest: digest(t.as_bytes()),
            name: ClientId::TOKEN.to_owned(),
            scopes: vec![Scope::Admin],
        });
        let named = tokens.iter().map(|t| Known {
            digest: digest(t.secret.as_bytes()),
            name: t.name.clone(),
            scopes: t.scopes.clone(),
        });
        Self {
            known: single.into_iter().chain(named).collect(),
        }
    }

    /// The token `presented` is, if any: every known digest is compared, in constant time,
    /// so the time taken says nothing about which token (or which byte) matched.
    fn find(&self, presented: &str) -> Option<&Known> {
        let presented = digest(presented.as_bytes());
        let mut found = None;
        for known in &self.known {
            if bool::from(known.digest.ct_eq(&presented)) {
                found = Some(known);
            }
        }
        found
    }
}

/// Whether `presented` is the token whose digest is `expected`, in constant time.
#[cfg(test)]
fn token_matches(expected: &[u8; 32], presented: &str) -> bool {
    bool::from(expected.ct_eq(&digest(presented.as_bytes())))
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The scope a request needs, from its method and route: reads need `read`; starting,
/// signalling and cancelling need `start`; the operator commands (bulk actions and changes of
/// a limit too) need `operate`. An unknown
/// route, and `GET /v1/whoami` (any token may ask what it may do), need only a valid token.
fn required_scope(method: &Method, route: Option<&str>) -> Option<Scope> {
    if route == Some("/v1/whoami") {
        return None;
    }
    if method == Method::GET || method == Method::HEAD {
        return Some(Scope::Read);
    }
    let route = route?;
    if route.starts_with("/v1/tasks/") {
        // A participant's report for its own call, like a signal.
        return Some(Scope::Start);
    }
    if route.ends_with("/abort")
        || route.ends_with("/retry")
        || route.ends_with("/mark-compensated")
        || route == "/v1/bulk"
        || route.ends_with("/pause")
        || route.ends_with("/resume")
        || route.ends_with("/complete")
        || route.ends_with("/fork")
        || route.starts_with("/v1/limits")
        || route.starts_with("/v1/schedules")
    {
        Some(Scope::Operate)
    } else if route.starts_with("/v1/sagas") {
        Some(Scope::Start)
    } else {
        None
    }
}

/// Whether a path needs the token: `/v1` and everything under it (unknown routes included, so
/// that routes cannot be probed without it), and `/metrics`.
fn protected(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || path == "/metrics"
}

/// What the `Authorization` header holds.
enum Credentials<'a> {
    None,
    /// A bearer token (the scheme name is case-insensitive, RFC 7235 §2.1).
    Bearer(&'a str),
    /// Something else: another scheme, or a value that is not text.
    Malformed,
}

fn credentials(headers: &HeaderMap) -> Credentials<'_> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Credentials::None;
    };
    let Ok(text) = value.to_str() else {
        return Credentials::Malformed;
    };
    match text.trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            let token = token.trim();
            if token.is_empty() {
                Credentials::Malformed
            } else {
                Credentials::Bearer(token)
            }
        }
        _ => Credentials::Malformed,
    }
}

/// `401 unauthorized` with `WWW-Authenticate: Bearer` (RFC 6750 §3).
fn unauthorized(presented: bool) -> Response {
    let (message, challenge) = if presented {
        (
            "the bearer token is not valid for this server",
            r#"Bearer realm="saga-orchestrator", error="invalid_token""#,
        )
    } else {
        (
            "this endpoint needs a bearer token: send Authorization: Bearer <token> \
             (the server's --api-token, or one of its --api-tokens-file)",
            r#"Bearer realm="saga-orchestrator""#,
        )
    };
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}

/// `403 forbidden`: a valid token without the scope the request needs.
fn forbidden(known: &Known, needed: Scope) -> Response {
    let has: Vec<&str> = known.scopes.iter().map(|s| s.as_str()).collect();
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "the token {:?} has the scopes [{}]; this request needs {needed:?}",
            known.name,
            has.join(", "),
            needed = needed.as_str()
        ),
    )
    .into_response()
}

/// The authentication layer: refuses a protected request without a known token (`401`) or
/// whose token lacks the route's scope (`403`), and records the [`ClientId`] (the token's
/// name) of every request it lets through.
pub(crate) async fn authenticate(
    State(auth): State<Arc<Auth>>,
    mut req: Request,
    next: Next,
) -> Response {
    if auth.known.is_empty() {
        req.extensions_mut().insert(ClientId::anonymous());
        req.extensions_mut().insert(CallerScopes {
            scopes: vec![Scope::Admin],
            auth_required: false,
        });
        return next.run(req).await;
    }
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str());
    let path_protected = protected(req.uri().path()) || route.is_some_and(protected);
    let known = match credentials(req.headers()) {
        Credentials::Bearer(token) => auth.find(token),
        _ => None,
    };
    let scopes = known.map(|k| k.scopes.clone()).unwrap_or_default();
    let client = match known {
        Some(known) => {
            if path_protected {
                if let Some(needed) = required_scope(req.method(), route) {
                    if !known.allows(needed) {
                        return forbidden(known, needed);
                    }
                }
            }
            ClientId(known.name.clone())
        }
        None if path_protected => {
            let presented = !matches!(credentials(req.headers()), Credentials::None);
            return unauthorized(presented);
        }
        None => ClientId::anonymous(),
    };
    req.extensions_mut().insert(client);
    req.extensions_mut().insert(CallerScopes {
        scopes,
        auth_required: true,
    });
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(authorization).expect("header value"),
        );
        h
    }

    #[test]
    fn reads_bearer_credentials() {
        assert!(matches!(credentials(&HeaderMap::new()), Credentials::None));
        assert!(matches!(
            credentials(&headers("Bearer abc")),
            Credentials::Bearer("abc")
        ));
        assert!(matches!(
            credentials(&headers("bearer   abc ")),
            Credentials::Bearer("abc")
        ));
        assert!(matches!(
            credentials(&headers("Basic YTpi")),
            Credentials::Malformed
        ));
        assert!(matches!(
            credentials(&headers("Bearer ")),
            Credentials::Malformed
        ));
        assert!(matches!(
            credentials(&headers("abc")),
            Credentials::Malformed
        ));
    }

    #[test]
    fn compares_tokens_by_digest() {
        let auth = Auth::new(Some("s3cret"), &[]);
        let expected = auth.known[0].digest;
        assert!(token_matches(&expected, "s3cret"));
        assert!(!token_matches(&expected, "s3cre"));
        assert!(!token_matches(&expected, "s3cret "));
        assert!(!token_matches(&expected, ""));
        assert!(
            Auth::new(Some(""), &[]).known.is_empty(),
            "empty token = off"
        );
        let named = Auth::new(None, &[ApiToken::new("ci", &[Scope::Read], "s3cret-ci")]);
        assert_eq!(named.find("s3cret-ci").map(|k| k.name.as_str()), Some("ci"));
        assert!(named.find("s3cret").is_none());
        assert!(!format!("{named:?}").contains("s3cret"));
        assert!(!format!("{auth:?}").contains("s3cret"));
    }

    /// A router that answers with the `ClientId` the layer recorded.
    fn app(token: Option<&str>) -> axum::Router {
        use axum::routing::get;
        use axum::Extension;
        let who = |Extension(c): Extension<ClientId>| async move { c.0 };
        axum::Router::new()
            .route("/v1/who", get(who))
            .route("/healthz", get(who))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(Auth::new(token, &[])),
                authenticate,
            ))
    }

    async fn call(app: axum::Router, path: &str, auth: Option<&str>) -> (StatusCode, String) {
        use tower::ServiceExt;
        let mut req = axum::http::Request::get(path);
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let res = app
            .oneshot(req.body(axum::body::Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn requests_carry_their_client_id() {
        let (s, who) = call(app(Some("t")), "/v1/who", Some("Bearer t")).await;
        assert_eq!((s, who.as_str()), (StatusCode::OK, ClientId::TOKEN));
        let (s, _) = call(app(Some("t")), "/v1/who", Some("Bearer x")).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, who) = call(app(Some("t")), "/healthz", None).await;
        assert_eq!((s, who.as_str()), (StatusCode::OK, ClientId::ANONYMOUS));
        let (s, who) = call(app(None), "/v1/who", None).await;
        assert_eq!((s, who.as_str()), (StatusCode::OK, ClientId::ANONYMOUS));
    }

    #[test]
    fn each_route_needs_its_scope() {
        let post = Method::POST;
        assert_eq!(
            required_scope(&Method::GET, Some("/v1/sagas/{saga}")),
            Some(Scope::Read)
        );
        assert_eq!(required_scope(&Method::GET, None), Some(Scope::Read));
        assert_eq!(
            required_scope(&post, Some("/v1/sagas/{saga}")),
            Some(Scope::Start)
        );
        assert_eq!(
            required_scope(&post, Some("/v1/sagas/{saga}/cancel")),
            Some(Scope::Start)
        );
        assert_eq!(
            required_scope(&post, Some("/v1/sagas/{saga}/signals/{signal}")),
            Some(Scope::Start)
        );
        for operate in [
            "/v1/sagas/{saga}/abort",
            "/v1/sagas/{saga}/retry",
            "/v1/sagas/{saga}/steps/{step}/mark-compensated",
            "/v1/sagas/{saga}/pause",
            "/v1/sagas/{saga}/resume",
            "/v1/sagas/{saga}/steps/{step}/complete",
            "/v1/sagas/{saga}/fork",
        ] {
            assert_eq!(required_scope(&post, Some(operate)), Some(Scope::Operate));
        }
        assert_eq!(
            required_scope(&Method::PUT, Some("/v1/limits/{name}")),
            Some(Scope::Operate)
        );
        assert_eq!(
            required_scope(&Method::GET, Some("/v1/limits")),
            Some(Scope::Read)
        );
        for operate in [
            "/v1/schedules",
            "/v1/schedules/{id}/pause",
            "/v1/schedules/{id}/resume",
            "/v1/schedules/{id}/trigger",
        ] {
            assert_eq!(required_scope(&post, Some(operate)), Some(Scope::Operate));
        }
        assert_eq!(
            required_scope(&Method::DELETE, Some("/v1/schedules/{id}")),
            Some(Scope::Operate)
        );
        for read in ["/v1/schedules", "/v1/schedules/{id}"] {
            assert_eq!(required_scope(&Method::GET, Some(read)), Some(Scope::Read));
        }
        assert_eq!(required_scope(&post, None), None);
    }

    #[test]
    fn protects_v1_and_metrics_only() {
        for p in [
            "/v1",
            "/v1/sagas",
            "/v1/sagas/x/cancel",
            "/v1/nope",
            "/metrics",
        ] {
            assert!(protected(p), "{p}");
        }
        for p in ["/healthz", "/openapi.json", "/v10", "/metricsx", "/"] {
            assert!(!protected(p), "{p}");
        }
    }
}
