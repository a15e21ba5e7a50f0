//! `example-sagas`: the example application. It links the example saga definitions, so besides
//! the operator commands of `saga` it can `serve` them (HTTP API plus engine), print the
//! participants' `ledger`, and run the `bench`mark.
//!
//! ```text
//! example-sagas serve                       # HTTP API on 127.0.0.1:8080, SQLite saga.db
//! example-sagas show 0193a4f2-…             # the same operator commands as `saga`
//! example-sagas ledger --json               # what the participants really did
//! example-sagas ledger --timings --json     # when the bank was called, when payouts ran
//! example-sagas bank --listen 127.0.0.1:8090 # the fake bank alone (SQLite bank.db)
//! example-sagas bench --sagas 2000 --concurrency 16
//! example-sagas bench-participants          # HTTP steps and callbacks beside in-process steps
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use example_sagas::bank::{BankConfig, FakeBank};
use example_sagas::bench::{self, Scenario};
use example_sagas::payout::BankLink;
use example_sagas::shop::Shop;
use orchestrator::cli::{self, AdminCommand, CliError, DatabaseArgs, LogFormat};
use orchestrator::participants::{HttpParticipant, ParticipantConfig};
use orchestrator::server::{shutdown_signal, NewFiles};
use orchestrator::store::redact_url;
use orchestrator::telemetry::Telemetry;
use orchestrator::{Orchestrator, ServeArgs};
use tokio_util::sync::CancellationToken;

