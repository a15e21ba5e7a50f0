//! The command-line shape of the operator commands (clap derive).
//!
//! Saga ids and list cursors are taken as plain text and checked by [`run_admin`](super::run_admin),
//! not by clap: a malformed id then gets the same one-line `invalid saga id …` error whether the
//! command came from the `saga` binary, an application binary or a test.

use saga_dsl::Rate;

use crate::model::{BulkAction, SagaStatus};
use crate::operations::limits::MAX_LIMIT;

/// The page size of `list` when `--limit` is not given.
pub const DEFAULT_LIST_LIMIT: u32 = 50;

/// The database every command works on.
///
/// Flatten it into the top-level parser of a binary; the flag is global, so it may be given
/// before or after the subcommand.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct DatabaseArgs {
    /// Database URL: `sqlite://PATH` or `postgres://…`.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://saga.db",
        global = true
    )]
    pub database_url: String,
}

/// The operator commands of SPEC §5: all but `start` work directly on the database; `start`
/// goes through a server's HTTP API (see [`AdminCommand::needs_database`]).
///
/// An application binary embeds them next to its own commands (`serve`, `start`) with
/// `#[command(flatten)]`:
///
/// ```
/// use clap::{Parser, Subcommand};
/// use orchestrator::cli::{AdminCommand, DatabaseArgs};
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     db: DatabaseArgs,
///     #[command(subcommand)]
///     cmd: Command,
/// }
///
/// #[derive(Subcommand)]
/// enum Command {
///     /// Run the HTTP API and the engine.
///     Serve,
///     #[command(flatten)]
///     Admin(AdminCommand),
/// }
///
/// let cli = Cli::parse_from(["my-app", "show", "0193a4f2"]);
/// assert!(matches!(cli.cmd, Command::Admin(AdminCommand::Show(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum AdminCommand {
    /// List sagas, newest first.
    List(ListArgs),
    /// Show one saga: its steps with status, attempts, errors and timings, and its attempt log.
    Show(ShowArgs),
    /// Show a saga's event history.
    Events(EventsArgs),
    /// Request cancellation: the step in flight finishes, then the saga compensates.
    Cancel(CancelArgs),
    /// Stop driving a saga without compensating it (audited).
    Abort(AbortArgs),
    /// Make a waiting retry happen now; on a FAILED saga, retry the failed step.
    Retry(RetryArgs),
    /// Vouch that a stuck compensation was done by hand (audited); the saga carries on.
    MarkCompensated(MarkCompensatedArgs),
    /// Pause a saga (audited): nothing new starts, its timers do not fire, no lease is held;
    /// a call in flight finishes and is recorded first.
    Pause(PauseArgs),
    /// Resume a PAUSED saga (audited); a step whose retries ran out gets a fresh budget.
    Resume(PauseArgs),
    /// Record the output of a step done by hand (audited); the saga goes on, and the step's
    /// compensation, if ever needed, receives that output.
    CompleteStep(CompleteStepArgs),
    /// Fork a saga: a new one from its input (or another), optionally taking over the effects
    /// of the stages before --from-stage (audited); prints the new saga's id. Needs a server.
    Fork(ForkArgs),
    /// List the orchestrator processes recorded in the database, their heartbeats and leases.
    Workers(WorkersArgs),
    /// Show how far each outbox relay (webhooks, NATS) has published the event log, and what
    /// it has left: lag in events and in time.
    Outbox(OutboxArgs),
    /// Apply database migrations (creates an SQLite database if it does not exist).
    Migrate,
    /// Delete finished sagas older than a bound, with all their rows, in small batches.
    Purge(PurgeArgs),
    /// Start a saga through a server's HTTP API, with one idempotency key reused across retries.
    Start(StartArgs),
    /// List the saga definitions a server can start: stages, hash and required input.
    Definitions(DefinitionsArgs),
    /// Send a signal with a JSON payload to a saga through a server's HTTP API (an approval,
    /// a provider's answer); the saga's signal step takes it.
    Signal(SignalArgs),
    /// Apply cancel, pause, resume, retry, abort or fork to every saga a filter matches, as a
    /// durable job of the server (audited); prints the job id and how many sagas it matched.
    Bulk(BulkArgs),
    /// Show a bulk job: its progress and the sagas that refused its command.
    BulkJob(BulkJobArgs),
    /// List the concurrency limits and rate limiters: value, what holds and what waits for
    /// each; `limits set` changes one (audited).
    Limits(LimitsArgs),
    /// Schedules: sagas started on a cron expression or at an interval; `schedule create`,
    /// `list`, `show`, `pause`, `resume`, `trigger`, `delete`.
    Schedule(ScheduleArgs),
    /// List a server's NATS triggers (--server: subject, saga, stream, consumer, lag, counts)
    /// and the messages they refused; on the database, the refusals alone.
    Triggers(TriggersArgs),
}

