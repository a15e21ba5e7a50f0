//! `sqlx::migrate!` embeds the migration files at compile time; tell cargo to rebuild when a
//! migration is added or changed, or a binary could run with a stale schema list.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    println!("cargo:rerun-if-changed=../migrations/sqlite");
    println!("cargo:rerun-if-changed=../migrations/postgres");
}
