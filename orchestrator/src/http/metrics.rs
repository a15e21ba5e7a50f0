//! Prometheus metrics: one recorder per process, the HTTP request counter, and `GET /metrics`.
//!
//! The engine records its series with the `metrics` facade (`metrics::counter!` and friends in
//! `engine/`); they go nowhere until a recorder is installed. Building a router installs the
//! Prometheus recorder once per process ([`handle`]), so a binary gets them for free, and tests
//! that build several routers in one process share it rather than fail on "already installed".
//!
//! | series | kind | labels |
//! |---|---|---|
//! | `saga_started_total` | counter | `name` |
//! | `saga_ended_total` | counter | `name`, `status` |
//! | `saga_duration_seconds` | histogram | `name`, `status`: from creation to the end |
//! | `saga_step_duration_seconds` | histogram | `name`, `step`, `phase`, `outcome` |
//! | `saga_step_retries_total` | counter | `name`, `step`, `phase` |
//! | `saga_compensations_total` | counter | `name`, `step` |
//! | `saga_needs_attention` | gauge | (none): refreshed from the store at each scrape |
//! | `saga_waiting` | gauge | `kind` (`sleep`, `signal`, `child`, `task`, `scheduled`, `limit`, `rate`): refreshed from the store at each scrape |
//! | `sagas_by_status` | gauge | `status`: refreshed from the store at each scrape |
//! | `http_requests_total` | counter | `method`, `route` (the route template), `status` |
//! | `http_request_duration_seconds` | histogram | `method`, `route`, `status` |
//! | `saga_build_info` | gauge | `version` (always 1) |
//! | `outbox_lag_events`, `outbox_lag_seconds` | gauge | `target` (`webhooks`, `nats`) |
//! | `outbox_published_total`, `outbox_publish_failures_total` | counter | `target` |

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::http::error::ApiError;
use crate::http::openapi::{Forbidden, Unauthorized};
use crate::http::state::AppState;
use crate::model::ListFilter;

/// The bucket bounds of `saga_step_duration_seconds`, from 5 ms to 5 minutes.
const STEP_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The bucket bounds of `saga_duration_seconds`: sagas may sleep or wait for days.
const SAGA_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0, 86400.0,
    604800.0,
];

/// The bucket bounds of `http_request_duration_seconds`, from 1 ms (a long poll may take
/// minutes).
const HTTP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 120.0,
];

/// At most this many flagged sagas are counted for `saga_needs_attention` (one page of the
/// store's list); a larger backlog shows as 1000.
const NEEDS_ATTENTION_CAP: u32 = 1000;

/// How often histograms are folded and idle series trimmed when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus handle, installing the recorder on first use.
///
/// When another recorder is installed already (an application that set up its own), the
/// series recorded through the `metrics` facade go to that one: this handle then renders only
/// an empty registry, and a warning says so once.
pub(crate) fn handle() -> PrometheusHandle {
    HANDLE.get_or_init(install).clone()
}

fn install() -> PrometheusHandle {
    let buckets = [
        ("saga_step_duration_seconds", STEP_BUCKETS),
        ("saga_duration_seconds", SAGA_BUCKETS),
        ("http_request_duration_seconds", HTTP_BUCKETS),
    ];
    let builder = buckets
        .iter()
        .try_fold(PrometheusBuilder::new(), |b, (name, bounds)| {
            b.set_buckets_for_metric(Matcher::Full((*name).to_owned()), bounds)
        });
    let builder = match builder {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "cannot set histogram buckets; using summaries");
            PrometheusBuilder::new()
        }
    };
    let handle = match builder.install_recorder() {
        Ok(handle) => handle,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "a metrics recorder is installed already; /metrics will not show the saga series"
            );
            PrometheusBuilder::new().build_recorder().handle()
        }
    };
    describe();
    let upkeep = handle.clone();
    // A plain thread, not a task: it must outlive whichever runtime built the first router.
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the metrics upkeep thread; scrapes still do it");
    }
    handle
}

