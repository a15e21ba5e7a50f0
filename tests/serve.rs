//! `serve` as a new user meets it, with real processes: what it prints first, how it refuses
//! to start, and that a start that fails leaves nothing behind.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use saga_suite::{bin_path, sigterm, wait_exit, Server, TempDb};

/// Flags that pass parsing and fail once the database is open: the relay cannot send to ftp.
const BAD_WEBHOOK: &[&str] = &[
    "--listen",
    "127.0.0.1:0",
    "--webhook-url",
    "ftp://hooks.example/x",
];

/// What a finished process said.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `example-sagas serve ARGS` in `dir` until it exits (at most 30 s).
fn serve_to_exit(dir: &Path, args: &[&str]) -> Finished {
    let started = Instant::now();
    let mut child = Command::new(bin_path("example-sagas"))
        .current_dir(dir)
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Finished {
        code: status.code(),
        stdout,
        stderr,
        took: started.elapsed(),
    }
}

/// The names of the files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Starts `serve` in `dir` with its defaults (`saga.db` and `shop.db` there) and returns the
/// process with the first two lines it printed.
fn spawn_in(dir: &Path, args: &[&str]) -> (Child, Vec<String>) {
    use std::io::BufRead;
    let mut child = Command::new(bin_path("example-sagas"))
        .current_dir(dir)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let lines = (0..2)
        .map(|_| rx.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    (child, lines)
}

#[test]
fn serve_names_its_database_then_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, lines) = spawn_in(dir.path(), &[]);
    let db = std::fs::canonicalize(dir.path()).unwrap().join("saga.db");
    assert_eq!(lines[0], format!("database {} (SQLite)", db.display()));
    assert!(
        lines[1].starts_with("listening on http://127.0.0.1:"),
        "{lines:?}"
    );
    assert!(sigterm(&mut child).success(), "a SIGTERM is a clean stop");
}

#[test]
fn serve_on_postgres_prints_the_url_without_its_password() {
    let db = TempDb::postgres();
    // The server trusts loopback connections, so any password is accepted (and must not show).
    let url = db
        .url
        .replacen("postgres://postgres@", "postgres://postgres:hunter2@", 1);
    assert!(url.contains("hunter2"), "{url}");
    let dir = tempfile::tempdir().unwrap();
    let (mut child, lines) = spawn_in(dir.path(), &["--database-url", &url]);
    let shown = url.replace("hunter2", "***");
    assert_eq!(lines[0], format!("database {shown} (PostgreSQL)"));
    assert!(lines[1].starts_with("listening on http://"), "{lines:?}");
    assert!(sigterm(&mut child).success());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_a_held_file_fails_before_it_says_it_listens() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("saga.db").display());
    let first = Server::spawn(&url, dir.path(), &[], &[]).await;
    let before = files(dir.path());
    let second = serve_to_exit(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--database-url", &url],
    );
    assert_eq!(second.code, Some(1), "{}", second.stderr);
    assert!(
        !second.stdout.contains("listening on"),
        "it never said it listens: {}",
        second.stdout
    );
    assert!(
        second
            .stderr
            .contains("another orchestrator process is running on"),
        "{}",
        second.stderr
    );
    assert_eq!(
        second.stderr.lines().count(),
        1,
        "one line: {}",
        second.stderr
    );
    assert_eq!(files(dir.path()), before, "nothing created or removed");
    // The first server is untouched.
    let health = reqwest::get(format!("{}/healthz", first.base))
        .await
        .unwrap();
    assert!(health.status().is_success());
}

#[test]
fn a_start_that_fails_leaves_no_new_files() {
    // After the database was opened and migrated: a webhook URL the relay cannot use.
    let dir = tempfile::tempdir().unwrap();
    let bad = serve_to_exit(dir.path(), BAD_WEBHOOK);
    assert_eq!(bad.code, Some(1), "{}", bad.stderr);
    assert!(
        bad.stderr.contains("invalid webhook settings"),
        "{}",
        bad.stderr
    );
    assert!(!bad.stdout.contains("listening on"), "{}", bad.stdout);
    assert_eq!(
        files(dir.path()),
        Vec::<String>::new(),
        "saga.db, shop.db and their files removed"
    );

    // Before anything was opened: a port already taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let busy = serve_to_exit(dir.path(), &["--listen", &addr]);
    assert_eq!(busy.code, Some(1), "{}", busy.stderr);
    assert!(
        busy.stderr.contains(&format!("cannot listen on {addr}")),
        "{}",
        busy.stderr
    );
    assert!(busy.took < Duration::from_secs(10), "{:?}", busy.took);
    assert_eq!(files(dir.path()), Vec::<String>::new());
}

#[test]
fn a_start_that_fails_keeps_the_files_of_an_existing_database() {
    let dir = tempfile::tempdir().unwrap();
    // A first run creates the databases and stops cleanly.
    let (mut child, _) = spawn_in(dir.path(), &[]);
    assert!(sigterm(&mut child).success());
    let before = files(dir.path());
    assert!(before.contains(&"saga.db".to_owned()), "{before:?}");
    assert!(before.contains(&"shop.db".to_owned()), "{before:?}");
    let bad = serve_to_exit(dir.path(), BAD_WEBHOOK);
    assert_eq!(bad.code, Some(1), "{}", bad.stderr);
    let after = files(dir.path());
    for name in ["saga.db", "shop.db"] {
        assert!(after.contains(&name.to_owned()), "{name} kept: {after:?}");
    }
}
