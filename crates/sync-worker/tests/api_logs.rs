//! No secret reaches the logs at any level: everything every crate logs at
//! `trace` while a user signs up, logs in, adds an IMAP account (its
//! password crosses the IMAP login), opens a WebSocket (the token as its
//! first message), changes the account's password and logs out is
//! collected, and none of the secrets appears in it.

use std::io::Write;
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use serde_json::json;
use sync_worker::storage::DbKind;
use sync_worker::testing::TestDb;

mod api_harness;
use api_harness::*;

#[derive(Clone, Default)]
struct Collected(Arc<Mutex<Vec<u8>>>);

impl Write for Collected {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_password_is_logged_at_trace() {
    let logs = Collected::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(sync_worker::logging::filter("trace").unwrap())
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let db = TestDb::fresh(DbKind::Sqlite, "no_secrets").unwrap_or_else(|e| panic!("a SQLite test database: {e}"));
    let s = server(db, |_| {}).await;
    s.append("alice", "hello");
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    s.wait_listed(&token, &id, 1).await;
    let mut ws = s.ws(&token).await;
    tokio::task::block_in_place(|| s.dovecot.set_password("alice", "Changed-Imap-Pw-99")).expect("set the password");
    // Dovecot rereads its users file by mtime in whole seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let body = json!({"password": "Changed-Imap-Pw-99"});
        let (st, v) = s.call("PATCH", &format!("/v1/accounts/{id}"), Some(&token), Some(body)).await;
        if st == StatusCode::OK {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{st} {v}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let (st, _) = s.call("POST", "/v1/logout", Some(&token), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // The logout closes the socket (after any event already on its way):
    // read until it does, so its end is logged too.
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        use futures::StreamExt as _;
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    assert!(closed.is_ok(), "the logout did not close the socket within 5 s");
    drop(s);

    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).to_string();
    assert!(text.lines().count() > 100, "too few log lines to mean anything: {}", text.lines().count());
    for (what, secret) in [
        ("the session token", token.as_str()),
        ("the user's password", USER_PASSWORD),
        ("the IMAP password", IMAP_PASSWORD),
        ("the new IMAP password", "Changed-Imap-Pw-99"),
    ] {
        if let Some(line) = text.lines().find(|l| l.contains(secret)) {
            panic!("{what} is in the logs: {line}");
        }
    }
}
