//! Users, logins and sessions.
//!
//! Passwords are hashed with argon2id (the `argon2` crate's defaults: 19 MiB,
//! 2 passes), on the blocking pool. A session token is 256 random bits
//! (URL-safe base64) that the client keeps; the database stores only its
//! SHA-256, with an expiry. Failed logins slow down the pair of e-mail and
//! client address, and sign-ups are bounded per client address (`limiter`).

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use leasehold_core::UserId;
use sha2::{Digest, Sha256};

use super::errors::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::state::ApiState;
use crate::events::{EventSink as _, SessionEnded, SyncEvent};
use crate::storage::{now_ms, Email};

/// Shortest password accepted at sign-up.
pub const MIN_PASSWORD_LEN: usize = 8;
/// Longest password accepted (argon2 hashes whatever it is given).
pub const MAX_PASSWORD_LEN: usize = 1024;

/// `POST /v1/users` and `POST /v1/login`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// The user's e-mail address: name@domain, without spaces or control characters.
    #[schema(max_length = 254, pattern = r"^\s*[^\s@\x00-\x1f\x7f-\x9f]+@[^\s@\x00-\x1f\x7f-\x9f]+\s*$")]
    pub email: String,
    /// Their password (8 to 1024 characters at sign-up).
    #[schema(min_length = 8, max_length = 1024)]
    pub password: String,
}

/// A fresh session.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct LoginAnswer {
    /// The bearer token (shown once, never stored).
    pub token: String,
    /// When it expires (ms since the epoch).
    pub expires_at: i64,
}

/// A new session token and the hash under which it is stored.
pub fn new_token() -> (String, String) {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    let token = B64URL.encode(bytes);
    let hash = token_hash(&token);
    (token, hash)
}

/// The stored name of `token`: hex SHA-256.
pub fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// An argon2id PHC string of `password`.
pub async fn hash_password(password: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default().hash_password(password.as_bytes(), &salt).map(|h| h.to_string())
    })
    .await
    .map_err(|e| ApiError::internal("hash a password", e))?
    .map_err(|e| ApiError::Internal { op: "hash a password".into(), source: e.to_string().into() })
}

/// Whether `password` matches the PHC string `hash` (any other string: no).
pub async fn verify_password(password: String, hash: Option<String>) -> Result<bool, ApiError> {
    tokio::task::spawn_blocking(move || {
        // A user without a password (or no user at all) costs the same as a
        // wrong password, so timing does not tell which addresses exist.
        let hash = hash.unwrap_or_else(|| dummy_hash().to_string());
        let Ok(parsed) = PasswordHash::new(&hash) else { return false };
        Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok()
    })
    .await
    .map_err(|e| ApiError::internal("check a password", e))
}

fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default().hash_password(b"no such user", &salt).map(|h| h.to_string()).unwrap_or_default()
    })
}

fn email_field(email: &str) -> Result<Email, ApiError> {
    email.parse::<Email>().map_err(|e| ApiError::field("email", e.to_string()))
}

/// The id of what a `POST` made.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Created {
    /// Its id (a UUID).
    pub id: String,
}

