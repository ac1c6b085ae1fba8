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
    // Logout is announced over Redis too: the socket closes within 1 s, unpinged.
    let t0 = Instant::now();
    let r = http.post(format!("{base}/v1/logout")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await.expect("no close within 1 s of the logout") {
            Some(Ok(Message::Close(Some(f)))) => {
                assert_eq!(u16::from(f.code), 4001, "{f:?}");
                break;
            }
            Some(Ok(_)) => continue,
            other => panic!("the socket ended without its close frame: {other:?}"),
        }
    }
    eprintln!("the socket closed {:?} after the logout", t0.elapsed());
}

/// `sync-worker worker` with `METRICS_LISTEN` serves `/metrics`, `/healthz`
/// and `/readyz` (nothing else), and `LOG_FORMAT=json` writes one JSON
/// object per log line; bad values of either stop the start with words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_serves_metrics_and_writes_json_logs() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().expect("a free port");
    let mut c = sync_worker::testing::sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path());
    c.arg("worker")
        .env("METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut worker = Proc(c.spawn().expect("spawn sync-worker worker"), "worker");
    let stderr = worker.0.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        // Read to the end: a closed pipe would fail the worker's next log write.
        std::io::BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<String>>()
    });
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        if let Ok(r) = http.get(format!("{base}/metrics")).send().await {
            break r.text().await.unwrap();
        }
        if let Some(status) = worker.0.try_wait().unwrap() {
            panic!("sync-worker worker exited: {status}");
        }
        assert!(Instant::now() < deadline, "METRICS_LISTEN never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let parsed = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
    let hot = parsed
        .samples
        .iter()
        .find(|s| s.metric == "sync_worker_accounts" && s.labels.get("tier") == Some("hot"))
        .unwrap_or_else(|| panic!("no accounts gauge: {page}"));
    assert!(matches!(hot.value, prometheus_parse::Value::Gauge(v) if v == 0.0), "{page}");
    for (path, status) in [("/healthz", 200), ("/readyz", 200), ("/v1/accounts", 404), ("/", 404)] {
        let r = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{path}");
    }
    drop(worker);
    let lines = lines.join().unwrap();
    assert!(!lines.is_empty(), "no log lines");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }

    for (var, value, words) in [
        ("LOG_FORMAT", "xml", "LOG_FORMAT=\"xml\" is invalid"),
        ("METRICS_LISTEN", "port 9090", "METRICS_LISTEN=\"port 9090\" is invalid"),
    ] {
        let out = sync_worker::testing::sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path())
            .arg("worker")
            .env(var, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && text.contains(words), "{var}={value}: {text}");
    }
}
