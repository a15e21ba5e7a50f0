//! A log written by an earlier release, opened by this one: its migrations must keep what is in it.

use crate::store::EngineLog;
use crate::store::LogReads;
use std::path::Path;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use uuid::Uuid;

use super::SqliteStore;
use crate::store::outbox::{OutboxPosition, OutboxStore};
use crate::store::NewSaga;

/// Creates the log at `file` with the migrations numbered below `before` only, as the release
/// that had only those left it.
async fn log_as_of(file: &Path, before: &str) -> sqlx::SqlitePool {
    let dir = file.with_extension("migrations");
    std::fs::create_dir(&dir).expect("a directory for the older migrations");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/sqlite");
    for entry in std::fs::read_dir(&source).expect("the migrations") {
        let entry = entry.expect("a migration");
        if entry.file_name().to_string_lossy().as_ref() < before {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copied");
        }
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(file)
                .create_if_missing(true),
        )
        .await
        .expect("the older log opens");
    Migrator::new(dir.as_path())
        .await
        .expect("the older migrations")
        .run(&pool)
        .await
        .expect("the older migrations run");
    pool
}

#[tokio::test]
async fn events_keep_their_ids_and_deliveries_through_the_rebuild_and_new_ones_follow() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("saga.db");
    let old = log_as_of(&file, "0003").await;
    let saga = Uuid::now_v7().to_string();
    sqlx::query(
        "INSERT INTO sagas (id, name, version, definition_hash, definition_key, status, input, \
         created_at, updated_at) VALUES (?1, 'old', 1, 'h', 'old@1#h', 'COMPLETED', '{}', 1, 2)",
    )
    .bind(&saga)
    .execute(&old)
    .await
    .expect("an old saga");
    for (at, kind) in [(1, "saga.started"), (2, "saga.completed")] {
        sqlx::query("INSERT INTO events (saga_id, at, type) VALUES (?1, ?2, ?3)")
            .bind(&saga)
            .bind(at)
            .bind(kind)
            .execute(&old)
            .await
            .expect("an old event");
    }
    sqlx::query(
        "INSERT INTO webhook_deliveries (event_id, target, saga_id, kind, next_attempt_at) \
         VALUES (2, 'http://127.0.0.1:9/hook', ?1, 'subscriber', 3)",
    )
    .bind(&saga)
    .execute(&old)
    .await
    .expect("an old delivery");
    old.close().await;

    let store = SqliteStore::open(&format!("sqlite://{}", file.display()))
        .await
        .expect("the current release opens the older log");
    let id = Uuid::parse_str(&saga).expect("a uuid");
    let events = store.events(id).await.expect("the old events");
    let kept: Vec<(i64, &str)> = events.iter().map(|e| (e.id, e.kind.as_str())).collect();
    assert_eq!(kept, [(1, "saga.started"), (2, "saga.completed")]);
    let deliveries = store.deliveries(id).await.expect("the old deliveries");
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].event_id, 2);
    assert_eq!(deliveries[0].kind, "saga.completed");

    let schema: String = sqlx::query_scalar(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'events'",
    )
    .fetch_one(&store.reader)
    .await
    .expect("the events table");
    assert!(!schema.contains("AUTOINCREMENT"), "{schema}");
    let index: Option<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'events_saga'",
    )
    .fetch_optional(&store.reader)
    .await
    .expect("the index list");
    assert!(index.is_some(), "events_saga is rebuilt");

    // A new saga's first event takes the next id: a relay's cursor at the old end sees it.
    let new = NewSaga {
        id: Uuid::now_v7(),
        name: "new".to_owned(),
        version: 1,
        definition_hash: "h".to_owned(),
        input: serde_json::json!({}),
        steps: vec![],
        first_attempt: false,
        start_at: None,
        traceparent: None,
        flow: crate::store::NewFlow::default(),
        attrs: Vec::new(),
    };
    store.create_saga(new.clone()).await.expect("a new saga");
    let after = store
        .outbox_after(OutboxPosition { tx: 0, event_id: 2 }, 10)
        .await
        .expect("the outbox");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].position.event_id, 3);
    assert_eq!(after[0].saga_id, new.id);
    assert_eq!(after[0].kind, "saga.started");
}
