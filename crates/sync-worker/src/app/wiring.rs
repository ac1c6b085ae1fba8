//! The one place that turns configuration into a backend: no `REDIS_URL`
//! means the in-memory store and bus (one process), a `redis://` URL the
//! Redis store and pub/sub bus (`redis+cluster://host:port,...` a Redis
//! Cluster), with the keys under `REDIS_KEY_PREFIX` (default `leasehold`).
//!
//! Nothing else in the crate names a backend crate: the rest holds an
//! `Arc<dyn Leases>` (a lease store with bucket leases) and an [`EventBus`].

use std::sync::Arc;

use leasehold_core::backend_url::redact_url;
use leasehold_core::UnitQueue;
use leasehold_redis::RedisConfig;

use crate::config::Config;
use crate::errors::SyncError;
use crate::events::EventBus;
use crate::leases::Leases;

/// The lease store and event bus a process runs on.
#[derive(Clone)]
pub struct Backend {
    store: Arc<dyn Leases>,
    queue: Arc<dyn UnitQueue>,
    bus: EventBus,
    name: String,
    in_process: bool,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Backend {
    /// Leases, bucket leases, the live set, workers, tiers and presence.
    pub fn store(&self) -> &Arc<dyn Leases> {
        &self.store
    }

    /// The unit queue webhook deliveries go through (the same store).
    pub fn queue(&self) -> &Arc<dyn UnitQueue> {
        &self.queue
    }

    /// Where the engine's writes are announced and the API listens.
    pub fn bus(&self) -> &EventBus {
        &self.bus
    }

    /// Which backend this is, for logs (`memory`, `redis (URL)`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is the in-memory backend of this process alone: no
    /// other process sees its leases, and its fencing tokens restart at 1
    /// with the process.
    pub fn is_in_process(&self) -> bool {
        self.in_process
    }
}

/// Connects the store and the bus `config` selects.
pub async fn connect(config: &Config) -> Result<Backend, SyncError> {
    match &config.redis_url {
        None => Ok(in_process()),
        Some(url) => {
            let store = Arc::new(connect_redis(config, url).await?);
            Ok(Backend {
                store: store.clone(),
                queue: store,
                bus: connect_bus(config).await?,
                name: backend_name(config),
                in_process: false,
            })
        }
    }
}

/// The in-memory store and bus of this process (`sync-worker serve` with no
/// `REDIS_URL`, tests).
pub fn in_process() -> Backend {
    let store = Arc::new(leasehold_mem::MemoryStore::new());
    Backend { store: store.clone(), queue: store, bus: memory_bus(), name: "memory".into(), in_process: true }
}

/// Which backend a configuration selects, for logs.
pub fn backend_name(config: &Config) -> String {
    match &config.redis_url {
        None => "memory".into(),
        Some(url) => format!("redis ({})", redact_url(url)),
    }
}

/// The Redis settings of `config` for `url`: its key prefix, or the default.
fn redis_config(config: &Config, url: &str) -> RedisConfig {
    let prefix = if config.redis_key_prefix.is_empty() {
        leasehold_redis::DEFAULT_PREFIX.to_string()
    } else {
        config.redis_key_prefix.clone()
    };
    RedisConfig::new(url.to_owned()).with_prefix(prefix)
}

/// The lease store the workers share, when `config` names one outside this
/// process (Redis): tiers and owners live there. `None` on the in-memory
/// store, which in an operator command's process would know nothing.
pub async fn shared_store(config: &Config) -> Result<Option<Arc<dyn Leases>>, SyncError> {
    match &config.redis_url {
        None => Ok(None),
        Some(_) => Ok(Some(connect_store(config).await?)),
    }
}

/// Connects the lease store `config` selects.
pub async fn connect_store(config: &Config) -> Result<Arc<dyn Leases>, SyncError> {
    match &config.redis_url {
        None => Ok(Arc::new(leasehold_mem::MemoryStore::new())),
        Some(url) => Ok(Arc::new(connect_redis(config, url).await?)),
    }
}

async fn connect_redis(config: &Config, url: &str) -> Result<leasehold_redis::RedisStore, SyncError> {
    leasehold_redis::RedisStore::connect_with(redis_config(config, url))
        .await
        .map_err(|e| SyncError::Backend { url: redact_url(url), source: Box::new(e) })
}

/// Connects the event bus `config` selects: no `REDIS_URL` means the
/// in-process bus (the worker and the API in one process); a Redis URL means
/// pub/sub on a channel per user ([`leasehold_redis::bus::RedisBus`]), so mail
/// a worker stores on one machine reaches WebSockets on another.
pub async fn connect_bus(config: &Config) -> Result<EventBus, SyncError> {
    match &config.redis_url {
        None => Ok(memory_bus()),
        Some(url) => {
            let bus = leasehold_redis::bus::RedisBus::connect(&redis_config(config, url))
                .await
                .map_err(|e| SyncError::Backend { url: redact_url(url), source: Box::new(e) })?;
            Ok(EventBus::new(Arc::new(bus)))
        }
    }
}

/// The in-process event bus (`sync-worker serve`, tests).
pub fn memory_bus() -> EventBus {
    EventBus::new(Arc::new(leasehold_mem::MemoryBus::new()))
}
