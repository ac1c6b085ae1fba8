//! The one place that turns configuration into a backend: no `REDIS_URL`
//! means the in-memory store (one process), a `redis://` URL the Redis store
//! (`redis+cluster://host:port,...` a Redis Cluster), with the keys under
//! `REDIS_KEY_PREFIX` (default `leasehold`).

use std::sync::Arc;

use leasehold_core::LeaseStore;

use crate::config::{redact_url, Config};
use crate::errors::SyncError;
use crate::events::EventBus;

/// Which backend a configuration selects, for logs.
pub fn backend_name(config: &Config) -> String {
    match &config.redis_url {
        None => "memory".into(),
        Some(url) => format!("redis ({})", redact_url(url)),
    }
}

/// Connects the backend `config` selects.
pub async fn connect_store(config: &Config) -> Result<Arc<dyn LeaseStore>, SyncError> {
    match &config.redis_url {
        None => Ok(Arc::new(leasehold_mem::MemoryStore::new())),
        Some(url) => {
            let prefix = if config.redis_key_prefix.is_empty() {
                leasehold_redis::DEFAULT_PREFIX.to_string()
            } else {
                config.redis_key_prefix.clone()
            };
            let store = leasehold_redis::RedisStore::connect_with(
                leasehold_redis::RedisConfig::new(url.clone()).with_prefix(prefix),
            )
            .await
            .map_err(|e| SyncError::Backend { url: redact_url(url), source: Box::new(e) })?;
            Ok(Arc::new(store))
        }
    }
}

/// Connects the event bus `config` selects: no `REDIS_URL` means the
/// in-process bus (the worker and the API in one process); a Redis URL means
/// pub/sub on a channel per user ([`leasehold_redis::bus::RedisBus`]), so mail
/// a worker stores on one machine reaches WebSockets on another.
pub async fn connect_bus(config: &Config) -> Result<EventBus, SyncError> {
    match &config.redis_url {
        None => Ok(memory_bus()),
        Some(url) => {
            let prefix = if config.redis_key_prefix.is_empty() {
                leasehold_redis::DEFAULT_PREFIX.to_string()
            } else {
                config.redis_key_prefix.clone()
            };
            let bus = leasehold_redis::bus::RedisBus::connect(
                &leasehold_redis::RedisConfig::new(url.clone()).with_prefix(prefix),
            )
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
