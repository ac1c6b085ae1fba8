//! The API test harness: a real HTTP server and a real worker in this
//! process (exactly what `sync-worker serve` runs), a real private Dovecot,
//! and the test's own database; HTTP and WebSocket clients to drive them.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_core::WorkerId;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sync_worker::api::ApiSettings;
use sync_worker::app::serve::{self, Parts, Running};
use sync_worker::app::wiring;
use sync_worker::storage::Storage;
use sync_worker::testing::{Dovecot, DovecotOptions, TestDb};
use sync_worker::Config;
use tokio_tungstenite::tungstenite::Message;

pub const IMAP_PASSWORD: &str = "imap-Secret-4711";
pub const USER_PASSWORD: &str = "console-pw-1234";

pub struct Server {
    pub running: Option<Running>,
    pub dovecot: Dovecot,
    /// The same database, for checks behind the API's back.
    pub storage: Storage,
    pub http: reqwest::Client,
    pub base: String,
    /// The worker's id (`w-` and the test's name).
    pub worker: String,
    pub _db: TestDb,
}

pub fn config() -> Config {
    Config {
        lease_ttl: Duration::from_secs(3),
        poll_warm: Duration::from_secs(2),
        poll_cold: Duration::from_secs(4),
        tier_eval_interval: Duration::from_secs(1),
        reconcile_interval: Duration::from_secs(1),
        // The test's Dovecot is on loopback, which the API refuses by default.
        imap_allow_private: true,
        ..Config::default()
    }
}

pub async fn server(db: TestDb, tune: impl FnOnce(&mut ApiSettings)) -> Server {
    server_with(db, &DovecotOptions::default(), tune).await
}

/// [`server`] on a Dovecot started with `options`.
pub async fn server_with(db: TestDb, options: &DovecotOptions, tune: impl FnOnce(&mut ApiSettings)) -> Server {
    server_configured(db, options, config(), tune).await
}

/// [`server_with`], the engine configured by `config` (see [`config`]).
pub async fn server_configured(
    db: TestDb,
    options: &DovecotOptions,
    config: Config,
    tune: impl FnOnce(&mut ApiSettings),
) -> Server {
    let dovecot = Dovecot::start_with(options).unwrap_or_else(|e| panic!("Dovecot: {e}"));
    dovecot.add_users([("alice", IMAP_PASSWORD), ("bob", IMAP_PASSWORD)]).expect("Dovecot users");
    let storage = db.open().await.unwrap_or_else(|e| panic!("open {}: {e:?}", db.url()));
    let mut settings = ApiSettings::new(&config);
    settings.listen = "127.0.0.1:0".parse().unwrap();
    tune(&mut settings);
    let parts = Parts { storage: storage.clone(), backend: wiring::in_process(), config, settings };
    let worker = format!("w-{}", db.tag());
    let running = serve::start(parts, Some(WorkerId::new(&worker).unwrap())).await.expect("start");
    let base = format!("http://{}", running.addr());
    Server { running: Some(running), dovecot, storage, http: reqwest::Client::new(), base, worker, _db: db }
}

/// A raw message with this subject.
pub fn mail(subject: &str) -> Vec<u8> {
    format!(
        "From: Carol <carol@example.org>\r\nTo: alice@example.org\r\nSubject: {subject}\r\n\
         Message-ID: <{subject}@example.org>\r\nDate: Tue, 1 Dec 2026 09:00:00 +0000\r\n\r\nHello, {subject}.\r\n"
    )
    .into_bytes()
}

