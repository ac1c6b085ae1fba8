//! The API's accept loop: hyper with the limits `axum::serve` does not set.
//!
//! `axum::serve` gives hyper no timer, so a client that sends its request
//! head one byte at a time (slowloris), or opens a connection and says
//! nothing, holds it for ever. Here every connection must finish each
//! request head within [`ApiSettings::header_timeout`]: the clock starts when
//! the server waits for a head, so it also ends an idle keep-alive
//! connection. A WebSocket, once upgraded, is the socket's own business
//! ([`super::ws`]).
//!
//! [`ApiSettings::header_timeout`]: super::ApiSettings::header_timeout

use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

use super::limits::{MAX_HEADERS, MAX_HEADER_BYTES, MAX_URI_BYTES};
use super::{router, ApiState};

/// hyper's own bounds sit above ours ([`super::limits`]), so a request a
/// little over ours gets the JSON error body that hyper's bare 414 and 431
/// lack; only one far over (more than 4× the bytes) meets hyper's.
const HYPER_MAX_HEADERS: usize = 4 * MAX_HEADERS;
const HYPER_MAX_BUF: usize = 4 * (MAX_URI_BYTES + MAX_HEADER_BYTES);

/// Serves the API on `listener` until `shutdown` completes, then waits for
/// the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let header_timeout = state.settings.header_timeout;
    serve_app(listener, router(state), header_timeout, shutdown).await
}

/// Serves the operations routes alone ([`super::ops_router`]: health and
/// metrics) on `listener`, as `sync-worker worker` does on `METRICS_LISTEN`.
pub async fn serve_ops(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let header_timeout = state.settings.header_timeout;
    serve_app(listener, super::ops_router(state), header_timeout, shutdown).await
}

async fn serve_app(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_headers(HYPER_MAX_HEADERS)
        .max_buf_size(HYPER_MAX_BUF);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(header_timeout));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: the listener itself is fine.
                    tracing::warn!(error = %e, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = tower::ServiceExt::map_request(app.clone(), move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(addr));
            req
        });
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // hyper reads the first bytes to choose HTTP/1 or 2 before its
            // header timeout starts: a connection that says nothing would
            // wait there for ever.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(e) = watcher.watch(conn).await {
                // A client that went away, or one cut off by a limit.
                tracing::debug!(client = %addr, error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
