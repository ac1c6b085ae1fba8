//! Accounts, folders and messages, each only for the user who owns them:
//! another user's account answers 404, as one that does not exist.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use leasehold_core::{LeaseKey, Tier};

use super::auth::Created;
use super::auth::{authenticate, token_hash, AuthUser, BearerToken};
use super::errors::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::state::ApiState;
use crate::imap::{ImapSource, LoginError};
use crate::oauth2::{grant_from, OAuth2Grant, OAuth2Provider};
use crate::storage::{
    search_terms, AccountAuth, AccountSummary, Credentials, FolderInfo, LoginChange, MessageSummary, NewAccount,
    SearchCursor, Security,
};

/// Default page size of a message list.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page size of a message list.
pub const MAX_LIMIT: u32 = 500;

/// `POST /v1/accounts`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddAccount {
    /// The IMAP server's host name or address, without spaces.
    #[schema(min_length = 1, max_length = 253, pattern = r"^\s*[^\s\x00-\x1f\x7f-\x9f]+\s*$")]
    pub host: String,
    /// Its port.
    #[serde(deserialize_with = "super::json::port")]
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// `tls`, `starttls` or `plain`.
    pub security: Security,
    /// The IMAP login.
    #[schema(min_length = 1, max_length = 1024, pattern = r"\S")]
    pub username: String,
    /// The IMAP password (stored encrypted); give it or `oauth2`.
    #[schema(min_length = 1, max_length = 1024)]
    pub password: Option<String>,
    /// An OAuth2 grant (stored encrypted) instead of a password.
    pub oauth2: Option<OAuth2Fields>,
}

/// An account's OAuth2 grant, as the API takes it: the refresh token of an
/// authorization the user gave this client (scope `https://mail.google.com/`
/// for Gmail, `https://outlook.office.com/IMAP.AccessAsUser.All
/// offline_access` for Microsoft 365).
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuth2Fields {
    /// `google` or `microsoft`: their token endpoint and scope.
    pub provider: Option<OAuth2Provider>,
    /// The token endpoint (https), for another provider, or to override the preset's.
    #[schema(format = "uri", max_length = 2048)]
    pub token_url: Option<String>,
    /// The OAuth2 client id.
    #[schema(min_length = 1, max_length = 1024)]
    pub client_id: String,
    /// The client secret, unless the client is public.
    #[schema(max_length = 1024)]
    pub client_secret: Option<String>,
    /// The refresh token.
    #[schema(min_length = 1, max_length = 8192)]
    pub refresh_token: String,
    /// The scope to ask for on refresh, overriding the preset's.
    #[schema(max_length = 1024)]
    pub scope: Option<String>,
}

impl OAuth2Fields {
    fn grant(self) -> Result<OAuth2Grant, ApiError> {
        grant_from(self.provider, self.token_url, self.client_id, self.client_secret, self.refresh_token, self.scope)
            .map_err(|e| ApiError::field("oauth2", e.to_string()))
    }
}

/// The login of a body holding `password` or `oauth2`; `None` for neither
/// when `optional`.
fn auth_of(
    password: Option<String>,
    oauth2: Option<OAuth2Fields>,
    optional: bool,
) -> Result<Option<AccountAuth>, ApiError> {
    match (password, oauth2) {
        (Some(_), Some(_)) => Err(ApiError::field("oauth2", "give a password or an OAuth2 grant, not both")),
        (Some(p), None) => {
            required("password", &p)?;
            Ok(Some(AccountAuth::Password(p)))
        }
        (None, Some(o)) => Ok(Some(AccountAuth::OAuth2(o.grant()?))),
        (None, None) if optional => Ok(None),
        (None, None) => Err(ApiError::field("password", "must not be empty (or give an OAuth2 grant in oauth2)")),
    }
}

