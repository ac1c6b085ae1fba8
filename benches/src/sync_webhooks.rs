//! The webhook part of `sync-api`: deliveries per second from a running
//! `sync-worker serve` to a receiver in this process, for a burst of new
//! mail on a synced account.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{json, Value};
use sync_worker::testing::Dovecot;
use tokio::sync::Mutex;

/// What the receiver saw: each event id once, and when.
#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    first: Option<Instant>,
    last: Option<Instant>,
    posts: u64,
}

async fn receive(State(seen): State<Arc<Mutex<Seen>>>, body: Bytes) -> StatusCode {
    let id = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["id"].as_str().map(str::to_string));
    let mut seen = seen.lock().await;
    let now = Instant::now();
    seen.posts += 1;
    seen.first.get_or_insert(now);
    seen.last = Some(now);
    if let Some(id) = id {
        seen.ids.insert(id);
    }
    StatusCode::NO_CONTENT
}

/// What the burst measured.
pub struct Figures {
    /// Distinct events delivered per second, first POST to last.
    pub per_s: f64,
    /// From the first APPEND to the last delivery.
    pub end_to_end_s: f64,
    /// POSTs received per distinct event (1.0: no duplicates).
    pub posts_per_event: f64,
}

/// Registers a webhook for `message.new`, appends `count` messages made by
/// `mail` to `user`'s INBOX, and waits for every event.
pub async fn burst(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    dovecot: &Dovecot,
    user: &str,
    count: usize,
    mail: impl Fn(usize) -> Vec<u8>,
) -> Result<Figures> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let r = http
        .post(format!("{base}/v1/webhooks"))
        .bearer_auth(token)
        .json(&json!({"url": url, "events": ["message.new"]}))
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("POST /v1/webhooks: {} {}", r.status(), r.text().await?);
    }
    let messages: Vec<Vec<u8>> = (0..count).map(mail).collect();
    let t0 = Instant::now();
    dovecot.append_many(user, "INBOX", messages.iter().map(Vec::as_slice)).context("APPEND the burst")?;
    let deadline = t0 + Duration::from_secs(300);
    let figures = loop {
        {
            let seen = seen.lock().await;
            if seen.ids.len() >= count {
                let (first, last) = (seen.first.unwrap_or(t0), seen.last.unwrap_or(t0));
                let span = (last - first).as_secs_f64().max(1e-3);
                break Figures {
                    per_s: count as f64 / span,
                    end_to_end_s: (last - t0).as_secs_f64(),
                    posts_per_event: seen.posts as f64 / count as f64,
                };
            }
            if Instant::now() > deadline {
                bail!("only {} of {count} webhook events arrived within 300 s", seen.ids.len());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    server.abort();
    Ok(figures)
}
