//! The library's idempotent consumer on a real SQLite file and a real PostgreSQL database
//! (as `SAGA_TEST_BACKEND` says): a message's work runs once, in the transaction that records
//! it; a duplicate gets the first result back; concurrent duplicates do the work once; failed
//! work records nothing; and a table made before results were kept is upgraded in place.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use orchestrator::consumer::{Consumed, ConsumerError, IdempotentConsumer};
use saga_suite::{backend_is_postgres, TempDb};
use serde_json::{json, Value};

/// The test's database as a pool of the consumer's own (`$db` the sqlx database type).
macro_rules! pool {
    (Postgres, $url:expr) => {
        sqlx::PgPool::connect($url).await.unwrap()
    };
    (Sqlite, $url:expr) => {{
        let options: sqlx::sqlite::SqliteConnectOptions = $url.parse().unwrap();
        sqlx::SqlitePool::connect_with(
            options
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap()
    }};
}

/// The body of each test, once per backend: `$db` is `Sqlite` or `Postgres`, `$insert` the
/// effect's INSERT in that backend's placeholders.
macro_rules! on_backend {
    (|$db:ident, $insert:ident| $body:block) => {
        if backend_is_postgres() {
            #[allow(non_camel_case_types, unused)]
            type $db = sqlx::Postgres;
            let $insert = "INSERT INTO effects (message, n) VALUES ($1, $2)";
            macro_rules! make_pool {
                ($url:expr) => {
                    pool!(Postgres, $url)
                };
            }
            $body
        } else {
            #[allow(non_camel_case_types, unused)]
            type $db = sqlx::Sqlite;
            let $insert = "INSERT INTO effects (message, n) VALUES (?1, ?2)";
            macro_rules! make_pool {
                ($url:expr) => {
                    pool!(Sqlite, $url)
                };
            }
            $body
        }
    };
}

const CREATE_EFFECTS: &str = "CREATE TABLE effects (message TEXT NOT NULL, n BIGINT NOT NULL)";

/// A duplicate does no work and answers the first result; failed work records nothing, so
/// the next delivery does it.
#[tokio::test]
async fn a_duplicate_does_nothing_and_gets_the_first_result() {
    let db = TempDb::new();
    on_backend!(|Db, insert| {
        let pool = make_pool!(&db.url);
        sqlx::query(CREATE_EFFECTS).execute(&pool).await.unwrap();
        let consumer = IdempotentConsumer::<Db>::new(pool.clone(), "payments");
        consumer.migrate().await.unwrap();
        consumer.migrate().await.unwrap();
        macro_rules! charge {
            ($n:expr) => {
                move |conn| {
                    Box::pin(async move {
                        sqlx::query(insert)
                            .bind("m1")
                            .bind($n as i64)
                            .execute(&mut *conn)
                            .await?;
                        Ok::<_, sqlx::Error>(json!({"charge": $n}))
                    })
                }
            };
        }
        let first = consumer.process("m1", charge!(1)).await.unwrap();
        assert_eq!(first, Consumed::Processed(json!({"charge": 1})));
        let again = consumer.process("m1", charge!(2)).await.unwrap();
        assert_eq!(
            again,
            Consumed::Duplicate(json!({"charge": 1})),
            "the first answer"
        );

        let failed = consumer
            .process("m2", |_| {
                Box::pin(async { Err::<Value, _>("card declined") })
            })
            .await;
        assert!(matches!(failed, Err(ConsumerError::Work("card declined"))));
        let later = consumer.process("m2", charge!(3)).await.unwrap();
        assert!(
            matches!(later, Consumed::Processed(_)),
            "not recorded as done"
        );

        let rows: Vec<(String, i64)> = sqlx::query_as("SELECT message, n FROM effects ORDER BY n")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(rows, vec![("m1".to_owned(), 1), ("m1".to_owned(), 3)]);
    });
}

/// Sixteen deliveries of one message at once, each on its own connection: the work runs once
/// and every other delivery gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_do_the_work_once() {
    let db = TempDb::new();
    on_backend!(|Db, insert| {
        let pool = make_pool!(&db.url);
        sqlx::query(CREATE_EFFECTS).execute(&pool).await.unwrap();
        let consumer = IdempotentConsumer::<Db>::new(pool.clone(), "payments");
        consumer.migrate().await.unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..16i64 {
            let consumer = consumer.clone();
            tasks.spawn(async move {
                consumer
                    .process("same", move |conn| {
                        Box::pin(async move {
                            sqlx::query(insert)
                                .bind("same")
                                .bind(i)
                                .execute(&mut *conn)
                                .await?;
                            // Held open a while, so the others arrive while it runs.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, sqlx::Error>(i)
                        })
                    })
                    .await
                    .unwrap()
            });
        }
        let outcomes: Vec<Consumed<i64>> = tasks.join_all().await;
        let processed: Vec<i64> = outcomes
            .iter()
            .filter_map(|o| match o {
                Consumed::Processed(i) => Some(*i),
                Consumed::Duplicate(_) => None,
            })
            .collect();
        assert_eq!(processed.len(), 1, "{outcomes:?}");
        assert!(outcomes
            .iter()
            .all(|o| o.clone().into_inner() == processed[0]));
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM effects")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 1);
    });
}

/// `record` inside the caller's transaction: the first call records, the next one finds what
/// was stored; the table of an earlier version, without results, is upgraded by `migrate`
/// and its old rows read as `null`.
#[tokio::test]
async fn record_claims_once_and_old_tables_are_upgraded() {
    let db = TempDb::new();
    on_backend!(|Db, _insert| {
        let pool = make_pool!(&db.url);
        sqlx::query(
            "CREATE TABLE saga_processed_messages (consumer TEXT NOT NULL, message_id TEXT \
             NOT NULL, processed_at BIGINT NOT NULL, PRIMARY KEY (consumer, message_id))",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO saga_processed_messages (consumer, message_id, processed_at) \
             VALUES ('payments', 'old', 1)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let consumer = IdempotentConsumer::<Db>::new(pool.clone(), "payments");
        consumer.migrate().await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let first: Option<Value> = consumer
            .record::<Value, Value, sqlx::Error>(&mut tx, "voided", Some(&json!({"voided": true})))
            .await
            .unwrap();
        assert_eq!(first, None, "recorded now");
        let second: Option<Value> = consumer
            .record::<Value, Value, sqlx::Error>(&mut tx, "voided", Some(&json!({"other": 1})))
            .await
            .unwrap();
        assert_eq!(second, Some(json!({"voided": true})));
        tx.commit().await.unwrap();
        let old = consumer
            .process("old", |_| {
                Box::pin(async { Ok::<_, sqlx::Error>(Some(1i64)) })
            })
            .await
            .unwrap();
        assert_eq!(
            old,
            Consumed::Duplicate(None),
            "processed by the earlier version"
        );
    });
}
