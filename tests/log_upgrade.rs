//! Step logs written by older releases, opened by this one, on the backend `SAGA_TEST_BACKEND`
//! selects: the release before durable sleeps, and the release before child sagas. The upgrade
//! keeps every row, and sagas that were running, sleeping or waiting for a signal when the old
//! release stopped are finished by this one.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use orchestrator::model::{SagaStatus, StepStatus};
use std::time::Duration;

use saga_dsl::StepKind::{Compensatable, Pivot};
use saga_suite::{
    backend_is_postgres, registry_of, scripted_saga, test_config, wait_terminal, Journal,
    RunningEngine, ScriptedStep as S, TempDb,
};
use sqlx::migrate::Migrator;
use uuid::Uuid;

/// The first migration of the release that added sleeps, per backend.
fn sleeps_migration() -> (&'static str, &'static str) {
    if backend_is_postgres() {
        ("postgres", "0005")
    } else {
        ("sqlite", "0004")
    }
}

/// The first migration of the release that added child sagas and scheduled starts.
fn children_migration() -> (&'static str, &'static str) {
    if backend_is_postgres() {
        ("postgres", "0007")
    } else {
        ("sqlite", "0006")
    }
}

/// A copy of the migrations numbered below `before`, as the older release shipped them.
fn older_migrations(dir: &Path, backend: &str, before: &str) -> PathBuf {
    let older = dir.join("older-migrations");
    std::fs::create_dir(&older).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    let mut copied = 0;
    for entry in std::fs::read_dir(source).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().as_ref() < before {
            std::fs::copy(entry.path(), older.join(entry.file_name())).unwrap();
            copied += 1;
        }
    }
    assert!(copied >= 3, "the older release had its migrations");
    older
}

/// Runs `statements` on the database at `url` after migrating it with `migrations` only.
async fn write_older_log(url: &str, migrations: &Path, statements: &[String]) {
    let migrator = Migrator::new(migrations).await.unwrap();
    if backend_is_postgres() {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        migrator.run(&pool).await.unwrap();
        for s in statements {
            sqlx::query(s).execute(&pool).await.unwrap();
        }
        pool.close().await;
    } else {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true))
            .await
            .unwrap();
        migrator.run(&pool).await.unwrap();
        for s in statements {
            sqlx::query(s).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }
}

#[tokio::test]
async fn a_log_from_before_sleeps_keeps_its_rows_and_its_running_saga_finishes() {
    let db = TempDb::new();
    let (backend, before) = sleeps_migration();
    let older = older_migrations(db.dir.path(), backend, before);
    let j = Journal::default();
    let def = scripted_saga(
        "s",
        1,
        &[S::new("a", Compensatable), S::new("b", Pivot)],
        &j,
    );
    let (id, hash) = (Uuid::now_v7(), def.hash().to_owned());
    // Step `a` done, `b` not started: the saga was between two steps when the old release
    // stopped.
    let statements = [
        format!(
            "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
             input, output, next_run_at, created_at, updated_at) VALUES ('{id}', 's', 1, \
             '{hash}', 's@1#{hash}', 'RUNNING', '{{}}', NULL, 0, 1000, 2000)"
        ),
        format!(
            "INSERT INTO steps (saga_id, idx, name, kind, status, attempts, output, started_at, \
             ended_at, comp_status) VALUES ('{id}', 0, 'a', 'compensatable', 'SUCCEEDED', 1, \
             '{{\"old\": true}}', 1000, 1500, 'PENDING')"
        ),
        format!(
            "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
             VALUES ('{id}', 1, 'b', 'pivot', 'PENDING', 'NONE')"
        ),
    ];
    write_older_log(&db.url, &older, &statements).await;

    // This release opens it, upgrading it in place.
    let store = db.store().await;
    let saga = store.get_saga(id).await.unwrap().unwrap();
    assert_eq!(saga.status, SagaStatus::Running);
    let a = &saga.steps[0];
    assert_eq!(a.action.status, StepStatus::Succeeded);
    assert_eq!(a.output, Some(serde_json::json!({"old": true})));
    assert_eq!(
        (a.action.started_at, a.action.ended_at),
        (Some(1000), Some(1500))
    );
    assert!(saga.steps.iter().all(|s| s.wake_at.is_none()));

    let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
    let done = wait_terminal(&store, id).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(j.names(), ["b:action"], "a is not called again");
    assert_eq!(
        done.output.unwrap(),
        serde_json::json!({"a": {"old": true}, "b": {"step": "b", "attempt": 1}})
    );
    eng.stop().await;
}

