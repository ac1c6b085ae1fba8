//! The HTTP + WebSocket API (axum) and the web console.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/users` | sign up (`{"email","password"}` → 201 `{"id"}`), when `SIGNUP=open` |
//! | `POST /v1/login` | a session (`{"token","expires_at"}`); the user is present |
//! | `POST /v1/logout` | ends the session |
//! | `POST /v1/accounts`, `GET /v1/accounts` | add (IMAP login checked first), list |
//! | `GET`, `PATCH`, `DELETE /v1/accounts/{id}` | status (tier, owner, last sync / error, folders); change the server, security or password (login checked first, mail kept); remove |
//! | `GET /v1/accounts/{id}/folders` | folders with counts |
//! | `GET /v1/accounts/{id}/messages` | newest first, `?folder=&limit=&cursor=` |
//! | `GET /v1/accounts/{id}/messages/{message_id}` | one message, whole: header fields, text and HTML, attachments ([`messages`]) |
//! | `PATCH`, `DELETE /v1/accounts/{id}/messages/{message_id}` | seen, flagged, answered, keywords; to Trash ([`actions`]) |
//! | `POST /v1/accounts/{id}/messages/{message_id}/move` | to another folder |
//! | `POST /v1/accounts/{id}/messages/actions` | one of these on up to 500 messages |
//! | `GET /v1/accounts/{id}/messages/{message_id}/raw` | its RFC 5322 bytes, streamed from the server |
//! | `GET /v1/accounts/{id}/messages/{message_id}/attachments/{part}` | one attachment, decoded as it streams |
//! | `POST`, `GET /v1/webhooks` | add a receiver of mail events (its signing secret is answered once), list them ([`webhooks`]) |
//! | `GET`, `DELETE /v1/webhooks/{id}` | one webhook, with its state (active or paused); remove it |
//! | `POST /v1/webhooks/{id}/resume` | end a pause: held and failed deliveries are sent again |
//! | `GET /v1/webhooks/{id}/deliveries` | its latest deliveries and what happened to each |
//! | `GET /v1/ws` | presence and live mail events ([`ws`]) |
//! | `GET /` | the console |
//! | `GET /healthz`, `GET /readyz` | the process is up; the database and the lease store answer ([`health`]) |
//! | `GET /metrics` | Prometheus text format ([`crate::metrics`]) |
//! | `GET /v1/openapi.json` | the OpenAPI document, generated from the handlers ([`openapi`]) |
//!
//! The handlers share an [`ApiState`] and read their settings from
//! [`ApiSettings`] (both in `state`). Every error is
//! `{"error":{"code","message"}}` ([`errors::ApiError`]).
//! Settings from the environment: `LISTEN` (default `127.0.0.1:8080`),
//! `SIGNUP` (`open`, the default, or `closed`), `BODY_CACHE_MB` (whole
//! messages cached per account, default 25), `SESSION_TTL` (default
//! `24h`), `HTTP_HEADER_TIMEOUT` (default `10s`), `SIGNUPS_PER_HOUR`
//! (default 20), `ACCOUNTS_PER_USER` (default 50), `WS_PER_USER` (default
//! 16); presence lasts `TIER_SESSION_GRACE_MIN`. The bounds on requests are
//! in [`limits`], [`limiter`] and [`ws`]; the accept loop in `server`.

pub mod accounts;
pub mod actions;
pub mod auth;
mod download;
pub mod errors;
pub mod health;
pub mod json;
pub mod limiter;
pub mod limits;
pub mod messages;
mod metrics_page;
pub mod mime;
mod search;
mod server;
pub mod sockets;
mod state;
mod transfer;
pub mod webhooks;
pub mod ws;

use std::sync::OnceLock;

use axum::http::header::CONTENT_SECURITY_POLICY;
use axum::response::Html;
use axum::{Json, Router};
use errors::ErrorBody;
pub use server::{serve, serve_ops};
pub use state::{ApiSettings, ApiState, DEFAULT_LISTEN};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The console page.
pub const CONSOLE_HTML: &str = include_str!("console.html");

/// `GET /`: the web console, with a Content-Security-Policy that lets only
/// its own inline script and style run, talk only to this origin, and never
/// be framed.
#[utoipa::path(get, path = "/", tag = "console",
    responses((status = 200, description = "The web console (one HTML page)", content_type = "text/html", body = String)))]
