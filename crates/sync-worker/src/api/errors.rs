//! The API's one error shape: `{"error":{"code","message"}}` with the
//! matching status. Internal failures are logged here, once, and answered
//! without their details.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::storage::StorageError;

/// The body of every error answer.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong, for programs (`code`) and people (`message`).
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// `unauthorized`, `bad_login`, `rate_limited`, `bad_request`, `not_found`,
    /// `conflict`, `signup_closed`, `imap_login_refused`, `imap_unreachable`, `imap_unusable`,
    /// `imap_unavailable`, `method_not_allowed`, `not_ready`, `unsupported_media_type`, `over_limit`, `quota_exceeded`,
    /// `uri_too_long`, `headers_too_large` or `internal`.
    #[schema(example = "bad_request")]
    pub code: String,
    /// A sentence; for `bad_request` it starts with the field (`port: ...`).
    #[schema(example = "port: must be 1 to 65535")]
    pub message: String,
}

impl ErrorBody {
    /// The body of error `code` saying `message`.
    pub(super) fn new(code: &str, message: String) -> Self {
        Self { error: ErrorDetail { code: code.to_string(), message } }
    }
}

/// What went wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No token, or one that is wrong or expired.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Bad e-mail address or password at login.
    #[error("wrong e-mail address or password")]
    BadLogin,
    /// Too many failed logins, or sign-ups.
    #[error("{what}: retry in {retry_after_s} s")]
    RateLimited {
        /// What was too many, in words.
        what: &'static str,
        /// Seconds until the next attempt is allowed.
        retry_after_s: u64,
    },
    /// The body is not valid JSON, or a field is missing or wrong.
    #[error("{field}: {message}")]
    BadField {
        /// The field (`email`, `port`, ...; `body` when the JSON itself is broken).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// Nothing of this kind that the caller may see.
    #[error("no {what} {id}")]
    NotFound {
        /// `account`, `message`, `folder`, `route`.
        what: &'static str,
        /// The id asked for.
        id: String,
    },
    /// Something unique already exists.
    #[error("{0} already exists")]
    Conflict(String),
    /// Sign-up is closed on this server.
    #[error("sign-up is closed on this server: ask the operator (`sync-worker user add`)")]
    SignupClosed,
    /// The IMAP server refused the login.
    #[error("the IMAP server refused the login: {answer}")]
    ImapRefused {
        /// The server's answer.
        answer: String,
    },
    /// The IMAP server could not be reached.
    #[error("could not reach the IMAP server {server}: {reason}")]
    ImapUnreachable {
        /// `host:port`.
        server: String,
        /// Why.
        reason: String,
    },
    /// The IMAP server was reached but cannot be used (its certificate,
    /// its protocol, a limit, or `plain` to an address that is not loopback).
    #[error("cannot use the IMAP server {server}: {reason}")]
    ImapUnusable {
        /// `host:port`.
        server: String,
        /// Why, in words.
        reason: String,
    },
    /// The account's IMAP server could not do what was asked (read a
    /// message, change one): unreachable, refusing the stored login, failing
    /// or refusing the command, or lacking what the action needs.
    #[error("the IMAP server of account {account} failed: {reason}; retry later")]
    ImapFailed {
        /// The account.
        account: String,
        /// Why, in words (the error chain).
        reason: String,
    },
    /// `GET /v1/ws` without a valid WebSocket upgrade (a plain GET, a
    /// missing or wrong `Connection`, `Upgrade` or `Sec-WebSocket-*` header).
    #[error("not a WebSocket upgrade request: {source}; connect with a WebSocket client")]
    NotWebSocket {
        /// axum's reason.
        #[source]
        source: axum::extract::ws::rejection::WebSocketUpgradeRejection,
    },
    /// A body that is not `application/json`.
    #[error("the body must be JSON, sent as `Content-Type: application/json`; it came as {got}")]
    NotJson {
        /// The request's content type, quoted, or `no Content-Type`.
        got: String,
    },
    /// Too many of something per user or per client (the setting is named).
    #[error("{what}: at most {limit} ({setting}); {remedy}")]
    OverLimit {
        /// What there would be too many of.
        what: &'static str,
        /// The bound.
        limit: u64,
        /// The setting that sets it.
        setting: &'static str,
        /// What the caller can do.
        remedy: &'static str,
    },
    /// The user has as many of something as one user may keep.
    #[error("{what}: at most {limit} per user ({setting}); remove one first")]
    Quota {
        /// What there would be too many of.
        what: &'static str,
        /// The bound.
        limit: u64,
        /// The setting that sets it.
        setting: &'static str,
    },
    /// `GET /readyz`: a dependency does not answer.
    #[error("{what} does not answer: {reason}")]
    NotReady {
        /// `the database` or `the lease store`.
        what: &'static str,
        /// Its error, or that it did not answer in time.
        reason: String,
    },
    /// Anything else: a storage or backend failure.
    #[error("internal error while trying to {op}")]
    Internal {
        /// What was being done.
        op: String,
        /// Why.
        #[source]
        source: crate::errors::BoxError,
    },
}

impl ApiError {
    /// A bad field.
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::BadField { field: field.into(), message: message.into() }
    }

    /// An internal failure while doing `op`.
    pub fn internal(op: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        ApiError::Internal { op: op.into(), source: Box::new(source) }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::BadLogin => (StatusCode::UNAUTHORIZED, "bad_login"),
            ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::BadField { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::SignupClosed => (StatusCode::FORBIDDEN, "signup_closed"),
            ApiError::ImapRefused { .. } => (StatusCode::BAD_REQUEST, "imap_login_refused"),
            ApiError::ImapUnreachable { .. } => (StatusCode::BAD_REQUEST, "imap_unreachable"),
            ApiError::ImapUnusable { .. } => (StatusCode::BAD_REQUEST, "imap_unusable"),
            ApiError::NotWebSocket { .. } => (StatusCode::BAD_REQUEST, "not_websocket"),
            ApiError::ImapFailed { .. } => (StatusCode::BAD_GATEWAY, "imap_unavailable"),
            ApiError::NotReady { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            ApiError::NotJson { .. } => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::OverLimit { .. } => (StatusCode::TOO_MANY_REQUESTS, "over_limit"),
            ApiError::Quota { .. } => (StatusCode::FORBIDDEN, "quota_exceeded"),
            ApiError::Internal { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// A failure of the account's IMAP server, logged here.
pub(super) fn imap_failure(account: &str, e: &crate::imap::remote::RemoteError) -> ApiError {
    let reason = crate::errors::error_chain(e);
    tracing::warn!(%account, error = %reason, "the IMAP server failed an API request");
    ApiError::ImapFailed { account: account.to_string(), reason }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Duplicate { what } => ApiError::Conflict(what),
            e => ApiError::internal("use the database", e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Internal { .. } = &self {
            tracing::error!(error = %crate::errors::error_chain(&self), "request failed");
        }
        let body = ErrorBody::new(code, self.to_string());
        let mut response = (status, Json(body)).into_response();
        if let ApiError::RateLimited { retry_after_s, .. } = self {
            if let Ok(v) = axum::http::HeaderValue::from_str(&retry_after_s.to_string()) {
                response.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// The answer to a route that does not exist.
pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound { what: "route", id: uri.path().to_string() }
}

/// The answer to a route called with a method it does not take.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let body = ErrorBody::new("method_not_allowed", format!("{method} is not allowed on {}", uri.path()));
    (StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}
