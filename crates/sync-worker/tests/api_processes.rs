//! The `sync-worker` binary's API processes, as an operator runs them:
//! `serve` with no configuration at all, and scale-out with `api` and
//! `worker` as separate processes on one Redis and one Postgres, where mail
//! a worker stores must reach the `api` process's WebSocket (Redis pub/sub).
//! A missing Redis, Postgres or Dovecot fails these tests; they never skip.

use std::time::{Duration, Instant};

use futures::StreamExt;
use leasehold_redis::test_support;
use serde_json::{json, Value};
use sync_worker::testing::{free_port, Dovecot, TestDb};
use tokio_tungstenite::tungstenite::Message;

mod process_harness;
use process_harness::{scale_out_env, sync_worker, Proc};

async fn wait_up(http: &reqwest::Client, base: &str, procs: &mut [&mut Proc]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http.get(format!("{base}/")).send().await {
            return r.text().await.unwrap();
        }
        for p in procs.iter_mut() {
            if let Some(status) = p.0.try_wait().unwrap() {
                panic!("sync-worker {} exited: {status}", p.1);
            }
        }
        assert!(Instant::now() < deadline, "the API never answered at {base}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn post(http: &reqwest::Client, url: String, token: Option<&str>, body: Value) -> Value {
    let mut req = http.post(url).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{status}: {v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_with_no_configuration_and_serves_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().expect("a free port");
    let mut serve = sync_worker(dir.path(), &["serve"], &[("LISTEN", format!("127.0.0.1:{port}"))], "serve");
    let http = reqwest::Client::new();
    let page = wait_up(&http, &format!("http://127.0.0.1:{port}"), &mut [&mut serve]).await;
    assert!(page.contains("sync-worker console"), "{page}");
    assert!(dir.path().join("sync-worker.db").exists(), "the SQLite file");
    let key = dir.path().join("sync-worker.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).expect("the key file").permissions().mode() & 0o777, 0o600);
    let v = post(
        &http,
        format!("http://127.0.0.1:{port}/v1/users"),
        None,
        json!({"email": "a@b.org", "password": "long enough"}),
    )
    .await;
    assert!(v["id"].is_string(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_stored_by_a_worker_process_reaches_the_websocket_of_an_api_process() {
    test_support::require_binary("redis-server");
    let redis = test_support::redis_url();
    let prefix = test_support::unique_prefix("api2p");
    let pg = TestDb::postgres("api_two_processes").unwrap_or_else(|e| panic!("Postgres: {e}"));
    let dovecot = Dovecot::start().unwrap_or_else(|e| panic!("Dovecot: {e}"));
    dovecot.add_user("alice", "imap-pw").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().expect("a free port");
    let common = scale_out_env(&redis, &prefix, pg.url());
    let mut api_env = common.to_vec();
    api_env.push(("LISTEN", format!("127.0.0.1:{port}")));
    let mut worker_env = common.to_vec();
    worker_env.push(("WORKER_ID", "worker-1".to_string()));
    let mut api = sync_worker(dir.path(), &["api"], &api_env, "api");
    let mut worker = sync_worker(dir.path(), &["worker"], &worker_env, "worker");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    wait_up(&http, &base, &mut [&mut api, &mut worker]).await;

    let creds = json!({"email": "alice@example.org", "password": "console-pw"});
    post(&http, format!("{base}/v1/users"), None, creds.clone()).await;
    let token = post(&http, format!("{base}/v1/login"), None, creds).await["token"].as_str().unwrap().to_string();
    let account = json!({"host": dovecot.host(), "port": dovecot.port(), "security": "plain",
                         "username": "alice", "password": "imap-pw"});
    let id =
        post(&http, format!("{base}/v1/accounts"), Some(&token), account).await["id"].as_str().unwrap().to_string();
    let (mut ws, _) = {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut req = format!("ws://127.0.0.1:{port}/v1/ws").into_client_request().unwrap();
        req.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        tokio_tungstenite::connect_async(req).await.unwrap()
    };

    // The worker process owns it (through Redis) and syncs it hot.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a: Value = http
            .get(format!("{base}/v1/accounts/{id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if a["owner"] == "worker-1" && a["tier"] == "hot" && a["last_sync_at"].is_i64() {
            break;
        }
        assert!(Instant::now() < deadline, "the worker process never synced the account hot: {a}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = Instant::now();
    let raw = b"From: carol@example.org\r\nTo: alice@example.org\r\nSubject: across-processes\r\n\r\nhi\r\n";
    tokio::task::block_in_place(|| dovecot.append("alice", "INBOX", raw)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next()).await.expect("no message.new within 10 s");
        let Some(Ok(Message::Text(t))) = msg else { continue };
        let ev: Value = serde_json::from_str(t.as_str()).unwrap();
        if ev["type"] == "message.new" {
            assert_eq!(ev["account"], id.as_str());
            assert_eq!(ev["message"]["subject"], "across-processes");
            eprintln!("message.new reached the api process's WebSocket {:?} after the APPEND", t0.elapsed());
            break;
        }
    }
    // The worker process's poll outcomes come across too, as account.status.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next()).await.expect("no account.status within 15 s");
        let Some(Ok(Message::Text(t))) = msg else { continue };
        let ev: Value = serde_json::from_str(t.as_str()).unwrap();
        if ev["type"] == "account.status" {
            assert_eq!(ev["account"], id.as_str(), "{ev}");
            assert!(ev["last_sync_at"].as_i64().is_some() && ev["tier"] == "hot", "{ev}");
            assert!(ev["owner"].as_str().is_some_and(|o| !o.is_empty()), "{ev}");
            break;
        }
    }
}