/// Run and inspect the example sagas (place_order, book_trip, fulfil_order, payout).
#[derive(Debug, Parser)]
#[command(name = "example-sagas", version)]
struct Cli {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The participants' own database (inventory, payments, riders).
    #[arg(
        long,
        env = "SHOP_DATABASE_URL",
        default_value = "sqlite://shop.db",
        global = true
    )]
    shop_database_url: String,
    /// Log format on stderr (the level comes from RUST_LOG; default `info` for serve).
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API and run the engine's workers.
    Serve(Box<ServeCommand>),
    /// Print, per order, trip or payout, how many times each participant effect really happened.
    ///
    /// With --json: one object keyed by order or payout id; a `place_order` order has its six
    /// counters, a `fulfil_order` order its ledger keys, a `payout` its four counters
    /// `{"debited", "credited", "transferred", "notified"}`.
    Ledger {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Print instead what the payout participants noted on their own clock (milliseconds
        /// since the Unix epoch): every call the bank received, duplicates and failures
        /// included, and when each payout began (its first `debit_balance`) and ended (its last
        /// `notify_merchant`, or `credit_balance` when compensated). With --json:
        /// `{"bank_calls": [{"payout_id", "merchant", "at", "attempt"}…], "payouts": {"<id>":
        /// {"merchant", "debit_started_at", "notify_ended_at", "credit_ended_at"}}}`.
        #[arg(long)]
        timings: bool,
        /// The fake bank's database, whose `"transferred"` per payout id is added to the
        /// payouts' counters (default: `bank.db` beside a SQLite shop database, if it exists).
        #[arg(long, value_name = "URL")]
        bank_database: Option<String>,
    },
    /// Run the fake bank alone: `POST /transfers` answers 202 and the outcome is reported later
    /// to the caller's `Saga-Task-Url` (see the `bank` module of example-sagas for the protocol).
    Bank(BankArgs),
    /// Consume the orchestrator's events from NATS JetStream as an idempotent consumer (one
    /// notification per event, in its own database); `--ledger` prints what it recorded.
    #[cfg(feature = "nats")]
    NotifyConsumer(NotifyArgs),
    /// Run the in-process benchmark on a fresh database and print one line of figures.
    Bench(BenchArgs),
    /// Measure HTTP steps and completion by callback beside in-process steps: a 3-step saga
    /// against a participant on a loopback port, each configuration on a fresh database
    /// (unless `--database-url` names one), one line of figures per configuration.
    BenchParticipants(BenchParticipantsArgs),
    /// Measure the outbox relay to NATS JetStream: end-to-end lag with sagas in flight, then
    /// the relay's throughput on a backlog (fresh database; deletes the server's `SAGAS`
    /// stream first).
    #[cfg(feature = "nats")]
    BenchBroker {
        /// The NATS server (a scratch one: its `SAGAS` stream is deleted).
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        nats_url: String,
        /// Sagas of the live phase.
        #[arg(long, default_value_t = 5000)]
        sagas: usize,
        /// Sagas in flight.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Sagas run with the relay stopped, then published as a backlog.
        #[arg(long, default_value_t = 5000)]
        backlog: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure sagas started from NATS JetStream messages (`serve --nats-trigger`): a steady
    /// rate, with the lag from publication to the saga's creation, then as fast as the
    /// messages come (fresh database; deletes the server's `BENCH_TRIGGERS` stream first).
    #[cfg(feature = "nats")]
    BenchTriggers {
        /// The NATS server (a scratch one: its `BENCH_TRIGGERS` stream is deleted).
        #[arg(long, default_value = "nats://127.0.0.1:4222")]
        nats_url: String,
        /// Messages a second in the steady phase.
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        /// How long the steady phase publishes, in seconds.
        #[arg(long, default_value_t = 30)]
        seconds: u32,
        /// Messages published at once in the maximum-throughput phase.
        #[arg(long, default_value_t = 20_000)]
        burst: usize,
        /// Sagas driven at once.
        #[arg(long, default_value_t = 64)]
        workers: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure memory with many sagas waiting on durable retry timers (fresh database unless
    /// `--database-url` names one).
    BenchTimers {
        /// Sagas to park on a one-hour retry timer.
        #[arg(long, default_value_t = 100_000)]
        sagas: usize,
        /// Sagas started at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
    },
    /// Measure waits: memory with many sagas parked on a signal, the time from a signal to its
    /// saga's end, and how soon many sleeps that end at one instant resume (fresh database
    /// unless `--database-url` names one).
    BenchWaits {
        /// Sagas to park on a wait for a signal.
        #[arg(long, default_value_t = 100_000)]
        sagas: usize,
        /// Signals to send, one at a time, to parked sagas.
        #[arg(long, default_value_t = 1_000)]
        signals: usize,
        /// Sagas asleep until one common instant.
        #[arg(long, default_value_t = 10_000)]
        sleepers: usize,
        /// Sagas started at once, and engine workers.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
    },
    /// A helper process of a multi-process benchmark: runs the benchmark saga's engine until
    /// SIGTERM, then prints its commit count.
    #[command(hide = true)]
    BenchWorker {
        /// Engine workers.
        #[arg(long, default_value_t = 16)]
        workers: usize,
    },
    #[command(flatten)]
    Admin(AdminCommand),
}

#[derive(Debug, clap::Args)]
struct ServeCommand {
    #[command(flatten)]
    serve: ServeArgs,
    /// Also serve the benchmark saga `bench_order` (three no-op steps), for HTTP load tests.
    #[arg(long, hide = true)]
    with_bench_saga: bool,
    /// The bank `payout`'s `send_transfer` calls (`example-sagas bank`): without it, a fake bank
    /// runs in this process on a free loopback port.
    #[arg(long, env = "SAGA_BANK_URL", value_name = "URL")]
    bank_url: Option<String>,
    /// The in-process bank's own database: by default `bank.db` beside a SQLite shop
    /// database, or the shop's PostgreSQL database (its tables are named `bank_…`).
    #[arg(long, env = "SAGA_BANK_DATABASE_URL", value_name = "URL")]
    bank_database_url: Option<String>,
    /// The token the in-process bank calls back with (scope `start`); by default the server's
    /// `--api-token`.
    #[arg(
        long,
        env = "SAGA_BANK_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    bank_token: Option<String>,
}

#[cfg(feature = "nats")]
#[derive(Debug, clap::Args)]
struct NotifyArgs {
    /// The NATS server.
    #[arg(long, env = "SAGA_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The JetStream stream the orchestrator publishes to.
    #[arg(long, default_value = "SAGAS")]
    nats_stream: String,
    /// The durable consumer's name (its position survives restarts).
    #[arg(long, default_value = "notify")]
    durable: String,
    /// How long JetStream waits for an ack before delivering a message again (e.g. 30s).
    #[arg(long, default_value = "30s", value_parser = orchestrator::retention::parse_duration)]
    ack_wait: std::time::Duration,
    /// The consumer's own database: notifications and processed message ids.
    #[arg(
        long,
        env = "NOTIFY_DATABASE_URL",
        default_value = "sqlite://notify.db"
    )]
    notify_database_url: String,
    /// Print the ledger (notifications per saga, terminal events, duplicates skipped) and
    /// exit, instead of consuming.
    #[arg(long)]
    ledger: bool,
    /// With --ledger: print JSON.
    #[arg(long, requires = "ledger")]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct BankArgs {
    /// Where the bank listens.
    #[arg(long, default_value = "127.0.0.1:8090", value_name = "ADDR")]
    listen: std::net::SocketAddr,
    /// The bank's own database (created if missing).
    #[arg(
        long,
        env = "BANK_DATABASE_URL",
        default_value = "sqlite://bank.db",
        value_name = "URL"
    )]
    database: String,
    /// Sent as `Authorization: Bearer TOKEN` with every callback.
    #[arg(
        long,
        env = "BANK_CALLBACK_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    callback_token: Option<String>,
    /// How long after a transfer is accepted it settles, in milliseconds.
    #[arg(long, default_value_t = 50, value_name = "N")]
    settle_after_ms: u64,
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Sagas to measure (after a warm-up).
    #[arg(long, default_value_t = 2000)]
    sagas: usize,
    /// Sagas kept in flight.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Engine workers (default: the concurrency).
    #[arg(long)]
    workers: Option<usize>,
    /// Workload.
    #[arg(long, value_enum, default_value_t = Scenario::Happy)]
    scenario: Scenario,
    /// Orchestrator processes sharing the database (PostgreSQL only): this one plus helpers.
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// The rate limiter's rate of `--scenario rated` (`N/s`, `N/m` or `N/h`).
    #[arg(long, default_value = "2000/s")]
    rate: saga_dsl::Rate,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
    /// Export the engine's spans to this OTLP/HTTP collector while it runs.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// The share of sagas whose spans are exported, with --otlp-endpoint.
    #[arg(long, default_value_t = 1.0, value_name = "RATIO")]
    otlp_sample_ratio: f64,
}

