//! The operator commands of SPEC §5 (`list`, `show`, `events`, `cancel`, `abort`, `retry`,
//! `mark-compensated`, `migrate`, `start`, `definitions`), shared by the `saga` binary and
//! application binaries. `start` and `definitions` go through a server's HTTP API
//! ([`run_start`], [`run_definitions`]) and open no database.
//!
//! The commands are plain data ([`AdminCommand`], parsed by clap) and one function,
//! [`run_admin`], that runs one against any [`Store`] and writes to any [`std::io::Write`]:
//! tests drive it with a `Vec<u8>`, binaries with stdout. An application binary that also runs
//! the server embeds the same commands in its own parser:
//!
//! ```
//! use clap::{Parser, Subcommand};
//! use orchestrator::cli::{self, AdminCommand, DatabaseArgs};
//! use orchestrator::{Orchestrator, ServeArgs};
//! # use saga_dsl::Registry;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     db: DatabaseArgs,
//!     #[command(subcommand)]
//!     cmd: Command,
//! }
//!
//! #[derive(Subcommand)]
//! enum Command {
//!     /// Run the HTTP API and the engine.
//!     Serve(ServeArgs),
//!     #[command(flatten)]
//!     Admin(AdminCommand),
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("saga.db").display());
//! # let registry = Registry::new();
//! // `my-app migrate` here; `Cli::parse()` in a real binary.
//! let args = Cli::parse_from(["my-app", "--database-url", &url, "migrate"]);
//! match &args.cmd {
//!     Command::Serve(serve) => {
//!         Orchestrator::builder(registry)
//!             .database_url(&args.db.database_url)
//!             .args(serve)
//!             .serve()
//!             .await?
//!     }
//!     Command::Admin(cmd) => {
//!         cli::open_and_run(cmd, &args.db.database_url, &mut std::io::stdout()).await?
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every command but `migrate` refuses to create a database: a mistyped path answers
//! "database … does not exist" instead of listing an empty, freshly created log.

mod address;
mod args;
mod commands;
mod definitions;
mod error;
mod remote;
mod render;
mod table;

use std::sync::Arc;

pub use args::DefinitionsArgs;
pub use args::{
    AbortArgs, AdminCommand, Auth, CancelArgs, DatabaseArgs, EventsArgs, ListArgs,
    MarkCompensatedArgs, OutboxArgs, Output, PurgeArgs, RetryArgs, Server, ShowArgs, SignalArgs,
    StartArgs, ViaServer, WorkersArgs, DEFAULT_LIST_LIMIT, DEFAULT_SERVER,
};
pub use commands::{actor, run_admin, run_admin_with, run_signal, run_start, show_with_deliveries};
pub use definitions::run_definitions;
pub use error::CliError;
pub use remote::run_via_server;
pub use table::Layout;

use crate::store::{self, SqliteStore, Store};

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
/// ([`Telemetry::tracing_layer`](crate::telemetry::Telemetry::tracing_layer)).
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
    let _ = tracing_subscriber::registry()
        .with(telemetry.tracing_layer())
        .with(logs.with_filter(filter))
        .try_init();
}

/// Whether the user asked for no colour (<https://no-color.org>: `NO_COLOR` set and not empty).
pub(crate) fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// Opens the store a command needs: an existing database for every command but `migrate`, which
/// creates an SQLite file if it is missing. Opening applies pending migrations.
///
/// `start` needs no store (see [`AdminCommand::needs_database`]): asking for one is an error,
/// rather than opening (or creating) a database for nothing. [`open_and_run`] handles it.
pub async fn open_store_for(cmd: &AdminCommand, url: &str) -> Result<Arc<dyn Store>, CliError> {
    if !cmd.needs_database() {
        return Err(CliError::BadArgument(
            "this command works through the HTTP API and opens no database".to_owned(),
        ));
    }
    if url.starts_with("sqlite:") && !cmd.creates_database() {
        Ok(Arc::new(SqliteStore::open_existing(url).await?))
    } else {
        Ok(store::open(url).await?)
    }
}

/// Opens the database `url` names as [`open_store_for`] does and runs the command on it: the
/// whole of an admin subcommand, for binaries. `start`, `definitions` and `signal` run without
/// opening anything: they ask the server given by `--server` or `SAGA_SERVER`, else the one
/// whose address was written beside the database `url` ([`crate::discovery`]), else the
/// default.
///
/// `out` is taken to be standard output: tables fit its width and are coloured if it is a
/// terminal ([`Layout::for_stdout`]).
pub async fn open_and_run(
    cmd: &AdminCommand,
    url: &str,
    out: &mut impl std::io::Write,
) -> Result<(), CliError> {
    if let AdminCommand::Start(args) = cmd {
        run_start(args, Some(url), out).await?;
        out.flush()?;
        return Ok(());
    }
    if let AdminCommand::Definitions(args) = cmd {
        run_definitions(args, Some(url), out).await?;
        out.flush()?;
        return Ok(());
    }
    if let AdminCommand::Signal(args) = cmd {
        run_signal(args, Some(url), out).await?;
        out.flush()?;
        return Ok(());
    }
    if let Some(via) = cmd.server() {
        run_via_server(cmd, via, out).await?;
        out.flush()?;
        return Ok(());
    }
    if cmd.changes_a_saga() {
        // Said on stderr, so that what the command prints stays the same for scripts. Going
        // through a server stays a choice (it needs the server's token): a server found
        // running on the database is only pointed out.
        let running = crate::discovery::read_address(url)
            .map(|(server, _)| {
                format!(
                    "; a server of this database listens at {server}: --server {server} goes \
                     through it"
                )
            })
            .unwrap_or_default();
        eprintln!(
            "note: no --server given, so this writes the database directly (meant for a server \
             that is down), audited as {}{running}",
            actor()
        );
    }
    if let AdminCommand::Show(args) = cmd {
        // `show` also lists the saga's webhook deliveries, which live outside the step log.
        let stores = if url.starts_with("sqlite:") {
            store::Stores::sqlite(SqliteStore::open_existing(url).await?)
        } else {
            store::open_full(url).await?
        };
        show_with_deliveries(
            args,
            stores.log.as_ref(),
            stores.outbox.as_ref(),
            out,
            &Layout::for_stdout(),
        )
        .await?;
        out.flush()?;
        return Ok(());
    }
    let store = open_store_for(cmd, url).await?;
    run_admin_with(cmd, store.as_ref(), out, &Layout::for_stdout()).await?;
    out.flush()?;
    Ok(())
}
