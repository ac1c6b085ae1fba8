//! The API's bounds against abuse, end to end on a real server (SQLite: the
//! bounds live above the database): slow and idle connections are cut, the
//! socket, frame, account and sign-up caps hold, sessions end on every
//! socket at once, oversized heads and non-JSON bodies get the error body,
//! and the console carries its security headers.

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sync_worker::storage::DbKind;
use sync_worker::testing::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

mod api_harness;
use api_harness::*;

fn db(name: &str) -> TestDb {
    TestDb::fresh(DbKind::Sqlite, name).unwrap_or_else(|e| panic!("a SQLite test database: {e}"))
}

/// Reads until the server closes the connection (or `within` passes):
/// how long that took, or `None` when it stayed open.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(within.saturating_sub(t0.elapsed()), stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t0.elapsed()),
            Ok(Ok(_)) => continue, // a 408 or similar before the close
        }
    }
}

/// Slowloris: 200 connections that send a request head a few bytes at a
/// time, and 200 that send nothing, are all cut within the header timeout
/// (1 s here) and a little; a normal request still gets through meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_connections_are_cut_after_the_header_timeout() {
    let s = server(db("slowloris"), |a| a.header_timeout = Duration::from_secs(1)).await;
    let addr = s.running().addr();
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        slow.push(c);
    }
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // The slow ones keep trickling header bytes, each well inside any
    // per-read timeout, never finishing the head.
    let trickle = tokio::spawn(async move {
        let mut open = slow;
        let t0 = Instant::now();
        let mut cut = Vec::new();
        while !open.is_empty() && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut still = Vec::new();
            for mut c in open {
                match c.write_all(b"X-Slow: 1\r\n").await {
                    Ok(()) => still.push(c),
                    Err(_) => cut.push(t0.elapsed()),
                }
            }
            // A write can still succeed on a closed socket once: ask the reader too.
            let mut next = Vec::new();
            for mut c in still {
                let mut b = [0u8; 256];
                match tokio::time::timeout(Duration::from_millis(1), c.read(&mut b)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => cut.push(t0.elapsed()),
                    _ => next.push(c),
                }
            }
            open = next;
        }
        (open.len(), cut)
    });
    let (st, _) = s.call("GET", "/healthz", None, None).await;
    assert_eq!(st, StatusCode::OK, "a normal request is served meanwhile");
    for mut c in silent {
        let t = closed_within(&mut c, Duration::from_secs(5)).await;
        assert!(t.is_some(), "a silent connection was still open after 5 s");
    }
    let (still_open, cut) = trickle.await.unwrap();
    assert_eq!(still_open, 0, "slow connections still open after 10 s");
    let slowest = cut.iter().max().unwrap();
    assert!(*slowest < Duration::from_secs(4), "the last slow connection was cut after {slowest:?}");
}

/// A request line over 8 KiB is 414 and a head over 32 KiB is 431, both
/// with the JSON error body; a body that is not JSON is 415.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_non_json_bodies_get_the_error_body() {
    let s = server(db("heads"), |_| {}).await;
    let long = format!("{}/healthz?{}", s.base, "a".repeat(33 * 1024));
    let resp = s.http.get(&long).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::URI_TOO_LONG);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "uri_too_long", "{v}");
    let resp = s.http.get(format!("{}/healthz", s.base)).header("x-big", "b".repeat(40 * 1024)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "headers_too_large", "{v}");
    let mut many = s.http.get(format!("{}/healthz", s.base));
    for i in 0..150 {
        many = many.header(format!("x-h{i}"), "v");
    }
    let resp = many.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("header fields"), "{v}");

    // A cross-site form posts text/plain without a preflight: refused, and
    // nothing is made.
    let body = json!({"email": "eve@example.org", "password": USER_PASSWORD}).to_string();
    for content_type in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let mut req = s.http.post(format!("{}/v1/users", s.base)).body(body.clone());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{content_type:?}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "unsupported_media_type", "{v}");
    }
    let email: sync_worker::storage::Email = "eve@example.org".parse().unwrap();
    assert!(s.storage.user_by_email(&email).await.unwrap().is_none());
}

/// The console may run only its own script and style, never be framed, and
/// every answer says nosniff and no referrer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_carries_its_security_headers() {
    let s = server(db("console_headers"), |_| {}).await;
    let resp = s.http.get(format!("{}/", s.base)).send().await.unwrap();
    let h = resp.headers().clone();
    let csp = h["content-security-policy"].to_str().unwrap().to_string();
    for part in ["default-src 'none'", "frame-ancestors 'none'", "script-src 'sha256-", "connect-src 'self'"] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(h["x-frame-options"], "DENY");
    let html = resp.text().await.unwrap();
    assert!(!html.contains(" style=\"") && !html.contains(" onclick=\""), "inline attributes the CSP would block");
    let resp = s.http.get(format!("{}/v1/accounts", s.base)).send().await.unwrap();
    assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    assert_eq!(resp.headers()["referrer-policy"], "no-referrer");
}

