//! Webhooks end to end on SQLite and Postgres: mail added to the private
//! Dovecot by a real client is synced, and its events are POSTed to a real
//! HTTP receiver, signed, at least once, through the unit queue's retries.
//! A worker killed mid-delivery is `webhook_processes.rs`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sync_worker::both_databases;
use sync_worker::testing::{DovecotOptions, TestDb};
use sync_worker::webhooks::WebhookSettings;
use sync_worker::Config;

mod api_harness;
mod webhook_receiver;
use api_harness::*;
use webhook_receiver::{signature_checks_with_openssl, Receiver};

both_databases!(
    async:
    every_event_reaches_a_receiver_that_fails_its_first_3_tries,
    a_receiver_down_for_good_is_paused_not_retried_forever_and_resumes,
    webhook_routes_check_urls_events_and_owners,
);

/// The harness's engine settings with quick webhook retries.
fn quick(retries: u32) -> Config {
    Config {
        webhooks: WebhookSettings {
            retries,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_millis(400),
            poll: Duration::from_millis(100),
            ..WebhookSettings::default()
        },
        ..config()
    }
}

async fn webhook(s: &Server, token: &str, url: &str, events: Value) -> Value {
    let (status, v) = s.call("POST", "/v1/webhooks", Some(token), Some(json!({"url": url, "events": events}))).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert!(v["secret"].as_str().is_some_and(|s| s.starts_with("whsec_")), "{v}");
    v
}

