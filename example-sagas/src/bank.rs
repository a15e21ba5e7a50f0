//! A fake bank: a separate HTTP service with a database of its own, which accepts a transfer,
//! answers `202 Accepted`, settles it a little later and reports the outcome by calling back the
//! orchestrator's task URL (SPEC §16). It is the participant of `payout`'s `send_transfer` when
//! that step completes by callback.
//!
//! Run it alone with `example-sagas bank --listen ADDR [--database URL] [--callback-token
//! TOKEN] [--settle-after-ms N]`, or in-process with [`FakeBank::spawn`]. Its database is
//! `sqlite://bank.db` in the working directory by default (created if missing), or a PostgreSQL
//! database (`postgres://…`) when example-sagas is built with the `postgres` feature.
//!
//! ## Protocol
//!
//! `POST /transfers`, with the headers
//! - `Idempotency-Key` (required; `400` without): the transfer's identity;
//! - `Saga-Task-Url` (optional): where to report the outcome, e.g.
//!   `http://127.0.0.1:8080/v1/tasks/{token}`;
//!
//! and the body `{"payout_id": str, "merchant": str, "amount": int, "refuse": bool}`
//! (`refuse` defaults to `false`, other fields are ignored; a body that is not this, an empty
//! `payout_id` or `merchant`, a negative amount, or a task URL that is not an absolute `http`
//! or `https` URL without a query answers `400`).
//! In one transaction of its own database the bank records the transfer under the key, and the
//! callback owed to the task URL, then answers `202 Accepted` `{"transfer_id": str, "status":
//! "pending"}`. A repeat with the same key and the same body answers the same `transfer_id`
//! (and the status it has reached: `pending`, `transferred` or `refused`) and records nothing
//! new; the same key with a different body answers `422`.
//!
//! After `--settle-after-ms` (default 50) the transfer settles, in one transaction:
//! - `refuse` false: the ledger gains one `transferred` entry for the payout id (exactly once
//!   per key), then the bank sends `POST {Saga-Task-Url}/complete`
//!   `{"output": {"transfer_id": str, "amount": int}}`;
//! - `refuse` true: nothing moves, and the bank sends `POST {Saga-Task-Url}/fail`
//!   `{"error": "the bank rejected the transfer", "retryable": false}`.
//!
//! With `--callback-token TOKEN` each callback carries `Authorization: Bearer TOKEN`. A callback
//! is sent again with backoff (from 50 ms, doubling, at most 5 s apart) until it is answered
//! `2xx`; a `404` or a `409` (the token is unknown, or its attempt is no longer current) stops
//! it. A repeat of a request with the same key and a new `Saga-Task-Url` (the orchestrator tried
//! again with a new attempt's token) reports the recorded outcome to the new URL too, once the
//! transfer has settled. Pending settlements and callbacks are kept in the database, so a bank
//! restarted on it settles and calls back what the last one left.
//!
//! `GET /transfers/{payout_id}` answers what the bank holds for a payout: `{"payout_id",
//! "transferred": n, "transfers": [{"transfer_id", "idempotency_key", "payout_id", "merchant",
//! "amount", "refuse", "status"}…]}`, or `404` when it holds nothing. `GET /ledger` answers
//! `{"<payout_id>": {"transferred": n}}`, the bank statement that "transferred exactly once" is
//! checked against (`example-sagas ledger --json` shows it beside the shop's counters).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod routes;
mod store;
mod worker;

pub use store::{BankLedgerEntry, BankStore, Transfer, TransferRequest, TransferStatus};
pub use worker::REFUSED_ERROR;

/// Why the bank could not start or answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BankError {
    /// The database URL is neither `sqlite:…` nor `postgres://…`.
    #[error("unsupported bank database URL {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// The URL names PostgreSQL, which this build leaves out.
    #[error("the bank database {0:?} is PostgreSQL: build example-sagas with --features postgres")]
    NotBuilt(String),
    /// The database failed.
    #[error("bank database: {0}")]
    Database(sqlx::Error),
    /// The database holds something this program does not know: it was tampered with.
    #[error("bank database: {0}")]
    Corrupt(String),
    /// An idempotency key was used before for a different transfer.
    #[error("idempotency key {0:?} was used before for a different transfer")]
    KeyReused(String),
    /// The listening address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP client for callbacks cannot be built.
    #[error("cannot build the callback client: {0}")]
    Client(reqwest::Error),
    /// The HTTP server stopped with an error.
    #[error("the bank's server failed: {0}")]
    Serve(std::io::Error),
}