#[derive(Debug, clap::Args)]
struct BenchParticipantsArgs {
    /// How long each configuration is measured, in seconds (after a short warm-up).
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    seconds: f64,
    /// Sagas kept in flight by the in-process and HTTP workloads, one configuration each.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64])]
    concurrency: Vec<usize>,
    /// Sagas kept in flight by the callback workload, one configuration each.
    #[arg(long, value_delimiter = ',', default_values_t = [16, 64])]
    callback_concurrency: Vec<usize>,
    /// Print the figures as JSON, one object a line.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    // `bench` runs on a fresh database unless one is named explicitly.
    let db_explicit = matches!(
        matches.value_source("database_url"),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    );
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let serving = matches!(cli.cmd, Command::Serve(_) | Command::Bank(_));
    // Made before the log, so that the spans the participants open go with the sagas' traces.
    let telemetry = match &cli.cmd {
        Command::Serve(args) => match args.serve.telemetry() {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => Telemetry::disabled(),
    };
    cli::init_tracing_with(
        cli.log_format == LogFormat::Json,
        if serving { "info" } else { "warn" },
        &telemetry,
    );
    let result = match &cli.cmd {
        Command::Serve(args) => serve(&cli, args, telemetry).await,
        Command::Ledger {
            json,
            timings,
            bank_database,
        } => ledger(&cli, *json, *timings, bank_database.as_deref()).await,
        Command::Bank(args) => bank(args).await,
        #[cfg(feature = "nats")]
        Command::NotifyConsumer(args) => notify_consumer(args).await,
        Command::Bench(args) => run_bench(&cli, args, db_explicit).await,
        Command::BenchParticipants(args) => bench_participants(&cli, args, db_explicit).await,
        Command::BenchWorker { workers } => bench_worker(&cli, *workers).await,
        #[cfg(feature = "nats")]
        Command::BenchTriggers {
            nats_url,
            rate,
            seconds,
            burst,
            workers,
            json,
        } => {
            bench_triggers(
                &cli,
                nats_url,
                [*rate, *seconds],
                [*burst, *workers],
                *json,
                db_explicit,
            )
            .await
        }
        #[cfg(feature = "nats")]
        Command::BenchBroker {
            nats_url,
            sagas,
            concurrency,
            backlog,
            json,
        } => {
            bench_broker(
                &cli,
                nats_url,
                [*sagas, *concurrency, *backlog],
                *json,
                db_explicit,
            )
            .await
        }
        Command::BenchTimers { sagas, concurrency } => {
            bench_timers(&cli, *sagas, *concurrency, db_explicit).await
        }
        Command::BenchWaits {
            sagas,
            signals,
            sleepers,
            concurrency,
        } => {
            bench_waits(
                &cli,
                [*sagas, *signals, *sleepers, *concurrency],
                db_explicit,
            )
            .await
        }
        Command::Admin(cmd) => admin(&cli, cmd).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped early (`example-sagas list | head`) is not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// Whether writing to stdout failed because its reader went away.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let kind = if let Some(cli) = cause.downcast_ref::<CliError>() {
            return cli.is_broken_pipe();
        } else if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            Some(io.kind())
        } else {
            cause
                .downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

async fn admin(cli: &Cli, cmd: &AdminCommand) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    cli::open_and_run(cmd, &cli.db.database_url, &mut out).await?;
    out.flush().map_err(CliError::Io)?;
    Ok(())
}

/// The fake bank `serve` runs without `--bank-url`: on a free loopback port, on its own
/// database (see [`ServeCommand::bank_database_url`]). Returns its URL, and the handle that
/// stops it when dropped.
async fn in_process_bank(
    args: &ServeCommand,
    database_url: &str,
) -> anyhow::Result<(String, example_sagas::bank::BankHandle)> {
    let mut config = BankConfig::new(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    config.database_url = database_url.to_owned();
    config.callback_token = args
        .bank_token
        .clone()
        .or_else(|| args.serve.api_token.clone())
        .filter(|t| !t.is_empty());
    let (addr, handle) = FakeBank::spawn(config)
        .await
        .context("cannot start the in-process bank")?;
    tracing::info!(%addr, "the fake bank runs in this process");
    Ok((format!("http://{addr}"), handle))
}

/// The in-process bank's database for a shop database: `bank.db` beside a SQLite file, the
/// same database on PostgreSQL.
fn bank_database_beside(shop_url: &str) -> String {
    match shop_url.strip_prefix("sqlite://") {
        Some(path) => {
            let path = path.split('?').next().unwrap_or(path);
            let dir = std::path::Path::new(path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            format!("sqlite://{}", dir.join("bank.db").display())
        }
        None => shop_url.to_owned(),
    }
}

async fn serve(cli: &Cli, args: &ServeCommand, telemetry: Telemetry) -> anyhow::Result<()> {
    // The participants' database is the application's own: a start that fails removes it
    // again if it was just created, as the server does with the saga log.
    let shop_files = NewFiles::before_open(&cli.shop_database_url);
    let shop = match Shop::open(&cli.shop_database_url).await {
        Ok(shop) => shop,
        Err(e) => {
            shop_files.remove();
            return Err(anyhow::Error::new(e).context(format!(
                "cannot open the participants' database {}",
                redact_url(&cli.shop_database_url)
            )));
        }
    };
    // So is the in-process bank's: a start that fails stops the bank and removes its new files.
    let bank_database = args
        .bank_database_url
        .clone()
        .unwrap_or_else(|| bank_database_beside(&cli.shop_database_url));
    let bank_files = args
        .bank_url
        .is_none()
        .then(|| NewFiles::before_open(&bank_database));
    let mut bank = None;
    let started = async {
        let bank_url = match &args.bank_url {
            Some(url) => url.clone(),
            None => {
                let (url, handle) = in_process_bank(args, &bank_database).await?;
                bank = Some(handle);
                url
            }
        };
        let participant = HttpParticipant::new(ParticipantConfig::default())?;
        let link = BankLink::http(&participant, &bank_url)?;
        let mut registry = example_sagas::registry_with_bank(Arc::new(shop), link)?;
        if args.with_bench_saga {
            registry.register(bench::bench_saga()?)?;
        }
        let server = Orchestrator::builder(registry)
            .database_url(&cli.db.database_url)
            .args(&args.serve)
            .telemetry(telemetry)
            .start()
            .await?;
        anyhow::Ok(server)
    }
    .await;
    match started {
        Ok(server) => Ok(server.wait().await?),
        Err(e) => {
            if let Some(bank) = bank.take() {
                let _ = bank.shutdown().await;
            }
            if let Some(files) = bank_files {
                files.remove();
            }
            shop_files.remove();
            Err(e)
        }
    }
}

#[cfg(feature = "nats")]
async fn notify_consumer(args: &NotifyArgs) -> anyhow::Result<()> {
    use example_sagas::notify::{consume, ConsumeConfig, NotifyStore};
    let cannot_open = || format!("cannot open {}", redact_url(&args.notify_database_url));
    if args.ledger {
        let ledger = NotifyStore::read_ledger(&args.notify_database_url)
            .await
            .with_context(cannot_open)?;
        let mut out = std::io::stdout().lock();
        if args.json {
            serde_json::to_writer_pretty(&mut out, &ledger)?;
            writeln!(out)?;
            return Ok(());
        }
        writeln!(
            out,
            "{:<36} {:<16} {:>6}  terminal",
            "saga", "name", "events"
        )?;
        for (id, saga) in &ledger.sagas {
            let terminal: Vec<String> = saga
                .terminal
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            writeln!(
                out,
                "{id:<36} {:<16} {:>6}  {}",
                saga.name,
                saga.events,
                terminal.join(" ")
            )?;
        }
        writeln!(
            out,
            "{} handled, {} duplicates skipped",
            ledger.handled, ledger.duplicates
        )?;
        return Ok(());
    }
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        let signal = shutdown_signal();
        tokio::spawn(async move {
            signal.await;
            shutdown.cancel();
        });
    }
    let store = NotifyStore::open(&args.notify_database_url)
        .await
        .with_context(cannot_open)?;
    let config = ConsumeConfig {
        nats_url: args.nats_url.clone(),
        stream: args.nats_stream.clone(),
        durable: args.durable.clone(),
        ack_wait: args.ack_wait,
    };
    println!("consuming {} from {}", args.nats_stream, args.nats_url);
    consume(&store, &config, shutdown).await?;
    Ok(())
}

async fn bank(args: &BankArgs) -> anyhow::Result<()> {
    use example_sagas::bank::{BankConfig, FakeBank};
    // A start that fails removes the bank's database again if it was just created.
    let files = NewFiles::before_open(&args.database);
    let config = BankConfig {
        database_url: args.database.clone(),
        callback_token: args.callback_token.clone(),
        settle_after: std::time::Duration::from_millis(args.settle_after_ms),
        ..BankConfig::new(args.listen)
    };
    let (addr, handle) = match FakeBank::spawn(config).await {
        Ok(started) => started,
        Err(e) => {
            files.remove();
            return Err(anyhow::Error::new(e).context(format!(
                "cannot start the bank on {}",
                redact_url(&args.database)
            )));
        }
    };
    println!("bank listening on http://{addr}");
    let _ = std::io::stdout().flush();
    handle.run_until(shutdown_signal()).await?;
    Ok(())
}

/// The bank database `ledger` reads: the one named, or `bank.db` beside a SQLite shop database
/// when that file exists.
fn bank_database_url(cli: &Cli, named: Option<&str>) -> Option<String> {
    if let Some(url) = named {
        return Some(url.to_owned());
    }
    let shop = cli
        .shop_database_url
        .strip_prefix("sqlite://")
        .or_else(|| cli.shop_database_url.strip_prefix("sqlite:"))?;
    let shop = shop.split_once('?').map_or(shop, |(path, _)| path);
    if shop.is_empty() || shop.contains(":memory:") {
        return None;
    }
    let bank = std::path::Path::new(shop).with_file_name("bank.db");
    bank.exists()
        .then(|| format!("sqlite://{}", bank.display()))
}

async fn ledger(
    cli: &Cli,
    json: bool,
    timings: bool,
    bank_database: Option<&str>,
) -> anyhow::Result<()> {
    let shop = Shop::open(&cli.shop_database_url)
        .await
        .with_context(|| format!("cannot open {}", redact_url(&cli.shop_database_url)))?;
    if timings {
        let timings = shop.payout_timings().await;
        shop.close().await;
        return payout_timings(&timings?, json);
    }
    let ledger = shop.ledger().await?;
    let fulfilments = shop.fulfilment_ledger().await?;
    let mut payouts = shop.payout_ledger().await?;
    shop.close().await;
    if let Some(url) = bank_database_url(cli, bank_database) {
        // Opened as it is: reading a ledger never creates a database.
        let bank = example_sagas::bank::BankStore::open_existing(&url)
            .await
            .with_context(|| format!("cannot open the bank's database {}", redact_url(&url)))?;
        let transferred = bank.ledger().await;
        bank.close().await;
        // The bank's transfers add to what the shop's own stand-in recorded, so that a payout
        // sent to both is seen twice.
        for (payout, entry) in transferred? {
            payouts.entry(payout).or_default().transferred += entry.transferred;
        }
    }
    let mut out = std::io::stdout().lock();
    if json {
        // One object per order or payout id: `place_order`'s six counters, `fulfil_order`'s
        // keys, or `payout`'s four counters.
        let mut all = serde_json::to_value(&ledger)?;
        for more in [
            serde_json::to_value(&fulfilments)?,
            serde_json::to_value(&payouts)?,
        ] {
            if let (Some(all), serde_json::Value::Object(more)) = (all.as_object_mut(), more) {
                all.extend(more);
            }
        }
        serde_json::to_writer_pretty(&mut out, &all)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "order", "reserved", "released", "charged", "refunded", "rider", "unassigned"
    )?;
    for (order, e) in &ledger {
        writeln!(
            out,
            "{:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}",
            order,
            e.reserved,
            e.released,
            e.charged,
            e.refunded,
            e.rider_assigned,
            e.rider_unassigned
        )?;
    }
    for (order, effects) in &fulfilments {
        let effects: Vec<String> = effects.iter().map(|(k, n)| format!("{k}={n}")).collect();
        writeln!(out, "{order:<24} {}", effects.join(" "))?;
    }
    for (payout, e) in &payouts {
        writeln!(
            out,
            "{payout:<24} debited={} credited={} transferred={} notified={}",
            e.debited, e.credited, e.transferred, e.notified
        )?;
    }
    Ok(())
}

/// Prints what `ledger --timings` shows: the bank's calls, then each payout's window.
fn payout_timings(timings: &example_sagas::shop::PayoutTimings, json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, timings)?;
        writeln!(out)?;
        return Ok(());
    }
    let at = |ms: Option<i64>| ms.map_or_else(|| "-".to_owned(), |ms| ms.to_string());
    writeln!(
        out,
        "{:<24} {:<16} {:>8} {:>15}",
        "bank call: payout", "merchant", "attempt", "at (ms)"
    )?;
    for call in &timings.bank_calls {
        writeln!(
            out,
            "{:<24} {:<16} {:>8} {:>15}",
            call.payout_id, call.merchant, call.attempt, call.at
        )?;
    }
    writeln!(
        out,
        "{:<24} {:<16} {:>15} {:>15} {:>15}",
        "payout", "merchant", "debit started", "notify ended", "credit ended"
    )?;
    for (payout, times) in &timings.payouts {
        writeln!(
            out,
            "{payout:<24} {:<16} {:>15} {:>15} {:>15}",
            times.merchant,
            at(times.debit_started_at),
            at(times.notify_ended_at),
            at(times.credit_ended_at)
        )?;
    }
    Ok(())
}