/// An account as the API shows it (also the body of an `account.status` event).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct AccountView {
    /// Its id.
    pub id: String,
    /// The IMAP server's host name.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// How it is reached.
    pub security: Security,
    /// The IMAP login.
    pub username: String,
    /// `hot`, `warm` or `cold`; `None` until a worker has claimed it.
    pub tier: Option<String>,
    /// The worker that holds its lease (or last wrote for it).
    pub owner: Option<String>,
    /// When its last poll ended well (ms since the epoch).
    pub last_sync_at: Option<i64>,
    /// The last poll's error, cleared by the next good one.
    pub last_error: Option<String>,
    /// Its folders with their message counts (only for one account).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folders: Option<Vec<FolderInfo>>,
    /// While stored mail is behind what the server said its folders hold
    /// (a first sync, or a big arrival): how far it has come (only for one
    /// account, with `folders`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_progress: Option<SyncProgress>,
}

/// Messages stored of those the server holds, over every folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct SyncProgress {
    /// Messages stored.
    pub synced: i64,
    /// Messages the server said its folders hold when they were last selected.
    pub total: i64,
}

impl SyncProgress {
    /// The progress over `folders`; `None` when nothing is behind.
    pub fn of(folders: &[FolderInfo]) -> Option<Self> {
        let known = folders.iter().filter_map(|f| f.on_server.map(|n| (f.messages.min(n), n)));
        let (synced, total) = known.fold((0, 0), |(s, t), (m, n)| (s + m, t + n));
        (synced < total).then_some(Self { synced, total })
    }
}

/// A page of a message list.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct MessagePage {
    /// Newest first.
    pub messages: Vec<MessageSummary>,
    /// The `cursor` of the next page; `null` when this page is the last.
    pub next_cursor: Option<String>,
    /// Only in a search's answer: whether the IMAP server's own search of
    /// the bodies (`body=true`) was added to the index's matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub searched_bodies: Option<bool>,
}

impl MessagePage {
    /// `messages` as a page of at most `limit`: a full page may have more after it.
    fn new(messages: Vec<MessageSummary>, uidvalidity: u32, limit: u32) -> Self {
        let next_cursor = match messages.last() {
            Some(last) if messages.len() == limit as usize => Some(encode_cursor(uidvalidity, last.uid)),
            _ => None,
        };
        MessagePage { messages, next_cursor, searched_bodies: None }
    }
}

fn required(field: &'static str, value: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::field(field, "must not be empty"));
    }
    Ok(())
}

/// A host name or address as the API takes it.
fn check_host(host: &str) -> Result<(), ApiError> {
    required("host", host)?;
    if host.len() > 253 || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ApiError::field("host", "must be a host name or address, without spaces"));
    }
    Ok(())
}