impl AdminCommand {
    /// Parses one command from its words, without the program name (`["show", ID, "--json"]`),
    /// exactly as the `saga` binary would.
    pub fn parse_words<I, T>(words: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;

        #[derive(clap::Parser)]
        #[command(name = "saga", no_binary_name = true)]
        struct Words {
            #[command(subcommand)]
            cmd: AdminCommand,
        }

        Words::try_parse_from(words).map(|w| w.cmd)
    }

    /// Whether the command may create the database (only `migrate`); every other command wants
    /// an existing one, so that a wrong path is an error rather than a new empty file.
    pub fn creates_database(&self) -> bool {
        matches!(self, Self::Migrate)
    }

    /// Whether the command works on the database. `start`, `definitions` and `signal` do not:
    /// they talk to a server over HTTP, so no store is opened for them (and no `saga.db` is
    /// created).
    pub fn needs_database(&self) -> bool {
        !matches!(
            self,
            Self::Start(_)
                | Self::Definitions(_)
                | Self::Signal(_)
                | Self::Bulk(_)
                | Self::BulkJob(_)
        ) && !matches!(self, Self::Schedule(a) if a.needs_server())
            && self.server().is_none()
    }

    /// The server a command that may go through one (one that changes a saga, `limits`) is
    /// sent to, if `--server` named one.
    pub fn server(&self) -> Option<&ViaServer> {
        let via = match self {
            Self::Cancel(a) => &a.via,
            Self::Abort(a) => &a.via,
            Self::Retry(a) => &a.via,
            Self::MarkCompensated(a) => &a.via,
            Self::Pause(a) | Self::Resume(a) => &a.via,
            Self::CompleteStep(a) => &a.via,
            Self::Fork(a) => &a.via,
            Self::Limits(a) => a.via(),
            Self::Schedule(a) => a.via(),
            Self::Triggers(a) => &a.via,
            _ => return None,
        };
        via.server.is_some().then_some(via)
    }

    /// Whether the command changes a saga (and may go through a server instead).
    pub fn changes_a_saga(&self) -> bool {
        matches!(
            self,
            Self::Cancel(_)
                | Self::Abort(_)
                | Self::Retry(_)
                | Self::MarkCompensated(_)
                | Self::Pause(_)
                | Self::Resume(_)
                | Self::CompleteStep(_)
                | Self::Fork(_)
        )
    }
}

/// `--json`: what a command prints, as JSON for scripts instead of a table or a sentence for
/// people.
///
/// Every command that prints something flattens it; each says what its JSON is by giving the
/// flag its own help (`#[command(mut_arg(Output::JSON, …))]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct Output {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Output {
    /// The id of the `--json` flag, for a command to set its help.
    pub const JSON: &'static str = "json";
}

/// `--token`: the API token a command sends to a server as a bearer token.
///
/// A command may say which scopes it needs by giving the flag its own help
/// (`#[command(mut_arg(Auth::TOKEN, …))]`, as [`ViaServer`] does).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct Auth {
    /// The server's API token, sent as a bearer token.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "SAGA_API_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl Auth {
    /// The id of the `--token` flag, for a command to set its help.
    pub const TOKEN: &'static str = "token";
}

/// The server of the commands that talk to one when neither `--server`, `SAGA_SERVER` nor an
/// address written beside the database names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// `--server URL` of a command that works only through a server (`start`, `signal`,
/// `definitions`). Without it (or `SAGA_SERVER`), the command asks the server that runs on its
/// `--database-url`, whose address that server wrote beside an SQLite database
/// ([`crate::discovery`]), else [`DEFAULT_SERVER`]. The commands that may go through a server
/// instead of the database take [`ViaServer`].
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct Server {
    /// The server's base URL [default: the address of the server running on --database-url,
    /// else http://127.0.0.1:8080].
    #[arg(
        id = "server",
        long = "server",
        value_name = "URL",
        env = "SAGA_SERVER"
    )]
    pub url: Option<String>,
}

