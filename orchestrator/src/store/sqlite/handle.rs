//! Borrowing the SQLite handle of an sqlx connection to run statements through SQLite's own API
//! ([`on_handle`]), and the writer's statements kept on its handle between batches
//! ([`Statements`], [`with_statements`]).
//!
//! While a task holds the handle ([`SqliteConnection::lock_handle`]) the driver's thread keeps
//! off it. A `rusqlite` connection made over the handle does not own it: dropping it finalizes
//! the statements it prepared and leaves the connection open.

use rusqlite::Connection;
use sqlx::{SqliteConnection, SqlitePool};

use crate::store::SqlxResultExt;
use crate::store::{Result, StoreError};

/// Distinct statements one writer keeps prepared (the writer's rows, savepoints and
/// transaction statements number about twenty; past this the least recently used is
/// finalized and prepared again when next needed).
const KEPT_STATEMENTS: usize = 48;

/// Lookaside memory of the writer's connection, slots and their size in bytes: SQLite's own
/// allocator for a connection's small objects. The kept statements hold on to theirs, and with
/// the default 40 slots the statements' runs then fell back on `malloc`: ~2.5 times the calls,
/// which took back most of what keeping them saved. 600 KB for the one writer connection.
const WRITER_LOOKASIDE: (i32, i32) = (500, 1200);

/// Gives the writer's connection, new and not yet used, the lookaside memory its kept
/// statements need ([`WRITER_LOOKASIDE`]). If SQLite refuses (lookaside already in use), the
/// connection keeps the default: slower, not wrong.
#[allow(unsafe_code)]
pub(crate) async fn widen_lookaside(conn: &mut SqliteConnection) -> sqlx::Result<()> {
    // The connection's setup statements, kept by the driver, hold lookaside slots.
    sqlx::Connection::clear_cached_statements(conn).await?;
    let mut locked = conn.lock_handle().await?;
    let raw = locked.as_raw_handle().as_ptr();
    let (slots, size) = WRITER_LOOKASIDE;
    // SAFETY: the handle is locked; with a null buffer SQLite allocates the slots itself.
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
/// batch to the next. Preparing them again for every batch cost about a tenth of the writer's
/// throughput (SQLite's parser and code generator, for each of some twenty statements).
pub(crate) struct Statements {
    /// The handle's address, and a connection over it that owns the statements it prepared.
    db: Option<(usize, Connection)>,
    /// Keeps the writer's pool, and so its connection, open until `db` has finalized them:
    /// SQLite will not close a connection that still has prepared statements (and sqlx panics
    /// when its close fails). Fields drop in declaration order, `db` first. The writer pool is
    /// never closed otherwise: it has no idle timeout or lifetime, and nothing calls `close`.
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
#[allow(unsafe_code)]
pub(crate) async fn on_handle<T>(
    conn: &mut SqliteConnection,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    on_locked(conn, |raw| {
        // SAFETY: the handle is locked for this call (see `on_locked`); `db` is dropped, its
        // statements finalized, before the lock is released.
        let db = unsafe { Connection::from_handle(raw) }.map_err(from_rusqlite)?;
        f(&db)
    })
    .await
}

/// Runs `f` on the SQLite handle of `conn` with the writer's kept statements: those prepared
/// on this handle before are used again, and what `f` prepares is kept.
#[allow(unsafe_code)]
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
                // SAFETY: as in `on_handle`; between calls `db` is only kept, never used, and
                // it is used again only on this same handle, locked again.
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
/// keeps off it.
///
/// `f` may wait for the disk (a batch's commit) and holds this runtime thread meanwhile, while
/// the runtime's other threads run the other tasks; the store has one writer, so one thread at
/// most is held so. This is deliberate: handing the thread's tasks to another one first
/// (`block_in_place`) cost a thread hand-off per batch, measured at 13–22 % of the throughput
/// at 1 and 16 sagas in flight and 16 % of HTTP starts (BENCHMARKS.md).
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

/// Runs `sql` with `params`, prepared once per connection made over the handle (see
/// [`on_handle`], [`with_statements`]); the rows it changed.
pub(crate) fn exec<P: rusqlite::Params>(db: &Connection, sql: &str, params: P) -> Result<usize> {
    db.prepare_cached(sql)
        .and_then(|mut st| st.execute(params))
        .map_err(from_rusqlite)
}

/// `f` inside the savepoint `name`: on `Err` everything it wrote is undone and the enclosing
/// transaction goes on without it.
pub(crate) fn in_savepoint<T>(
    db: &Connection,
    name: &str,
    f: impl FnOnce(&Connection) -> Result<T>,
) -> Result<T> {
    exec(db, &format!("SAVEPOINT {name}"), [])?;
    match f(db) {
        Ok(out) => {
            exec(db, &format!("RELEASE {name}"), [])?;
            Ok(out)
        }
        Err(e) => {
            db.execute_batch(&format!("ROLLBACK TO {name}; RELEASE {name}"))
                .map_err(from_rusqlite)?;
            Err(e)
        }
    }
}

/// A failed SQLite call as a store error, keeping its extended result code (busy and locked
/// are transient).
pub(crate) fn from_rusqlite(e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code),
        _ => None,
    };
    StoreError::sqlite(code, &e.to_string(), Some(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use uuid::Uuid;

    use super::*;
    use crate::model::StepKindName;
    use crate::store::{NewSaga, SqliteStore, Store};

    #[test]
    fn busy_and_locked_are_transient_whatever_the_extended_code_and_a_constraint_is_not() {
        let err = |code| StoreError::sqlite(Some(code), "", None);
        // SQLITE_BUSY, SQLITE_BUSY_SNAPSHOT, SQLITE_BUSY_TIMEOUT, SQLITE_LOCKED.
        for code in [5, 517, 773, 6] {
            assert!(err(code).is_transient(), "{code}");
        }
        // SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_IOERR, SQLITE_READONLY.
        for code in [1555, 10, 8] {
            assert!(!err(code).is_transient(), "{code}");
        }
    }

    #[test]
    fn a_failed_call_keeps_sqlites_extended_code() {
        let db = Connection::open_in_memory().unwrap();
        db.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1)")
            .unwrap();
        let e = db
            .execute("INSERT INTO t VALUES (1)", [])
            .map_err(from_rusqlite)
            .unwrap_err();
        assert_eq!(e.backend().and_then(|b| b.code()), Some("1555"), "{e:?}");
    }

    /// Statements prepared on the connection of `pool` and not finalized, once the driver's
    /// own are cleared.
    #[allow(unsafe_code)]
    async fn statements_left(pool: &SqlitePool) -> usize {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::Connection::clear_cached_statements(&mut *conn)
            .await
            .unwrap();
        let mut locked = conn.lock_handle().await.unwrap();
        let raw = locked.as_raw_handle().as_ptr();
        let mut count = 0;
        // SAFETY: the handle is locked; `sqlite3_next_stmt` only walks its statement list.
        let mut st = unsafe { rusqlite::ffi::sqlite3_next_stmt(raw, std::ptr::null_mut()) };
        while !st.is_null() {
            count += 1;
            st = unsafe { rusqlite::ffi::sqlite3_next_stmt(raw, st) };
        }
        count
    }

    fn new_saga() -> NewSaga {
        NewSaga {
            id: Uuid::now_v7(),
            name: "kept".to_owned(),
            version: 1,
            definition_hash: "h".to_owned(),
            input: serde_json::json!({}),
            steps: vec![("a".to_owned(), StepKindName::Compensatable)],
            first_attempt: false,
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
}
