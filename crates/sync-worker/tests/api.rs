//! The API end to end: a real HTTP server and a real worker in this process
//! (exactly what `sync-worker serve` runs), a real WebSocket client, a real
//! private Dovecot, and SQLite or Postgres (a fresh database per test).
//! A missing Dovecot or Postgres fails these tests; they never skip.

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use leasehold_core::LeaseKey;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::Row;
use sync_worker::both_databases;
use sync_worker::storage::{AccountAuth, NewAccount, Security, Storage};
use sync_worker::testing::TestDb;
use tokio_tungstenite::tungstenite::Message;

mod api_harness;
use api_harness::*;

both_databases!(
    async:
    sign_up_log_in_add_an_account_and_see_its_mail,
    message_new_is_pushed_within_2s_of_an_append,
    websocket_presence_promotes_a_warm_account_to_hot_within_5s,
    account_status_is_pushed_when_the_tier_or_the_last_error_changes,
    two_users_are_isolated,
    every_auth_failure_is_401,
    the_message_list_answers_each_failure_as_the_other_routes_do,
    bad_input_is_a_400_naming_the_field,
    no_plain_text_password_in_any_column,
    deleting_an_account_stops_its_sync_and_removes_its_data,
    accounts_may_not_point_at_private_addresses_in_any_spelling,
    closed_silent_and_unknown_hosts_give_one_answer,
    a_changed_password_is_updated_once_it_works_and_the_mail_stays,
    one_mailbox_is_one_account_per_user_and_the_check_follows_the_login,
);

