//! Steps whose action and compensation are HTTP requests to a participant (SPEC §16), against a
//! real participant served by axum on loopback in this file, on the backend `SAGA_TEST_BACKEND`
//! selects: each status mapped to success, retry or permanent failure; `Retry-After` in both
//! forms; the headers every request carries; a participant that applies the effect and then
//! hangs past the step's timeout; URLs built from the saga's data under callback safety; and a
//! compensation sent with its own key.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use orchestrator::model::{Attempt, Saga, SagaStatus, StepStatus};
use orchestrator::participants::header::{HeaderName, HeaderValue, AUTHORIZATION};
use orchestrator::participants::{HttpParticipant, ParticipantConfig};
use orchestrator::store::Store;
use orchestrator::webhooks::{verify_signature, CallbackPolicy};
use orchestrator::StartRequest;
use saga_dsl::{idempotency_key, Phase, RetryPolicy, SagaDefinition, Step, TraceContext};
use saga_suite::{registry_of, test_config, wait_terminal, RunningEngine, TempDb};
use serde_json::{json, Value};

const SECRET: &str = "whsec_participant";

/// What the participant answers to a request of `/scripted`, in order; once they are spent, it
/// applies the effect.
#[derive(Debug, Clone)]
enum Reply {
    /// This status, with a short body.
    Status(u16),
    /// `429` with this `Retry-After` value.
    Throttle(&'static str),
    /// `429` with a `Retry-After` date this many seconds after the request.
    ThrottleFor(u64),
}

/// A request as the participant received it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn key(&self) -> &str {
        self.header("idempotency-key").unwrap()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A fake participant: records every request, and applies each effect once per
/// `Idempotency-Key`, answering a repeat with the first answer.
#[derive(Default)]
struct Participant {
    seen: Mutex<Vec<Seen>>,
    /// The answer of each applied effect, by key.
    applied: Mutex<HashMap<String, Value>>,
    /// How many times each path applied an effect.
    effects: Mutex<HashMap<String, usize>>,
    script: Mutex<VecDeque<Reply>>,
    base: Mutex<String>,
}

impl Participant {
    async fn serve() -> Arc<Self> {
        let participant = Arc::new(Self::default());
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::any(handle))
            .with_state(participant.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        *participant.base.lock().unwrap() = format!("http://{addr}");
        tokio::spawn(async move { axum::serve(listener, app).await });
        participant
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.lock().unwrap())
    }

