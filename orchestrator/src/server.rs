//! The library entry point: an application serves its own sagas in a few lines.
//!
//! [`Orchestrator::builder`] takes the application's [`Registry`] and runs everything a server
//! needs on one database: the [`Engine`] (workers, heartbeat, recovery), the HTTP API, the
//! webhook relay of the outbox, the sweeper of expired idempotency keys, and a graceful
//! shutdown on SIGINT or SIGTERM (calls in flight finish, leases are released).
//!
//! ```
//! use orchestrator::Orchestrator;
//! use saga_dsl::{Registry, SagaDefinition, Step, StepContext, StepError};
//!
//! async fn hello(_ctx: StepContext) -> Result<String, StepError> {
//!     Ok("hello".to_owned())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}", dir.path().join("saga.db").display());
//! let registry = Registry::new()
//!     .with(SagaDefinition::builder("hello", 1).step(Step::retriable("say", hello)).build()?)?;
//! let server = Orchestrator::builder(registry)
//!     .database_url(url)            // default: sqlite://saga.db
//!     .listen("127.0.0.1:0")        // default: 127.0.0.1:8080
//!     .start()                      // or `.serve().await?` to run until SIGINT/SIGTERM
//!     .await?;
//! println!("serving on {}", server.local_addr());
//! server.stop().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What it guarantees at start
//!
//! [`OrchestratorBuilder::start`] binds the address, opens (and migrates) the database, checks
//! the webhook settings and registers the engine (on SQLite: takes the file's engine lock)
//! *before* it prints anything: a server that could not run its sagas never says it listens.
//! Then it prints two lines on stdout, the database (without its password) and
//! `listening on http://ADDR` (scripts read the address from it). A start that fails leaves no
//! new file behind: an SQLite database it had just created is removed again.
//!
//! # Your own axum app
//!
//! An application with an HTTP server of its own mounts [`crate::http::router`] in it and
//! runs [`Engine::run`] beside it (plus, if it wants webhooks, a [`Relay`]); see the guide in
//! `docs/guide.md`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use saga_dsl::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "nats")]
use crate::broker::nats::{NatsConfig, NatsTarget};
use crate::broker::{BrokerRelay, TargetError};
#[cfg(feature = "nats")]
use crate::broker::{BrokerRelayConfig, EventTarget};
use crate::engine::{Engine, EngineConfig, EngineError};
use crate::http::{self, HttpConfig};
use crate::logs::LogFormat;
use crate::store::{self, redact_url, Store, StoreError};
#[cfg(feature = "nats")]
use crate::triggers::{consumer::TriggerRunner, TriggersConfig};
use crate::triggers::{TriggerError, TriggerSpec};
use crate::webhooks::{Relay, WebhookConfig, WebhookError};

