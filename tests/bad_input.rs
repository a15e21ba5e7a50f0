//! Bad input and broken storage: a corrupt row, a database file that cannot be written, a
//! database URL that names a missing folder or a setting that does not exist, a PostgreSQL
//! server that is not there, a step list changed under the same version. Each gets a clear
//! message that names the cause and the fix, said once, no panic, and loses nothing.

#![allow(clippy::unwrap_used)]

use orchestrator::store::Audit;
use orchestrator::store::LogReads;
use std::time::Duration;

use orchestrator::model::SagaStatus;
use saga_dsl::StepKind::Compensatable;
use saga_suite::{
    bin_path, registry_of, scripted_saga, test_config, wait_for, wait_terminal, Journal,
    RunningEngine, ScriptedStep as S, TempDb,
};
use serde_json::json;

#[tokio::test]
async fn a_corrupt_row_is_parked_and_flagged_while_other_sagas_run() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let registry = registry_of([scripted_saga(
        "s",
        1,
        &[S::new("a", Compensatable), S::new("b", Compensatable)],
        &j,
    )]);
    let idle = orchestrator::Engine::new(
        store.clone(),
        std::sync::Arc::new(registry.clone()),
        test_config(),
    );
    let bad = idle.start_saga("s", json!({})).await.unwrap();
    let good = idle.start_saga("s", json!({})).await.unwrap();

    // Someone edits the log by hand and writes a status no version knows.
    db.execute(&format!(
        "UPDATE steps SET status = 'HALF_DONE' WHERE saga_id = '{}' AND idx = 0",
        bad.id
    ))
    .await;

    let eng = RunningEngine::start(store.clone(), registry, test_config());
    assert_eq!(
        wait_terminal(&store, good.id).await.status,
        SagaStatus::Completed,
        "the other saga is not held up"
    );
    // Reading the corrupt saga is a clear error naming it, not a panic.
    let err = store.get_saga(bad.id).await.unwrap_err().to_string();
    assert!(
        err.contains(&bad.id.to_string()) && err.contains("HALF_DONE"),
        "{err}"
    );
    assert!(!err.contains('\n'));
    let flagged = store
        .list_sagas(&orchestrator::model::ListFilter {
            needs_attention: true,
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(flagged.sagas.len(), 1);
    assert_eq!(flagged.sagas[0].id, bad.id);
    let events = store.events(bad.id).await.unwrap();
    assert!(events.iter().any(|e| e.kind == "saga.corrupt"));

    // Repaired by hand and retried, it runs to the end: nothing was lost.
    db.execute(&format!(
        "UPDATE steps SET status = 'PENDING' WHERE saga_id = '{}' AND idx = 0",
        bad.id
    ))
    .await;
    store
        .retry_now(bad.id, &Audit::by("ops@test"))
        .await
        .unwrap();
    let done = wait_for(&store, bad.id, Duration::from_secs(10), |s| {
        s.status.is_terminal()
    })
    .await;
    assert_eq!(done.status, SagaStatus::Completed);
    eng.stop().await;
}

/// Runs `example-sagas` as an unprivileged user when we are root (root writes anywhere).
fn unprivileged(args: &[&str]) -> std::process::Output {
    let bin = bin_path("example-sagas");
    let is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut cmd = if is_root {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin);
        c
    } else {
        std::process::Command::new(&bin)
    };
    cmd.args(args).env("RUST_LOG", "off").output().unwrap()
}

#[tokio::test]
async fn a_database_that_cannot_be_written_is_a_one_line_error_and_loses_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("saga.db");
    let url = format!("sqlite://{}", path.display());
    // A database with one saga in it, then made read-only for everyone but its owner.
    let store = orchestrator::store::SqliteStore::open(&url).await.unwrap();
    let j = Journal::default();
    let idle = orchestrator::Engine::new(
        std::sync::Arc::new(store),
        std::sync::Arc::new(registry_of([scripted_saga(
            "s",
            1,
            &[S::new("a", Compensatable)],
            &j,
        )])),
        test_config(),
    );
    let saga = idle.start_saga("s", json!({"keep": "me"})).await.unwrap();
    drop(idle);
    for f in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::set_permissions(f.unwrap().path(), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
    // The directory stays writable (the engine lock file can be made): only the database
    // file itself refuses writes. The participants' store lives elsewhere.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let shop_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shop_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let shop = format!("sqlite://{}", shop_dir.path().join("shop.db").display());
    let out = unprivileged(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        &url,
        "--shop-database-url",
        &shop,
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains("readonly")
            || stderr.contains("read-only")
            || stderr.contains("unable to open"),
        "says why: {stderr}"
    );

    // Nothing lost: the saga is still there, readable by its owner.
    let store = orchestrator::store::SqliteStore::open(&url).await.unwrap();
    let back = store.get_saga(saga.id).await.unwrap().unwrap();
    assert_eq!(back.input, json!({"keep": "me"}));
}

