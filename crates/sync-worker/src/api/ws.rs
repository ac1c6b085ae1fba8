//! `GET /v1/ws`: presence in, mail events out.
//!
//! **Authentication.** A program sends `Authorization: Bearer <token>` with
//! the upgrade. A browser, which cannot set headers on a WebSocket, sends
//! the text `{"type":"auth","token":"<token>"}` as its first message, within
//! [`AUTH_WAIT`]. The token never goes in the URL, where proxies and logs
//! keep it: `?token=` is refused.
//!
//! **Events.** Connecting and every ping (a WebSocket ping, or the text
//! `{"type":"ping"}` that browsers can send) refresh the user's presence
//! and publish `user.active`, which promotes the user's accounts to hot.
//! The server first sends `{"type":"ready"}`, then one JSON text per event
//! of the user's accounts. Each message carries `seq`, its place on this
//! socket (1 for `ready`). An event lost on the way (the bus is at most
//! once) is never a silent gap: the next message after it is
//! `{"type":"resync"}`, and the client fetches what it shows again (as it
//! does after `ready`, when it may have missed what came while it was away).
//! The events:
//! `{"type":"message.new","account","folder","id","uid","message":{...}}`
//! (`message.updated` alike, `message.deleted` without `message`), and
//! `{"type":"account.status","account","id","tier","owner","last_sync_at","last_error","folders",...}`
//! (`account` and the body of `GET /v1/accounts/{id}`) whenever an account's tier, owner,
//! last sync time or last error changes.
//!
//! **The session's end.** The socket closes with code 4001 when its session
//! ends: at logout (announced on the bus, so in every API process), at its
//! expiry (a timer), or when a check finds it gone (every
//! [`SESSION_RECHECK`], and on each ping).
//!
//! **Bounds.** At most [`ApiSettings::ws_per_user`](super::ApiSettings::ws_per_user)
//! sockets per user in one API process (`WS_PER_USER`; more: 429 before the
//! upgrade, or close code 4029 after a first-message login), and frames and
//! messages of at most [`MAX_FRAME`] bytes.

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::Response;

use super::auth::{authenticate, bearer, AuthUser};
use super::errors::{ApiError, ErrorBody};
use super::sockets::SocketSlot;
use super::state::ApiState;
use crate::events::{AccountChanged, MailEvent, MailEventKind, Received, SyncEvent};
use crate::storage::{now_ms, MessageKey};
use serde_json::json;

/// Close code for a session that ended (or a first message that was not a
/// good login).
pub const CLOSE_SESSION_ENDED: u16 = 4001;
/// Close code for a user over their WebSocket bound.
pub const CLOSE_TOO_MANY: u16 = 4029;
/// The longest frame or message taken: 64 KiB (a client only sends pings
/// and its login).
pub const MAX_FRAME: usize = 64 * 1024;
/// How long a socket without a header login may take to send its first
/// message.
pub const AUTH_WAIT: Duration = Duration::from_secs(10);
/// How often an open socket checks that its session still exists: the
/// backstop for a logout announcement the bus lost (it is at most once).
pub const SESSION_RECHECK: Duration = Duration::from_secs(30);

/// The user of a WebSocket request with an `Authorization` header; `None`
/// when it has none (its first message logs in).
#[derive(Debug)]
pub struct WsAuth(pub Option<AuthUser>);

impl FromRequestParts<ApiState> for WsAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
        let in_url = parts.uri.query().is_some_and(|q| q.split('&').any(|kv| kv.split('=').next() == Some("token")));
        if in_url {
            return Err(ApiError::Unauthorized(
                "the token may not go in the URL (proxies and logs keep URLs): send `Authorization: Bearer <token>`, \
                 or {\"type\":\"auth\",\"token\":\"<token>\"} as the first message",
            ));
        }
        match bearer(parts)? {
            Some(token) => authenticate(state, token).await.map(|a| WsAuth(Some(a))),
            None => Ok(WsAuth(None)),
        }
    }
}

fn too_many(state: &ApiState) -> ApiError {
    ApiError::OverLimit {
        what: "open WebSockets per user",
        limit: state.settings.ws_per_user as u64,
        setting: "WS_PER_USER",
        remedy: "close another one first",
    }
}

