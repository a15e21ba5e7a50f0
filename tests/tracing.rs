//! Traces over OTLP/HTTP, received by a real OTLP receiver on loopback (`support/otlp.rs`,
//! which decodes the exporter's protobuf): one trace per saga under the `traceparent` of its
//! start, a span per attempt with its outcome, failed attempts marked as errors, the
//! participants' own spans beneath their attempts, the trace context handed to steps, sent
//! with webhooks and broker messages and inherited by child sagas, and a span for an attempt a
//! crash cut short.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::engine::StartRequest;
use orchestrator::telemetry::{parse_traceparent, Telemetry};
use orchestrator::EngineConfig;
use saga_dsl::{SagaDefinition, Step, StepContext, StepError, TraceContext};
use saga_suite::nats::{messages, NatsServer};
use saga_suite::otlp::{OtlpReceiver, ReceivedSpan};
use saga_suite::{registry_of, test_config, wait_terminal, RunningEngine, Server, TempDb};
use serde_json::{json, Value};
use uuid::Uuid;

const LONG: Duration = Duration::from_secs(60);
/// The caller's span: the start request's `traceparent`.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn caller_traceparent() -> String {
    format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
}

/// A webhook receiver that keeps the `traceparent` header of each delivery by event type.
async fn header_receiver() -> (String, Arc<Mutex<BTreeMap<String, String>>>) {
    let seen: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::Json<Value>| {
                let kept = kept.clone();
                async move {
                    let tp = headers
                        .get("traceparent")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    let kind = body["type"].as_str().unwrap_or_default().to_owned();
                    kept.lock().unwrap().insert(kind, tp);
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn span_named<'a>(spans: &'a [ReceivedSpan], saga: Uuid, name: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.name == name && s.attr("saga.id") == saga.to_string())
        .collect()
}

/// A compensated `place_order` started under a caller's span: its saga span is a child of that
/// span, every attempt in the log is one span under the saga span with its step, phase,
/// attempt and outcome, the failed ones are errors, the participants' spans sit beneath their
/// attempts, and the webhook deliveries and the broker's messages carry the saga span's
/// context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensated_saga_is_one_trace_beneath_its_callers_span() {
    let receiver = OtlpReceiver::start().await;
    let (hook, deliveries) = header_receiver().await;
    let nats = NatsServer::start();
    let db = TempDb::new();
    let server = Server::spawn(
        &db.url,
        db.dir.path(),
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
        &[
            "--otlp-endpoint",
            &receiver.endpoint,
            "--webhook-url",
            &hook,
            "--nats-url",
            &nats.url(),
        ],
    )
    .await;
    let input = json!({"order_id": "o-1", "user": "ada", "amount": 1200,
        "simulate": {"transient_failures": {"charge_payment": 1}, "fail_step": "assign_rider"}});
    let started = reqwest::Client::new()
        .post(format!("{}/v1/sagas/place_order", server.base))
        .header("traceparent", caller_traceparent())
        .json(&input)
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let id: Uuid = started.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    server
        .wait_for(id, LONG, |s| s["status"] == "COMPENSATED")
        .await;
    let attempts: Value = reqwest::get(format!("{}/v1/sagas/{id}/attempts", server.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let attempts = attempts["attempts"].as_array().unwrap().clone();
    // reserve, charge ×2 (one transient failure), assign (failed), refund, release.
    assert_eq!(attempts.len(), 6, "{attempts:#?}");

    let spans = receiver
        .wait_for(LONG, |spans| {
            !span_named(spans, id, "saga place_order").is_empty()
                && spans
                    .iter()
                    .filter(|s| s.attr("saga.id") == id.to_string() && s.name != "saga place_order")
                    .count()
                    >= attempts.len()
                && spans.iter().filter(|s| s.name.starts_with("shop.")).count() >= 4
        })
        .await;
    assert!(
        spans.iter().all(|s| s.trace_id == CALLER_TRACE),
        "{spans:#?}"
    );
    assert!(spans.iter().all(|s| s.service == "saga-orchestrator"));

    let saga_span = span_named(&spans, id, "saga place_order")[0].clone();
    assert_eq!(saga_span.parent_span_id, CALLER_SPAN);
    assert_eq!(saga_span.attr("saga.status"), "COMPENSATED");
    assert_eq!(saga_span.status_code, 2, "a compensated saga is an error");
    assert!(saga_span.end_ns > saga_span.start_ns);

    let attempt_spans: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.attr("saga.id") == id.to_string() && s.name != "saga place_order")
        .collect();
    assert_eq!(attempt_spans.len(), attempts.len(), "one span per attempt");
    for a in &attempts {
        let (step, phase) = (a["step"].as_str().unwrap(), a["phase"].as_str().unwrap());
        let number = a["attempt"].as_i64().unwrap();
        let matching: Vec<&&ReceivedSpan> = attempt_spans
            .iter()
            .filter(|s| {
                s.attr("saga.step") == step
                    && s.attr("saga.phase") == phase
                    && s.attributes["saga.attempt"] == json!(number)
            })
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{step} {phase} #{number}: {attempt_spans:#?}"
        );
        let span = matching[0];
        assert_eq!(span.name, format!("{phase} {step}"));
        assert_eq!(span.parent_span_id, saga_span.span_id);
        assert_eq!(span.attr("saga.name"), "place_order");
        assert_eq!(span.attr("saga.outcome"), a["outcome"].as_str().unwrap());
        if a["outcome"] == "succeeded" {
            assert_eq!(span.status_code, 1, "{span:#?}");
        } else {
            assert_eq!(
                span.status_code, 2,
                "a failed attempt is an error: {span:#?}"
            );
            assert_eq!(span.status_message, a["error"].as_str().unwrap());
        }
    }
    let failed: Vec<String> = attempt_spans
        .iter()
        .filter(|s| s.status_code == 2)
        .map(|s| format!("{} #{}", s.name, s.attributes["saga.attempt"]))
        .collect();
    assert_eq!(
        failed.len(),
        2,
        "the transient charge failure and the rider: {failed:?}"
    );

    // The participants' spans (opened with `tracing` inside the steps) are children of the
    // attempt that ran them.
    let reserve = attempt_spans
        .iter()
        .find(|s| s.name == "action reserve_stock")
        .unwrap();
    let apply = spans
        .iter()
        .find(|s| s.name == "shop.apply" && s.parent_span_id == reserve.span_id);
    assert!(apply.is_some(), "{spans:#?}");
    let refund = attempt_spans
        .iter()
        .find(|s| s.name == "compensation charge_payment")
        .unwrap();
    assert!(spans
        .iter()
        .any(|s| s.name == "shop.undo" && s.parent_span_id == refund.span_id));

    // Every webhook delivery carries the saga span's context.
    let expected = format!("00-{CALLER_TRACE}-{}-01", saga_span.span_id);
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let seen = deliveries.lock().unwrap().clone();
        if seen.contains_key("saga.compensated") {
            assert!(seen.values().all(|tp| *tp == expected), "{seen:#?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{seen:#?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // And so does every message published to JetStream.
    let mut stream = nats.stream("SAGAS").await;
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let published = messages(&mut stream).await;
        if published
            .iter()
            .any(|m| m.body["type"] == "saga.compensated")
        {
            assert!(
                published.iter().all(|m| m.traceparent == expected),
                "{published:#?}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{published:#?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    server.kill9();
}

/// What the steps of the in-process sagas saw: their trace context, by saga.
type Seen = Arc<Mutex<Vec<(Uuid, Option<TraceContext>)>>>;

fn recording_step(name: &str, seen: &Seen) -> Step<saga_dsl::Call> {
    let seen = seen.clone();
    let action = move |ctx: StepContext| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((ctx.saga_id(), ctx.trace()));
            Ok::<_, StepError>(json!({}))
        }
    };
    Step::compensatable(name, action, |_: StepContext| async {
        Ok::<_, StepError>(())
    })
}

/// A saga with one step that records its trace context, and one that runs it as a child.
fn traced_sagas(seen: &Seen) -> [SagaDefinition; 2] {
    let child = SagaDefinition::builder("traced", 1)
        .step(recording_step("call", seen))
        .build()
        .unwrap();
    let parent = SagaDefinition::builder("parent", 1)
        .step(Step::child("kid", "traced", |_| Ok(json!({}))))
        .step(recording_step("after", seen))
        .build()
        .unwrap();
    [child, parent]
}

/// Without an endpoint nothing is exported: a saga of its own has no trace context to pass on
/// (one nobody records would only tell the services it calls not to record theirs), and a
/// saga started in a caller's trace passes the caller's on, as the caller decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_only_a_callers_trace_is_passed_on() {
    let seen: Seen = Arc::default();
    let db = TempDb::new();
    let store = db.store().await;
    let eng = RunningEngine::start(
        store.clone(),
        registry_of(traced_sagas(&seen)),
        test_config(),
    );
    eng.ready().await;
    let own = eng.engine.start_saga("traced", json!({})).await.unwrap();
    wait_terminal(&store, own.id).await;
    let caller = parse_traceparent(&caller_traceparent()).unwrap();
    let joined = eng
        .engine
        .start(StartRequest::new("traced", json!({})).in_trace(caller))
        .await
        .unwrap()
        .saga_id();
    wait_terminal(&store, joined).await;
    eng.stop().await;

    let seen = seen.lock().unwrap().clone();
    let of = |id: Uuid| seen.iter().find(|(s, _)| *s == id).unwrap().1;
    assert_eq!(of(own.id), None);
    let joined_trace = of(joined).unwrap();
    assert_eq!(joined_trace.trace_id_hex(), CALLER_TRACE);
    assert!(joined_trace.sampled, "the caller's decision");
    assert_ne!(joined_trace.span_id, caller.span_id);
}

/// With an exporter, a step is given its attempt's span, and a child saga's trace is its
/// parent's: the child's saga span is a child of the parent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_see_their_attempts_span_and_a_child_saga_joins_its_parents_trace() {
    let receiver = OtlpReceiver::start().await;
    let seen: Seen = Arc::default();
    let db = TempDb::new();
    let store = db.store().await;
    let telemetry = Telemetry::otlp(&receiver.endpoint).unwrap();
    let config = EngineConfig {
        telemetry: telemetry.clone(),
        ..test_config()
    };
    let eng = RunningEngine::start(store.clone(), registry_of(traced_sagas(&seen)), config);
    eng.ready().await;
    let parent = eng.engine.start_saga("parent", json!({})).await.unwrap();
    assert_eq!(
        wait_terminal(&store, parent.id).await.status,
        orchestrator::SagaStatus::Completed
    );
    let child = saga_dsl::child_saga_id(parent.id, "kid");
    eng.stop().await;
    // Stopping the exporter sends what it still holds.
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
    let spans = receiver
        .wait_for(LONG, |spans| {
            !span_named(spans, parent.id, "saga parent").is_empty()
                && !span_named(spans, child, "saga traced").is_empty()
                && !span_named(spans, parent.id, "action after").is_empty()
        })
        .await;

    let parent_span = span_named(&spans, parent.id, "saga parent")[0];
    let child_span = span_named(&spans, child, "saga traced")[0];
    let trace = hex(parent.id.as_bytes());
    assert_eq!(parent_span.trace_id, trace, "a saga's own trace is its id");
    assert_eq!(parent_span.parent_span_id, "", "the root");
    assert_eq!(child_span.trace_id, trace);
    assert_eq!(child_span.parent_span_id, parent_span.span_id);

    let call = span_named(&spans, child, "action call")[0];
    assert_eq!(call.parent_span_id, child_span.span_id);
    let seen = seen.lock().unwrap().clone();
    let in_child = seen.iter().find(|(s, _)| *s == child).unwrap().1.unwrap();
    assert_eq!(
        hex(&in_child.span_id),
        call.span_id,
        "the step sees its attempt"
    );
    assert!(in_child.sampled);
    let after = span_named(&spans, parent.id, "action after")[0];
    let in_parent = seen
        .iter()
        .find(|(s, _)| *s == parent.id)
        .unwrap()
        .1
        .unwrap();
    assert_eq!(hex(&in_parent.span_id), after.span_id);
    assert_eq!(after.parent_span_id, parent_span.span_id);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A process killed during an attempt: the process that takes the saga over emits that
/// attempt's span, from its start in the log, as interrupted, beside the span of the attempt
/// made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_a_crash_cut_short_is_a_span_marked_interrupted() {
    let receiver = OtlpReceiver::start().await;
    let db = TempDb::new();
    let args = ["--otlp-endpoint", receiver.endpoint.as_str()];
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let server = Server::spawn(&db.url, db.dir.path(), &env, &args).await;
    let input = json!({"order_id": "o-9", "user": "ada", "amount": 10,
        "simulate": {"delay_ms": 1500}});
    let id = server.start("place_order", input).await;
    server
        .wait_for(id, LONG, |s| s["steps"][0]["status"] == "RUNNING")
        .await;
    server.kill9();

    let server = Server::spawn(&db.url, db.dir.path(), &env, &args).await;
    server
        .wait_for(id, LONG, |s| s["status"] == "COMPLETED")
        .await;
    let spans = receiver
        .wait_for(LONG, |spans| {
            !span_named(spans, id, "saga place_order").is_empty()
                && span_named(spans, id, "action reserve_stock").len() == 2
        })
        .await;
    let reserve = span_named(&spans, id, "action reserve_stock");
    let cut = reserve
        .iter()
        .find(|s| s.attr("saga.outcome") == "interrupted")
        .unwrap();
    assert_eq!(cut.attributes["saga.attempt"], json!(1));
    assert_eq!(cut.status_code, 2);
    assert!(cut.end_ns > cut.start_ns, "from its start in the log");
    let again = reserve
        .iter()
        .find(|s| s.attr("saga.outcome") == "succeeded")
        .unwrap();
    assert_eq!(again.attributes["saga.attempt"], json!(2));
    server.kill9();
}