async fn console() -> ([(axum::http::HeaderName, &'static str); 1], Html<&'static str>) {
    ([(CONTENT_SECURITY_POLICY, console_csp())], Html(CONSOLE_HTML))
}

/// The console's CSP: its one `<script>` and one `<style>` by their SHA-256.
fn console_csp() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        format!(
            "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; img-src 'self' data:; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            inline_hash(CONSOLE_HTML, "<script>", "</script>"),
            inline_hash(CONSOLE_HTML, "<style>", "</style>"),
        )
    })
}

/// `sha256-…` of the text between `open` and `close` in `html`.
fn inline_hash(html: &str, open: &str, close: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let start = html.find(open).map_or(0, |i| i + open.len());
    let end = html[start..].find(close).map_or(html.len(), |i| start + i);
    let digest = sha2::Sha256::digest(&html.as_bytes()[start..end]);
    format!("sha256-{}", base64::engine::general_purpose::STANDARD.encode(digest))
}

/// The document's frame: title, the bearer scheme, the error shape.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "sync-worker API", description = "Accounts, synced mail and live push. Every error is \
        `{\"error\":{\"code\",\"message\"}}` (ErrorBody)."),
    modifiers(&BearerScheme),
    components(schemas(ErrorBody, errors::ErrorDetail, health::Probe)),
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
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(auth::sign_up))
        .routes(routes!(auth::login))
        .routes(routes!(auth::logout))
        .routes(routes!(accounts::list, accounts::add))
        .routes(routes!(accounts::get, accounts::update, accounts::delete))
        .routes(routes!(accounts::folders))
        .routes(routes!(accounts::messages))
        .routes(routes!(messages::message, actions::update_message, actions::delete_message))
        .routes(routes!(actions::move_message))
        .routes(routes!(actions::batch))
        .routes(routes!(messages::raw_message))
        .routes(routes!(messages::attachment))
        .routes(routes!(webhooks::list, webhooks::create))
        .routes(routes!(webhooks::get, webhooks::delete))
        .routes(routes!(webhooks::resume))
        .routes(routes!(webhooks::deliveries))
        .routes(routes!(ws::upgrade))
}

/// The OpenAPI document of [`router`].
pub fn openapi() -> &'static utoipa::openapi::OpenApi {
    static DOC: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = routes().split_for_parts().1;
        with_common_answers(&mut doc);
        doc
    })
}

/// The answers every operation may give, said once here rather than on
/// each route: 414 and 431 ([`limits`]) everywhere, and 415 ([`json::ApiJson`])
/// where a body is taken.
fn with_common_answers(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let error = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build(),
        )
    };
    for item in doc.paths.paths.values_mut() {
        let ops = [&mut item.get, &mut item.post, &mut item.put, &mut item.patch, &mut item.delete];
        for op in ops.into_iter().flatten() {
            let answers = &mut op.responses.responses;
            answers.insert("414".into(), error("The request target is over 32 KiB (`uri_too_long`)"));
            answers.insert("431".into(), error("Over 100 header fields or 32 KiB of them (`headers_too_large`)"));
            if op.request_body.is_some() {
                answers.insert(
                    "415".into(),
                    error("The body is not `Content-Type: application/json` (`unsupported_media_type`)"),
                );
            }
        }
    }
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "console",
    responses((status = 200, description = "The OpenAPI document of this API", body = Object)))]
async fn openapi_json() -> Json<&'static utoipa::openapi::OpenApi> {
    Json(openapi())
}

/// The operations routes alone (`/healthz`, `/readyz`, `/metrics`): what
/// `sync-worker worker` serves on `METRICS_LISTEN`.
pub fn ops_router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", axum::routing::get(health::healthz))
        .route("/readyz", axum::routing::get(health::readyz))
        .route("/metrics", axum::routing::get(health::metrics))
        .fallback(errors::not_found)
        .with_state(state)
}

/// Every route.
pub fn router(state: ApiState) -> Router {
    let (router, _) = routes().split_for_parts();
    router
        .fallback(errors::not_found)
        .method_not_allowed_fallback(errors::method_not_allowed)
        .layer(axum::middleware::from_fn(limits::bound_heads))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}
