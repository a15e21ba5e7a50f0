//! Completion by callback (SPEC §16): a call whose participant answers "accepted" and reports
//! later through `POST /v1/tasks/{token}/complete`, `…/fail` and `…/heartbeat`, over real HTTP
//! on loopback, on the backend `SAGA_TEST_BACKEND` selects. The participant is the test: the
//! step hands it each attempt's token and idempotency key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::http::HttpConfig;
use reqwest::StatusCode;
use saga_dsl::{RetryPolicy, SagaDefinition, Step, StepContext, StepError};
use saga_suite::api::{Api, Harness};
use saga_suite::registry_of;
use serde_json::{json, Value};
use uuid::Uuid;

/// One attempt handed to the participant.
#[derive(Debug, Clone)]
struct Handed {
    saga: Uuid,
    attempt: u32,
    key: Uuid,
    token: String,
    url: String,
}

/// What the participant saw and did.
#[derive(Clone, Default)]
struct Participant {
    handed: Arc<Mutex<Vec<Handed>>>,
    effects: Arc<Mutex<Vec<String>>>,
    /// When set, the step reports its own completion before it answers (a participant faster
    /// than the orchestrator's record of its answer): the API's base URL.
    report_first: Arc<Mutex<Option<String>>>,
    /// When set, the step reports its completion this long after it answered: the API's base
    /// URL and the delay.
    report_after: Arc<Mutex<Option<(String, Duration)>>>,
    /// With `report_first`: the step's answer is lost after it reported.
    answer_lost: Arc<Mutex<bool>>,
}

impl Participant {
    fn handed(&self, saga: &str) -> Vec<Handed> {
        let saga: Uuid = saga.parse().unwrap();
        let all = self.handed.lock().unwrap().clone();
        all.into_iter().filter(|h| h.saga == saga).collect()
    }

    async fn wait_handed(&self, saga: &str, n: usize) -> Vec<Handed> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let handed = self.handed(saga);
            if handed.len() >= n {
                return handed;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "attempt {n} of saga {saga} was never handed over: {handed:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn effects(&self) -> Vec<String> {
        self.effects.lock().unwrap().clone()
    }
}

/// `callback`: `reserve` (compensatable, in-process) → `pay` (compensatable, completed by
/// callback, `timeout` per attempt, 4 attempts) → `ship` (a pivot that records the payment's
/// output).
fn definition(p: &Participant, timeout: Duration) -> SagaDefinition {
    let reserve = {
        let p = p.clone();
        move |_ctx: StepContext| {
            let p = p.clone();
            async move {
                p.effects.lock().unwrap().push("reserved".into());
                Ok::<_, StepError>(json!({"reserved": true}))
            }
        }
    };
    let release = {
        let p = p.clone();
        move |_ctx: StepContext| {
            let p = p.clone();
            async move {
                p.effects.lock().unwrap().push("released".into());
                Ok(())
            }
        }
    };
    let pay = {
        let p = p.clone();
        move |ctx: StepContext| {
            let p = p.clone();
            async move {
                let task = ctx
                    .task()
                    .expect("a call completed by callback has a token");
                let handed = Handed {
                    saga: ctx.saga_id(),
                    attempt: ctx.attempt(),
                    key: ctx.idempotency_key(),
                    token: task.token().to_owned(),
                    url: task.url().to_owned(),
                };
                p.handed.lock().unwrap().push(handed);
                let first = p.report_first.lock().unwrap().clone();
                if let Some(base) = first {
                    let answer = reqwest::Client::new()
                        .post(format!("{base}/v1/tasks/{}/complete", task.token()))
                        .json(&json!({"output": {"charge": "fast"}}))
                        .send()
                        .await
                        .map_err(|e| StepError::retryable(e.to_string()))?;
                    assert_eq!(answer.status(), StatusCode::OK);
                    if *p.answer_lost.lock().unwrap() {
                        // Reported, and then its answer is lost on the way back.
                        return Err(StepError::retryable("connection reset by peer"));
                    }
                }
                let later = p.report_after.lock().unwrap().clone();
                if let Some((base, after)) = later {
                    let url = format!("{base}/v1/tasks/{}/complete", task.token());
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let body = json!({"output": {"charge": "soon"}});
                        let answer = reqwest::Client::new().post(url).json(&body).send().await;
                        assert_eq!(answer.unwrap().status(), StatusCode::OK);
                    });
                }
                Ok::<_, StepError>(json!({"accepted": true}))
            }
        }
    };
    let refund = {
        let p = p.clone();
        move |ctx: StepContext| {
            let p = p.clone();
            async move {
                p.effects
                    .lock()
                    .unwrap()
                    .push(format!("refunded:{}", ctx.action_key()));
                Ok(())
            }
        }
    };
    let ship = {
        let p = p.clone();
        move |ctx: StepContext| {
            let p = p.clone();
            async move {
                let paid = ctx.raw_output_of("pay").cloned().unwrap_or(Value::Null);
                p.effects.lock().unwrap().push(format!("shipped:{paid}"));
                Ok::<_, StepError>(json!({}))
            }
        }
    };
    let policy = RetryPolicy::new()
        .with_initial_delay(Duration::from_millis(20))
        .with_max_attempts(4);
    SagaDefinition::builder("callback", 1)
        .step(Step::compensatable("reserve", reserve, release))
        .step(
            Step::compensatable("pay", pay, refund)
                .completed_by_callback()
                .timeout(timeout)
                .retry(policy),
        )
        .step(Step::pivot("ship", ship))
        .build()
        .unwrap()
}

