//! The transactional outbox relay and its webhooks against a real receiver on loopback (a tiny
//! axum server in this file), on the backend `SAGA_TEST_BACKEND` selects: signatures verify with
//! `verify_signature`, every event arrives in order per saga and target, a receiver that is down
//! gets retries until it answers, a relay killed between sending and recording sends again with
//! the same event id, and the delivery state is visible over the API. Callback URLs that point
//! inside the network are refused at start and again at delivery, and nothing reaches them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use orchestrator::http::{router_with_shutdown, serve, HttpConfig};
use orchestrator::store::{DeliveryState, Stores};
use orchestrator::webhooks::{verify_signature, CallbackPolicy, Relay, WebhookConfig, RELAY_NAME};
use saga_dsl::StepKind::{Compensatable, Pivot};
use saga_suite::{
    registry_of, scripted_saga, test_config, wait_terminal, Journal, RunningEngine,
    ScriptedStep as S, Server, TempDb,
};
use serde_json::{json, Value};
use tokio_rustls::rustls::pki_types as rustls_pki;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const SECRET: &str = "whsec_global";
const CALLBACK_SECRET: &str = "whsec_callback";
const LONG: Duration = Duration::from_secs(60);

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hit {
    path: String,
    event_id: i64,
    signature: Option<String>,
    body: Bytes,
    /// What the receiver answered.
    status: u16,
}

impl Hit {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A webhook receiver: records every request, answers `503` to the first `fail_first` ones.
#[derive(Default)]
struct Receiver {
    hits: Mutex<Vec<Hit>>,
    fail_first: AtomicUsize,
}

impl Receiver {
    /// A receiver over plain http on loopback, and its base URL.
    async fn start(fail_first: usize) -> (Arc<Self>, String) {
        let (receiver, app) = Self::app(fail_first);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, base)
    }

