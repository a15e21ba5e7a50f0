//! A real `nats-server` with JetStream for one test: its own port and store directory, so
//! tests run side by side without sharing a stream, and it can be killed and started again on
//! the same store (what a broker outage looks like).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream::{self, stream::Stream};

/// The server binary: `SAGA_TEST_NATS_SERVER`, else `nats-server` on the `PATH`.
fn binary() -> String {
    std::env::var("SAGA_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned())
}

/// A running `nats-server -js`, killed when dropped.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    /// Its JetStream store, kept across restarts.
    pub store: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server on a free loopback port; panics (failing the test) if `nats-server`
    /// cannot be run or does not listen within 10 seconds.
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = Self {
            child: None,
            port,
            store: tempfile::tempdir().unwrap(),
        };
        server.start_again();
        server
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server again on the same port and store (after [`kill9`](Self::kill9)).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let child = Command::new(binary())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} (install nats-server, or set SAGA_TEST_NATS_SERVER): {e}",
                    binary()
                )
            });
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not listen on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server with SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with SIGSTOP: it keeps its connections open and answers nothing, as a
    /// broker on a host that hangs or behind a dropped network does.
    pub fn freeze(&self) {
        let child = self.child.as_ref().expect("the server is running");
        let status = Command::new("kill")
            .args(["-STOP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -STOP failed");
    }

    /// A JetStream context on this server.
    pub async fn jetstream(&self) -> jetstream::Context {
        let client = async_nats::connect(self.url()).await.unwrap();
        jetstream::new(client)
    }

    /// The stream `name`, once it exists (the orchestrator creates it at start).
    pub async fn stream(&self, name: &str) -> Stream {
        let js = self.jetstream().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match js.get_stream(name).await {
                Ok(stream) => return stream,
                Err(e) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "stream {name} never appeared: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One message read back from a stream.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its subject.
    pub subject: String,
    /// Its `Nats-Msg-Id`.
    pub message_id: String,
    /// Its body.
    pub body: serde_json::Value,
    /// Its `traceparent` header.
    pub traceparent: String,
}

/// Every message the stream holds, in stream order.
pub async fn messages(stream: &mut Stream) -> Vec<Stored> {
    messages_after(stream, 0).await
}

/// The stream's last sequence number (0 when it is empty).
pub async fn last_sequence(stream: &mut Stream) -> u64 {
    stream.info().await.unwrap().state.last_sequence
}

/// The messages the stream holds after sequence `after`, in stream order.
pub async fn messages_after(stream: &mut Stream, after: u64) -> Vec<Stored> {
    let info = stream.info().await.unwrap().clone();
    let mut out = Vec::new();
    for seq in info.state.first_sequence.max(after + 1)..=info.state.last_sequence {
        if seq == 0 {
            continue;
        }
        let m = stream.get_raw_message(seq).await.unwrap();
        out.push(Stored {
            subject: m.subject.to_string(),
            message_id: m
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
            body: serde_json::from_slice(&m.payload).unwrap(),
            traceparent: m
                .headers
                .get("traceparent")
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
        });
    }
    out
}