/// The default database: `saga.db` in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://saga.db";
/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Why a server could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    // The variants below say their cause in their message, so none of them also gives it as
    // its `source()`: a program that prints the error with its chain (anyhow's `{:#}`, or the
    // `Error: … Caused by: …` of a `main` that returns it) would say the cause twice.
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {cause}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// What the system said.
        cause: std::io::Error,
    },
    /// The database could not be opened or migrated.
    #[error("cannot open the database {url}: {cause}")]
    Database {
        /// The URL, without its password.
        url: String,
        /// What failed.
        cause: StoreError,
    },
    /// The tokens file cannot be read, or a line of it is wrong.
    #[error(transparent)]
    Tokens(#[from] crate::http::tokens::TokensFileError),
    /// The webhook settings are invalid (a subscriber URL, say).
    #[error("invalid webhook settings: {0}")]
    Webhooks(WebhookError),
    /// The message broker is set up in a way the relay cannot publish to (a stream that does
    /// not capture the events' subjects, say).
    #[error("cannot publish to the message broker: {0}")]
    Broker(TargetError),
    /// The NATS triggers cannot run as given (`--nats-trigger` without `--nats-url`, or naming
    /// a saga that is not registered).
    #[error(transparent)]
    Triggers(#[from] TriggerError),
    /// Traces cannot be exported as asked (a bad `--otlp-endpoint`).
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    /// The engine cannot run on this database (another process holds the SQLite file).
    #[error("the engine cannot start on {url}: {cause}")]
    EngineStart {
        /// The URL, without its password.
        url: String,
        /// What failed.
        cause: EngineError,
    },
    /// The engine stopped with an error while serving.
    #[error("the engine failed: {0}")]
    Engine(EngineError),
    /// The HTTP server failed while serving.
    #[error("the HTTP server failed: {0}")]
    Http(std::io::Error),
    /// A task of the server panicked.
    #[error("the {task} task panicked")]
    Panicked {
        /// Which task.
        task: &'static str,
    },
    /// A setting asks for a part this build was compiled without (a Cargo feature of the
    /// `orchestrator` crate).
    #[error("{setting} needs the \"{feature}\" feature: build with --features {feature}")]
    NotBuilt {
        /// The flag (and its variable) that asked for it.
        setting: &'static str,
        /// The feature that compiles it in.
        feature: &'static str,
    },
}

impl From<WebhookError> for ServeError {
    fn from(e: WebhookError) -> Self {
        Self::Webhooks(e)
    }
}

/// The entry point: see the [module](self).
#[derive(Debug)]
pub struct Orchestrator;

impl Orchestrator {
    /// A server for the sagas of `registry`, with every setting at its default, except those
    /// the environment sets as it does for the `serve` command line: `DATABASE_URL`,
    /// `SAGA_LISTEN`, `SAGA_WORKERS`, `SAGA_API_TOKEN`, `SAGA_WEBHOOK_SECRET` and
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (so a deployment configures every application the same
    /// way; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` wins over the last, as in any OpenTelemetry
    /// SDK). The builder's own calls override them.
    pub fn builder(registry: Registry) -> OrchestratorBuilder {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut engine = EngineConfig::default();
        if let Some(workers) = env("SAGA_WORKERS").and_then(|w| w.parse::<usize>().ok()) {
            engine.workers = workers.max(1);
        }
        OrchestratorBuilder {
            registry: Arc::new(registry),
            database_url: env("DATABASE_URL").unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
            listen: env("SAGA_LISTEN")
                .map(|l| listen_address(&l).unwrap_or(l))
                .unwrap_or_else(|| DEFAULT_LISTEN.to_owned()),
            engine,
            http: HttpConfig {
                api_token: env("SAGA_API_TOKEN"),
                ..HttpConfig::default()
            },
            webhooks: WebhookConfig {
                secret: env("SAGA_WEBHOOK_SECRET"),
                ..WebhookConfig::default()
            },
            tokens_file: None,
            #[cfg(feature = "nats")]
            nats: None,
            #[cfg(feature = "nats")]
            triggers: None,
            not_built: None,
            otlp_endpoint: env("OTEL_EXPORTER_OTLP_ENDPOINT"),
            otlp_sample_ratio: 1.0,
            public_url: None,
            retention: None,
            shutdown: CancellationToken::new(),
            signals: true,
            announce: true,
        }
    }
}

/// The settings of a server, then [`start`](Self::start) or [`serve`](Self::serve).
#[derive(Debug)]
#[must_use = "a builder does nothing until `start` or `serve`"]
pub struct OrchestratorBuilder {
    registry: Arc<Registry>,
    database_url: String,
    listen: String,
    engine: EngineConfig,
    http: HttpConfig,
    webhooks: WebhookConfig,
    tokens_file: Option<std::path::PathBuf>,
    #[cfg(feature = "nats")]
    nats: Option<NatsConfig>,
    #[cfg(feature = "nats")]
    triggers: Option<TriggersConfig>,
    /// A setting of the command line this build cannot honour, refused at start.
    not_built: Option<ServeError>,
    otlp_endpoint: Option<String>,
    otlp_sample_ratio: f64,
    retention: Option<Duration>,
    shutdown: CancellationToken,
    signals: bool,
    announce: bool,
    public_url: Option<String>,
}

impl OrchestratorBuilder {
    /// The database: `sqlite://PATH` (created if missing) or `postgres://…`. Default
    /// `DATABASE_URL`, else [`DEFAULT_DATABASE_URL`].
    pub fn database_url(mut self, url: impl Into<String>) -> Self {
        self.database_url = url.into();
        self
    }

    /// The address the HTTP API listens on (`HOST:PORT`; port 0 picks a free one). Default
    /// `SAGA_LISTEN`, else [`DEFAULT_LISTEN`].
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// How many sagas this process drives at once (see [`EngineConfig::workers`]).
    pub fn workers(mut self, workers: usize) -> Self {
        self.engine.workers = workers.max(1);
        self
    }

    /// The address participants reach this server's API at, for the task URLs of calls
    /// completed by callback (`{url}/v1/tasks/{token}`). Default `http://` and the address it
    /// listens on.
    pub fn public_url(mut self, url: impl Into<String>) -> Self {
        self.public_url = Some(url.into());
        self
    }

    /// Every engine setting at once.
    pub fn engine_config(mut self, config: EngineConfig) -> Self {
        self.engine = config;
        self
    }

    /// The HTTP API's settings (auth token, body limit, waits, idempotency keys). They replace
    /// the defaults whole, the token read from `SAGA_API_TOKEN` included: set `api_token` in
    /// `config` to keep one.
    pub fn http_config(mut self, config: HttpConfig) -> Self {
        self.http = config;
        self
    }

    /// The webhook relay's settings (global subscribers, signing secret, retries). They
    /// replace the defaults whole, the secret read from `SAGA_WEBHOOK_SECRET` included.
    pub fn webhooks(mut self, config: WebhookConfig) -> Self {
        self.webhooks = config;
        self
    }

    /// Stops the server gracefully when `token` is cancelled (as well as on a signal, unless
    /// [`without_signal_handlers`](Self::without_signal_handlers)).
    pub fn shutdown_on(mut self, token: CancellationToken) -> Self {
        self.shutdown = token;
        self
    }

    /// Does not stop on SIGINT or SIGTERM: the application stops the server itself (with
    /// [`shutdown_on`](Self::shutdown_on) or [`Server::stop`]).
    pub fn without_signal_handlers(mut self) -> Self {
        self.signals = false;
        self
    }

    /// Prints nothing on stdout (the database and address lines); they are still logged.
    pub fn quiet(mut self) -> Self {
        self.announce = false;
        self
    }

    /// The settings of a `serve` command line ([`ServeArgs`]).
    pub fn args(mut self, args: &ServeArgs) -> Self {
        self.listen = args.listen.clone();
        self.public_url = args.public_url.clone().filter(|u| !u.is_empty());
        self.engine.workers = args.workers.max(1);
        self.engine.lease_ttl = Duration::from_secs(args.lease_ttl_secs.max(1));
        self.engine.needs_attention_after = args.needs_attention_after.max(1);
        self.http.body_limit = args.body_limit;
        self.http.api_token = args.api_token.clone().filter(|t| !t.is_empty());
        self.tokens_file = args.api_tokens_file.clone();
        self.retention = args.retention;
        self.http.max_wait = Duration::from_secs(args.max_wait_secs);
        self.http.idempotency_retention =
            Duration::from_secs(args.idempotency_retention_secs.max(1));
        self.http.require_idempotency_key = args.require_idempotency_key;
        self.webhooks.subscribers = args.webhook_urls.clone();
        self.webhooks.secret = args.webhook_secret.clone().filter(|s| !s.is_empty());
        self.webhooks.timeout = Duration::from_secs(args.webhook_timeout_secs.max(1));
        self.webhooks.retry_base = Duration::from_millis(args.webhook_retry_base_ms.max(1));
        self.webhooks.max_attempts = args.webhook_max_attempts.max(1);
        self.webhooks.ca_file = args.webhook_ca_file.clone();
        let nats_url = args.nats_url.as_ref().filter(|u| !u.is_empty());
        #[cfg(feature = "nats")]
        {
            self.nats = nats_url.map(|url| NatsConfig {
                stream: args.nats_stream.clone(),
                duplicate_window: args.nats_dedup_window,
                ..NatsConfig::new(url.clone())
            });
        }
        #[cfg(not(feature = "nats"))]
        if nats_url.is_some() {
            self.not_built = Some(ServeError::NotBuilt {
                setting: "--nats-url (or SAGA_NATS_URL)",
                feature: "nats",
            });
        }
        #[cfg(feature = "nats")]
        {
            // Without a URL the triggers are refused at start, by `TriggersConfig::check`.
            self.triggers = (!args.nats_triggers.is_empty()).then(|| {
                TriggersConfig::new(
                    nats_url.cloned().unwrap_or_default(),
                    args.nats_triggers.clone(),
                )
                .with_stream(args.nats_trigger_stream.clone())
                .with_ack_wait(args.nats_trigger_ack_wait)
            });
        }
        #[cfg(not(feature = "nats"))]
        if !args.nats_triggers.is_empty() && self.not_built.is_none() {
            self.not_built = Some(ServeError::NotBuilt {
                setting: "--nats-trigger",
                feature: "nats",
            });
        }
        if let Some(endpoint) = args.otlp_endpoint.as_ref().filter(|e| !e.is_empty()) {
            self.otlp_endpoint = Some(endpoint.clone());
        }
        self.otlp_sample_ratio = args.otlp_sample_ratio;
        let callbacks = crate::webhooks::CallbackPolicy::allowing(&args.allow_callback_hosts);
        self.http.callbacks = callbacks.clone();
        self.webhooks.callbacks = callbacks;
        self
    }

    /// Deletes finished sagas older than `keep` (and all their rows) now and then, in small
    /// pages (see [`crate::retention`]). Default: keep everything.
    pub fn retention(mut self, keep: Duration) -> Self {
        self.retention = Some(keep);
        self
    }

    /// Also publishes every event to NATS JetStream (see [`crate::broker::nats`]). At start the
    /// server connects and creates or checks the stream: a stream it cannot use stops the
    /// start, a broker it cannot reach does not (events wait in the outbox until it can).
    #[cfg(feature = "nats")]
    pub fn nats(mut self, config: NatsConfig) -> Self {
        self.nats = Some(config);
        self
    }

    /// Starts sagas from NATS JetStream messages (see [`crate::triggers`]): at start the
    /// server checks the triggers (a saga not registered stops the start) and sets up each
    /// one's stream and durable consumer, or retries that in the background while NATS cannot
    /// be reached.
    #[cfg(feature = "nats")]
    pub fn nats_triggers(mut self, config: TriggersConfig) -> Self {
        self.triggers = Some(config);
        self
    }

    /// Exports the spans of sagas to the OTLP/HTTP collector at `endpoint` (see
    /// [`crate::telemetry`]), unless [`telemetry`](Self::telemetry) gives an exporter of the
    /// application's own.
    pub fn otlp_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.otlp_endpoint = Some(endpoint.into());
        self
    }

    /// Exports the traces of only `ratio` of the sagas (0 to 1, chosen by saga id; default 1)
    /// to the [`otlp_endpoint`](Self::otlp_endpoint).
    pub fn otlp_sample_ratio(mut self, ratio: f64) -> Self {
        self.otlp_sample_ratio = ratio;
        self
    }

    /// Exports the spans of sagas through `telemetry`: the one an application also hands its
    /// `tracing` subscriber (`Telemetry::tracing_layer`, with the `otel` feature),
    /// so that the spans its steps open join the sagas' traces. The server flushes it when it
    /// stops.
    pub fn telemetry(mut self, telemetry: crate::telemetry::Telemetry) -> Self {
        self.engine.telemetry = telemetry;
        self
    }

    /// Reads named API tokens with scopes from `path` when the server starts (see
    /// [`crate::http::tokens`] for the format); a bad line stops the start with an error
    /// naming it.
    pub fn api_tokens_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tokens_file = Some(path.into());
        self
    }

    /// Lets clients' callback URLs reach `host` although it is internal (loopback, private,
    /// link-local): both the start's check and the relay's check at each delivery allow it.
    pub fn allow_callback_host(mut self, host: &str) -> Self {
        self.http.callbacks = std::mem::take(&mut self.http.callbacks).allow(host);
        self.webhooks.callbacks = std::mem::take(&mut self.webhooks.callbacks).allow(host);
        self
    }

    /// Starts everything and returns once the server listens, its engine registered: see the
    /// [module](self) for what is checked first. The server runs until it is stopped
    /// ([`Server::stop`], the token of [`shutdown_on`](Self::shutdown_on), or a signal).
    pub async fn start(mut self) -> Result<Server, ServeError> {
        if let Some(refused) = self.not_built.take() {
            return Err(refused);
        }
        #[cfg(feature = "nats")]
        if let Some(triggers) = &self.triggers {
            triggers.check(&self.registry)?;
        }
        if !self.engine.telemetry.is_enabled() {
            self.engine.telemetry =
                telemetry_for(self.otlp_endpoint.as_deref(), self.otlp_sample_ratio)?;
        }
        self.webhooks.trace_sampling = self.engine.telemetry.sampling();
        if let Some(path) = &self.tokens_file {
            // Before anything is bound or created: a bad file changes nothing.
            let tokens = crate::http::tokens::read_tokens_file(path)?;
            tracing::info!(tokens = tokens.len(), file = %path.display(), "API tokens read");
            self.http.api_tokens.extend(tokens);
        }
        let shown_url = redact_url(&self.database_url);
        // Bound first: a busy port is found before any file is created.
        let listen_error = |cause| ServeError::Listen {
            addr: self.listen.clone(),
            cause,
        };
        let listener = tokio::net::TcpListener::bind(&self.listen)
            .await
            .map_err(listen_error)?;
        let addr = listener.local_addr().map_err(listen_error)?;
        self.engine.task_url = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        let new_files = NewFiles::before_open(&self.database_url);
        let parts = match self.prepare(&shown_url).await {
            Ok(parts) => parts,
            Err(e) => {
                new_files.remove();
                return Err(e);
            }
        };
        // Before anything is printed: a signal sent as soon as the address is known must stop
        // the server gracefully, not kill it.
        let signal = self.signals.then(shutdown_signal);
        let database = match sqlite_path(&self.database_url) {
            Some(path) => format!("{} (SQLite)", path.display()),
            None if self.database_url.starts_with("sqlite:") => format!("{shown_url} (SQLite)"),
            None => format!("{shown_url} (PostgreSQL)"),
        };
        // Before the address is announced: whoever reads it (a script, a test) finds the file
        // too. Nothing can fail between here and serving.
        let address_file = crate::discovery::AddressFile::write(&self.database_url, addr);
        tracing::info!(%database, %addr, workers = self.engine.workers, "serving");
        if self.announce {
            // Scripts and tests read the bound address from the second line.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "database {database}");
            let _ = writeln!(out, "listening on http://{addr}");
            let _ = out.flush();
        }
        if let Some(signal) = signal {
            tokio::spawn(stop_on_signal(signal, self.shutdown.clone()));
        }
        let mut server = Server::run(
            addr,
            listener,
            parts,
            self.http,
            self.retention,
            self.shutdown,
        );
        server.address_file = address_file;
        Ok(server)
    }

    /// [`start`](Self::start), then serve until stopped: the whole life of a server process.
    pub async fn serve(self) -> Result<(), ServeError> {
        self.start().await?.wait().await
    }

    /// The whole life of a server process, as `example-sagas serve` runs one: reads the command
    /// line and environment ([`ServeCommandLine`]: `--listen`, `--database-url`, `--workers`,
    /// every [`ServeArgs`] flag, `--log-format`, `--help`), logs on stderr at `info` unless
    /// `RUST_LOG` says otherwise, then [`serve`](Self::serve)s until SIGINT or SIGTERM.
    ///
    /// The settings those flags name come from the command line, its variables or its defaults,
    /// replacing any set on the builder before; set the others (telemetry, a shutdown token)
    /// as usual. `--help` prints the flags and exits, as does a command line that does not
    /// parse (with status 2), before anything is opened or created.
    pub async fn run_from_args(self) -> Result<(), ServeError> {
        let program = std::env::args_os()
            .next()
            .and_then(|p| {
                std::path::Path::new(&p)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "server".to_owned());
        let line = ServeCommandLine::parse_named(&program, std::env::args_os());
        self.run_with(&line).await
    }

    /// [`run_from_args`](Self::run_from_args) with a command line already parsed (an
    /// application's own parser that flattens [`ServeCommandLine`]).
    pub async fn run_with(mut self, line: &ServeCommandLine) -> Result<(), ServeError> {
        // Made before the log, so that the spans the steps open go with the sagas' traces.
        let telemetry = line.serve.telemetry()?;
        crate::logs::init_tracing_with(line.log_format == LogFormat::Json, "info", &telemetry);
        if telemetry.is_enabled() {
            self = self.telemetry(telemetry);
        }
        self.database_url(&line.database_url)
            .args(&line.serve)
            .serve()
            .await
    }

    /// Opens the store, checks the webhook settings and registers the engine: everything that
    /// can refuse to start.
    async fn prepare(&self, shown_url: &str) -> Result<Parts, ServeError> {
        let store =
            store::open(&self.database_url)
                .await
                .map_err(|cause| ServeError::Database {
                    url: shown_url.to_owned(),
                    cause,
                })?;
        if self.webhooks.secret.is_none() {
            tracing::info!(
                "no webhook secret set (SAGA_WEBHOOK_SECRET or --webhook-secret): webhooks are \
                 sent unsigned unless a saga gives its own"
            );
        }
        if self.http.api_token.is_none() && self.http.api_tokens.is_empty() {
            tracing::info!(
                "no API token set (SAGA_API_TOKEN, --api-token or --api-tokens-file): the API \
                 is open"
            );
        }
        let relay = Relay::new(store.clone(), self.webhooks.clone())?;
        #[cfg(feature = "nats")]
        let broker = match &self.nats {
            Some(config) => {
                Some(nats_relay(&store, config, shown_url, self.webhooks.trace_sampling).await?)
            }
            None => None,
        };
        #[cfg(not(feature = "nats"))]
        let broker: Option<BrokerRelay> = None;
        let engine = Engine::new(store, self.registry.clone(), self.engine.clone());
        engine
            .register()
            .await
            .map_err(|cause| ServeError::EngineStart {
                url: shown_url.to_owned(),
                cause,
            })?;
        #[cfg(feature = "nats")]
        let triggers = match &self.triggers {
            Some(config) => Some(
                TriggerRunner::prepare(engine.clone(), config.clone(), &self.http.triggers).await?,
            ),
            None => None,
        };
        Ok(Parts {
            engine,
            relay,
            broker,
            #[cfg(feature = "nats")]
            triggers,
        })
    }
}

/// What [`OrchestratorBuilder::prepare`] makes ready to run.
struct Parts {
    engine: Engine,
    relay: Relay,
    broker: Option<BrokerRelay>,
    #[cfg(feature = "nats")]
    triggers: Option<TriggerRunner>,
}

/// The NATS relay, its stream checked (or the broker found unreachable, which only delays
/// events) and its cursor made, so that retention keeps what it has not published.
#[cfg(feature = "nats")]
async fn nats_relay(
    store: &Arc<dyn Store>,
    config: &NatsConfig,
    shown_url: &str,
    trace_sampling: crate::telemetry::Sampling,
) -> Result<BrokerRelay, ServeError> {
    let target = NatsTarget::new(config.clone());
    match tokio::time::timeout(config.timeout, target.prepare()).await {
        Ok(Ok(())) => {
            tracing::info!(url = %config.url, stream = %config.stream, "publishing events to NATS")
        }
        Ok(Err(e @ TargetError::Misconfigured(_))) => return Err(ServeError::Broker(e)),
        Ok(Err(e)) => tracing::warn!(error = %e,
            "NATS is unreachable: events wait in the outbox until it is back"),
        Err(_) => tracing::warn!(url = %config.url,
            "NATS did not answer in time: events wait in the outbox until it does"),
    }
    store
        .open_relay(crate::broker::nats::TARGET_NAME)
        .await
        .map_err(|cause| ServeError::Database {
            url: shown_url.to_owned(),
            cause,
        })?;
    Ok(BrokerRelay::new(
        store.clone(),
        Arc::new(target),
        BrokerRelayConfig {
            trace_sampling,
            ..BrokerRelayConfig::default()
        },
    ))
}

/// A running server: see [`OrchestratorBuilder::start`].
#[derive(Debug)]
#[must_use = "a server stops when it is dropped only if its tasks are stopped: call `wait` or `stop`"]
pub struct Server {
    addr: SocketAddr,
    engine: Engine,
    shutdown: CancellationToken,
    engine_task: JoinHandle<Result<(), EngineError>>,
    http_task: JoinHandle<std::io::Result<()>>,
    relay_task: JoinHandle<()>,
    broker_task: Option<JoinHandle<()>>,
    triggers_task: Option<JoinHandle<()>>,
    sweeper_task: JoinHandle<()>,
    bulk_task: JoinHandle<()>,
    scheduler_task: JoinHandle<()>,
    retention_task: Option<JoinHandle<()>>,
    /// Where commands on this database find the server; removed once it has stopped.
    address_file: Option<crate::discovery::AddressFile>,
}

impl Server {
    fn run(
        addr: SocketAddr,
        listener: tokio::net::TcpListener,
        parts: Parts,
        http: HttpConfig,
        retention: Option<Duration>,
        shutdown: CancellationToken,
    ) -> Self {
        let Parts {
            engine,
            relay,
            broker,
            #[cfg(feature = "nats")]
            triggers,
        } = parts;
        let engine_task = {
            let (engine, shutdown) = (engine.clone(), shutdown.clone());
            tokio::spawn(async move {
                let ran = engine.run(shutdown.clone()).await;
                // An engine that stops takes the HTTP API down with it: accepting sagas that
                // nothing here will run would be worse than refusing them.
                shutdown.cancel();
                ran
            })
        };
        // Waits (`Prefer: wait`) end at shutdown, so a long poll cannot hold the graceful stop.
        let router = http::router_with_shutdown(engine.clone(), http, shutdown.clone());
        let http_task = tokio::spawn(http::serve(listener, router, shutdown.clone()));
        let relay_task = tokio::spawn(relay.run(shutdown.clone()));
        let broker_task = broker.map(|b| tokio::spawn(b.run(shutdown.clone())));
        #[cfg(feature = "nats")]
        let triggers_task = triggers.map(|t| tokio::spawn(t.run(shutdown.clone())));
        #[cfg(not(feature = "nats"))]
        let triggers_task = None;
        let sweeper_task = tokio::spawn(sweep_idempotency_keys(
            engine.store().clone(),
            shutdown.clone(),
        ));
        let bulk_task = tokio::spawn(crate::operations::bulk::run(
            engine.clone(),
            shutdown.clone(),
        ));
        let scheduler_task = tokio::spawn(crate::schedules::scheduler::run(
            engine.clone(),
            shutdown.clone(),
        ));
        let retention_task = retention.map(|keep| {
            tokio::spawn(crate::retention::run(
                engine.store().clone(),
                keep,
                shutdown.clone(),
            ))
        });
        Self {
            addr,
            engine,
            shutdown,
            engine_task,
            http_task,
            relay_task,
            broker_task,
            triggers_task,
            sweeper_task,
            bulk_task,
            scheduler_task,
            retention_task,
            address_file: None,
        }
    }

    /// The address the HTTP API listens on (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The engine: start sagas in process, wait for them, reach the store.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The token that stops the server when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the server is stopped, then finishes gracefully: no new requests, calls in
    /// flight finished and recorded, leases released. The first error of a part wins.
    pub async fn wait(self) -> Result<(), ServeError> {
        let served = self.http_task.await;
        // The HTTP server ends only at shutdown, or when its listener fails: stop the rest.
        self.shutdown.cancel();
        let ran = self.engine_task.await;
        let relayed = self.relay_task.await;
        if let Some(task) = self.broker_task {
            task.await.map_err(|_| ServeError::Panicked {
                task: "broker relay",
            })?;
        }
        if let Some(task) = self.triggers_task {
            task.await
                .map_err(|_| ServeError::Panicked { task: "triggers" })?;
        }
        let swept = self.sweeper_task.await;
        self.bulk_task.await.map_err(|_| ServeError::Panicked {
            task: "bulk runner",
        })?;
        self.scheduler_task
            .await
            .map_err(|_| ServeError::Panicked { task: "scheduler" })?;
        if let Some(task) = self.retention_task {
            task.await
                .map_err(|_| ServeError::Panicked { task: "retention" })?;
        }
        let served = served.map_err(|_| ServeError::Panicked { task: "HTTP" })?;
        let ran = ran.map_err(|_| ServeError::Panicked { task: "engine" })?;
        relayed.map_err(|_| ServeError::Panicked {
            task: "webhook relay",
        })?;
        swept.map_err(|_| ServeError::Panicked {
            task: "idempotency sweeper",
        })?;
        // The spans of the last calls, exported before the process ends.
        let telemetry = self.engine.config().telemetry.clone();
        if telemetry.is_enabled() {
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        }
        ran.map_err(ServeError::Engine)?;
        served.map_err(ServeError::Http)?;
        Ok(())
    }

    /// Stops the server gracefully and waits until it has: see [`wait`](Self::wait).
    pub async fn stop(self) -> Result<(), ServeError> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// The SQLite files that did not exist before a server opened its database, so that a start
/// that fails can remove what it created (and nothing else: the files of a database that
/// existed belong to it, and maybe to a process running on it).
#[derive(Debug)]
pub struct NewFiles {
    created: Vec<PathBuf>,
}

impl NewFiles {
    /// Notes which of the files an SQLite URL's database would use are missing now (none for
    /// PostgreSQL, or when the database file itself exists).
    pub fn before_open(url: &str) -> Self {
        let Some(db) = sqlite_path(url) else {
            return Self {
                created: Vec::new(),
            };
        };
        if db.exists() {
            return Self {
                created: Vec::new(),
            };
        }
        let with_suffix = |suffix: &str| {
            let mut name = db.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        let created = [
            db.clone(),
            with_suffix("-wal"),
            with_suffix("-shm"),
            with_suffix("-journal"),
            lock_file(&db),
        ]
        .into_iter()
        .filter(|p| !p.exists())
        .collect();
        Self { created }
    }

    /// Removes those files if they exist now.
    pub fn remove(self) {
        for path in self.created {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "removed after a failed start"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove"),
            }
        }
    }
}

/// The file of an SQLite URL (`None` for PostgreSQL, memory, or a build without SQLite, which
/// creates no file).
fn sqlite_path(url: &str) -> Option<PathBuf> {
    #[cfg(feature = "sqlite")]
    return store::sqlite_file(url);
    #[cfg(not(feature = "sqlite"))]
    {
        let _ = url;
        None
    }
}

/// The engine's lock file beside the SQLite database `db`.
fn lock_file(db: &std::path::Path) -> PathBuf {
    #[cfg(feature = "sqlite")]
    return store::engine_lock_file(db);
    #[cfg(not(feature = "sqlite"))]
    db.with_extension("lock")
}

/// Deletes expired idempotency keys every minute until `shutdown`.
async fn sweep_idempotency_keys(store: Arc<dyn Store>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        let swept = match store.now().await {
            Ok(now) => store.sweep_idempotency(now).await,
            Err(e) => Err(e),
        };
        match swept {
            Ok(0) => {}
            Ok(n) => tracing::debug!(keys = n, "expired idempotency keys deleted"),
            Err(e) => tracing::warn!(error = %e, "sweeping idempotency keys failed; will retry"),
        }
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM: a graceful stop of any process serving sagas.
///
/// The handlers are installed when this is called, not when the future is first polled: a
/// signal that arrives in between is not lost (nor does it kill the process).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                    }
                }
                (interrupt, terminate) => {
                    if let Err(e) = interrupt.and(terminate) {
                        tracing::warn!(error = %e, "cannot listen for signals; Ctrl-C only");
                    }
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn stop_on_signal(
    signal: impl std::future::Future<Output = ()>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = signal => {
            tracing::info!("shutting down: finishing calls in flight, releasing leases");
            shutdown.cancel();
        }
        _ = shutdown.cancelled() => {}
    }
}

/// The flags of a `serve` command, for an application's own command line (clap): flatten it
/// into a subcommand and hand it to [`OrchestratorBuilder::args`].
///
/// ```
/// use clap::Parser;
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     serve: orchestrator::server::ServeArgs,
/// }
///
/// let cli = Cli::parse_from(["app", "--listen", "0.0.0.0:9000", "--workers", "8"]);
/// assert_eq!(cli.serve.listen, "0.0.0.0:9000");
/// assert_eq!(cli.serve.workers, 8);
/// ```
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on: HOST:PORT (0.0.0.0:8080 for every interface), or a bare PORT
    /// for 127.0.0.1:PORT.
    #[arg(long, default_value = DEFAULT_LISTEN, env = "SAGA_LISTEN", value_name = "ADDR",
          value_parser = listen_address)]
    pub listen: String,
    /// Sagas driven at once by this process.
    #[arg(long, default_value_t = 32, env = "SAGA_WORKERS")]
    pub workers: usize,
    /// Seconds a lease lasts without a heartbeat.
    #[arg(long, default_value_t = 30)]
    pub lease_ttl_secs: u64,
    /// Failed attempts of a compensation after which the saga is flagged as needing attention.
    #[arg(long, default_value_t = 5)]
    pub needs_attention_after: u32,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = HttpConfig::DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// Bearer token every /v1 endpoint and /metrics require (`Authorization: Bearer TOKEN`);
    /// without one the API is open. /healthz and /openapi.json never need it.
    #[arg(
        long,
        env = "SAGA_API_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub api_token: Option<String>,
    /// A file of named tokens with scopes, one `name scope[,scope] token` per line (scopes
    /// read, start, operate, admin; `#` comments); beside --api-token, which has them all.
    #[arg(long, env = "SAGA_API_TOKENS_FILE", value_name = "FILE")]
    pub api_tokens_file: Option<std::path::PathBuf>,
    /// Longest `Prefer: wait=N` honoured, in seconds; longer waits are capped to it.
    #[arg(long, default_value_t = HttpConfig::DEFAULT_MAX_WAIT.as_secs(), value_name = "SECONDS")]
    pub max_wait_secs: u64,
    /// How long an Idempotency-Key is remembered, in seconds (default 24 hours); expired keys
    /// are swept every minute.
    #[arg(
        long,
        default_value_t = HttpConfig::DEFAULT_IDEMPOTENCY_RETENTION.as_secs(),
        value_name = "SECONDS"
    )]
    pub idempotency_retention_secs: u64,
    /// Refuse saga starts without an Idempotency-Key header (400).
    #[arg(long)]
    pub require_idempotency_key: bool,
    /// A global webhook subscriber: every event of every saga is POSTed to this URL
    /// (repeatable). Sagas may also name their own with the Saga-Callback-Url header.
    #[arg(long = "webhook-url", value_name = "URL")]
    pub webhook_urls: Vec<String>,
    /// The secret that signs webhook deliveries (Saga-Signature header); without one they are
    /// sent unsigned.
    #[arg(
        long,
        env = "SAGA_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub webhook_secret: Option<String>,
    /// How long one webhook attempt may take, in seconds.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub webhook_timeout_secs: u64,
    /// The first webhook retry delay, in milliseconds (doubling, with jitter, up to an hour).
    #[arg(long, default_value_t = 1000, value_name = "MILLIS")]
    pub webhook_retry_base_ms: u64,
    /// Attempts before a webhook delivery is given up.
    #[arg(long, default_value_t = 20)]
    pub webhook_max_attempts: u32,
    /// A host that clients' Saga-Callback-Url may name although it is, or resolves to, a
    /// loopback, private, link-local or unspecified address (repeatable; a name or an
    /// address, as written in the URL). Others such are refused at start and at delivery.
    #[arg(long = "allow-callback-host", value_name = "HOST")]
    pub allow_callback_hosts: Vec<String>,
    /// Delete finished sagas (with their steps, attempts, events, deliveries and keys) this
    /// long after they ended, e.g. 30d or 12h; sagas that need attention are kept. Default:
    /// keep everything.
    #[arg(long, value_name = "DURATION", value_parser = crate::retention::parse_duration)]
    pub retention: Option<Duration>,
    /// A PEM file of CA certificates to trust for https webhook targets, besides the public
    /// roots (a private CA).
    #[arg(long, value_name = "FILE")]
    pub webhook_ca_file: Option<std::path::PathBuf>,
    /// Also publish every event to NATS JetStream at this server (subjects
    /// `sagas.<name>.<event type>`); without it no broker is needed.
    #[arg(long, env = "SAGA_NATS_URL", value_name = "URL")]
    pub nats_url: Option<String>,
    /// The JetStream stream that stores the events (created if missing, capturing `sagas.>`).
    #[arg(long, default_value = "SAGAS", value_name = "NAME")]
    pub nats_stream: String,
    /// How long the stream remembers message ids, to drop republished events (e.g. 2m): the
    /// window of a stream this server creates; an existing one with a shorter window is
    /// lengthened to it.
    #[arg(long, default_value = "2m", value_name = "DURATION", value_parser = crate::retention::parse_duration)]
    pub nats_dedup_window: Duration,
    /// Start a saga SAGA for each message on the NATS subject SUBJECT (wildcards allowed;
    /// repeatable), its body as the input: one durable JetStream consumer per trigger, shared
    /// by every process of the database. Needs --nats-url.
    #[arg(long = "nats-trigger", value_name = "SUBJECT=SAGA")]
    pub nats_triggers: Vec<TriggerSpec>,
    /// The JetStream stream a trigger's subject is added to when no stream holds it (created
    /// if missing).
    #[arg(long, default_value = crate::triggers::DEFAULT_STREAM, value_name = "NAME")]
    pub nats_trigger_stream: String,
    /// How long a trigger's message may stay unacknowledged (its process gone) before it is
    /// handed out again, e.g. 30s: the `ack_wait` of a consumer this server creates.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::retention::parse_duration)]
    pub nats_trigger_ack_wait: Duration,
    /// Export traces over OTLP/HTTP to this collector (`http://HOST:4318`, to which
    /// `/v1/traces` is added; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, a full URL, wins): one
    /// trace per saga, a span per attempt. Without either no span is made.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The share of sagas whose traces are exported, 0 to 1, chosen by saga id (a saga
    /// started with a `traceparent` follows its caller's choice).
    #[arg(long, default_value_t = 1.0, env = "SAGA_OTLP_SAMPLE_RATIO", value_name = "RATIO",
          value_parser = parse_ratio)]
    pub otlp_sample_ratio: f64,
    /// The address participants reach this server's API at: the base of the task URLs handed
    /// to calls completed by callback. Default `http://` and the listen address.
    #[arg(long, env = "SAGA_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
}