impl Server {
    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    /// `GET path` as bytes, with the answer's headers.
    pub async fn get_bytes(&self, path: &str, token: &str) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        let resp = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.expect("request");
        let (status, headers) = (resp.status(), resp.headers().clone());
        (status, headers, resp.bytes().await.expect("body").to_vec())
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        let v = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        (status, v)
    }

    pub async fn raw(&self, method: &str, path: &str, token: Option<&str>, body: &str) -> (StatusCode, Value) {
        let mut req = self.http.request(method.parse().unwrap(), format!("{}{path}", self.base)).body(body.to_string());
        req = req.header("content-type", "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request");
        (resp.status(), resp.json().await.unwrap_or(Value::Null))
    }

    /// Signs up and logs in; returns the token.
    pub async fn user(&self, email: &str) -> String {
        let (s, v) =
            self.call("POST", "/v1/users", None, Some(json!({"email": email, "password": USER_PASSWORD}))).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert!(v["id"].is_string(), "{v}");
        let (s, v) =
            self.call("POST", "/v1/login", None, Some(json!({"email": email, "password": USER_PASSWORD}))).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert!(v["expires_at"].as_i64().unwrap() > 0);
        v["token"].as_str().unwrap().to_string()
    }

    pub async fn add_account(&self, token: &str, imap_user: &str) -> String {
        let body = json!({"host": self.dovecot.host(), "port": self.dovecot.port(), "security": "plain",
                          "username": imap_user, "password": IMAP_PASSWORD});
        let (s, v) = self.call("POST", "/v1/accounts", Some(token), Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    pub fn append(&self, imap_user: &str, subject: &str) {
        tokio::task::block_in_place(|| self.dovecot.append(imap_user, "INBOX", &mail(subject)).expect("APPEND"));
    }

    /// Waits (up to 20 s) until `INBOX` of `account` lists `n` messages.
    pub async fn wait_listed(&self, token: &str, account: &str, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (s, v) =
                self.call("GET", &format!("/v1/accounts/{account}/messages?limit=500"), Some(token), None).await;
            if s == StatusCode::OK && v["messages"].as_array().unwrap().len() == n {
                return v["messages"].as_array().unwrap().clone();
            }
            if Instant::now() >= deadline {
                let (_, a) = self.call("GET", &format!("/v1/accounts/{account}"), Some(token), None).await;
                panic!("INBOX never listed {n} messages: {s} {v}; the account: {a}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_tier(&self, token: &str, account: &str, tier: &str, within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let (_, v) = self.call("GET", &format!("/v1/accounts/{account}"), Some(token), None).await;
            if v["tier"] == tier {
                return t0.elapsed();
            }
            assert!(t0.elapsed() < within, "account never turned {tier} within {within:?}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A WebSocket logged in as a browser does: the token as its first message.
    pub async fn ws(&self, token: &str) -> Ws {
        let url = format!("ws://{}/v1/ws", self.running().addr());
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.expect("websocket");
        use futures::SinkExt as _;
        ws.send(Message::Text(json!({"type": "auth", "token": token}).to_string().into()))
            .await
            .expect("send the login");
        let first = next_json(&mut ws, Duration::from_secs(5)).await.expect("ready");
        assert_eq!(first["type"], "ready");
        ws
    }
}

pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn next_json(ws: &mut Ws, within: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return None,
            Ok(None) => panic!("websocket closed"),
            Ok(Some(Ok(Message::Text(t)))) => return Some(serde_json::from_str(t.as_str()).expect("json event")),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => panic!("websocket: {e}"),
        }
    }
}

/// The first `message.new` whose subject is `subject`.
pub async fn wait_new(ws: &mut Ws, subject: &str, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    while let Some(ev) = next_json(ws, deadline.saturating_duration_since(Instant::now())).await {
        if ev["type"] == "message.new" && ev["message"]["subject"] == subject {
            return Some(ev);
        }
    }
    None
}

impl Drop for Server {
    fn drop(&mut self) {
        // Dropping the handle aborts the server and the worker's tasks.
        drop(self.running.take());
    }
}

/// The next event of type `kind`.
pub async fn wait_kind(ws: &mut Ws, kind: &str, within: Duration) -> Option<Value> {
    let deadline = Instant::now() + within;
    while let Some(ev) = next_json(ws, deadline.saturating_duration_since(Instant::now())).await {
        if ev["type"] == kind {
            return Some(ev);
        }
    }
    None
}
