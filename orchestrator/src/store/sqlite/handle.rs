//! Lending the SQLite handle of an sqlx connection to rusqlite, to run statements through
//! SQLite's own API on it ([`on_handle`]), and the writer's statements kept on its handle
//! between batches ([`Statements`], [`with_statements`]).
//!
//! Every `unsafe` of the crate is in this module, behind the safe functions above and
//! [`widen_lookaside`]. They rest on these invariants:
//!
//! 1. **The handle is used only while locked.** sqlx's [`SqliteConnection::lock_handle`] keeps
//!    the driver's own thread off the handle until the lock is dropped; the raw handle, and any
//!    rusqlite connection over it, is used only while that lock is held, on the thread holding
//!    it (`on_locked`).
//! 2. **rusqlite never owns the handle.** `Connection::from_handle` makes a connection that
//!    does not close the handle: dropping it finalizes the statements it prepared and leaves
//!    the handle to sqlx, which alone closes it.
//! 3. **Kept statements outlive no handle.** A rusqlite connection kept between calls (in
//!    [`Statements`]) is only stored meanwhile; it is used again only on the same handle (by
//!    address), locked again, and otherwise dropped. It is dropped before the handle can close:
//!    [`Statements`] holds the writer's pool, which keeps its connection open until then (SQLite
//!    refuses to close a connection with statements left, and sqlx panics if it cannot). The
//!    exception is a runtime dropped while the connection is on its way back to the pool after
//!    a batch (sqlx returns it from a task of its own): that task is dropped with the runtime
//!    and closes the connection first, and sqlx's thread reports the refusal as a panic. Only a
//!    process ending right after a batch meets it, and the log is not affected: every batch
//!    the writer answered was committed.
//! 4. **One SQLite library.** sqlx-sqlite and rusqlite link the same `libsqlite3-sys`, so a
//!    handle one opened is a handle of the library the other calls. Cargo links one crate per
//!    native library; the tests below check the lock file and the running library.

#![allow(unsafe_code)]

use rusqlite::Connection;
use sqlx::{SqliteConnection, SqlitePool};

use super::stmt::from_rusqlite;
use crate::store::Result;
use crate::store::SqlxResultExt;

/// Distinct statements one writer keeps prepared (the writer's rows, savepoints and
/// transaction statements number about twenty; past this the least recently used is
/// finalized and prepared again when next needed).
const KEPT_STATEMENTS: usize = 48;

/// Lookaside memory of the writer's connection, slots and their size in bytes: SQLite's own
/// allocator for a connection's small objects. The kept statements hold on to theirs, and with
/// the default 40 slots their runs fell back on `malloc` for much of what keeping them saved
/// (see BENCHMARKS.md).
const WRITER_LOOKASIDE: (i32, i32) = (500, 1200);

/// Gives the writer's connection, new and not yet used, the lookaside memory its kept
/// statements need ([`WRITER_LOOKASIDE`]). If SQLite refuses (lookaside already in use), the
/// connection keeps the default: slower, not wrong.
pub(crate) async fn widen_lookaside(conn: &mut SqliteConnection) -> sqlx::Result<()> {
    // The connection's setup statements, kept by the driver, hold lookaside slots.
    sqlx::Connection::clear_cached_statements(conn).await?;
    let mut locked = conn.lock_handle().await?;
    let raw = locked.as_raw_handle().as_ptr();
    let (slots, size) = WRITER_LOOKASIDE;
    // SAFETY: invariant 1 (the handle is locked while `raw` is used); with a null buffer
    // SQLite allocates the slots itself.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_config(
            raw,
            rusqlite::ffi::SQLITE_DBCONFIG_LOOKASIDE,
            std::ptr::null_mut::<std::ffi::c_void>(),
            size,
            slots,
        )
    };
    if rc != rusqlite::ffi::SQLITE_OK {
        tracing::debug!(rc, "the writer connection keeps the default lookaside");
    }
    Ok(())
}

