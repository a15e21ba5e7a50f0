//! Why a store operation failed: a refusal the caller acts on, or the database failing.
//!
//! [`StoreError`]'s variants other than [`StoreError::Backend`] are refusals with a meaning of
//! their own: a lease lost, a saga or step that does not exist, a request the saga's state
//! forbids, a row that cannot be read, a file another process holds. Callers match on them.
//! Everything else is the database (or a file beside it) failing, carried as one opaque
//! [`BackendError`]: its message, whether it is worth retrying, and the database's error code,
//! without the driver's types, so that changing or upgrading the driver is not an API change.

use uuid::Uuid;

/// Errors of the step log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The saga's lease is no longer ours: another worker (or an operator) took it over.
    #[error("lease on saga {0} lost")]
    LeaseLost(Uuid),
    /// No saga with this id.
    #[error("saga {0} not found")]
    NotFound(Uuid),
    /// The saga has no step with this name.
    #[error("saga {saga} has no step {step:?}")]
    UnknownStep {
        /// The saga.
        saga: Uuid,
        /// The step name given.
        step: String,
    },
    /// A command of a bulk job found the job's item for its saga settled already, or the job
    /// taken over by another process: it changed nothing.
    #[error(
        "saga {saga} of bulk job {job} was acted on already, or another process works the job now"
    )]
    BulkItemSettled {
        /// The bulk job.
        job: Uuid,
        /// The saga.
        saga: Uuid,
    },
    /// The lease of a bulk job is no longer this claim's: it expired and another process took
    /// the job, or the job is done.
    #[error("bulk job {0} is no longer held by this claim")]
    BulkJobLost(Uuid),
    /// No limit of this name is declared (SPEC §14).
    #[error("no limit named {0:?}")]
    UnknownLimit(String),
    /// The operation does not apply to the saga in its current state.
    #[error("{0}")]
    Conflict(String),
    /// A row that cannot be read back (hand-edited, or written by a newer version).
    #[error("corrupt row for saga {saga}: {detail}")]
    Corrupt {
        /// The saga.
        saga: String,
        /// What was wrong.
        detail: String,
    },
    /// The database URL is not one this build understands (held with its password masked,
    /// see [`redact_url`](super::redact_url)).
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// The database URL is of a kind this build understands, but one of its settings is not
    /// (`?synchronous=bogus`): the message names the setting and the values it takes.
    #[error("{0}")]
    InvalidUrl(String),
    /// The database URL names a store this build was compiled without (a Cargo feature of
    /// the `orchestrator` crate).
    #[error(
        "{url:?} needs the {feature:?} feature of the orchestrator: build with --features \
         {feature}"
    )]
    NotBuilt {
        /// The URL, its password masked.
        url: String,
        /// The feature that compiles its store in.
        feature: &'static str,
    },
    /// Another orchestrator process runs the engine on this SQLite file.
    #[error("{0}")]
    InUse(String),
    /// The database refused a value (PostgreSQL refuses NUL characters in text and `\u0000` in
    /// JSON, which SQLite accepts): the request carried data the store cannot hold.
    #[error("the database cannot store this value: {0}")]
    InvalidValue(String),
    /// The database or a file beside it failed: unreachable, a query, commit or migration
    /// failed, the engine lock could not be taken. See [`BackendError::is_transient`] for
    /// whether it may work in a moment.
    #[error(transparent)]
    Backend(BackendError),
}

impl From<crate::model::rules::Refusal> for StoreError {
    fn from(refusal: crate::model::rules::Refusal) -> Self {
        match refusal {
            crate::model::rules::Refusal::UnknownStep { saga, step } => {
                Self::UnknownStep { saga, step }
            }
            crate::model::rules::Refusal::Conflict(message) => Self::Conflict(message),
            // Checked first by the use case against the same definition: a conflict here.
            crate::model::rules::Refusal::Invalid(message) => Self::Conflict(message),
        }
    }
}