    /// A receiver over https on loopback with the certificate `chain` for `localhost`, and
    /// its base URL.
    async fn start_tls(
        chain: Vec<rustls_pki::CertificateDer<'static>>,
        key: rustls_pki::PrivateKeyDer<'static>,
    ) -> (Arc<Self>, String) {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let (receiver, app) = Self::app(0);
        let tls = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        );
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing to serve.
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (receiver, base)
    }

    fn app(fail_first: usize) -> (Arc<Self>, axum::Router) {
        let receiver = Arc::new(Self {
            hits: Mutex::new(Vec::new()),
            fail_first: AtomicUsize::new(fail_first),
        });
        async fn hook(
            State(r): State<Arc<Receiver>>,
            uri: axum::http::Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> StatusCode {
            let failing = r
                .fail_first
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            let status = if failing {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::NO_CONTENT
            };
            let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            r.hits.lock().unwrap().push(Hit {
                path: uri.path().to_owned(),
                event_id: header("saga-event-id").unwrap().parse().unwrap(),
                signature: header("saga-signature").map(str::to_owned),
                body,
                status: status.as_u16(),
            });
            status
        }
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::post(hook))
            .with_state(receiver.clone());
        (receiver, app)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// The event types acknowledged (2xx) on `path` for `saga`, in arrival order.
    fn delivered(&self, path: &str, saga: Uuid) -> Vec<(i64, String)> {
        self.hits()
            .iter()
            .filter(|h| h.path == path && h.status < 300)
            .map(|h| (h.event_id, h.json()))
            .filter(|(_, b)| b["saga_id"] == saga.to_string())
            .map(|(id, b)| (id, b["type"].as_str().unwrap().to_owned()))
            .collect()
    }

    /// Waits until `path` has acknowledged a terminal event of `saga`.
    async fn wait_for_end(&self, path: &str, saga: Uuid) -> Vec<(i64, String)> {
        let deadline = tokio::time::Instant::now() + LONG;
        loop {
            let got = self.delivered(path, saga);
            if got.iter().any(|(_, t)| t == "saga.completed") {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} never got the end of saga {saga}: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Every request to `path` verifies with `secret`, carries its event id in the body too, and
/// the acknowledged events are in increasing id order with no event sent before its
/// predecessor was acknowledged.
fn check_deliveries(receiver: &Receiver, path: &str, secret: &str) {
    let hits: Vec<Hit> = receiver
        .hits()
        .into_iter()
        .filter(|h| h.path == path)
        .collect();
    assert!(!hits.is_empty(), "nothing arrived on {path}");
    let mut acknowledged: BTreeMap<String, i64> = BTreeMap::new();
    for hit in &hits {
        let header = hit.signature.as_deref().expect("signed");
        verify_signature(secret, header, &hit.body, Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("signature of event {}: {e}", hit.event_id));
        assert!(verify_signature("wrong", header, &hit.body, Duration::from_secs(300)).is_err());
        let body = hit.json();
        assert_eq!(body["id"], hit.event_id);
        for field in ["type", "saga_id", "saga_name", "at", "data"] {
            assert!(body.get(field).is_some(), "{field} missing: {body}");
        }
        let saga = body["saga_id"].as_str().unwrap().to_owned();
        let last = acknowledged.get(&saga).copied().unwrap_or(0);
        // A retry of the last acknowledged one (at least once) or the next one, never a skip
        // ahead of an unacknowledged event.
        assert!(
            hit.event_id >= last,
            "event {} sent after {last} was acknowledged",
            hit.event_id
        );
        if hit.status < 300 {
            acknowledged.insert(saga, hit.event_id);
        }
    }
}

/// An engine, the HTTP API and a relay over one temporary database.
struct Setup {
    base: String,
    stores: Stores,
    engine: RunningEngine,
    shutdown: CancellationToken,
    _db: TempDb,
}

impl Setup {
    /// With the relay's callback policy at start too.
    async fn start(webhooks: WebhookConfig) -> Self {
        let callbacks = webhooks.callbacks.clone();
        Self::start_checking(webhooks, callbacks).await
    }

    /// With `at_start` the policy the API checks callbacks with when a saga starts.
    async fn start_checking(webhooks: WebhookConfig, at_start: CallbackPolicy) -> Self {
        let db = TempDb::new();
        let stores = db.stores().await;
        let journal = Journal::default();
        let registry = registry_of([scripted_saga(
            "s",
            1,
            &[
                S::new("a", Compensatable),
                S::new("b", Compensatable),
                S::new("c", Pivot),
            ],
            &journal,
        )]);
        let engine = RunningEngine::start(stores.log.clone(), registry, test_config());
        let shutdown = CancellationToken::new();
        let relay = Relay::new(stores.outbox.clone(), webhooks).unwrap();
        tokio::spawn(relay.run(shutdown.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let http = HttpConfig {
            callbacks: at_start,
            ..HttpConfig::default()
        };
        let router = router_with_shutdown(engine.engine.clone(), http, shutdown.clone());
        tokio::spawn(serve(listener, router, shutdown.clone()));
        Self {
            base,
            stores,
            engine,
            shutdown,
            _db: db,
        }
    }

    async fn start_saga(&self, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = reqwest::Client::new()
            .post(format!("{}/v1/sagas/s", self.base))
            .json(&json!({"n": 1}));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.unwrap()
    }

    async fn deliveries(&self, id: Uuid) -> Value {
        reqwest::get(format!("{}/v1/sagas/{id}/deliveries", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The deliveries of `id` once the relay has enqueued some and none is pending any more;
    /// panics after [`LONG`].
    async fn settled_deliveries(&self, id: Uuid) -> Value {
        let deadline = tokio::time::Instant::now() + LONG;
        loop {
            let d = self.deliveries(id).await;
            let list = d["deliveries"].as_array().unwrap();
            let pending = list.iter().any(|x| x["state"] == "pending");
            if !list.is_empty() && !pending {
                return d;
            }
            assert!(tokio::time::Instant::now() < deadline, "{d:#}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.engine.stop().await;
    }
}

/// Quick retries; callbacks may reach the receivers on 127.0.0.1.
fn fast_webhooks(subscribers: Vec<String>) -> WebhookConfig {
    WebhookConfig {
        subscribers,
        secret: Some(SECRET.to_owned()),
        timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(20),
        retry_base: Duration::from_millis(100),
        callbacks: CallbackPolicy::new().allow("127.0.0.1"),
        ..WebhookConfig::default()
    }
}

fn saga_id(body: &Value) -> Uuid {
    body["id"].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callback_to_an_internal_address_is_refused_and_nothing_reaches_it() {
    let (receiver, hooks) = Receiver::start(0).await;
    let port = hooks.rsplit(':').next().unwrap().to_owned();
    let webhooks = WebhookConfig {
        callbacks: CallbackPolicy::new(),
        ..fast_webhooks(Vec::new())
    };
    let setup = Setup::start(webhooks).await;
    for url in [
        format!("http://127.0.0.1:{port}/internal-admin"),
        // A name that resolves to loopback, and other spellings of it.
        format!("http://localhost:{port}/internal-admin"),
        format!("http://[::ffff:127.0.0.1]:{port}/internal-admin"),
        format!("http://2130706433:{port}/internal-admin"),
        format!("http://0.0.0.0:{port}/internal-admin"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/hook".to_owned(),
        "http://[fd00::1]/hook".to_owned(),
    ] {
        let r = setup
            .start_saga(&[
                ("saga-callback-url", url.as_str()),
                ("idempotency-key", &url),
            ])
            .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{url}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["error"]["code"], "callback_url_not_allowed",
            "{url}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("--allow-callback-host"), "{message}");
    }
    // Nothing was created, so nothing is ever sent.
    let list: Value = reqwest::get(format!("{}/v1/sagas", setup.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sagas"], json!([]), "{list}");
    // A saga without a callback still runs; its events go nowhere.
    let r = setup.start_saga(&[]).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = saga_id(&r.json().await.unwrap());
    wait_terminal(&setup.stores.log, id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.hits().is_empty(), "{:?}", receiver.hits());
    setup.stop().await;
}

/// A private CA and a certificate it signed for `localhost`: the CA's PEM, the chain, the key.
fn test_ca() -> (
    String,
    Vec<rustls_pki::CertificateDer<'static>>,
    rustls_pki::PrivateKeyDer<'static>,
) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = rustls_pki::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    (ca.pem(), vec![leaf.der().clone()], key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_https_receiver_signed_by_a_private_ca_gets_every_event() {
    let (ca_pem, chain, key) = test_ca();
    let (receiver, hooks) = Receiver::start_tls(chain, key).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();

    // Without the CA the certificate is refused: nothing arrives, the attempt says why.
    let untrusting = WebhookConfig {
        max_attempts: 1,
        ..fast_webhooks(vec![format!("{hooks}/untrusted")])
    };
    let setup = Setup::start(untrusting).await;
    let r = setup.start_saga(&[]).await;
    let id = saga_id(&r.json().await.unwrap());
    wait_terminal(&setup.stores.log, id).await;
    let deliveries = setup.settled_deliveries(id).await;
    for d in deliveries["deliveries"].as_array().unwrap() {
        assert_eq!(d["state"], "failed", "{d}");
        let error = d["last_error"].as_str().unwrap();
        assert!(error.contains("certificate"), "{error}");
    }
    assert!(receiver.hits().is_empty());
    setup.stop().await;

    // With it (`--webhook-ca-file`), every event arrives, signed and in order. The callback
    // names loopback, so the operator allowed `localhost`.
    let trusting = WebhookConfig {
        ca_file: Some(ca_file.clone()),
        callbacks: CallbackPolicy::new().allow("localhost"),
        ..fast_webhooks(vec![format!("{hooks}/global")])
    };
    let setup = Setup::start(trusting).await;
    let callback = format!("{hooks}/callback");
    let r = setup
        .start_saga(&[("saga-callback-url", callback.as_str())])
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = saga_id(&r.json().await.unwrap());
    let on_global = receiver.wait_for_end("/global", id).await;
    let on_callback = receiver.wait_for_end("/callback", id).await;
    assert_eq!(on_global, on_callback);
    check_deliveries(&receiver, "/global", SECRET);
    setup.stop().await;

    // A CA file that holds no certificate stops the relay from starting, with the file named.
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let db = TempDb::new();
    let stores = db.stores().await;
    let config = WebhookConfig {
        ca_file: Some(empty.clone()),
        ..WebhookConfig::default()
    };
    let error = Relay::new(stores.outbox.clone(), config)
        .unwrap_err()
        .to_string();
    assert!(error.contains("empty.pem"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callback_is_checked_again_at_each_delivery() {
    // Allowed when the sagas started, no longer when their events are sent (an operator took
    // the host off the list, or its name now resolves inside): nothing is sent.
    let (receiver, hooks) = Receiver::start(0).await;
    let port = hooks.rsplit(':').next().unwrap().to_owned();
    let webhooks = WebhookConfig {
        callbacks: CallbackPolicy::new(),
        max_attempts: 2,
        ..fast_webhooks(Vec::new())
    };
    let at_start = CallbackPolicy::allowing(["127.0.0.1", "localhost"]);
    let setup = Setup::start_checking(webhooks, at_start).await;
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("http://{host}:{port}/callback");
        let r = setup
            .start_saga(&[("saga-callback-url", url.as_str())])
            .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{url}");
        let id = saga_id(&r.json().await.unwrap());
        wait_terminal(&setup.stores.log, id).await;
        let deliveries = setup.settled_deliveries(id).await;
        let list = deliveries["deliveries"].as_array().unwrap();
        assert!(!list.is_empty(), "{deliveries:#}");
        for d in list {
            assert_eq!(d["state"], "failed", "{d}");
            assert_eq!(d["last_status"], Value::Null, "{d}");
            let error = d["last_error"].as_str().unwrap();
            assert!(error.contains("internal address"), "{host}: {error}");
        }
    }
    assert!(receiver.hits().is_empty(), "{:?}", receiver.hits());
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_reach_the_callback_and_the_subscribers_signed_and_in_order() {
    let (receiver, hooks) = Receiver::start(0).await;
    let setup = Setup::start(fast_webhooks(vec![format!("{hooks}/global")])).await;
    let callback = format!("{hooks}/callback?order=1");
    let resp = setup
        .start_saga(&[
            ("saga-callback-url", callback.as_str()),
            ("saga-callback-secret", CALLBACK_SECRET),
            ("idempotency-key", "cb-1"),
        ])
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let id: Uuid = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let on_callback = receiver.wait_for_end("/callback", id).await;
    let on_global = receiver.wait_for_end("/global", id).await;
    // The whole history, in order, on both: exactly the saga's events.
    let history: Vec<(i64, String)> = setup
        .stores
        .log
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.id, e.kind))
        .collect();
    assert_eq!(on_callback, history);
    assert_eq!(on_global, history);
    assert_eq!(history.first().unwrap().1, "saga.started");
    check_deliveries(&receiver, "/callback", CALLBACK_SECRET);
    check_deliveries(&receiver, "/global", SECRET);

    // The delivery state over the API: everything delivered, once each. The receiver sees a
    // request before the relay records its answer, so wait for the last record first.
    let deliveries = setup.settled_deliveries(id).await;
    let list = deliveries["deliveries"].as_array().unwrap();
    assert_eq!(list.len(), history.len() * 2, "{deliveries:#}");
    for d in list {
        assert_eq!(d["state"], "delivered", "{d}");
        assert_eq!(d["attempts"], 1);
        assert_eq!(d["last_status"], 204);
    }
    assert!(list.iter().any(|d| d["target_kind"] == "callback"));
    assert!(list.iter().any(|d| d["target_kind"] == "subscriber"));

    // A callback that is no http(s) URL is refused up front.
    for bad in ["ftp://example.com/", "not a url", "https://"] {
        let r = setup.start_saga(&[("saga-callback-url", bad)]).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_that_is_down_gets_retries_until_it_answers() {
    // The first five requests fail: the first event is retried, the rest wait for it.
    let (receiver, hooks) = Receiver::start(5).await;
    let setup = Setup::start(fast_webhooks(vec![format!("{hooks}/down")])).await;
    let resp = setup.start_saga(&[]).await;
    let id: Uuid = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let delivered = receiver.wait_for_end("/down", id).await;
    let history = setup.stores.log.events(id).await.unwrap();
    assert_eq!(delivered.len(), history.len(), "each event delivered once");
    check_deliveries(&receiver, "/down", SECRET);
    let hits = receiver.hits();
    let first = history[0].id;
    let tries = hits.iter().filter(|h| h.event_id == first).count();
    assert_eq!(tries, 6, "five refusals, then the sixth attempt succeeded");
    // Nothing of the saga was sent before its first event got through.
    assert!(hits.iter().take(6).all(|h| h.event_id == first));

    let deliveries = setup.settled_deliveries(id).await;
    let d0 = &deliveries["deliveries"][0];
    assert_eq!(d0["event_id"], first);
    assert_eq!(d0["state"], "delivered");
    assert_eq!(d0["attempts"], 6);
    let state = setup.stores.outbox.deliveries(id).await.unwrap();
    assert!(state.iter().all(|d| d.state == DeliveryState::Delivered));
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receiver_that_never_answers_is_given_up_and_later_events_go_on() {
    let (receiver, hooks) = Receiver::start(usize::MAX).await;
    let setup = Setup::start(WebhookConfig {
        max_attempts: 2,
        retry_base: Duration::from_millis(20),
        ..fast_webhooks(vec![format!("{hooks}/dead")])
    })
    .await;
    let resp = setup.start_saga(&[]).await;
    let id: Uuid = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let d = setup.stores.outbox.deliveries(id).await.unwrap();
        let history = setup.stores.log.events(id).await.unwrap();
        let ended = history.last().is_some_and(|e| e.kind == "saga.completed");
        if ended && d.len() == history.len() && d.iter().all(|x| x.state == DeliveryState::Failed) {
            assert!(d
                .iter()
                .all(|x| x.attempts == 2 && x.last_status == Some(503)));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{d:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(receiver.delivered("/dead", id).is_empty());
    setup.stop().await;
}

/// The relay of a real `example-sagas serve` dies right after the receiver acknowledged a
/// delivery and before it was recorded: after a restart the same event is sent again, with the
/// same `Saga-Event-Id`, and the rest follows in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_between_send_and_record_sends_the_same_event_again() {
    let (receiver, hooks) = Receiver::start(0).await;
    let db = TempDb::new();
    let dir = db.dir.path().to_owned();
    let hook = format!("{hooks}/serve");
    let args = [
        "--webhook-url",
        hook.as_str(),
        "--webhook-timeout-secs",
        "1",
        "--webhook-retry-base-ms",
        "100",
    ];
    let server = Server::spawn(
        &db.url,
        &dir,
        &[
            ("SAGA_CRASH_AT", "after_webhook_send:saga.started"),
            ("SAGA_WEBHOOK_SECRET", SECRET),
        ],
        &args,
    )
    .await;
    let id = server
        .start(
            "place_order",
            json!({"order_id": "o-hook", "user": "ada", "amount": 1200, "simulate": {}}),
        )
        .await;
    let status = server.wait_exit(LONG);
    assert!(!status.success(), "the crash point aborts the process");
    let hits = receiver.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    let started = hits[0].event_id;
    assert_eq!(hits[0].json()["type"], "saga.started");
    assert_eq!(hits[0].status, 204, "the receiver had acknowledged it");

    let server = Server::spawn(&db.url, &dir, &[("SAGA_WEBHOOK_SECRET", SECRET)], &args).await;
    let delivered = receiver.wait_for_end("/serve", id).await;
    let again = receiver
        .hits()
        .iter()
        .filter(|h| h.event_id == started)
        .count();
    assert_eq!(again, 2, "the same event id, sent twice (at least once)");
    // Deduplicated by event id, the receiver saw the history in order.
    let mut ids: Vec<i64> = delivered.iter().map(|(id, _)| *id).collect();
    ids.dedup();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{delivered:?}");
    assert_eq!(delivered.first().unwrap().1, "saga.started");
    check_deliveries(&receiver, "/serve", SECRET);
    let saga = server.saga(id).await;
    assert_eq!(saga["status"], "COMPLETED");
    server.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_nothing_to_send_records_its_cursor_once_idle_not_per_batch() {
    use orchestrator::store::{Callback, NewSaga};
    let db = TempDb::new();
    let stores = db.stores().await;
    let journal = Journal::default();
    let def = scripted_saga("s", 1, &[S::new("a", Pivot)], &journal);
    let engine = RunningEngine::start(
        stores.log.clone(),
        registry_of([def.clone()]),
        test_config(),
    );
    engine.ready().await;
    for _ in 0..3 {
        let saga = engine.engine.start_saga("s", json!({})).await.unwrap();
        wait_terminal(&stores.log, saga.id).await;
    }
    let outbox = stores.outbox.clone();
    let all = outbox.outbox_after(Default::default(), 1000).await.unwrap();
    let last = all.last().unwrap().position;
    assert!(all.len() > 4, "{all:?}");
    // No subscribers, no callbacks: batches of 4 events are read past without a write.
    let relay = Relay::new(
        outbox.clone(),
        WebhookConfig {
            batch: 4,
            ..WebhookConfig::default()
        },
    )
    .unwrap();
    let mut read = 0;
    loop {
        let n = relay.relay_once().await.unwrap();
        if n == 0 {
            break;
        }
        read += n;
        assert_eq!(
            outbox.relay_cursor(RELAY_NAME).await.unwrap(),
            Default::default(),
            "nothing recorded while batches without deliveries go by"
        );
    }
    assert_eq!(read, all.len());
    // Idle: how far it read is recorded.
    assert_eq!(outbox.relay_cursor(RELAY_NAME).await.unwrap(), last);

    // A saga with a callback: its events are enqueued, and the cursor moves with them.
    let saga = stores
        .idempotency
        .create_saga_with_callback(
            NewSaga::of(&def, json!({})),
            &Callback {
                url: "http://127.0.0.1:9/hook".to_owned(),
                secret: None,
            },
            None,
        )
        .await
        .unwrap();
    engine.engine.wake();
    wait_terminal(&stores.log, saga.id).await;
    let events = stores.log.events(saga.id).await.unwrap();
    while relay.relay_once().await.unwrap() > 0 {}
    let deliveries = outbox.deliveries(saga.id).await.unwrap();
    assert_eq!(deliveries.len(), events.len(), "{deliveries:?}");
    let now_last = outbox
        .outbox_after(Default::default(), 1000)
        .await
        .unwrap()
        .last()
        .unwrap()
        .position;
    assert_eq!(outbox.relay_cursor(RELAY_NAME).await.unwrap(), now_last);
    engine.stop().await;
}

/// On PostgreSQL event ids can commit out of order, and a relay reads by (transaction, id):
/// its lag counts what it has not read in that order. An event with a smaller id that
/// committed later is still owed; one with a larger id already read is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_lag_follows_its_reading_order_when_ids_commit_out_of_order() {
    use sqlx::Connection;
    let db = TempDb::postgres();
    let stores = db.stores().await;
    let journal = Journal::default();
    let def = scripted_saga("s", 1, &[S::new("a", Pivot)], &journal);
    let engine = RunningEngine::start(stores.log.clone(), registry_of([def]), test_config());
    engine.ready().await;
    let saga = engine.engine.start_saga("s", json!({})).await.unwrap();
    wait_terminal(&stores.log, saga.id).await;
    engine.stop().await;
    let outbox = stores.outbox.clone();
    let relay = Relay::new(outbox.clone(), WebhookConfig::default()).unwrap();
    while relay.relay_once().await.unwrap() > 0 {}
    let read = outbox.relay_cursor(RELAY_NAME).await.unwrap();
    assert_eq!(
        outbox.relay_progress(RELAY_NAME).await.unwrap().lag_events,
        0
    );

    // `early` takes its transaction id first; `late` writes and commits an event before it.
    let mut early = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut late = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // An event of the saga written at `at` on `conn`; its id.
    async fn insert(conn: &mut sqlx::PgConnection, saga: Uuid, at: i64) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO events (saga_id, at, type) VALUES ($1, $2, 'test.event') RETURNING id",
        )
        .bind(saga)
        .bind(at)
        .fetch_one(conn)
        .await
        .unwrap()
    }
    sqlx::query("BEGIN").execute(&mut early).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut early)
        .await
        .unwrap();
    let low = insert(&mut late, saga.id, 1_000).await;
    let high = insert(&mut early, saga.id, 2_000).await;
    sqlx::query("COMMIT").execute(&mut early).await.unwrap();
    assert!(low < high);

    let next = outbox.outbox_after(read, 10).await.unwrap();
    let ids: Vec<i64> = next.iter().map(|e| e.id()).collect();
    assert_eq!(ids, [high, low], "read in commit order");
    let (first, second) = (next[0].position, next[1].position);

    assert!(outbox
        .advance_relay(RELAY_NAME, read, first, &[])
        .await
        .unwrap());
    let owed = outbox.relay_progress(RELAY_NAME).await.unwrap();
    assert_eq!(
        (owed.lag_events, owed.oldest_unread_at),
        (1, Some(1_000)),
        "the smaller id is still owed: {owed:?}"
    );

    assert!(outbox
        .advance_relay(RELAY_NAME, first, second, &[])
        .await
        .unwrap());
    let done = outbox.relay_progress(RELAY_NAME).await.unwrap();
    assert_eq!(
        (done.lag_events, done.oldest_unread_at),
        (0, None),
        "the larger id was read already: {done:?}"
    );
}