/// `GET /v1/ws`.
#[utoipa::path(get, path = "/v1/ws", tag = "events", security(("bearer" = []), ()),
    responses(
        (status = 101, description = "A WebSocket. Without an `Authorization` header, send \
            `{\"type\":\"auth\",\"token\":\"<token>\"}` first (within 10 s). The server sends `{\"type\":\"ready\"}`, \
            then one JSON text per event of the user's accounts: `message.new` and `message.updated` \
            (`{\"type\",\"account\",\"folder\",\"id\",\"uid\",\"message\":MessageSummary}`), `message.deleted` \
            (the same without `message`) and `account.status` (`{\"type\":\"account.status\",\"account\"}` with \
            the fields of AccountView, as `GET /v1/accounts/{id}` shows them) when its tier, owner, last sync or last \
            error changes. Send a ping, or the text `{\"type\":\"ping\"}` (answered \
            `{\"type\":\"pong\"}`), to stay present. The socket closes with code 4001 when its session ends \
            (logout, expiry) or its first message is not a good login, and 4029 when the user has too many open."),
        (status = 400, description = "Not a WebSocket upgrade request", body = ErrorBody),
        (status = 401, description = "A wrong or expired token, or a token in the URL", body = ErrorBody),
        (status = 429, description = "The user has WS_PER_USER sockets open", body = ErrorBody),
    ))]
pub async fn upgrade(
    State(state): State<ApiState>,
    WsAuth(auth): WsAuth,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    // axum's own rejection is plain text; every error here has the one JSON shape.
    let ws = ws.map_err(|source| ApiError::NotWebSocket { source })?;
    let slot = match &auth {
        Some(a) => Some(state.sockets.take(&a.user, state.settings.ws_per_user).ok_or_else(|| too_many(&state))?),
        None => None,
    };
    Ok(ws.max_frame_size(MAX_FRAME).max_message_size(MAX_FRAME).on_upgrade(move |mut socket| async move {
        let (auth, _slot) = match (auth, slot) {
            (Some(auth), Some(slot)) => (auth, slot),
            _ => match first_message_login(&state, &mut socket).await {
                Some(pair) => pair,
                None => return,
            },
        };
        if let Err(e) = session(state, auth, socket).await {
            tracing::debug!(error = %e, "websocket ended");
        }
    }))
}

/// `{"type":"auth","token":...}` as the socket's first message: its user and
/// slot, or `None` once the socket is closed with the reason.
async fn first_message_login(state: &ApiState, socket: &mut WebSocket) -> Option<(AuthUser, SocketSlot)> {
    let first = match tokio::time::timeout(AUTH_WAIT, socket.recv()).await {
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => return None,
        Ok(Some(Ok(_))) | Err(_) => {
            let _ = socket.send(close(CLOSE_SESSION_ENDED, "send {\"type\":\"auth\",\"token\"} first")).await;
            return None;
        }
    };
    let token = serde_json::from_str::<serde_json::Value>(first.as_str())
        .ok()
        .filter(|v| v["type"] == "auth")
        .and_then(|v| v["token"].as_str().map(str::to_string));
    let Some(token) = token else {
        let _ =
            socket.send(close(CLOSE_SESSION_ENDED, "the first message must be {\"type\":\"auth\",\"token\"}")).await;
        return None;
    };
    let auth = match authenticate(state, &token).await {
        Ok(a) => a,
        Err(e) => {
            let _ = socket.send(close(CLOSE_SESSION_ENDED, "the token is wrong or expired: log in again")).await;
            tracing::debug!(error = %e, "websocket login refused");
            return None;
        }
    };
    match state.sockets.take(&auth.user, state.settings.ws_per_user) {
        Some(slot) => Some((auth, slot)),
        None => {
            let _ = socket.send(close(CLOSE_TOO_MANY, &too_many(state).to_string())).await;
            None
        }
    }
}

/// A close frame with `code` and `reason`.
fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code, reason: reason.to_string().into() }))
}

/// Why a session's socket closes.
fn session_ended(reason: &str) -> Message {
    close(CLOSE_SESSION_ENDED, reason)
}

