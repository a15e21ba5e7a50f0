//! The harness of the HTTP tests: an engine over a fresh database ([`Harness`]), its HTTP API
//! on a loopback port with a client for it ([`Api`], whose answers are [`Answer`]s), and a
//! server shared by all the tests of a binary ([`SharedServer`]).

use std::sync::Arc;
use std::time::Duration;

use orchestrator::http::{router_with_shutdown, serve, HttpConfig};
use orchestrator::model::ListFilter;
use orchestrator::store::Stores;
use orchestrator::{Saga, Store};
use reqwest::header::HeaderMap;
use reqwest::{Method, RequestBuilder, StatusCode};
use saga_dsl::Registry;
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{test_config, RunningEngine, TempDb};

/// An engine over a fresh database, with a free worker; [`Harness::serve`] puts HTTP APIs on it.
pub struct Harness {
    /// The database; its directory is free for the test's own files too.
    pub db: TempDb,
    /// The database's stores, as `serve` opens them.
    pub stores: Stores,
    /// The engine, running in a task of the runtime that made the harness.
    pub engine: RunningEngine,
}

impl Harness {
    /// An engine running `registry` over a fresh database (`TempDb::new()`: the backend
    /// `SAGA_TEST_BACKEND` selects), once it has a free worker, so a start is taken up at once.
    pub async fn new(registry: Registry) -> Self {
        Self::on(TempDb::new(), registry).await
    }

    /// [`Harness::new`] over `db`, for a registry whose participants keep data in `db.dir`.
    pub async fn on(db: TempDb, registry: Registry) -> Self {
        let stores = db.stores().await;
        let engine = RunningEngine::start(stores.log.clone(), registry, test_config());
        engine.ready().await;
        Self { db, stores, engine }
    }

    /// The HTTP API over this engine on a free loopback port, in a task of the current runtime.
    /// Several APIs (with different configurations) may share one harness.
    pub async fn serve(&self, config: HttpConfig) -> Api {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        // An empty token turns authentication off: then there is nothing to send.
        let token = config.api_token.clone().filter(|t| !t.is_empty());
        let router = router_with_shutdown(self.engine.engine.clone(), config, shutdown.clone());
        let task = tokio::spawn(serve(listener, router, shutdown.clone()));
        Api {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            token,
            log: self.stores.log.clone(),
            runtime: Handle::current(),
            server: Some(ServerTask { shutdown, task }),
            harness: None,
        }
    }

    /// [`Harness::serve`], the API owning the harness: [`Api::stop`] stops the engine too, and
    /// dropping the API drops the database.
    pub async fn into_api(self, config: HttpConfig) -> Api {
        let mut api = self.serve(config).await;
        api.harness = Some(self);
        api
    }

    /// How many sagas of the definition `name` the database holds.
    pub async fn count(&self, name: &str) -> usize {
        count(
            &self.stores.log,
            ListFilter {
                name: Some(name.to_owned()),
                limit: 1000,
                ..ListFilter::default()
            },
        )
        .await
    }

    /// Stops the engine and waits for it (it lets the steps in flight finish).
    pub async fn stop(self) {
        self.engine.stop().await;
    }
}

async fn count(store: &Arc<dyn Store>, filter: ListFilter) -> usize {
    store.list_sagas(&filter).await.unwrap().sagas.len()
}

/// The HTTP server task behind an [`Api`] a test started, and what stops it.
struct ServerTask {
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

/// A client of one HTTP API server: of a [`Harness`] ([`Harness::serve`]), or of the
/// [`SharedServer`] of the test binary ([`SharedServer::api`]).
pub struct Api {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The client every request goes through; each test has its own, since a pooled connection
    /// belongs to the runtime that opened it and that runtime ends with its test.
    pub http: reqwest::Client,
    /// The bearer token [`Api::req`] sends: the server's own, if it has one.
    pub token: Option<String>,
    log: Arc<dyn Store>,
    /// The runtime the store's connections belong to: store reads are run there.
    runtime: Handle,
    /// `None` for the shared server, which no test stops.
    server: Option<ServerTask>,
    harness: Option<Harness>,
}

/// An answer of the API.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body as text (invalid UTF-8 replaced).
    pub text: String,
    /// The body as JSON: `Null` when empty, the text as a JSON string when it is not JSON.
    pub body: Value,
    /// Whether the body is JSON (or empty).
    is_json: bool,
}

impl Answer {
    /// A header's value, when present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON; panics when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("{}: body is not JSON ({e}): {:?}", self.status, self.text))
    }

    /// Whether this is a saved answer replayed for a known `Idempotency-Key`.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

impl Api {
    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request carrying the server's token, if it has one.
    pub fn req(&self, method: Method, path: &str) -> RequestBuilder {
        let req = self.http.request(method, self.url(path));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// A request without credentials.
    pub fn anonymous(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, self.url(path))
    }

