//! SIGTERM: `serve` lets the step in flight finish and records it, starts nothing after it,
//! releases its lease and exits 0; restarted, it resumes the saga where it stopped.

use std::time::Duration;

use orchestrator::model::StepStatus;
use saga_suite::{run_bin, Server, TempDb};
use serde_json::{json, Value};

#[tokio::test]
async fn sigterm_finishes_the_step_in_flight_then_the_saga_resumes_on_restart() {
    let db = TempDb::new();
    let shop_url = format!("sqlite://{}", db.dir.path().join("shop.db").display());
    let no_token = [("SAGA_API_TOKEN", "")];
    let server = Server::spawn(&db.url, db.dir.path(), &no_token, &[]).await;
    let input = json!({"order_id": "o-term", "user": "ada", "amount": 500,
                       "simulate": {"delay_ms": 1500}});
    let id = server.start("place_order", input).await;
    // The first step is in flight (its effect lands half way through its 1.5 s).
    server
        .wait_for(id, Duration::from_secs(20), |s| {
            s["steps"][0]["status"] == "RUNNING"
        })
        .await;
    server.signal("TERM");
    let exit = server.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "serve exited with {exit:?} on SIGTERM");

    // The step in flight finished and its result was recorded; nothing started after it.
    let store = db.store().await;
    let saga = store.get_saga(id).await.unwrap().unwrap();
    assert!(
        saga.steps
            .iter()
            .all(|s| s.action.status != StepStatus::Running),
        "{saga:#?}"
    );
    assert_eq!(
        saga.steps[0].action.status,
        StepStatus::Succeeded,
        "{saga:#?}"
    );
    assert_eq!(
        saga.steps[1].action.status,
        StepStatus::Pending,
        "{saga:#?}"
    );
    assert!(
        saga.lease_owner.is_none(),
        "the lease was released: {saga:#?}"
    );
    let attempts = store.attempts(id).await.unwrap();
    assert!(
        attempts.iter().all(|a| a.ended_at.is_some()),
        "{attempts:#?}"
    );
    drop(store);

    // Restarted, the server resumes the saga and completes it, each effect exactly once.
    let server = Server::spawn(&db.url, db.dir.path(), &no_token, &[]).await;
    let done = server
        .wait_for(id, Duration::from_secs(30), |s| s["status"] == "COMPLETED")
        .await;
    assert_eq!(done["steps"][0]["attempts"], 1, "{done:#}");
    drop(server);
    let out = run_bin(
        "example-sagas",
        &["ledger", "--json", "--shop-database-url", &shop_url],
        db.dir.path(),
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ledger: Value = serde_json::from_slice(&out.stdout).unwrap();
    let order = &ledger["o-term"];
    assert_eq!(order["reserved"], 1, "{ledger:#}");
    assert_eq!(order["charged"], 1, "{ledger:#}");
    assert_eq!(order["rider_assigned"], 1, "{ledger:#}");
}
