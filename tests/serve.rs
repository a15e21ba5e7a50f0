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

#[test]
fn a_bad_tokens_file_stops_serve_with_one_line_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let conf = tempfile::tempdir().unwrap();
    let file = conf.path().join("tokens");
    for (text, says) in [
        (
            "ops operate s3cret-ops-0123456789\nci read\n",
            "line 2: expected `name scope[,scope] token`",
        ),
        (
            "ci read,wirte s3cret-ci\n",
            "line 1: unknown scope \"wirte\"",
        ),
        (
            "ci read s3cret-a\n# the pipeline\nci start s3cret-b\n",
            "line 3: the name \"ci\" is given twice",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let args = ["--listen", "127.0.0.1:0", "--api-tokens-file"];
        let out = serve_to_exit(dir.path(), &[&args[..], &[file.to_str().unwrap()]].concat());
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{:?}", out.stderr);
        assert!(lines[0].contains(says), "{}", lines[0]);
        assert!(lines[0].contains(file.to_str().unwrap()), "{}", lines[0]);
        assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
        assert!(!out.stdout.contains("listening on"), "{}", out.stdout);
        assert_eq!(files(dir.path()), Vec::<String>::new(), "nothing created");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_abort_through_the_server_with_a_scoped_token_and_are_audited_by_its_name() {
    use saga_suite::run_bin;
    use serde_json::{json, Value};
    let db = TempDb::new();
    let dir = db.dir.path();
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        "# name scopes token\nci start,read ci-token-0123456789\nops operate,read ops-token-0123456789\n",
    )
    .unwrap();
    let server = Server::spawn(
        &db.url,
        dir,
        &[],
        &[
            "--api-tokens-file",
            tokens.to_str().unwrap(),
            "--allow-callback-host",
            "127.0.0.1",
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let input = json!({"order_id": "o-abort", "user": "ada", "amount": 5,
                       "simulate": {"delay_ms": 3000}});
    // The operator allowed 127.0.0.1, so a callback there is accepted.
    let started: Value = client
        .post(format!("{}/v1/sagas/place_order", server.base))
        .bearer_auth("ci-token-0123456789")
        .header("saga-callback-url", "http://127.0.0.1:9/hook")
        .json(&input)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = started["id"].as_str().unwrap().to_owned();
    let base = server.base.as_str();

    // The start token may not abort: the CLI says why, in one line.
    let refused = run_bin(
        "saga",
        &[
            "abort",
            &id,
            "--reason",
            "x",
            "--server",
            base,
            "--token",
            "ci-token-0123456789",
        ],
        dir,
    )
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("forbidden") || stderr.contains("403"),
        "{stderr}"
    );
    assert!(stderr.contains("operate"), "{stderr}");

    let done = run_bin(
        "saga",
        &[
            "abort",
            &id,
            "--reason",
            "customer called",
            "--server",
            base,
            "--token",
            "ops-token-0123456789",
        ],
        dir,
    )
    .await;
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(stdout.contains("is now ABORTED"), "{stdout}");
    let events: Value = client
        .get(format!("{base}/v1/sagas/{id}/events"))
        .bearer_auth("ops-token-0123456789")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let aborted = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "saga.aborted")
        .cloned()
        .unwrap();
    assert_eq!(aborted["data"]["actor"], "ops");
    assert_eq!(aborted["data"]["reason"], "customer called");

    // Without --server the CLI writes the database itself, and says so.
    let direct = run_bin("saga", &["retry", &id, "--database-url", &db.url], dir).await;
    let stderr = String::from_utf8_lossy(&direct.stderr);
    assert!(stderr.contains("writes the database directly"), "{stderr}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_retention_purges_finished_sagas_on_its_own() {
    use serde_json::{json, Value};
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &["--retention", "1s"]).await;
    let client = reqwest::Client::new();
    let input = json!({"order_id": "o-old", "user": "ada", "amount": 5});
    let started: Value = client
        .post(format!("{}/v1/sagas/place_order", server.base))
        .header("prefer", "wait=20")
        .json(&input)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(started["status"], "COMPLETED", "{started}");
    let url = format!(
        "{}/v1/sagas/{}",
        server.base,
        started["id"].as_str().unwrap()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = client.get(&url).send().await.unwrap().status();
        if status == reqwest::StatusCode::NOT_FOUND {
            break;
        }
        assert_eq!(status, reqwest::StatusCode::OK);
        assert!(Instant::now() < deadline, "never purged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(server);
}

/// One sample of a Prometheus text exposition: its family's type, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    kind: String,
    labels: std::collections::BTreeMap<String, String>,
    value: f64,
}

/// Parses a Prometheus text exposition into samples by series name, each with the `# TYPE`
/// of its family (a histogram's `_bucket`, `_sum` and `_count` belong to it); panics on a line
/// that is not of the format, or a series without `# TYPE` and `# HELP`.
fn parse_exposition(text: &str) -> std::collections::BTreeMap<String, Vec<Sample>> {
    use std::collections::BTreeMap;
    let mut types = BTreeMap::new();
    let mut helps = std::collections::BTreeSet::new();
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helps.insert(rest.split_once(' ').unwrap().0.to_owned());
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| types.get(*f).is_some_and(|k| k == "histogram"))
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("{family} has no # TYPE"))
            .clone();
        assert!(helps.contains(family), "{family} has no # HELP");
        out.entry(name.to_owned()).or_default().push(Sample {
            kind,
            labels,
            value: value.parse().unwrap(),
        });
    }
    out
}

