//! Bad input and broken storage: a corrupt row, a database file that cannot be written. Each
//! gets a clear one-line error, no panic, and loses nothing.

#![allow(clippy::unwrap_used)]

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
    store.retry_now(bad.id, "ops@test").await.unwrap();
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
