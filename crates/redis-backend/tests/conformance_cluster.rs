//! The shared conformance suite on a 3-master Redis Cluster (private, or
//! `REDIS_CLUSTER_URL`).

mod common;

leasehold_core::conformance_suite!(common::RedisBackend::new(leasehold_redis::test_support::cluster_url(), "confc"));