/// A saga an operator aborts is ended by no driver: the abort emits its saga span, an error
/// with the `ABORTED` status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_saga_has_its_span_too() {
    let receiver = OtlpReceiver::start().await;
    let db = TempDb::new();
    let server = Server::spawn(
        &db.url,
        db.dir.path(),
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
        &["--otlp-endpoint", &receiver.endpoint],
    )
    .await;
    let input = json!({"order_id": "o-5", "user": "ada", "amount": 10,
        "simulate": {"delay_ms": 3000}});
    let id = server.start("place_order", input).await;
    let aborted = reqwest::Client::new()
        .post(format!("{}/v1/sagas/{id}/abort", server.base))
        .json(&json!({"reason": "customer called"}))
        .send()
        .await
        .unwrap();
    assert_eq!(aborted.status(), 200);
    let spans = receiver
        .wait_for(LONG, |spans| {
            !span_named(spans, id, "saga place_order").is_empty()
        })
        .await;
    let saga_span = span_named(&spans, id, "saga place_order")[0];
    assert_eq!(saga_span.attr("saga.status"), "ABORTED");
    assert_eq!(saga_span.status_code, 2);
    assert_eq!(saga_span.trace_id, hex(id.as_bytes()));
    server.kill9();
}

/// With a sample ratio, a share of the sagas is traced, each one whole (its saga span and
/// every attempt) and the others not at all, as the saga id decides in every process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_share_of_the_sagas_is_traced_whole_and_the_rest_not_at_all() {
    let receiver = OtlpReceiver::start().await;
    let seen: Seen = Arc::default();
    let db = TempDb::new();
    let store = db.store().await;
    let telemetry = Telemetry::otlp(&receiver.endpoint)
        .unwrap()
        .with_sample_ratio(0.5);
    let config = EngineConfig {
        telemetry: telemetry.clone(),
        ..test_config()
    };
    let eng = RunningEngine::start(store.clone(), registry_of(traced_sagas(&seen)), config);
    eng.ready().await;
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(eng.engine.start_saga("traced", json!({})).await.unwrap().id);
    }
    for id in &ids {
        wait_terminal(&store, *id).await;
    }
    eng.stop().await;
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
    let spans = receiver.spans();
    let sampling = orchestrator::telemetry::Sampling::ratio(0.5);
    let traced: Vec<Uuid> = ids
        .iter()
        .copied()
        .filter(|id| sampling.records(*id))
        .collect();
    assert!(
        (5..=35).contains(&traced.len()),
        "about half: {}",
        traced.len()
    );
    for id in &ids {
        let saga_spans = span_named(&spans, *id, "saga traced").len();
        let attempt_spans = span_named(&spans, *id, "action call").len();
        let expected = usize::from(traced.contains(id));
        assert_eq!((saga_spans, attempt_spans), (expected, expected), "{id}");
    }
    let seen = seen.lock().unwrap().clone();
    for (id, trace) in seen {
        assert_eq!(trace.unwrap().sampled, traced.contains(&id), "{id}");
    }
}

/// A saga not sampled exports nothing at all: neither its own spans nor those its
/// participants open (they run in its unsampled context, so they are not roots of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_not_sampled_exports_nothing_not_even_its_participants_spans() {
    let receiver = OtlpReceiver::start().await;
    let db = TempDb::new();
    let mut server = Server::spawn(
        &db.url,
        db.dir.path(),
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
        &[
            "--otlp-endpoint",
            &receiver.endpoint,
            "--otlp-sample-ratio",
            "0",
        ],
    )
    .await;
    let undone = json!({"order_id": "o-6", "user": "ada", "amount": 10,
        "simulate": {"fail_step": "assign_rider"}});
    let id = server.start("place_order", undone).await;
    server
        .wait_for(id, LONG, |s| s["status"] == "COMPENSATED")
        .await;
    // A graceful stop exports whatever the exporter still holds.
    server.signal("TERM");
    let stopped = saga_suite::wait_exit(&mut server.child, LONG);
    assert!(stopped.success());
    assert_eq!(receiver.spans(), vec![], "nothing recorded");
}
