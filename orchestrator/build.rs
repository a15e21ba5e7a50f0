//! Embeds the migration files of `../migrations/sqlite` and `../migrations/postgres` in the
//! library (`$OUT_DIR/migrations.rs`, read by `src/store/migrations.rs`): a file added there is
//! picked up by the next build with no change to the code. This lists the files as
//! `sqlx::migrate!` did (a file named `<VERSION>_<DESCRIPTION>.sql`, anything else ignored)
//! without sqlx's `macros` feature, whose proc-macro crate compiles sqlx and SQLite a second
//! time for the build host.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let mut code = String::new();
    for (feature, constant, dir) in [
        ("sqlite", "SQLITE", "sqlite"),
        ("postgres", "POSTGRES", "postgres"),
    ] {
        let dir = manifest.join("../migrations").join(dir);
        // A directory is scanned whole: a file added, removed or edited reruns this script.
        println!("cargo:rerun-if-changed={}", dir.display());
        let files = listed(&dir);
        code.push_str(&format!(
            "/// The files of `migrations/{feature}`: version, file name, contents.\n\
             #[cfg(feature = \"{feature}\")]\n\
             pub(crate) const {constant}: &[(i64, &str, &str)] = &[\n"
        ));
        for (version, name, path) in files {
            code.push_str(&format!(
                "    ({version}, {name:?}, include_str!({:?})),\n",
                path.display()
            ));
        }
        code.push_str("];\n");
    }
    std::fs::write(out.join("migrations.rs"), code).expect("cannot write migrations.rs");
}

/// The migrations in `dir`, by version: the files whose name is `<VERSION>_<…>.sql`, as
/// sqlx's `resolve_blocking` selects them.
fn listed(dir: &Path) -> Vec<(i64, String, PathBuf)> {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read the migrations in {}: {e}", dir.display()));
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        let path = entry.path();
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((version, rest)) = name.split_once('_') else {
            continue;
        };
        if !rest.ends_with(".sql") {
            continue;
        }
        let version: i64 = version.parse().unwrap_or_else(|_| {
            panic!(
                "migration {}: expected an integer version before the first `_`",
                path.display()
            )
        });
        let path = path
            .canonicalize()
            .unwrap_or_else(|e| panic!("cannot resolve {}: {e}", path.display()));
        files.push((version, name, path));
    }
    files.sort_by_key(|(version, _, _)| *version);
    files
}