#[tokio::test]
async fn a_log_from_before_child_sagas_keeps_its_sleeps_and_signals_and_they_end() {
    let db = TempDb::new();
    let (backend, before) = children_migration();
    let older = older_migrations(db.dir.path(), backend, before);
    let (j_sig, j_nap) = (Journal::default(), Journal::default());
    let sig = scripted_saga(
        "sig",
        1,
        &[
            S::new("a", Compensatable),
            S::signal("await", "approval"),
            S::new("b", Pivot),
        ],
        &j_sig,
    );
    let nap = scripted_saga(
        "nap",
        1,
        &[
            S::new("a", Compensatable),
            S::sleep("nap", Duration::from_secs(3600)),
            S::new("b", Pivot),
        ],
        &j_nap,
    );
    let (sig_id, nap_id) = (Uuid::now_v7(), Uuid::now_v7());
    let saga_row = |id: Uuid, name: &str, hash: &str, next_run_at: i64| {
        format!(
            "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
             input, next_run_at, created_at, updated_at) VALUES ('{id}', '{name}', 1, '{hash}', \
             '{name}@1#{hash}', 'RUNNING', '{{}}', {next_run_at}, 1000, 2000)"
        )
    };
    let done_a = |id: Uuid| {
        format!(
            "INSERT INTO steps (saga_id, idx, name, kind, status, attempts, output, started_at, \
             ended_at, comp_status) VALUES ('{id}', 0, 'a', 'compensatable', 'SUCCEEDED', 1, \
             'null', 1000, 1100, 'PENDING')"
        )
    };
    let pending_b = |id: Uuid| {
        format!(
            "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status) \
             VALUES ('{id}', 2, 'b', 'pivot', 'PENDING', 'NONE')"
        )
    };
    // `sig` waits for `approval`, which arrived just before the old release stopped; `nap`
    // sleeps until an instant that passed while no release ran.
    let statements = [
        saga_row(sig_id, "sig", sig.hash(), 0),
        done_a(sig_id),
        format!(
            "INSERT INTO steps (saga_id, idx, name, kind, status, started_at, comp_status, \
             waiting_for) VALUES ('{sig_id}', 1, 'await', 'signal', 'WAITING', 1100, 'NONE', \
             'approval')"
        ),
        pending_b(sig_id),
        format!(
            "INSERT INTO signals (saga_id, name, payload, received_at) \
             VALUES ('{sig_id}', 'approval', '{{\"by\": \"old\"}}', 1800)"
        ),
        saga_row(nap_id, "nap", nap.hash(), 1500),
        done_a(nap_id),
        format!(
            "INSERT INTO steps (saga_id, idx, name, kind, status, started_at, comp_status, \
             wake_at) VALUES ('{nap_id}', 1, 'nap', 'sleep', 'WAITING', 1100, 'NONE', 1500)"
        ),
        pending_b(nap_id),
    ];
    write_older_log(&db.url, &older, &statements).await;

    let store = db.store().await;
    for id in [sig_id, nap_id] {
        let saga = store.get_saga(id).await.unwrap().unwrap();
        assert_eq!(saga.status, SagaStatus::Running);
        assert_eq!(saga.steps[1].action.status, StepStatus::Waiting);
        assert_eq!(
            (
                saga.parent_id,
                saga.parent_stage.as_deref(),
                saga.scheduled_at
            ),
            (None, None, None),
            "the new columns start empty"
        );
    }
    assert_eq!(
        store.get_saga(nap_id).await.unwrap().unwrap().steps[1].wake_at,
        Some(1500)
    );

    let eng = RunningEngine::start(store.clone(), registry_of([sig, nap]), test_config());
    let sig_done = wait_terminal(&store, sig_id).await;
    let nap_done = wait_terminal(&store, nap_id).await;
    eng.stop().await;
    assert_eq!(sig_done.status, SagaStatus::Completed, "{sig_done:#?}");
    assert_eq!(
        sig_done.steps[1].output,
        Some(serde_json::json!({"by": "old"})),
        "the signal kept in the old log is the one taken"
    );
    assert_eq!(nap_done.status, SagaStatus::Completed, "{nap_done:#?}");
    assert_eq!(nap_done.steps[1].wake_at, Some(1500), "the wake time holds");
    assert_eq!(j_sig.names(), ["b:action"], "a is not called again");
    assert_eq!(j_nap.names(), ["b:action"]);
}