/// `POST /v1/users`: sign up.
#[utoipa::path(post, path = "/v1/users", tag = "users",
    request_body = Credentials,
    responses(
        (status = 201, description = "The user was made", body = Created),
        (status = 400, description = "A bad e-mail address or password (the message names the field)", body = ErrorBody),
        (status = 403, description = "Sign-up is closed on this server", body = ErrorBody),
        (status = 409, description = "A user with this e-mail address exists", body = ErrorBody),
        (status = 429, description = "Too many sign-ups from this client address (SIGNUPS_PER_HOUR, `Retry-After`)", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn sign_up(
    State(state): State<ApiState>,
    ClientAddr(ip): ClientAddr,
    ApiJson(body): ApiJson<Credentials>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    if !state.settings.signup_open {
        return Err(ApiError::SignupClosed);
    }
    state.signups.attempt(ip)?;
    let email = email_field(&body.email)?;
    let n = body.password.chars().count();
    if !(MIN_PASSWORD_LEN..=MAX_PASSWORD_LEN).contains(&n) {
        return Err(ApiError::field(
            "password",
            format!("must be {MIN_PASSWORD_LEN} to {MAX_PASSWORD_LEN} characters long, got {n}"),
        ));
    }
    let hash = hash_password(body.password).await?;
    let user = state.storage.add_user(&email).await?;
    state.storage.set_password_hash(&user.id, &hash).await?;
    tracing::info!(user = %user.id, "user signed up");
    Ok((StatusCode::CREATED, Json(Created { id: user.id.to_string() })))
}

/// `POST /v1/login`: a new session, and the user is present.
#[utoipa::path(post, path = "/v1/login", tag = "users",
    request_body = Credentials,
    responses(
        (status = 200, description = "A new session; the user is present (their accounts turn hot)", body = LoginAnswer),
        (status = 400, description = "A malformed body (the message names the field)", body = ErrorBody),
        (status = 401, description = "Wrong e-mail address or password", body = ErrorBody),
        (status = 429, description = "Failed logins of this address from this client must wait (the wait doubles \
            with each failure), or this client has failed too often (`Retry-After`)", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn login(
    State(state): State<ApiState>,
    ClientAddr(ip): ClientAddr,
    ApiJson(body): ApiJson<Credentials>,
) -> Result<Json<LoginAnswer>, ApiError> {
    let email = email_field(&body.email)?;
    if let Err(e) = state.limiter.check(email.as_str(), ip) {
        metrics::counter!("sync_worker_api_logins_total", "outcome" => "limited").increment(1);
        return Err(e);
    }
    let found = state.storage.password_hash(&email).await?;
    let (user, hash) = match found {
        Some((user, hash)) => (Some(user), hash),
        None => (None, None),
    };
    let ok = verify_password(body.password, hash).await?;
    let Some(user) = user.filter(|_| ok) else {
        state.limiter.failed(email.as_str(), ip);
        metrics::counter!("sync_worker_api_logins_total", "outcome" => "failed").increment(1);
        return Err(ApiError::BadLogin);
    };
    state.limiter.succeeded(email.as_str(), ip);
    metrics::counter!("sync_worker_api_logins_total", "outcome" => "ok").increment(1);
    let (token, hash) = new_token();
    let expires_at = now_ms() + state.settings.session_ttl.as_millis() as i64;
    state.storage.add_session(&hash, &user, expires_at).await?;
    state.present(&user).await?;
    Ok(Json(LoginAnswer { token, expires_at }))
}

/// `POST /v1/logout`: ends the session of the token used.
#[utoipa::path(post, path = "/v1/logout", tag = "users", security(("bearer" = [])),
    responses(
        (status = 204, description = "The session has ended, and its WebSockets close (code 4001)"),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn logout(State(state): State<ApiState>, auth: AuthUser) -> Result<StatusCode, ApiError> {
    state.storage.remove_session(&auth.token_hash).await?;
    // The session's WebSockets close now, in whichever API process holds them.
    let ended = SessionEnded { user: auth.user.to_string(), token_hash: auth.token_hash };
    state.bus.publish(vec![SyncEvent::SessionEnded(ended)]);
    Ok(StatusCode::NO_CONTENT)
}

/// The client's IP address, when the server records it (it does: see [`super::serve`]).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddr(parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())))
    }
}

/// The user a request's bearer token belongs to.
#[derive(Debug, Clone)]
pub struct AuthUser {
    /// The user.
    pub user: UserId,
    /// The hash of the token used.
    pub token_hash: String,
    /// When the session expires (ms since the epoch).
    pub expires_at: i64,
}

/// The bearer token of `parts`, if it carries one.
pub fn bearer(parts: &Parts) -> Result<Option<&str>, ApiError> {
    let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) else { return Ok(None) };
    let value = value.to_str().map_err(|_| ApiError::Unauthorized("the Authorization header is not text"))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            Ok(Some(token.trim()))
        }
        _ => Err(ApiError::Unauthorized("the Authorization header must be `Bearer <token>`")),
    }
}

/// The user of `token`: 401 when it is unknown or expired.
pub async fn authenticate(state: &ApiState, token: &str) -> Result<AuthUser, ApiError> {
    let token_hash = token_hash(token);
    match state.storage.session(&token_hash).await? {
        Some(s) => Ok(AuthUser { user: s.user, token_hash, expires_at: s.expires_at }),
        None => Err(ApiError::Unauthorized("the token is wrong or expired: log in again (POST /v1/login)")),
    }
}

/// A request's bearer token, not yet checked against the sessions: 401 when
/// the request carries none. For handlers that fold the session check into
/// their own query ([`AuthUser`] checks it first).
#[derive(Debug, Clone)]
pub struct BearerToken(pub String);

impl<S: Send + Sync> FromRequestParts<S> for BearerToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let token = bearer(parts)?
            .ok_or(ApiError::Unauthorized("no token: send `Authorization: Bearer <token>` (POST /v1/login)"))?;
        Ok(BearerToken(token.to_string()))
    }
}

impl FromRequestParts<ApiState> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
        let BearerToken(token) = BearerToken::from_request_parts(parts, state).await?;
        authenticate(state, &token).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_256_random_bits_stored_as_their_hash() {
        let (a, ha) = new_token();
        let (b, _) = new_token();
        assert_ne!(a, b);
        assert_eq!(B64URL.decode(&a).unwrap().len(), 32);
        assert_eq!(ha, token_hash(&a));
        assert_eq!(ha.len(), 64);
        assert!(!ha.contains(&a));
    }

    #[tokio::test]
    async fn passwords_verify_only_against_their_own_hash() {
        let h = hash_password("correct horse".into()).await.unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse".into(), Some(h.clone())).await.unwrap());
        assert!(!verify_password("wrong horse".into(), Some(h)).await.unwrap());
        assert!(!verify_password("anything".into(), None).await.unwrap());
        assert!(!verify_password("anything".into(), Some("garbage".into())).await.unwrap());
    }
}
