//! The sagas resource: a start (`202` with `Location`), the saga as it runs and ends, its events,
//! the list with its filters and cursor, and a cancel accepted or refused, with the errors of
//! those routes.

use orchestrator::http::HttpConfig;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::{assert_error, own, shared};

#[tokio::test]
async fn start_answers_202_with_location_and_the_saga_completes() {
    let api = shared();
    let (status, headers, body) = api.post("/v1/sagas/s", &json!({"x": 1})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["name"], "s");
    // A free worker took it at once.
    assert_eq!(body["status"], "RUNNING");
    let id = body["id"].as_str().unwrap();
    let location = headers["location"].to_str().unwrap();
    assert_eq!(location, format!("/v1/sagas/{id}"));
    assert!(headers.contains_key("x-request-id"));

    let done = api.wait(id, |s| s["status"] == "COMPLETED").await;
    assert_eq!(done["id"], id);
    assert_eq!(done["version"], 1);
    assert_eq!(done["input"], json!({"x": 1}));
    assert_eq!(done["needs_attention"], false);
    assert_eq!(done["blocked"], false);
    assert!(done["created_at"].as_str().unwrap().ends_with('Z'));
    let steps = done["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3);
    assert!(steps
        .iter()
        .all(|s| s["status"] == "SUCCEEDED" && s["attempts"] == 1));
    assert_eq!(steps[2]["kind"], "pivot");
    assert_eq!(steps[2]["compensation"]["status"], "NOT_NEEDED");
    // The Location header is the URL to poll.
    let (status, by_location) = api.get(location).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(by_location, done);

    // A body without any content type is accepted as JSON.
    let (status, _, body) = api
        .request(Method::POST, "/v1/sagas/s", Some(("", b"{}".to_vec())))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

#[tokio::test]
async fn compensated_saga_shows_each_steps_compensation_and_its_events() {
    let api = shared();
    let id = api.start_saga("fails", json!({})).await;
    let saga = api.wait_status(&id, "COMPENSATED").await;
    assert!(saga["error"]
        .as_str()
        .unwrap()
        .contains("scripted permanent failure"));
    let steps = &saga["steps"];
    assert_eq!(steps[0]["status"], "SUCCEEDED");
    assert_eq!(steps[0]["compensation"]["status"], "SUCCEEDED");
    assert_eq!(steps[0]["compensation"]["attempts"], 1);
    assert_eq!(steps[1]["status"], "FAILED");
    assert_eq!(steps[1]["last_error"], "scripted permanent failure");
    // The failed step's action never took effect: its compensation will never run.
    assert_eq!(steps[1]["compensation"]["status"], "NOT_NEEDED");
    assert_eq!(steps[2]["status"], "PENDING");

    let (status, body) = api.get(&format!("/v1/sagas/{id}/events")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = body["events"].as_array().unwrap();
    assert_eq!(events[0]["type"], "saga.started");
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events.last().unwrap()["type"], "saga.compensated");
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(events
        .iter()
        .any(|e| e["type"] == "step.compensated" && e["step"] == "a"));
    assert!(events
        .iter()
        .any(|e| e["type"] == "step.failed" && e["step"] == "b"));

    // Events of an unknown saga are 404, not an empty list.
    let (status, body) = api
        .get("/v1/sagas/0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60/events")
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn list_filters_by_status_and_name_and_pages_with_a_cursor() {
    // A server of its own: the test lists every saga of the database.
    let api = own(HttpConfig::default()).await;
    let mut completed = Vec::new();
    for i in 0..3 {
        completed.push(api.start_saga("s", json!({"i": i})).await);
    }
    let failed = api.start_saga("fails", json!({})).await;
    for id in &completed {
        api.wait_status(id, "COMPLETED").await;
    }
    api.wait_status(&failed, "COMPENSATED").await;

    let (status, page) = api.get("/v1/sagas?status=COMPLETED&limit=2").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let ids: Vec<&str> = page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    // Newest first (ids are UUIDv7, so they sort by creation time).
    assert_eq!(ids, [completed[2].as_str(), completed[1].as_str()]);
    assert!(page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["status"] == "COMPLETED"));
    let cursor = page["next_cursor"].as_str().unwrap();
    let (status, page2) = api
        .get(&format!(
            "/v1/sagas?status=COMPLETED&limit=2&cursor={cursor}"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{page2}");
    assert_eq!(page2["sagas"].as_array().unwrap().len(), 1);
    assert_eq!(page2["sagas"][0]["id"], completed[0].as_str());
    assert_eq!(page2["next_cursor"], Value::Null);

    let (_, all) = api.get("/v1/sagas").await;
    assert_eq!(all["sagas"].as_array().unwrap().len(), 4);
    assert_eq!(all["next_cursor"], Value::Null);
    // Lower case is accepted; the wire form stays upper case.
    let (_, compensated) = api.get("/v1/sagas?status=compensated").await;
    assert_eq!(compensated["sagas"].as_array().unwrap().len(), 1);
    assert_eq!(compensated["sagas"][0]["status"], "COMPENSATED");
    let (_, by_name) = api.get("/v1/sagas?name=fails&status=").await;
    assert_eq!(by_name["sagas"][0]["id"], failed.as_str());
    assert_eq!(by_name["sagas"].as_array().unwrap().len(), 1);

    let (status, body) = api.get("/v1/sagas?status=DONE").await;
    let message = assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        message.contains("COMPENSATING") && message.contains("QUEUED"),
        "{message}"
    );
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=-3",
        "limit=ten",
        "cursor=not-a-uuid",
        "needs_attention=maybe",
        "colour=blue",
        "limit=1&limit=2",
    ] {
        let (status, body) = api.get(&format!("/v1/sagas?{bad}")).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, page) = api.get("/v1/sagas?limit=1000").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    api.stop().await;
}

#[tokio::test]
async fn cancel_is_accepted_while_running_and_refused_when_too_late() {
    let api = shared();

    // Cancel while the first (compensatable) step runs: it finishes, then compensates.
    let id = api.start_saga("slow", json!({})).await;
    api.wait(&id, |s| s["steps"][0]["status"] == "RUNNING")
        .await;
    let (status, _, body) = api
        .request(Method::POST, &format!("/v1/sagas/{id}/cancel"), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["id"], id.as_str());
    assert_eq!(body["cancel"], "accepted");
    let saga = api.wait_status(&id, "COMPENSATED").await;
    assert_eq!(saga["steps"][0]["compensation"]["status"], "SUCCEEDED");
    assert_eq!(saga["steps"][1]["status"], "PENDING");

    // Terminal: 409.
    let (status, _, body) = api
        .request(Method::POST, &format!("/v1/sagas/{id}/cancel"), None)
        .await;
    let message = assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(message.contains("COMPENSATED"), "{message}");

    let done = api.start_saga("s", json!({})).await;
    api.wait_status(&done, "COMPLETED").await;
    let (status, _, body) = api
        .request(Method::POST, &format!("/v1/sagas/{done}/cancel"), None)
        .await;
    let message = assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(message.contains("COMPLETED"), "{message}");

    // Past the pivot: 409 with a clear reason, and the saga runs on to completion.
    // The pivot has started (a cancel is refused) but not succeeded (`pivot_reached` says so).
    let pivot = api.start_saga("slow_pivot", json!({})).await;
    let running = api
        .wait(&pivot, |s| s["steps"][0]["status"] == "RUNNING")
        .await;
    assert_eq!(running["pivot_reached"], false, "{running}");
    let (status, _, body) = api
        .request(Method::POST, &format!("/v1/sagas/{pivot}/cancel"), None)
        .await;
    let message = assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(message.contains("point of no return"), "{message}");
    let done = api.wait_status(&pivot, "COMPLETED").await;
    assert_eq!(done["pivot_reached"], true, "{done}");

    // Unknown and malformed ids.
    let (status, _, body) = api
        .request(
            Method::POST,
            "/v1/sagas/0190f5b4-7a3c-7cc1-9f5e-2b8d3c4e5f60/cancel",
            None,
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, _, body) = api
        .request(Method::POST, "/v1/sagas/nope/cancel", None)
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
}

#[tokio::test]
async fn a_scheduled_start_waits_queued_and_a_past_or_malformed_instant_is_refused() {
    let api = own(HttpConfig::default()).await;
    let in_an_hour = chrono::Utc::now() + chrono::Duration::hours(1);
    let at = in_an_hour.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let a = api.start_raw("s", "{}", &[("saga-start-at", &at)]).await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.json());
    let id = a.json()["id"].as_str().unwrap().to_owned();
    let (status, saga) = api.get(&format!("/v1/sagas/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(saga["status"], "QUEUED", "{saga:#}");
    assert_eq!(saga["scheduled_at"], at.as_str(), "{saga:#}");
    assert_eq!(
        saga["lease_owner"],
        Value::Null,
        "nobody holds it until its time"
    );

    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let past = api
        .start_raw("s", "{}", &[("saga-start-at", &an_hour_ago)])
        .await;
    let message = assert_error(
        past.status,
        &past.json(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "start_in_past",
    );
    assert!(message.contains("Saga-Start-At"), "{message}");
    for bad in ["tomorrow", "2026-13-01T00:00:00Z", "1767225600"] {
        let a = api.start_raw("s", "{}", &[("saga-start-at", bad)]).await;
        let message = assert_error(a.status, &a.json(), StatusCode::BAD_REQUEST, "bad_request");
        assert!(message.contains("RFC 3339"), "{bad}: {message}");
    }
    assert_eq!(
        api.saga_count().await,
        1,
        "only the scheduled start made a saga"
    );
}
