//! `example-sagas`: the example application. It links the example saga definitions, so besides
//! the operator commands of `saga` it can `serve` them (HTTP API plus engine), print the
//! participants' `ledger`, and run the `bench`mark.
//!
//! ```text
//! example-sagas serve                       # HTTP API on 127.0.0.1:8080, SQLite saga.db
//! example-sagas show 0193a4f2-…             # the same operator commands as `saga`
//! example-sagas ledger --json               # what the participants really did
//! example-sagas bench --sagas 2000 --concurrency 16
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use example_sagas::bench::{self, Scenario};
use example_sagas::shop::Shop;
use orchestrator::cli::{self, AdminCommand, CliError, DatabaseArgs};
use orchestrator::http::{self, HttpConfig};
use orchestrator::webhooks::{Relay, WebhookConfig};
use orchestrator::{Engine, EngineConfig};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Run and inspect the example sagas (place_order, book_trip).
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API and run the engine's workers.
    Serve(ServeArgs),
    /// Print, per order, how many times each participant effect really happened.
    Ledger {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run the in-process benchmark on a fresh database and print one line of figures.
    Bench(BenchArgs),
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
struct ServeArgs {
    /// Also serve the benchmark saga `bench_order` (three no-op steps), for HTTP load tests.
    #[arg(long, hide = true)]
    with_bench_saga: bool,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080", env = "SAGA_LISTEN")]
    listen: String,
    /// Sagas driven at once by this process.
    #[arg(long, default_value_t = 32, env = "SAGA_WORKERS")]
    workers: usize,
    /// Seconds a lease lasts without a heartbeat.
    #[arg(long, default_value_t = 30)]
    lease_ttl_secs: u64,
    /// Failed attempts of a compensation after which the saga is flagged as needing attention.
    #[arg(long, default_value_t = 5)]
    needs_attention_after: u32,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = HttpConfig::DEFAULT_BODY_LIMIT)]
    body_limit: usize,
    /// Bearer token every /v1 endpoint and /metrics require (`Authorization: Bearer TOKEN`);
    /// without one the API is open. /healthz and /openapi.json never need it.
    #[arg(
        long,
        env = "SAGA_API_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    api_token: Option<String>,
    /// Longest `Prefer: wait=N` honoured, in seconds; longer waits are capped to it.
    #[arg(long, default_value_t = HttpConfig::DEFAULT_MAX_WAIT.as_secs(), value_name = "SECONDS")]
    max_wait_secs: u64,
    /// How long an Idempotency-Key is remembered, in seconds (default 24 hours); expired keys
    /// are swept every minute.
    #[arg(
        long,
        default_value_t = HttpConfig::DEFAULT_IDEMPOTENCY_RETENTION.as_secs(),
        value_name = "SECONDS"
    )]
    idempotency_retention_secs: u64,
    /// Refuse saga starts without an Idempotency-Key header (400).
    #[arg(long)]
    require_idempotency_key: bool,
    /// A global webhook subscriber: every event of every saga is POSTed to this URL
    /// (repeatable). Sagas may also name their own with the Saga-Callback-Url header.
    #[arg(long = "webhook-url", value_name = "URL")]
    webhook_urls: Vec<String>,
    /// The secret that signs webhook deliveries (Saga-Signature header); without one they are
    /// sent unsigned.
    #[arg(
        long,
        env = "SAGA_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    webhook_secret: Option<String>,
    /// How long one webhook attempt may take, in seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    webhook_timeout_secs: u64,
    /// The first webhook retry delay, in milliseconds (doubling, with jitter, up to an hour).
    #[arg(long, default_value_t = 1000, value_name = "MILLIS")]
    webhook_retry_base_ms: u64,
    /// Attempts before a webhook delivery is given up.
    #[arg(long, default_value_t = 20)]
    webhook_max_attempts: u32,
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
    /// Print the figures as JSON.
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
    init_tracing(cli.log_format, matches!(cli.cmd, Command::Serve(_)));
    let result = match &cli.cmd {
        Command::Serve(args) => serve(&cli, args).await,
        Command::Ledger { json } => ledger(&cli, *json).await,
        Command::Bench(args) => run_bench(&cli, args, db_explicit).await,
        Command::BenchWorker { workers } => bench_worker(&cli, *workers).await,
        Command::BenchTimers { sagas, concurrency } => {
            bench_timers(&cli, *sagas, *concurrency, db_explicit).await
        }
        Command::Admin(cmd) => admin(&cli, cmd).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e)
            if e.downcast_ref::<CliError>()
                .is_some_and(CliError::is_broken_pipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat, serving: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(if serving { "info" } else { "warn" }));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn admin(cli: &Cli, cmd: &AdminCommand) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    cli::open_and_run(cmd, &cli.db.database_url, &mut out).await?;
    out.flush().map_err(CliError::Io)?;
    Ok(())
}