async fn setup(timeout: Duration) -> (Participant, Api) {
    let p = Participant::default();
    let harness = Harness::new(registry_of([definition(&p, timeout)])).await;
    let api = harness.into_api(HttpConfig::default()).await;
    (p, api)
}

/// Starts a `callback` saga and waits until its first attempt was handed over and the step
/// waits for its callback: the saga's id and that attempt.
async fn start_waiting(p: &Participant, api: &Api) -> (String, Handed) {
    let id = api.start_saga("callback", json!({})).await;
    let first = p.wait_handed(&id, 1).await.remove(0);
    api.wait(&id, |s| step(s, "pay")["status"] == "WAITING")
        .await;
    (id, first)
}

async fn report(api: &Api, token: &str, what: &str, body: Value) -> (StatusCode, Value) {
    let (status, _, body) = api.post(&format!("/v1/tasks/{token}/{what}"), &body).await;
    (status, body)
}

fn step<'a>(saga: &'a Value, name: &str) -> &'a Value {
    saga["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {saga:#}"))
}

async fn attempts(api: &Api, id: &str) -> Vec<(String, u64, String)> {
    let (_, saga) = api.get(&format!("/v1/sagas/{id}")).await;
    saga["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["step"].as_str().unwrap().to_owned(),
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap_or("open").to_owned(),
            )
        })
        .filter(|(step, _, _)| step == "pay")
        .collect()
}

