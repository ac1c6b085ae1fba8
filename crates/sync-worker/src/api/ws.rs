//! `GET /v1/ws`: presence in, mail events out.
//!
//! Authenticated by `Authorization: Bearer` or, for browsers (which cannot
//! set headers on a WebSocket), a `token` query parameter. Connecting and
//! every ping (a WebSocket ping, or the text `{"type":"ping"}` that
//! browsers can send) refresh the user's presence and publish `user.active`,
//! which promotes the user's accounts to hot. The server first sends
//! `{"type":"ready"}` (from then on no event is missed), then one JSON text
//! per event of the user's accounts:
//! `{"type":"message.new","account","folder","id","uid","message":{...}}`
//! (`message.updated` alike, `message.deleted` without `message`), and
//! `{"type":"account.status","account","id","tier","owner","last_sync_at","last_error","folders",...}`
//! (`account` and the body of `GET /v1/accounts/{id}`) whenever an account's tier, owner,
//! last sync time or last error changes. A ping
//! after the session has ended or expired closes the socket (code 4001).

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::response::Response;

use super::auth::{authenticate, bearer, AuthUser};
use super::errors::{ApiError, ErrorBody};
use super::state::ApiState;
use crate::events::{AccountChanged, MailEvent, MailEventKind, SyncEvent};
use crate::storage::MessageKey;

/// Close code for a session that ended while the socket was open.
pub const CLOSE_SESSION_ENDED: u16 = 4001;

/// The user of a WebSocket request: bearer header or `?token=`.
#[derive(Debug)]
pub struct WsAuth(pub AuthUser);

impl FromRequestParts<ApiState> for WsAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
        if let Some(token) = bearer(parts)? {
            return authenticate(state, token).await.map(WsAuth);
        }
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::Unauthorized("the query string is malformed"))?;
        match pairs.iter().find(|(k, _)| k == "token") {
            Some((_, token)) => authenticate(state, token).await.map(WsAuth),
            None => Err(ApiError::Unauthorized("no token: send `Authorization: Bearer <token>` or `?token=`")),
        }
    }
}

/// `GET /v1/ws`.
#[utoipa::path(get, path = "/v1/ws", tag = "events", security(("bearer" = []), ()),
    params(("token" = Option<String>, Query, description = "The session token, for browsers \
        (which cannot set `Authorization` on a WebSocket)")),
    responses(
        (status = 101, description = "A WebSocket. The server sends `{\"type\":\"ready\"}`, then one JSON text \
            per event of the user's accounts: `message.new` and `message.updated` \
            (`{\"type\",\"account\",\"folder\",\"id\",\"uid\",\"message\":MessageSummary}`), `message.deleted` \
            (the same without `message`) and `account.status` (`{\"type\":\"account.status\",\"account\"}` with \
            the fields of AccountView, as `GET /v1/accounts/{id}` shows them) when its tier, owner, last sync or last \
            error changes. Send a ping, or the text `{\"type\":\"ping\"}` (answered \
            `{\"type\":\"pong\"}`), to stay present; a ping after the session ended closes with code 4001."),
        (status = 400, description = "Not a WebSocket upgrade request", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
    ))]
pub async fn upgrade(
    State(state): State<ApiState>,
    WsAuth(auth): WsAuth,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    // axum's own rejection is plain text; every error here has the one JSON shape.
    let ws = ws.map_err(|source| ApiError::NotWebSocket { source })?;
    Ok(ws.on_upgrade(move |socket| async move {
        if let Err(e) = session(state, auth, socket).await {
            tracing::debug!(error = %e, "websocket ended");
        }
    }))
}

async fn session(state: ApiState, auth: AuthUser, mut socket: WebSocket) -> Result<(), axum::Error> {
    let mut events = match state.bus.subscribe(&auth.user).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %crate::errors::error_chain(&e), "websocket without events");
            return socket.send(Message::Close(Some(CloseFrame { code: 1011, reason: "no event bus".into() }))).await;
        }
    };
    if let Err(e) = state.present(&auth.user).await {
        tracing::warn!(error = %e, user = %auth.user, "could not refresh presence on connect");
    }
    socket.send(Message::Text(r#"{"type":"ready"}"#.into())).await?;
    loop {
        tokio::select! {
            incoming = socket.recv() => {
                let Some(incoming) = incoming else { return Ok(()) };
                let text_ping = match &incoming? {
                    Message::Ping(_) => false,
                    Message::Text(t) if is_ping(t.as_str()) => true,
                    Message::Close(_) => return Ok(()),
                    _ => continue,
                };
                match state.storage.session(&auth.token_hash).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        let frame = CloseFrame { code: CLOSE_SESSION_ENDED, reason: "session ended: log in again".into() };
                        return socket.send(Message::Close(Some(frame))).await;
                    }
                    Err(e) => tracing::warn!(error = %crate::errors::error_chain(&e), "could not check a websocket's session"),
                }
                if let Err(e) = state.present(&auth.user).await {
                    tracing::warn!(error = %e, user = %auth.user, "could not refresh presence on ping");
                }
                if text_ping {
                    socket.send(Message::Text(r#"{"type":"pong"}"#.into())).await?;
                }
            }
            event = events.recv() => {
                let Some(event) = event else { return Ok(()) };
                if let Some(text) = render(&state, &event).await {
                    socket.send(Message::Text(text.into())).await?;
                }
            }
        }
    }
}

fn is_ping(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text).ok().and_then(|v| v.get("type").cloned())
        == Some(serde_json::Value::String("ping".into()))
}

/// The JSON text of `event`; `None` when there is nothing to say (the
/// account is gone).
pub async fn render(state: &ApiState, event: &SyncEvent) -> Option<String> {
    match event {
        SyncEvent::Mail(e) => Some(render_mail(state, e).await),
        SyncEvent::Account(e) => render_status(state, e).await,
    }
}

/// `{"type":"account.status", ...}` with the fields of `GET /v1/accounts/{id}`,
/// as the account is now.
async fn render_status(state: &ApiState, event: &AccountChanged) -> Option<String> {
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
            Some(v.to_string())
        }
        Err(e) => {
            tracing::warn!(error = %e, account = event.account, "could not read an account's status");
            None
        }
    }
}

/// The JSON text of `event`, with the message as listed for new and updated ones.
async fn render_mail(state: &ApiState, event: &MailEvent) -> String {
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
    v.to_string()
}
