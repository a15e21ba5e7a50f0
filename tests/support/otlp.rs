//! A real OTLP/HTTP trace receiver on loopback: it accepts what an exporter posts to
//! `/v1/traces` (protobuf), decodes it and keeps every span, for the tests to read as a tree.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{json, Value};

/// One received span, its ids in lowercase hex.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The trace.
    pub trace_id: String,
    /// The span.
    pub span_id: String,
    /// Its parent, empty for a root.
    pub parent_span_id: String,
    /// Its name.
    pub name: String,
    /// Its attributes: strings, integers and booleans as JSON.
    pub attributes: BTreeMap<String, Value>,
    /// `0` unset, `1` ok, `2` error.
    pub status_code: i32,
    /// The status message (an error's).
    pub status_message: String,
    /// Start and end, in nanoseconds since the epoch.
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
    /// `service.name` of the resource that sent it.
    pub service: String,
}

impl ReceivedSpan {
    /// A string attribute, or `""`.
    pub fn attr(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// The receiver: its URL and what it received so far.
#[derive(Clone)]
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`, to give as the exporter's endpoint.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    requests: Arc<Mutex<u64>>,
}

fn any_to_json(value: Option<AnyValue>) -> Value {
    match value {
        Some(AnyValue::StringValue(s)) => json!(s),
        Some(AnyValue::IntValue(i)) => json!(i),
        Some(AnyValue::BoolValue(b)) => json!(b),
        Some(AnyValue::DoubleValue(d)) => json!(d),
        other => json!(format!("{other:?}")),
    }
}

async fn receive(State(receiver): State<OtlpReceiver>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    *receiver.requests.lock().unwrap() += 1;
    let mut spans = receiver.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(|kv| any_to_json(kv.value.clone().and_then(|v| v.value)))
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                let status = span.status.unwrap_or_default();
                spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    attributes: span
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, any_to_json(kv.value.and_then(|v| v.value))))
                        .collect(),
                    status_code: status.code,
                    status_message: status.message,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    service: service.clone(),
                });
            }
        }
    }
    StatusCode::OK
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl OtlpReceiver {
    /// Listens on a free loopback port until the test's runtime ends.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let receiver = Self {
            endpoint: format!("http://{}", listener.local_addr().unwrap()),
            spans: Arc::default(),
            requests: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        receiver
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// How many export requests arrived.
    pub fn requests(&self) -> u64 {
        *self.requests.lock().unwrap()
    }

    /// Waits until `done` holds of the spans received (a batch exporter sends them a little
    /// later); panics with what arrived after `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the expected spans never arrived; received: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}
