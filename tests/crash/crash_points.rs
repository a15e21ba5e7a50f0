//! The process aborts itself at an armed crash point (`SAGA_CRASH_AT`): between a call to a
//! participant returning and its result reaching the log, for an action and for a compensation.
//! The call is made again after the restart, with the same key.

use saga_suite::{Server, TempDb};
use serde_json::json;

use crate::{
    assert_completed_once, assert_net_zero, ledger, order, restart_and_finish, step, LONG,
};

#[tokio::test]
async fn crash_between_an_action_returning_and_its_result_being_logged() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(
        &db.url,
        dir,
        &[("SAGA_CRASH_AT", "after_action:charge_payment")],
        &[],
    )
    .await;
    let id = server
        .start("place_order", order("o-after", json!({})))
        .await;
    let status = server.wait_exit(LONG);
    assert!(!status.success(), "the crash point aborts the process");
    // The card was charged, the log does not know it yet.
    let before = ledger(dir, "o-after").await;
    assert_eq!(before.charged, 1);
    let saga = restart_and_finish(&db, id, "COMPLETED").await;
    assert_eq!(step(&saga, "charge_payment")["attempts"], 2);
    // The second call carried the same key: the participant deduplicated it.
    assert_completed_once(&ledger(dir, "o-after").await);
}

#[tokio::test]
async fn crash_after_a_compensation_ran_but_before_it_was_logged() {
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let dir = dir.as_path();
    let server = Server::spawn(
        &db.url,
        dir,
        &[("SAGA_CRASH_AT", "after_compensation:charge_payment")],
        &[],
    )
    .await;
    let id = server
        .start(
            "place_order",
            order("o-comp2", json!({"fail_step": "assign_rider"})),
        )
        .await;
    assert!(!server.wait_exit(LONG).success());
    assert_eq!(ledger(dir, "o-comp2").await.refunded, 1);
    let saga = restart_and_finish(&db, id, "COMPENSATED").await;
    assert_eq!(step(&saga, "charge_payment")["compensation"]["attempts"], 2);
    assert_net_zero(&ledger(dir, "o-comp2").await);
}
