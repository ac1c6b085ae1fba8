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
use leasehold_redis::{test_support, RedisConfig, RedisStore};
use sync_worker::config::Ownership;
use sync_worker::Leases;

struct Redis {
    url: String,
    prefix: String,
    ownership: Ownership,
}

#[async_trait]
impl Backend for Redis {
    async fn store(&self) -> Arc<dyn Leases> {
        let config = RedisConfig::new(self.url.clone()).with_prefix(self.prefix.clone());
        Arc::new(RedisStore::connect_with(config).await.unwrap_or_else(|e| panic!("connect to {}: {e}", self.url)))
    }

    fn scale(&self) -> Scale {
        Scale::real()
    }

    fn ownership(&self) -> Ownership {
        self.ownership
    }
}

fn redis() -> Arc<dyn Backend> {
    if std::env::var("REDIS_URL").map_or(true, |u| u.is_empty()) {
        test_support::require_binary("redis-server");
    }
    Arc::new(Redis {
        url: test_support::redis_url(),
        prefix: test_support::unique_prefix("sync"),
        ownership: Ownership::Accounts,
    })
}

fn redis_buckets() -> Arc<dyn Backend> {
    test_support::require_binary("redis-server");
    Arc::new(Redis {
        url: test_support::redis_url(),
        prefix: test_support::unique_prefix("sync"),
        ownership: Ownership::Buckets,
    })
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

/// The same cases under bucket ownership.
mod buckets {
    use super::*;

    macro_rules! redis_bucket_cases {
        ($($name:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                common::cases::$name(redis_buckets()).await;
            }
        )*};
    }

    acceptance_cases!(redis_bucket_cases);

    /// Bucket ownership only: the change notice of an added account.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_account_added_to_a_held_bucket_starts_at_once() {
        common::cases::an_account_added_to_a_held_bucket_starts_at_once(redis_buckets()).await;
    }
}