async fn sign_up_log_in_add_an_account_and_see_its_mail(db: TestDb) {
    let s = server(db, |_| {}).await;
    for i in 0..3 {
        s.append("alice", &format!("hello-{i}"));
    }
    let token = s.user("alice@example.org").await;
    // The IMAP login is checked first: a wrong password saves nothing and
    // answers with the server's words.
    let bad = json!({"host": s.dovecot.host(), "port": s.dovecot.port(), "security": "plain",
                     "username": "alice", "password": "wrong"});
    let (st, v) = s.call("POST", "/v1/accounts", Some(&token), Some(bad)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "imap_login_refused");
    assert!(v["error"]["message"].as_str().unwrap().contains("AUTHENTICATIONFAILED"), "{v}");
    let (_, list) = s.call("GET", "/v1/accounts", Some(&token), None).await;
    assert_eq!(list, json!([]));

    let id = s.add_account(&token, "alice").await;
    let (st, v) = s
        .call(
            "POST",
            "/v1/accounts",
            Some(&token),
            Some(json!({"host": s.dovecot.host(),
        "port": s.dovecot.port(), "security": "plain", "username": "alice", "password": IMAP_PASSWORD})),
        )
        .await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::CONFLICT, json!("conflict")), "{v}");

    let listed = s.wait_listed(&token, &id, 3).await;
    let subjects: Vec<&str> = listed.iter().map(|m| m["subject"].as_str().unwrap()).collect();
    assert_eq!(subjects, ["hello-2", "hello-1", "hello-0"], "newest first");
    let m = &listed[0];
    assert_eq!(m["from"], "Carol <carol@example.org>");
    assert!(m["to"].as_str().unwrap().contains("alice@example.org"), "{m}");
    assert!(m["size"].as_i64().unwrap() > 0 && m["date"].as_i64().unwrap() > 0, "{m}");
    assert!(m["preview"].as_str().unwrap().contains("Hello, hello-2"), "{m}");
    assert!(m["flags"].is_array());

    // Pages of 2 with a cursor: no repeat, no gap, even with new mail in between.
    let (_, p1) = s.call("GET", &format!("/v1/accounts/{id}/messages?folder=INBOX&limit=2"), Some(&token), None).await;
    assert_eq!(p1["messages"].as_array().unwrap().len(), 2);
    let cursor = p1["next_cursor"].as_str().expect("next_cursor").to_string();
    s.append("alice", "hello-3");
    s.wait_listed(&token, &id, 4).await;
    let (_, p2) =
        s.call("GET", &format!("/v1/accounts/{id}/messages?limit=2&cursor={cursor}"), Some(&token), None).await;
    let p2: Vec<&str> = p2["messages"].as_array().unwrap().iter().map(|m| m["subject"].as_str().unwrap()).collect();
    assert_eq!(p2, ["hello-0"]);

    let mid = listed[1]["id"].as_str().unwrap();
    let (st, one) = s.call("GET", &format!("/v1/accounts/{id}/messages/{mid}"), Some(&token), None).await;
    assert_eq!(st, StatusCode::OK, "{one}");
    assert_eq!(one["subject"], "hello-1");
    assert_eq!(one["message_id"], "hello-1@example.org");
    assert!(one["header"].as_str().unwrap().contains("Subject: hello-1"));
    let (st, _) = s.call("GET", &format!("/v1/accounts/{id}/messages/bm9wZQ"), Some(&token), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    // The account's folders and GET .../folders agree; the first poll
    // stores the folders one by one, so both are read until it is over.
    let deadline = Instant::now() + Duration::from_secs(20);
    let a = loop {
        let (st, a) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
        assert_eq!(st, StatusCode::OK, "{a}");
        let (_, folders) = s.call("GET", &format!("/v1/accounts/{id}/folders"), Some(&token), None).await;
        if folders == a["folders"] {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "the account's folders {} and /folders {folders} never agreed",
            a["folders"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(a["owner"], s.worker);
    assert!(a["tier"].is_string() && a["last_sync_at"].as_i64().unwrap() > 0, "{a}");
    assert_eq!(a["last_error"], Value::Null);
    let inbox = a["folders"].as_array().unwrap().iter().find(|f| f["name"] == "INBOX").expect("INBOX").clone();
    assert_eq!(inbox["messages"], 4);
    let (_, list) = s.call("GET", "/v1/accounts", Some(&token), None).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["username"], "alice");
}

async fn message_new_is_pushed_within_2s_of_an_append(db: TestDb) {
    let s = server(db, |_| {}).await;
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    let mut ws = s.ws(&token).await;
    s.wait_tier(&token, &id, "hot", Duration::from_secs(10)).await;
    // The first sync and the IDLE are under way once INBOX is listed (empty).
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", &format!("/v1/accounts/{id}/messages"), Some(&token), None).await.0 != StatusCode::OK {
        assert!(Instant::now() < deadline, "INBOX never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..3 {
        let subject = format!("push-{i}");
        let t0 = Instant::now();
        s.append("alice", &subject);
        let ev = wait_new(&mut ws, &subject, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| panic!("no message.new for {subject} within 2 s"));
        eprintln!("{subject}: pushed {:?} after the APPEND", t0.elapsed());
        assert_eq!(ev["account"], id.as_str());
        assert_eq!(ev["folder"], "INBOX");
        assert_eq!(ev["message"]["from"], "Carol <carol@example.org>");
        let (st, m) = s
            .call("GET", &format!("/v1/accounts/{id}/messages/{}", ev["id"].as_str().unwrap()), Some(&token), None)
            .await;
        assert_eq!((st, m["subject"].clone()), (StatusCode::OK, json!(subject)));
    }
    // Another client flags one message and expunges another: both are pushed.
    let ids = s.wait_listed(&token, &id, 3).await;
    let id_of = |subject: &str| ids.iter().find(|m| m["subject"] == subject).unwrap()["id"].clone();
    tokio::task::block_in_place(|| s.dovecot.add_flags("alice", "INBOX", "\\Flagged", &["subject", "push-1"])).unwrap();
    let ev = wait_kind(&mut ws, "message.updated", Duration::from_secs(10)).await.expect("message.updated");
    assert_eq!(ev["id"], id_of("push-1"));
    assert!(ev["message"]["flags"].as_array().unwrap().contains(&json!("\\Flagged")), "{ev}");
    tokio::task::block_in_place(|| s.dovecot.expunge("alice", "INBOX", &["subject", "push-0"])).unwrap();
    let ev = wait_kind(&mut ws, "message.deleted", Duration::from_secs(10)).await.expect("message.deleted");
    assert_eq!(ev["id"], id_of("push-0"));
    assert!(ev.get("message").is_none(), "{ev}");
}

/// The first event of type `kind`.
async fn websocket_presence_promotes_a_warm_account_to_hot_within_5s(db: TestDb) {
    // Presence lasts 2 s here, so the login's wears off and the account
    // settles warm: its newest mail is a day old (neither recent enough for
    // hot nor old enough for cold).
    let s = server(db, |a| a.presence_grace = Duration::from_secs(2)).await;
    let day_ago = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 - 86_400;
    tokio::task::block_in_place(|| s.dovecot.append_with("alice", "INBOX", &[], Some(day_ago), &mail("old")))
        .expect("APPEND");
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    s.wait_tier(&token, &id, "hot", Duration::from_secs(10)).await;
    s.wait_tier(&token, &id, "warm", Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, a) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
    assert_eq!(a["tier"], "warm", "{a}");
    let mut ws = s.ws(&token).await;
    let took = s.wait_tier(&token, &id, "hot", Duration::from_secs(5)).await;
    eprintln!("hot {took:?} after the WebSocket connected");
    // A text ping keeps it so and is answered.
    ws.send(Message::Text(r#"{"type":"ping"}"#.into())).await.unwrap();
    wait_kind(&mut ws, "pong", Duration::from_secs(2)).await.expect("pong");
}

/// The first `account.status` of `account` that `pred` accepts.
async fn wait_status(ws: &mut Ws, account: &str, within: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
    let deadline = Instant::now() + within;
    while let Some(ev) = next_json(ws, deadline.saturating_duration_since(Instant::now())).await {
        if ev["type"] == "account.status" && ev["id"] == account && pred(&ev) {
            return Some(ev);
        }
    }
    None
}

async fn account_status_is_pushed_when_the_tier_or_the_last_error_changes(db: TestDb) {
    // As in the presence test: the account settles warm once the login's presence wears off.
    let s = server(db, |a| a.presence_grace = Duration::from_secs(2)).await;
    let day_ago = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 - 86_400;
    tokio::task::block_in_place(|| s.dovecot.append_with("alice", "INBOX", &[], Some(day_ago), &mail("old")))
        .expect("APPEND");
    let token = s.user("alice@example.org").await;
    // Another user's account must not show up on alice's socket.
    let bob = s.user("bob@example.org").await;
    let bobs = s.add_account(&bob, "bob").await;
    let id = s.add_account(&token, "alice").await;
    // Claimed warm, hot while the login's presence lasts, then warm.
    s.wait_tier(&token, &id, "hot", Duration::from_secs(10)).await;
    s.wait_tier(&token, &id, "warm", Duration::from_secs(15)).await;

    // Connecting is presence: warm -> hot, pushed as account.status.
    let mut ws = s.ws(&token).await;
    let hot = wait_status(&mut ws, &id, Duration::from_secs(5), |e| e["tier"] == "hot")
        .await
        .expect("an account.status with tier hot within 5 s of connecting");
    let (_, got) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
    assert_eq!(hot["account"], id.as_str(), "{hot}");
    let mut fields: Vec<&String> =
        hot.as_object().unwrap().keys().filter(|k| !["type", "account", "seq"].contains(&k.as_str())).collect();
    fields.sort();
    let mut expected: Vec<&String> = got.as_object().unwrap().keys().collect();
    expected.sort();
    assert_eq!(fields, expected, "account.status has the fields of GET /v1/accounts/{{id}}: {hot} vs {got}");
    assert_eq!(hot["owner"], s.worker, "{hot}");
    assert!(hot["last_sync_at"].as_i64().is_some(), "{hot}");
    assert!(hot["last_error"].is_null(), "{hot}");
    assert_eq!(hot["folders"].as_array().unwrap().iter().find(|f| f["name"] == "INBOX").unwrap()["messages"], 1);

    // A password changed on the server: the next login fails, pushed as last_error.
    tokio::task::block_in_place(|| {
        s.dovecot.set_password("alice", "changed-Elsewhere-1").expect("set password");
        s.dovecot.kill_imap_processes("alice").expect("kill alice's IMAP sessions");
    });
    // (The killed sessions may first fail a command in flight: a broken pipe.)
    let refused = |e: &Value| {
        e["last_error"]
            .as_str()
            .is_some_and(|t| t.to_lowercase().contains("auth") || t.to_lowercase().contains("login"))
    };
    let failed = wait_status(&mut ws, &id, Duration::from_secs(20), refused)
        .await
        .expect("an account.status with the refused login as last_error within 20 s of the password change");
    eprintln!("last_error pushed: {}", failed["last_error"]);
    let (_, got) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
    assert_eq!(got["last_error"], failed["last_error"], "{got}");

    // Never bob's.
    while let Some(ev) = next_json(&mut ws, Duration::from_millis(500)).await {
        assert_ne!(ev["id"], bobs, "{ev}");
        assert_ne!(ev["account"], bobs, "{ev}");
    }
}

async fn two_users_are_isolated(db: TestDb) {
    let s = server(db, |_| {}).await;
    let alice = s.user("alice@example.org").await;
    let bob = s.user("bob@example.org").await;
    let a_id = s.add_account(&alice, "alice").await;
    let b_id = s.add_account(&bob, "bob").await;
    let mut a_ws = s.ws(&alice).await;
    let mut b_ws = s.ws(&bob).await;
    s.append("alice", "for-alice");
    s.wait_listed(&alice, &a_id, 1).await;
    let ev = wait_new(&mut a_ws, "for-alice", Duration::from_secs(10)).await.expect("alice's push");
    let mid = ev["id"].as_str().unwrap().to_string();

    let message = format!("/v1/accounts/{a_id}/messages/{mid}");
    for (method, path, body) in [
        ("GET", format!("/v1/accounts/{a_id}"), None),
        ("GET", format!("/v1/accounts/{a_id}/folders"), None),
        ("GET", format!("/v1/accounts/{a_id}/messages"), None),
        ("GET", format!("/v1/accounts/{a_id}/messages?q=alice"), None),
        ("GET", message.clone(), None),
        ("GET", format!("{message}/raw"), None),
        ("GET", format!("{message}/attachments/1"), None),
        ("PATCH", message.clone(), Some(json!({"seen": true}))),
        ("PATCH", format!("/v1/accounts/{a_id}"), Some(json!({"password": "taken-over"}))),
        ("POST", format!("{message}/move"), Some(json!({"folder": "Trash"}))),
        ("DELETE", message.clone(), None),
        ("POST", format!("/v1/accounts/{a_id}/messages/actions"), Some(json!({"ids": [mid], "action": "delete"}))),
        ("DELETE", format!("/v1/accounts/{a_id}"), None),
    ] {
        let (st, v) = s.call(method, &path, Some(&bob), body).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], "not_found");
    }
    let (_, bobs) = s.call("GET", "/v1/accounts", Some(&bob), None).await;
    let ids: Vec<&str> = bobs.as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [b_id.as_str()]);
    // Alice's account and mail survived bob's tries, and bob's socket saw none of her mail.
    s.wait_listed(&alice, &a_id, 1).await;
    let flags = tokio::task::block_in_place(|| {
        s.dovecot.doveadm(&["fetch", "-u", "alice", "flags", "mailbox", "INBOX", "all"])
    })
    .expect("doveadm");
    assert!(!flags.contains("\\Seen"), "bob's PATCH reached alice's mail: {flags}");
    s.append("bob", "for-bob");
    let ev = wait_new(&mut b_ws, "for-bob", Duration::from_secs(10)).await.expect("bob's push");
    assert_eq!(ev["account"], b_id.as_str());
    while let Some(ev) = next_json(&mut b_ws, Duration::from_millis(300)).await {
        assert_eq!(ev["account"], b_id.as_str(), "bob got {ev}");
    }
    while let Some(ev) = next_json(&mut a_ws, Duration::from_millis(300)).await {
        assert_eq!(ev["account"], a_id.as_str(), "alice got {ev}");
    }
}

async fn every_auth_failure_is_401(db: TestDb) {
    let s = server(db, |a| a.login.free = 2).await;
    let token = s.user("alice@example.org").await;
    let unauthorized = |st: StatusCode, v: &Value, what: &str| {
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{what}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized", "{what}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 5, "{what}: {v}");
    };
    let (st, v) = s.call("GET", "/v1/accounts", None, None).await;
    unauthorized(st, &v, "no token");
    let (st, v) = s.call("GET", "/v1/accounts", Some("not-a-token"), None).await;
    unauthorized(st, &v, "wrong token");
    let resp = s
        .http
        .get(format!("{}/v1/accounts", s.base))
        .header("authorization", format!("Basic {token}"))
        .send()
        .await
        .unwrap();
    let st = resp.status();
    unauthorized(st, &resp.json().await.unwrap(), "wrong scheme");
    // An expired session, stored as the API stores them.
    let (old, old_hash) = sync_worker::api::auth::new_token();
    let (user, _) = s.storage.password_hash(&"alice@example.org".parse().unwrap()).await.unwrap().unwrap();
    s.storage.add_session(&old_hash, &user, 1).await.unwrap();
    let (st, v) = s.call("GET", "/v1/accounts", Some(&old), None).await;
    unauthorized(st, &v, "expired token");
    // The WebSocket refuses them all: a bad header or a token in the URL
    // before upgrading, ...
    let addr = s.running().addr();
    for (url, header) in [
        (format!("ws://{addr}/v1/ws"), Some("Bearer nope".to_string())),
        (format!("ws://{addr}/v1/ws"), Some(format!("Bearer {old}"))),
        (format!("ws://{addr}/v1/ws?token=nope"), None),
        (format!("ws://{addr}/v1/ws?token={token}"), None),
    ] {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut req = url.as_str().into_client_request().unwrap();
        if let Some(h) = &header {
            req.headers_mut().insert("authorization", h.parse().unwrap());
        }
        match tokio_tungstenite::connect_async(req).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401, "{url} {header:?}"),
            other => panic!("{url}: {:?}", other.map(|_| ())),
        }
    }
    // ... and a first message that is not a good login closes with 4001.
    for first in
        [json!({"type": "auth", "token": "nope"}), json!({"type": "auth", "token": old}), json!({"type": "ping"})]
    {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws")).await.unwrap();
        ws.send(Message::Text(first.to_string().into())).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
            Ok(Some(Ok(Message::Close(Some(f))))) => assert_eq!(u16::from(f.code), 4001, "{first}: {f:?}"),
            other => panic!("{first}: {other:?}"),
        }
    }
    // Logout ends the token.
    let (st, _) = s.call("POST", "/v1/logout", Some(&token), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, v) = s.call("GET", "/v1/accounts", Some(&token), None).await;
    unauthorized(st, &v, "after logout");
    // A wrong password, an unknown user: the same 401; then the address is limited.
    for (email, pw) in [("alice@example.org", "wrong-password"), ("nobody@example.org", USER_PASSWORD)] {
        let (st, v) = s.call("POST", "/v1/login", None, Some(json!({"email": email, "password": pw}))).await;
        assert_eq!((st, v["error"]["code"].clone()), (StatusCode::UNAUTHORIZED, json!("bad_login")), "{v}");
    }
    for _ in 0..2 {
        s.call("POST", "/v1/login", None, Some(json!({"email": "alice@example.org", "password": "wrong-password"})))
            .await;
    }
    let (st, v) =
        s.call("POST", "/v1/login", None, Some(json!({"email": "alice@example.org", "password": USER_PASSWORD}))).await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::TOO_MANY_REQUESTS, json!("rate_limited")), "{v}");
    // Only that pair of address and client waits: the owner, from another
    // client address, logs in at once with the right password.
    let elsewhere = reqwest::Client::builder().local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap()).build();
    let resp = elsewhere
        .unwrap()
        .post(format!("{}/v1/login", s.base))
        .json(&json!({"email": "alice@example.org", "password": USER_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{:?}", resp.text().await);
}

/// The message list checks the session, the owner and the folder in its own
/// query (the hot path); every way that can fail still gets its own answer,
/// on an account that has mail to show.
async fn the_message_list_answers_each_failure_as_the_other_routes_do(db: TestDb) {
    let s = server(db, |_| {}).await;
    let alice = s.user("alice@example.org").await;
    let bob = s.user("bob@example.org").await;
    let id = s.add_account(&alice, "alice").await;
    s.append("alice", "listed");
    s.wait_listed(&alice, &id, 1).await;
    let list = |query: &str| format!("/v1/accounts/{id}/messages{query}");
    let code = |v: &Value| v["error"]["code"].as_str().unwrap_or_default().to_string();
    let field = |v: &Value| v["error"]["message"].as_str().unwrap_or_default().split(':').next().unwrap().to_string();

    let (old, old_hash) = sync_worker::api::auth::new_token();
    let (user, _) = s.storage.password_hash(&"alice@example.org".parse().unwrap()).await.unwrap().unwrap();
    s.storage.add_session(&old_hash, &user, 1).await.unwrap();
    for (token, what) in [(None, "no token"), (Some("not-a-token"), "wrong token"), (Some(old.as_str()), "expired")] {
        let (st, v) = s.call("GET", &list(""), token, None).await;
        assert_eq!((st, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized".into()), "{what}: {v}");
        // 401 before 400: a bad query says nothing to a caller without a session.
        let (st, v) = s.call("GET", &list("?limit=0"), token, None).await;
        assert_eq!((st, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized".into()), "{what}, bad query: {v}");
    }
    let (st, v) = s.call("GET", &list("?limit=0"), Some(&alice), None).await;
    assert_eq!((st, field(&v)), (StatusCode::BAD_REQUEST, "limit".into()), "{v}");
    let (st, v) = s.call("GET", &list(""), Some(&bob), None).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found".into()), "bob: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("account"), "{v}");
    let (st, v) = s.call("GET", &list("?folder=Nowhere"), Some(&alice), None).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found".into()), "unknown folder: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("folder"), "{v}");

    // A page of one is full, so it has a cursor; the page after it is empty.
    let (st, page) = s.call("GET", &list("?limit=1"), Some(&alice), None).await;
    assert_eq!(st, StatusCode::OK, "{page}");
    let cursor = page["next_cursor"].as_str().expect("a full page has a cursor").to_string();
    let (st, rest) = s.call("GET", &list(&format!("?cursor={cursor}")), Some(&alice), None).await;
    assert_eq!((st, rest), (StatusCode::OK, json!({"messages": [], "next_cursor": null})));
    // A cursor made under another UIDVALIDITY (the folder was reset): 400, whether a page would follow or not.
    let uid = page["messages"][0]["uid"].as_u64().unwrap() as u32;
    let (st, folders) = s.call("GET", &format!("/v1/accounts/{id}/folders"), Some(&alice), None).await;
    assert_eq!(st, StatusCode::OK, "{folders}");
    let inbox = folders.as_array().unwrap().iter().find(|f| f["name"] == "INBOX").expect("INBOX").clone();
    let uidvalidity = inbox["uidvalidity"].as_u64().expect("INBOX has a UIDVALIDITY") as u32;
    for before in [uid + 1, uid] {
        let stale = sync_worker::api::accounts::encode_cursor(uidvalidity.wrapping_add(1), before);
        let (st, v) = s.call("GET", &list(&format!("?cursor={stale}")), Some(&alice), None).await;
        assert_eq!((st, field(&v)), (StatusCode::BAD_REQUEST, "cursor".into()), "{v}");
    }
    // Logged out: the token no longer lists anything.
    let (st, _) = s.call("POST", "/v1/logout", Some(&alice), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, v) = s.call("GET", &list(""), Some(&alice), None).await;
    assert_eq!((st, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized".into()), "after logout: {v}");
}

async fn bad_input_is_a_400_naming_the_field(db: TestDb) {
    let s = server(db, |_| {}).await;
    let token = s.user("alice@example.org").await;
    let field = |v: &Value| v["error"]["message"].as_str().unwrap().split(':').next().unwrap().to_string();
    for (path, body, named) in [
        ("/v1/users", r#"{"email":"x@y.org""#, "body"),
        ("/v1/users", r#"{"email":"x@y.org"}"#, "password"),
        ("/v1/users", r#"{"email":"not an address","password":"long enough"}"#, "email"),
        ("/v1/users", r#"{"email":"x@y.org","password":"short"}"#, "password"),
        ("/v1/users", r#"{"email":"x@y.org","password":"long enough","admin":true}"#, "admin"),
        ("/v1/login", r#"{"email":7,"password":"x"}"#, "email"),
        ("/v1/accounts", r#"{"host":"h","port":"143","security":"plain","username":"u","password":"p"}"#, "port"),
        ("/v1/accounts", r#"{"host":"h","port":143,"security":"ssl","username":"u","password":"p"}"#, "security"),
        ("/v1/accounts", r#"{"host":"","port":143,"security":"plain","username":"u","password":"p"}"#, "host"),
        ("/v1/accounts", r#"{"host":"h","port":0,"security":"plain","username":"u","password":"p"}"#, "port"),
        ("/v1/accounts", r#"{"host":"h","port":143,"security":"plain","username":"u"}"#, "password"),
        (
            "/v1/accounts",
            r#"{"host":"h","port":143,"security":"plain","username":"u","password":"p","oauth2":{"provider":"google","client_id":"c","refresh_token":"r"}}"#,
            "oauth2",
        ),
        (
            "/v1/accounts",
            r#"{"host":"h","port":143,"security":"plain","username":"u","oauth2":{"client_id":"c","refresh_token":"r"}}"#,
            "oauth2",
        ),
        (
            "/v1/accounts",
            r#"{"host":"h","port":143,"security":"plain","username":"u","oauth2":{"token_url":"http://id.example.com/t","client_id":"c","refresh_token":"r"}}"#,
            "oauth2",
        ),
        (
            "/v1/accounts",
            r#"{"host":"h","port":143,"security":"plain","username":"u","oauth2":{"provider":"yahoo","client_id":"c","refresh_token":"r"}}"#,
            "oauth2.provider",
        ),
    ] {
        let (st, v) = s.raw("POST", path, Some(&token), body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        assert_eq!(v["error"]["code"], "bad_request", "{v}");
        assert_eq!(field(&v), named, "{path} {body}: {v}");
    }
    let id = s.add_account(&token, "alice").await;
    for (query, named) in [("limit=0", "limit"), ("limit=x", "limit"), ("cursor=zz", "cursor"), ("order=asc", "order")]
    {
        let (st, v) = s.call("GET", &format!("/v1/accounts/{id}/messages?{query}"), Some(&token), None).await;
        assert_eq!((st, field(&v)), (StatusCode::BAD_REQUEST, named.to_string()), "{query}: {v}");
    }
    let (st, v) =
        s.call("POST", "/v1/users", None, Some(json!({"email": "ALICE@example.org", "password": "another-pw"}))).await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::CONFLICT, json!("conflict")), "{v}");
    let (st, v) = s.call("GET", "/v1/nothing-here", None, None).await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::NOT_FOUND, json!("not_found")), "{v}");
    let (st, v) = s.call("PUT", "/v1/accounts", Some(&token), None).await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::METHOD_NOT_ALLOWED, json!("method_not_allowed")), "{v}");
}

/// Every value of every column of `table`, as text. Postgres's search
/// column (a `tsvector`, which sqlx's Any driver cannot read) is made from
/// the subject, addresses and preview, which are read.
async fn column_texts(storage: &Storage, table: &str) -> Vec<String> {
    let names_sql = match storage.kind() {
        sync_worker::storage::DbKind::Sqlite => format!("SELECT name FROM pragma_table_info('{table}')"),
        sync_worker::storage::DbKind::Postgres => format!(
            "SELECT column_name::text FROM information_schema.columns WHERE table_schema = current_schema() \
             AND table_name = '{table}' AND data_type <> 'tsvector'"
        ),
    };
    let names: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(names_sql))
        .fetch_all(storage.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(names.len() > 2, "{table} has columns {names:?}");
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {} FROM {table}", names.join(", "))))
        .fetch_all(storage.pool())
        .await
        .unwrap();
    let mut out = Vec::new();
    for r in &rows {
        for i in 0..r.len() {
            if let Ok(Some(t)) = r.try_get::<Option<String>, _>(i) {
                out.push(t);
            } else if let Ok(Some(n)) = r.try_get::<Option<i64>, _>(i) {
                out.push(n.to_string());
            }
        }
    }
    out
}

async fn no_plain_text_password_in_any_column(db: TestDb) {
    let s = server(db, |_| {}).await;
    s.append("alice", "secret-check");
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    s.wait_listed(&token, &id, 1).await;
    let mut texts = 0;
    for table in ["users", "accounts", "folders", "messages", "sessions"] {
        for t in column_texts(&s.storage, table).await {
            texts += 1;
            for secret in [IMAP_PASSWORD, USER_PASSWORD, token.as_str()] {
                assert!(!t.contains(secret), "{table} holds {secret:?} in plain text: {t:?}");
            }
        }
    }
    assert!(texts > 20, "the scan read only {texts} values");
    // What is stored decrypts to the password, and the hash is argon2id.
    let key = LeaseKey::new(&id).unwrap();
    assert_eq!(s.storage.credentials(&key).await.unwrap().auth, AccountAuth::Password(IMAP_PASSWORD.into()));
    let (_, hash) = s.storage.password_hash(&"alice@example.org".parse().unwrap()).await.unwrap().unwrap();
    assert!(hash.unwrap().starts_with("$argon2id$"));
}

async fn count(storage: &Storage, table: &str, account: &str) -> i64 {
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table} WHERE account_id = $1")))
        .bind(account)
        .fetch_one(storage.pool())
        .await
        .unwrap()
        .get(0)
}

async fn deleting_an_account_stops_its_sync_and_removes_its_data(db: TestDb) {
    let s = server(db, |_| {}).await;
    s.append("alice", "before-delete");
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    s.wait_listed(&token, &id, 1).await;
    let key = LeaseKey::new(&id).unwrap();
    assert!(s.running().coordinator().unwrap().owns(&key));
    assert!(count(&s.storage, "messages", &id).await > 0);

    let (st, v) = s.call("DELETE", &format!("/v1/accounts/{id}"), Some(&token), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{v}");
    let (st, _) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.running().coordinator().unwrap().owns(&key) {
        assert!(Instant::now() < deadline, "the worker still syncs the removed account");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // New mail after the removal is never stored.
    s.append("alice", "after-delete");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for table in ["messages", "folders"] {
        assert_eq!(count(&s.storage, table, &id).await, 0, "{table} rows of the removed account");
    }
    let n: i64 = sqlx::query("SELECT COUNT(*) FROM accounts WHERE id = $1")
        .bind(&id)
        .fetch_one(s.storage.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    assert!(!s.running().coordinator().unwrap().owns(&key));
}

async fn accounts_may_not_point_at_private_addresses_in_any_spelling(db: TestDb) {
    // What an operator runs without IMAP_ALLOW_PRIVATE.
    let s = server(db, |settings| settings.imap.allow_private = false).await;
    let token = s.user("alice@example.org").await;
    let port = s.dovecot.port();
    // The Dovecot is right there on loopback, with a valid login: only the
    // address rule can refuse these, whichever way the address is written.
    for host in [
        "127.0.0.1",
        "127.1",
        "0x7f000001",
        "2130706433",
        "localhost",
        "::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "10.0.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "fe80::1",
        "fd00::1",
    ] {
        let body = json!({"host": host, "port": port, "security": "plain",
                          "username": "alice", "password": IMAP_PASSWORD});
        let (st, v) = s.call("POST", "/v1/accounts", Some(&token), Some(body)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{host}: {v}");
        assert_eq!(v["error"]["code"], "imap_unusable", "{host}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("may not point at") && message.contains("IMAP_ALLOW_PRIVATE"), "{host}: {v}");
    }
    let (_, list) = s.call("GET", "/v1/accounts", Some(&token), None).await;
    assert_eq!(list, json!([]));

    // An account the operator added (the CLI is trusted) cannot be moved to
    // a private address through the API either, and a refused move changes
    // nothing.
    let email: sync_worker::storage::Email = "alice@example.org".parse().unwrap();
    let user = s.storage.user_by_email(&email).await.unwrap().expect("alice").id;
    let new = NewAccount {
        user,
        host: "imap.example.org".into(),
        port: 993,
        security: Security::Tls,
        username: "alice".into(),
        auth: AccountAuth::Password(IMAP_PASSWORD.into()),
    };
    let id = s.storage.add_account(&new).await.expect("add the operator's account");
    for host in ["127.0.0.1", "0x7f000001", "::1", "10.0.0.1", "169.254.169.254"] {
        let body = json!({"host": host, "port": port, "security": "plain"});
        let (st, v) = s.call("PATCH", &format!("/v1/accounts/{id}"), Some(&token), Some(body)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "PATCH to {host}: {v}");
        assert_eq!(v["error"]["code"], "imap_unusable", "PATCH to {host}: {v}");
    }
    let (_, a) = s.call("GET", &format!("/v1/accounts/{id}"), Some(&token), None).await;
    assert_eq!((a["host"].as_str(), a["port"].as_u64()), (Some("imap.example.org"), Some(993)), "{a}");
}

async fn closed_silent_and_unknown_hosts_give_one_answer(db: TestDb) {
    let s = server(db, |settings| settings.imap.connect_timeout = Duration::from_secs(1)).await;
    let token = s.user("alice@example.org").await;
    // A closed port, a port that accepts and never greets, an unknown host.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let mut answers = Vec::new();
    for (host, port) in [("127.0.0.1", closed), ("127.0.0.1", silent_port), ("no-such-host.invalid", 993)] {
        let body = json!({"host": host, "port": port, "security": "plain",
                          "username": "alice", "password": IMAP_PASSWORD});
        let (st, v) = s.call("POST", "/v1/accounts", Some(&token), Some(body)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{host}:{port}: {v}");
        assert_eq!(v["error"]["code"], "imap_unreachable", "{host}:{port}: {v}");
        let message = v["error"]["message"].as_str().unwrap().replace(&format!("{host}:{port}"), "HOST");
        answers.push(message);
    }
    drop(silent);
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:#?}");
    for word in ["refused", "timed out", "os error", "lookup"] {
        assert!(!answers[0].contains(word), "{}", answers[0]);
    }
}

/// The provider changed the password: `PATCH /v1/accounts/{id}` checks the
/// new one first (a wrong one changes nothing), then keeps the synced mail
/// and syncs on with it.
async fn a_changed_password_is_updated_once_it_works_and_the_mail_stays(db: TestDb) {
    let s = server(db, |_| {}).await;
    let token = s.user("alice@example.org").await;
    let id = s.add_account(&token, "alice").await;
    s.append("alice", "before");
    s.wait_listed(&token, &id, 1).await;
    tokio::task::block_in_place(|| s.dovecot.set_password("alice", "changed-pw")).expect("set the password");
    let path = format!("/v1/accounts/{id}");
    for (body, field) in [
        (json!({}), "host"),
        (json!({"password": ""}), "password"),
        (json!({"port": 0}), "port"),
        (json!({"host": " "}), "host"),
    ] {
        let (st, v) = s.call("PATCH", &path, Some(&token), Some(body.clone())).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["error"]["code"], "bad_request", "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().starts_with(&format!("{field}:")), "{body}: {v}");
    }
    let (st, v) = s.call("PATCH", &path, Some(&token), Some(json!({"password": "still-wrong"}))).await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("imap_login_refused")), "{v}");
    let (st, v) = s.call("PATCH", &path, Some(&token), Some(json!({"password": "changed-pw"}))).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["id"].as_str(), v["username"].as_str(), v["last_error"].clone()),
        (Some(id.as_str()), Some("alice"), json!(null)),
        "{v}"
    );
    // The mail synced with the old password is still there, and new mail comes with the new one.
    s.append("alice", "after");
    let listed = s.wait_listed(&token, &id, 2).await;
    let subjects: Vec<&str> = listed.iter().map(|m| m["subject"].as_str().unwrap()).collect();
    assert_eq!(subjects, ["after", "before"]);
}

/// The same mailbox through `localhost`, `LOCALHOST` and `127.0.0.1`, or as
/// `ALICE` (Dovecot folds user names), is one account of its user. Another
/// user without the password gets the server's refusal, never a conflict,
/// and with the password may sync the mailbox too.
async fn one_mailbox_is_one_account_per_user_and_the_check_follows_the_login(db: TestDb) {
    let s = server(db, |_| {}).await;
    let (alice, bob) = (s.user("alice@example.org").await, s.user("bob@example.org").await);
    let port = s.dovecot.port();
    let body = |host: &str, user: &str, password: &str| json!({"host": host, "port": port, "security": "plain", "username": user, "password": password});
    let (st, v) = s.call("POST", "/v1/accounts", Some(&alice), Some(body("127.0.0.1", "alice", IMAP_PASSWORD))).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    for (host, user) in [("localhost", "alice"), ("LOCALHOST", "alice"), ("127.0.0.1", "ALICE")] {
        let (st, v) = s.call("POST", "/v1/accounts", Some(&alice), Some(body(host, user, IMAP_PASSWORD))).await;
        assert_eq!((st, v["error"]["code"].clone()), (StatusCode::CONFLICT, json!("conflict")), "{host} {user}: {v}");
    }
    // Without the password the answer is the login's, as for a mailbox nobody added.
    let (st, v) = s.call("POST", "/v1/accounts", Some(&bob), Some(body("127.0.0.1", "alice", "guess"))).await;
    assert_eq!((st, v["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("imap_login_refused")), "{v}");
    let (st2, v2) = s.call("POST", "/v1/accounts", Some(&bob), Some(body("127.0.0.1", "nobody", "guess"))).await;
    assert_eq!((st2, v2["error"]["code"].clone()), (st, v["error"]["code"].clone()), "{v2}");
    // With it, bob has his own account of the same mailbox.
    let (st, v) = s.call("POST", "/v1/accounts", Some(&bob), Some(body("localhost", "alice", IMAP_PASSWORD))).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    for token in [&alice, &bob] {
        let (_, list) = s.call("GET", "/v1/accounts", Some(token), None).await;
        assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    }
}