/// The database of a benchmark: the one `--database-url` names, or a fresh SQLite file at
/// `file`; with its URL and backend name.
async fn bench_store(
    cli: &Cli,
    db_explicit: bool,
    file: &std::path::Path,
) -> anyhow::Result<(
    String,
    &'static str,
    std::sync::Arc<dyn orchestrator::Store>,
)> {
    let url = if db_explicit {
        cli.db.database_url.clone()
    } else {
        format!("sqlite://{}", file.display())
    };
    let backend = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let store = orchestrator::store::open(&url)
        .await
        .with_context(|| format!("cannot open {}", redact_url(&url)))?;
    Ok((url, backend, store))
}

async fn run_bench(cli: &Cli, args: &BenchArgs, db_explicit: bool) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (url, backend, store) = bench_store(cli, db_explicit, &tmp.path().join("bench.db")).await?;
    let plan = bench::BenchPlan {
        backend: backend.to_owned(),
        url: url.clone(),
        scenario: args.scenario,
        sagas: args.sagas,
        concurrency: args.concurrency,
        workers: args.workers.unwrap_or(args.concurrency),
        processes: args.processes.max(1),
        telemetry: match &args.otlp_endpoint {
            Some(endpoint) => Telemetry::otlp(endpoint)?.with_sample_ratio(args.otlp_sample_ratio),
            None => Telemetry::disabled(),
        },
        rate: args.rate,
    };
    let report = bench::run(store, &plan).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", report.line());
    }
    Ok(())
}

