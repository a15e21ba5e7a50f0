//! The schema migrations, embedded in the library by `build.rs` from the files of
//! `migrations/sqlite` and `migrations/postgres`, made into the [`Migrator`] that
//! `sqlx::migrate!` would have built from the same files: the same versions, descriptions and
//! checksums, so a log migrated by an earlier build opens unchanged.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use sqlx::error::BoxDynError;
use sqlx::migrate::{MigrateError, Migration, MigrationSource, MigrationType, Migrator};

include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// Migrations held in the binary, as `(version, file name, contents)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Embedded(pub(crate) &'static [(i64, &'static str, &'static str)]);

impl Embedded {
    /// The migrations, described as sqlx describes a file of a migrations directory.
    fn migrations(self) -> Vec<Migration> {
        self.0
            .iter()
            .map(|&(version, file, sql)| {
                let rest = file.split_once('_').map_or(file, |(_, rest)| rest);
                let migration_type = MigrationType::from_filename(rest);
                let description = rest
                    .trim_end_matches(migration_type.suffix())
                    .replace('_', " ");
                Migration::new(
                    version,
                    Cow::Owned(description),
                    migration_type,
                    Cow::Borrowed(sql),
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect()
    }

    /// The migrator that runs them.
    pub(crate) async fn migrator(self) -> Result<Migrator, MigrateError> {
        Migrator::new(self).await
    }
}

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send>> {
        Box::pin(std::future::ready(Ok(self.migrations())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sqlx::migrate!` embedded: the directory as sqlx reads it.
    fn from_directory(dir: &str) -> Vec<Migration> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations")
            .join(dir);
        sqlx::migrate::resolve_blocking(&path.canonicalize().unwrap())
            .unwrap()
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }

    fn assert_same(embedded: Embedded, dir: &str) {
        let ours = embedded.migrations();
        let theirs = from_directory(dir);
        assert!(!ours.is_empty());
        assert_eq!(ours.len(), theirs.len(), "{dir}: every file is embedded");
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a.version, b.version, "{dir}");
            assert_eq!(a.description, b.description, "{dir} {}", a.version);
            assert_eq!(a.migration_type, b.migration_type, "{dir} {}", a.version);
            assert_eq!(a.checksum, b.checksum, "{dir} {}", a.version);
            assert_eq!(a.no_tx, b.no_tx, "{dir} {}", a.version);
            assert_eq!(a.sql, b.sql, "{dir} {}", a.version);
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn the_embedded_sqlite_migrations_are_those_of_the_directory() {
        assert_same(Embedded(SQLITE), "sqlite");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn the_embedded_postgres_migrations_are_those_of_the_directory() {
        assert_same(Embedded(POSTGRES), "postgres");
    }
}
