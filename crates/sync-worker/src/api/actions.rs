//! Changing mail: flags and keywords (`PATCH .../messages/{message_id}`),
//! moving (`POST .../move`), deleting (`DELETE`), and any of these on up to
//! [`MAX_BATCH`] messages at once (`POST .../messages/actions`, one IMAP
//! command per folder).
//!
//! Every change is made on the IMAP server only, over the API's own
//! connection; the API writes no mail row. The change reaches SQL and every
//! WebSocket through the normal sync (`message.updated`, `message.deleted`,
//! `message.new` in the target folder), under its fencing. An answer gives
//! what the server confirmed.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::Json;

use super::accounts::owned;
use super::auth::AuthUser;
use super::errors::imap_failure;
use super::errors::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::messages::stored;
use super::state::ApiState;
use crate::imap::remote::{Remote, RemoteError};
use crate::storage::MessageKey;

/// Most messages one `POST .../messages/actions` acts on.
pub const MAX_BATCH: usize = 500;

/// A keyword: an IMAP flag of the user's own (`$Important`, `todo`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(try_from = "String")]
#[schema(value_type = String, min_length = 1, max_length = 100, pattern = r#"^[\x21\x23\x24\x26\x27\x2B-\x5B\x5E-\x7A\x7C-\x7E]+$"#)]
pub struct Keyword(String);

impl TryFrom<String> for Keyword {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        // RFC 3501 `flag-keyword` is an atom: no space, control character,
        // `(){%*"\]`, and not a system flag (those start with `\`).
        let bad = s.chars().find(|c| c.is_ascii_control() || !c.is_ascii() || " (){%*\"\\]".contains(*c));
        match bad {
            _ if s.is_empty() || s.len() > 100 => Err(format!("{s:?} is not 1 to 100 characters")),
            Some(c) => Err(format!("{s:?} holds {c:?}: a keyword is printable ASCII without spaces or (){{%*\"\\]")),
            None => Ok(Keyword(s)),
        }
    }
}

/// Keywords to add and to remove.
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KeywordChanges {
    /// Keywords to set.
    #[serde(default)]
    #[schema(max_items = 50)]
    pub add: Vec<Keyword>,
    /// Keywords to clear.
    #[serde(default)]
    #[schema(max_items = 50)]
    pub remove: Vec<Keyword>,
}

/// What to change of a message; fields left out stay as they are.
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageUpdate {
    /// Read (`\Seen`).
    pub seen: Option<bool>,
    /// Flagged (`\Flagged`).
    pub flagged: Option<bool>,
    /// Answered (`\Answered`).
    pub answered: Option<bool>,
    /// Keywords to add and remove.
    pub keywords: Option<KeywordChanges>,
}

impl MessageUpdate {
    /// The flags to add and to remove; a 400 when there is nothing to change.
    fn flags(&self, field: &str) -> Result<(Vec<String>, Vec<String>), ApiError> {
        let (mut add, mut remove) = (Vec::new(), Vec::new());
        for (flag, set) in [("\\Seen", self.seen), ("\\Flagged", self.flagged), ("\\Answered", self.answered)] {
            match set {
                Some(true) => add.push(flag.to_string()),
                Some(false) => remove.push(flag.to_string()),
                None => {}
            }
        }
        if let Some(k) = &self.keywords {
            if k.add.len() > 50 || k.remove.len() > 50 {
                return Err(ApiError::field(format!("{field}keywords"), "at most 50 to add and 50 to remove"));
            }
            add.extend(k.add.iter().map(|k| k.0.clone()));
            remove.extend(k.remove.iter().map(|k| k.0.clone()));
        }
        if let Some(both) = add.iter().find(|f| remove.contains(f)) {
            return Err(ApiError::field(format!("{field}keywords"), format!("{both} is both added and removed")));
        }
        if add.is_empty() && remove.is_empty() {
            let field = if field.is_empty() { "body".to_string() } else { field.trim_end_matches('.').to_string() };
            return Err(ApiError::field(field, "nothing to change: give seen, flagged, answered or keywords"));
        }
        Ok((add, remove))
    }
}

/// A message's flags as the server confirmed them.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct MessageFlags {
    /// The message.
    pub id: String,
    /// Its flags now.
    pub flags: Vec<String>,
}

/// `POST .../move`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveTo {
    /// The target folder, as `GET .../folders` names it.
    #[schema(min_length = 1, example = "Archive")]
    pub folder: String,
}

/// Where a message went.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Moved {
    /// The message (its old id: the moved copy gets a new one, announced by
    /// `message.new` in the target folder).
    pub id: String,
    /// The folder it is in now; `null` when it was expunged for good.
    pub folder: Option<String>,
}