impl ServeArgs {
    /// The exporter these flags ask for ([`Telemetry::disabled`](crate::telemetry::Telemetry::disabled)
    /// without `--otlp-endpoint`): for an application that also hands it to its `tracing`
    /// subscriber, then to [`OrchestratorBuilder::telemetry`].
    pub fn telemetry(
        &self,
    ) -> Result<crate::telemetry::Telemetry, crate::telemetry::TelemetryError> {
        telemetry_for(self.otlp_endpoint.as_deref(), self.otlp_sample_ratio)
    }
}

/// The exporter of the collector at `endpoint`, or of `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
/// which wins as the OpenTelemetry specification says; disabled with neither.
fn telemetry_for(
    endpoint: Option<&str>,
    sample_ratio: f64,
) -> Result<crate::telemetry::Telemetry, crate::telemetry::TelemetryError> {
    use crate::telemetry::Telemetry;
    let traces_url = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .ok()
        .filter(|u| !u.is_empty());
    let telemetry = match (traces_url, endpoint.filter(|e| !e.is_empty())) {
        (Some(url), _) => Telemetry::otlp_traces_url(&url)?,
        (None, Some(endpoint)) => Telemetry::otlp(endpoint)?,
        (None, None) => return Ok(Telemetry::disabled()),
    };
    Ok(telemetry.with_sample_ratio(sample_ratio))
}