/// `list [--status S] [--name N] [--limit N] [--cursor ID] [--needs-attention] [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print the page as JSON (`{\"sagas\": […], \"next_cursor\": …}`)")
}))]
pub struct ListArgs {
    /// Only sagas in this status (QUEUED, RUNNING, COMPENSATING, COMPLETED, COMPENSATED, FAILED,
    /// ABORTED; any case).
    #[arg(long, value_name = "STATUS", value_parser = parse_status)]
    pub status: Option<SagaStatus>,
    /// Only sagas of this definition name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Page size (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIST_LIMIT,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Start after this saga id (the cursor printed at the end of the previous page).
    #[arg(long, value_name = "ID")]
    pub cursor: Option<String>,
    /// Only sagas flagged as needing attention.
    #[arg(long)]
    pub needs_attention: bool,
    /// Only sagas with this search attribute, NAME=VALUE (repeatable: each must match).
    #[arg(long, value_name = "NAME=VALUE")]
    pub attr: Vec<String>,
    /// Through a server's API (`GET /v1/sagas`), or the database.
    #[command(flatten)]
    pub via: ViaServer,
    /// Tables, or JSON.
    #[command(flatten)]
    pub output: Output,
}

impl Default for ListArgs {
    fn default() -> Self {
        Self {
            status: None,
            name: None,
            limit: DEFAULT_LIST_LIMIT,
            cursor: None,
            needs_attention: false,
            attr: Vec::new(),
            via: ViaServer::default(),
            output: Output::default(),
        }
    }
}

