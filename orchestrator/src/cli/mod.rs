//! The operator commands of SPEC §5 (`list`, `show`, `events`, `cancel`, `abort`, `retry`,
//! `mark-compensated`, `migrate`, `start`, `definitions`) and those of later sections (`pause`,
//! `resume`, `complete-step`, `fork`, `bulk`, `limits`), shared by the `saga` binary and
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
mod bulk;
mod commands;
mod definitions;
mod error;
mod limits;
mod remote;
mod render;
mod schedules;
mod table;
mod triggers;

use std::sync::Arc;

pub use args::DefinitionsArgs;
pub use args::{
    AbortArgs, AdminCommand, Auth, BulkArgs, BulkJobArgs, CancelArgs, CompleteStepArgs,
    DatabaseArgs, EventsArgs, ForkArgs, LimitsArgs, LimitsCommand, ListArgs, MarkCompensatedArgs,
    OutboxArgs, Output, PauseArgs, PurgeArgs, RetryArgs, Server, SetLimitArgs, ShowArgs,
    SignalArgs, StartArgs, TriggersArgs, ViaServer, WorkersArgs, DEFAULT_LIST_LIMIT,
    DEFAULT_SERVER,
};
pub use args::{
    CreateScheduleArgs, ListSchedulesArgs, ScheduleArgs, ScheduleCommand, ScheduleIdArgs,
};
pub use commands::{actor, run_admin, run_admin_with, run_signal, run_start, show_with_deliveries};
pub use definitions::run_definitions;
pub use error::CliError;
pub use remote::run_via_server;
pub use table::Layout;

#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::{self, Store};

pub(crate) use crate::logs::no_color;
pub use crate::logs::{init_tracing, init_tracing_with, LogFormat};

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
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") && !cmd.creates_database() {
        return Ok(Arc::new(SqliteStore::open_existing(url).await?));
    }
    Ok(store::open(url).await?)
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
    if let AdminCommand::Bulk(args) = cmd {
        bulk::run_bulk(args, Some(url), out).await?;
        out.flush()?;
        return Ok(());
    }
    if let AdminCommand::BulkJob(args) = cmd {
        bulk::run_bulk_job(args, Some(url), out).await?;
        out.flush()?;
        return Ok(());
    }
    if let AdminCommand::List(args) = cmd {
        if args.via.server.is_some() {
            commands::list_via_server(args, out, &Layout::for_stdout()).await?;
            out.flush()?;
            return Ok(());
        }
    }
    if let AdminCommand::Schedule(args) = cmd {
        if args.via().server.is_some() || args.needs_server() {
            schedules::run_schedule(args, None, Some(url), out, &Layout::for_stdout()).await?;
            out.flush()?;
            return Ok(());
        }
    }
    if let AdminCommand::Limits(args) = cmd {
        if args.via().server.is_some() {
            limits::run_limits(args, None, &actor(), out, &Layout::for_stdout()).await?;
            out.flush()?;
            return Ok(());
        }
        if matches!(args.command, Some(args::LimitsCommand::Set(_))) {
            eprintln!(
                "note: no --server given, so this writes the database directly; audited as {}, \
                 it reaches every process within a second",
                actor()
            );
        }
    }
    if let AdminCommand::Triggers(args) = cmd {
        if args.via.server.is_some() {
            triggers::run_triggers(args, None, out, &Layout::for_stdout()).await?;
            out.flush()?;
            return Ok(());
        }
    }
    if let Some(via) = cmd.server() {
        run_via_server(cmd, via, out).await?;
        out.flush()?;
        return Ok(());
    }
    // A fork on the database is refused (it needs a server): no note that it writes there.
    if cmd.changes_a_saga() && !matches!(cmd, AdminCommand::Fork(_)) {
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
        #[cfg(feature = "sqlite")]
        let stores = if url.starts_with("sqlite:") {
            store::Stores::sqlite(SqliteStore::open_existing(url).await?)
        } else {
            store::open_full(url).await?
        };
        #[cfg(not(feature = "sqlite"))]
        let stores = store::open_full(url).await?;
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
