//! `/metrics` as Prometheus reads it: parsed by a Prometheus text-format
//! parser, and its values move as mail arrives, sockets open and users log
//! in, on a real `serve` (API and worker) over a private Dovecot.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use sync_worker::storage::DbKind;
use sync_worker::testing::TestDb;

mod api_harness;
use api_harness::*;

/// Every sample of the page, by name and sorted labels.
async fn scrape(s: &Server) -> HashMap<String, f64> {
    let resp = s.http.get(format!("{}/metrics", s.base)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = resp.text().await.unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("not Prometheus text: {e}\n{text}"));
    let mut out = HashMap::new();
    for sample in parsed.samples {
        let mut labels: Vec<String> = sample.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            prometheus_parse::Value::Summary(_) => continue,
        };
        out.insert(format!("{}{{{}}}", sample.metric, labels.join(",")), value);
    }
    out
}

fn get(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| {
        let mut keys: Vec<_> = m.keys().filter(|k| k.starts_with("sync_worker")).collect();
        keys.sort();
        panic!("no {key} in /metrics: {keys:#?}")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_move_as_mail_arrives() {
    let db = TestDb::fresh(DbKind::Sqlite, "metrics").unwrap_or_else(|e| panic!("a SQLite test database: {e}"));
    let s = server(db, |_| {}).await;
    s.append("alice", "before");
    let token = s.user("alice@example.org").await;
    let (st, _) =
        s.call("POST", "/v1/login", None, Some(json!({"email": "alice@example.org", "password": "wrong-pw-1"}))).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let id = s.add_account(&token, "alice").await;
    s.wait_listed(&token, &id, 1).await;
    let ws = s.ws(&token).await;

    // Tier gauges are read at the scrape: the one account, owned and hot.
    let deadline = Instant::now() + Duration::from_secs(20);
    let before = loop {
        let m = scrape(&s).await;
        if get(&m, "sync_worker_accounts{tier=hot}") == 1.0
            && get(&m, "sync_worker_account_health{state=up_to_date}") == 1.0
        {
            break m;
        }
        assert!(Instant::now() < deadline, "the account never showed as hot and up to date: {m:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(get(&before, "sync_worker_accounts{tier=warm}") + get(&before, "sync_worker_accounts{tier=cold}"), 0.0);
    assert_eq!(get(&before, "sync_worker_websockets_open{}"), 1.0);
    assert!(get(&before, "sync_worker_api_logins_total{outcome=ok}") >= 1.0);
    assert!(get(&before, "sync_worker_api_logins_total{outcome=failed}") >= 1.0);
    assert!(get(&before, "sync_worker_messages_synced_total{}") >= 1.0);
    // A hot account holds its IDLE connection open.
    assert!(get(&before, "sync_worker_imap_connections_open{}") >= 1.0);
    assert!(get(&before, "sync_worker_sync_lag_seconds{}") < 60.0);

    // New mail moves the count of stored messages (metrics are per process,
    // and other tests in this binary may add to them, so: at least).
    for i in 0..3 {
        s.append("alice", &format!("after-{i}"));
    }
    s.wait_listed(&token, &id, 4).await;
    let after = scrape(&s).await;
    let moved =
        get(&after, "sync_worker_messages_synced_total{}") - get(&before, "sync_worker_messages_synced_total{}");
    assert!(moved >= 3.0, "messages_synced_total moved by {moved}");
    // ... and each reached the open socket: three more push latencies.
    let pushed_before = before.get("sync_worker_push_seconds{}").copied().unwrap_or(0.0);
    let pushed = get(&after, "sync_worker_push_seconds{}") - pushed_before;
    assert!(pushed >= 3.0, "push_seconds counted {pushed} more");
    drop(ws);
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(&scrape(&s).await, "sync_worker_websockets_open{}") != 0.0 {
        assert!(Instant::now() < deadline, "a closed socket is still counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