    /// Sends `req` and reads the whole answer.
    pub async fn send(req: RequestBuilder) -> Answer {
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (body, is_json) = if bytes.is_empty() {
            (Value::Null, true)
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(v) => (v, true),
                Err(_) => (Value::String(text.clone()), false),
            }
        };
        Answer {
            status,
            headers,
            text,
            body,
            is_json,
        }
    }

    /// Sends `method path` with the server's token and, when given, a body with its content
    /// type (none when empty); returns the status, the headers and the body, which must be JSON
    /// (or empty: `Null`).
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> (StatusCode, HeaderMap, Value) {
        let mut req = self.req(method, path);
        if let Some((content_type, bytes)) = body {
            if !content_type.is_empty() {
                req = req.header("content-type", content_type);
            }
            req = req.body(bytes);
        }
        let a = Self::send(req).await;
        assert!(a.is_json, "{}: body is not JSON: {:?}", a.status, a.text);
        (a.status, a.headers, a.body)
    }

    /// `GET path`: the status and the JSON body.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (s, _, v) = self.request(Method::GET, path, None).await;
        (s, v)
    }

    /// `POST path` with `body` as JSON: the status, the headers and the JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, HeaderMap, Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        self.request(Method::POST, path, Some(("application/json", bytes)))
            .await
    }

    /// `POST /v1/sagas/{name}` with `body` sent as given (so the caller chooses key order and
    /// spacing) and the extra `headers`.
    pub async fn start_raw(&self, name: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = self
            .req(Method::POST, &format!("/v1/sagas/{name}"))
            .header("content-type", "application/json")
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Self::send(req).await
    }

    /// Starts a saga, checks the `202` and its `Location`, and returns the saga's id.
    pub async fn start_saga(&self, name: &str, input: Value) -> String {
        let (status, headers, body) = self.post(&format!("/v1/sagas/{name}"), &input).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let id = body["id"].as_str().unwrap().to_owned();
        assert_eq!(
            headers["location"].to_str().unwrap(),
            format!("/v1/sagas/{id}")
        );
        id
    }

    /// Starts a saga with an empty input and waits (server side, `Prefer: wait=20`) for it to
    /// end: the final saga.
    pub async fn run_saga(&self, name: &str) -> Value {
        let a = Self::send(
            self.req(Method::POST, &format!("/v1/sagas/{name}"))
                .header("prefer", "wait=20")
                .json(&serde_json::json!({})),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        a.body
    }

    /// Polls `GET /v1/sagas/{id}` until `until` holds; panics after 20 s.
    pub async fn wait(&self, id: &str, until: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (status, saga) = self.get(&format!("/v1/sagas/{id}")).await;
            assert_eq!(status, StatusCode::OK, "{saga}");
            if until(&saga) {
                return saga;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "saga {id} did not settle: {saga:#}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the saga until its status is `status`.
    pub async fn wait_status(&self, id: &str, status: &str) -> Value {
        self.wait(id, |s| s["status"] == status).await
    }

    /// How many sagas the server's database holds, of every definition.
    pub async fn saga_count(&self) -> usize {
        let log = self.log.clone();
        let filter = ListFilter {
            limit: 1000,
            ..ListFilter::default()
        };
        self.runtime
            .spawn(async move { count(&log, filter).await })
            .await
            .unwrap()
    }

    /// The saga `id` as the store has it.
    pub async fn stored_saga(&self, id: Uuid) -> Saga {
        let log = self.log.clone();
        self.runtime
            .spawn(async move { log.get_saga(id).await.unwrap() })
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no saga {id}"))
    }

    /// Begins the server's graceful shutdown (waits in progress end at once).
    pub fn shut_down(&self) {
        self.server_task().shutdown.cancel();
    }

    /// Shuts the server down and waits for it to end, which it must do without an error.
    pub async fn stop_server(&mut self) {
        let server = self
            .server
            .take()
            .expect("the shared server is never stopped");
        server.shutdown.cancel();
        server.task.await.unwrap().unwrap();
    }

    /// [`Api::stop_server`], then the engine if the API owns its harness.
    pub async fn stop(mut self) {
        self.stop_server().await;
        if let Some(harness) = self.harness.take() {
            harness.stop().await;
        }
    }

    fn server_task(&self) -> &ServerTask {
        self.server
            .as_ref()
            .expect("the shared server is never stopped")
    }
}

/// An engine and its HTTP API that live as long as the test process, on a runtime of their own
/// thread: each `#[tokio::test]` has its own runtime, which ends with the test together with
/// everything spawned on it. Tests reach it through [`SharedServer::api`]; kept in a `static`,
/// it is never dropped, so its database is removed by [`TempDb::remove_after_exit`].
pub struct SharedServer {
    base: String,
    token: Option<String>,
    log: Arc<dyn Store>,
    runtime: Handle,
}

impl SharedServer {
    /// Starts an engine running `registry()` over a fresh database (`TempDb::new()`) and its
    /// HTTP API configured by `config`, and waits until both are ready.
    pub fn start(registry: impl FnOnce() -> Registry + Send + 'static, config: HttpConfig) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("shared-server".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let harness = Harness::new(registry()).await;
                    harness.db.remove_after_exit();
                    let api = harness.serve(config).await;
                    let _ = tx.send(SharedServer {
                        base: api.base.clone(),
                        token: api.token.clone(),
                        log: harness.stores.log.clone(),
                        runtime: Handle::current(),
                    });
                    // Keeps the harness and the server task alive for good.
                    let _kept = (harness, api);
                    std::future::pending::<()>().await;
                })
            })
            .unwrap();
        rx.recv().expect("the shared server did not start")
    }

    /// A client of the shared server, with an HTTP client of its own (see [`Api::http`]).
    pub fn api(&self) -> Api {
        Api {
            base: self.base.clone(),
            http: reqwest::Client::new(),
            token: self.token.clone(),
            log: self.log.clone(),
            runtime: self.runtime.clone(),
            server: None,
            harness: None,
        }
    }
}
