//! The processes that serve the API: `sync-worker serve` (the API and a
//! worker in one process: by default the in-memory lease store, a SQLite
//! file and an in-process event bus) and `sync-worker api` (the API alone,
//! for scale-out on Redis and Postgres, next to `sync-worker worker`s).

use std::net::SocketAddr;
use std::sync::Arc;

use leasehold_core::{LeaseStore, TokioClock, WorkerId};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{ApiSettings, ApiState};
use crate::errors::SyncError;
use crate::events::EventBus;
use crate::imap::{ImapSettings, ImapSource};
use crate::reconcile::{self, Reconciler};
use crate::storage::Storage;
use crate::{Config, Coordinator, CoordinatorHandle, Deps};

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
    /// The worker, its reconciler or its storage failed to start.
    #[error("could not start the worker")]
    Worker(#[from] SyncError),
}

/// What a process is made of.
#[derive(Clone)]
pub struct Parts {
    /// The database (without an event sink: [`start`] adds the bus).
    pub storage: Storage,
    /// Leases, tiers and presence.
    pub store: Arc<dyn LeaseStore>,
    /// Where the engine's writes are announced and the API listens.
    pub bus: EventBus,
    /// The engine's settings.
    pub config: Config,
    /// The API's settings.
    pub settings: ApiSettings,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("storage", &self.storage)
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
    coordinator: Option<CoordinatorHandle>,
    _reconciler: Option<Reconciler>,
}

/// Starts the API on `parts.settings.listen` and, when `worker` is given, a
/// worker with that id writing through the same storage.
pub async fn start(parts: Parts, worker: Option<WorkerId>) -> Result<Running, StartError> {
    let addr = parts.settings.listen;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
    let storage = parts.storage.with_events(Arc::new(parts.bus.clone()));
    let (coordinator, reconciler) = match worker {
        None => (None, None),
        Some(worker) => {
            reconcile::reconcile(&storage, parts.store.as_ref()).await?;
            let reconciler = reconcile::spawn(storage.clone(), parts.store.clone(), parts.config.reconcile_interval);
            let deps = Deps {
                store: parts.store.clone(),
                source: Arc::new(ImapSource::new(storage.clone(), ImapSettings::from(&parts.config))),
                directory: Arc::new(storage.clone()),
                clock: Arc::new(TokioClock::new()),
            };
            let handle = Coordinator::prepare(worker, parts.config.clone(), deps)
                .await?
                .with_events(Arc::new(parts.bus.clone()))
                .spawn();
            (Some(handle), Some(reconciler))
        }
    };
    let state = ApiState::new(storage, parts.store, parts.bus, parts.settings);
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(super::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    tracing::info!(%addr, worker = coordinator.is_some(), "API listening");
    Ok(Running { addr, stop: Some(stop), server, coordinator, _reconciler: reconciler })
}

impl Running {
    /// Where the API listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The worker, for `serve`.
    pub fn coordinator(&self) -> Option<&CoordinatorHandle> {
        self.coordinator.as_ref()
    }

    /// Until the server or the worker ends by itself (an error).
    pub async fn finished(&mut self) -> anyhow::Result<()> {
        match self.coordinator.as_mut() {
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
        if let Some(c) = self.coordinator.take() {
            c.shutdown().await?;
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
        if let Some(c) = self.coordinator.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(c.kill());
            }
        }
    }
}
