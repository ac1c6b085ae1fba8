//! `GET /healthz` and `GET /readyz`: the probes of a process supervisor or
//! a load balancer. `/healthz` says the process serves HTTP; `/readyz` says
//! it can do its work, so it asks the database and the lease store, each
//! within [`PROBE_TIMEOUT`] (a hung dependency must fail the probe, not
//! hang it).

use std::time::Duration;

use axum::extract::State;
use axum::Json;

use super::errors::ApiError;
use super::state::ApiState;

/// How long `/readyz` waits for each dependency.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The answer of a probe that passed.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Probe {
    /// Always `ok`.
    #[schema(example = "ok")]
    pub status: String,
}

fn ok() -> Json<Probe> {
    Json(Probe { status: "ok".to_string() })
}

/// `GET /healthz`: the process is up and serving.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = Probe)))]
pub async fn healthz() -> Json<Probe> {
    ok()
}

/// `GET /readyz`: the database and the lease store answer.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "The database and the lease store answer", body = Probe),
        (status = 503, description = "`not_ready`: the message names the part that does not answer and why", body = super::errors::ErrorBody),
    ))]
pub async fn readyz(State(state): State<ApiState>) -> Result<Json<Probe>, ApiError> {
    let database =
        async { sqlx::query("SELECT 1").execute(state.storage.pool()).await.map(|_| ()).map_err(|e| e.to_string()) };
    probe("the database", database).await?;
    // A read that touches the store (a round trip on Redis) and changes nothing.
    let store = async { state.store.live_workers().await.map(|_| ()).map_err(|e| e.to_string()) };
    probe("the lease store", store).await?;
    Ok(ok())
}

/// `GET /metrics`: this process's metrics in Prometheus text format (see
/// [`crate::metrics`]), with the owned-account gauges of its worker, if it
/// runs one.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format (version 0.0.4)", content_type = "text/plain", body = String)))]
pub async fn metrics(State(state): State<ApiState>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let page = super::metrics_page::render(state.worker.as_ref(), Some(state.sockets.total()));
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], page)
}

/// Runs `check` within [`PROBE_TIMEOUT`]; a failure or a timeout is `not_ready` naming `what`.
async fn probe(
    what: &'static str,
    check: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), ApiError> {
    let reason = match tokio::time::timeout(PROBE_TIMEOUT, check).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e,
        Err(_) => format!("no answer within {} s", PROBE_TIMEOUT.as_secs()),
    };
    tracing::warn!(%what, %reason, "readiness probe failed");
    Err(ApiError::NotReady { what, reason })
}