/// What `POST .../messages/actions` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// Change flags and keywords (`update`).
    Update,
    /// Move to `folder`.
    Move,
    /// Move to Trash, or expunge what is in Trash already.
    Delete,
}

/// `POST /v1/accounts/{id}/messages/actions`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAction {
    /// The messages (ids from a list or an event), 1 to 500.
    #[schema(min_items = 1, max_items = 500)]
    pub ids: Vec<String>,
    /// What to do.
    pub action: ActionKind,
    /// For `update`: what to change.
    pub update: Option<MessageUpdate>,
    /// For `move`: the target folder.
    pub folder: Option<String>,
}

/// One message's outcome in a batch.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ActionOutcome {
    /// The message.
    pub id: String,
    /// `ok`, or `not_found` (no such message, here or on the server).
    #[schema(example = "ok")]
    pub status: String,
    /// For `update`: its flags as the server confirmed them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
    /// For `move` and `delete`: where it is now (`null`: expunged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folder: Option<Option<String>>,
}

/// The answer of `POST .../messages/actions`, in the order of `ids`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct BatchOutcome {
    /// One per id.
    pub results: Vec<ActionOutcome>,
}

/// One action, resolved against the account's folders.
#[derive(Debug, Clone)]
enum Action {
    Update {
        add: Vec<String>,
        remove: Vec<String>,
    },
    Move {
        target: String,
    },
    /// `trash`: the account's Trash; `None` expunges.
    Delete {
        trash: Option<String>,
    },
}

/// What happened to one UID.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Done {
    Flags(Vec<String>),
    /// In this folder now (`None`: expunged).
    In(Option<String>),
}

/// The account's folders: the target of a move must be one, named as stored.
async fn resolve(state: &ApiState, id: &str, kind: ActionKind, body: BatchLike<'_>) -> Result<Action, ApiError> {
    let folders = state.storage.folders(id).await?;
    Ok(match kind {
        ActionKind::Update => {
            let update = body.update.ok_or_else(|| ApiError::field("update", "required for the update action"))?;
            let (add, remove) = update.flags(body.prefix)?;
            Action::Update { add, remove }
        }
        ActionKind::Move => {
            let target = body.folder.ok_or_else(|| ApiError::field("folder", "required for the move action"))?;
            if !folders.iter().any(|f| f.name == target) {
                return Err(ApiError::field(
                    "folder",
                    format!("no folder {target:?} in this account (GET .../folders lists them)"),
                ));
            }
            Action::Move { target: target.to_string() }
        }
        ActionKind::Delete => {
            Action::Delete { trash: folders.into_iter().find(|f| f.role.as_deref() == Some("trash")).map(|f| f.name) }
        }
    })
}

/// The parts of a request [`resolve`] reads.
struct BatchLike<'a> {
    update: Option<&'a MessageUpdate>,
    folder: Option<&'a str>,
    /// Where the update's fields sit in the body (`update.` in a batch).
    prefix: &'a str,
}

/// Does `action` to `uids` of `folder` (under `uidvalidity`) on `remote`;
/// the UIDs the server no longer has are left out of the answer.
async fn act(
    remote: &mut Remote,
    folder: &str,
    uidvalidity: u32,
    uids: &[u32],
    action: &Action,
) -> Result<BTreeMap<u32, Done>, RemoteError> {
    if !remote.enter(folder, uidvalidity, true).await? {
        return Ok(BTreeMap::new());
    }
    let present: Vec<u32> = remote.flags(uids).await?.into_keys().collect();
    if present.is_empty() {
        return Ok(BTreeMap::new());
    }
    let moved = |to: Option<String>| present.iter().map(|u| (*u, Done::In(to.clone()))).collect();
    Ok(match action {
        Action::Update { add, remove } => {
            remote.store(&present, add, remove).await?;
            remote.flags(&present).await?.into_iter().map(|(u, f)| (u, Done::Flags(f))).collect()
        }
        Action::Move { target } if target == folder => moved(Some(folder.to_string())),
        Action::Move { target } => {
            remote.move_to(&present, target).await?;
            moved(Some(target.clone()))
        }
        Action::Delete { trash: Some(trash) } if trash != folder => {
            remote.move_to(&present, trash).await?;
            moved(Some(trash.clone()))
        }
        Action::Delete { .. } => {
            remote.expunge(&present).await?;
            moved(None)
        }
    })
}