/// A fresh server's first scrape already has every series whose labels are known, at 0, with
/// its type: the histograms of saga and step durations and of each route's success answers
/// too. Error answers' series appear with the first one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_has_its_series_at_zero_from_the_first_scrape() {
    let db = TempDb::sqlite();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let scrape = || async { parse_exposition(&server.metrics().await) };
    let first = scrape().await;
    let value = |m: &std::collections::BTreeMap<String, Vec<Sample>>,
                 name: &str,
                 labels: &[(&str, &str)]|
     -> Option<(String, f64)> {
        m.get(name)?
            .iter()
            .find(|s| {
                s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| (s.kind.clone(), s.value))
    };
    let counter = |v: f64| Some(("counter".to_owned(), v));
    let gauge = |v: f64| Some(("gauge".to_owned(), v));
    for name in ["place_order", "book_trip", "fulfil_order"] {
        assert_eq!(
            value(&first, "saga_started_total", &[("name", name)]),
            counter(0.0)
        );
        for status in ["COMPLETED", "COMPENSATED", "FAILED", "ABORTED"] {
            assert_eq!(
                value(
                    &first,
                    "saga_ended_total",
                    &[("name", name), ("status", status)]
                ),
                counter(0.0),
                "{name} {status}"
            );
        }
    }
    let retries = [
        ("name", "place_order"),
        ("step", "charge_payment"),
        ("phase", "action"),
    ];
    assert_eq!(
        value(&first, "saga_step_retries_total", &retries),
        counter(0.0)
    );
    let undone = [("name", "place_order"), ("step", "reserve_stock")];
    assert_eq!(
        value(&first, "saga_compensations_total", &undone),
        counter(0.0)
    );
    for status in [
        "QUEUED",
        "RUNNING",
        "COMPENSATING",
        "PAUSED",
        "COMPLETED",
        "COMPENSATED",
        "FAILED",
        "ABORTED",
    ] {
        assert_eq!(
            value(&first, "sagas_by_status", &[("status", status)]),
            gauge(0.0),
            "{status}"
        );
    }
    for kind in ["sleep", "signal", "child", "scheduled"] {
        assert_eq!(value(&first, "saga_waiting", &[("kind", kind)]), gauge(0.0));
    }
    for name in [
        "idempotent_replays_total",
        "webhook_failures_total",
        "saga_purged_total",
    ] {
        assert_eq!(value(&first, name, &[]), counter(0.0), "{name}");
    }
    for result in ["delivered", "gave_up"] {
        assert_eq!(
            value(&first, "webhook_deliveries_total", &[("result", result)]),
            counter(0.0)
        );
    }
    assert_eq!(value(&first, "saga_needs_attention", &[]), gauge(0.0));
    let histogram = |v: f64| Some(("histogram".to_owned(), v));
    let completed = [("name", "place_order"), ("status", "COMPLETED")];
    for series in ["saga_duration_seconds_count", "saga_duration_seconds_sum"] {
        assert_eq!(
            value(&first, series, &completed),
            histogram(0.0),
            "{series}"
        );
    }
    for (step, phase, outcome) in [
        ("reserve_stock", "action", "succeeded"),
        ("reserve_stock", "compensation", "timed_out"),
        ("charge_payment", "action", "retryable"),
    ] {
        let labels = [
            ("name", "place_order"),
            ("step", step),
            ("phase", phase),
            ("outcome", outcome),
        ];
        assert_eq!(
            value(&first, "saga_step_duration_seconds_count", &labels),
            histogram(0.0),
            "{step} {phase} {outcome}"
        );
    }
    let accepted = [
        ("method", "POST"),
        ("route", "/v1/sagas/{saga}"),
        ("status", "202"),
    ];
    assert_eq!(
        value(&first, "http_request_duration_seconds_count", &accepted),
        histogram(0.0)
    );
    assert_eq!(
        value(&first, "http_requests_total", &accepted),
        counter(0.0)
    );
    let buckets = first["http_request_duration_seconds_bucket"]
        .iter()
        .filter(|s| s.labels.get("route").map(String::as_str) == Some("/v1/sagas/{saga}"))
        .filter(|s| s.labels.get("method").map(String::as_str) == Some("POST"))
        .count();
    assert!(
        buckets > 10,
        "every bucket of the start route is there: {buckets}"
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        value(&first, "saga_build_info", &[("version", version)]),
        gauge(1.0)
    );

    let id = server
        .start(
            "place_order",
            serde_json::json!({"order_id": "o-m", "user": "ada", "amount": 5}),
        )
        .await;
    server
        .wait_for(id, Duration::from_secs(30), |s| s["status"] == "COMPLETED")
        .await;
    let after = scrape().await;
    let ended = [("name", "place_order"), ("status", "COMPLETED")];
    assert_eq!(value(&after, "saga_ended_total", &ended), counter(1.0));
    assert_eq!(
        value(&after, "sagas_by_status", &[("status", "COMPLETED")]),
        gauge(1.0)
    );
    let lived = value(&after, "saga_duration_seconds_count", &ended).unwrap();
    assert_eq!(lived, ("histogram".to_owned(), 1.0));
    let post = [
        ("method", "POST"),
        ("route", "/v1/sagas/{saga}"),
        ("status", "202"),
    ];
    assert_eq!(
        value(&after, "http_request_duration_seconds_count", &post),
        Some(("histogram".to_owned(), 1.0))
    );
    assert!(after["saga_step_duration_seconds_bucket"]
        .iter()
        .all(|s| s.kind == "histogram"));
    drop(server);
}

#[tokio::test]
async fn a_server_on_sqlite_writes_its_address_beside_the_database_while_it_serves() {
    let db = TempDb::new();
    let Some(file) = orchestrator::discovery::address_file(&db.url) else {
        // A PostgreSQL log has no file beside it: commands there need --server.
        return;
    };
    let mut server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    // The address commands on this database find, reachable from here even when the server
    // listens on every interface.
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written.trim(), server.base);
    assert!(sigterm(&mut server.child).success());
    assert!(
        !file.exists(),
        "a server that stopped leaves no address behind"
    );
}
