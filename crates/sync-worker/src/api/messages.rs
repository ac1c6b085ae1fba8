//! One message, whole: its header fields, bodies and attachments
//! (`GET .../messages/{message_id}`), its raw bytes (`.../raw`) and one
//! attachment (`.../attachments/{part}`).
//!
//! The stored row says the message exists (the sync deletes the rows of
//! expunged mail); the rest is read on demand from the IMAP server over a
//! transient connection (EXAMINE and `BODY.PEEK`, so reading never sets
//! `\Seen`; see `download`). The raw bytes and an attachment stream from
//! the server to the client as they arrive; the whole message is read
//! whole, for its view. What the detail route made of a message is cached in SQL
//! (`BODY_CACHE_MB` per account, least recently used first out). A message
//! the server no longer has answers 404: at once where the server is asked
//! (its cached view forgotten then), and for a cached view once the sync
//! has seen the expunge (within a poll; the view goes with the row).

use axum::extract::{Path, State};
use axum::response::Response;
use axum::Json;

use super::accounts::owned;
use super::auth::AuthUser;
use super::download;
use super::errors::{ApiError, ErrorBody};
use super::mime::{self, MessageBody};
use super::state::ApiState;
use crate::storage::{MessageDetail, MessageKey};

/// A whole message: what the list shows, the stored header, and what was
/// read from the server.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct MessageView {
    /// The stored row.
    #[serde(flatten)]
    pub stored: MessageDetail,
    /// The header fields, bodies and attachments.
    #[serde(flatten)]
    pub body: MessageBody,
}

/// The account's message `message_id`, checked to be the caller's and still stored.
pub(super) async fn stored(
    state: &ApiState,
    auth: &AuthUser,
    id: &str,
    message_id: &str,
) -> Result<(MessageKey, MessageDetail), ApiError> {
    owned(state, auth, id).await?;
    let not_found = || ApiError::NotFound { what: "message", id: message_id.to_string() };
    let key = MessageKey::decode(message_id).ok_or_else(not_found)?;
    let detail = state.storage.message(id, &key).await?.ok_or_else(not_found)?;
    Ok((key, detail))
}

/// `GET /v1/accounts/{id}/messages/{message_id}`.
#[utoipa::path(get, path = "/v1/accounts/{id}/messages/{message_id}", tag = "mail", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("message_id" = String, Path, description = "A message's `id` from a list or an event"),
    ),
    responses(
        (status = 200, description = "The whole message: the stored row, the header fields, the text and HTML \
            bodies decoded to UTF-8 and the attachments (read from the server without setting \\Seen, then cached)",
            body = MessageView),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, or no such message (on the server too)",
            body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server could not be read (`imap_unavailable`); retry later",
            body = ErrorBody),
    ))]
pub async fn message(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path((id, message_id)): Path<(String, String)>,
) -> Result<Json<MessageView>, ApiError> {
    let (key, stored) = stored(&state, &auth, &id, &message_id).await?;
    if let Some(cached) = state.storage.cached_view(&id, &key).await? {
        match serde_json::from_str::<MessageBody>(&cached) {
            Ok(body) => return Ok(Json(MessageView { stored, body })),
            // Written by another version: read it again.
            Err(e) => tracing::debug!(account = %id, error = %e, "a cached view does not read: read again"),
        }
    }
    let raw = download::whole(&state, &id, &message_id, &key).await?;
    let (body, json) = download::blocking("read a message's MIME", move || {
        let body = mime::read(&raw);
        let json = serde_json::to_string(&body);
        (body, json)
    })
    .await?;
    let cap = state.settings.body_cache_bytes;
    if let Ok(json) = json {
        if cap > 0 {
            state.storage.cache_view(&id, &key, &json, cap).await?;
        }
    }
    Ok(Json(MessageView { stored, body }))
}

/// `GET /v1/accounts/{id}/messages/{message_id}/raw`.
#[utoipa::path(get, path = "/v1/accounts/{id}/messages/{message_id}/raw", tag = "mail",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("message_id" = String, Path, description = "A message's `id` from a list or an event"),
    ),
    responses(
        (status = 200, description = "The message as the server holds it (RFC 5322 bytes)",
            content_type = "message/rfc822", body = Vec<u8>),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, or no such message (on the server too)",
            body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server could not be read (`imap_unavailable`); retry later",
            body = ErrorBody),
    ))]
pub async fn raw_message(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path((id, message_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (key, _) = stored(&state, &auth, &id, &message_id).await?;
    download::raw(&state, &id, &message_id, &key).await
}

/// `GET /v1/accounts/{id}/messages/{message_id}/attachments/{part}`.
#[utoipa::path(get, path = "/v1/accounts/{id}/messages/{message_id}/attachments/{part}", tag = "mail",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("message_id" = String, Path, description = "A message's `id` from a list or an event"),
        ("part" = String, Path, description = "An attachment's `part` from the message (an IMAP part number \
            such as `2` or `1.3`)", pattern = r"^[1-9][0-9]{0,3}(\.[1-9][0-9]{0,3}){0,15}$"),
    ),
    responses(
        (status = 200, description = "The part, decoded (text as UTF-8), with its Content-Type and a \
            Content-Disposition that names its file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "`part` is not a part number", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, no such message, or no such part",
            body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server could not be read (`imap_unavailable`); retry later",
            body = ErrorBody),
    ))]
pub async fn attachment(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path((id, message_id, part)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    if !is_part_number(&part) {
        return Err(ApiError::field("part", format!("{part:?} is not a part number such as 2 or 1.3")));
    }
    let (key, detail) = stored(&state, &auth, &id, &message_id).await?;
    download::attachment(&state, &id, &message_id, &key, &detail, &part).await
}

/// `2`, `1.3`: what `BODY[section]` numbers a part with.
fn is_part_number(s: &str) -> bool {
    s.len() <= 80
        && s.split('.')
            .all(|n| !n.is_empty() && n.len() <= 4 && !n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_numbers_are_what_imap_numbers_parts_with() {
        for good in ["1", "2", "1.3", "10.2.1"] {
            assert!(is_part_number(good), "{good}");
        }
        for bad in ["", "0", "1.", ".1", "1..2", "01", "a", "1.x", "HEADER", "1.MIME", "99999"] {
            assert!(!is_part_number(bad), "{bad}");
        }
    }
}