impl StoreError {
    /// Whether the error is the database being away or contended for a moment (connection
    /// refused, pool timeout, SQLite busy, a PostgreSQL deadlock or serialization failure), as
    /// opposed to a refusal, a bug or bad data: callers may retry.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Backend(e) if e.is_transient())
    }

    /// The database failure, if this is one rather than a refusal.
    pub fn backend(&self) -> Option<&BackendError> {
        match self {
            Self::Backend(e) => Some(e),
            _ => None,
        }
    }

    /// A failure of sqlx, classified: a value the database refused is the request's fault
    /// ([`StoreError::InvalidValue`]), anything else the database's.
    pub(crate) fn from_sqlx(e: sqlx::Error) -> Self {
        // SQLSTATE class 22 is "data exception": the value, not the database, is at fault.
        if let Some(d) = e.as_database_error() {
            if d.code()
                .is_some_and(|c| c.len() == 5 && c.starts_with("22"))
            {
                return Self::InvalidValue(d.message().to_owned());
            }
        }
        // Invalid UTF-8 or a NUL byte sent as a bound parameter fails while encoding.
        if let sqlx::Error::Encode(err) = &e {
            return Self::InvalidValue(err.to_string());
        }
        Self::Backend(BackendError::query(e))
    }

    /// A failed migration.
    pub(crate) fn from_migrate(e: sqlx::migrate::MigrateError) -> Self {
        Self::Backend(BackendError::new(
            BackendErrorKind::Migrate,
            format!("migration failed: {e}"),
            false,
            None,
            Some(Box::new(e)),
        ))
    }

    /// A failure of a file beside the database, or of the store's own machinery (its writer
    /// stopped), said in `message`: never transient.
    pub(crate) fn io(message: impl Into<String>) -> Self {
        Self::Backend(BackendError::new(
            BackendErrorKind::Io,
            message.into(),
            false,
            None,
            None,
        ))
    }

    /// A database server that could not be reached when the store was opened: `target` says
    /// what was dialled, for people (`PostgreSQL at host:port (database NAME)`), `cause` why it
    /// failed, in words.
    // Only the PostgreSQL store dials a server.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn connect(target: &str, cause: &str, transient: bool) -> Self {
        Self::Backend(BackendError::new(
            BackendErrorKind::Connect,
            format!("cannot connect to {target}: {cause}"),
            transient,
            None,
            None,
        ))
    }

    /// The transaction carrying a write (with others, by group commit) failed to commit, or
    /// its outcome could not be told; `message` says which and why.
    pub(crate) fn commit_failed(message: String, transient: bool) -> Self {
        Self::Backend(BackendError::new(
            BackendErrorKind::Commit,
            format!("commit failed: {message}"),
            transient,
            None,
            None,
        ))
    }

    /// A statement run through SQLite's own API failed, with SQLite's extended result code if
    /// the library reported one (busy and locked, of any extended code, are transient).
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(
        code: Option<i32>,
        message: &str,
        cause: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Backend(BackendError::new(
            BackendErrorKind::Query,
            format!("database error: {message}"),
            code.is_some_and(|c| matches!(c & 0xff, 5 | 6)),
            code.map(|c| c.to_string()),
            cause,
        ))
    }
}

/// `?` on sqlx's results inside the store. [`StoreError`] has no public `From<sqlx::Error>`:
/// that would make sqlx's error type part of the API.
pub(crate) trait SqlxResultExt<T> {
    /// The result with a sqlx error classified by [`StoreError::from_sqlx`].
    fn db(self) -> Result<T, StoreError>;
}

impl<T> SqlxResultExt<T> for Result<T, sqlx::Error> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(StoreError::from_sqlx)
    }
}

/// What kind of database failure a [`BackendError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The database server could not be reached, or turned the connection down, when the store
    /// was opened.
    Connect,
    /// A statement failed, or no connection could be had for it.
    Query,
    /// The transaction carrying a write failed to commit, or its outcome could not be told.
    Commit,
    /// A migration failed.
    Migrate,
    /// A file beside the database (the database file itself, the engine lock) could not be
    /// used, or the store's writer stopped.
    Io,
}

/// The database, or a file beside it, failed. Opaque on purpose: it says what failed and why
/// ([`Display`](std::fmt::Display), without passwords), whether trying again may help
/// ([`Self::is_transient`]) and the database's own error code ([`Self::code`]); its `Debug`
/// form also shows the driver's error, for logs.
///
/// One pointer wide, so that a `Result` of the store stays small on the hot path.
pub struct BackendError(Box<Inner>);

struct Inner {
    kind: BackendErrorKind,
    /// The whole message, cause included, written when the error is made.
    message: String,
    transient: bool,
    code: Option<String>,
    /// The driver's error, shown by `Debug`. Deliberately not a `source()`: its text is part
    /// of `message` already, and sqlx repeats its own message in its source, so an error chain
    /// printed on one line would say every cause two or three times.
    cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Database error codes that mean "try again": SQLite's extended codes `SQLITE_BUSY` (5),
/// `SQLITE_LOCKED` (6) and `SQLITE_BUSY_SNAPSHOT` (517); PostgreSQL's SQLSTATEs
/// `serialization_failure` (40001) and `deadlock_detected` (40P01), whose transaction the server
/// rolled back whole.
const TRANSIENT_CODES: [&str; 5] = ["5", "6", "517", "40001", "40P01"];

impl BackendError {
    fn new(
        kind: BackendErrorKind,
        message: String,
        transient: bool,
        code: Option<String>,
        cause: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self(Box::new(Inner {
            kind,
            message,
            transient,
            code,
            cause,
        }))
    }