/// The `# HELP` lines.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!("saga_started_total", "Sagas started, by definition name.");
    describe_counter!(
        "saga_ended_total",
        "Sagas that reached a terminal status, by definition name and status."
    );
    describe_histogram!(
        "saga_duration_seconds",
        Unit::Seconds,
        "Duration of each saga that ended, from its creation to its terminal status, by status."
    );
    describe_gauge!(
        "sagas_by_status",
        "Sagas in the log in each status, read from the store at each scrape."
    );
    describe_histogram!(
        "http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer each HTTP request, by method, route template and status."
    );
    describe_gauge!(
        "saga_build_info",
        "Always 1; the version label says which build of the orchestrator is running."
    );
    describe_histogram!(
        "saga_step_duration_seconds",
        Unit::Seconds,
        "Duration of each action or compensation attempt, by outcome."
    );
    describe_counter!(
        "saga_step_retries_total",
        "Attempts of an action or compensation that failed and were scheduled again."
    );
    describe_counter!(
        "saga_compensations_total",
        "Compensations that succeeded (steps undone), by saga and step."
    );
    describe_gauge!(
        "saga_needs_attention",
        "Sagas flagged as needing a person (capped at 1000), read from the store at each scrape."
    );
    describe_gauge!(
        "saga_waiting",
        "Sagas waiting without a worker, by what they wait for (sleep, signal, child, or a \
         scheduled start), read from the store at each scrape."
    );
    describe_counter!(
        "http_requests_total",
        "HTTP requests answered, by method, route template and status."
    );
    describe_counter!(
        "idempotent_replays_total",
        "Starts answered with the saved response of an earlier request with the same \
         Idempotency-Key."
    );
    describe_gauge!(
        "outbox_lag_events",
        "Events in the outbox a relay has not published yet (roughly), by target: webhooks, nats."
    );
    describe_gauge!(
        "outbox_lag_seconds",
        Unit::Seconds,
        "How long the oldest event a relay has not published yet has waited, by target."
    );
    describe_counter!(
        "outbox_published_total",
        "Events a broker target acknowledged, by target (republished copies included)."
    );
    describe_counter!(
        "outbox_publish_failures_total",
        "Broker publish rounds that failed (the broker down, full or slow) and will be retried, by target."
    );
    describe_counter!(
        "webhook_deliveries_total",
        "Webhook deliveries that ended, by result: delivered, or gave_up after the last attempt."
    );
    describe_counter!(
        "webhook_failures_total",
        "Webhook attempts that failed (an error or a non-2xx answer), retried or not."
    );
    describe_counter!(
        "saga_purged_total",
        "Finished sagas deleted by retention or saga purge, with all their rows."
    );
}

/// Registers, at 0, every series whose labels are known before anything happens: the saga
/// series of each definition of `registry` (started, ended by status, retries, compensations,
/// the saga and step duration histograms), the HTTP series of each documented route and
/// success status of `api`, the unlabelled counters, the webhook results and the build info,
/// so that rates and absences can be told apart from the first scrape. Series labelled by an
/// error status, or by a target configured later, appear with their first value.
pub(crate) fn zero_series(registry: &saga_dsl::Registry, api: &utoipa::openapi::OpenApi) {
    use crate::model::SagaStatus;
    use saga_dsl::{Phase, StepKind};
    for def in registry.iter() {
        let name = def.name().to_owned();
        metrics::counter!("saga_started_total", "name" => name.clone()).increment(0);
        for status in SagaStatus::ALL.iter().filter(|s| s.is_terminal()) {
            metrics::counter!("saga_ended_total", "name" => name.clone(),
                              "status" => status.as_str())
            .increment(0);
            // A histogram handle that records nothing is rendered with empty buckets.
            let _ = metrics::histogram!("saga_duration_seconds", "name" => name.clone(),
                                        "status" => status.as_str());
        }
        for step in def.steps() {
            let step_name = step.name().to_owned();
            for phase in [Phase::Action, Phase::Compensation] {
                metrics::counter!("saga_step_retries_total", "name" => name.clone(),
                                  "step" => step_name.clone(), "phase" => phase.as_str())
                .increment(0);
            }
            // Waits make no calls; groups are timed under their own name, as their branches.
            let phases: &[Phase] = match step.rank_kind() {
                None => &[],
                Some(StepKind::Compensatable) => &[Phase::Action, Phase::Compensation],
                Some(_) => &[Phase::Action],
            };
            for phase in phases {
                for outcome in crate::engine::CALL_OUTCOMES {
                    let _ = metrics::histogram!("saga_step_duration_seconds",
                        "name" => name.clone(), "step" => step_name.clone(),
                        "phase" => phase.as_str(), "outcome" => *outcome);
                }
            }
            if step.kind() == StepKind::Compensatable {
                metrics::counter!("saga_compensations_total", "name" => name.clone(),
                                  "step" => step_name.clone())
                .increment(0);
            }
        }
    }
    for counter in [
        "idempotent_replays_total",
        "webhook_failures_total",
        "saga_purged_total",
    ] {
        metrics::counter!(counter).increment(0);
    }
    for result in ["delivered", "gave_up"] {
        metrics::counter!("webhook_deliveries_total", "result" => result).increment(0);
    }
    metrics::gauge!("saga_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    zero_http_series(api);
}

/// The HTTP series of every route of `api` with each success status it documents. Error
/// statuses are left to appear when they happen: at 0 they would multiply the page by the
/// number of possible answers for series that mostly stay empty.
fn zero_http_series(api: &utoipa::openapi::OpenApi) {
    for (route, item) in &api.paths.paths {
        let operations = [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("DELETE", &item.delete),
            ("PATCH", &item.patch),
            ("HEAD", &item.head),
        ];
        for (method, operation) in operations {
            let Some(operation) = operation else { continue };
            let successes = operation
                .responses
                .responses
                .keys()
                .filter(|s| s.starts_with('2'));
            for status in successes {
                let labels = [
                    ("method", method.to_owned()),
                    ("route", route.clone()),
                    ("status", status.clone()),
                ];
                let _ = metrics::histogram!("http_request_duration_seconds", &labels);
                metrics::counter!("http_requests_total", &labels).increment(0);
            }
        }
    }
}

/// A method as a label: the standard ones by name, anything else as `OTHER`, so that a client
/// cannot create series at will.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// The outermost layer: counts every answer, timeouts and refusals included, by the route
/// template it matched (`/v1/sagas/{saga}`, never the raw path) or `unmatched`.
pub(crate) async fn track_requests(req: Request, next: Next) -> Response {
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    let status = response.status().as_str().to_owned();
    metrics::histogram!(
        "http_request_duration_seconds",
        "method" => method,
        "route" => route.clone(),
        "status" => status.clone()
    )
    .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        "http_requests_total",
        "method" => method,
        "route" => route,
        "status" => status
    )
    .increment(1);
    response
}

