//! The operator commands (`saga list`, `show`, `events`, `cancel`, `abort`, `retry`,
//! `mark-compensated`) against a real SQLite file whose sagas were run by a real engine, plus the
//! `saga` binary's exit status and one-line errors.
//!
//! The binary tests need `target/debug/saga`: run `cargo build --workspace --bins` first (the
//! README's test command does).

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use orchestrator::cli::{run_admin, AdminCommand, CliError};
use orchestrator::model::{SagaStatus, StepStatus};
use orchestrator::Store;
use saga_dsl::StepKind::{Compensatable, Pivot, Retriable};
use saga_suite::Outcome::{Hang, Permanent, Retryable};
use saga_suite::{
    is, registry_of, scripted_saga, test_config, wait_for, wait_terminal, Journal, RunningEngine,
    ScriptedStep as S, TempDb,
};
use serde_json::{json, Value};
use uuid::Uuid;

/// Runs one command given as words (`["show", id, "--json"]`) and returns what it printed.
async fn saga(store: &Arc<dyn Store>, words: &[&str]) -> Result<String, CliError> {
    let cmd = AdminCommand::parse_words(words).unwrap();
    let mut out = Vec::new();
    run_admin(&cmd, store.as_ref(), &mut out).await?;
    Ok(String::from_utf8(out).unwrap())
}

async fn saga_json(store: &Arc<dyn Store>, words: &[&str]) -> Value {
    let text = saga(store, words).await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A database with sagas in every end state, run by a real engine:
/// two `order` sagas COMPLETED, one `refund` COMPENSATED, one `late` FAILED (a retriable step
/// after the pivot failed permanently; its second attempt would succeed).
struct Fixture {
    db: TempDb,
    store: Arc<dyn Store>,
    engine: RunningEngine,
    completed: Vec<Uuid>,
    compensated: Uuid,
    failed: Uuid,
}

impl Fixture {
    async fn new() -> Self {
        Self::with_extra(Vec::new()).await
    }

    async fn with_extra(extra: Vec<saga_dsl::SagaDefinition>) -> Self {
        let db = TempDb::new();
        let store = db.store().await;
        let j = Journal::default();
        let mut defs = vec![
            scripted_saga(
                "order",
                1,
                &[
                    S::new("reserve", Compensatable),
                    S::new("charge", Compensatable),
                    S::new("ship", Pivot),
                ],
                &j,
            ),
            scripted_saga(
                "refund",
                1,
                &[
                    S::new("reserve", Compensatable),
                    S::new("charge", Compensatable).action(&[Permanent]),
                ],
                &j,
            ),
            scripted_saga(
                "late",
                1,
                &[
                    S::new("reserve", Compensatable),
                    S::new("ship", Pivot),
                    S::new("notify", Retriable).action(&[Permanent]),
                ],
                &j,
            ),
        ];
        defs.extend(extra);
        let engine = RunningEngine::start(store.clone(), registry_of(defs), test_config());
        let mut completed = Vec::new();
        for n in 0..2 {
            let s = engine
                .engine
                .start_saga("order", json!({"n": n}))
                .await
                .unwrap();
            completed.push(wait_terminal(&store, s.id).await.id);
        }
        let compensated = engine
            .engine
            .start_saga("refund", json!({}))
            .await
            .unwrap()
            .id;
        let failed = engine
            .engine
            .start_saga("late", json!({}))
            .await
            .unwrap()
            .id;
        assert_eq!(
            wait_terminal(&store, compensated).await.status,
            SagaStatus::Compensated
        );
        assert_eq!(
            wait_terminal(&store, failed).await.status,
            SagaStatus::Failed
        );
        Self {
            db,
            store,
            engine,
            completed,
            compensated,
            failed,
        }
    }
}

#[tokio::test]
async fn list_shows_a_table_json_filters_and_pages() {
    let f = Fixture::new().await;
    let s = &f.store;

    let table = saga(s, &["list"]).await.unwrap();
    for id in f.completed.iter().chain([&f.compensated, &f.failed]) {
        assert!(table.contains(&id.to_string()), "{id} missing:\n{table}");
    }
    for word in [
        "COMPLETED",
        "COMPENSATED",
        "FAILED",
        "order",
        "refund",
        "late",
    ] {
        assert!(table.contains(word), "{word} missing:\n{table}");
    }
    assert!(!table.contains("--cursor"), "one page only:\n{table}");

    let page = saga_json(s, &["list", "--json"]).await;
    let ids: Vec<&str> = page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    let newest_first =
        [f.failed, f.compensated, f.completed[1], f.completed[0]].map(|u| u.to_string());
    assert_eq!(ids, newest_first, "newest first");
    assert_eq!(page["next_cursor"], Value::Null);
    assert_eq!(page["sagas"][0]["status"], "FAILED");

    let done = saga_json(s, &["list", "--status", "completed", "--json"]).await;
    let done = done["sagas"].as_array().unwrap();
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|x| x["status"] == "COMPLETED"));
    let by_name = saga_json(s, &["list", "--name", "refund", "--json"]).await;
    assert_eq!(by_name["sagas"].as_array().unwrap().len(), 1);

    // Pages of two: the table says how to get the next one, and the cursor gets it.
    let first = saga(s, &["list", "--limit", "2"]).await.unwrap();
    let first_json = saga_json(s, &["list", "--limit", "2", "--json"]).await;
    let cursor = first_json["next_cursor"].as_str().unwrap().to_owned();
    assert!(
        first.contains(&format!("--cursor {cursor}")),
        "no next-page hint:\n{first}"
    );
    let second = saga_json(s, &["list", "--limit", "2", "--cursor", &cursor, "--json"]).await;
    let second_ids: Vec<&str> = second["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(second_ids, newest_first[2..]);

    let err = saga(s, &["list", "--cursor", "page-2"]).await.unwrap_err();
    assert!(matches!(err, CliError::BadArgument(_)), "{err}");
    let none = saga(s, &["list", "--status", "aborted"]).await.unwrap();
    assert_eq!(none.trim(), "no sagas found");
    f.engine.stop().await;
}