async fn bench_participants(
    cli: &Cli,
    args: &BenchParticipantsArgs,
    db_explicit: bool,
) -> anyhow::Result<()> {
    use example_sagas::bench_participants::{self as bench, Workload};
    anyhow::ensure!(
        args.seconds.is_finite() && args.seconds > 0.0,
        "--seconds must be a positive number of seconds, not {}",
        args.seconds
    );
    let tmp = tempfile::tempdir()?;
    let plan = bench::Plan {
        database_url: db_explicit.then(|| cli.db.database_url.clone()),
        dir: tmp.path().to_owned(),
        measure: std::time::Duration::from_secs_f64(args.seconds),
        concurrency: args.concurrency.clone(),
        callback_concurrency: args.callback_concurrency.clone(),
    };
    let print = |line: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let json = args.json;
    let all = bench::run(&plan, |f| {
        print(if json {
            serde_json::to_string(f).unwrap_or_default()
        } else {
            f.line()
        })
    })
    .await?;
    if !json {
        for http in all.iter().filter(|f| f.workload == Workload::Http) {
            let local = all
                .iter()
                .find(|f| f.workload == Workload::InProcess && f.concurrency == http.concurrency);
            if let Some(local) = local {
                print(bench::ratio_line(http, local));
            }
        }
    }
    let errors: usize = all.iter().map(|f| f.errors).sum();
    anyhow::ensure!(errors == 0, "{errors} errors: see the figures above");
    Ok(())
}

