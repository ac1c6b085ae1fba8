//! A user's webhooks: `POST`/`GET /v1/webhooks`, `GET`/`DELETE
//! /v1/webhooks/{id}`, `POST /v1/webhooks/{id}/resume` and `GET
//! /v1/webhooks/{id}/deliveries`. Another user's webhook answers 404, as
//! one that does not exist. Delivery itself is the workers' (see
//! [`crate::webhooks`]).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;

use super::auth::AuthUser;
use super::errors::{ApiError, ErrorBody};
use super::json::ApiJson;
use super::state::ApiState;
use crate::events::MailEventKind;
use crate::storage::{DeliveryRecord, WebhookRecord};
use crate::webhooks::check_url;
use crate::webhooks::signature::new_secret;

/// Most webhooks one user may have.
pub const MAX_WEBHOOKS_PER_USER: usize = 20;
/// Default number of deliveries listed.
pub const DEFAULT_DELIVERIES: u32 = 50;
/// Most deliveries listed at once.
pub const MAX_DELIVERIES: u32 = 500;

/// `POST /v1/webhooks`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    /// Where events are POSTed: `http` or `https`, at a public address
    /// (unless the operator sets `IMAP_ALLOW_PRIVATE=true`), without a user
    /// name or password.
    #[schema(format = "uri", max_length = 2048, example = "https://example.com/hooks/mail")]
    pub url: String,
    /// The events it takes, at least one.
    #[schema(min_items = 1, max_items = 3)]
    pub events: Vec<MailEventKind>,
}

/// A webhook as the API shows it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct WebhookView {
    /// Its id (a UUID).
    pub id: String,
    /// Where events are POSTed.
    pub url: String,
    /// The events it takes.
    pub events: Vec<MailEventKind>,
    /// `active`, or `paused` (a delivery used up its retries: nothing is
    /// sent until `POST /v1/webhooks/{id}/resume`; events are held meanwhile).
    #[schema(example = "active")]
    pub state: String,
    /// Why it was paused.
    pub paused_reason: Option<String>,
    /// When it was paused (ms since the epoch).
    pub paused_at: Option<i64>,
    /// When it was made (ms since the epoch).
    pub created_at: i64,
    /// The last 2xx answer (ms since the epoch).
    pub last_success_at: Option<i64>,
    /// The last failed attempt (ms since the epoch).
    pub last_failure_at: Option<i64>,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
    /// Deliveries not yet delivered (waiting, retrying or held).
    pub undelivered: i64,
}

impl From<WebhookRecord> for WebhookView {
    fn from(w: WebhookRecord) -> Self {
        Self {
            state: if w.paused_at.is_some() { "paused" } else { "active" }.to_string(),
            id: w.id,
            url: w.url,
            events: w.events,
            paused_reason: w.paused_reason,
            paused_at: w.paused_at,
            created_at: w.created_at,
            last_success_at: w.last_success_at,
            last_failure_at: w.last_failure_at,
            last_error: w.last_error,
            undelivered: w.undelivered,
        }
    }
}

/// The answer of `POST /v1/webhooks`: the webhook and its signing secret,
/// shown this once.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CreatedWebhook {
    /// The webhook.
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// The key of the `X-Webhook-Signature` HMAC-SHA256 (`sha256=<hex>` of
    /// the body). Keep it: it is not shown again.
    #[schema(example = "whsec_5f2b…")]
    pub secret: String,
}

/// `GET /v1/webhooks`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct WebhookList {
    /// Oldest first.
    pub webhooks: Vec<WebhookView>,
}

/// `GET /v1/webhooks/{id}/deliveries`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct DeliveryList {
    /// Newest first.
    pub deliveries: Vec<DeliveryRecord>,
}