#[tokio::test]
async fn show_puts_steps_statuses_and_attempts_at_a_glance() {
    let f = Fixture::new().await;
    let s = &f.store;
    let id = f.compensated.to_string();

    let text = saga(s, &["show", &id]).await.unwrap();
    for word in [
        id.as_str(),
        "refund@1",
        "COMPENSATED",
        "reserve",
        "charge",
        "compensatable",
        "SUCCEEDED",
        "FAILED",
        "scripted permanent failure",
        "Attempts",
        "compensation",
    ] {
        assert!(text.contains(word), "{word:?} missing:\n{text}");
    }
    // One row per attempt in the attempt log: reserve action, charge action, reserve compensation.
    let attempts = s.attempts(f.compensated).await.unwrap();
    assert_eq!(attempts.len(), 3);
    for a in &attempts {
        assert!(text.contains(&a.worker), "worker missing:\n{text}");
    }

    let failed = saga(s, &["show", &f.failed.to_string()]).await.unwrap();
    assert!(
        failed.contains("FAILED") && failed.contains("retriable"),
        "{failed}"
    );
    assert!(failed.contains("reached"), "{failed}");
    assert!(
        failed.contains(&format!("retry {}", f.failed)) && failed.contains("runs notify again"),
        "a hint says what a person can do:\n{failed}"
    );

    // `--json` is exactly the saga object of the HTTP API: the stored saga as it is shown,
    // with every attempt of its attempt log, as the table has them.
    let shown = saga_json(s, &["show", &id, "--json"]).await;
    let stored = serde_json::to_value(orchestrator::model::SagaDetail {
        saga: s.get_saga(f.compensated).await.unwrap().unwrap().shown(),
        attempts: s.attempts(f.compensated).await.unwrap(),
    })
    .unwrap();
    assert_eq!(shown, stored);
    assert_eq!(shown["attempts"].as_array().map(Vec::len), Some(3));
    assert_eq!(shown["steps"][1]["status"], "FAILED");
    assert_eq!(shown["steps"][0]["compensation"]["status"], "SUCCEEDED");
    f.engine.stop().await;
}

