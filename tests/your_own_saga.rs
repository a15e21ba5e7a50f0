//! The README's "Your own saga" program, as a new user runs it: the exact files the README
//! shows (`examples/your-own-saga`), built, served on the embedded default in an empty
//! directory, started over HTTP and inspected with the `saga` CLI.

#![allow(clippy::unwrap_used)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use saga_suite::{bin_path, sigterm};
use serde_json::{json, Value};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced block that follows `<!-- FILE -->` in the README.
fn readme_block(file: &str) -> String {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let marker = format!("<!-- {file} -->");
    let after = readme
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"))
        .1;
    let fence_open = after.find("```").unwrap();
    let body = &after[fence_open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    body[..body.find("\n```").unwrap() + 1].to_owned()
}

#[test]
fn the_readme_shows_the_program_exactly() {
    for file in ["Cargo.toml", "src/lib.rs", "src/main.rs"] {
        let on_disk =
            std::fs::read_to_string(workspace().join("examples/your-own-saga").join(file)).unwrap();
        assert_eq!(
            readme_block(&format!("your-own-saga/{file}")),
            on_disk,
            "README.md's copy of examples/your-own-saga/{file} differs from the file"
        );
    }
}

#[test]
fn the_readme_shows_a_test_of_the_crate_as_it_is() {
    let file = "tests/crash_points.rs";
    let on_disk =
        std::fs::read_to_string(workspace().join("examples/your-own-saga").join(file)).unwrap();
    let shown = readme_block(&format!("your-own-saga/{file} (excerpt)"));
    assert!(
        on_disk.contains(&shown),
        "README.md's excerpt of examples/your-own-saga/{file} is not in the file:\n{shown}"
    );
}

fn saga_cli(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin_path("saga"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "saga {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_program_serves_its_saga_and_the_cli_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin_path("your-own-saga"))
        .current_dir(dir.path())
        // The README runs it on 127.0.0.1:8080; a test takes whatever port is free.
        .env("SAGA_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let database = lines.next().unwrap().unwrap();
    assert!(database.ends_with("saga.db (SQLite)"), "{database}");
    let listening = lines.next().unwrap().unwrap();
    let base = listening.strip_prefix("listening on ").unwrap().to_owned();
    std::thread::spawn(move || lines.for_each(drop));

    let http = reqwest::Client::new();
    let start = |body: Value| {
        let http = http.clone();
        let url = format!("{base}/v1/sagas/book_seat?");
        async move {
            let r = http
                .post(url.trim_end_matches('?'))
                .header("prefer", "wait=10")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "ended within the wait");
            r.json::<Value>().await.unwrap()
        }
    };
    let booked = start(json!({"seat": "12A", "amount": 120})).await;
    assert_eq!(booked["status"], "COMPLETED", "{booked}");
    let declined = start(json!({"seat": "12B", "amount": 900})).await;
    assert_eq!(declined["status"], "COMPENSATED", "{declined}");
    assert_eq!(
        declined["error"], "charge_card: card declined",
        "{declined}"
    );
    assert_eq!(declined["steps"][0]["compensation"]["status"], "SUCCEEDED");

    // The operator CLI on the same directory's saga.db, beside the running server.
    let list = saga_cli(dir.path(), &["list"]);
    for id in [&booked["id"], &declined["id"]] {
        assert!(list.contains(id.as_str().unwrap()), "{list}");
    }
    let show = saga_cli(
        dir.path(),
        &["show", declined["id"].as_str().unwrap(), "--json"],
    );
    let shown: Value = serde_json::from_str(&show).unwrap();
    assert_eq!(shown["status"], "COMPENSATED");

    let status = sigterm(&mut child);
    assert!(status.success(), "{status:?}");
}

#[test]
fn help_lists_the_serve_flags_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin_path("your-own-saga"))
        .current_dir(dir.path())
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in ["--listen", "--database-url", "--workers", "--log-format"] {
        assert!(help.contains(flag), "{flag} missing from the help:\n{help}");
    }
    assert!(
        help.contains("Usage: your-own-saga"),
        "the program's own name:\n{help}"
    );
    let created: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(created.is_empty(), "--help created {created:?}");
}

#[test]
fn a_bare_port_listens_on_the_loopback_and_the_log_shows_at_info() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(bin_path("your-own-saga"))
        .current_dir(dir.path())
        .args(["--listen", &port.to_string()])
        .env_remove("RUST_LOG")
        .env_remove("SAGA_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let _database = lines.next().unwrap().unwrap();
    let listening = lines.next().unwrap().unwrap();
    assert_eq!(listening, format!("listening on http://127.0.0.1:{port}"));
    let stderr = child.stderr.take().unwrap();
    let status = sigterm(&mut child);
    assert!(status.success(), "{status:?}");
    let log = std::io::read_to_string(stderr).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("INFO") && l.contains("serving")),
        "no info line saying it serves:\n{log}"
    );
}

#[test]
fn a_listen_address_without_a_port_is_refused_with_what_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin_path("your-own-saga"))
        .current_dir(dir.path())
        .args(["--listen", "localhost"])
        .env_remove("SAGA_LISTEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("HOST:PORT") && err.contains("PORT"), "{err}");
    let created: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(
        created.is_empty(),
        "a refused command line created {created:?}"
    );
}
