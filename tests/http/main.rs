//! The HTTP API over real loopback sockets, as a client sees it, one module per resource:
//! sagas (start, read, list, events, cancel), signals, the health check, auth, the OpenAPI document,
//! metrics, `Prefer: wait`, the typed client with `saga start`, saga id prefixes, and malformed
//! requests. Every
//! error is JSON `{"error": {"code", "message"}}`.
//!
//! Most tests talk to one server shared by the whole binary ([`shared`]), so their sagas live
//! side by side: such a test looks only at its own sagas. A test that needs another
//! configuration (a token, a body limit, a shorter `max_wait`), counts or lists every saga of
//! its database, or stops its server starts one of its own ([`own`]). Both run on the backend
//! `SAGA_TEST_BACKEND` selects. The `client` tests also run the workspace's binaries:
//! `cargo build --workspace --bins` first.
//!
//! Regenerate the committed `docs/openapi.json` with
//! `UPDATE_OPENAPI=1 cargo test -p saga-suite --test http openapi::`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod client;
mod console;
mod contract;
mod health;
mod malformed;
mod metrics;
mod openapi;
mod operators;
mod prefer_wait;
mod prefixes;
mod sagas;
mod signals;

use std::sync::OnceLock;
use std::time::Duration;

use orchestrator::http::HttpConfig;
use reqwest::StatusCode;
use saga_dsl::SagaDefinition;
use saga_suite::api::{Api, Harness, SharedServer};
use saga_suite::{fixtures, registry_of, Journal};
use serde_json::Value;

/// The token of the servers that have one.
const TOKEN: &str = "test-token-0123456789";

/// The definitions every server of this binary knows (from `saga_suite::fixtures`): `s`, three
/// steps that succeed; `fails`, whose `b` fails so `a` is compensated; `flaky`, whose `a` fails
/// once (retryable); `typed`, with the `Order` input; `slow`, a 1.5 s step then a pivot (a
/// cancel while it runs, a `Prefer: wait` shorter than it); `slow_pivot`, a 600 ms pivot first
/// (a cancel once it has started is refused); `stuck`, a step that takes ten minutes;
/// `approval`, a wait for the signal `approval` between two steps; `stuck_undo`, whose
/// compensation takes ten minutes (an operator marks it compensated).
fn definitions() -> Vec<SagaDefinition> {
    let journal = Journal::default();
    vec![
        fixtures::succeeds(&journal),
        fixtures::fails(&journal),
        fixtures::flaky(&journal),
        fixtures::typed(),
        fixtures::slow(Duration::from_millis(1500)),
        fixtures::slow_pivot(Duration::from_millis(600)),
        fixtures::stuck(),
        fixtures::approval(),
        fixtures::stuck_undo(),
    ]
}

/// A client of the server the tests of this binary share: the default configuration, no
/// token. Started by the first test that asks for it, it runs until the binary exits.
fn shared() -> Api {
    static SERVER: OnceLock<SharedServer> = OnceLock::new();
    SERVER
        .get_or_init(|| SharedServer::start(|| registry_of(definitions()), HttpConfig::default()))
        .api()
}

/// A server of the test's own, on a fresh database, configured by `config`.
async fn own(config: HttpConfig) -> Api {
    Harness::new(registry_of(definitions()))
        .await
        .into_api(config)
        .await
}

/// The configuration of a server that wants [`TOKEN`].
fn with_token() -> HttpConfig {
    HttpConfig {
        api_token: Some(TOKEN.to_owned()),
        ..HttpConfig::default()
    }
}

/// Asserts the API's error shape and returns the message.
fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) -> String {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{body}");
    message.to_owned()
}
