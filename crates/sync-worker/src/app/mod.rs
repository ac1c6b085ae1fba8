//! The processes, assembled once: the storage [`open_storage`] opens, the
//! worker [`start_worker`] starts, the API [`serve`] serves (with or
//! without a worker), on the backend [`wiring`] connects.
//!
//! `sync-worker worker` is [`start_worker`]; `serve` and `api` are
//! [`serve::start`] with and without a worker, so the recipe of a worker
//! (the in-memory store's fence reset, the first reconcile, the reconciler,
//! the engine's dependencies, the coordinator) is written here and nowhere
//! else. [`wiring`] is the one module of the crate that names a backend.

pub mod serve;
pub mod wiring;

use std::num::NonZeroU16;
use std::path::PathBuf;
use std::sync::Arc;

use leasehold_core::{LeaseStore, TokioClock, WorkerId};

use crate::config::{Config, Ownership};
use crate::coordinator::reconcile::{self, Reconciler};
use crate::coordinator::{Coordinator, CoordinatorHandle, Deps};
use crate::errors::SyncError;
use crate::imap::{ImapSettings, ImapSource};
use crate::secret::{SecretError, SecretKey};
use crate::storage::{ConnectionSettings, PartitionError, Storage, StorageError, DEFAULT_DATABASE_URL};
use crate::webhooks::{self, DispatcherHandle};
use wiring::Backend;

/// Why the storage could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The password key (`SECRET_KEY` / `SECRET_KEY_FILE`) could not be read or made.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The database could not be opened.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// `PG_MESSAGE_PARTITIONS` is not a count of partitions.
    #[error(
        "PG_MESSAGE_PARTITIONS={value:?} is invalid: expected a whole number of partitions from 1 to 65535 (or unset)"
    )]
    BadPartitions {
        /// The value given.
        value: String,
    },
    /// `messages` could not be partitioned as `PG_MESSAGE_PARTITIONS` asks.
    #[error(transparent)]
    Partition(#[from] PartitionError),
}

/// Opens the storage that `DATABASE_URL` (absent: [`DEFAULT_DATABASE_URL`])
/// and `SECRET_KEY` / `SECRET_KEY_FILE` (absent: the file `sync-worker.key`,
/// generated with mode 0600) name.
pub async fn open_storage() -> Result<Storage, OpenError> {
    open_storage_with(&ConnectionSettings::default()).await
}

/// [`open_storage`] for worker `worker`: its Postgres connections carry its id
/// and time out a stalled transaction well within the lease TTL.
pub async fn open_worker_storage(worker: &WorkerId, config: &Config) -> Result<Storage, OpenError> {
    open_storage_with(&ConnectionSettings::for_worker(worker, config.lease_ttl)).await
}

async fn open_storage_with(connection: &ConnectionSettings) -> Result<Storage, OpenError> {
    let key_file = std::env::var_os("SECRET_KEY_FILE").map_or_else(|| PathBuf::from("sync-worker.key"), PathBuf::from);
    let secret = SecretKey::load(std::env::var("SECRET_KEY").ok().as_deref(), &key_file)?;
    let url = std::env::var("DATABASE_URL").ok().filter(|u| !u.trim().is_empty());
    let url = url.as_deref().unwrap_or(DEFAULT_DATABASE_URL);
    let partitions = match std::env::var("PG_MESSAGE_PARTITIONS").ok().filter(|v| !v.trim().is_empty()) {
        None => None,
        Some(value) => Some(value.trim().parse::<NonZeroU16>().map_err(|_| OpenError::BadPartitions { value })?),
    };
    let storage = Storage::open_with(url, secret, connection).await?;
    // After the migrations, once: a table partitioned already is left as it is.
    if let Some(partitions) = partitions {
        storage.partition_messages(partitions).await?;
    }
    Ok(storage)
}

/// A running worker: its coordinator and the reconciler of the live set.
/// Dropping it stops the reconciler but, like a dropped
/// [`CoordinatorHandle`], leaves the coordinator running: end it with
/// [`Worker::shutdown`] or [`Worker::kill`].
#[derive(Debug)]
pub struct Worker {
    coordinator: CoordinatorHandle,
    webhooks: DispatcherHandle,
    _reconciler: Option<Reconciler>,
}

/// Starts worker `worker` on `storage` and `backend`: makes the live set
/// match the accounts table, keeps it matching every `RECONCILE_INTERVAL`,
/// starts the coordinator, whose engine writes through `storage`
/// announcing every write on the backend's bus, and the webhook dispatcher
/// that delivers what those writes record for webhooks.
pub async fn start_worker(
    worker: WorkerId,
    storage: &Storage,
    backend: &Backend,
    config: &Config,
) -> Result<Worker, SyncError> {
    // Counted from the start, whether or not anything serves /metrics yet.
    crate::metrics::handle();
    let storage = storage.clone().with_events(Arc::new(backend.bus().clone()));
    if backend.is_in_process() {
        // The in-memory lease store restarts its fencing tokens at 1 with the
        // process, and no other process can share it: start the stored tokens over.
        storage.reset_fences().await?;
    }
    let store: Arc<dyn LeaseStore> = backend.store().clone();
    let reconciler = match config.ownership {
        Ownership::Accounts => {
            reconcile::reconcile(&storage, store.as_ref()).await?;
            Some(reconcile::spawn(storage.clone(), store.clone(), config.reconcile_interval))
        }
        // Owners read their own buckets' accounts: nothing reads the whole table.
        Ownership::Buckets => {
            reconcile::check_deployment(&storage, store.as_ref()).await?;
            None
        }
    };
    tracing::info!(%worker, backend = %backend.name(), database = ?storage.kind(), "starting the worker");
    let sender = webhooks::Sender::new(
        config.webhooks.timeout,
        config.imap_allow_private,
        &crate::imap::TlsSettings::with_ca_file(config.imap_ca_file.as_ref()),
    )?;
    let webhooks =
        webhooks::spawn(storage.clone(), backend.queue().clone(), worker.clone(), config.webhooks.clone(), sender);
    let deps = Deps {
        store,
        buckets: backend.store().clone(),
        presence: backend.store().clone(),
        source: Arc::new(ImapSource::new(storage.clone(), ImapSettings::from(config))),
        directory: Arc::new(storage),
        clock: Arc::new(TokioClock::new()),
    };
    let coordinator =
        Coordinator::prepare(worker, config.clone(), deps).await?.with_events(Arc::new(backend.bus().clone())).spawn();
    Ok(Worker { coordinator, webhooks, _reconciler: reconciler })
}

impl Worker {
    /// The coordinator: what it owns, and how hot each account is.
    pub fn coordinator(&self) -> &CoordinatorHandle {
        &self.coordinator
    }

    /// Until the coordinator ends by itself (it only does on an error).
    pub async fn finished(&mut self) -> Result<(), SyncError> {
        self.coordinator.finished().await
    }

    /// Stops every runner, releases every lease and deregisters the worker,
    /// so the others take over at their next tick.
    pub async fn shutdown(self) -> Result<(), SyncError> {
        let (coordinator, webhooks) = (self.coordinator.shutdown(), self.webhooks.shutdown());
        let (stopped, ()) = tokio::join!(coordinator, webhooks);
        stopped
    }

    /// Drops everything without a word to the store, as a crash would: the
    /// leases expire rather than being released.
    pub async fn kill(self) {
        drop(self.webhooks);
        self.coordinator.kill().await
    }
}