#[tokio::test]
async fn events_table_and_json() {
    let f = Fixture::new().await;
    let s = &f.store;
    let id = f.completed[0].to_string();

    let text = saga(s, &["events", &id]).await.unwrap();
    assert!(
        text.contains("saga.started") && text.contains("saga.completed"),
        "{text}"
    );

    let json = saga_json(s, &["events", &id, "--json"]).await;
    let events = json["events"].as_array().unwrap();
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events[0]["type"], "saga.started");
    assert_eq!(events.last().unwrap()["type"], "saga.completed");
    assert_eq!(
        json["events"],
        serde_json::to_value(s.events(f.completed[0]).await.unwrap()).unwrap()
    );
    f.engine.stop().await;
}

#[tokio::test]
async fn unknown_and_malformed_ids_are_clear_errors() {
    let f = Fixture::new().await;
    let s = &f.store;
    let unknown = Uuid::now_v7().to_string();
    for cmd in ["show", "events", "cancel", "retry"] {
        let err = saga(s, &[cmd, &unknown]).await.unwrap_err();
        assert!(matches!(err, CliError::NotFound(_)), "{cmd}: {err:?}");
        assert_eq!(err.to_string(), format!("saga {unknown} not found"));
    }
    let err = saga(s, &["abort", &unknown, "--reason", "x"])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::NotFound(_)), "{err:?}");

    let err = saga(s, &["show", "not-a-uuid"]).await.unwrap_err();
    assert!(matches!(err, CliError::BadArgument(_)), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("invalid saga id \"not-a-uuid\""),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'));
    f.engine.stop().await;
}

#[tokio::test]
async fn cancel_is_refused_on_finished_sagas_and_after_the_pivot() {
    let stuck = scripted_saga(
        "stuck",
        1,
        &[
            S::new("reserve", Compensatable),
            S::new("ship", Pivot),
            S::new("notify", Retriable).action(&[Retryable; 1000]),
        ],
        &Journal::default(),
    );
    let f = Fixture::with_extra(vec![stuck]).await;
    let s = &f.store;

    let err = saga(s, &["cancel", &f.completed[0].to_string()])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::Conflict(_)), "{err:?}");
    assert!(err.to_string().contains("COMPLETED"), "{err}");

    // A saga retrying forward after its pivot cannot be cancelled, only aborted.
    let id = f
        .engine
        .engine
        .start_saga("stuck", json!({}))
        .await
        .unwrap()
        .id;
    wait_for(s, id, Duration::from_secs(10), |x| {
        x.steps[2].action.attempts >= 2
    })
    .await;
    let err = saga(s, &["cancel", &id.to_string()]).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("past its pivot; it can no longer be cancelled"),
        "{err}"
    );
    let out = saga(s, &["abort", &id.to_string(), "--reason", "customer gone"])
        .await
        .unwrap();
    assert!(out.contains("ABORTED"), "{out}");
    assert_eq!(
        wait_terminal(s, id).await.status,
        SagaStatus::Aborted,
        "the engine let go of it"
    );
    f.engine.stop().await;
}

#[tokio::test]
async fn cancel_accepts_a_saga_before_its_pivot() {
    let slow = scripted_saga(
        "slow",
        1,
        &[
            // Every attempt times out: the saga stays before its pivot for a while.
            S::new("reserve", Compensatable).action(&[Hang; 3]),
            S::new("ship", Pivot),
        ],
        &Journal::default(),
    );
    let f = Fixture::with_extra(vec![slow]).await;
    let s = &f.store;
    let id = f
        .engine
        .engine
        .start_saga("slow", json!({}))
        .await
        .unwrap()
        .id;
    let out = saga(s, &["cancel", &id.to_string()]).await.unwrap();
    assert!(out.contains("cancel requested"), "{out}");
    let done = wait_terminal(s, id).await;
    assert_eq!(done.status, SagaStatus::Compensated);
    f.engine.stop().await;
}

#[tokio::test]
async fn abort_is_audited_with_actor_and_reason() {
    let f = Fixture::new().await;
    let s = &f.store;
    let id = f.failed.to_string();

    let err = saga(s, &["abort", &id, "--reason", "  "])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::BadArgument(_)), "{err:?}");

    let out = saga(
        s,
        &["abort", &id, "--reason", "refunded by phone, ticket 42"],
    )
    .await
    .unwrap();
    assert!(out.contains("ABORTED"), "{out}");
    let saga_now = s.get_saga(f.failed).await.unwrap().unwrap();
    assert_eq!(saga_now.status, SagaStatus::Aborted);
    let events = s.events(f.failed).await.unwrap();
    let aborted = events.iter().find(|e| e.kind == "saga.aborted").unwrap();
    assert_eq!(aborted.data["reason"], "refunded by phone, ticket 42");
    assert!(
        aborted.data["actor"].as_str().unwrap().ends_with("@cli"),
        "{:?}",
        aborted.data
    );

    // A finished saga cannot be aborted.
    let err = saga(s, &["abort", &f.completed[0].to_string(), "--reason", "x"])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::Conflict(_)), "{err:?}");
    f.engine.stop().await;
}