/// `POST /v1/accounts`: checks the login against the server, then saves the
/// account (password encrypted) and marks it live.
#[utoipa::path(post, path = "/v1/accounts", tag = "accounts", security(("bearer" = [])),
    request_body = AddAccount,
    responses(
        (status = 201, description = "The IMAP login worked; the account is saved and will sync", body = Created),
        (status = 400, description = "A bad field, or the IMAP server refused the login or could not be reached \
            (`imap_login_refused` with the server's answer, `imap_unreachable`; `imap_unusable` when it was reached but its certificate was refused, it does not speak IMAP, or `plain` was asked for to an address that is not loopback)", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 409, description = "The caller has this account already", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn add(
    State(state): State<ApiState>,
    auth: AuthUser,
    ApiJson(body): ApiJson<AddAccount>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let host = body.host.trim().to_string();
    check_host(&host)?;
    if body.port == 0 {
        return Err(ApiError::field("port", "must be 1 to 65535"));
    }
    required("username", &body.username)?;
    let limit = state.settings.accounts_per_user;
    if state.storage.account_ids_of(&auth.user).await?.len() as u64 >= u64::from(limit) {
        return Err(ApiError::Quota { what: "accounts", limit: limit.into(), setting: "ACCOUNTS_PER_USER" });
    }
    let Some(login) = auth_of(body.password, body.oauth2, false)? else {
        return Err(ApiError::field("password", "must not be empty"));
    };
    let creds = Credentials {
        host: host.clone(),
        port: body.port,
        security: body.security,
        username: body.username.clone(),
        auth: login,
    };
    // The duplicate check comes after the login: it tells nothing to one
    // who does not hold the password.
    let server_ip = check_login(&state, &creds).await?;
    let duplicate =
        state.storage.same_mailbox(&auth.user, &host, body.port, &body.username, Some(server_ip), None).await?;
    if duplicate.is_some() {
        return Err(ApiError::Conflict(format!("account {}@{host}:{}", body.username, body.port)));
    }
    let id = state
        .storage
        .add_account(&NewAccount {
            user: auth.user.clone(),
            host,
            port: body.port,
            security: body.security,
            username: body.username,
            auth: creds.auth,
        })
        .await?;
    state.storage.record_server_ip(id.as_str(), server_ip).await?;
    // Its user is here adding it: it starts hot (the claim takes the stored
    // tier), not warm until the next tier evaluation; that evaluation
    // demotes it when the user's presence has passed. Stored before the
    // account is announced, so no owner starts it first.
    if let Err(e) = state.store.set_tier(&id, Tier::Hot).await {
        tracing::warn!(account = %id, error = %e, "could not store the new account's tier; it starts warm");
    }
    crate::leases::account_added(state.store.as_ref(), &id, state.storage.bucket_of(id.as_str()))
        .await
        .map_err(|e| ApiError::internal(format!("mark account {id} live"), e))?;
    tracing::info!(account = %id, user = %auth.user, "account added");
    Ok((StatusCode::CREATED, Json(Created { id: id.to_string() })))
}

/// Logs in with `creds` and out again, with the API's address rules, and
/// answers the server's address; the error says why it failed, never which
/// port state stopped it.
async fn check_login(state: &ApiState, creds: &Credentials) -> Result<std::net::IpAddr, ApiError> {
    match ImapSource::verify_login(creds, &state.settings.imap).await {
        Ok(ip) => Ok(ip),
        Err(LoginError::Refused { answer }) => Err(ApiError::ImapRefused { answer }),
        Err(e @ LoginError::Unreachable { .. }) => {
            let server = format!("{}:{}", creds.host, creds.port);
            // One answer for an unknown host, a closed port, a silent or a
            // filtered one: the API must not tell port states apart.
            tracing::info!(%server, error = %crate::errors::error_chain(&e), "IMAP login check: server unreachable");
            let reason = "no IMAP server answered there (unknown host, closed or filtered port, or no answer in time)";
            Err(ApiError::ImapUnreachable { server, reason: reason.into() })
        }
        Err(LoginError::Unusable { server, source }) => {
            // Reached, and found wanting: a refused certificate, not IMAP, a limit passed.
            Err(ApiError::ImapUnusable { server, reason: source.to_string() })
        }
    }
}

/// `PATCH /v1/accounts/{id}`: what changes; at least one field.
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateAccount {
    /// Another IMAP server host name or address, without spaces.
    #[schema(min_length = 1, max_length = 253, pattern = r"^\s*[^\s\x00-\x1f\x7f-\x9f]+\s*$")]
    pub host: Option<String>,
    /// Another port.
    #[serde(default, deserialize_with = "super::json::optional_port")]
    #[schema(minimum = 1, maximum = 65535)]
    pub port: Option<u16>,
    /// Another way to reach it: `tls`, `starttls` or `plain`.
    pub security: Option<Security>,
    /// Another IMAP password (stored encrypted).
    #[schema(min_length = 1, max_length = 1024)]
    pub password: Option<String>,
    /// Another OAuth2 grant (e.g. after the user authorized again).
    pub oauth2: Option<OAuth2Fields>,
}

/// `PATCH /v1/accounts/{id}`: changes the account's server, security or
/// password once the login works with them. Its synced mail stays, and a
/// login the server had refused is tried again at its next poll.
#[utoipa::path(patch, path = "/v1/accounts/{id}", tag = "accounts", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)")),
    request_body = UpdateAccount,
    responses(
        (status = 200, description = "The login worked with the changes; they are saved", body = AccountView),
        (status = 400, description = "A bad field, no field, or the IMAP login check failed as for `POST /v1/accounts`: nothing changed", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's", body = ErrorBody),
        (status = 409, description = "The change makes it the same as another account", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn update(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateAccount>,
) -> Result<Json<AccountView>, ApiError> {
    owned(&state, &auth, &id).await?;
    let host = body.host.map(|h| h.trim().to_string());
    if let Some(host) = &host {
        check_host(host)?;
    }
    if body.port == Some(0) {
        return Err(ApiError::field("port", "must be 1 to 65535"));
    }
    let login = auth_of(body.password, body.oauth2, true)?;
    let change = LoginChange { host, port: body.port, security: body.security, auth: login };
    if change.is_empty() {
        return Err(ApiError::field("host", "nothing to change: give host, port, security, password or oauth2"));
    }
    let key = LeaseKey::new(&id).map_err(|_| ApiError::NotFound { what: "account", id: id.clone() })?;
    let login = change.apply(state.storage.credentials(&key).await?);
    let server_ip = check_login(&state, &login).await?;
    let same =
        state.storage.same_mailbox(&auth.user, &login.host, login.port, &login.username, Some(server_ip), Some(&id));
    if same.await?.is_some() {
        return Err(ApiError::Conflict(format!("account {}@{}:{}", login.username, login.host, login.port)));
    }
    state.storage.update_login(&key, &login, Some(server_ip)).await?;
    tracing::info!(account = %id, user = %auth.user, "account login updated");
    let a = owned(&state, &auth, &id).await?;
    Ok(Json(view(&state, a, false).await?))
}

/// The account `id` when `auth`'s user owns it; 404 otherwise.
pub(super) async fn owned(state: &ApiState, auth: &AuthUser, id: &str) -> Result<AccountSummary, ApiError> {
    let not_found = || ApiError::NotFound { what: "account", id: id.to_string() };
    if state.storage.account_user(id).await?.as_ref() != Some(&auth.user) {
        return Err(not_found());
    }
    state.storage.account(id).await?.ok_or_else(not_found)
}

/// The account as `GET /v1/accounts/{id}` shows it (with folders) or the list does (without).
pub async fn view(state: &ApiState, a: AccountSummary, with_folders: bool) -> Result<AccountView, ApiError> {
    let (mut tier, mut owner) = (None, a.owner.clone());
    if let Ok(key) = LeaseKey::new(&a.id) {
        let lease_err = |e| ApiError::internal(format!("read the lease of account {}", a.id), e);
        tier = state.store.tier(&key).await.map_err(lease_err)?.map(|t| t.to_string());
        let bucket = state.storage.bucket_of(key.as_str());
        if let Some(lease) =
            crate::leases::account_holder(state.store.as_ref(), &key, bucket).await.map_err(lease_err)?
        {
            owner = Some(lease.owner.to_string());
        }
    }
    let folders = if with_folders { Some(state.storage.folders(&a.id).await?) } else { None };
    let sync_progress = folders.as_deref().and_then(SyncProgress::of);
    Ok(AccountView {
        id: a.id,
        host: a.host,
        port: a.port,
        security: a.security,
        username: a.username,
        tier,
        owner,
        last_sync_at: a.last_sync_at,
        last_error: a.last_error,
        folders,
        sync_progress,
    })
}

/// `GET /v1/accounts`: the caller's accounts, oldest first.
#[utoipa::path(get, path = "/v1/accounts", tag = "accounts", security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller's accounts, oldest first (without folders)", body = Vec<AccountView>),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn list(State(state): State<ApiState>, auth: AuthUser) -> Result<Json<Vec<AccountView>>, ApiError> {
    let mut out = Vec::new();
    for id in state.storage.account_ids_of(&auth.user).await? {
        if let Some(a) = state.storage.account(&id).await? {
            out.push(view(&state, a, false).await?);
        }
    }
    Ok(Json(out))
}

/// `GET /v1/accounts/{id}`: tier, owner, last sync, last error and folders.
#[utoipa::path(get, path = "/v1/accounts/{id}", tag = "accounts", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)")),
    responses(
        (status = 200, description = "Tier, owner, last sync, last error and folders", body = AccountView),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn get(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<AccountView>, ApiError> {
    let a = owned(&state, &auth, &id).await?;
    Ok(Json(view(&state, a, true).await?))
}

/// `DELETE /v1/accounts/{id}`: removes the account and its mail, and takes
/// it out of the live set (its owner's next renew fails and its sync stops).
#[utoipa::path(delete, path = "/v1/accounts/{id}", tag = "accounts", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)")),
    responses(
        (status = 204, description = "The account and its mail are gone; its sync stops"),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn delete(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    owned(&state, &auth, &id).await?;
    // The rows go first: a write racing this one finds no account and fails.
    state.storage.remove_account(&id).await?;
    if let Ok(key) = LeaseKey::new(&id) {
        crate::leases::account_removed(state.store.as_ref(), &key, state.storage.bucket_of(&id))
            .await
            .map_err(|e| ApiError::internal(format!("mark account {id} not live"), e))?;
    }
    tracing::info!(account = %id, user = %auth.user, "account removed");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/accounts/{id}/folders`.
#[utoipa::path(get, path = "/v1/accounts/{id}/folders", tag = "mail", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)")),
    responses(
        (status = 200, description = "The folders by name, with their message counts", body = Vec<FolderInfo>),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn folders(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<Vec<FolderInfo>>, ApiError> {
    owned(&state, &auth, &id).await?;
    Ok(Json(state.storage.folders(&id).await?))
}

/// What a message list asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// The folder (default `INBOX`).
    pub folder: String,
    /// The page size.
    pub limit: u32,
    /// Where the previous page ended: (UIDVALIDITY, last UID).
    pub cursor: Option<(u32, u32)>,
    /// A search (`q=`) instead of a plain list.
    pub search: Option<Search>,
}

/// What a search (`q=`) asks for.
#[derive(Debug, PartialEq, Eq)]
pub struct Search {
    /// The query's words ([`search_terms`]).
    pub terms: Vec<String>,
    /// Only this folder (`folder=`); every folder without it.
    pub folder: Option<String>,
    /// Where the previous page ended.
    pub after: Option<SearchCursor>,
    /// `body=true`: also ask the IMAP server to search the bodies.
    pub body: bool,
}

/// A cursor: after `uid` of a folder under `uidvalidity`.
pub fn encode_cursor(uidvalidity: u32, uid: u32) -> String {
    B64URL.encode(format!("{uidvalidity}:{uid}"))
}

fn decode_cursor(s: &str) -> Option<(u32, u32)> {
    let raw = String::from_utf8(B64URL.decode(s).ok()?).ok()?;
    let (v, u) = raw.split_once(':')?;
    Some((v.parse().ok()?, u.parse().ok()?))
}

impl ListQuery {
    /// Reads `folder`, `limit` and `cursor`; anything else, or a bad value, is a 400 naming it.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, ApiError> {
        let mut q = ListQuery { folder: "INBOX".into(), limit: DEFAULT_LIMIT, cursor: None, search: None };
        let (mut folder, mut cursor, mut words, mut body) = (None, None, None, None);
        for (k, v) in pairs {
            match k.as_str() {
                "folder" if !v.is_empty() => folder = Some(v.clone()),
                "folder" => return Err(ApiError::field("folder", "must not be empty")),
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| ApiError::field("limit", format!("must be 1 to {MAX_LIMIT}, got {v:?}")))?
                }
                "cursor" => cursor = Some(v.as_str()),
                "body" => {
                    body = Some(match v.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(ApiError::field("body", format!("must be true or false, got {v:?}"))),
                    })
                }
                "q" => {
                    let terms = search_terms(v);
                    if terms.is_empty() {
                        return Err(ApiError::field("q", "give at least one word (letters or digits) to search for"));
                    }
                    words = Some(terms);
                }
                other => {
                    return Err(ApiError::field(other, "unknown parameter: expected folder, limit, cursor, q or body"));
                }
            }
        }
        let bad_cursor = || ApiError::field("cursor", "is not a cursor from a previous page's next_cursor");
        match words {
            Some(terms) => {
                let after = cursor.map(|c| SearchCursor::decode(c).ok_or_else(bad_cursor)).transpose()?;
                q.search = Some(Search { terms, folder, after, body: body.unwrap_or(false) });
            }
            None if body.is_some() => return Err(ApiError::field("body", "searches bodies only with q")),
            None => {
                q.cursor = cursor.map(|c| decode_cursor(c).ok_or_else(bad_cursor)).transpose()?;
                if let Some(f) = folder {
                    q.folder = f;
                }
            }
        }
        Ok(q)
    }
}

/// `GET /v1/accounts/{id}/messages?folder=INBOX&limit=50&cursor=…`: newest
/// first; `next_cursor` is set when there may be more. With `q=`, a search
/// of subject, sender, recipients and preview (every folder unless
/// `folder=` names one), newest first by date.
#[utoipa::path(get, path = "/v1/accounts/{id}/messages", tag = "mail", security(("bearer" = [])),
    params(("id" = String, Path, description = "The account id (a UUID)"),
        ("folder" = Option<String>, Query, description = "The folder (default `INBOX`; with `q`, every folder)",
            min_length = 1, max_length = 1000),
        ("q" = Option<String>, Query, description = "Search: messages whose subject, sender, recipients or \
            preview hold every word (or a word starting with it), newest first; up to 16 words",
            min_length = 1, max_length = 1000),
        ("body" = Option<bool>, Query, description = "With `q`: also ask the IMAP server to search the bodies \
            (`UID SEARCH TEXT`), which are not stored; the answer says so (`searched_bodies`)"),
        ("limit" = Option<u32>, Query, description = "The page size, 1 to 500 (default 50)", minimum = 1, maximum = 500),
        ("cursor" = Option<String>, Query, description = "The previous page's `next_cursor`"),
    ),
    responses(
        (status = 200, description = "One page, newest first (by UID; by date for a search)", body = MessagePage),
        (status = 400, description = "A bad or unknown parameter (the message names it), or a cursor from \
            before the folder's UIDVALIDITY changed", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such account of the caller's, or no such folder", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn messages(
    State(state): State<ApiState>,
    BearerToken(token): BearerToken,
    Path(id): Path<String>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Json<MessagePage>, ApiError> {
    let q = match ListQuery::parse(&pairs) {
        Ok(q) => q,
        // 401 before 400: a caller without a valid token learns nothing more.
        Err(bad) => {
            authenticate(&state, &token).await?;
            return Err(bad);
        }
    };
    if let Some(search) = q.search {
        let auth = authenticate(&state, &token).await?;
        owned(&state, &auth, &id).await?;
        return Ok(Json(super::search::search_page(&state, &id, &search, q.limit).await?));
    }
    // The hot path: one query checks the session and the owner, and reads the page.
    let before = q.cursor.map(|(_, uid)| uid);
    if let Some((uidvalidity, page)) =
        state.storage.session_message_page(&token_hash(&token), &id, &q.folder, before, q.limit).await?
    {
        check_cursor(q.cursor, uidvalidity)?;
        return Ok(Json(MessagePage::new(page, uidvalidity, q.limit)));
    }
    // No page: find out why (each check gives its own answer), or it is empty.
    let auth = authenticate(&state, &token).await?;
    let Some(folder) = state.storage.owned_folder_uidvalidity(&auth.user, &id, &q.folder).await? else {
        return Err(ApiError::NotFound { what: "account", id });
    };
    let Some(uidvalidity) = folder else {
        return Err(ApiError::NotFound { what: "folder", id: q.folder });
    };
    check_cursor(q.cursor, uidvalidity)?;
    Ok(Json(MessagePage::new(Vec::new(), uidvalidity, q.limit)))
}

/// A cursor is good only under the UIDVALIDITY it was made under.
fn check_cursor(cursor: Option<(u32, u32)>, uidvalidity: u32) -> Result<(), ApiError> {
    match cursor {
        Some((v, _)) if v != uidvalidity => {
            Err(ApiError::field("cursor", "the folder was reset since (UIDVALIDITY changed): start over"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    fn bad_field(v: &[(&str, &str)]) -> String {
        match ListQuery::parse(&pairs(v)) {
            Err(ApiError::BadField { field, .. }) => field,
            other => panic!("{v:?}: {other:?}"),
        }
    }

    #[test]
    fn list_queries_default_and_name_bad_parameters() {
        let q = ListQuery::parse(&[]).unwrap();
        assert_eq!(q, ListQuery { folder: "INBOX".into(), limit: DEFAULT_LIMIT, cursor: None, search: None });
        let c = encode_cursor(7, 99);
        let q = ListQuery::parse(&pairs(&[("folder", "Sent"), ("limit", "10"), ("cursor", &c)])).unwrap();
        assert_eq!(q, ListQuery { folder: "Sent".into(), limit: 10, cursor: Some((7, 99)), search: None });
        let after = SearchCursor { date: 5, folder: "Sent".into(), uid: 3 };
        let q = ListQuery::parse(&pairs(&[("cursor", &after.encode()), ("q", "Carol's invoice")])).unwrap();
        let search = Search {
            terms: vec!["carol".into(), "s".into(), "invoice".into()],
            folder: None,
            after: Some(after),
            body: false,
        };
        assert_eq!(q.search, Some(search));
        assert_eq!(bad_field(&[("q", " ?! ")]), "q");
        assert_eq!(bad_field(&[("body", "true")]), "body");
        assert_eq!(bad_field(&[("q", "x"), ("body", "yes")]), "body");
        assert!(ListQuery::parse(&pairs(&[("q", "x"), ("body", "true")])).unwrap().search.unwrap().body);
        assert_eq!(bad_field(&[("q", "x"), ("cursor", &c)]), "cursor");
        assert_eq!(bad_field(&[("limit", "0")]), "limit");
        assert_eq!(bad_field(&[("limit", "x")]), "limit");
        assert_eq!(bad_field(&[("limit", "100000")]), "limit");
        assert_eq!(bad_field(&[("cursor", "zz")]), "cursor");
        assert_eq!(bad_field(&[("folder", "")]), "folder");
        assert_eq!(bad_field(&[("sort", "asc")]), "sort");
    }

    proptest::proptest! {
        #[test]
        fn any_query_parses_or_names_a_field(k in ".{0,12}", v in ".{0,24}") {
            let _ = ListQuery::parse(&[(k, v)]);
        }
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    fn folder(messages: i64, on_server: Option<i64>) -> FolderInfo {
        FolderInfo { name: "F".into(), role: None, uidvalidity: Some(1), messages, on_server, unread: 0 }
    }

    #[test]
    fn progress_shows_only_while_stored_mail_is_behind_the_server() {
        assert_eq!(SyncProgress::of(&[]), None);
        assert_eq!(SyncProgress::of(&[folder(5, Some(5)), folder(0, None)]), None);
        let behind = [folder(1200, Some(3000)), folder(10, Some(10)), folder(0, None)];
        assert_eq!(SyncProgress::of(&behind), Some(SyncProgress { synced: 1210, total: 3010 }));
        // More stored than the server said at its SELECT (new mail since): not behind.
        assert_eq!(SyncProgress::of(&[folder(7, Some(5))]), None);
    }
}