/// Does `action` to the messages `keys` of account `id`, one connection
/// and one command per folder; the outcome of each key, in order.
async fn apply(
    state: &ApiState,
    id: &str,
    keys: &[Option<MessageKey>],
    action: &Action,
) -> Result<Vec<Option<Done>>, ApiError> {
    let mut by_folder: BTreeMap<(&str, u32), Vec<u32>> = BTreeMap::new();
    for key in keys.iter().flatten() {
        by_folder.entry((key.folder.as_str(), key.uidvalidity)).or_default().push(key.uid);
    }
    let mut done: BTreeMap<(String, u32, u32), Done> = BTreeMap::new();
    if !by_folder.is_empty() {
        let mut remote = state.remote(id).await?;
        let mut failure = None;
        for ((folder, uidvalidity), uids) in &by_folder {
            match act(&mut remote, folder, *uidvalidity, uids, action).await {
                Ok(outcome) => {
                    done.extend(outcome.into_iter().map(|(uid, d)| ((folder.to_string(), *uidvalidity, uid), d)))
                }
                Err(e) => {
                    failure = Some(move_failure(id, action, e));
                    break;
                }
            }
        }
        remote.close().await;
        if let Some(e) = failure {
            return Err(e);
        }
    }
    Ok(keys
        .iter()
        .map(|k| k.as_ref().and_then(|k| done.get(&(k.folder.clone(), k.uidvalidity, k.uid)).cloned()))
        .collect())
}

/// A refused MOVE/COPY names the target folder: it is gone from the server.
fn move_failure(id: &str, action: &Action, e: RemoteError) -> ApiError {
    let target = match action {
        Action::Move { target } | Action::Delete { trash: Some(target) } => target,
        _ => return imap_failure(id, &e),
    };
    match &e {
        RemoteError::No { op, answer, .. } if op.starts_with("UID MOVE") || op.starts_with("UID COPY") => {
            ApiError::field("folder", format!("the server refused to move mail to {target:?}: {answer}"))
        }
        _ => imap_failure(id, &e),
    }
}

/// `PATCH /v1/accounts/{id}/messages/{message_id}`.
#[utoipa::path(patch, path = "/v1/accounts/{id}/messages/{message_id}", tag = "mail", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("message_id" = String, Path, description = "A message's `id` from a list or an event"),
    ),
    request_body = MessageUpdate,
    responses(
        (status = 200, description = "The flags the server confirmed (UID STORE); the change reaches the \
            list and the WebSocket (`message.updated`) through the sync", body = MessageFlags),
        (status = 400, description = "A bad field (named), or nothing to change", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, or no such message (on the server too)",
            body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server failed (`imap_unavailable`); retry later", body = ErrorBody),
    ))]
pub async fn update_message(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path((id, message_id)): Path<(String, String)>,
    ApiJson(update): ApiJson<MessageUpdate>,
) -> Result<Json<MessageFlags>, ApiError> {
    let (key, _) = stored(&state, &auth, &id, &message_id).await?;
    let (add, remove) = update.flags("")?;
    match apply(&state, &id, &[Some(key)], &Action::Update { add, remove }).await?.pop().flatten() {
        Some(Done::Flags(flags)) => Ok(Json(MessageFlags { id: message_id, flags })),
        _ => Err(ApiError::NotFound { what: "message", id: message_id }),
    }
}

/// `POST /v1/accounts/{id}/messages/{message_id}/move`.
#[utoipa::path(post, path = "/v1/accounts/{id}/messages/{message_id}/move", tag = "mail",
    security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("message_id" = String, Path, description = "A message's `id` from a list or an event"),
    ),
    request_body = MoveTo,
    responses(
        (status = 200, description = "Moved on the server (MOVE, or COPY + \\Deleted + UID EXPUNGE); the \
            sync announces `message.deleted` here and `message.new` there", body = Moved),
        (status = 400, description = "No such folder in this account (named), or a bad body", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, or no such message (on the server too)",
            body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server failed (`imap_unavailable`); retry later", body = ErrorBody),
    ))]
pub async fn move_message(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path((id, message_id)): Path<(String, String)>,
    ApiJson(to): ApiJson<MoveTo>,
) -> Result<Json<Moved>, ApiError> {
    let (key, _) = stored(&state, &auth, &id, &message_id).await?;
    let like = BatchLike { update: None, folder: Some(&to.folder), prefix: "" };
    let action = resolve(&state, &id, ActionKind::Move, like).await?;
    one_moved(&state, &id, message_id, key, &action).await
}

/// `DELETE /v1/accounts/{id}/messages/{message_id}`.
#[utoipa::path(delete, path = "/v1/accounts/{id}/messages/{message_id}", tag = "mail", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("message_id" = String, Path, description = "A message's `id` from a list or an event"),
    ),
    responses(
        (status = 200, description = "Moved to the account's Trash, or expunged (`folder: null`) when it was \
            in Trash already or the account has none", body = Moved),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, or no such message (on the server too)",
            body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server failed (`imap_unavailable`); retry later", body = ErrorBody),
    ))]