async fn serve(cli: &Cli, args: &ServeArgs) -> anyhow::Result<()> {
    let stores = orchestrator::store::open_full(&cli.db.database_url)
        .await
        .with_context(|| format!("cannot open {}", cli.db.database_url))?;
    let webhook_secret = args.webhook_secret.clone().filter(|s| !s.is_empty());
    if webhook_secret.is_none() {
        tracing::info!("no webhook secret set (SAGA_WEBHOOK_SECRET or --webhook-secret): webhooks are sent unsigned unless a saga gives its own");
    }
    let relay = Relay::new(
        stores.outbox.clone(),
        WebhookConfig {
            subscribers: args.webhook_urls.clone(),
            secret: webhook_secret,
            timeout: Duration::from_secs(args.webhook_timeout_secs.max(1)),
            retry_base: Duration::from_millis(args.webhook_retry_base_ms.max(1)),
            max_attempts: args.webhook_max_attempts.max(1),
            ..WebhookConfig::default()
        },
    )
    .context("invalid webhook settings")?;
    let shop = Shop::open(&cli.shop_database_url)
        .await
        .with_context(|| format!("cannot open {}", cli.shop_database_url))?;
    let mut registry = example_sagas::registry(Arc::new(shop))?;
    if args.with_bench_saga {
        registry.register(bench::bench_saga()?)?;
    }
    let engine = Engine::new(
        stores.log.clone(),
        Arc::new(registry),
        EngineConfig {
            workers: args.workers.max(1),
            lease_ttl: Duration::from_secs(args.lease_ttl_secs.max(1)),
            needs_attention_after: args.needs_attention_after.max(1),
            ..EngineConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));

    let api_token = args.api_token.clone().filter(|t| !t.is_empty());
    if api_token.is_none() {
        tracing::info!("no API token set (SAGA_API_TOKEN or --api-token): the API is open");
    }
    // Waits end at shutdown, so a long poll cannot hold the graceful stop.
    let router = http::router_with_shutdown(
        engine.clone(),
        &stores,
        HttpConfig {
            body_limit: args.body_limit,
            api_token,
            max_wait: Duration::from_secs(args.max_wait_secs),
            idempotency_retention: Duration::from_secs(args.idempotency_retention_secs.max(1)),
            require_idempotency_key: args.require_idempotency_key,
            ..HttpConfig::default()
        },
        shutdown.clone(),
    );
    // The outbox relay (webhooks) and the idempotency-key sweeper stop with the server.
    let relay_task = tokio::spawn(relay.run(shutdown.clone()));
    let sweeper_task = tokio::spawn(sweep_idempotency_keys(stores.clone(), shutdown.clone()));
    let engine_task = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move {
            let ran = engine.run(shutdown.clone()).await;
            // An engine that stops (or cannot start) takes the HTTP API down with it: accepting
            // sagas that nothing will run would be worse than refusing them.
            shutdown.cancel();
            ran
        })
    };
    // Tests and scripts read the bound address from this line (useful with `--listen :0`).
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    let served = http::serve(listener, router, shutdown.clone()).await;
    shutdown.cancel();
    let ran = engine_task.await.context("engine task")?;
    relay_task.await.context("webhook relay task")?;
    sweeper_task.await.context("idempotency sweeper task")?;
    served.context("HTTP server failed")?;
    ran.context("engine failed")?;
    Ok(())
}

/// Deletes expired idempotency keys every minute until `shutdown`.
async fn sweep_idempotency_keys(stores: orchestrator::store::Stores, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        let swept = match stores.log.now().await {
            Ok(now) => stores.idempotency.sweep_idempotency(now).await,
            Err(e) => Err(e),
        };
        match swept {
            Ok(0) => {}
            Ok(n) => tracing::debug!(keys = n, "expired idempotency keys deleted"),
            Err(e) => tracing::warn!(error = %e, "sweeping idempotency keys failed; will retry"),
        }
    }
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    shutdown.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down: finishing calls in flight, releasing leases");
    shutdown.cancel();
}

async fn ledger(cli: &Cli, json: bool) -> anyhow::Result<()> {
    let shop = Shop::open(&cli.shop_database_url)
        .await
        .with_context(|| format!("cannot open {}", cli.shop_database_url))?;
    let ledger = shop.ledger().await?;
    shop.close().await;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &ledger)?;
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
    Ok(())
}

async fn run_bench(cli: &Cli, args: &BenchArgs, db_explicit: bool) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let url = if db_explicit {
        cli.db.database_url.clone()
    } else {
        format!("sqlite://{}", tmp.path().join("bench.db").display())
    };
    let backend = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let store = orchestrator::store::open(&url)
        .await
        .with_context(|| format!("cannot open {url}"))?;
    let plan = bench::BenchPlan {
        backend: backend.to_owned(),
        url: url.clone(),
        scenario: args.scenario,
        sagas: args.sagas,
        concurrency: args.concurrency,
        workers: args.workers.unwrap_or(args.concurrency),
        processes: args.processes.max(1),
    };
    let report = bench::run(store, &plan).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", report.line());
    }
    Ok(())
}

async fn bench_worker(cli: &Cli, workers: usize) -> anyhow::Result<()> {
    let store = orchestrator::store::open(&cli.db.database_url)
        .await
        .with_context(|| format!("cannot open {}", cli.db.database_url))?;
    let engine = bench::bench_engine(store.clone(), workers)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    println!("ready");
    let _ = std::io::stdout().flush();
    engine.run(shutdown).await?;
    println!("commits={}", store.commits());
    Ok(())
}

async fn bench_timers(
    cli: &Cli,
    sagas: usize,
    concurrency: usize,
    db_explicit: bool,
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let url = if db_explicit {
        cli.db.database_url.clone()
    } else {
        format!("sqlite://{}", tmp.path().join("timers.db").display())
    };
    let backend = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let store = orchestrator::store::open(&url)
        .await
        .with_context(|| format!("cannot open {url}"))?;
    let r = bench::timers(store, backend, sagas, concurrency).await?;
    println!(
        "timers backend={} sagas={} seconds={:.1} rss_mb={:.1} peak_rss_mb={:.1}",
        r.backend, r.sagas, r.seconds, r.rss_mb, r.peak_rss_mb
    );
    Ok(())
}