/// The step-log writer's statements, prepared on its connection's handle once and kept from one
/// batch to the next: preparing them again for every batch is SQLite's parser and code
/// generator for each of some twenty statements (see BENCHMARKS.md).
pub(crate) struct Statements {
    /// The handle's address, and a connection over it that owns the statements it prepared.
    db: Option<(usize, Connection)>,
    /// Keeps the writer's pool, and so its connection, open until `db` has finalized them
    /// (invariant 3). Fields drop in declaration order, `db` first. The writer pool is never
    /// closed otherwise: it has no idle timeout or lifetime, and nothing calls `close`.
    _pool: SqlitePool,
}

impl Statements {
    /// None yet, for the writer that takes its connections from `pool`.
    pub(crate) fn new(pool: &SqlitePool) -> Self {
        Self {
            db: None,
            _pool: pool.clone(),
        }
    }
}

/// Runs `f` on the SQLite handle of `conn`, with statements prepared for this call only.
pub(crate) async fn on_handle<T>(
    conn: &mut SqliteConnection,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    on_locked(conn, |raw| {
        // SAFETY: invariants 1 and 2; `db` is dropped, its statements finalized, before the
        // lock is released.
        let db = unsafe { Connection::from_handle(raw) }.map_err(from_rusqlite)?;
        f(&db)
    })
    .await
}

/// Runs `f` on the SQLite handle of `conn` with the writer's kept statements: those prepared
/// on this handle before are used again, and what `f` prepares is kept.
pub(crate) async fn with_statements<T>(
    conn: &mut SqliteConnection,
    statements: &mut Statements,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    on_locked(conn, |raw| {
        let key = raw as usize;
        let db = match statements.db.take() {
            Some((on, db)) if on == key => db,
            other => {
                // Statements of another handle: finalized here. That handle is still open
                // (SQLite does not close a connection with statements left), if no longer used.
                drop(other);
                // SAFETY: invariants 1 to 3: kept in `statements` until the next call on this
                // same handle, locked again.
                let db = unsafe { Connection::from_handle(raw) }.map_err(from_rusqlite)?;
                db.set_prepared_statement_cache_capacity(KEPT_STATEMENTS);
                db
            }
        };
        let out = f(&db);
        statements.db = Some((key, db));
        out
    })
    .await
}