    /// A statement, or getting a connection for it, failed.
    fn query(e: sqlx::Error) -> Self {
        let code = e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned());
        let transient = matches!(
            e,
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
        ) || code
            .as_deref()
            .is_some_and(|c| TRANSIENT_CODES.contains(&c));
        Self::new(
            BackendErrorKind::Query,
            format!("database error: {e}"),
            transient,
            code,
            Some(Box::new(e)),
        )
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> BackendErrorKind {
        self.0.kind
    }

    /// Whether the database is away or contended for a moment (connection refused, pool
    /// timeout, SQLite busy, a PostgreSQL deadlock or serialization failure), so that the same
    /// request may succeed if tried again.
    pub fn is_transient(&self) -> bool {
        self.0.transient
    }

    /// The database's error code, if it gave one: SQLite's extended result code in decimal
    /// (`1555`), PostgreSQL's SQLSTATE (`40P01`).
    pub fn code(&self) -> Option<&str> {
        self.0.code.as_deref()
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::fmt::Debug for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.0;
        let mut d = f.debug_struct("BackendError");
        d.field("kind", &inner.kind)
            .field("message", &inner.message)
            .field("transient", &inner.transient);
        if let Some(code) = &inner.code {
            d.field("code", code);
        }
        if let Some(cause) = &inner.cause {
            d.field("cause", cause);
        }
        d.finish()
    }
}

impl std::error::Error for BackendError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_failure_is_one_pointer_and_the_error_stays_small() {
        assert_eq!(
            std::mem::size_of::<BackendError>(),
            std::mem::size_of::<usize>()
        );
        // The largest refusal (two strings) sets the size, not the database failure.
        assert!(std::mem::size_of::<StoreError>() <= 56);
    }

    #[test]
    fn messages_read_as_before() {
        assert_eq!(
            StoreError::connect("PostgreSQL at h:5432", "connection refused", true).to_string(),
            "cannot connect to PostgreSQL at h:5432: connection refused"
        );
        assert_eq!(
            StoreError::commit_failed("disk full".into(), false).to_string(),
            "commit failed: disk full"
        );
        assert_eq!(
            StoreError::io("cannot lock x.lock: denied").to_string(),
            "cannot lock x.lock: denied"
        );
        assert_eq!(
            StoreError::from_sqlx(sqlx::Error::PoolTimedOut).to_string(),
            format!("database error: {}", sqlx::Error::PoolTimedOut)
        );
    }

    #[test]
    fn an_unreachable_pool_is_transient_and_a_refusal_is_not() {
        assert!(StoreError::from_sqlx(sqlx::Error::PoolTimedOut).is_transient());
        assert!(StoreError::from_sqlx(sqlx::Error::PoolClosed).is_transient());
        assert!(!StoreError::from_sqlx(sqlx::Error::RowNotFound).is_transient());
        assert!(!StoreError::Conflict("no".into()).is_transient());
        assert!(!StoreError::io("stopped").is_transient());
        assert!(StoreError::connect("t", "refused", true).is_transient());
        assert!(!StoreError::connect("t", "bad password", false).is_transient());
    }

    /// A database's refusal with the given code, as sqlx reports it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "refused with {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "refused"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn refused(code: &'static str) -> StoreError {
        StoreError::from_sqlx(sqlx::Error::database(Coded(code)))
    }

    /// `tests/pg_scaleout.rs` shows PostgreSQL answering a real deadlock with `40P01`.
    #[test]
    fn busy_locked_deadlock_and_serialization_failure_are_transient_and_a_constraint_is_not() {
        for code in ["5", "6", "517", "40001", "40P01"] {
            let e = refused(code);
            assert!(e.is_transient(), "{code}: {e:?}");
            assert_eq!(e.backend().and_then(BackendError::code), Some(code));
        }
        for code in ["1555", "23505", "42P01"] {
            assert!(!refused(code).is_transient(), "{code}");
        }
    }

    #[test]
    fn a_value_the_database_refuses_is_the_requests_fault() {
        // 22P05: untranslatable character (a NUL in text).
        assert!(matches!(refused("22P05"), StoreError::InvalidValue(m) if m == "refused"));
    }

    #[test]
    fn a_refusal_is_not_a_database_failure() {
        assert!(StoreError::LeaseLost(Uuid::nil()).backend().is_none());
        let e = StoreError::commit_failed("x".into(), true);
        assert_eq!(
            e.backend().map(BackendError::kind),
            Some(BackendErrorKind::Commit)
        );
    }
}
