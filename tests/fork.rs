//! Completing a step by hand and forking a saga (SPEC §13), on the backend `SAGA_TEST_BACKEND`
//! selects: over real HTTP (an in-process API over a real store, or a real `example-sagas
//! serve` whose participants keep a ledger), the CLI through `--server`, a `kill -9` right after
//! a fork's commit, and the store-level commands on `PAUSED` sagas.
//!
//! Until pause and resume land, a `PAUSED` saga is made here by writing its status with SQL
//! ([`pause_by_sql`]), standing in for the pause command: what the tests check is what
//! complete-step and fork do with such a saga, not how it was paused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use example_sagas::shop::Shop;
use orchestrator::http::HttpConfig;
use orchestrator::model::{SagaStatus, StepStatus};
use orchestrator::operations::{ForkRequest, OperationError, Operations, Reason};
use reqwest::StatusCode;
use saga_dsl::{idempotency_key, Phase, SagaDefinition, Step, StepContext, StepError};
use saga_suite::api::Harness;
use saga_suite::{registry_of, run_bin, test_config, wait_for, RunningEngine, Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(30);

/// One call a participant of `handmade` saw: step, phase, idempotency key, and for a
/// compensation the output of its own action it was given.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    saga: Uuid,
    step: String,
    phase: Phase,
    key: Uuid,
    action_output: Option<Value>,
}

/// What the participants of `handmade` were called with, in order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, ctx: &StepContext) -> Result<(), StepError> {
        let action_output = match ctx.phase() {
            Phase::Action => None,
            Phase::Compensation => ctx.action_output::<Value>()?,
        };
        self.0.lock().unwrap().push(Call {
            saga: ctx.saga_id(),
            step: ctx.step_name().to_owned(),
            phase: ctx.phase(),
            key: ctx.idempotency_key(),
            action_output,
        });
        Ok(())
    }

    fn of(&self, step: &str, phase: Phase) -> Vec<Call> {
        let calls = self.0.lock().unwrap();
        calls
            .iter()
            .filter(|c| c.step == step && c.phase == phase)
            .cloned()
            .collect()
    }
}

/// `handmade`: `reserve` (compensatable), `charge` (compensatable), `ship` (pivot), `notify`
/// (retriable). Input flags: `stuck_reserve` / `stuck_charge` make that action ask to be
/// retried in an hour (the saga waits on a timer), `fail_charge` fails `charge` permanently,
/// `fail_notify` fails `notify` permanently (the saga ends `FAILED`). Every call is recorded.
fn handmade(calls: &Calls) -> SagaDefinition {
    fn call(calls: &Calls, name: &'static str) -> Step<saga_dsl::Call> {
        let (act, undo) = (calls.clone(), calls.clone());
        let action = move |ctx: StepContext| {
            let calls = act.clone();
            async move {
                calls.record(&ctx)?;
                let input = ctx.raw_input();
                if input[format!("stuck_{name}")] == true {
                    return Err(StepError::retry_after(
                        Duration::from_secs(3600),
                        "the provider is down",
                    ));
                }
                if input[format!("fail_{name}")] == true {
                    return Err(StepError::permanent(format!("{name} refused")));
                }
                Ok(json!({"by": "engine", "step": name}))
            }
        };
        let compensation = move |ctx: StepContext| {
            let calls = undo.clone();
            async move { calls.record(&ctx) }
        };
        match name {
            "ship" => Step::pivot(name, action),
            "notify" => Step::retriable(name, action),
            _ => Step::compensatable(name, action, compensation),
        }
    }
    SagaDefinition::builder("handmade", 1)
        .step(call(calls, "reserve"))
        .step(call(calls, "charge"))
        .step(call(calls, "ship"))
        .step(call(calls, "notify"))
        .build()
        .unwrap()
}

fn step<'a>(saga: &'a Value, name: &str) -> &'a Value {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {saga:#}"))
}