pub async fn delete_message(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path((id, message_id)): Path<(String, String)>,
) -> Result<Json<Moved>, ApiError> {
    let (key, _) = stored(&state, &auth, &id, &message_id).await?;
    let like = BatchLike { update: None, folder: None, prefix: "" };
    let action = resolve(&state, &id, ActionKind::Delete, like).await?;
    one_moved(&state, &id, message_id, key, &action).await
}

async fn one_moved(
    state: &ApiState,
    id: &str,
    message_id: String,
    key: MessageKey,
    action: &Action,
) -> Result<Json<Moved>, ApiError> {
    match apply(state, id, &[Some(key)], action).await?.pop().flatten() {
        Some(Done::In(folder)) => Ok(Json(Moved { id: message_id, folder })),
        _ => Err(ApiError::NotFound { what: "message", id: message_id }),
    }
}

/// `POST /v1/accounts/{id}/messages/actions`.
#[utoipa::path(post, path = "/v1/accounts/{id}/messages/actions", tag = "mail", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)")),
    request_body = BatchAction,
    responses(
        (status = 200, description = "Each message's outcome, in the order of `ids` (one IMAP command per \
            folder)", body = BatchOutcome),
        (status = 400, description = "A bad field (named): no ids or more than 500, a missing `update` or \
            `folder`, no such folder", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
        (status = 502, description = "The IMAP server failed (`imap_unavailable`); retry later", body = ErrorBody),
    ))]
pub async fn batch(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<BatchAction>,
) -> Result<Json<BatchOutcome>, ApiError> {
    owned(&state, &auth, &id).await?;
    if body.ids.is_empty() || body.ids.len() > MAX_BATCH {
        return Err(ApiError::field("ids", format!("1 to {MAX_BATCH} message ids, got {}", body.ids.len())));
    }
    let like = BatchLike { update: body.update.as_ref(), folder: body.folder.as_deref(), prefix: "update." };
    let action = resolve(&state, &id, body.action, like).await?;
    // Only ids this account stores are acted on; the rest are not_found.
    let mut keys = Vec::with_capacity(body.ids.len());
    for message_id in &body.ids {
        let key = match MessageKey::decode(message_id) {
            Some(key) if state.storage.message(&id, &key).await?.is_some() => Some(key),
            _ => None,
        };
        keys.push(key);
    }
    let outcomes = apply(&state, &id, &keys, &action).await?;
    let results = body
        .ids
        .into_iter()
        .zip(outcomes)
        .map(|(id, done)| match done {
            Some(Done::Flags(flags)) => ActionOutcome { id, status: "ok".into(), flags: Some(flags), folder: None },
            Some(Done::In(folder)) => ActionOutcome { id, status: "ok".into(), flags: None, folder: Some(folder) },
            None => ActionOutcome { id, status: "not_found".into(), flags: None, folder: None },
        })
        .collect();
    Ok(Json(BatchOutcome { results }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(json: &str) -> Result<(Vec<String>, Vec<String>), String> {
        let u: MessageUpdate = super::super::json::parse(json.as_bytes()).map_err(|e| e.to_string())?;
        u.flags("").map_err(|e| e.to_string())
    }

    #[test]
    fn updates_become_flags_and_bad_ones_name_their_field() {
        let (add, remove) =
            update(r#"{"seen":true,"flagged":false,"keywords":{"add":["$Work"],"remove":["x"]}}"#).unwrap();
        assert_eq!(add, ["\\Seen", "$Work"]);
        assert_eq!(remove, ["\\Flagged", "x"]);
        assert!(update("{}").unwrap_err().starts_with("body: nothing to change"));
        assert!(update(r#"{"keywords":{"add":["a b"]}}"#).unwrap_err().starts_with("keywords.add[0]:"));
        assert!(update(r#"{"keywords":{"add":["\\Seen"]}}"#).unwrap_err().starts_with("keywords.add[0]:"));
        assert!(update(r#"{"keywords":{"add":[""]}}"#).is_err());
        assert!(update(r#"{"keywords":{"add":["k"],"remove":["k"]}}"#).unwrap_err().contains("both added and removed"));
        assert!(update(r#"{"seen":"yes"}"#).unwrap_err().starts_with("seen:"));
        assert!(update(r#"{"sen":true}"#).unwrap_err().starts_with("sen:"));
    }

    proptest::proptest! {
        #[test]
        fn a_keyword_is_accepted_only_if_it_can_go_on_the_wire_as_an_atom(s in "\\PC{0,12}") {
            if let Ok(k) = Keyword::try_from(s.clone()) {
                let atom = !k.0.is_empty() && k.0.bytes().all(|b| b.is_ascii_graphic() && !b"(){%*\"\\]".contains(&b));
                proptest::prop_assert!(atom, "{:?}", k);
            }
        }
    }
}
