//! A small OAuth2 authorization server for tests: a token endpoint that
//! trades refresh tokens for short-lived access tokens (RFC 6749 §6), and
//! an introspection endpoint (RFC 7662) that a [`super::Dovecot`] with
//! [`super::DovecotOptions::oauth2`] asks whether a token is valid.
//!
//! It runs on its own thread and runtime, so blocking and async tests use
//! it alike; dropping the handle stops it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Form, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use parking_lot::Mutex;

use super::{HarnessError, Result};

/// The client id the server knows.
pub const OAUTH_CLIENT_ID: &str = "sync-worker-test";
/// Its client secret.
pub const OAUTH_CLIENT_SECRET: &str = "client-secret";

#[derive(Debug)]
struct Access {
    user: String,
    expires: Instant,
    refresh: String,
}

#[derive(Debug, Default)]
struct Books {
    /// refresh token -> (user, revoked)
    refresh: HashMap<String, (String, bool)>,
    access: HashMap<String, Access>,
    issued: u64,
    refreshes: u64,
    refused_refreshes: u64,
    introspections: u64,
    rotate: bool,
}

#[derive(Debug)]
struct Shared {
    books: Mutex<Books>,
    lifetime: Duration,
}

/// A running OAuth2 server.
#[derive(Debug)]
pub struct OAuthServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(serde::Deserialize)]
struct TokenForm {
    grant_type: String,
    refresh_token: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
}

#[derive(serde::Deserialize)]
struct IntrospectForm {
    token: String,
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    (status, Json(serde_json::json!({"error": error, "error_description": description}))).into_response()
}

async fn token(State(shared): State<Arc<Shared>>, Form(form): Form<TokenForm>) -> Response {
    let mut books = shared.books.lock();
    books.refreshes += 1;
    if form.client_id.as_deref() != Some(OAUTH_CLIENT_ID) || form.client_secret.as_deref() != Some(OAUTH_CLIENT_SECRET)
    {
        books.refused_refreshes += 1;
        return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", "Unknown client or wrong secret.");
    }
    if form.grant_type != "refresh_token" {
        books.refused_refreshes += 1;
        return oauth_error(StatusCode::BAD_REQUEST, "unsupported_grant_type", "Only refresh_token.");
    }
    let refresh = form.refresh_token.unwrap_or_default();
    let user = match books.refresh.get(&refresh) {
        Some((user, false)) => user.clone(),
        _ => {
            books.refused_refreshes += 1;
            return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "Token has been expired or revoked.");
        }
    };
    books.issued += 1;
    let access_token = format!("at-{}-{}", books.issued, uuid::Uuid::new_v4().simple());
    let mut body = serde_json::json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": shared.lifetime.as_secs(),
    });
    let mut current = refresh;
    if books.rotate {
        let next = format!("rt-{}", uuid::Uuid::new_v4().simple());
        let (user, _) = books.refresh.remove(&current).unwrap_or_default();
        books.refresh.insert(next.clone(), (user, false));
        body["refresh_token"] = serde_json::Value::String(next.clone());
        current = next;
    }
    let expires = Instant::now() + shared.lifetime;
    books.access.insert(access_token, Access { user, expires, refresh: current });
    Json(body).into_response()
}

async fn introspect(State(shared): State<Arc<Shared>>, Form(form): Form<IntrospectForm>) -> Response {
    let mut books = shared.books.lock();
    books.introspections += 1;
    let active = books
        .access
        .get(&form.token)
        .filter(|a| Instant::now() < a.expires && books.refresh.get(&a.refresh).is_some_and(|(_, revoked)| !revoked));
    match active {
        Some(a) => Json(serde_json::json!({"active": true, "username": a.user})).into_response(),
        None => Json(serde_json::json!({"active": false})).into_response(),
    }
}

impl OAuthServer {
    /// Starts a server on a free loopback port whose access tokens live
    /// `lifetime`.
    pub fn start(lifetime: Duration) -> Result<Self> {
        let shared = Arc::new(Shared { books: Mutex::default(), lifetime });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(HarnessError::io("bind the OAuth server"))?;
        listener.set_nonblocking(true).map_err(HarnessError::io("set the OAuth listener non-blocking"))?;
        let addr = listener.local_addr().map_err(HarnessError::io("read the OAuth server's address"))?;
        let app = Router::new()
            .route("/token", post(token))
            .route("/introspect", post(introspect))
            .with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::io("build the OAuth server's runtime"))?;
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                // Not a graceful shutdown: Dovecot keeps its connections open.
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(Self { addr, shared, stop: Some(stop), thread: Some(thread) })
    }

    /// The token endpoint's URL.
    pub fn token_url(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// The introspection endpoint's URL (for Dovecot).
    pub fn introspection_url(&self) -> String {
        format!("http://{}/introspect", self.addr)
    }

    /// A new refresh token for `user`.
    pub fn grant(&self, user: &str) -> String {
        let token = format!("rt-{}", uuid::Uuid::new_v4().simple());
        self.shared.books.lock().refresh.insert(token.clone(), (user.to_string(), false));
        token
    }

    /// Revokes every refresh token of `user`, and every access token got
    /// with them.
    pub fn revoke_all_of(&self, user: &str) {
        for (owner, revoked) in self.shared.books.lock().refresh.values_mut() {
            if owner == user {
                *revoked = true;
            }
        }
    }

    /// Whether each refresh hands out a new refresh token (and retires the old one).
    pub fn set_rotation(&self, rotate: bool) {
        self.shared.books.lock().rotate = rotate;
    }

    /// Refresh requests so far (granted or not).
    pub fn refreshes(&self) -> u64 {
        self.shared.books.lock().refreshes
    }

    /// Refresh requests refused so far.
    pub fn refused_refreshes(&self) -> u64 {
        self.shared.books.lock().refused_refreshes
    }

    /// Access tokens issued so far.
    pub fn issued(&self) -> u64 {
        self.shared.books.lock().issued
    }

    /// Introspection requests so far (one per login Dovecot checks).
    pub fn introspections(&self) -> u64 {
        self.shared.books.lock().introspections
    }
}

impl Drop for OAuthServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