async fn session(state: ApiState, auth: AuthUser, mut socket: WebSocket) -> Result<(), axum::Error> {
    let mut events = match state.bus.subscribe(&auth.user).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %crate::errors::error_chain(&e), "websocket without events");
            return socket.send(close(1011, "no event bus")).await;
        }
    };
    if let Err(e) = state.present(&auth.user).await {
        tracing::warn!(error = %e, user = %auth.user, "could not refresh presence on connect");
    }
    // Every message says its place on this socket, from 1 (`ready`).
    let mut seq: u64 = 1;
    socket.send(Message::Text(json!({"type": "ready", "seq": seq}).to_string().into())).await?;
    let left = Duration::from_millis(auth.expires_at.saturating_sub(now_ms()).max(0) as u64);
    let expiry = tokio::time::sleep(left);
    tokio::pin!(expiry);
    let mut recheck = tokio::time::interval_at(tokio::time::Instant::now() + SESSION_RECHECK, SESSION_RECHECK);
    loop {
        tokio::select! {
            () = &mut expiry => return socket.send(session_ended("session expired: log in again")).await,
            _ = recheck.tick() => {
                if !session_alive(&state, &auth).await {
                    return socket.send(session_ended("session ended: log in again")).await;
                }
            }
            incoming = socket.recv() => {
                let Some(incoming) = incoming else { return Ok(()) };
                let text_ping = match &incoming? {
                    Message::Ping(_) => false,
                    Message::Text(t) if is_ping(t.as_str()) => true,
                    Message::Close(_) => return Ok(()),
                    _ => continue,
                };
                if !session_alive(&state, &auth).await {
                    return socket.send(session_ended("session ended: log in again")).await;
                }
                if let Err(e) = state.present(&auth.user).await {
                    tracing::warn!(error = %e, user = %auth.user, "could not refresh presence on ping");
                }
                if text_ping {
                    socket.send(Message::Text(r#"{"type":"pong"}"#.into())).await?;
                }
            }
            received = events.recv() => {
                let Some(Received { event, after_gap }) = received else { return Ok(()) };
                if after_gap {
                    // Events were lost on the way: the client fetches again.
                    seq += 1;
                    socket.send(Message::Text(json!({"type": "resync", "seq": seq}).to_string().into())).await?;
                }
                if let SyncEvent::SessionEnded(ended) = &event {
                    if ended.token_hash == auth.token_hash {
                        return socket.send(session_ended("logged out")).await;
                    }
                    continue;
                }
                if let Some(mut v) = render(&state, &event).await {
                    seq += 1;
                    v["seq"] = seq.into();
                    socket.send(Message::Text(v.to_string().into())).await?;
                    if let SyncEvent::Mail(m) = &event {
                        if m.committed_at_ms > 0 {
                            let ms = now_ms().saturating_sub(m.committed_at_ms).max(0);
                            metrics::histogram!("sync_worker_push_seconds").record(ms as f64 / 1000.0);
                        }
                    }
                }
            }
        }
    }
}

/// Whether `auth`'s session still exists (a failed check keeps the socket:
/// the database may be back in a moment).
async fn session_alive(state: &ApiState, auth: &AuthUser) -> bool {
    match state.storage.session(&auth.token_hash).await {
        Ok(found) => found.is_some(),
        Err(e) => {
            tracing::warn!(error = %crate::errors::error_chain(&e), "could not check a websocket's session");
            true
        }
    }
}

fn is_ping(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text).ok().and_then(|v| v.get("type").cloned())
        == Some(serde_json::Value::String("ping".into()))
}

/// The JSON of `event`; `None` when there is nothing to say (the
/// account is gone).
pub async fn render(state: &ApiState, event: &SyncEvent) -> Option<serde_json::Value> {
    match event {
        SyncEvent::Mail(e) => Some(render_mail(state, e).await),
        SyncEvent::Account(e) => render_status(state, e).await,
        // Acted on by the socket, never sent.
        SyncEvent::SessionEnded(_) => None,
    }
}

/// `{"type":"account.status", ...}` with the fields of `GET /v1/accounts/{id}`,
/// as the account is now.
async fn render_status(state: &ApiState, event: &AccountChanged) -> Option<serde_json::Value> {
    let summary = match state.storage.account(&event.account).await {
        Ok(Some(a)) => a,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(error = %crate::errors::error_chain(&e), "could not read an account for its status");
            return None;
        }
    };
    match super::accounts::view(state, summary, true).await {
        Ok(view) => {
            let mut v = serde_json::to_value(view).ok()?;
            v["type"] = serde_json::Value::from("account.status");
            // Every event names its account as `account`.
            v["account"] = serde_json::Value::from(event.account.as_str());
            Some(v)
        }
        Err(e) => {
            tracing::warn!(error = %e, account = event.account, "could not read an account's status");
            None
        }
    }
}

/// The JSON of `event`, with the message as listed for new and updated ones.
async fn render_mail(state: &ApiState, event: &MailEvent) -> serde_json::Value {
    let key = MessageKey { folder: event.folder.clone(), uidvalidity: event.uidvalidity, uid: event.uid };
    let mut v = serde_json::json!({
        "type": event.kind.as_str(),
        "account": event.account,
        "folder": event.folder,
        "id": key.encode(),
        "uid": event.uid,
    });
    if event.kind != MailEventKind::Deleted {
        match state.storage.message(&event.account, &key).await {
            Ok(Some(m)) => v["message"] = serde_json::json!(m.summary),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %crate::errors::error_chain(&e), "could not read an event's message"),
        }
    }
    v
}
