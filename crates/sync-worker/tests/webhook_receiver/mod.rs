//! A webhook receiver for tests: a real HTTP server on loopback that
//! records every POST and answers as the test says (fail an event's first
//! N tries, fail everything, or hold the answer back).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;

/// One POST as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub json: Value,
    /// What the receiver answered (`None`: it never answered).
    pub answered: Option<u16>,
}

impl Received {
    pub fn event_id(&self) -> &str {
        self.json["id"].as_str().unwrap_or_default()
    }
}

#[derive(Default)]
struct Shared {
    log: Mutex<Vec<Received>>,
    tries: Mutex<HashMap<String, usize>>,
    /// Each event's first this many tries answer 500.
    fail_first: AtomicUsize,
    /// Every try answers 500.
    fail_all: AtomicBool,
    /// The next this many POSTs are never answered.
    hang_next: AtomicUsize,
}

/// The receiver. Dropping it stops the server.
pub struct Receiver {
    pub url: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = json["id"].as_str().unwrap_or_default().to_string();
    let hang = shared.hang_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    let tries = {
        let mut tries = shared.tries.lock();
        let n = tries.entry(id).or_default();
        *n += 1;
        *n
    };
    let status = if shared.fail_all.load(Ordering::SeqCst) || tries <= shared.fail_first.load(Ordering::SeqCst) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    };
    let answered = (!hang).then_some(status.as_u16());
    shared.log.lock().push(Received { headers, body: body.to_vec(), json, answered });
    if hang {
        std::future::pending::<()>().await;
    }
    status
}

impl Receiver {
    pub async fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, shared, server }
    }

    pub fn fail_first(&self, n: usize) {
        self.shared.fail_first.store(n, Ordering::SeqCst);
    }

    pub fn fail_all(&self, on: bool) {
        self.shared.fail_all.store(on, Ordering::SeqCst);
    }

    pub fn hang_next(&self, n: usize) {
        self.shared.hang_next.store(n, Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.log.lock().clone()
    }

    /// The POSTs answered 2xx.
    pub fn delivered(&self) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.answered.is_some_and(|s| (200..300).contains(&s))).collect()
    }

    /// Waits (up to `within`) until `done` holds for what was received.
    pub async fn wait_until(&self, within: Duration, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if done(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver never got {what}: {} POSTs: {:#?}",
                got.len(),
                got.iter()
                    .map(|r| format!(
                        "{} uid {} id {} -> {:?}",
                        r.json["type"],
                        r.json["data"]["uid"],
                        r.event_id(),
                        r.answered
                    ))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Checks `received`'s signature as the README tells a receiver to:
/// `openssl dgst -sha256 -hmac SECRET` over the raw body.
pub fn signature_checks_with_openssl(received: &Received, secret: &str) -> bool {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", secret, "-hex"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl (Debian package openssl)");
    child.stdin.take().unwrap().write_all(&received.body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl dgst failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = text.trim().rsplit(' ').next().unwrap_or_default().to_string();
    let header = received.headers.get("x-webhook-signature").and_then(|v| v.to_str().ok()).unwrap_or_default();
    header == format!("sha256={hex}")
}
