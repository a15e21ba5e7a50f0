//! Step logs written by older releases, opened by this one, on the backend `SAGA_TEST_BACKEND`
//! selects: the release before durable sleeps, the release before child sagas, and the release
//! before branches and waits had columns of their own. The upgrade keeps every row, and sagas
//! that were running, sleeping, waiting for a signal or a child, or retrying a step or a branch
//! when the old release stopped are finished by this one.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use orchestrator::model::{SagaStatus, StepStatus};
use std::time::Duration;

use saga_dsl::StepKind::{Compensatable, Pivot};
use saga_suite::{
    backend_is_postgres, registry_of, scripted_saga, test_config, wait_terminal, Journal,
    RunningEngine, ScriptedStep as S, TempDb,
};
use serde_json::json;
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

/// The first migration of the release that gave branches and each kind of wait columns of
/// their own.
fn log_columns_migration() -> (&'static str, &'static str) {
    if backend_is_postgres() {
        ("postgres", "0011")
    } else {
        ("sqlite", "0010")
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

#[tokio::test]
async fn a_log_from_before_branch_and_wait_columns_finishes_sagas_parked_in_every_stage_kind() {
    let db = TempDb::new();
    let (backend, before) = log_columns_migration();
    let older = older_migrations(db.dir.path(), backend, before);
    let journals: [Journal; 6] = Default::default();
    let [j_nap, j_sig, j_grp, j_parent, j_leaf, j_plain] = &journals;
    let a = || S::new("a", Compensatable);
    let b = || S::new("b", Pivot);
    let nap = scripted_saga(
        "nap",
        1,
        &[a(), S::sleep("nap", Duration::from_secs(3600)), b()],
        j_nap,
    );
    let sig = scripted_saga(
        "sig",
        1,
        &[
            a(),
            S::signal("await", "approval")
                .timeout(Duration::from_secs(3600), Some(json!({"by": "default"}))),
            b(),
        ],
        j_sig,
    );
    let grp = scripted_saga(
        "grp",
        1,
        &[
            S::parallel(
                "g",
                vec![S::new("x1", Compensatable), S::new("x2", Compensatable)],
            ),
            b(),
        ],
        j_grp,
    );
    let parent = scripted_saga("parent", 1, &[a(), S::child("kid", "leaf"), b()], j_parent);
    let leaf = scripted_saga("leaf", 1, &[S::new("c", Compensatable)], j_leaf);
    let plain = scripted_saga("plain", 1, &[a(), b()], j_plain);
    let ids: [Uuid; 5] = std::array::from_fn(|_| Uuid::now_v7());
    let [nap_id, sig_id, grp_id, parent_id, plain_id] = ids;
    let leaf_id = saga_dsl::child_saga_id(parent_id, "kid");

    let saga_row = |id: Uuid, def: &saga_dsl::SagaDefinition, next_run_at: &str| {
        let (name, hash) = (def.name(), def.hash());
        format!(
            "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
             input, next_run_at, created_at, updated_at) VALUES ('{id}', '{name}', 1, '{hash}', \
             '{name}@1#{hash}', 'RUNNING', '{{}}', {next_run_at}, 1000, 2000)"
        )
    };
    // A row with the columns every release had; `more` names further columns and values.
    let step =
        |id: Uuid, idx: u32, name: &str, kind: &str, status: &str, comp: &str, more: &str| {
            let (cols, vals) = more.split_once(" VALUES ").unwrap_or(("", ""));
            format!(
                "INSERT INTO steps (saga_id, idx, name, kind, status, comp_status{cols}) \
             VALUES ('{id}', {idx}, '{name}', '{kind}', '{status}', '{comp}'{vals})"
            )
        };
    let done_a = |id: Uuid| {
        step(
            id,
            0,
            "a",
            "compensatable",
            "SUCCEEDED",
            "PENDING",
            ", attempts, output, started_at, ended_at VALUES , 1, 'null', 1000, 1100",
        )
    };
    let pending_b = |id: Uuid, idx: u32| step(id, idx, "b", "pivot", "PENDING", "NONE", "");
    let attempt = |id: Uuid, idx: u32, outcome: &str| {
        format!(
            "INSERT INTO attempts (saga_id, step_idx, phase, attempt, worker, lease_epoch, \
             started_at, ended_at, outcome) VALUES ('{id}', {idx}, 'action', 1, 'old', 1, \
             1100, 1200, '{outcome}')"
        )
    };
    // The older release kept every wait in `wake_at` and named a branch only `group/branch`:
    // `nap` sleeps until an instant that passed while no release ran; `sig` waits for a
    // signal that never came, until a timeout that passed too; in `grp` branch `x1` succeeded
    // and `x2` failed and waits to be tried again; `parent` waits for its child `leaf`, which
    // has not run yet; in `plain` step `a` failed and waits to be tried again.
    let statements = [
        saga_row(nap_id, &nap, "1500"),
        done_a(nap_id),
        step(
            nap_id,
            1,
            "nap",
            "sleep",
            "WAITING",
            "NONE",
            ", started_at, wake_at VALUES , 1100, 1500",
        ),
        pending_b(nap_id, 2),
        saga_row(sig_id, &sig, "1600"),
        done_a(sig_id),
        step(
            sig_id,
            1,
            "await",
            "signal",
            "WAITING",
            "NONE",
            ", started_at, waiting_for, wake_at VALUES , 1100, 'approval', 1600",
        ),
        pending_b(sig_id, 2),
        saga_row(grp_id, &grp, "1700"),
        step(
            grp_id,
            0,
            "g",
            "parallel",
            "RUNNING",
            "NONE",
            ", started_at VALUES , 1100",
        ),
        pending_b(grp_id, 1),
        step(
            grp_id,
            2,
            "g/x1",
            "compensatable",
            "SUCCEEDED",
            "PENDING",
            ", attempts, output, started_at, ended_at VALUES \
             , 1, '{\"step\": \"g/x1\", \"attempt\": 1}', 1100, 1200",
        ),
        attempt(grp_id, 2, "succeeded"),
        step(
            grp_id,
            3,
            "g/x2",
            "compensatable",
            "RETRYING",
            "PENDING",
            ", attempts, last_error, started_at, ended_at, wake_at VALUES \
             , 1, 'scripted transient failure', 1100, 1200, 1700",
        ),
        attempt(grp_id, 3, "retryable"),
        saga_row(parent_id, &parent, "NULL"),
        done_a(parent_id),
        step(
            parent_id,
            1,
            "kid",
            "child",
            "WAITING",
            "PENDING",
            ", started_at VALUES , 1100",
        ),
        pending_b(parent_id, 2),
        format!(
            "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, \
             input, next_run_at, created_at, updated_at, parent_id, parent_stage) VALUES \
             ('{leaf_id}', 'leaf', 1, '{hash}', 'leaf@1#{hash}', 'QUEUED', '{{}}', 1100, 1100, \
             1100, '{parent_id}', 'kid')",
            hash = leaf.hash()
        ),
        step(leaf_id, 0, "c", "compensatable", "PENDING", "PENDING", ""),
        saga_row(plain_id, &plain, "1800"),
        step(
            plain_id,
            0,
            "a",
            "compensatable",
            "RETRYING",
            "PENDING",
            ", attempts, last_error, started_at, ended_at VALUES \
             , 1, 'scripted transient failure', 1100, 1200",
        ),
        attempt(plain_id, 0, "retryable"),
        pending_b(plain_id, 1),
    ];
    write_older_log(&db.url, &older, &statements).await;

    // This release opens it: each wait is in its own column, each branch names its group.
    let store = db.store().await;
    let get = |id: Uuid| {
        let store = store.clone();
        async move { store.get_saga(id).await.unwrap().unwrap() }
    };
    let waits = |s: &orchestrator::model::StepRecord| (s.wake_at, s.timeout_at, s.retry_at);
    let napping = get(nap_id).await;
    assert_eq!(
        waits(&napping.steps[1]),
        (Some(1500), None, None),
        "a sleep's wake time"
    );
    let waiting = get(sig_id).await;
    assert_eq!(
        waits(&waiting.steps[1]),
        (None, Some(1600), None),
        "a signal's timeout"
    );
    assert_eq!(waiting.steps[1].waiting_for.as_deref(), Some("approval"));
    let grouped = get(grp_id).await;
    let rows: Vec<_> = grouped
        .steps
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.stage_index,
                s.branch.as_deref(),
                s.branch_of(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("g", None, None, None),
            ("b", None, None, None),
            ("g/x1", Some(0), Some("x1"), Some(("g", "x1"))),
            ("g/x2", Some(0), Some("x2"), Some(("g", "x2"))),
        ]
    );
    assert_eq!(
        waits(&grouped.steps[3]),
        (None, None, Some(1700)),
        "a branch's retry"
    );
    let stages = grouped.clone().with_stages().stages;
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0].branches.as_ref().map(Vec::len), Some(2));
    for id in [parent_id, plain_id, leaf_id] {
        let saga = get(id).await;
        assert!(
            saga.steps.iter().all(|s| s.branch.is_none()
                && s.stage_index.is_none()
                && waits(s) == (None, None, None)),
            "{saga:#?}"
        );
    }

    let eng = RunningEngine::start(
        store.clone(),
        registry_of([nap, sig, grp, parent, leaf, plain]),
        test_config(),
    );
    let mut done = Vec::new();
    for id in [nap_id, sig_id, grp_id, parent_id, leaf_id, plain_id] {
        done.push(wait_terminal(&store, id).await);
    }
    eng.stop().await;
    for saga in &done {
        assert_eq!(saga.status, SagaStatus::Completed, "{saga:#?}");
        assert!(
            saga.steps
                .iter()
                .all(|s| s.action.status == StepStatus::Succeeded),
            "{saga:#?}"
        );
    }
    let [nap_done, sig_done, grp_done, parent_done, _, plain_done] = &done[..] else {
        unreachable!()
    };
    assert_eq!(nap_done.steps[1].wake_at, Some(1500), "the wake time holds");
    assert_eq!(
        sig_done.steps[1].output,
        Some(json!({"by": "default"})),
        "the timeout kept in the old log passed: the default payload is taken"
    );
    assert_eq!(
        grp_done.steps[0].output,
        Some(json!({
            "x1": {"step": "g/x1", "attempt": 1},
            "x2": {"step": "g/x2", "attempt": 2},
        }))
    );
    assert_eq!(
        grp_done.steps[3].retry_at, None,
        "no timer left once it succeeded"
    );
    assert_eq!(
        parent_done.steps[1].output,
        Some(json!({"c": {"step": "c", "attempt": 1}})),
        "the child's output"
    );
    assert_eq!(plain_done.steps[0].action.attempts, 2);
    // Each effect once: nothing that succeeded under the old release is called again.
    assert_eq!(j_nap.names(), ["b:action"]);
    assert_eq!(j_sig.names(), ["b:action"]);
    assert_eq!(j_grp.names(), ["g/x2:action", "b:action"]);
    assert_eq!(j_parent.names(), ["b:action"]);
    assert_eq!(j_leaf.names(), ["c:action"]);
    assert_eq!(j_plain.names(), ["a:action", "b:action"]);
}
