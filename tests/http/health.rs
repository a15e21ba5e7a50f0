//! `GET /healthz`, and the request id every answer carries.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::shared;

#[tokio::test]
async fn healthz_and_request_ids() {
    let api = shared();
    let (status, headers, body) = api.request(Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ok"}));
    let generated = headers["x-request-id"].to_str().unwrap();
    assert_eq!(generated.len(), 36, "{generated}");

    // A sane request id from a proxy is kept; another is replaced.
    let resp = api
        .http
        .get(api.url("/healthz"))
        .header("x-request-id", "lb-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-request-id"], "lb-1234");
    let resp = api
        .http
        .get(api.url("/healthz"))
        .header("x-request-id", "evil id <script>")
        .send()
        .await
        .unwrap();
    assert_ne!(resp.headers()["x-request-id"], "evil id <script>");
}