/// A WebSocket logged in by its first message.
async fn socket(s: &Server, token: &str) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", s.running().addr())).await.unwrap();
    ws.send(Message::Text(json!({"type": "auth", "token": token}).to_string().into())).await.unwrap();
    ws
}

/// The close code the socket ends with within `within`, skipping events.
async fn close_code(ws: &mut Ws, within: Duration) -> Option<u16> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return None,
            Ok(Some(Ok(Message::Close(f)))) => return Some(f.map_or(1005, |f| u16::from(f.code))),
            Ok(Some(Ok(_))) => continue,
            Ok(None) | Ok(Some(Err(_))) => return Some(1006),
        }
    }
}

/// Logout closes every socket of that session within 1 s, for a client
/// that never pings; another session's socket stays. Expiry closes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_close_when_their_session_ends_without_a_ping() {
    let s = server(db("session_end"), |a| a.session_ttl = Duration::from_secs(3)).await;
    let token = s.user("alice@example.org").await;
    let (_, other) =
        s.call("POST", "/v1/login", None, Some(json!({"email": "alice@example.org", "password": USER_PASSWORD}))).await;
    let other = other["token"].as_str().unwrap().to_string();
    let mut a = s.ws(&token).await;
    let mut b = s.ws(&token).await;
    let mut c = s.ws(&other).await;
    let t0 = Instant::now();
    let (st, _) = s.call("POST", "/v1/logout", Some(&token), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    for ws in [&mut a, &mut b] {
        assert_eq!(close_code(ws, Duration::from_secs(1)).await, Some(4001), "after {:?}", t0.elapsed());
    }
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // The other session lives until its expiry (3 s from its login), and
    // no longer.
    let code = close_code(&mut c, Duration::from_secs(5)).await;
    assert_eq!(code, Some(4001), "expiry");
}

/// At most WS_PER_USER sockets per user: one more is refused (429 before
/// the upgrade with a header login, 4029 after a first-message one), and a
/// closed socket frees its place. Frames over 64 KiB end the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_and_frame_caps_hold() {
    let s = server(db("socket_caps"), |a| a.ws_per_user = 2).await;
    let token = s.user("alice@example.org").await;
    let bob = s.user("bob@example.org").await;
    let first = s.ws(&token).await;
    let _second = s.ws(&token).await;
    let mut third = socket(&s, &token).await;
    assert_eq!(close_code(&mut third, Duration::from_secs(5)).await, Some(4029));
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut req = format!("ws://{}/v1/ws", s.running().addr()).into_client_request().unwrap();
    req.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    match tokio_tungstenite::connect_async(req.clone()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 429),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let _bobs = s.ws(&bob).await; // another user's count is their own
    drop(first);
    let t0 = Instant::now();
    loop {
        match tokio_tungstenite::connect_async(req.clone()).await {
            Ok((mut ws, _)) => {
                let v = next_json(&mut ws, Duration::from_secs(5)).await.expect("ready");
                assert_eq!(v["type"], "ready");
                break;
            }
            Err(_) if t0.elapsed() < Duration::from_secs(5) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("a closed socket never freed its place: {e}"),
        }
    }
    let mut big = s.ws(&bob).await;
    big.send(Message::Text("x".repeat(100 * 1024).into())).await.unwrap();
    let code = close_code(&mut big, Duration::from_secs(5)).await;
    assert!(matches!(code, Some(1009) | Some(1006)), "a 100 KiB frame: {code:?}");
}

/// ACCOUNTS_PER_USER holds, and sign-ups are bounded per client address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_and_sign_up_caps_hold() {
    let s = server(db("account_caps"), |a| {
        a.accounts_per_user = 1;
        a.signups_per_hour = 3;
    })
    .await;
    let token = s.user("alice@example.org").await;
    s.add_account(&token, "alice").await;
    let body = json!({"host": s.dovecot.host(), "port": s.dovecot.port(), "security": "plain",
                      "username": "bob", "password": IMAP_PASSWORD});
    let (st, v) = s.call("POST", "/v1/accounts", Some(&token), Some(body)).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"]["code"], "quota_exceeded", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("ACCOUNTS_PER_USER"), "{v}");
    let (_, list) = s.call("GET", "/v1/accounts", Some(&token), None).await;
    assert_eq!(list.as_array().unwrap().len(), 1);

    // alice was the first of 3 sign-ups this hour from 127.0.0.1.
    for who in ["u2@example.org", "u3@example.org"] {
        let (st, v) = s.call("POST", "/v1/users", None, Some(json!({"email": who, "password": USER_PASSWORD}))).await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    let resp = s
        .http
        .post(format!("{}/v1/users", s.base))
        .json(&json!({"email": "u4@example.org", "password": USER_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().get("retry-after").is_some());
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limited", "{v}");
    // Another client address is not held to 127.0.0.1's count.
    let elsewhere =
        reqwest::Client::builder().local_address("127.0.0.3".parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let resp = elsewhere
        .post(format!("{}/v1/users", s.base))
        .json(&json!({"email": "u4@example.org", "password": USER_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
}
