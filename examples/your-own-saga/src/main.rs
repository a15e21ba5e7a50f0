//! The program: the `book_seat` saga (src/lib.rs) served over HTTP on a SQLite log.
use orchestrator::Orchestrator;
use saga_dsl::Registry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let book_seat = your_own_saga::book_seat(Default::default())?;
    // SQLite `saga.db` in the working directory, HTTP on 127.0.0.1:8080, until Ctrl-C;
    // `--help` lists the flags (`--listen 9000`, `--database-url`, `--workers`, …).
    Orchestrator::builder(Registry::new().with(book_seat)?)
        .run_from_args()
        .await?;
    Ok(())
}
