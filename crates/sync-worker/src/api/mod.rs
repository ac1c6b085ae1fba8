//! The HTTP + WebSocket API (axum) and the web console.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/users` | sign up (`{"email","password"}` → 201 `{"id"}`), when `SIGNUP=open` |
//! | `POST /v1/login` | a session (`{"token","expires_at"}`); the user is present |
//! | `POST /v1/logout` | ends the session |
//! | `POST /v1/accounts`, `GET /v1/accounts` | add (IMAP login checked first), list |
//! | `GET`, `DELETE /v1/accounts/{id}` | status (tier, owner, last sync / error, folders), remove |
//! | `GET /v1/accounts/{id}/folders` | folders with counts |
//! | `GET /v1/accounts/{id}/messages` | newest first, `?folder=&limit=&cursor=` |
//! | `GET /v1/accounts/{id}/messages/{message_id}` | one message |
//! | `GET /v1/ws` | presence and live mail events ([`ws`]) |
//! | `GET /` | the console |
//! | `GET /v1/openapi.json` | the OpenAPI document, generated from the handlers ([`openapi`]) |
//!
//! Every error is `{"error":{"code","message"}}` ([`errors::ApiError`]).
//! Settings from the environment: `LISTEN` (default `127.0.0.1:8080`),
//! `SIGNUP` (`open`, the default, or `closed`), `SESSION_TTL` (default
//! `24h`); presence lasts `TIER_SESSION_GRACE_MIN`.

pub mod accounts;
pub mod auth;
pub mod errors;
pub mod json;
pub mod process;
pub mod ws;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::response::Html;
use axum::{Json, Router};
use leasehold_core::duration::{parse_duration, PlainUnit};
use leasehold_core::{LeaseStore, UserId};

use crate::errors::ConfigError;
use crate::events::EventBus;
use crate::imap::ImapSettings;
use crate::storage::Storage;
use errors::{ApiError, ErrorBody};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The default `LISTEN`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The API's settings.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// `LISTEN`: where to serve.
    pub listen: SocketAddr,
    /// `SIGNUP`: whether `POST /v1/users` is open.
    pub signup_open: bool,
    /// `SESSION_TTL`: how long a login's token lasts.
    pub session_ttl: Duration,
    /// `TIER_SESSION_GRACE_MIN`: how long a login or ping keeps the user present.
    pub presence_grace: Duration,
    /// The IMAP timeouts of the login check.
    pub imap: ImapSettings,
    /// Failed logins allowed per e-mail address per [`ApiSettings::login_window`].
    pub login_failures_per_email: u32,
    /// Failed logins allowed per client address per [`ApiSettings::login_window`].
    pub login_failures_per_client: u32,
    /// The window of the failed-login bounds.
    pub login_window: Duration,
}