#[cfg(feature = "nats")]
async fn bench_triggers(
    cli: &Cli,
    nats_url: &str,
    [rate, seconds]: [u32; 2],
    [burst, workers]: [usize; 2],
    json: bool,
    db_explicit: bool,
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (_, backend, store) =
        bench_store(cli, db_explicit, &tmp.path().join("triggers.db")).await?;
    let r =
        example_sagas::bench_triggers::run(store, backend, nats_url, rate, seconds, burst, workers)
            .await?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{}", r.line());
    }
    Ok(())
}

#[cfg(feature = "nats")]
async fn bench_broker(
    cli: &Cli,
    nats_url: &str,
    counts: [usize; 3],
    json: bool,
    db_explicit: bool,
) -> anyhow::Result<()> {
    let [sagas, concurrency, backlog] = counts;
    let tmp = tempfile::tempdir()?;
    let (_, backend, store) = bench_store(cli, db_explicit, &tmp.path().join("broker.db")).await?;
    let r = example_sagas::bench_broker::run(store, backend, nats_url, sagas, concurrency, backlog)
        .await?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{}", r.line());
    }
    Ok(())
}

async fn bench_worker(cli: &Cli, workers: usize) -> anyhow::Result<()> {
    let store = orchestrator::store::open(&cli.db.database_url)
        .await
        .with_context(|| format!("cannot open {}", redact_url(&cli.db.database_url)))?;
    let engine = bench::bench_engine(store.clone(), workers, false)?;
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let (signal, shutdown) = (shutdown_signal(), shutdown.clone());
        async move {
            signal.await;
            shutdown.cancel();
        }
    });
    println!("ready");
    let _ = std::io::stdout().flush();
    engine.run(shutdown).await?;
    println!("commits={}", store.commits());
    Ok(())
}

