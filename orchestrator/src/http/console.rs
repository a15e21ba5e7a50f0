//! The web console at `/ui/`: a page, its script (ES modules, by concern) and a style sheet
//! compiled into the binary (`src/http/console/`, plain files with no build step), which read
//! and steer sagas through the same HTTP API as any client, with the user's own token.
//!
//! The files hold no data, so they are served without a token; every request the console
//! makes then carries the one the user gives it. Each answer is revalidated by its `ETag`
//! (a digest of the file), and a strict content security policy lets the page load nothing
//! but these files and talk to nothing but this server.

use std::sync::LazyLock;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use crate::http::state::AppState;

/// The console's own files: path under `/ui/`, content type, contents.
const FILES: &[(&str, &str, &str)] = &[
    (
        "",
        "text/html; charset=utf-8",
        include_str!("console/index.html"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("console/console.js"),
    ),
    (
        "state.js",
        "text/javascript; charset=utf-8",
        include_str!("console/state.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("console/api.js"),
    ),
    (
        "ui.js",
        "text/javascript; charset=utf-8",
        include_str!("console/ui.js"),
    ),
    (
        "login.js",
        "text/javascript; charset=utf-8",
        include_str!("console/login.js"),
    ),
    (
        "poll.js",
        "text/javascript; charset=utf-8",
        include_str!("console/poll.js"),
    ),
    (
        "list.js",
        "text/javascript; charset=utf-8",
        include_str!("console/list.js"),
    ),
    (
        "saga.js",
        "text/javascript; charset=utf-8",
        include_str!("console/saga.js"),
    ),
    (
        "actions.js",
        "text/javascript; charset=utf-8",
        include_str!("console/actions.js"),
    ),
    (
        "bulk.js",
        "text/javascript; charset=utf-8",
        include_str!("console/bulk.js"),
    ),
    (
        "limits.js",
        "text/javascript; charset=utf-8",
        include_str!("console/limits.js"),
    ),
    (
        "schedules.js",
        "text/javascript; charset=utf-8",
        include_str!("console/schedules.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("console/console.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("console/favicon.svg"),
    ),
];

/// Nothing from elsewhere: no CDN, no inline script or style (the script sets styles through
/// the CSSOM, which the policy allows), no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// Each file's `ETag`, computed once.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(_, _, body)| {
            format!(
                "\"{}\"",
                &hex::encode(Sha256::digest(body.as_bytes()))[..16]
            )
        })
        .collect()
});

fn serve(index: usize, headers: &HeaderMap) -> Response {
    let (_, content_type, body) = FILES[index];
    let etag = &ETAGS[index];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    let common = [
        (header::ETAG, HeaderValue::from_str(etag).ok()),
        (
            header::CACHE_CONTROL,
            Some(HeaderValue::from_static("no-cache")),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            Some(HeaderValue::from_static(CSP)),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            Some(HeaderValue::from_static("nosniff")),
        ),
        (
            header::REFERRER_POLICY,
            Some(HeaderValue::from_static("no-referrer")),
        ),
    ];
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body,
        )
            .into_response()
    };
    for (name, value) in common {
        if let Some(value) = value {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The console's routes: `/ui` (redirected to `/ui/`), `/ui/` and its files.
pub(crate) fn routes() -> Router<AppState> {
    let mut router = Router::new().route("/ui", get(|| async { Redirect::permanent("/ui/") }));
    for (index, (path, _, _)) in FILES.iter().enumerate() {
        router = router.route(
            &format!("/ui/{path}"),
            get(move |headers: HeaderMap| async move { serve(index, &headers) }),
        );
    }
    router
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_referenced_by_the_page_it_serves() {
        let (_, _, index) = FILES[0];
        for (path, _, _) in &FILES[1..] {
            assert!(index.contains(path), "index.html does not load {path}");
        }
    }

    #[test]
    fn the_console_loads_nothing_from_elsewhere() {
        for (path, _, body) in FILES {
            // The SVG namespace is a name, not a place anything is loaded from.
            let rest = body.replace("http://www.w3.org/2000/svg", "");
            assert!(
                !rest.contains("http://") && !rest.contains("https://"),
                "{path} names another origin"
            );
        }
    }
}