/// `show ID [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print the saga object, the same as `GET /v1/sagas/{id}`")
}))]
pub struct ShowArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// Tables, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `events ID [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print `{\"events\": […]}`, the same as `GET /v1/sagas/{id}/events`")
}))]
pub struct EventsArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `purge --finished-before WHEN [--dry-run] [--batch N] [--attr NAME=VALUE]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct PurgeArgs {
    /// Sagas that ended this long ago or more (30d, 12h, 90m), or before this RFC 3339 instant.
    #[arg(long, value_name = "DURATION|TIME")]
    pub finished_before: String,
    /// Count what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Sagas deleted per transaction.
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
    /// Only sagas with this search attribute, NAME=VALUE (repeatable: each must match), as
    /// `list --attr` selects them.
    #[arg(long, value_name = "NAME=VALUE")]
    pub attr: Vec<String>,
}

/// Where a command that changes a saga is sent: a server's HTTP API (`--server`), where the
/// token's name is the audit actor, or, without one, the database itself (for a server that
/// is down), audited as `$USER@cli`.
///
/// Its `--server` is optional, unlike [`Server`]'s; its `--token` is [`Auth`]'s, with help that
/// names the scopes these commands need.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Auth::TOKEN, |a| {
    a.help(
        "The server's API token (with the `operate` scope for abort, retry and \
         mark-compensated; `start` for cancel), sent as a bearer token",
    )
}))]
pub struct ViaServer {
    /// The server's base URL: the command goes through its API, which resolves an id prefix
    /// as the database would. Without it the command writes the database directly.
    #[arg(long, value_name = "URL", env = "SAGA_SERVER")]
    pub server: Option<String>,
    /// The token the server's API is asked with.
    #[command(flatten)]
    pub auth: Auth,
}

/// `cancel ID [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CancelArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `abort ID --reason TEXT [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct AbortArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// Why (recorded in the saga's events with who did it).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `pause ID --reason TEXT [--server URL]`, and `resume` with the same arguments.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct PauseArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// Why (recorded in the saga's events with who did it).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `retry ID [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct RetryArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `mark-compensated ID STEP --reason TEXT [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct MarkCompensatedArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// The name of the step whose compensation was done by hand.
    pub step: String,
    /// What was done, and why (recorded in the saga's events with who did it).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `complete-step ID STEP --output JSON --reason TEXT [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct CompleteStepArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// The name of the step done by hand (a branch of a parallel group is `group/branch`).
    pub step: String,
    /// The step's output, as JSON (what its action would have returned).
    #[arg(long, value_name = "JSON")]
    pub output: String,
    /// What was done, and why (recorded in the saga's events with who did it).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `fork ID [--from-stage S] [--input JSON] --reason TEXT [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ForkArgs {
    /// The saga id, or its first 8 or more characters.
    pub id: String,
    /// The stage the new saga starts at: the stages before it are taken over from the
    /// original (not run again) and the original is aborted, superseded by the new saga.
    #[arg(long, value_name = "STAGE")]
    pub from_stage: Option<String>,
    /// The new saga's input, as JSON; the original's if not given.
    #[arg(long, value_name = "JSON")]
    pub input: Option<String>,
    /// Why (recorded in both sagas' events with who did it).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Through a server: a fork needs the saga definitions, which only a server has.
    #[command(flatten)]
    pub via: ViaServer,
}

/// `start NAME --input JSON [--server URL] [--idempotency-key K] [--wait SECONDS] [--token T]
/// [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help(
        "Print JSON: `{\"id\", \"name\", \"status\", \"idempotency_key\"}`, or with `--wait` the \
         saga object (as `GET /v1/sagas/{id}`)",
    )
}))]
pub struct StartArgs {
    /// The saga definition name (e.g. place_order).
    pub name: String,
    /// The saga input, as JSON.
    #[arg(long, value_name = "JSON")]
    pub input: String,
    /// The server it asks.
    #[command(flatten)]
    pub server: Server,
    /// The idempotency key of this start (default: a new UUIDv4). The same key is sent on
    /// every retry; run the command again with the printed key to retry the same start.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Wait up to this many seconds for the saga to end, and print how it ended.
    #[arg(long, value_name = "SECONDS")]
    pub wait: Option<u64>,
    /// Start at this RFC 3339 instant instead of now (`Saga-Start-At`), e.g.
    /// 2026-12-24T18:00:00Z: the saga waits `QUEUED` until then.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Its priority, 0 (last) to 9 (first; 5 by default): among sagas due to start, higher
    /// ones start first (`Saga-Priority`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: Option<u8>,
    /// The token the server's API is asked with.
    #[command(flatten)]
    pub auth: Auth,
    /// A sentence, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `signal ID NAME [--payload JSON] [--server URL] [--idempotency-key K] [--token T] [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print the answer as JSON: `{\"id\", \"signal\", \"status\", \"outcome\"}`")
}))]
pub struct SignalArgs {
    /// The saga id, or its first 8 or more characters (the server resolves them).
    pub id: String,
    /// The signal's name, as the saga's signal step names it (e.g. approval).
    pub name: String,
    /// The payload, as JSON (default: null).
    #[arg(long, value_name = "JSON", default_value = "null")]
    pub payload: String,
    /// The server it asks.
    #[command(flatten)]
    pub server: Server,
    /// The idempotency key of this signal (default: a new UUIDv4), sent on every retry.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The token the server's API is asked with.
    #[command(flatten)]
    pub auth: Auth,
    /// A sentence, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `bulk ACTION [--status S] [--name N] [--needs-attention] [--created-after T]
/// [--created-before T] [--attr K=V] --reason R [--dry-run] [--wait]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct BulkArgs {
    /// The command: cancel, pause, resume, retry, abort or fork.
    #[arg(value_parser = parse_bulk_action)]
    pub action: BulkAction,
    /// Only sagas in this status.
    #[arg(long, value_parser = parse_status)]
    pub status: Option<SagaStatus>,
    /// Only sagas of this definition name.
    #[arg(long)]
    pub name: Option<String>,
    /// Only sagas flagged as needing attention.
    #[arg(long)]
    pub needs_attention: bool,
    /// Only sagas created at or after this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    pub created_after: Option<String>,
    /// Only sagas created before this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    pub created_before: Option<String>,
    /// A search attribute to match, KEY=VALUE (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub attr: Vec<String>,
    /// Why (recorded in each saga's events with who did it).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Only count the matched sagas and show some of them; records nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Follow the job's progress until it is done, then list the sagas that refused.
    #[arg(long)]
    pub wait: bool,
    /// The server that records and works the job.
    #[command(flatten)]
    pub server: Server,
    /// The token the server's API is asked with (scope `operate`).
    #[command(flatten)]
    pub auth: Auth,
    /// A sentence, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `bulk-job ID`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct BulkJobArgs {
    /// The job's id, as `bulk` printed it.
    pub id: String,
    /// The server that holds the job.
    #[command(flatten)]
    pub server: Server,
    /// The token the server's API is asked with.
    #[command(flatten)]
    pub auth: Auth,
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `limits [--json] [--server URL]`, or `limits set …` ([`SetLimitArgs`]).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print `{\"limits\": […]}`, the same as `GET /v1/limits`")
}))]
pub struct LimitsArgs {
    /// `set`, to change a limit; without it the limits are listed.
    #[command(subcommand)]
    pub command: Option<LimitsCommand>,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

impl LimitsArgs {
    /// Where the command goes: `set`'s own `--server`, or the listing's.
    pub fn via(&self) -> &ViaServer {
        match &self.command {
            Some(LimitsCommand::Set(a)) => &a.via,
            None => &self.via,
        }
    }
}

/// `triggers [--limit N] [--json] [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print `{\"triggers\", \"refused\", \"refusals\"}`, the same as `GET /v1/triggers`")
}))]
pub struct TriggersArgs {
    /// How many of the latest refusals to list (0 to 1000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub limit: u32,
    /// Through a server (its triggers and their lag), or the database (the refusals alone).
    #[command(flatten)]
    pub via: ViaServer,
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// What `limits` does besides listing.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum LimitsCommand {
    /// Change a concurrency limit (--limit) or a rate limiter's rate and burst (--rate,
    /// --burst), audited; every process applies it within a second.
    Set(SetLimitArgs),
}

