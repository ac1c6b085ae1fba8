//! The acceptance cases on the Redis backend, in real time with small TTLs.
//!
//! They use `REDIS_URL` when set, otherwise a private `redis-server` started
//! for this test process. A missing `redis-server` fails these tests (in CI
//! and locally): they never pass by skipping.

#[macro_use]
mod common;

use std::sync::Arc;

use async_trait::async_trait;
use common::{Backend, Scale};
use leasehold_core::LeaseStore;
use leasehold_redis::{test_support, RedisConfig, RedisStore};

struct Redis {
    url: String,
    prefix: String,
}

#[async_trait]
impl Backend for Redis {
    async fn store(&self) -> Arc<dyn LeaseStore> {
        let config = RedisConfig::new(self.url.clone()).with_prefix(self.prefix.clone());
        Arc::new(RedisStore::connect_with(config).await.unwrap_or_else(|e| panic!("connect to {}: {e}", self.url)))
    }

    fn scale(&self) -> Scale {
        Scale::real()
    }
}

fn redis() -> Arc<dyn Backend> {
    if std::env::var("REDIS_URL").map_or(true, |u| u.is_empty()) {
        test_support::require_binary("redis-server");
    }
    Arc::new(Redis { url: test_support::redis_url(), prefix: test_support::unique_prefix("sync") })
}

macro_rules! redis_cases {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            common::cases::$name(redis()).await;
        }
    )*};
}

acceptance_cases!(redis_cases);