/// The address `--listen` names: `HOST:PORT` as given, or a bare port on the loopback
/// interface (`18083` → `127.0.0.1:18083`).
fn listen_address(text: &str) -> Result<String, String> {
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(format!("127.0.0.1:{port}"));
    }
    let has_port = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if has_port {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not an address to listen on: write HOST:PORT (127.0.0.1:8080, \
             0.0.0.0:8080, [::1]:8080) or a bare PORT for 127.0.0.1:PORT"
        ))
    }
}

/// The command line of a server process ([`OrchestratorBuilder::run_from_args`]): the
/// database, the [`ServeArgs`] that `example-sagas serve` takes too, and the log format.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    about = "Serve sagas: the HTTP API (the web console at /ui/) and the engine's workers, \
until Ctrl-C or SIGTERM."
)]
pub struct ServeCommandLine {
    /// Database URL: `sqlite://PATH` (created if missing) or `postgres://…`.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
    /// The server's settings.
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Log format on stderr (the level comes from RUST_LOG; default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
}

impl ServeCommandLine {
    /// Parses `args` (the program's name first) as the command line of `program`, which its
    /// help names; prints the help, or what is wrong, and exits when there is nothing to run.
    pub fn parse_named<I, T>(program: &str, args: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        // Parsed once per process: the name may as well live as long as it.
        let name: &'static str = Box::leak(program.to_owned().into_boxed_str());
        let command = Self::command().name(name).bin_name(name);
        let parsed = command
            .try_get_matches_from(args)
            .and_then(|m| Self::from_arg_matches(&m));
        match parsed {
            Ok(line) => line,
            Err(e) => e.exit(),
        }
    }
}

fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("{text:?} is not a ratio from 0 to 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::listen_address;

    /// What a build without NATS answers to a serve command line with `flag` and `value`,
    /// after checking that it created nothing.
    #[cfg(not(feature = "nats"))]
    async fn refused_without_nats(flag: &str, value: &str) -> String {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("saga.db");
        let url = format!("sqlite://{}", db.display());
        let line = super::ServeCommandLine::try_parse_from([
            "app",
            "--listen",
            "127.0.0.1:0",
            flag,
            value,
        ])
        .unwrap();
        let refused = super::Orchestrator::builder(saga_dsl::Registry::new())
            .database_url(&url)
            .args(&line.serve)
            .quiet()
            .start()
            .await
            .unwrap_err();
        assert!(!db.exists(), "nothing is created");
        refused.to_string()
    }

    /// A build without NATS refuses `--nats-url` before it binds or creates anything.
    #[cfg(not(feature = "nats"))]
    #[tokio::test]
    async fn a_nats_url_is_refused_by_a_build_without_nats() {
        assert_eq!(
            refused_without_nats("--nats-url", "nats://127.0.0.1:4222").await,
            "--nats-url (or SAGA_NATS_URL) needs the \"nats\" feature: build with --features nats"
        );
    }

    /// A build without NATS refuses `--nats-trigger` too, before it binds or creates anything.
    #[cfg(not(feature = "nats"))]
    #[tokio::test]
    async fn a_nats_trigger_is_refused_by_a_build_without_nats() {
        assert_eq!(
            refused_without_nats("--nats-trigger", "orders.placed=place_order").await,
            "--nats-trigger needs the \"nats\" feature: build with --features nats"
        );
    }

    #[test]
    fn listen_takes_an_address_or_a_bare_port() {
        assert_eq!(listen_address("18083").unwrap(), "127.0.0.1:18083");
        assert_eq!(listen_address("0.0.0.0:8080").unwrap(), "0.0.0.0:8080");
        assert_eq!(listen_address("[::1]:8080").unwrap(), "[::1]:8080");
        assert_eq!(listen_address("localhost:9000").unwrap(), "localhost:9000");
        for bad in [
            "localhost",
            ":8080",
            "127.0.0.1:",
            "127.0.0.1:99999",
            "eighty",
        ] {
            let e = listen_address(bad).unwrap_err();
            assert!(
                e.contains("HOST:PORT") && e.contains("bare PORT"),
                "{bad}: {e}"
            );
        }
    }
}