/// `limits set NAME (--limit N | --rate R [--burst B]) [--reason TEXT] [--server URL]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print the limit as it now stands, the same as the answer of `PUT /v1/limits/{name}`")
}))]
pub struct SetLimitArgs {
    /// The limit's name, as `limits` lists it.
    pub name: String,
    /// A concurrency limit's new value: how many sagas may run at once (per key, for a per-key
    /// limit); 0 holds every saga still to start.
    #[arg(long, value_name = "N", conflicts_with_all = ["rate", "burst"],
          required_unless_present = "rate",
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_LIMIT)))]
    pub limit: Option<u32>,
    /// A rate limiter's new rate: N/s, N/m or N/h (e.g. 20/s).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub rate: Option<Rate>,
    /// With --rate: the calls let through at once after a pause [default: the limiter's
    /// current burst].
    #[arg(long, value_name = "N", requires = "rate",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIMIT)))]
    pub burst: Option<u32>,
    /// Why (recorded with the change, and who made it).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
    /// A sentence, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// Reads a rate, `N/s`, `N/m` or `N/h`.
fn parse_rate(text: &str) -> Result<Rate, String> {
    text.parse()
        .map_err(|e: saga_dsl::flow::BadRate| e.to_string())
}

/// Reads a bulk action in any case.
fn parse_bulk_action(text: &str) -> Result<BulkAction, String> {
    text.trim().to_ascii_lowercase().parse().map_err(|_| {
        let known: Vec<&str> = BulkAction::ALL.iter().map(|a| a.as_str()).collect();
        format!("unknown action {text:?}: one of {}", known.join(", "))
    })
}

