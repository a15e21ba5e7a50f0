//! `GET /metrics`: the saga and HTTP series in the Prometheus text format.

use reqwest::{Method, StatusCode};
use saga_suite::api::Api;

use crate::{own, with_token};

/// Whether some sample line of `metric` carries every `label="value"` pair given.
fn has_sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> bool {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .any(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
}

#[tokio::test]
async fn metrics_expose_the_saga_and_http_series() {
    // A server of its own: a token, to count refusals.
    let api = own(with_token()).await;
    assert_eq!(api.run_saga("s").await["status"], "COMPLETED");
    assert_eq!(api.run_saga("fails").await["status"], "COMPENSATED");
    assert_eq!(api.run_saga("flaky").await["status"], "COMPLETED");
    let a = Api::send(api.anonymous(Method::GET, "/v1/sagas")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);

    let a = Api::send(api.req(Method::GET, "/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.header("content-type").unwrap().starts_with("text/plain"));
    let text = a.body.as_str().unwrap().to_owned();
    let expect: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("saga_started_total", vec![("name", "s")]),
        (
            "saga_ended_total",
            vec![("name", "s"), ("status", "COMPLETED")],
        ),
        (
            "saga_ended_total",
            vec![("name", "fails"), ("status", "COMPENSATED")],
        ),
        (
            "saga_step_duration_seconds_bucket",
            vec![
                ("name", "s"),
                ("step", "a"),
                ("phase", "action"),
                ("outcome", "succeeded"),
            ],
        ),
        (
            "saga_step_duration_seconds_count",
            vec![("name", "fails"), ("step", "b"), ("outcome", "failed")],
        ),
        (
            "saga_step_retries_total",
            vec![("name", "flaky"), ("step", "a"), ("phase", "action")],
        ),
        (
            "saga_compensations_total",
            vec![("name", "fails"), ("step", "a")],
        ),
        ("saga_needs_attention", vec![]),
        (
            "saga_duration_seconds_count",
            vec![("name", "fails"), ("status", "COMPENSATED")],
        ),
        ("sagas_by_status", vec![("status", "COMPLETED")]),
        ("sagas_by_status", vec![("status", "FAILED")]),
        (
            "saga_build_info",
            vec![("version", env!("CARGO_PKG_VERSION"))],
        ),
        (
            "http_request_duration_seconds_bucket",
            vec![
                ("method", "POST"),
                ("route", "/v1/sagas/{saga}"),
                ("status", "200"),
            ],
        ),
        (
            "http_requests_total",
            vec![
                ("method", "POST"),
                ("route", "/v1/sagas/{saga}"),
                ("status", "200"),
            ],
        ),
        (
            "http_requests_total",
            vec![("method", "GET"), ("route", "/v1/sagas"), ("status", "401")],
        ),
    ];
    for (metric, labels) in expect {
        assert!(
            has_sample(&text, metric, &labels),
            "no {metric} sample with {labels:?} in:\n{text}"
        );
    }
    // Raw paths never become labels (a label per saga id would explode the series count).
    assert!(!text.contains("route=\"/v1/sagas/0"), "{text}");
    // Every series says what it is.
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| text.contains(&format!("# TYPE {f} histogram")))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} has no HELP line:\n{text}"
        );
    }
}

/// The value of the sample of `metric` with exactly the label `kind="<kind>"`.
fn waiting_sample(text: &str, kind: &str) -> Option<f64> {
    let prefix = format!("saga_waiting{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

async fn scrape(api: &Api) -> String {
    let a = Api::send(api.req(Method::GET, "/metrics")).await;
    assert_eq!(a.status, StatusCode::OK);
    a.body.as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_waiting_gauge_counts_sagas_by_what_they_wait_for() {
    let api = own(with_token()).await;
    let text = scrape(&api).await;
    for kind in ["sleep", "signal", "child", "scheduled"] {
        assert_eq!(waiting_sample(&text, kind), Some(0.0), "{kind} in:\n{text}");
    }
    assert!(text.contains("# HELP saga_waiting "), "{text}");

    let id = api.start_saga("approval", serde_json::json!({})).await;
    api.wait(&id, |s| s["steps"][1]["status"] == "WAITING")
        .await;
    let in_an_hour = chrono::Utc::now() + chrono::Duration::hours(1);
    let later = api
        .start_raw("s", "{}", &[("saga-start-at", &in_an_hour.to_rfc3339())])
        .await;
    assert_eq!(later.status, StatusCode::ACCEPTED, "{}", later.json());

    let text = scrape(&api).await;
    assert_eq!(waiting_sample(&text, "signal"), Some(1.0), "{text}");
    assert_eq!(waiting_sample(&text, "scheduled"), Some(1.0), "{text}");
    assert_eq!(waiting_sample(&text, "sleep"), Some(0.0), "{text}");
    assert_eq!(waiting_sample(&text, "child"), Some(0.0), "{text}");
}