async fn every_event_reaches_a_receiver_that_fails_its_first_3_tries(db: TestDb) {
    let s = server_configured(db, &DovecotOptions::default(), quick(5), |_| {}).await;
    let receiver = Receiver::start().await;
    receiver.fail_first(3);
    let token = s.user("alice@example.org").await;
    let hook = webhook(&s, &token, &receiver.url, json!(["message.new", "message.updated", "message.deleted"])).await;
    let secret = hook["secret"].as_str().unwrap().to_string();
    let hook_id = hook["id"].as_str().unwrap().to_string();
    for subject in ["one", "two", "three"] {
        s.append("alice", subject);
    }
    let account = s.add_account(&token, "alice").await;
    let listed = s.wait_listed(&token, &account, 3).await;
    // A flag change and an expunge, made on the server by the API and by another client.
    let first = listed.iter().find(|m| m["subject"] == "one").unwrap()["id"].as_str().unwrap().to_string();
    let (st, v) = s
        .call("PATCH", &format!("/v1/accounts/{account}/messages/{first}"), Some(&token), Some(json!({"seen": true})))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    tokio::task::block_in_place(|| {
        s.dovecot.doveadm(&["expunge", "-u", "alice", "mailbox", "INBOX", "subject", "two"])
    })
    .expect("doveadm expunge");

    // Each event once by id (a batch stored twice announces the same ids).
    let delivered_ids = |got: &[webhook_receiver::Received], kind: &str| -> std::collections::BTreeSet<String> {
        got.iter()
            .filter(|r| r.answered == Some(204) && r.json["type"] == kind)
            .map(|r| r.event_id().to_string())
            .collect()
    };
    let got = receiver
        .wait_until(Duration::from_secs(45), "3 new, 1 updated and 1 deleted, delivered", |got| {
            delivered_ids(got, "message.new").len() == 3
                && !delivered_ids(got, "message.updated").is_empty()
                && delivered_ids(got, "message.deleted").len() == 1
        })
        .await;

    // Each event was refused 3 times, then delivered on its 4th try, every
    // time with the same event id and a signature that checks.
    for delivered in got.iter().filter(|r| r.answered == Some(204)) {
        let tries: Vec<_> = got.iter().filter(|r| r.event_id() == delivered.event_id()).collect();
        assert!(tries.len() >= 4, "{:?}", delivered.json);
        assert!(tries.iter().take(3).all(|r| r.answered == Some(500)) && tries[3].answered == Some(204));
        assert!(signature_checks_with_openssl(delivered, &secret), "signature of {:?}", delivered.json);
        assert!(!signature_checks_with_openssl(delivered, "whsec_wrong"));
        let h = |name: &str| delivered.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        assert_eq!(h("x-webhook-event-id"), delivered.event_id());
        assert_eq!(h("x-webhook-id"), hook_id);
        assert_eq!(h("x-webhook-event"), delivered.json["type"].as_str().unwrap());
        assert_eq!(delivered.json["account_id"], account.as_str());
        assert_eq!(delivered.json["webhook_id"], hook_id.as_str());
        assert!(delivered.json["data"]["message_id"].is_string(), "{:?}", delivered.json);
    }
    // The message ids are the API's: the new ones read back through it.
    for new in got.iter().filter(|r| r.answered == Some(204) && r.json["type"] == "message.new") {
        let mid = new.json["data"]["message_id"].as_str().unwrap();
        if new.json["data"]["uid"] == listed.iter().find(|m| m["subject"] == "two").unwrap()["uid"] {
            continue; // expunged since
        }
        let (st, v) = s.call("GET", &format!("/v1/accounts/{account}/messages/{mid}"), Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    let (_, list) = s.call("GET", &format!("/v1/webhooks/{hook_id}/deliveries"), Some(&token), None).await;
    let deliveries = list["deliveries"].as_array().unwrap();
    assert!(deliveries.len() >= 5, "{list}");
    assert!(deliveries.iter().all(|d| d["state"] == "delivered"), "{list}");
    assert!(deliveries.iter().any(|d| d["attempts"] == 4), "{list}");
    let (_, w) = s.call("GET", &format!("/v1/webhooks/{hook_id}"), Some(&token), None).await;
    assert_eq!(w["state"], "active", "{w}");
    assert_eq!(w["undelivered"], 0, "{w}");
    assert!(w["last_success_at"].is_i64() && w["last_error"].as_str().unwrap().contains("500"), "{w}");
}

async fn a_receiver_down_for_good_is_paused_not_retried_forever_and_resumes(db: TestDb) {
    let s = server_configured(db, &DovecotOptions::default(), quick(2), |_| {}).await;
    let receiver = Receiver::start().await;
    receiver.fail_all(true);
    let token = s.user("alice@example.org").await;
    let hook = webhook(&s, &token, &receiver.url, json!(["message.new"])).await;
    let id = hook["id"].as_str().unwrap().to_string();
    s.append("alice", "first");
    let account = s.add_account(&token, "alice").await;
    s.wait_listed(&token, &account, 1).await;
    receiver.wait_until(Duration::from_secs(20), "3 tries", |got| got.len() >= 3).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let w = loop {
        let (_, w) = s.call("GET", &format!("/v1/webhooks/{id}"), Some(&token), None).await;
        if w["state"] == "paused" {
            break w;
        }
        assert!(std::time::Instant::now() < deadline, "never paused: {w}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(w["paused_reason"].as_str().unwrap().contains("3 attempts"), "{w}");
    // Paused: nothing more is tried, and new events are held, not sent.
    s.append("alice", "second");
    s.wait_listed(&token, &account, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.received().len(), 3, "retried past its budget, or sent while paused");
    let (_, list) = s.call("GET", &format!("/v1/webhooks/{id}/deliveries"), Some(&token), None).await;
    let mut states: Vec<&str> =
        list["deliveries"].as_array().unwrap().iter().map(|d| d["state"].as_str().unwrap()).collect();
    states.sort();
    assert_eq!(states, ["failed", "held"], "{list}");
    // The receiver is back; resuming sends both.
    receiver.fail_all(false);
    let (st, w) = s.call("POST", &format!("/v1/webhooks/{id}/resume"), Some(&token), None).await;
    assert_eq!((st, w["state"].as_str()), (StatusCode::OK, Some("active")), "{w}");
    let got = receiver
        .wait_until(Duration::from_secs(20), "both events", |got| {
            got.iter().filter(|r| r.answered == Some(204)).count() == 2
        })
        .await;
    let mut uids: Vec<i64> =
        got.iter().filter(|r| r.answered == Some(204)).map(|r| r.json["data"]["uid"].as_i64().unwrap()).collect();
    uids.sort();
    assert_eq!(uids, [1, 2]);
}

async fn webhook_routes_check_urls_events_and_owners(db: TestDb) {
    // Receivers at private addresses are refused, as IMAP hosts are.
    let s = server_configured(db, &DovecotOptions::default(), config(), |a| a.imap.allow_private = false).await;
    let alice = s.user("alice@example.org").await;
    let bob = s.user("bob@example.org").await;
    for (url, events, field, says) in [
        ("http://127.0.0.1:9/hook", json!(["message.new"]), "url", "not a public address"),
        ("http://localhost:9/hook", json!(["message.new"]), "url", "not a public address"),
        ("http://[::1]/hook", json!(["message.new"]), "url", "not a public address"),
        ("http://10.0.0.1/hook", json!(["message.new"]), "url", "not a public address"),
        ("ftp://example.com/", json!(["message.new"]), "url", "http"),
        ("https://u:p@example.com/", json!(["message.new"]), "url", "password"),
        ("nonsense", json!(["message.new"]), "url", "not a URL"),
        ("https://example.com/", json!([]), "events", "at least one"),
        ("https://example.com/", json!(["message.exploded"]), "events", "message.exploded"),
    ] {
        let (st, v) = s.call("POST", "/v1/webhooks", Some(&alice), Some(json!({"url": url, "events": events}))).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{url} {events}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field) && message.contains(says), "{url} {events}: {v}");
    }
    let (st, v) = s
        .call("POST", "/v1/webhooks", None, Some(json!({"url": "https://example.com/", "events": ["message.new"]})))
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");

    // A public receiver is taken (nothing is sent to it: no mail is synced here).
    let hook = webhook(&s, &alice, "https://1.2.3.4/hooks/mail", json!(["message.new", "message.new"])).await;
    assert_eq!(hook["events"], json!(["message.new"]), "{hook}");
    assert_eq!(hook["state"], "active");
    let id = hook["id"].as_str().unwrap();
    let (_, list) = s.call("GET", "/v1/webhooks", Some(&alice), None).await;
    assert_eq!(list["webhooks"].as_array().unwrap().len(), 1, "{list}");
    assert!(list["webhooks"][0].get("secret").is_none(), "the secret is shown once: {list}");

    // Bob sees none of it.
    let (_, list) = s.call("GET", "/v1/webhooks", Some(&bob), None).await;
    assert_eq!(list["webhooks"], json!([]), "{list}");
    for (method, path) in [
        ("GET", format!("/v1/webhooks/{id}")),
        ("DELETE", format!("/v1/webhooks/{id}")),
        ("POST", format!("/v1/webhooks/{id}/resume")),
        ("GET", format!("/v1/webhooks/{id}/deliveries")),
    ] {
        let (st, v) = s.call(method, &path, Some(&bob), None).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{method} {path}: {v}");
    }
    let (st, v) = s.call("GET", &format!("/v1/webhooks/{id}/deliveries?limit=0"), Some(&alice), None).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = s.call("GET", &format!("/v1/webhooks/{id}/deliveries?since=1"), Some(&alice), None).await;
    assert!(st == StatusCode::BAD_REQUEST && v["error"]["message"].as_str().unwrap().starts_with("since"), "{v}");

    let (st, _) = s.call("DELETE", &format!("/v1/webhooks/{id}"), Some(&alice), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = s.call("GET", &format!("/v1/webhooks/{id}"), Some(&alice), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}