/// Reads a saga status in any case (`failed`, `FAILED`).
fn parse_status(text: &str) -> Result<SagaStatus, String> {
    text.trim().to_ascii_uppercase().parse().map_err(|_| {
        let known: Vec<&str> = SagaStatus::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown status {text:?} (one of {})", known.join(", "))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_every_command() {
        let list = AdminCommand::parse_words([
            "list",
            "--status",
            "failed",
            "--name",
            "place_order",
            "--limit",
            "5",
            "--needs-attention",
            "--json",
        ])
        .unwrap();
        assert_eq!(
            list,
            AdminCommand::List(ListArgs {
                status: Some(SagaStatus::Failed),
                name: Some("place_order".into()),
                limit: 5,
                cursor: None,
                needs_attention: true,
                output: Output { json: true },
                ..ListArgs::default()
            })
        );
        assert_eq!(
            AdminCommand::parse_words(["list"]).unwrap(),
            AdminCommand::List(ListArgs::default())
        );
        assert_eq!(
            AdminCommand::parse_words(["mark-compensated", "x", "charge", "--reason", "refunded"])
                .unwrap(),
            AdminCommand::MarkCompensated(MarkCompensatedArgs {
                id: "x".into(),
                step: "charge".into(),
                reason: "refunded".into(),
                via: ViaServer::default(),
            })
        );
        assert_eq!(
            AdminCommand::parse_words(["migrate"]).unwrap(),
            AdminCommand::Migrate
        );
        assert!(
            AdminCommand::parse_words(["abort", "x"]).is_err(),
            "--reason is required"
        );
        assert!(AdminCommand::parse_words(["list", "--status", "nope"]).is_err());
        assert!(AdminCommand::parse_words(["list", "--limit", "0"]).is_err());
    }

    #[test]
    fn every_command_builds() {
        // Catches a help set for a flag id that no longer exists, among clap's own checks.
        use clap::Subcommand;
        AdminCommand::augment_subcommands(clap::Command::new("saga")).debug_assert();
    }

    #[test]
    fn only_migrate_creates_a_database() {
        assert!(AdminCommand::Migrate.creates_database());
        assert!(!AdminCommand::List(ListArgs::default()).creates_database());
    }

    #[test]
    fn parses_start() {
        let cmd = AdminCommand::parse_words([
            "start",
            "place_order",
            "--input",
            "{}",
            "--server",
            "http://127.0.0.1:9",
            "--idempotency-key",
            "k-1",
            "--wait",
            "5",
            "--priority",
            "7",
            "--token",
            "t",
            "--json",
        ])
        .unwrap();
        assert_eq!(
            cmd,
            AdminCommand::Start(StartArgs {
                name: "place_order".into(),
                input: "{}".into(),
                server: Server {
                    url: Some("http://127.0.0.1:9".into()),
                },
                idempotency_key: Some("k-1".into()),
                wait: Some(5),
                at: None,
                priority: Some(7),
                auth: Auth {
                    token: Some("t".into()),
                },
                output: Output { json: true },
            })
        );
        assert!(!cmd.needs_database());
        assert!(AdminCommand::Migrate.needs_database());
        assert!(
            AdminCommand::parse_words(["start", "place_order"]).is_err(),
            "--input is required"
        );
        assert!(
            AdminCommand::parse_words(["start", "p", "--input", "{}", "--priority", "10"]).is_err(),
            "a priority is 0 to 9"
        );
    }

    #[test]
    fn parses_limits() {
        let list = AdminCommand::parse_words(["limits", "--json"]).unwrap();
        assert_eq!(
            list,
            AdminCommand::Limits(LimitsArgs {
                command: None,
                via: ViaServer::default(),
                output: Output { json: true },
            })
        );
        assert!(list.needs_database());
        let set = AdminCommand::parse_words([
            "limits",
            "set",
            "bank",
            "--rate",
            "10/s",
            "--burst",
            "3",
            "--reason",
            "bank asks",
            "--server",
            "http://127.0.0.1:9",
        ])
        .unwrap();
        let AdminCommand::Limits(LimitsArgs {
            command: Some(LimitsCommand::Set(args)),
            ..
        }) = &set
        else {
            panic!("{set:?}");
        };
        assert_eq!(args.rate, Some(Rate::per_second(10)));
        assert_eq!((args.burst, args.limit), (Some(3), None));
        assert_eq!(args.reason.as_deref(), Some("bank asks"));
        assert!(!set.needs_database(), "through the server");
        for wrong in [
            &["limits", "set", "x"][..],
            &["limits", "set", "x", "--limit", "1", "--rate", "1/s"],
            &["limits", "set", "x", "--limit", "1", "--burst", "2"],
            &["limits", "set", "x", "--rate", "fast"],
            &["limits", "set", "x", "--limit", "-1"],
            &["limits", "set", "x", "--rate", "1/s", "--burst", "0"],
            &["limits", "--json", "set", "x", "--limit", "1"],
        ] {
            assert!(AdminCommand::parse_words(wrong).is_err(), "{wrong:?}");
        }
    }
}

/// Arguments of `outbox`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print `{\"log_id\", \"relays\": […]}` instead of a table")
}))]
pub struct OutboxArgs {
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `workers [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct WorkersArgs {
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `definitions [--server URL] [--token T] [--json]`: asks a server, since the definitions are
/// linked into the application that serves them, not into this binary.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print the API's answer, `{\"definitions\": […]}` (as `GET /v1/definitions`)")
}))]
pub struct DefinitionsArgs {
    /// The server it asks.
    #[command(flatten)]
    pub server: Server,
    /// The token the server's API is asked with.
    #[command(flatten)]
    pub auth: Auth,
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `schedule …`: one of [`ScheduleCommand`].
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ScheduleArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

impl ScheduleArgs {
    /// Where the command goes.
    pub fn via(&self) -> &ViaServer {
        match &self.command {
            ScheduleCommand::Create(a) => &a.via,
            ScheduleCommand::List(a) => &a.via,
            ScheduleCommand::Show(a)
            | ScheduleCommand::Pause(a)
            | ScheduleCommand::Resume(a)
            | ScheduleCommand::Trigger(a)
            | ScheduleCommand::Delete(a) => &a.via,
        }
    }

