//! The log set-up of every binary built on the orchestrator: the `saga` command line and
//! servers made with `Orchestrator::builder`.

/// How diagnostics are written to stderr (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Installs the process's tracing subscriber: logs on stderr, the level from `RUST_LOG` or else
/// `default_filter` (`"warn"`, `"info"`), one JSON object per line when `json`.
///
/// Colour codes are written only when stderr is a terminal and `NO_COLOR` is unset, so logs
/// redirected to a file or collected by a supervisor stay plain text. Every binary built on the
/// orchestrator (the `saga` CLI, application binaries) should call this once, first thing.
/// Does nothing if a subscriber is already installed.
pub fn init_tracing(json: bool, default_filter: &str) {
    init_tracing_with(
        json,
        default_filter,
        &crate::telemetry::Telemetry::disabled(),
    );
}

/// [`init_tracing`], and, when `telemetry` exports spans, the layer that exports the spans an
/// application's steps open through `tracing` with them
/// (`Telemetry::tracing_layer`, with the `otel` feature).
pub fn init_tracing_with(
    json: bool,
    default_filter: &str,
    telemetry: &crate::telemetry::Telemetry,
) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};

    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = std::io::stderr().is_terminal() && !no_color();
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi && !json);
    let logs = if json {
        logs.json().boxed()
    } else {
        logs.boxed()
    };
    // The log level filters the log alone: the spans steps open are exported at INFO and
    // above whatever the log shows.
    // An error means a subscriber is already set (a test harness, an embedding application).
    let registry = tracing_subscriber::registry();
    #[cfg(feature = "otel")]
    let registry = registry.with(telemetry.tracing_layer());
    #[cfg(not(feature = "otel"))]
    let _ = telemetry;
    let _ = registry.with(logs.with_filter(filter)).try_init();
}

/// Whether the user asked for no colour (<https://no-color.org>: `NO_COLOR` set and not empty).
pub(crate) fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}