    fn port(&self) -> u16 {
        let base = self.base.lock().unwrap().clone();
        base.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn script(&self, replies: &[Reply]) {
        self.script.lock().unwrap().extend(replies.iter().cloned());
    }

    fn seen(&self, path: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }

    fn all_seen(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn effects(&self, path: &str) -> usize {
        self.effects.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Applies the effect of `seen` unless its key did already; the answer either way.
    fn apply(&self, seen: &Seen) -> Value {
        let key = seen.key().to_owned();
        let mut applied = self.applied.lock().unwrap();
        applied
            .entry(key.clone())
            .or_insert_with(|| {
                *self
                    .effects
                    .lock()
                    .unwrap()
                    .entry(seen.path.clone())
                    .or_default() += 1;
                let received = serde_json::from_slice::<Value>(&seen.body).unwrap_or(Value::Null);
                json!({"path": seen.path, "key": key, "received": received})
            })
            .clone()
    }
}

async fn handle(
    State(p): State<Arc<Participant>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let seen = Seen {
        path: uri.path().to_owned(),
        headers,
        body,
        at: Instant::now(),
    };
    p.seen.lock().unwrap().push(seen.clone());
    let path = seen.path.as_str();
    if let Some(code) = path.strip_prefix("/status/") {
        let status = StatusCode::from_u16(code.parse().unwrap()).unwrap();
        let location = p.url("/elsewhere");
        return (
            status,
            [("location", location.as_str())],
            format!("participant says {code}"),
        )
            .into_response();
    }
    match path {
        "/scripted" => {
            let next = p.script.lock().unwrap().pop_front();
            match next {
                Some(Reply::Status(code)) => {
                    let status = StatusCode::from_u16(code).unwrap();
                    return (status, format!("try again ({code})")).into_response();
                }
                Some(Reply::Throttle(after)) => {
                    return (
                        StatusCode::TOO_MANY_REQUESTS,
                        [("retry-after", after)],
                        "slow down",
                    )
                        .into_response();
                }
                Some(Reply::ThrottleFor(secs)) => {
                    let at = chrono::Utc::now() + chrono::Duration::seconds(secs as i64);
                    let date = at.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
                    return (
                        StatusCode::TOO_MANY_REQUESTS,
                        [("retry-after", date.as_str())],
                        "slow down",
                    )
                        .into_response();
                }
                None => {}
            }
        }
        "/hang-once" => {
            let first = !p.applied.lock().unwrap().contains_key(seen.key());
            let answer = p.apply(&seen);
            if first {
                // Applied, and then the answer never comes within the step's timeout.
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            return axum::Json(answer).into_response();
        }
        "/empty" => {
            p.apply(&seen);
            return StatusCode::OK.into_response();
        }
        "/html" => {
            p.apply(&seen);
            return axum::response::Html("<p>done</p>").into_response();
        }
        "/huge" => {
            p.apply(&seen);
            // Over the 1 MiB a step's output may be.
            return axum::Json(json!({"pad": "x".repeat(1024 * 1024)})).into_response();
        }
        _ => {}
    }
    axum::Json(p.apply(&seen)).into_response()
}

/// A policy that retries at once, so that a test does not wait for backoffs.
fn quick(attempts: u32) -> RetryPolicy {
    RetryPolicy::new()
        .with_max_attempts(attempts)
        .with_initial_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(10))
        .with_jitter(false)
}

fn client(config: ParticipantConfig) -> HttpParticipant {
    HttpParticipant::new(config).unwrap()
}

fn signed() -> HttpParticipant {
    client(ParticipantConfig {
        secret: Some(SECRET.to_owned()),
        ..ParticipantConfig::default()
    })
}

/// A saga of one compensatable step `reserve` (a POST of the input's `sku` to `reserve`, undone
/// by a POST of its own key and its action's to `/release`), then `then`.
fn reserve_then(p: &Participant, http: &HttpParticipant, then: impl Into<Step>) -> SagaDefinition {
    SagaDefinition::builder("s", 1)
        .step(
            Step::compensatable(
                "reserve",
                http.post(&p.url("/reserve"))
                    .unwrap()
                    .body(|ctx| Ok(json!({"sku": ctx.raw_input()["sku"]}))),
                http.post(&p.url("/release"))
                    .unwrap()
                    .body(|ctx| Ok(json!({"reservation": ctx.action_key()}))),
            )
            .retry(quick(3)),
        )
        .step(then)
        .build()
        .unwrap()
}

/// An engine running `def` over a fresh database.
struct Run {
    _db: TempDb,
    store: Arc<dyn Store>,
    eng: RunningEngine,
}

impl Run {
    async fn start(def: SagaDefinition) -> Self {
        let db = TempDb::new();
        let store = db.store().await;
        let eng = RunningEngine::start(store.clone(), registry_of([def]), test_config());
        eng.ready().await;
        Self {
            _db: db,
            store,
            eng,
        }
    }

    async fn saga(&self, request: StartRequest) -> (Saga, Vec<Attempt>) {
        let id = self.eng.engine.start(request).await.unwrap().saga_id();
        let done = wait_terminal(&self.store, id).await;
        let attempts = self.store.attempts(id).await.unwrap();
        (done, attempts)
    }

    async fn one(&self, input: Value) -> (Saga, Vec<Attempt>) {
        self.saga(StartRequest::new("s", input)).await
    }

    async fn stop(self) {
        self.eng.stop().await;
    }
}

fn errors_of(attempts: &[Attempt], step: &str) -> Vec<String> {
    attempts
        .iter()
        .filter(|a| a.step == step && a.phase == "action")
        .map(|a| a.error.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn a_2xx_answer_is_the_steps_output_and_bodies_come_from_input_and_earlier_outputs() {
    let p = Participant::serve().await;
    let http = signed();
    let ship = Step::compensatable(
        "ship",
        http.post(&p.url("/ship")).unwrap().body(|ctx| {
            Ok(json!({
                "sku": ctx.raw_input()["sku"],
                "reservation": ctx.raw_output_of("reserve").unwrap()["key"],
            }))
        }),
        http.post(&p.url("/unship")).unwrap(),
    );
    let def = SagaDefinition::builder("s", 1)
        .step(Step::compensatable(
            "reserve",
            http.post(&p.url("/reserve"))
                .unwrap()
                .body(|ctx| Ok(json!({"sku": ctx.raw_input()["sku"]}))),
            http.post(&p.url("/release")).unwrap(),
        ))
        .step(ship)
        .step(Step::pivot("confirm", http.post(&p.url("/empty")).unwrap()))
        .build()
        .unwrap();
    let run = Run::start(def).await;
    let (saga, _) = run.one(json!({"sku": "sku-1"})).await;
    assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    let reserve = &p.seen("/reserve")[0];
    assert_eq!(
        saga.steps[0].output,
        Some(json!({"path": "/reserve", "key": reserve.key(), "received": {"sku": "sku-1"}}))
    );
    assert_eq!(
        p.seen("/ship")[0].json(),
        json!({"sku": "sku-1", "reservation": reserve.key()})
    );
    assert_eq!(
        saga.steps[2].output,
        Some(Value::Null),
        "an empty answer is null"
    );
    // A request without a body has no content type.
    assert_eq!(p.seen("/empty")[0].header("content-type"), None);
    assert!(p.seen("/empty")[0].body.is_empty());
    run.stop().await;
}

#[tokio::test]
async fn a_2xx_answer_that_is_not_json_fails_permanently_naming_its_type() {
    let p = Participant::serve().await;
    let http = signed();
    let def = reserve_then(
        &p,
        &http,
        Step::compensatable(
            "ship",
            http.post(&p.url("/html")).unwrap(),
            http.post(&p.url("/unship")).unwrap(),
        )
        .retry(quick(3)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(
        errors_of(&attempts, "ship"),
        ["HTTP 200 OK: the answer is not JSON (content type text/html; charset=utf-8): <p>done</p>"]
    );
    run.stop().await;
}

#[tokio::test]
async fn a_2xx_answer_over_a_step_s_largest_output_fails_permanently() {
    let p = Participant::serve().await;
    let http = signed();
    let def = reserve_then(
        &p,
        &http,
        Step::compensatable(
            "ship",
            http.post(&p.url("/huge")).unwrap(),
            http.post(&p.url("/unship")).unwrap(),
        )
        .retry(quick(3)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(
        errors_of(&attempts, "ship"),
        ["HTTP 200 OK: the answer is over 1048576 bytes, the most a step's output may be"]
    );
    run.stop().await;
}

#[tokio::test]
async fn server_errors_timeouts_and_rate_limits_are_retried_with_the_same_key() {
    let p = Participant::serve().await;
    let http = signed();
    p.script(&[
        Reply::Status(503),
        Reply::Status(500),
        Reply::Status(408),
        Reply::Status(429),
    ]);
    let def = reserve_then(
        &p,
        &http,
        Step::compensatable(
            "pay",
            http.post(&p.url("/scripted"))
                .unwrap()
                .body(|ctx| Ok(json!({"amount": ctx.raw_input()["amount"]}))),
            http.post(&p.url("/refund")).unwrap(),
        )
        .retry(quick(5)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "a", "amount": 12})).await;
    assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    assert_eq!(saga.steps[1].action.attempts, 5);
    assert_eq!(
        errors_of(&attempts, "pay"),
        [
            "HTTP 503 Service Unavailable: try again (503)",
            "HTTP 500 Internal Server Error: try again (500)",
            "HTTP 408 Request Timeout: try again (408)",
            "HTTP 429 Too Many Requests: try again (429)",
            "",
        ]
    );
    let seen = p.seen("/scripted");
    assert_eq!(seen.len(), 5);
    let key = idempotency_key(saga.id, 1, Phase::Action).to_string();
    assert!(
        seen.iter().all(|s| s.key() == key),
        "one key on every attempt"
    );
    assert_eq!(p.effects("/scripted"), 1);
    assert_eq!(saga.steps[1].output.as_ref().unwrap()["key"], json!(key));
    run.stop().await;
}

#[tokio::test]
async fn retry_after_in_seconds_holds_the_next_attempt_back() {
    let p = Participant::serve().await;
    let http = signed();
    p.script(&[Reply::Throttle("1")]);
    let def = reserve_then(
        &p,
        &http,
        Step::retriable("notify", http.post(&p.url("/scripted")).unwrap()).retry(quick(3)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    let seen = p.seen("/scripted");
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
    assert_eq!(
        errors_of(&attempts, "notify")[0],
        "HTTP 429 Too Many Requests: slow down"
    );
    run.stop().await;
}

#[tokio::test]
async fn retry_after_as_an_http_date_holds_the_next_attempt_back() {
    let p = Participant::serve().await;
    let http = signed();
    // Two seconds ahead, written to the second: at least one second after the answer.
    p.script(&[Reply::ThrottleFor(2)]);
    let def = reserve_then(
        &p,
        &http,
        Step::retriable("notify", http.post(&p.url("/scripted")).unwrap()).retry(quick(3)),
    );
    let run = Run::start(def).await;
    let (saga, _) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    let seen = p.seen("/scripted");
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
    run.stop().await;
}

#[tokio::test]
async fn client_errors_fail_at_once_and_the_saga_compensates_with_the_compensations_key() {
    let p = Participant::serve().await;
    let http = signed();
    for code in [400u16, 404, 409, 422] {
        let path = format!("/status/{code}");
        let def = reserve_then(
            &p,
            &http,
            Step::compensatable(
                "pay",
                http.post(&p.url(&path)).unwrap(),
                http.post(&p.url("/refund")).unwrap(),
            )
            .retry(quick(5)),
        );
        let run = Run::start(def).await;
        let (saga, attempts) = run.one(json!({"sku": code})).await;
        assert_eq!(saga.status, SagaStatus::Compensated, "{code}");
        assert_eq!(saga.steps[1].action.status, StepStatus::Failed, "{code}");
        assert_eq!(saga.steps[1].action.attempts, 1, "{code}: not retried");
        let reason = StatusCode::from_u16(code)
            .unwrap()
            .canonical_reason()
            .unwrap();
        let message = format!("HTTP {code} {reason}: participant says {code}");
        assert_eq!(errors_of(&attempts, "pay"), std::slice::from_ref(&message));
        assert_eq!(saga.error, Some(format!("pay: {message}")));
        // The reservation was released, by a request of its own key that names the action's.
        let reserved = idempotency_key(saga.id, 0, Phase::Action).to_string();
        let release = idempotency_key(saga.id, 0, Phase::Compensation).to_string();
        let released: Vec<Seen> = p
            .seen("/release")
            .into_iter()
            .filter(|s| s.key() == release)
            .collect();
        assert_eq!(released.len(), 1, "{code}");
        assert_eq!(released[0].json(), json!({"reservation": reserved}));
        assert!(p.seen("/reserve").iter().any(|s| s.key() == reserved));
        assert_eq!(saga.steps[0].compensation.status, StepStatus::Succeeded);
        run.stop().await;
    }
    assert!(p.seen("/refund").is_empty(), "a failed step is not undone");
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_fails_permanently() {
    let p = Participant::serve().await;
    let http = signed();
    let def = reserve_then(
        &p,
        &http,
        Step::compensatable(
            "pay",
            http.post(&p.url("/status/302")).unwrap(),
            http.post(&p.url("/refund")).unwrap(),
        )
        .retry(quick(5)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[1].action.attempts, 1);
    assert_eq!(
        errors_of(&attempts, "pay"),
        [format!(
            "HTTP 302 Found, a redirect, not followed (to {}): participant says 302",
            p.url("/elsewhere")
        )]
    );
    assert!(p.seen("/elsewhere").is_empty());
    run.stop().await;
}

#[tokio::test]
async fn every_request_carries_its_key_trace_and_a_signature_that_verifies() {
    let p = Participant::serve().await;
    let http = signed();
    p.script(&[Reply::Status(503)]);
    let def = reserve_then(
        &p,
        &http,
        Step::retriable(
            "notify",
            http.post(&p.url("/scripted"))
                .unwrap()
                .body(|ctx| Ok(json!({"attempt": ctx.attempt()}))),
        )
        .retry(quick(3)),
    );
    let run = Run::start(def).await;
    let parent = TraceContext {
        trace_id: [0x5a; 16],
        span_id: [0x17; 8],
        sampled: true,
    };
    let (traced, _) = run
        .saga(StartRequest::new("s", json!({"sku": "t"})).in_trace(parent))
        .await;
    assert_eq!(traced.status, SagaStatus::Completed, "{:?}", traced.error);
    let (plain, _) = run.one(json!({"sku": "p"})).await;
    assert_eq!(plain.status, SagaStatus::Completed, "{:?}", plain.error);

    let seen = p.seen("/scripted");
    assert_eq!(
        seen.len(),
        3,
        "two attempts of the traced saga, one of the other"
    );
    for s in &seen {
        assert_eq!(s.header("content-type"), Some("application/json"));
        let signature = s.header("saga-signature").expect("signed");
        verify_signature(SECRET, signature, &s.body, Duration::from_secs(60)).unwrap();
        assert!(verify_signature("other", signature, &s.body, Duration::from_secs(60)).is_err());
        assert_eq!(s.header("saga-task-token"), None);
        assert_eq!(s.header("saga-task-url"), None);
    }
    let traced_key = idempotency_key(traced.id, 1, Phase::Action).to_string();
    let (first, second) = (&seen[0], &seen[1]);
    assert_eq!((first.key(), second.key()), (&*traced_key, &*traced_key));
    assert_eq!(
        (first.json(), second.json()),
        (json!({"attempt": 1}), json!({"attempt": 2}))
    );
    let traceparent = first.header("traceparent").expect("a traceparent");
    let trace_id = hex_of(&parent.trace_id);
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "{traceparent}"
    );
    assert!(second.header("traceparent").is_some());
    assert_eq!(
        seen[2].key(),
        idempotency_key(plain.id, 1, Phase::Action).to_string()
    );
    assert_eq!(
        seen[2].header("traceparent"),
        None,
        "a saga without a trace"
    );
    run.stop().await;
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn without_a_secret_no_signature_is_sent_and_headers_set_by_hand_are() {
    let p = Participant::serve().await;
    let http = client(ParticipantConfig::default());
    let def = reserve_then(
        &p,
        &http,
        Step::retriable(
            "notify",
            http.post(&p.url("/notify"))
                .unwrap()
                .header(AUTHORIZATION, HeaderValue::from_static("Bearer t0k"))
                // The call's own key wins over one set by hand.
                .header(
                    HeaderName::from_static("idempotency-key"),
                    HeaderValue::from_static("mine"),
                ),
        ),
    );
    let run = Run::start(def).await;
    let (saga, _) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    let notify = &p.seen("/notify")[0];
    assert_eq!(notify.header("saga-signature"), None);
    assert_eq!(
        notify.key(),
        idempotency_key(saga.id, 1, Phase::Action).to_string()
    );
    assert_eq!(notify.headers.get_all("idempotency-key").iter().count(), 1);
    assert_eq!(notify.header("authorization"), Some("Bearer t0k"));
    run.stop().await;
}

#[tokio::test]
async fn a_participant_that_applies_the_effect_then_hangs_is_retried_with_the_same_key() {
    let p = Participant::serve().await;
    let http = signed();
    let def = reserve_then(
        &p,
        &http,
        Step::compensatable(
            "pay",
            http.post(&p.url("/hang-once"))
                .unwrap()
                .body(|ctx| Ok(json!({"sku": ctx.raw_input()["sku"]}))),
            http.post(&p.url("/refund")).unwrap(),
        )
        .retry(quick(3))
        .timeout(Duration::from_millis(400)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "slow"})).await;
    assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    let seen = p.seen("/hang-once");
    assert_eq!(seen.len(), 2, "the timed-out attempt, then its retry");
    assert_eq!(seen[0].key(), seen[1].key());
    assert_eq!(p.effects("/hang-once"), 1, "the effect applied once");
    let outcomes: Vec<_> = attempts
        .iter()
        .filter(|a| a.step == "pay")
        .map(|a| a.outcome.clone().unwrap_or_default())
        .collect();
    assert_eq!(outcomes, ["timed_out", "succeeded"]);
    assert_eq!(saga.steps[1].output.as_ref().unwrap()["key"], seen[0].key());
    assert!(p.seen("/refund").is_empty());
    run.stop().await;
}

/// A saga whose second step POSTs to a URL built from its input's `host`.
fn to_input_host(p: &Participant, http: &HttpParticipant) -> SagaDefinition {
    reserve_then(
        p,
        http,
        Step::compensatable(
            "pay",
            http.request_to(orchestrator::participants::Method::POST, |ctx| {
                let host = ctx.raw_input()["host"].as_str().unwrap_or_default();
                Ok(format!("http://{host}/charge"))
            })
            .body(|ctx| Ok(json!({"sku": ctx.raw_input()["sku"]}))),
            http.post(&p.url("/refund")).unwrap(),
        )
        .retry(quick(5)),
    )
}

#[tokio::test]
async fn a_url_from_input_that_points_inside_the_network_is_refused_for_good() {
    let p = Participant::serve().await;
    let http = signed();
    let run = Run::start(to_input_host(&p, &http)).await;
    let port = p.port();
    // A literal address, refused before any request; and a name that resolves to loopback,
    // refused as the client resolves it.
    for (host, addr) in [
        (format!("127.0.0.1:{port}"), "127.0.0.1"),
        (format!("localhost:{port}"), ""),
    ] {
        let (saga, attempts) = run.one(json!({"sku": "x", "host": host})).await;
        assert_eq!(saga.status, SagaStatus::Compensated, "{host}");
        assert_eq!(saga.steps[1].action.attempts, 1, "{host}: not retried");
        let error = &errors_of(&attempts, "pay")[0];
        let name = host.split(':').next().unwrap();
        assert!(
            error.starts_with(&format!(
                "the participant URL http://{host}/charge built from the saga's data is refused: its host {name} is "
            )),
            "{error}"
        );
        assert!(
            error.contains(
                "an internal address (loopback), which the participant client does not allow"
            ),
            "{error}"
        );
        assert!(error.contains(addr), "{error}");
    }
    assert!(p.seen("/charge").is_empty(), "no request reached it");
    run.stop().await;
}

#[tokio::test]
async fn a_url_from_input_reaches_an_internal_host_the_client_allows() {
    let p = Participant::serve().await;
    let http = client(ParticipantConfig {
        secret: Some(SECRET.to_owned()),
        allowed: CallbackPolicy::allowing(["127.0.0.1", "LOCALHOST"]),
        ..ParticipantConfig::default()
    });
    let run = Run::start(to_input_host(&p, &http)).await;
    let port = p.port();
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (saga, _) = run.one(json!({"sku": "x", "host": host})).await;
        assert_eq!(saga.status, SagaStatus::Completed, "{:?}", saga.error);
    }
    assert_eq!(p.seen("/charge").len(), 2);
    assert_eq!(p.effects("/charge"), 2);
    run.stop().await;
}

#[tokio::test]
async fn a_url_from_input_that_is_no_url_fails_permanently() {
    let p = Participant::serve().await;
    let http = signed();
    let run = Run::start(to_input_host(&p, &http)).await;
    let (saga, attempts) = run.one(json!({"sku": "x", "host": "no such host"})).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[1].action.attempts, 1, "not retried");
    let error = &errors_of(&attempts, "pay")[0];
    assert!(
        error.starts_with(
            "the participant URL \"http://no such host/charge\" built from the saga's data is not usable: "
        ),
        "{error}"
    );
    run.stop().await;
}

#[tokio::test]
async fn a_participant_that_cannot_be_reached_is_retried_then_compensated() {
    let p = Participant::serve().await;
    let http = signed();
    // A port nothing listens on: bound, then released.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let def = reserve_then(
        &p,
        &http,
        Step::compensatable(
            "pay",
            http.post(&format!("http://{closed}/charge")).unwrap(),
            http.post(&p.url("/refund")).unwrap(),
        )
        .retry(quick(3)),
    );
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "a"})).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[1].action.attempts, 3, "retried");
    for error in errors_of(&attempts, "pay") {
        assert!(
            error.starts_with(&format!("the request to http://{closed} failed: ")),
            "{error}"
        );
    }
    run.stop().await;
}

#[test]
fn a_url_from_configuration_must_be_an_http_url() {
    let http = signed();
    for bad in ["ftp://stock.internal/reserve", "not a url", "http://"] {
        let e = http.post(bad).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("participant URL {bad:?}: ")),
            "{e}"
        );
    }
    assert!(http.post("https://stock.internal/reserve").is_ok());
    // From configuration, an internal host is trusted as given.
    assert!(http.post("http://127.0.0.1:9/reserve").is_ok());
}

#[tokio::test]
async fn a_compensation_over_http_runs_with_its_own_key_until_it_succeeds() {
    let p = Participant::serve().await;
    let http = signed();
    p.script(&[Reply::Status(502), Reply::Status(503)]);
    let def = SagaDefinition::builder("s", 1)
        .step(
            Step::compensatable(
                "reserve",
                http.post(&p.url("/reserve"))
                    .unwrap()
                    .body(|ctx| Ok(json!({"sku": ctx.raw_input()["sku"]}))),
                http.post(&p.url("/scripted")).unwrap().body(|ctx| {
                    Ok(json!({
                        "reservation": ctx.action_key(),
                        "reserved": ctx.action_output::<Value>()?,
                    }))
                }),
            )
            .compensation_retry(
                RetryPolicy::forever()
                    .with_initial_delay(Duration::from_millis(10))
                    .with_max_delay(Duration::from_millis(10))
                    .with_jitter(false),
            ),
        )
        .step(Step::pivot(
            "pay",
            http.post(&p.url("/status/422")).unwrap(),
        ))
        .build()
        .unwrap();
    let run = Run::start(def).await;
    let (saga, attempts) = run.one(json!({"sku": "c"})).await;
    assert_eq!(saga.status, SagaStatus::Compensated);
    assert_eq!(saga.steps[0].compensation.attempts, 3);
    let undo: Vec<_> = attempts
        .iter()
        .filter(|a| a.phase == "compensation")
        .map(|a| a.error.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        undo,
        [
            "HTTP 502 Bad Gateway: try again (502)",
            "HTTP 503 Service Unavailable: try again (503)",
            "",
        ]
    );
    let action_key = idempotency_key(saga.id, 0, Phase::Action).to_string();
    let own_key = idempotency_key(saga.id, 0, Phase::Compensation).to_string();
    let seen = p.seen("/scripted");
    assert_eq!(seen.len(), 3);
    let reserved = p.seen("/reserve")[0].clone();
    assert_eq!(reserved.key(), action_key);
    for s in &seen {
        assert_eq!(s.key(), own_key);
        assert_eq!(
            s.json(),
            json!({
                "reservation": action_key,
                "reserved": {"path": "/reserve", "key": action_key, "received": {"sku": "c"}},
            })
        );
    }
    assert_eq!(p.effects("/scripted"), 1);
    assert_eq!(p.all_seen(), 5, "reserve, pay, and three releases");
    run.stop().await;
}
