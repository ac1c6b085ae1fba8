//! A worker process killed in the middle of a webhook delivery loses
//! nothing: the delivery is pending on it in the unit queue (Redis), and
//! another worker process reclaims it once it has gone without a heartbeat
//! for `WEBHOOK_RECLAIM_AFTER`. Real processes, a real Redis, Postgres and
//! Dovecot; a missing one fails the test, it never skips.

use std::time::{Duration, Instant};

use leasehold_redis::test_support;
use serde_json::{json, Value};
use sync_worker::testing::{free_port, Dovecot, TestDb};

mod process_harness;
mod webhook_receiver;
use process_harness::{scale_out_env, sync_worker};
use webhook_receiver::Receiver;

async fn call(http: &reqwest::Client, method: &str, url: String, token: Option<&str>, body: Option<Value>) -> Value {
    let mut req = http.request(method.parse().unwrap(), url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("request");
    let status = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{status}: {v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_delivery_loses_nothing() {
    test_support::require_binary("redis-server");
    let redis = test_support::redis_url();
    let prefix = test_support::unique_prefix("webhook-kill");
    let pg = TestDb::postgres("webhook_kill").unwrap_or_else(|e| panic!("Postgres: {e}"));
    let dovecot = Dovecot::start().unwrap_or_else(|e| panic!("Dovecot: {e}"));
    dovecot.add_user("alice", "imap-pw").unwrap();
    let receiver = Receiver::start().await;
    // The first POST is never answered: its worker is killed while it waits.
    receiver.hang_next(1);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().expect("a free port");
    let mut common = scale_out_env(&redis, &prefix, pg.url());
    common.extend([
        ("POLL_WARM", "1s".to_string()),
        ("WEBHOOK_RECLAIM_AFTER", "2s".to_string()),
        ("WEBHOOK_TIMEOUT", "60s".to_string()),
    ]);
    let with = |extra: &[(&'static str, String)]| [common.as_slice(), extra].concat();
    let _api = sync_worker(dir.path(), &["api"], &with(&[("LISTEN", format!("127.0.0.1:{port}"))]), "api");
    let mut first = sync_worker(dir.path(), &["worker"], &with(&[("WORKER_ID", "worker-a".to_string())]), "worker-a");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the API never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let creds = json!({"email": "alice@example.org", "password": "console-pw"});
    call(&http, "POST", format!("{base}/v1/users"), None, Some(creds.clone())).await;
    let token =
        call(&http, "POST", format!("{base}/v1/login"), None, Some(creds)).await["token"].as_str().unwrap().to_string();
    let hook = json!({"url": receiver.url, "events": ["message.new"]});
    let hook = call(&http, "POST", format!("{base}/v1/webhooks"), Some(&token), Some(hook)).await;
    let hook_id = hook["id"].as_str().unwrap().to_string();
    let raw = b"From: carol@example.org\r\nTo: alice@example.org\r\nSubject: mid-delivery\r\n\r\nhi\r\n";
    tokio::task::block_in_place(|| dovecot.append("alice", "INBOX", raw)).unwrap();
    let account = json!({"host": dovecot.host(), "port": dovecot.port(), "security": "plain",
                         "username": "alice", "password": "imap-pw"});
    call(&http, "POST", format!("{base}/v1/accounts"), Some(&token), Some(account)).await;

    let got = receiver.wait_until(Duration::from_secs(30), "the first POST", |got| !got.is_empty()).await;
    let event = got[0].event_id().to_string();
    assert_eq!(got[0].answered, None, "the first POST is the one held");
    first.0.kill().expect("kill worker-a");
    first.0.wait().expect("reap worker-a");
    let killed_at = Instant::now();

    let _second = sync_worker(dir.path(), &["worker"], &with(&[("WORKER_ID", "worker-b".to_string())]), "worker-b");
    let got = receiver
        .wait_until(Duration::from_secs(30), "the event again, answered", |got| {
            got.iter().any(|r| r.event_id() == event && r.answered == Some(204))
        })
        .await;
    eprintln!("delivered by worker-b {:?} after worker-a was killed", killed_at.elapsed());
    assert!(got.iter().all(|r| r.event_id() == event), "one event only: {}", got.len());
    let list = call(&http, "GET", format!("{base}/v1/webhooks/{hook_id}/deliveries"), Some(&token), None).await;
    let deliveries = list["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1, "{list}");
    assert_eq!(deliveries[0]["state"], "delivered", "{list}");
    assert_eq!(deliveries[0]["event_id"], event.as_str(), "{list}");
}