#[tokio::test]
async fn a_completion_by_callback_ends_the_step_with_its_output_and_the_saga_goes_on() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    let id = api.start_saga("callback", json!({})).await;
    let handed = p.wait_handed(&id, 1).await;
    assert!(handed[0]
        .url
        .ends_with(&format!("/v1/tasks/{}", handed[0].token)));
    // Parked on the callback, holding no worker, and saying so.
    let saga = api
        .wait(&id, |s| step(s, "pay")["status"] == "WAITING")
        .await;
    assert_eq!(saga["waiting_for"], "task", "{saga:#}");
    assert_eq!(saga["status"], "RUNNING");
    let token = &handed[0].token;
    let (status, body) = report(
        &api,
        token,
        "complete",
        json!({"output": {"charge": "c-1"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "recorded");
    assert_eq!(body["saga_id"], id.as_str());
    assert_eq!(body["step"], "pay");
    assert_eq!(body["attempt"], 1);
    let saga = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&saga, "pay")["output"], json!({"charge": "c-1"}));
    assert_eq!(
        p.effects(),
        ["reserved", r#"shipped:{"charge":"c-1"}"#],
        "the next stage read the callback's output"
    );
    assert_eq!(
        attempts(&api, &id).await,
        [("pay".into(), 1, "succeeded".into())]
    );
    // A repeat of the same completion answers the same; another outcome does not.
    let (status, body) = report(
        &api,
        token,
        "complete",
        json!({"output": {"charge": "c-1"}}),
    )
    .await;
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::OK, &json!("repeated"))
    );
    let (status, body) = report(
        &api,
        token,
        "complete",
        json!({"output": {"charge": "c-2"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _) = report(&api, token, "fail", json!({"error": "late"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = report(&api, token, "heartbeat", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, events) = api.get(&format!("/v1/sagas/{id}/events")).await;
    let text = events.to_string();
    assert!(text.contains("task.completed"), "{text}");
    assert!(
        !text.contains(token.as_str()),
        "a token never reaches the events"
    );
    api.stop().await;
}

#[tokio::test]
async fn a_retryable_failure_tries_again_with_the_same_key_and_a_new_token() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    let id = api.start_saga("callback", json!({})).await;
    let first = p.wait_handed(&id, 1).await.remove(0);
    let (status, body) = report(
        &api,
        &first.token,
        "fail",
        json!({"error": "card network busy", "retryable": true}),
    )
    .await;
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::OK, &json!("recorded")),
        "{body}"
    );
    let second = p.wait_handed(&id, 2).await.remove(1);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.key, first.key, "the same idempotency key");
    assert_ne!(second.token, first.token, "a token per attempt");
    // The first attempt's token is no longer current.
    let (status, body) = report(&api, &first.token, "complete", json!({"output": 1})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(!body.to_string().contains(&first.token));
    let (status, _) = report(&api, &second.token, "complete", json!({"output": 2})).await;
    assert_eq!(status, StatusCode::OK);
    api.wait_status(&id, "COMPLETED").await;
    assert_eq!(
        attempts(&api, &id).await,
        [
            ("pay".into(), 1, "retryable".into()),
            ("pay".into(), 2, "succeeded".into())
        ]
    );
    api.stop().await;
}

#[tokio::test]
async fn a_permanent_failure_compensates_the_saga() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    let id = api.start_saga("callback", json!({})).await;
    let first = p.wait_handed(&id, 1).await.remove(0);
    let (status, _) = report(
        &api,
        &first.token,
        "fail",
        json!({"error": "card declined", "retryable": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let saga = api.wait_status(&id, "COMPENSATED").await;
    assert_eq!(step(&saga, "pay")["status"], "FAILED");
    assert_eq!(step(&saga, "pay")["last_error"], "card declined");
    assert_eq!(
        p.effects(),
        ["reserved", "released"],
        "the charge never happened"
    );
    assert_eq!(p.handed(&id).len(), 1, "not tried again");
    api.stop().await;
}

#[tokio::test]
async fn a_forged_or_malformed_token_names_no_task() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    let id = api.start_saga("callback", json!({})).await;
    let real = p.wait_handed(&id, 1).await.remove(0).token;
    // The same length, another signature; a flipped bit of the attempt; junk.
    let mut flipped = real.clone().into_bytes();
    let at = 2 * 22 + 1; // within the attempt number
    flipped[at] = if flipped[at] == b'0' { b'1' } else { b'0' };
    let flipped = String::from_utf8(flipped).unwrap();
    let other = format!("{}{}", &real[..real.len() - 4], "abcd");
    for forged in [flipped.as_str(), other.as_str(), "abc", "zz"] {
        let (status, body) = report(&api, forged, "complete", json!({"output": 1})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{forged}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
    }
    // The real one still works.
    let (status, _) = report(&api, &real, "complete", json!({"output": 1})).await;
    assert_eq!(status, StatusCode::OK);
    api.wait_status(&id, "COMPLETED").await;
    api.stop().await;
}

#[tokio::test]
async fn a_wait_past_its_timeout_is_an_unknown_outcome_tried_again_with_the_same_key() {
    let (p, api) = setup(Duration::from_millis(800)).await;
    let id = api.start_saga("callback", json!({})).await;
    let first = p.wait_handed(&id, 1).await.remove(0);
    // Nobody reports: the wait times out and the call is made again.
    let second = p.wait_handed(&id, 2).await.remove(1);
    assert_eq!(second.key, first.key);
    let (status, _) = report(&api, &first.token, "complete", json!({"output": "late"})).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a late callback for an old attempt"
    );
    let (status, _) = report(&api, &second.token, "complete", json!({"output": "ok"})).await;
    assert_eq!(status, StatusCode::OK);
    let saga = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&saga, "pay")["output"], "ok");
    assert_eq!(
        attempts(&api, &id).await,
        [
            ("pay".into(), 1, "timed_out".into()),
            ("pay".into(), 2, "succeeded".into())
        ]
    );
    api.stop().await;
}

#[tokio::test]
async fn heartbeats_keep_a_wait_alive_past_its_timeout() {
    let (p, api) = setup(Duration::from_millis(1000)).await;
    let (id, first) = start_waiting(&p, &api).await;
    // Three timeouts' worth of time, a heartbeat every 300 ms.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, body) = report(&api, &first.token, "heartbeat", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["outcome"], "extended");
        assert!(body["timeout_at"].is_string(), "{body}");
    }
    assert_eq!(p.handed(&id).len(), 1, "never timed out meanwhile");
    let (status, _) = report(&api, &first.token, "complete", json!({"output": 1})).await;
    assert_eq!(status, StatusCode::OK);
    api.wait_status(&id, "COMPLETED").await;
    assert_eq!(
        attempts(&api, &id).await,
        [("pay".into(), 1, "succeeded".into())]
    );
    api.stop().await;
}