// Not `#[from]`: sqlx repeats its message in its `source()`, which would print every cause twice
// in an error chain; the message already carries it.
impl From<sqlx::Error> for BankError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

/// How a [`FakeBank`] runs.
#[derive(Clone)]
pub struct BankConfig {
    /// Where it listens; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Its own database.
    pub database_url: String,
    /// Sent as `Authorization: Bearer TOKEN` with every callback.
    pub callback_token: Option<String>,
    /// How long after a transfer is accepted it settles.
    pub settle_after: Duration,
}

impl BankConfig {
    /// The defaults: `sqlite://bank.db`, no callback token, settling after 50 ms, listening on
    /// `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            database_url: "sqlite://bank.db".to_owned(),
            callback_token: None,
            settle_after: Duration::from_millis(50),
        }
    }
}

impl fmt::Debug for BankConfig {
    /// Leaves the callback token and the database URL's password out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BankConfig")
            .field("listen", &self.listen)
            .field(
                "database_url",
                &orchestrator::store::redact_url(&self.database_url),
            )
            .field(
                "callback_token",
                &self.callback_token.as_ref().map(|_| "<redacted>"),
            )
            .field("settle_after", &self.settle_after)
            .finish()
    }
}

/// The fake bank: its HTTP server and its worker, run on the current tokio runtime.
#[derive(Debug)]
pub struct FakeBank;

impl FakeBank {
    /// Opens the bank's database, binds `config.listen` and starts serving; returns the address
    /// it listens on and the handle that stops it. Pending settlements and callbacks left in the
    /// database by an earlier bank are resumed at once.
    pub async fn spawn(config: BankConfig) -> Result<(SocketAddr, BankHandle), BankError> {
        let store = BankStore::open(&config.database_url).await?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| BankError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| BankError::Listen {
            addr: config.listen,
            source,
        })?;
        let client = reqwest::Client::builder()
            .build()
            .map_err(BankError::Client)?;
        let wake = Arc::new(Notify::new());
        let shutdown = CancellationToken::new();
        let app = routes::router(routes::AppState {
            store: store.clone(),
            settle_after_ms: i64::try_from(config.settle_after.as_millis()).unwrap_or(i64::MAX),
            wake: wake.clone(),
        });
        let worker = worker::Worker {
            store: store.clone(),
            client,
            callback_token: config.callback_token,
            wake,
        };
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let worker = tokio::spawn(worker.run(shutdown.clone()));
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                    .await;
                // The server may stop on its own (an I/O error): the worker stops with it.
                shutdown.cancel();
                let _ = worker.await;
                store.close().await;
                served.map_err(BankError::Serve)
            }
        });
        Ok((
            addr,
            BankHandle {
                shutdown,
                task: Some(task),
            },
        ))
    }
}

/// Stops a [`FakeBank`]: explicitly with [`BankHandle::shutdown`], or when dropped.
#[derive(Debug)]
pub struct BankHandle {
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), BankError>>>,
}

impl BankHandle {
    /// Stops the bank and waits until its server, its worker and its database are closed.
    pub async fn shutdown(mut self) -> Result<(), BankError> {
        self.shutdown.cancel();
        self.join().await
    }

    /// Waits until the bank stops, which it does when `stop` completes (e.g. a signal) or its
    /// server fails.
    pub async fn run_until(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), BankError> {
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        tokio::select! {
            () = stop => {
                self.shutdown.cancel();
                finished(task.await)
            }
            done = &mut task => finished(done),
        }
    }

    async fn join(&mut self) -> Result<(), BankError> {
        match self.task.take() {
            Some(task) => finished(task.await),
            None => Ok(()),
        }
    }
}

/// The outcome of the bank's task; a panic in it goes on.
fn finished(done: Result<Result<(), BankError>, tokio::task::JoinError>) -> Result<(), BankError> {
    match done {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled with its runtime: nothing is left running.
        Err(_) => Ok(()),
    }
}

impl Drop for BankHandle {
    /// A dropped handle stops the bank in the background.
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Milliseconds since the Unix epoch, the bank's clock.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