#[tokio::test]
async fn a_value_the_database_cannot_hold_is_refused_cleanly() {
    let db = TempDb::new();
    let store = db.store().await;
    let j = Journal::default();
    let engine = orchestrator::Engine::new(
        store.clone(),
        std::sync::Arc::new(registry_of([scripted_saga(
            "s",
            1,
            &[S::new("a", Compensatable)],
            &j,
        )])),
        test_config(),
    );
    let input = json!({"note": "before\u{0}after"});
    match engine.start_saga("s", input.clone()).await {
        // SQLite stores it and gives it back unchanged.
        Ok(saga) => {
            let back = store.get_saga(saga.id).await.unwrap().unwrap();
            assert_eq!(back.input, input);
        }
        // PostgreSQL refuses NUL in JSON: a typed error (HTTP 400), not a database failure.
        Err(orchestrator::StartError::Store(orchestrator::StoreError::InvalidValue(m))) => {
            assert!(!m.is_empty());
            let page = store
                .list_sagas(&orchestrator::model::ListFilter {
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert!(page.sagas.is_empty(), "nothing half-written");
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Runs `bin` with `args`, the database `url` in `DATABASE_URL`, no log lines and no
/// backtraces: what remains on stderr is the error a person reads.
fn run_quietly(bin: &str, url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(bin_path(bin))
        .args(args)
        .env("DATABASE_URL", url)
        .env("SAGA_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "off")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .env_remove("SAGA_SERVER")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// What a failed run said on stderr, checked to be a failure.
fn failure(out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "it succeeded: {stderr}");
    stderr
}

/// The ways each binary starts on a database: the `saga` CLI creating one and reading one,
/// the application serving one, and the README's own program (which returns its error from
/// `main`, so anyhow prints it with its chain).
fn every_way_in(shop: &str) -> Vec<(&'static str, Vec<String>)> {
    vec![
        ("saga", vec!["migrate".to_owned()]),
        ("saga", vec!["list".to_owned()]),
        (
            "example-sagas",
            vec![
                "serve".to_owned(),
                "--listen".to_owned(),
                "127.0.0.1:0".to_owned(),
                "--shop-database-url".to_owned(),
                shop.to_owned(),
            ],
        ),
        ("your-own-saga", vec![]),
    ]
}

#[test]
fn a_database_in_a_missing_folder_names_the_folder_and_how_to_make_it() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("missing").join("dir");
    let url = format!("sqlite://{}", folder.join("saga.db").display());
    let shop = format!("sqlite://{}", dir.path().join("shop.db").display());
    for (bin, args) in every_way_in(&shop) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stderr = failure(&run_quietly(bin, &url, &args));
        let said = format!("the folder {} does not exist", folder.display());
        assert!(stderr.contains(&said), "{bin} {args:?}: {stderr}");
        assert!(stderr.contains("mkdir -p"), "{bin} {args:?}: {stderr}");
        assert_eq!(stderr.matches(&said).count(), 1, "said once: {stderr}");
        assert!(!stderr.contains("Caused by"), "{bin}: {stderr}");
        if bin != "your-own-saga" {
            assert_eq!(stderr.trim().lines().count(), 1, "{bin}: {stderr}");
            assert!(stderr.starts_with("error: "), "{bin}: {stderr}");
        }
    }
    assert!(!dir.path().join("missing").exists(), "nothing was created");
}

#[test]
fn an_unknown_synchronous_setting_names_the_parameter_and_its_values() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?synchronous=bogus",
        dir.path().join("saga.db").display()
    );
    let shop = format!("sqlite://{}", dir.path().join("shop.db").display());
    for (bin, args) in every_way_in(&shop) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stderr = failure(&run_quietly(bin, &url, &args));
        for words in [
            "synchronous=bogus",
            "synchronous=full",
            "synchronous=normal",
        ] {
            assert!(
                stderr.contains(words),
                "{bin} {args:?} lacks {words}: {stderr}"
            );
        }
        assert!(!stderr.contains("unsupported database URL"), "{stderr}");
        assert!(!stderr.contains("Caused by"), "{bin}: {stderr}");
    }
    assert!(!dir.path().join("saga.db").exists(), "nothing was created");
}

#[test]
fn a_refused_postgres_connection_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = "postgres://postgres:hunter2@127.0.0.1:1/x";
    let shop = format!("sqlite://{}", dir.path().join("shop.db").display());
    for (bin, args) in every_way_in(&shop) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let stderr = failure(&run_quietly(bin, url, &args));
        assert_eq!(
            stderr.matches("connection refused").count(),
            1,
            "{bin} {args:?}: {stderr}"
        );
        assert!(stderr.contains("127.0.0.1:1"), "{bin}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{bin}: {stderr}");
        assert!(!stderr.contains("Caused by"), "{bin}: {stderr}");
    }
}

#[tokio::test]
async fn a_step_list_changed_under_the_same_version_is_warned_of_at_start() {
    use std::io::BufRead;

    let db = TempDb::new();
    let store = db.store().await;
    // Two unfinished `place_order` sagas of version 1 with another step list than the
    // application's, as a previous build of it would have left them; and a finished one,
    // which needs nothing.
    let old = scripted_saga(
        "place_order",
        1,
        &[S::new("reserve_stock", Compensatable)],
        &Journal::default(),
    );
    for _ in 0..2 {
        store
            .create_saga(orchestrator::store::NewSaga::of(&old, json!({})))
            .await
            .unwrap();
    }
    drop(store);
    let mut child = std::process::Command::new(bin_path("example-sagas"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
        ])
        .arg("--shop-database-url")
        .arg(format!(
            "sqlite://{}",
            db.dir.path().join("shop.db").display()
        ))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("another step list") {
                let _ = tx.send(line);
            }
        }
    });
    let warning = rx.recv_timeout(Duration::from_secs(30));
    let _ = child.kill();
    let _ = child.wait();
    let warning = warning.expect("no warning of the changed step list");
    assert!(
        warning.contains("2 unfinished place_order saga(s) of version 1"),
        "how many, of what: {warning}"
    );
    assert!(warning.contains("blocked"), "{warning}");
    assert!(
        warning.contains("version 2") && warning.contains("restore the old steps"),
        "what to do: {warning}"
    );
}
