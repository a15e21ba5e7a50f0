//! What the web console reads besides the sagas: its own files at `/ui/` (served from the
//! binary without a token, revalidated by `ETag`, under a content security policy that lets
//! them load nothing from elsewhere), `GET /v1/counts` and `GET /v1/whoami`, and the list
//! filters its form sends. Its behaviour in a browser is tested in `tests/browser`.

use orchestrator::http::tokens::{ApiToken, Scope};
use orchestrator::http::HttpConfig;
use reqwest::{Method, StatusCode};
use saga_suite::api::Api;
use serde_json::{json, Value};

use crate::{own, with_token, TOKEN};

const READER: &str = "console-reader-token";
const STARTER: &str = "console-starter-token";

#[tokio::test]
async fn the_console_is_served_from_the_binary_without_a_token() {
    let api = own(with_token()).await;
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let moved = no_redirects.get(api.url("/ui")).send().await.unwrap();
    assert_eq!(moved.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(moved.headers()["location"], "/ui/");
    // The server's bare address leads to the console too, not to a JSON 404.
    let root = no_redirects.get(api.url("/")).send().await.unwrap();
    assert_eq!(root.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(root.headers()["location"], "/ui/");
    // The server's bare address leads to the console too, not to a JSON 404.
    let root = no_redirects.get(api.url("/")).send().await.unwrap();
    assert_eq!(root.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(root.headers()["location"], "/ui/");

    let page = Api::send(api.anonymous(Method::GET, "/ui/")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(page.text.contains("console.js"));
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));

    for (path, kind) in [
        ("/ui/console.js", "text/javascript"),
        ("/ui/console.css", "text/css"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        let file = Api::send(api.anonymous(Method::GET, path)).await;
        assert_eq!(file.status, StatusCode::OK, "{path}");
        assert!(
            file.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        let etag = file.header("etag").unwrap().to_owned();
        let again = Api::send(
            api.anonymous(Method::GET, path)
                .header("if-none-match", &etag),
        )
        .await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{path}");
        assert!(again.text.is_empty());
    }
    // Every module the script imports, however deep, is served as a script.
    let mut modules = vec!["console.js".to_owned()];
    let mut served = std::collections::BTreeSet::new();
    while let Some(name) = modules.pop() {
        if !served.insert(name.clone()) {
            continue;
        }
        let file = Api::send(api.anonymous(Method::GET, &format!("/ui/{name}"))).await;
        assert_eq!(
            file.status,
            StatusCode::OK,
            "{name}, imported but not served"
        );
        assert!(file
            .header("content-type")
            .unwrap()
            .starts_with("text/javascript"));
        for (_, rest) in file
            .text
            .match_indices("from './")
            .map(|(i, _)| file.text.split_at(i + 8))
        {
            let imported = &rest[..rest.find('\'').unwrap()];
            modules.push(imported.to_owned());
        }
    }
    assert!(served.len() > 1, "the modules of console.js: {served:?}");
    let missing = Api::send(api.anonymous(Method::GET, "/ui/nothing.js")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["code"], "not_found");
    // The API behind it still wants the token.
    let list = Api::send(api.anonymous(Method::GET, "/v1/sagas")).await;
    assert_eq!(list.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn whoami_names_the_token_and_its_scopes() {
    let api = own(HttpConfig {
        api_token: Some(TOKEN.to_owned()),
        api_tokens: vec![
            ApiToken::new("viewer", &[Scope::Read], READER),
            ApiToken::new("starter", &[Scope::Start], STARTER),
        ],
        ..HttpConfig::default()
    })
    .await;
    let me = Api::send(api.req(Method::GET, "/v1/whoami")).await;
    assert_eq!(
        me.body,
        json!({"name": "token", "scopes": ["admin"], "auth_required": true})
    );
    let viewer = Api::send(api.anonymous(Method::GET, "/v1/whoami").bearer_auth(READER)).await;
    assert_eq!(
        viewer.body,
        json!({"name": "viewer", "scopes": ["read"], "auth_required": true})
    );
    let nobody = Api::send(api.anonymous(Method::GET, "/v1/whoami")).await;
    assert_eq!(nobody.status, StatusCode::UNAUTHORIZED);
    // A token that may not read may still ask what it may do.
    let starter = Api::send(
        api.anonymous(Method::GET, "/v1/whoami")
            .bearer_auth(STARTER),
    )
    .await;
    assert_eq!(
        starter.body,
        json!({"name": "starter", "scopes": ["start"], "auth_required": true})
    );

    let open = own(HttpConfig::default()).await;
    let anyone = Api::send(open.anonymous(Method::GET, "/v1/whoami")).await;
    assert_eq!(
        anyone.body,
        json!({"name": "anonymous", "scopes": ["admin"], "auth_required": false})
    );
}

#[tokio::test]
async fn counts_give_every_status_and_the_flagged_sagas() {
    let api = own(HttpConfig::default()).await;
    let done = api.start_saga("s", json!({})).await;
    let undone = api.start_saga("fails", json!({})).await;
    api.wait_status(&done, "COMPLETED").await;
    api.wait_status(&undone, "COMPENSATED").await;
    let (status, counts) = api.get("/v1/counts").await;
    assert_eq!(status, StatusCode::OK, "{counts}");
    let by_status = counts["by_status"].as_object().unwrap();
    assert_eq!(by_status.len(), 8, "every status: {counts}");
    assert_eq!(counts["by_status"]["PAUSED"], 0);
    assert_eq!(counts["by_status"]["COMPLETED"], 1);
    assert_eq!(counts["by_status"]["COMPENSATED"], 1);
    assert_eq!(counts["by_status"]["RUNNING"], 0);
    assert_eq!(counts["needs_attention"], 0);
    assert_eq!(counts["blocked"], 0);
    assert!(counts["counted_at"].as_str().unwrap().ends_with('Z'));
}

/// The ids of a page of `GET /v1/sagas` with `query`.
async fn listed(api: &Api, query: &str) -> Vec<String> {
    let (status, page) = api.get(&format!("/v1/sagas?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{query}: {page}");
    page["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_list_filters_by_creation_time_and_id_prefix() {
    let api = own(HttpConfig::default()).await;
    let first = api.start_saga("s", json!({})).await;
    let (_, saga) = api.get(&format!("/v1/sagas/{first}")).await;
    let created: String = saga["created_at"].as_str().unwrap().to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let second = api.start_saga("s", json!({})).await;
    let (_, later) = api.get(&format!("/v1/sagas/{second}")).await;
    let second_created = later["created_at"].as_str().unwrap().to_owned();

    assert_eq!(
        listed(&api, &format!("created_before={second_created}")).await,
        [first.as_str()]
    );
    assert_eq!(
        listed(&api, &format!("created_after={second_created}")).await,
        [second.as_str()]
    );
    assert_eq!(
        listed(&api, &format!("created_after={created}")).await,
        [second.as_str(), first.as_str()]
    );
    assert_eq!(
        listed(&api, &format!("id_prefix={}", &second[..13])).await,
        [second.as_str()]
    );
    assert!(listed(&api, "blocked=true").await.is_empty());

    for (query, names) in [
        ("created_after=yesterday", "created_after"),
        ("id_prefix=abc", "id_prefix"),
        ("blocked=maybe", "blocked"),
    ] {
        let (status, body): (StatusCode, Value) = api.get(&format!("/v1/sagas?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(names),
            "{query}: {body}"
        );
    }
}