/// `POST /v1/webhooks`: checks the URL's address, then saves the webhook.
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = [])),
    request_body = NewWebhook,
    responses(
        (status = 201, description = "The webhook; events from now on are POSTed to it, signed with `secret`", body = CreatedWebhook),
        (status = 400, description = "A bad field: the URL (its form, or an address that is not public), an unknown event, no events, or too many webhooks", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<ApiState>,
    auth: AuthUser,
    ApiJson(body): ApiJson<NewWebhook>,
) -> Result<(StatusCode, Json<CreatedWebhook>), ApiError> {
    let mut events = body.events;
    events.sort_by_key(|e| e.as_str());
    events.dedup();
    if events.is_empty() {
        return Err(ApiError::field(
            "events",
            "must name at least one of message.new, message.updated, message.deleted",
        ));
    }
    let url = check_url(&body.url, state.settings.imap.allow_private)
        .await
        .map_err(|e| ApiError::field("url", e.to_string()))?;
    if state.storage.webhooks(&auth.user).await?.len() >= MAX_WEBHOOKS_PER_USER {
        return Err(ApiError::field(
            "url",
            format!("a user may have at most {MAX_WEBHOOKS_PER_USER} webhooks: delete one first"),
        ));
    }
    let secret = new_secret();
    let webhook = state.storage.add_webhook(&auth.user, url.as_str(), &events, &secret).await?;
    tracing::info!(webhook = %webhook.id, user = %auth.user, "webhook added");
    Ok((StatusCode::CREATED, Json(CreatedWebhook { webhook: webhook.into(), secret })))
}

/// `GET /v1/webhooks`.
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = [])),
    responses(
        (status = 200, description = "The caller's webhooks", body = WebhookList),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn list(State(state): State<ApiState>, auth: AuthUser) -> Result<Json<WebhookList>, ApiError> {
    let webhooks = state.storage.webhooks(&auth.user).await?.into_iter().map(WebhookView::from).collect();
    Ok(Json(WebhookList { webhooks }))
}

async fn owned(state: &ApiState, auth: &AuthUser, id: &str) -> Result<WebhookRecord, ApiError> {
    state
        .storage
        .webhook(&auth.user, id)
        .await?
        .ok_or_else(|| ApiError::NotFound { what: "webhook", id: id.to_string() })
}

/// `GET /v1/webhooks/{id}`.
#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = [])),
    params(("id" = String, Path, description = "The webhook id (a UUID)")),
    responses(
        (status = 200, description = "The webhook, with its state", body = WebhookView),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such webhook of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn get(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    Ok(Json(owned(&state, &auth, &id).await?.into()))
}

/// `DELETE /v1/webhooks/{id}`: no further POST goes out for it.
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = [])),
    params(("id" = String, Path, description = "The webhook id (a UUID)")),
    responses(
        (status = 204, description = "The webhook and its deliveries are gone"),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such webhook of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn delete(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if !state.storage.remove_webhook(&auth.user, &id).await? {
        return Err(ApiError::NotFound { what: "webhook", id });
    }
    tracing::info!(webhook = %id, user = %auth.user, "webhook removed");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/webhooks/{id}/resume`: ends a pause; the held and failed
/// deliveries are sent again, with a fresh retry budget.
#[utoipa::path(post, path = "/v1/webhooks/{id}/resume", tag = "webhooks", security(("bearer" = [])),
    params(("id" = String, Path, description = "The webhook id (a UUID)")),
    responses(
        (status = 200, description = "The webhook, active again", body = WebhookView),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such webhook of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn resume(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    let resumed = state.storage.resume_webhook(&auth.user, &id).await?;
    let webhook = resumed.ok_or_else(|| ApiError::NotFound { what: "webhook", id: id.clone() })?;
    tracing::info!(webhook = %id, user = %auth.user, "webhook resumed");
    Ok(Json(webhook.into()))
}

/// `GET /v1/webhooks/{id}/deliveries`: the latest deliveries and what
/// happened to each.
#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks", security(("bearer" = [])),
    params(("id" = String, Path, description = "The webhook id (a UUID)"),
        ("limit" = Option<u32>, Query, description = "How many, newest first (1 to 500, default 50)",
            minimum = 1, maximum = 500)),
    responses(
        (status = 200, description = "Newest first", body = DeliveryList),
        (status = 400, description = "A bad `limit`", body = ErrorBody),
        (status = 401, description = "No token, or a wrong or expired one", body = ErrorBody),
        (status = 404, description = "No such webhook of the caller's", body = ErrorBody),
        (status = 500, description = "Internal failure", body = ErrorBody),
    ))]
pub async fn deliveries(
    State(state): State<ApiState>,
    auth: AuthUser,
    Path(id): Path<String>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Json<DeliveryList>, ApiError> {
    let mut limit = DEFAULT_DELIVERIES;
    for (name, value) in &pairs {
        match name.as_str() {
            "limit" => {
                limit = value.parse().ok().filter(|n| (1..=MAX_DELIVERIES).contains(n)).ok_or_else(|| {
                    ApiError::field("limit", format!("must be a whole number from 1 to {MAX_DELIVERIES}"))
                })?
            }
            other => return Err(ApiError::field(other, "is not a parameter of this route (only `limit`)")),
        }
    }
    owned(&state, &auth, &id).await?;
    Ok(Json(DeliveryList { deliveries: state.storage.webhook_deliveries(&id, limit).await? }))
}