#[tokio::test]
async fn retry_runs_a_failed_saga_again() {
    let f = Fixture::new().await;
    let s = &f.store;
    let out = saga(s, &["retry", &f.failed.to_string()]).await.unwrap();
    assert!(out.contains("notify will be retried"), "{out}");
    // The retriable step's second attempt succeeds.
    let done = wait_for(
        s,
        f.failed,
        Duration::from_secs(10),
        is(SagaStatus::Completed),
    )
    .await;
    assert_eq!(done.steps[2].action.status, StepStatus::Succeeded);
    assert_eq!(done.steps[2].action.attempts, 2);
    let events = s.events(f.failed).await.unwrap();
    let retried = events.iter().find(|e| e.kind == "saga.retried").unwrap();
    assert!(retried.data["actor"].as_str().unwrap().ends_with("@cli"));

    let err = saga(s, &["retry", &f.completed[0].to_string()])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::Conflict(_)), "{err:?}");
    f.engine.stop().await;
}

#[tokio::test]
async fn mark_compensated_checks_the_step_and_ends_a_stuck_compensation() {
    let stuck = scripted_saga(
        "stuck",
        1,
        &[
            S::new("reserve", Compensatable).compensation(&[Retryable; 1000]),
            S::new("charge", Compensatable).action(&[Permanent]),
            S::new("ship", Pivot),
        ],
        &Journal::default(),
    );
    let f = Fixture::with_extra(vec![stuck]).await;
    let s = &f.store;

    // Not compensating.
    let done = f.completed[0].to_string();
    let err = saga(s, &["mark-compensated", &done, "charge", "--reason", "x"])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::Conflict(_)), "{err:?}");
    assert!(err.to_string().contains("COMPENSATING"), "{err}");

    let id = f
        .engine
        .engine
        .start_saga("stuck", json!({}))
        .await
        .unwrap()
        .id;
    let flagged = wait_for(s, id, Duration::from_secs(10), |x| x.needs_attention).await;
    assert_eq!(flagged.status, SagaStatus::Compensating);
    let listed = saga_json(s, &["list", "--needs-attention", "--json"]).await;
    assert_eq!(listed["sagas"][0]["id"], id.to_string());
    let shown = saga(s, &["show", &id.to_string()]).await.unwrap();
    assert!(shown.contains("NEEDS ATTENTION"), "{shown}");
    assert!(
        shown.contains(&format!("mark-compensated {id} reserve")),
        "a hint names the stuck step:\n{shown}"
    );

    let sid = id.to_string();
    // Unknown step: the message names the steps there are.
    let err = saga(s, &["mark-compensated", &sid, "refund", "--reason", "x"])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::BadArgument(_)), "{err:?}");
    assert!(err.to_string().contains("reserve, charge, ship"), "{err}");
    // A step with no compensation pending (its action failed definitively).
    let err = saga(s, &["mark-compensated", &sid, "charge", "--reason", "x"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no compensation pending"), "{err}");
    // No reason.
    let err = saga(s, &["mark-compensated", &sid, "reserve", "--reason", ""])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::BadArgument(_)), "{err:?}");

    let out = saga(
        s,
        &[
            "mark-compensated",
            &sid,
            "reserve",
            "--reason",
            "released by hand",
        ],
    )
    .await
    .unwrap();
    assert!(out.contains("marked compensated"), "{out}");
    let end = wait_for(s, id, Duration::from_secs(10), is(SagaStatus::Compensated)).await;
    assert_eq!(end.steps[0].compensation.status, StepStatus::Manual);
    let events = s.events(id).await.unwrap();
    let marked = events
        .iter()
        .find(|e| e.kind == "step.marked_compensated")
        .unwrap();
    assert_eq!(marked.step.as_deref(), Some("reserve"));
    assert_eq!(marked.data["reason"], "released by hand");
    assert!(marked.data["actor"].as_str().unwrap().ends_with("@cli"));
    f.engine.stop().await;
}

