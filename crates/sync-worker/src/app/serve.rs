//! The processes that serve the API: `sync-worker serve` (the API and a
//! worker in one process: by default the in-memory lease store, a SQLite
//! file and an in-process event bus) and `sync-worker api` (the API alone,
//! for scale-out on Redis and Postgres, next to `sync-worker worker`s). The
//! worker is [`start_worker`]'s, as in `sync-worker worker`.

use std::net::SocketAddr;

use leasehold_core::WorkerId;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::wiring::Backend;
use super::{start_worker, Worker};
use crate::api::{ApiSettings, ApiState};
use crate::config::Config;
use crate::coordinator::CoordinatorHandle;
use crate::errors::SyncError;
use crate::storage::Storage;

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen address is taken or not ours.
    #[error("could not listen on {addr}: is another process using it? (set LISTEN)")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The worker (its reconcile, its storage or its coordinator) failed to start.
    #[error("could not start the worker")]
    Worker(#[from] SyncError),
}

/// What a process is made of.
#[derive(Clone)]
pub struct Parts {
    /// The database (without an event sink: the worker's engine announces
    /// its writes on the backend's bus).
    pub storage: Storage,
    /// Leases, tiers and presence, and the bus the API listens on.
    pub backend: Backend,
    /// The engine's settings.
    pub config: Config,
    /// The API's settings.
    pub settings: ApiSettings,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("storage", &self.storage)
            .field("backend", &self.backend)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A running API (and worker, for `serve`).
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<std::io::Result<()>>,
    worker: Option<Worker>,
}

/// Starts the API on `parts.settings.listen` and, when `worker` is given, a
/// worker with that id writing through the same storage.
pub async fn start(parts: Parts, worker: Option<WorkerId>) -> Result<Running, StartError> {
    let addr = parts.settings.listen;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
    let worker = match worker {
        Some(worker) => Some(start_worker(worker, &parts.storage, &parts.backend, &parts.config).await?),
        None => {
            if parts.backend.is_in_process() {
                tracing::warn!("`api` on the in-memory backend sees no worker: use `serve`, or set REDIS_URL");
            }
            None
        }
    };
    let mut state =
        ApiState::new(parts.storage, parts.backend.store().clone(), parts.backend.bus().clone(), parts.settings);
    if let Some(w) = &worker {
        state = state.with_worker(w.coordinator().observer());
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(crate::api::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    tracing::info!(%addr, worker = worker.is_some(), "API listening");
    Ok(Running { addr, stop: Some(stop), server, worker })
}

impl Running {
    /// Where the API listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The worker's coordinator, for `serve`.
    pub fn coordinator(&self) -> Option<&CoordinatorHandle> {
        self.worker.as_ref().map(Worker::coordinator)
    }

    /// Until the server or the worker ends by itself (an error).
    pub async fn finished(&mut self) -> anyhow::Result<()> {
        match self.worker.as_mut() {
            Some(c) => tokio::select! {
                r = &mut self.server => Err(server_end(r)),
                r = c.finished() => Err(match r {
                    Ok(()) => anyhow::anyhow!("the worker stopped"),
                    Err(e) => anyhow::Error::new(e).context("the worker failed"),
                }),
            },
            None => Err(server_end((&mut self.server).await)),
        }
    }

    /// Stops serving (open WebSockets are dropped) and releases the worker's leases.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(w) = self.worker.take() {
            w.shutdown().await?;
        }
        Ok(())
    }
}

fn server_end(r: Result<std::io::Result<()>, tokio::task::JoinError>) -> anyhow::Error {
    match r {
        Ok(Ok(())) => anyhow::anyhow!("the API server stopped"),
        Ok(Err(e)) => anyhow::Error::new(e).context("the API server failed"),
        Err(e) => anyhow::Error::new(e).context("the API server task failed"),
    }
}

impl Drop for Running {
    /// Without [`Running::shutdown`]: the server stops at once and the worker
    /// is killed (its leases expire rather than being released).
    fn drop(&mut self) {
        self.server.abort();
        if let Some(w) = self.worker.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(w.kill());
            }
        }
    }
}