/// Runs `f` with the raw SQLite handle of `conn`, on this thread, while the driver's thread
/// keeps off it (invariant 1).
///
/// `f` may wait for the disk (a batch's commit) and holds this runtime thread meanwhile, while
/// the runtime's other threads run the other tasks; the store has one writer, so one thread at
/// most is held so. This is deliberate: handing the thread's tasks to another one first
/// (`block_in_place`) cost a thread hand-off per batch (see BENCHMARKS.md).
async fn on_locked<T>(
    conn: &mut SqliteConnection,
    f: impl FnOnce(*mut rusqlite::ffi::sqlite3) -> Result<T>,
) -> Result<T> {
    let mut locked = conn.lock_handle().await.db()?;
    let raw = locked.as_raw_handle().as_ptr();
    let out = f(raw);
    drop(locked);
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use uuid::Uuid;

    use super::*;
    use crate::model::StepKind;
    use crate::store::{EngineLog, NewSaga, SqliteStore};

    /// Statements prepared on the connection of `pool` and not finalized, once the driver's
    /// own are cleared.
    async fn statements_left(pool: &SqlitePool) -> usize {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::Connection::clear_cached_statements(&mut *conn)
            .await
            .unwrap();
        on_locked(&mut conn, |raw| {
            let mut count = 0;
            // SAFETY: invariant 1 (the handle is locked); `sqlite3_next_stmt` only walks the
            // handle's list of statements.
            let mut st = unsafe { rusqlite::ffi::sqlite3_next_stmt(raw, std::ptr::null_mut()) };
            while !st.is_null() {
                count += 1;
                // SAFETY: as above; `st` is a statement of this handle.
                st = unsafe { rusqlite::ffi::sqlite3_next_stmt(raw, st) };
            }
            Ok(count)
        })
        .await
        .unwrap()
    }

    fn new_saga() -> NewSaga {
        NewSaga {
            id: Uuid::now_v7(),
            name: "kept".to_owned(),
            version: 1,
            definition_hash: "h".to_owned(),
            input: serde_json::json!({}),
            steps: vec![("a".to_owned(), StepKind::Compensatable)],
            first_attempt: false,
            start_at: None,
            traceparent: None,
            flow: crate::store::NewFlow::default(),
            attrs: Vec::new(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writers_statements_outlive_its_batches_and_are_finalized_before_its_connection_closes(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("saga.db").display());
        let store = SqliteStore::open(&url).await.unwrap();
        for _ in 0..2 {
            store.create_saga(new_saga()).await.unwrap();
        }
        let pool = store.writer_pool().clone();
        assert!(
            statements_left(&pool).await > 0,
            "the writer's statements are kept between its batches"
        );
        // The writer stops with the store, and finalizes its statements while the connection
        // is still open (this pool keeps it so): SQLite refuses to close a connection that
        // still has statements.
        drop(store);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = statements_left(&pool).await;
            if left == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{left} statements left after the writer stopped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pool.close().await;
    }

    /// The packages of the workspace's lock file, each as its `name` and the first word of
    /// each of its dependencies.
    fn locked_packages() -> Vec<(&'static str, Vec<&'static str>)> {
        let lock = include_str!("../../../../Cargo.lock");
        lock.split("[[package]]")
            .skip(1)
            .map(|package| {
                let name = package
                    .lines()
                    .find_map(|l| l.strip_prefix("name = \""))
                    .and_then(|l| l.strip_suffix('"'))
                    .unwrap_or_default();
                let deps = package
                    .split_once("dependencies = [")
                    .map(|(_, rest)| rest.split(']').next().unwrap_or_default())
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().trim_end_matches(',').strip_prefix('"'))
                    .filter_map(|d| d.trim_end_matches('"').split(' ').next())
                    .collect();
                (name, deps)
            })
            .collect()
    }

    /// Invariant 4: one `libsqlite3-sys` in the build, and both drivers on it. Upgrading one
    /// of sqlx and rusqlite alone to a release on another `libsqlite3-sys` fails here (or, as
    /// cargo links only one crate per native library, in the build).
    #[test]
    fn sqlx_and_rusqlite_depend_on_the_one_libsqlite3_sys() {
        let packages = locked_packages();
        let named = |name: &'static str| packages.iter().filter(move |(n, _)| *n == name);
        assert_eq!(named("libsqlite3-sys").count(), 1, "one libsqlite3-sys");
        for driver in ["sqlx-sqlite", "rusqlite"] {
            let mut found = named(driver).peekable();
            assert!(found.peek().is_some(), "{driver} is in Cargo.lock");
            for (_, deps) in found {
                assert!(
                    deps.contains(&"libsqlite3-sys"),
                    "{driver} depends on libsqlite3-sys: {deps:?}"
                );
            }
        }
    }

    /// Invariant 4 as the running program sees it: the SQLite that rusqlite calls is the one
    /// behind sqlx's connections, borrowed handle included.
    #[tokio::test]
    async fn sqlx_and_rusqlite_run_the_same_sqlite() {
        let pool = SqlitePool::connect("sqlite::memory:").await.unwrap();
        let through_sqlx: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(through_sqlx, rusqlite::version());
        let mut conn = pool.acquire().await.unwrap();
        let borrowed = on_handle(&mut conn, |db| {
            db.query_row("SELECT sqlite_version()", [], |r| r.get::<_, String>(0))
                .map_err(from_rusqlite)
        })
        .await
        .unwrap();
        assert_eq!(borrowed, through_sqlx);
    }
}