#[tokio::test]
async fn a_callback_racing_the_timeout_ends_the_attempt_exactly_once() {
    let (p, api) = setup(Duration::from_millis(600)).await;
    // The completion sent around the deadline, a little before to a little after; each saga
    // checked at once, before its next attempt could time out too.
    for offset in [-60i64, -30, -10, 0, 10, 30, 60] {
        let id = api.start_saga("callback", json!({})).await;
        let first = p.wait_handed(&id, 1).await.remove(0);
        let waiting = api
            .wait(&id, |s| step(s, "pay")["status"] == "WAITING")
            .await;
        let deadline = chrono::DateTime::parse_from_rfc3339(
            step(&waiting, "pay")["timeout_at"].as_str().unwrap(),
        )
        .unwrap()
        .timestamp_millis();
        let now = chrono::Utc::now().timestamp_millis();
        let sleep = (deadline + offset - now).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(sleep)).await;
        let (status, _) = report(&api, &first.token, "complete", json!({"output": "first"})).await;
        if status == StatusCode::OK {
            let saga = api.wait_status(&id, "COMPLETED").await;
            assert_eq!(step(&saga, "pay")["output"], "first", "offset {offset}");
            assert_eq!(
                attempts(&api, &id).await,
                [("pay".into(), 1, "succeeded".into())]
            );
            assert_eq!(
                p.handed(&id).len(),
                1,
                "not tried again after its completion"
            );
        } else {
            assert_eq!(status, StatusCode::CONFLICT, "offset {offset}");
            let second = p.wait_handed(&id, 2).await.remove(1);
            assert_eq!(second.key, first.key);
            let (status, _) =
                report(&api, &second.token, "complete", json!({"output": "second"})).await;
            assert_eq!(status, StatusCode::OK, "offset {offset}");
            let saga = api.wait_status(&id, "COMPLETED").await;
            assert_eq!(step(&saga, "pay")["output"], "second");
            assert_eq!(
                attempts(&api, &id).await[0],
                ("pay".into(), 1, "timed_out".into())
            );
        }
    }
    api.stop().await;
}

