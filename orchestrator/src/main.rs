//! `saga`: inspect and administer the sagas in any orchestrator database.
//!
//! ```text
//! saga list --status FAILED
//! saga show 0193a4f2-7c1e-7b3a-9d2e-5f6a7b8c9d0e
//! saga --database-url sqlite:///var/lib/shop/saga.db retry 0193a4f2-…
//! ```
//!
//! The commands are those of [`orchestrator::cli`]; running sagas needs their definitions, so
//! `serve` lives in application binaries (`example-sagas serve`). Exit status: 0 on success,
//! 1 with one `error: …` line on stderr when a command fails, 2 for a command line that does not
//! parse.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use orchestrator::cli::{self, AdminCommand, CliError, DatabaseArgs, LogFormat};

/// Inspect and administer sagas: list, show, cancel, abort, retry.
#[derive(Debug, Parser)]
#[command(name = "saga", version)]
struct Cli {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Log format on stderr (the level comes from RUST_LOG; default `warn`).
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: AdminCommand,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    cli::init_tracing(cli.log_format == LogFormat::Json, "warn");
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<CliError>()
                .is_some_and(CliError::is_broken_pipe) =>
        {
            // The reader went away (`saga list | head`): not worth a complaint.
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    cli::open_and_run(&cli.cmd, &cli.db.database_url, &mut out).await?;
    out.flush().map_err(CliError::Io)?;
    Ok(())
}

/// Help and version go to stdout with exit 0; `saga` without a command prints the help with
/// exit 2; any other parse error becomes one line on stderr and exit 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // `saga` alone: the help is the most useful answer.
        let _ = e.print();
        return ExitCode::from(2);
    }
    // clap renders the error (sometimes with a list below it), tips, then the usage: keep
    // everything before the usage, on one line.
    let rendered = e.render().to_string();
    let kept: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let joined = kept.join(" ").replace(" tip:", "; tip:");
    let message = joined.strip_prefix("error: ").unwrap_or(&joined);
    let message = if message.is_empty() {
        "invalid command line"
    } else {
        message
    };
    eprintln!("error: {} (see `saga --help`)", one_line(message));
    ExitCode::from(2)
}

/// Folds a message onto one line, whatever a database driver put in it.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
