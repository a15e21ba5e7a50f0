//! Statements run through SQLite's own API (rusqlite) on a handle borrowed from the driver
//! (`handle.rs`): one statement, a savepoint around a closure, and SQLite's errors as
//! store errors.

use rusqlite::Connection;

use crate::store::{Result, StoreError};

/// Runs `sql` with `params`, prepared once per connection made over the handle; the rows it
/// changed.
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
    use super::*;

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
}
