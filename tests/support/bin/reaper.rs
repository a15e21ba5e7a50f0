//! `saga-suite-reaper DIR [ADMIN_URL DATABASE]`: removes a test database once the test process
//! that made it has exited. That process holds this one's stdin open until it ends, however it
//! ends (even killed), so the end of stdin is the signal; then `DIR` is removed and, when given,
//! the PostgreSQL database `DATABASE` on the server `ADMIN_URL` is dropped. Started by
//! `TempDb::remove_after_exit`, for a database that lives in a `static`, which is never dropped.

use std::io::Read;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut rest = Vec::new();
    // Blocks until every holder of the other end is gone; an error means the same.
    let _ = std::io::stdin().read_to_end(&mut rest);
    if let [_, admin_url, name] = args.as_slice() {
        saga_suite::drop_pg_database(admin_url, name);
    }
    if let Some(dir) = args.first() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
