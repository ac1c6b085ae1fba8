//! Shared test support: a conformance `Backend` on a Redis URL.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::conformance::{Backend, Fixture, TimeControl};
use leasehold_redis::test_support::unique_prefix;
use leasehold_redis::{RedisConfig, RedisStore};

/// Time on a real server: it passes by sleeping.
pub struct RealTime;

#[async_trait]
impl TimeControl for RealTime {
    async fn advance(&self, by: Duration) {
        tokio::time::sleep(by).await;
    }
}

/// Fixtures on one Redis (or cluster) URL, each under a fresh key prefix.
pub struct RedisBackend {
    url: String,
    tag: &'static str,
}

impl RedisBackend {
    /// Fixtures on `url`.
    pub fn new(url: String, tag: &'static str) -> Self {
        Self { url, tag }
    }
}

/// A store on `url` under a fresh prefix.
pub async fn store(url: &str, tag: &str) -> RedisStore {
    let config = RedisConfig::new(url).with_prefix(unique_prefix(tag));
    RedisStore::connect_with(config).await.unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

#[async_trait]
impl Backend for RedisBackend {
    async fn fresh(&self) -> Fixture {
        let store = Arc::new(store(&self.url, self.tag).await);
        Fixture {
            queue: store.clone(),
            leases: store.clone(),
            buckets: store.clone(),
            presence: store,
            time: Arc::new(RealTime),
        }
    }
}