    /// Whether it needs a server: making one (its saga and input are checked against the
    /// server's definitions) and firing one (a start).
    pub fn needs_server(&self) -> bool {
        matches!(
            self.command,
            ScheduleCommand::Create(_) | ScheduleCommand::Trigger(_)
        )
    }
}

/// The schedule commands.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum ScheduleCommand {
    /// Make a schedule (through a server, which checks the saga and its input).
    Create(CreateScheduleArgs),
    /// List the schedules with their next tick and latest run.
    List(ListSchedulesArgs),
    /// Show a schedule: its next ticks and its latest runs, with their sagas.
    Show(ScheduleIdArgs),
    /// Pause a schedule: no tick fires until it is resumed.
    Pause(ScheduleIdArgs),
    /// Resume a schedule at its next tick after now (the ticks while paused are not caught up).
    Resume(ScheduleIdArgs),
    /// Fire a schedule now, under its overlap policy (through a server).
    Trigger(ScheduleIdArgs),
    /// Delete a schedule and its history; its sagas keep running.
    Delete(ScheduleIdArgs),
}

/// `schedule create ID --saga NAME (--cron EXPR | --every DURATION) …`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print the schedule made, the same as the answer of `POST /v1/schedules`")
}))]
pub struct CreateScheduleArgs {
    /// Its id: letters, digits, '.', '_' or '-'.
    pub id: String,
    /// The saga each tick starts.
    #[arg(long, value_name = "NAME")]
    pub saga: String,
    /// A cron expression (5 fields, or 6 with seconds first), e.g. "0 2 * * *".
    #[arg(
        long,
        value_name = "EXPR",
        required_unless_present = "every",
        conflicts_with = "every"
    )]
    pub cron: Option<String>,
    /// A fixed interval, at least 1s (e.g. 15m).
    #[arg(long, value_name = "DURATION")]
    pub every: Option<String>,
    /// The IANA time zone the cron expression is read in [default: UTC].
    #[arg(long, value_name = "ZONE")]
    pub timezone: Option<String>,
    /// The input of every saga it starts, as JSON [default: {}].
    #[arg(long, value_name = "JSON")]
    pub input: Option<String>,
    /// What a tick does while the previous run has not ended: skip, buffer_one, allow_all or
    /// cancel_other [default: skip].
    #[arg(long, value_name = "POLICY")]
    pub overlap: Option<String>,
    /// How late a missed tick may still start after downtime, from 15s to 7d [default: 1m].
    #[arg(long, value_name = "DURATION")]
    pub catchup_window: Option<String>,
    /// Make it paused.
    #[arg(long)]
    pub paused: bool,
    /// Through a server.
    #[command(flatten)]
    pub via: ViaServer,
    /// A sentence, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `schedule list [--json]`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print `{\"schedules\": […]}`, the same as `GET /v1/schedules`")
}))]
pub struct ListSchedulesArgs {
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
    /// A table, or JSON.
    #[command(flatten)]
    pub output: Output,
}

/// `schedule show|pause|resume|trigger|delete ID`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(mut_arg(Output::JSON, |a| {
    a.help("Print JSON, the same as the API's answer")
}))]
pub struct ScheduleIdArgs {
    /// The schedule's id.
    pub id: String,
    /// Through a server, or the database.
    #[command(flatten)]
    pub via: ViaServer,
    /// A table or sentence, or JSON.
    #[command(flatten)]
    pub output: Output,
}