async fn bench_waits(cli: &Cli, counts: [usize; 4], db_explicit: bool) -> anyhow::Result<()> {
    let [sagas, signals, sleepers, concurrency] = counts;
    let tmp = tempfile::tempdir()?;
    let (_, backend, store) = bench_store(cli, db_explicit, &tmp.path().join("waits.db")).await?;
    let r = bench::waits(store, backend, sagas, signals, sleepers, concurrency).await?;
    println!(
        "waits backend={} parked={} park_seconds={:.1} rss_mb={:.1} waiting_read_ms={:.1} \
         signals={} signal_p50_ms={:.2} signal_p99_ms={:.2} sleepers={} sleepers_resumed_s={:.2}",
        r.backend,
        r.parked,
        r.park_seconds,
        r.rss_mb,
        r.waiting_read_ms,
        r.signals,
        r.signal_p50_ms,
        r.signal_p99_ms,
        r.sleepers,
        r.sleepers_resumed_s
    );
    Ok(())
}

async fn bench_timers(
    cli: &Cli,
    sagas: usize,
    concurrency: usize,
    db_explicit: bool,
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (_, backend, store) = bench_store(cli, db_explicit, &tmp.path().join("timers.db")).await?;
    let r = bench::timers(store, backend, sagas, concurrency).await?;
    println!(
        "timers backend={} sagas={} seconds={:.1} rss_mb={:.1} peak_rss_mb={:.1}",
        r.backend, r.sagas, r.seconds, r.rss_mb, r.peak_rss_mb
    );
    Ok(())
}