// ---- the `saga` binary -------------------------------------------------------------------

/// `target/debug/saga`, next to this test's `deps` directory.
fn saga_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let bin = dir.join(format!("saga{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} not found: run `cargo build --workspace --bins` before the tests",
        bin.display()
    );
    bin
}

fn run_binary(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(saga_binary())
        .args(args)
        .env("DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn assert_one_line_error(out: &std::process::Output, contains: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("error: "), "{stderr:?}");
    assert!(stderr.contains(contains), "{stderr:?} lacks {contains:?}");
}

#[tokio::test]
async fn the_binary_exits_one_with_a_single_line_error() {
    let f = Fixture::new().await;
    let unknown = Uuid::now_v7().to_string();
    let out = run_binary(&f.db.url, &["show", &unknown]);
    assert_one_line_error(&out, &format!("saga {unknown} not found"));
    assert!(out.stdout.is_empty());

    let out = run_binary(&f.db.url, &["show", "xyz"]);
    assert_one_line_error(&out, "invalid saga id");

    // A wrong path is an error, not a new empty database.
    let missing = f.db.dir.path().join("nope").join("saga.db");
    let url = format!("sqlite://{}", missing.display());
    let out = run_binary(&url, &["list"]);
    assert_one_line_error(&out, "does not exist");
    assert!(!missing.exists());
    // A relative path is reported as the absolute path it meant, wherever the command ran.
    let out = Command::new(saga_binary())
        .args(["list", "--database-url", "sqlite://nope.db"])
        .current_dir(f.db.dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let absolute = f.db.dir.path().join("nope.db");
    assert_one_line_error(
        &out,
        &format!("database {} does not exist", absolute.display()),
    );
    assert!(!absolute.exists());
    // The flag wins over the environment.
    let out = Command::new(saga_binary())
        .args(["list", "--database-url", &url])
        .env("DATABASE_URL", &f.db.url)
        .output()
        .unwrap();
    assert_one_line_error(&out, "does not exist");
    f.engine.stop().await;
}

#[tokio::test]
async fn the_binary_lists_json_and_migrates() {
    let f = Fixture::new().await;
    let out = run_binary(&f.db.url, &["list", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(page["sagas"].as_array().unwrap().len(), 4);
    assert_eq!(page["next_cursor"], Value::Null);

    let out = run_binary(&f.db.url, &["show", &f.failed.to_string(), "--json"]);
    assert!(out.status.success());
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["status"], "FAILED");

    // `migrate` is the one command that creates a database.
    let fresh = f.db.dir.path().join("fresh.db");
    let out = run_binary(&format!("sqlite://{}", fresh.display()), &["migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fresh.exists());

    // A command line that does not parse: one line too, and clap's usage exit status.
    let out = run_binary(&f.db.url, &["list", "--status", "sleeping"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    f.engine.stop().await;
}

#[tokio::test]
async fn workers_lists_the_running_process_and_its_leases() {
    let f = Fixture::new().await;
    let listed = saga_json(&f.store, &["workers", "--json"]).await;
    let workers = listed["workers"].as_array().unwrap();
    let me = workers
        .iter()
        .find(|w| w["id"] == f.engine.engine.config().worker_id.as_str())
        .expect("the running engine is listed");
    assert_eq!(me["pid"], std::process::id());
    assert!(me["stopped_at"].is_null());
    assert_eq!(me["leases"], 0, "every saga of the fixture has ended");
    let table = saga(&f.store, &["workers"]).await.unwrap();
    assert!(table.contains("alive"), "{table}");
}

#[test]
fn a_refused_postgres_connection_names_the_address_at_once_without_the_password() {
    let started = std::time::Instant::now();
    let out = run_binary("postgres://postgres:hunter2@127.0.0.1:1/x", &["list"]);
    let took = started.elapsed();
    assert_one_line_error(&out, "127.0.0.1:1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "the password is shown: {stderr}"
    );
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} to report a refused connection"
    );

    // A URL that is not understood is quoted back with its password masked.
    let out = run_binary("mysql://root:hunter2@db/shop", &["list"]);
    assert_one_line_error(&out, "mysql://root:***@db/shop");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
}

/// Sagas created with chosen ids (no engine runs them: they stay QUEUED), to look them up by
/// prefixes on either side of every boundary.
async fn sagas_with_ids(store: &Arc<dyn Store>, ids: &[&str]) -> Vec<Uuid> {
    let def = scripted_saga(
        "order",
        1,
        &[S::new("reserve", Compensatable)],
        &Journal::default(),
    );
    let mut out = Vec::new();
    for text in ids {
        let mut new = orchestrator::store::NewSaga::of(&def, json!({}));
        new.id = Uuid::parse_str(text).unwrap();
        out.push(store.create_saga(new).await.unwrap().id);
    }
    out
}

#[tokio::test]
async fn the_store_finds_ids_by_prefix_with_a_range_scan() {
    use orchestrator::model::IdPrefix;

    let db = TempDb::new();
    let store = db.store().await;
    let ids = sagas_with_ids(
        &store,
        &[
            "aaaaaaa9-ffff-7fff-bfff-ffffffffffff",
            "aaaaaaaa-0000-7000-8000-000000000001",
            "aaaaaaaa-0000-7000-8000-000000000002",
            "aaaaaaab-0000-7000-8000-000000000000",
            "bbbbbbbb-1234-7000-8000-000000000003",
        ],
    )
    .await;
    let find = |p: &str| {
        let store = store.clone();
        let p = IdPrefix::parse(p).unwrap();
        async move { store.saga_ids_with_prefix(&p, 10).await.unwrap() }
    };
    assert_eq!(find("aaaaaaaa").await, ids[1..3]);
    assert_eq!(find("AAAAAAAA-0000-7000-8000-0000000000").await, ids[1..3]);
    assert_eq!(find("aaaaaaaa000070008000000000000001").await, ids[1..2]);
    assert_eq!(
        find("aaaaaaaa-0000-7000-8000-000000000002").await,
        ids[2..3]
    );
    assert_eq!(find("aaaaaaa9").await, ids[0..1]);
    assert_eq!(find("aaaaaaab").await, ids[3..4]);
    assert_eq!(find("bbbbbbbb-12").await, ids[4..5]);
    assert!(find("cccccccc").await.is_empty());
    assert!(find("aaaaaaa0").await.is_empty());
    // The limit holds.
    let p = IdPrefix::parse("aaaaaaaa").unwrap();
    assert_eq!(store.saga_ids_with_prefix(&p, 1).await.unwrap(), ids[1..2]);
}

#[tokio::test]
async fn every_command_takes_a_unique_id_prefix() {
    let db = TempDb::new();
    let s = db.store().await;
    let ids = sagas_with_ids(
        &s,
        &[
            "aaaaaaaa-0000-7000-8000-000000000001",
            "aaaaaaaa-0000-7000-8000-000000000002",
            "bbbbbbbb-1234-7000-8000-000000000003",
            "cccccccc-1234-7000-8000-000000000004",
        ],
    )
    .await;
    let (b, c) = (ids[2].to_string(), ids[3].to_string());

    let shown = saga_json(&s, &["show", "bbbbbbbb", "--json"]).await;
    assert_eq!(shown["id"], b.as_str());
    let text = saga(&s, &["show", "BBBBBBBB-12"]).await.unwrap();
    assert!(text.contains(&b), "{text}");
    let events = saga_json(&s, &["events", "bbbbbbbb", "--json"]).await;
    assert_eq!(events["events"][0]["type"], "saga.started");
    let out = saga(&s, &["retry", "bbbbbbbb"]).await.unwrap();
    assert!(out.contains(&b), "{out}");
    let err = saga(
        &s,
        &["mark-compensated", "bbbbbbbb", "reserve", "--reason", "x"],
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CliError::Conflict(_)), "{err:?}");
    assert!(err.to_string().contains(&b), "{err}");
    let out = saga(&s, &["cancel", "bbbbbbbb"]).await.unwrap();
    assert!(
        out.contains(&format!("cancel requested for saga {b}")),
        "{out}"
    );
    let out = saga(&s, &["abort", "cccccccc", "--reason", "by prefix"])
        .await
        .unwrap();
    assert!(out.contains(&format!("saga {c} is now ABORTED")), "{out}");
    assert_eq!(
        s.get_saga(ids[3]).await.unwrap().unwrap().status,
        SagaStatus::Aborted
    );

    // Ambiguous: the error names the candidates, and nothing is changed.
    for cmd in ["show", "events", "cancel", "retry"] {
        let err = saga(&s, &[cmd, "aaaaaaaa"]).await.unwrap_err();
        assert!(matches!(err, CliError::Ambiguous { .. }), "{cmd}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains("ambiguous"), "{msg}");
        assert!(
            msg.contains(&ids[0].to_string()) && msg.contains(&ids[1].to_string()),
            "{msg}"
        );
    }
    let err = saga(&s, &["abort", "aaaaaaaa", "--reason", "x"])
        .await
        .unwrap_err();
    assert!(matches!(err, CliError::Ambiguous { .. }), "{err:?}");
    assert_eq!(
        s.get_saga(ids[0]).await.unwrap().unwrap().status,
        SagaStatus::Queued
    );
    // Too short, and no match.
    let err = saga(&s, &["show", "aaaaaaa"]).await.unwrap_err();
    assert!(matches!(err, CliError::BadArgument(_)), "{err:?}");
    assert!(err.to_string().contains("too short"), "{err}");
    let err = saga(&s, &["show", "dddddddd"]).await.unwrap_err();
    assert_eq!(err.to_string(), "no saga has an id starting with dddddddd");
}

/// The lines of one section of `show` (from its title to the next blank line).
fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| l.trim() != title)
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// The row of the steps table of `show` for `step`.
fn step_row<'a>(text: &'a str, step: &str) -> &'a str {
    section(text, "Steps")
        .into_iter()
        .find(|l| l.split('┆').nth(1).is_some_and(|c| c.trim() == step))
        .unwrap_or_else(|| panic!("no row for {step}:\n{text}"))
}

#[tokio::test]
async fn show_says_running_under_a_live_lease_and_outcome_unknown_without_one() {
    let db = TempDb::new();
    let s = db.store().await;
    let def = scripted_saga(
        "order",
        1,
        &[
            S::new("reserve", Compensatable),
            S::new("charge", Compensatable),
        ],
        &Journal::default(),
    );
    // What a worker holds while its first call is in flight: the saga RUNNING, the action's
    // attempt written ahead, the lease live.
    let mut new = orchestrator::store::NewSaga::of(&def, json!({}));
    new.first_attempt = true;
    let lease = orchestrator::store::LeaseRequest::new("w-1", 60_000);
    let claimed = s.create_saga_leased(new, &lease).await.unwrap();
    let id = claimed.saga.id.to_string();

    let text = saga(&s, &["show", &id]).await.unwrap();
    let row = step_row(&text, "reserve");
    assert!(row.contains("RUNNING"), "{row}");
    assert!(!text.contains("outcome unknown"), "a live call:\n{text}");
    assert!(
        !text.contains("overdue") && !text.contains("due now"),
        "{text}"
    );
    assert!(text.contains("w-1 (epoch 1, expires in"), "{text}");
    assert!(
        section(&text, "Attempts")
            .iter()
            .any(|l| l.contains("running")),
        "{text}"
    );
    assert!(
        row.contains("┆ PENDING"),
        "the compensation will run should the saga go back, as `--json` says: {row}"
    );

    // The lease ran out (the process died): nobody knows what the call did.
    db.execute(&format!(
        "UPDATE sagas SET lease_expires_at = 1 WHERE id = '{id}'"
    ))
    .await;
    let text = saga(&s, &["show", &id]).await.unwrap();
    assert!(
        step_row(&text, "reserve").contains("RUNNING (outcome unknown)"),
        "{text}"
    );
    assert!(text.contains("expired"), "{text}");
    assert!(text.contains("due now"), "nobody runs it:\n{text}");
    assert!(
        section(&text, "Attempts")
            .iter()
            .any(|l| l.contains("outcome unknown")),
        "{text}"
    );
    // `--json` is the saga object, unchanged by the rendering.
    let shown = saga_json(&s, &["show", &id, "--json"]).await;
    assert_eq!(shown["steps"][0]["status"], "RUNNING");
    assert_eq!(shown["steps"][0]["compensation"]["status"], "PENDING");
}

#[tokio::test]
async fn show_says_which_compensations_are_not_needed_and_when_actions_ended() {
    let f = Fixture::new().await;
    let s = &f.store;

    let done = f.completed[0];
    let text = saga(s, &["show", &done.to_string()]).await.unwrap();
    for step in ["reserve", "charge"] {
        let row = step_row(&text, step);
        assert!(row.contains("NOT_NEEDED"), "{row}");
        assert!(!row.contains("PENDING"), "{row}");
    }
    // The pivot has no compensation at all.
    assert!(step_row(&text, "ship").contains("┆ NOT_NEEDED"), "{text}");

    // A compensated saga: the failed step needed none; the reserve step's action ended when
    // its action did, not when its compensation did.
    let saga_rec = s.get_saga(f.compensated).await.unwrap().unwrap();
    let text = saga(s, &["show", &f.compensated.to_string()])
        .await
        .unwrap();
    let charge = step_row(&text, "charge");
    assert!(
        charge.contains("FAILED") && charge.contains("NOT_NEEDED"),
        "{charge}"
    );
    let reserve = step_row(&text, "reserve");
    let action_end = saga_rec.steps[0].action.ended_at.unwrap();
    let comp_end = saga_rec.steps[0].compensation.ended_at.unwrap();
    assert!(
        reserve.contains(&orchestrator::model::rfc3339(action_end)),
        "{reserve}"
    );
    if comp_end != action_end {
        assert!(
            !reserve.contains(&orchestrator::model::rfc3339(comp_end)),
            "{reserve}"
        );
    }
    f.engine.stop().await;
}

#[tokio::test]
async fn purge_counts_in_a_dry_run_then_deletes_the_finished_sagas_but_the_failed_one() {
    let f = Fixture::new().await;
    // The binary runs while this test's thread waits for it: an engine of this process must
    // not be inside a write transaction meanwhile.
    f.engine.stop().await;
    // An instant before them all deletes nothing; bad input is a one-line error.
    let out = run_binary(
        &f.db.url,
        &["purge", "--finished-before", "2000-01-01T00:00:00Z"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("purged 0 sagas"));
    let out = run_binary(&f.db.url, &["purge", "--finished-before", "soon"]);
    assert_one_line_error(&out, "is not a duration such as 30d");

    let out = run_binary(
        &f.db.url,
        &["purge", "--finished-before", "0s", "--dry-run"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two completed and one compensated; the failed one waits for a person.
    assert!(stdout.starts_with("would purge 3 sagas"), "{stdout}");
    assert_eq!(
        saga_json(&f.store, &["list", "--json"]).await["sagas"]
            .as_array()
            .unwrap()
            .len(),
        4
    );

    let out = run_binary(
        &f.db.url,
        &["purge", "--finished-before", "0s", "--batch", "2"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("purged 3 sagas"), "{stdout}");
    let left = saga_json(&f.store, &["list", "--json"]).await;
    let left: Vec<&str> = left["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(left, vec![f.failed.to_string()]);
    for id in f.completed.iter().chain([&f.compensated]) {
        let err = saga(&f.store, &["show", &id.to_string()])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
    }
}

#[tokio::test]
async fn the_application_help_names_every_example_saga() {
    let dir = tempfile::tempdir().unwrap();
    let shop = example_sagas::shop::Shop::open(&format!(
        "sqlite://{}",
        dir.path().join("shop.db").display()
    ))
    .await
    .unwrap();
    let registry = example_sagas::registry(Arc::new(shop)).unwrap();
    let out = Command::new(saga_suite::bin_path("example-sagas"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = registry.iter().map(|d| d.name()).collect();
    assert!(names.contains(&"fulfil_order"), "{names:?}");
    for name in names {
        assert!(help.contains(name), "the help omits {name}:\n{help}");
    }
}

#[tokio::test]
async fn an_output_that_cannot_be_written_is_said_once() {
    let f = Fixture::new().await;
    let full = std::fs::File::options()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(saga_binary())
        .args(["list", "--json"])
        .env("DATABASE_URL", &f.db.url)
        .env_remove("RUST_LOG")
        .stdout(full)
        .output()
        .unwrap();
    assert_one_line_error(&out, "cannot write output: ");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("os error 28").count(), 1, "{stderr}");
    f.engine.stop().await;
}