async fn event_types(api: &saga_suite::api::Api, id: &str) -> Vec<Value> {
    let (status, events) = api.get(&format!("/v1/sagas/{id}/events")).await;
    assert_eq!(status, StatusCode::OK);
    events["events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completing_the_failed_step_of_a_failed_saga_completes_it_with_that_output() {
    let calls = Calls::default();
    let api = Harness::new(registry_of([handmade(&calls)]))
        .await
        .into_api(HttpConfig::default())
        .await;
    let id = api
        .start_saga("handmade", json!({"fail_notify": true}))
        .await;
    api.wait_status(&id, "FAILED").await;

    // Not the failed step, not a group, not unknown: refused, nothing changed.
    let (status, _, body) = api
        .post(
            &format!("/v1/sagas/{id}/steps/ship/complete"),
            &json!({"output": 1, "reason": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("ship"));
    let (status, _, body) = api
        .post(
            &format!("/v1/sagas/{id}/steps/nope/complete"),
            &json!({"output": 1, "reason": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _, _) = api
        .post(
            &format!("/v1/sagas/{id}/steps/notify/complete"),
            &json!({"output": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        api.get(&format!("/v1/sagas/{id}")).await.1["status"],
        "FAILED"
    );

    let output = json!({"sent_by": "ada", "channel": "phone"});
    let (status, _, saga) = api
        .post(
            &format!("/v1/sagas/{id}/steps/notify/complete"),
            &json!({"output": output, "reason": "called the customer"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{saga}");
    assert_eq!(step(&saga, "notify")["status"], "SUCCEEDED");
    assert_eq!(step(&saga, "notify")["output"], output);

    let done = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&done, "notify")["output"], output);
    assert_eq!(done["output"]["notify"], output);
    // The step was not called again.
    assert_eq!(calls.of("notify", Phase::Action).len(), 1);
    let events = event_types(&api, &id).await;
    let completed = events
        .iter()
        .find(|e| e["type"] == "step.completed_by_operator")
        .unwrap();
    assert_eq!(completed["step"], "notify");
    assert_eq!(completed["data"]["reason"], "called the customer");
    assert_eq!(completed["data"]["output"], output);
    assert_eq!(completed["data"]["step"], "notify");
    assert!(completed["data"]["actor"].is_string());

    // Done: a second completion is refused.
    let (status, _, _) = api
        .post(
            &format!("/v1/sagas/{id}/steps/notify/complete"),
            &json!({"output": 2, "reason": "again"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_completed_by_hand_is_compensated_with_the_operator_s_output() {
    let calls = Calls::default();
    let api = Harness::new(registry_of([handmade(&calls)]))
        .await
        .into_api(HttpConfig::default())
        .await;
    let id = api
        .start_saga(
            "handmade",
            json!({"stuck_reserve": true, "fail_charge": true}),
        )
        .await;
    // Parked on its retry timer, an hour away.
    api.wait(&id, |s| step(s, "reserve")["status"] == "RETRYING")
        .await;

    // Over the limit: refused before anything is written.
    let huge = json!({"blob": "x".repeat(orchestrator::operations::MAX_OUTPUT)});
    let (status, _, body) = api
        .post(
            &format!("/v1/sagas/{id}/steps/reserve/complete"),
            &json!({"output": huge, "reason": "too big"}),
        )
        .await;
    assert!(
        status == StatusCode::PAYLOAD_TOO_LARGE || status == StatusCode::UNPROCESSABLE_ENTITY,
        "{status} {body}"
    );

    let hold = json!({"hold": "H-by-hand"});
    let (status, _, saga) = api
        .post(
            &format!("/v1/sagas/{id}/steps/reserve/complete"),
            &json!({"output": hold, "reason": "reserved by phone"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{saga}");
    let ended = api.wait_status(&id, "COMPENSATED").await;
    assert_eq!(step(&ended, "reserve")["output"], hold);

    // The compensation of the step done by hand received the operator's output, once.
    let undone = calls.of("reserve", Phase::Compensation);
    assert_eq!(undone.len(), 1, "{undone:?}");
    assert_eq!(undone[0].action_output, Some(hold));
    assert_eq!(
        undone[0].key,
        idempotency_key(id.parse().unwrap(), 0, Phase::Compensation)
    );
    // The action was not called again after the operator's word.
    assert_eq!(calls.of("reserve", Phase::Action).len(), 1);
    api.stop().await;
}

/// Makes saga `id` `PAUSED` as the pause command will (no lease, no timer), by writing its
/// row: it stands in for that command, which lands separately.
async fn pause_by_sql(db: &TempDb, id: Uuid) {
    db.execute(&format!(
        "UPDATE sagas SET status = 'PAUSED', next_run_at = NULL, lease_owner = NULL, \
         lease_expires_at = NULL, lease_epoch = lease_epoch + 1 WHERE id = '{id}'"
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_saga_s_step_completed_by_hand_runs_on_and_a_running_step_is_refused() {
    let db = TempDb::new();
    let store = db.store().await;
    let calls = Calls::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([handmade(&calls)]),
        test_config(),
    );
    eng.ready().await;
    let ops = Operations::of(&eng.engine);
    let reason = Reason::parse("the provider confirmed by mail").unwrap();
    let saga = eng
        .engine
        .start_saga("handmade", json!({"stuck_charge": true}))
        .await
        .unwrap();
    wait_for(&store, saga.id, LONG, |s| {
        s.steps[1].action.status == StepStatus::Retrying
    })
    .await;
    pause_by_sql(&db, saga.id).await;

    // Only the stage it stands on.
    let refused = ops
        .complete_step(saga.id, "reserve", json!(1), &reason, "ops")
        .await;
    assert!(
        matches!(refused, Err(OperationError::Conflict(_))),
        "{refused:?}"
    );
    let refused = ops
        .complete_step(saga.id, "ship", json!(1), &reason, "ops")
        .await;
    assert!(matches!(refused, Err(OperationError::Conflict(m)) if m.contains("charge")));

    let before = store.get_saga(saga.id).await.unwrap().unwrap();
    let after = ops
        .complete_step(
            saga.id,
            "charge",
            json!({"paid": "by hand"}),
            &reason,
            "ops",
        )
        .await
        .unwrap();
    // Running again (an engine may already have claimed it, or even finished it, by the
    // time the command reads it back), taken over from whoever held it.
    assert!(
        matches!(after.status, SagaStatus::Running | SagaStatus::Completed),
        "{after:?}"
    );
    assert!(after.lease_epoch > before.lease_epoch, "taken over");
    let events = store.events(saga.id).await.unwrap();
    let completed = events
        .iter()
        .find(|e| e.kind == "step.completed_by_operator")
        .unwrap();
    assert_eq!(completed.data["previous_status"], "PAUSED");
    assert_eq!(completed.data["actor"], "ops");
    assert_eq!(after.steps[1].action.status, StepStatus::Succeeded);
    let done = wait_for(&store, saga.id, LONG, |s| s.status.is_terminal()).await;
    assert_eq!(done.status, SagaStatus::Completed);
    assert_eq!(done.steps[1].output, Some(json!({"paid": "by hand"})));
    assert_eq!(calls.of("charge", Phase::Action).len(), 1);
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_a_paused_saga_takes_its_effects_over_and_undoes_them_with_its_keys() {
    let db = TempDb::new();
    let store = db.store().await;
    let calls = Calls::default();
    let eng = RunningEngine::start(
        store.clone(),
        registry_of([handmade(&calls)]),
        test_config(),
    );
    eng.ready().await;
    let ops = Operations::of(&eng.engine);
    let reason = Reason::parse("the provider is back; retry the charge").unwrap();
    let original = eng
        .engine
        .start_saga("handmade", json!({"stuck_charge": true}))
        .await
        .unwrap();
    wait_for(&store, original.id, LONG, |s| {
        s.steps[1].action.status == StepStatus::Retrying
    })
    .await;

    // Not while it may still change: it is running.
    let request = |input: Value| ForkRequest {
        input: Some(input),
        from_stage: Some("charge".to_owned()),
    };
    let refused = ops
        .fork(original.id, request(json!({})), &reason, "ops")
        .await;
    assert!(
        matches!(refused, Err(OperationError::Conflict(_))),
        "{refused:?}"
    );

    pause_by_sql(&db, original.id).await;
    let refused = ops
        .fork(
            original.id,
            ForkRequest {
                input: None,
                from_stage: Some("nope".to_owned()),
            },
            &reason,
            "ops",
        )
        .await;
    assert!(matches!(refused, Err(OperationError::Invalid(m)) if m.contains("nope")));
    // From after the stage it stands on: that stage's effect does not stand.
    let refused = ops
        .fork(
            original.id,
            ForkRequest {
                input: None,
                from_stage: Some("ship".to_owned()),
            },
            &reason,
            "ops",
        )
        .await;
    assert!(matches!(refused, Err(OperationError::Conflict(m)) if m.contains("charge")));

    // The new saga's charge fails: it compensates the reserve it took over, with the
    // original's keys, and the original never compensates.
    let forked = ops
        .fork(
            original.id,
            request(json!({"fail_charge": true})),
            &reason,
            "ops",
        )
        .await
        .unwrap()
        .saga;
    let old = store.get_saga(original.id).await.unwrap().unwrap();
    assert_eq!(old.status, SagaStatus::Aborted);
    assert_eq!(old.superseded_by, Some(forked.id));
    assert_eq!(forked.forked_from.as_ref().unwrap().saga_id, original.id);
    assert_eq!(
        forked.forked_from.as_ref().unwrap().stage.as_deref(),
        Some("charge")
    );
    assert_eq!(forked.steps[0].action.status, StepStatus::Succeeded);
    assert_eq!(forked.steps[0].output, old.steps[0].output);

    let ended = wait_for(&store, forked.id, LONG, |s| s.status.is_terminal()).await;
    assert_eq!(ended.status, SagaStatus::Compensated);
    assert_eq!(calls.of("reserve", Phase::Action).len(), 1, "not run again");
    let undone = calls.of("reserve", Phase::Compensation);
    assert_eq!(undone.len(), 1, "{undone:?}");
    assert_eq!(undone[0].saga, forked.id);
    assert_eq!(
        undone[0].key,
        idempotency_key(original.id, 0, Phase::Compensation),
        "the original's key"
    );
    assert_eq!(undone[0].action_output, old.steps[0].output);
    let still = store.get_saga(original.id).await.unwrap().unwrap();
    assert_eq!(still.status, SagaStatus::Aborted);
    assert_eq!(still.steps[0].compensation.status, StepStatus::Pending);

    // Superseded: no second fork of it, from a stage or afresh.
    let again = ops
        .fork(original.id, request(json!({})), &reason, "ops")
        .await;
    assert!(matches!(again, Err(OperationError::Conflict(m)) if m.contains("superseded")));
    let again = ops
        .fork(original.id, ForkRequest::default(), &reason, "ops")
        .await;
    assert!(
        matches!(again, Err(OperationError::Conflict(_))),
        "{again:?}"
    );
    eng.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_needs_the_definitions_of_a_server() {
    let db = TempDb::new();
    let store = db.store().await;
    let id = Uuid::now_v7();
    let refused = Operations::new(store.as_ref())
        .fork(
            id,
            ForkRequest::default(),
            &Reason::parse("x").unwrap(),
            "ops",
        )
        .await;
    assert!(matches!(refused, Err(OperationError::NeedsServer(m)) if m.contains("server")));
}

// ---- `fulfil_order` through a real `example-sagas serve`, with its participants' ledger ----

fn order(id: &str, extra: Value) -> Value {
    let mut input = json!({
        "order_id": id, "user": "ada", "amount": 4200,
        "items": [{"sku": "sku-1", "qty": 1}, {"sku": "sku-2", "qty": 2}],
    });
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    input
}

async fn ledger(db: &TempDb, order: &str) -> BTreeMap<String, u64> {
    let shop = Shop::open(&format!(
        "sqlite://{}",
        db.dir.path().join("shop.db").display()
    ))
    .await
    .unwrap();
    let entry = shop.fulfilment_ledger_for(order).await.unwrap();
    shop.close().await;
    entry
}

fn keys(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
}

async fn post(server: &Server, path: &str, body: &Value) -> (u16, Option<String>, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let location = r
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_owned());
    (status, location, r.json().await.unwrap_or(Value::Null))
}

async fn sagas_named(server: &Server, name: &str) -> Vec<Value> {
    let page: Value = reqwest::get(format!("{}/v1/sagas?name={name}&limit=100", server.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["sagas"].as_array().unwrap().clone()
}

/// An order that charged and then waits for its approval, aborted there: its reserves and its
/// charge stand, nothing will undo them.
async fn aborted_after_its_charge(server: &Server, order_id: &str) -> Uuid {
    let id = server
        .start(
            "fulfil_order",
            order(order_id, json!({"needs_approval": true})),
        )
        .await;
    server
        .wait_for(id, LONG, |s| {
            s["steps"]
                .as_array()
                .unwrap()
                .iter()
                .any(|st| st["name"] == "await_approval" && st["status"] == "WAITING")
        })
        .await;
    let (status, _, body) = post(
        server,
        &format!("/v1/sagas/{id}/abort"),
        &json!({"reason": "the approver left"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    id
}

#[tokio::test]
async fn a_fork_from_a_stage_of_an_aborted_order_charges_once_and_refunds_once_with_the_original_key(
) {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;

    // A running original cannot hand its effects over.
    let running = server
        .start(
            "fulfil_order",
            order("f-running", json!({"needs_approval": true})),
        )
        .await;
    server
        .wait_for(running, LONG, |s| s["status"] == "RUNNING")
        .await;
    let (status, _, body) = post(
        &server,
        &format!("/v1/sagas/{running}/fork"),
        &json!({"from_stage": "await_approval", "reason": "too early"}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(sagas_named(&server, "fulfil_order").await.len(), 1);

    let original = aborted_after_its_charge(&server, "f-fork").await;
    // Bad requests change nothing.
    for (body, expected) in [
        (json!({"from_stage": "nope", "reason": "x"}), 422),
        (json!({"from_stage": "ship", "reason": "x"}), 409),
        (
            json!({"from_stage": "await_approval", "input": {"order_id": 5}, "reason": "x"}),
            422,
        ),
        (json!({"from_stage": "await_approval", "reason": " "}), 400),
    ] {
        let (status, _, answer) = post(&server, &format!("/v1/sagas/{original}/fork"), &body).await;
        assert_eq!(status, expected, "{body} → {answer}");
    }
    assert_eq!(sagas_named(&server, "fulfil_order").await.len(), 2);
    assert_eq!(server.saga(original).await["status"], "ABORTED");

    let (status, location, forked) = post(
        &server,
        &format!("/v1/sagas/{original}/fork"),
        &json!({"from_stage": "await_approval", "reason": "approval by the new approver"}),
    )
    .await;
    assert_eq!(status, 201, "{forked}");
    let new: Uuid = forked["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        location.as_deref(),
        Some(format!("/v1/sagas/{new}").as_str())
    );
    assert_eq!(
        forked["forked_from"],
        json!({"saga_id": original, "stage": "await_approval"})
    );
    let old = server.saga(original).await;
    assert_eq!(old["status"], "ABORTED");
    assert_eq!(old["superseded_by"], json!(new));
    let charged = old["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "charge_payment")
        .unwrap()
        .clone();
    // Taken over with its recorded output.
    let taken = forked["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "charge_payment")
        .unwrap();
    assert_eq!(taken["status"], "SUCCEEDED");
    assert_eq!(taken["output"], charged["output"]);

    // Superseded: no second fork.
    let (status, _, body) = post(
        &server,
        &format!("/v1/sagas/{original}/fork"),
        &json!({"from_stage": "await_approval", "reason": "again"}),
    )
    .await;
    assert_eq!(status, 409, "{body}");

    // The new saga waits for its approval, is refused, and compensates what it took over.
    server
        .wait_for(new, LONG, |s| s["waiting_for"] == "signal:approval")
        .await;
    let (status, _, _) = post(
        &server,
        &format!("/v1/sagas/{new}/signals/approval"),
        &json!({"approved": false, "by": "grace"}),
    )
    .await;
    assert_eq!(status, 202);
    let ended = server
        .wait_for(new, LONG, |s| s["status"] == "COMPENSATED")
        .await;
    assert_eq!(ended["forked_from"]["saga_id"], json!(original));
    assert_eq!(
        ledger(&db, "f-fork").await,
        keys(&[
            ("reserved:sku-1", 1),
            ("reserved:sku-2", 1),
            ("charged", 1),
            ("released:sku-1", 1),
            ("released:sku-2", 1),
            ("refunded", 1),
        ]),
        "charged once, refunded once with the original's key"
    );
    let events: Value = reqwest::get(format!("{}/v1/sagas/{original}/events", server.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let forked_event = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "saga.forked")
        .unwrap()
        .clone();
    assert_eq!(forked_event["data"]["new_saga_id"], json!(new));
    assert_eq!(forked_event["data"]["from_stage"], "await_approval");
    assert_eq!(
        forked_event["data"]["reason"],
        "approval by the new approver"
    );
    assert_eq!(server.saga(original).await["status"], "ABORTED");
}

#[tokio::test]
async fn a_fork_afresh_of_a_compensated_order_runs_again_with_keys_of_its_own() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let original = server
        .start(
            "fulfil_order",
            order("f-again", json!({"simulate": {"fail_step": "ship"}})),
        )
        .await;
    server
        .wait_for(original, LONG, |s| s["status"] == "COMPENSATED")
        .await;

    // Through the CLI and the server, with an edited input: the new id is what it prints.
    let edited = order("f-again", json!({})).to_string();
    let out = run_bin(
        "example-sagas",
        &[
            "fork",
            &original.to_string()[..13],
            "--input",
            &edited,
            "--reason",
            "the warehouse is open again",
            "--server",
            &server.base,
        ],
        db.dir.path(),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let new: Uuid = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let done = server
        .wait_for(new, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_eq!(
        done["forked_from"],
        json!({"saga_id": original, "stage": null})
    );
    // The original is left as it was.
    let old = server.saga(original).await;
    assert_eq!(old["status"], "COMPENSATED");
    assert!(old.get("superseded_by").is_none(), "{old}");
    // New keys: a second charge really happened (the first one's key would have been deduped).
    assert_eq!(
        ledger(&db, "f-again").await,
        keys(&[
            ("reserved:sku-1", 2),
            ("reserved:sku-2", 2),
            ("charged", 2),
            ("released:sku-1", 1),
            ("released:sku-2", 1),
            ("refunded", 1),
            ("shipped", 1),
            ("notified", 1),
        ])
    );

    // On the database without a server, a fork says to use one.
    let out = run_bin(
        "example-sagas",
        &[
            "--database-url",
            &db.url,
            "fork",
            &original.to_string(),
            "--reason",
            "x",
        ],
        db.dir.path(),
    )
    .await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("server"),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_crash_right_after_a_fork_commits_leaves_every_effect_one_owner() {
    let db = TempDb::new();
    let server = Server::spawn(
        &db.url,
        db.dir.path(),
        &[("SAGA_CRASH_AT", "after_fork:fulfil_order")],
        &[],
    )
    .await;
    let original = aborted_after_its_charge(&server, "f-crash").await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sagas/{original}/fork", server.base))
        .json(&json!({"from_stage": "await_approval", "reason": "fork then crash"}))
        .send()
        .await;
    assert!(r.is_err(), "the server died before answering: {r:?}");
    server.wait_exit(Duration::from_secs(10));

    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let old = server.saga(original).await;
    assert_eq!(old["status"], "ABORTED");
    let new: Uuid = old["superseded_by"].as_str().unwrap().parse().unwrap();
    let sagas = sagas_named(&server, "fulfil_order").await;
    assert_eq!(sagas.len(), 2, "exactly the original and its fork");
    let forked = server.saga(new).await;
    assert_eq!(
        forked["forked_from"],
        json!({"saga_id": original, "stage": "await_approval"})
    );
    // The new saga is claimed after the restart and finishes; nothing is done twice.
    server
        .wait_for(new, LONG, |s| s["waiting_for"] == "signal:approval")
        .await;
    let (status, _, _) = post(
        &server,
        &format!("/v1/sagas/{new}/signals/approval"),
        &json!({"approved": true, "by": "grace"}),
    )
    .await;
    assert_eq!(status, 202);
    server
        .wait_for(new, LONG, |s| s["status"] == "COMPLETED")
        .await;
    assert_eq!(server.saga(original).await["status"], "ABORTED");
    assert_eq!(
        ledger(&db, "f-crash").await,
        keys(&[
            ("reserved:sku-1", 1),
            ("reserved:sku-2", 1),
            ("charged", 1),
            ("shipped", 1),
            ("notified", 1),
        ])
    );
}

#[tokio::test]
async fn the_cli_completes_a_failed_order_s_step_through_a_server_and_on_the_database() {
    let db = TempDb::new();
    let server = Server::spawn(&db.url, db.dir.path(), &[], &[]).await;
    let failing = json!({"simulate": {"fail_step": "notify_customer"}});
    let via_server = server
        .start("fulfil_order", order("f-cli-1", failing.clone()))
        .await;
    let on_db = server
        .start("fulfil_order", order("f-cli-2", failing))
        .await;
    for id in [via_server, on_db] {
        server.wait_for(id, LONG, |s| s["status"] == "FAILED").await;
    }
    let output = json!({"notified_by": "phone"}).to_string();
    let base = server.base.clone();
    let via_server_id = via_server.to_string();
    let on_db_id = on_db.to_string();
    let mut with_server = vec![
        "complete-step",
        &via_server_id[..13],
        "notify_customer",
        "--output",
        &output,
        "--reason",
        "called the customer",
    ];
    with_server.extend(["--server", &base]);
    let on_database = [
        "--database-url",
        &db.url,
        "complete-step",
        &on_db_id,
        "notify_customer",
        "--output",
        &output,
        "--reason",
        "called the customer",
    ];
    // A bad --output is refused before anything is sent or written.
    let bad = run_bin(
        "example-sagas",
        &[
            "complete-step",
            &via_server_id,
            "notify_customer",
            "--output",
            "{nope",
            "--reason",
            "x",
            "--server",
            &base,
        ],
        db.dir.path(),
    )
    .await;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--output"),
        "{bad:?}"
    );
    for (args, id) in [(&with_server[..], via_server), (&on_database[..], on_db)] {
        let out = run_bin("example-sagas", args, db.dir.path()).await;
        assert!(out.status.success(), "{out:?}");
        let done = server
            .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
            .await;
        let notify = done["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "notify_customer")
            .unwrap()
            .clone();
        assert_eq!(notify["output"], json!({"notified_by": "phone"}));
    }
    // Done by hand: the participant never notified.
    for order_id in ["f-cli-1", "f-cli-2"] {
        assert_eq!(ledger(&db, order_id).await.get("notified"), None);
    }
}

/// `trip`: the parallel group `book` (branches `hotel`, whose action asks to be retried in an
/// hour, and `car`), then `pay` (pivot).
fn trip(calls: &Calls) -> SagaDefinition {
    let branch = |name: &'static str| {
        let (act, undo) = (calls.clone(), calls.clone());
        Step::compensatable(
            name,
            move |ctx: StepContext| {
                let calls = act.clone();
                async move {
                    calls.record(&ctx)?;
                    if name == "hotel" {
                        return Err(StepError::retry_after(
                            Duration::from_secs(3600),
                            "the hotel desk is closed",
                        ));
                    }
                    Ok(json!({"booked": name}))
                }
            },
            move |ctx: StepContext| {
                let calls = undo.clone();
                async move { calls.record(&ctx) }
            },
        )
    };
    SagaDefinition::builder("trip", 1)
        .step(Step::parallel("book", vec![branch("hotel"), branch("car")]))
        .step(Step::pivot("pay", |_ctx: StepContext| async {
            Ok::<_, StepError>(json!("paid"))
        }))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_waiting_on_its_retry_is_completed_by_hand_and_its_group_goes_on() {
    let calls = Calls::default();
    let api = Harness::new(registry_of([trip(&calls)]))
        .await
        .into_api(HttpConfig::default())
        .await;
    let id = api.start_saga("trip", json!({})).await;
    let status_of = |s: &Value, name: &str| {
        s["steps"]
            .as_array()
            .and_then(|steps| steps.iter().find(|st| st["name"] == name))
            .map(|st| st["status"].clone())
    };
    api.wait(&id, |s| {
        status_of(s, "book/hotel") == Some(json!("RETRYING"))
            && status_of(s, "book/car") == Some(json!("SUCCEEDED"))
    })
    .await;
    let complete = |step: &str| format!("/v1/sagas/{id}/steps/{step}/complete");
    let (status, _, body) = api
        .post(&complete("book"), &json!({"output": 1, "reason": "x"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("book/hotel, book/car"), "{message}");

    let room = json!({"booked": "hotel", "room": 12});
    let (status, _, body) = api
        .post(
            &complete("book%2Fhotel"),
            &json!({"output": room, "reason": "booked by phone"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let done = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&done, "book")["output"]["hotel"], room);
    assert_eq!(calls.of("book/hotel", Phase::Action).len(), 1);
    api.stop().await;
}