impl ApiSettings {
    /// The defaults, with presence and IMAP timeouts from `config`.
    pub fn new(config: &crate::Config) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            signup_open: true,
            session_ttl: Duration::from_secs(24 * 3600),
            presence_grace: config.tier_session_grace,
            imap: ImapSettings::from(config),
            login_failures_per_email: 10,
            login_failures_per_client: 100,
            login_window: Duration::from_secs(300),
        }
    }

    /// [`ApiSettings::new`] with `LISTEN`, `SIGNUP` and `SESSION_TTL` read through `lookup`.
    pub fn from_lookup(config: &crate::Config, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut s = Self::new(config);
        let var = |name| lookup(name).filter(|v: &String| !v.trim().is_empty());
        if let Some(v) = var("LISTEN") {
            s.listen = v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "LISTEN",
                value: v.clone(),
                expected: "an address and port such as 127.0.0.1:8080 or [::]:8080".into(),
            })?;
        }
        if let Some(v) = var("SIGNUP") {
            s.signup_open = match v.trim() {
                "open" => true,
                "closed" => false,
                _ => {
                    return Err(ConfigError::Invalid { var: "SIGNUP", value: v, expected: "`open` or `closed`".into() })
                }
            };
        }
        if let Some(v) = var("SESSION_TTL") {
            s.session_ttl = parse_duration(&v, PlainUnit::Seconds).ok().filter(|d| d.as_millis() > 0).ok_or(
                ConfigError::Invalid { var: "SESSION_TTL", value: v, expected: "a duration such as 24h".into() },
            )?;
        }
        Ok(s)
    }

    /// [`ApiSettings::from_lookup`] on the process environment.
    pub fn from_env(config: &crate::Config) -> Result<Self, ConfigError> {
        Self::from_lookup(config, |k| std::env::var(k).ok())
    }
}

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    /// The database.
    pub storage: Storage,
    /// Leases, tiers and presence.
    pub store: Arc<dyn LeaseStore>,
    /// Where the engine's writes are announced.
    pub bus: EventBus,
    /// The settings.
    pub settings: Arc<ApiSettings>,
    /// Failed-login bounds.
    pub limiter: Arc<auth::LoginLimiter>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("storage", &self.storage)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// The state of an API on these parts.
    pub fn new(storage: Storage, store: Arc<dyn LeaseStore>, bus: EventBus, settings: ApiSettings) -> Self {
        let limiter = auth::LoginLimiter::new(
            settings.login_failures_per_email,
            settings.login_failures_per_client,
            settings.login_window,
        );
        Self { storage, store, bus, settings: Arc::new(settings), limiter: Arc::new(limiter) }
    }

    /// Refreshes `user`'s presence and publishes `user.active`.
    pub async fn present(&self, user: &UserId) -> Result<(), ApiError> {
        // The store takes a TTL that cannot be zero (`Ttl`).
        #[allow(clippy::useless_conversion)]
        let grace = self
            .settings
            .presence_grace
            .try_into()
            .map_err(|e| ApiError::internal("check the presence grace (TIER_SESSION_GRACE_MIN)", e))?;
        self.store
            .mark_user_active(user, grace)
            .await
            .map_err(|e| ApiError::internal(format!("refresh the presence of user {user}"), e))
    }
}

/// The console page.
pub const CONSOLE_HTML: &str = include_str!("console.html");

/// `GET /`: the web console.
#[utoipa::path(get, path = "/", tag = "console",
    responses((status = 200, description = "The web console (one HTML page)", content_type = "text/html", body = String)))]
async fn console() -> Html<&'static str> {
    Html(CONSOLE_HTML)
}

/// The document's frame: title, the bearer scheme, the error shape.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "sync-worker API", description = "Accounts, synced mail and live push. Every error is \
        `{\"error\":{\"code\",\"message\"}}` (ErrorBody)."),
    modifiers(&BearerScheme),
    components(schemas(ErrorBody, errors::ErrorDetail)),
)]
struct ApiDoc;

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The token of `POST /v1/login`, as `Authorization: Bearer <token>`".to_string()))
                    .build(),
            ),
        );
    }
}

/// Every route with its documentation: a route exists only through its
/// `#[utoipa::path]`, so what is served and what is documented are one list.
fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(<ApiDoc as utoipa::OpenApi>::openapi())
        .routes(routes!(console))
        .routes(routes!(openapi_json))
        .routes(routes!(auth::sign_up))
        .routes(routes!(auth::login))
        .routes(routes!(auth::logout))
        .routes(routes!(accounts::list, accounts::add))
        .routes(routes!(accounts::get, accounts::delete))
        .routes(routes!(accounts::folders))
        .routes(routes!(accounts::messages))
        .routes(routes!(accounts::message))
        .routes(routes!(ws::upgrade))
}

/// The OpenAPI document of [`router`].
pub fn openapi() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(|| routes().split_for_parts().1)
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "console",
    responses((status = 200, description = "The OpenAPI document of this API", body = Object)))]
async fn openapi_json() -> Json<&'static utoipa::openapi::OpenApi> {
    Json(openapi())
}

/// Every route.
pub fn router(state: ApiState) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .fallback(errors::not_found)
        .method_not_allowed_fallback(errors::method_not_allowed)
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}