/// The OpenAPI description of `GET /metrics`.
const METRICS_DESCRIPTION: &str = "The process's series in the Prometheus text format: sagas \
    started and ended, saga and step durations, retries, compensations, sagas by status, the \
    needs-attention count, the sagas waiting by what they wait for, HTTP requests and their \
    durations, the outbox relays' lag, and the build. Series whose labels are known at start are \
    there at 0 from the first scrape. Needs the bearer token when the server has one.";

/// `GET /metrics`: the Prometheus text exposition of this process's series.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    summary = "Prometheus metrics",
    description = METRICS_DESCRIPTION,
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text format 0.0.4",
         content_type = "text/plain", body = String),
        Unauthorized,
        Forbidden,
    )
)]
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let filter = ListFilter {
        needs_attention: true,
        limit: NEEDS_ATTENTION_CAP,
        ..ListFilter::default()
    };
    match state.engine.store().list_sagas(&filter).await {
        Ok(page) => {
            metrics::gauge!("saga_needs_attention").set(page.sagas.len() as f64);
        }
        // Still serve the other series: a scrape that fails entirely would hide them too.
        Err(e) => tracing::warn!(error = %e, "cannot count the sagas needing attention"),
    }
    match state.engine.store().count_by_status().await {
        Ok(counts) => {
            for (status, n) in counts {
                metrics::gauge!("sagas_by_status", "status" => status.as_str()).set(n as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count the sagas by status"),
    }
    match state.engine.store().waiting().await {
        Ok(w) => {
            for (kind, n) in [
                ("sleep", w.sleep),
                ("signal", w.signal),
                ("child", w.child),
                ("task", w.task),
                ("scheduled", w.scheduled),
                ("limit", w.limit),
                ("rate", w.rate),
            ] {
                metrics::gauge!("saga_waiting", "kind" => kind).set(n as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count the waiting sagas"),
    }
    let body = state.metrics.render();
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(PROMETHEUS_TEXT),
        )],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_bounded_labels() {
        assert_eq!(method_label(&Method::GET), "GET");
        let odd = Method::from_bytes(b"BREW").expect("a method");
        assert_eq!(method_label(&odd), "OTHER");
    }

    #[test]
    fn the_handle_is_shared() {
        let a = handle();
        let b = handle();
        metrics::counter!("saga_started_total", "name" => "unit_test").increment(1);
        assert!(a.render().contains("unit_test"));
        assert!(b.render().contains("unit_test"));
    }
}