#[tokio::test]
async fn a_participant_that_calls_back_before_its_answer_is_recorded_completes_the_step() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    *p.report_first.lock().unwrap() = Some(api.base.clone());
    let id = api.start_saga("callback", json!({})).await;
    let saga = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&saga, "pay")["output"], json!({"charge": "fast"}));
    assert_eq!(
        attempts(&api, &id).await,
        [("pay".into(), 1, "succeeded".into())]
    );
    api.stop().await;
}

#[tokio::test]
async fn a_cancel_while_a_step_waits_for_its_callback_compensates_it_and_refuses_the_late_report() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    let (id, first) = start_waiting(&p, &api).await;
    let (status, _, body) = api
        .post(&format!("/v1/sagas/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let saga = api.wait_status(&id, "COMPENSATED").await;
    // Its outcome was unknown: compensated with the action's key, in reverse order.
    assert_eq!(step(&saga, "pay")["status"], "UNKNOWN");
    assert_eq!(
        p.effects(),
        [
            "reserved".to_owned(),
            format!("refunded:{}", first.key),
            "released".to_owned()
        ]
    );
    assert_eq!(
        attempts(&api, &id).await[0],
        ("pay".into(), 1, "abandoned".into())
    );
    let (status, _) = report(&api, &first.token, "complete", json!({"output": 1})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    api.stop().await;
}

#[tokio::test]
async fn a_paused_saga_keeps_a_report_and_takes_it_once_resumed() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    let (id, first) = start_waiting(&p, &api).await;
    let metrics = Api::send(api.req(reqwest::Method::GET, "/metrics"))
        .await
        .text;
    assert!(
        metrics.contains("saga_waiting{kind=\"task\"} 1"),
        "{metrics}"
    );
    let (status, _, body) = api
        .post(
            &format!("/v1/sagas/{id}/pause"),
            &json!({"reason": "checking the card"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = report(&api, &first.token, "complete", json!({"output": "paid"})).await;
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::OK, &json!("recorded")),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, saga) = api.get(&format!("/v1/sagas/{id}")).await;
    assert_eq!(
        saga["status"], "PAUSED",
        "a report does not resume a paused saga"
    );
    let (status, _, body) = api
        .post(
            &format!("/v1/sagas/{id}/resume"),
            &json!({"reason": "all good"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let saga = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&saga, "pay")["output"], "paid");
    assert_eq!(
        attempts(&api, &id).await,
        [("pay".into(), 1, "succeeded".into())]
    );
    api.stop().await;
}

#[tokio::test]
async fn a_report_that_comes_soon_after_the_answer_lets_the_saga_go_on_without_giving_it_back() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    // Within the engine's short hold (100 ms in the tests' configuration).
    *p.report_after.lock().unwrap() = Some((api.base.clone(), Duration::from_millis(20)));
    let id = api.start_saga("callback", json!({})).await;
    let saga = api.wait_status(&id, "COMPLETED").await;
    assert_eq!(step(&saga, "pay")["output"], json!({"charge": "soon"}));
    // The driver that made the call made the next one too: the saga was never given back and
    // claimed again (a claim takes a new lease epoch).
    let epochs: Vec<u64> = saga["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["lease_epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(epochs, [1, 1, 1], "{saga:#}");
    api.stop().await;
}

#[tokio::test]
async fn a_report_whose_call_s_answer_was_lost_is_the_attempt_s_outcome() {
    let (p, api) = setup(Duration::from_secs(30)).await;
    *p.report_first.lock().unwrap() = Some(api.base.clone());
    *p.answer_lost.lock().unwrap() = true;
    let id = api.start_saga("callback", json!({})).await;
    let saga = api.wait_status(&id, "COMPLETED").await;
    // The completion the participant was answered 200 for stands: not tried again.
    assert_eq!(step(&saga, "pay")["output"], json!({"charge": "fast"}));
    assert_eq!(
        attempts(&api, &id).await,
        [("pay".into(), 1, "succeeded".into())]
    );
    assert_eq!(p.handed(&id).len(), 1);
    api.stop().await;
}
