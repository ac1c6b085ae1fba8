//! The shared conformance suite on one private Redis (or `REDIS_URL`).

mod common;

leasehold_core::conformance_suite!(common::RedisBackend::new(leasehold_redis::test_support::redis_url(), "conf"));
