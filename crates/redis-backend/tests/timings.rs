//! The timings store on one Redis server and on a Redis Cluster.

mod common;

use leasehold_core::conformance::timings::{timings_merge_and_round_trip, timings_pass_streaks};
use leasehold_redis::test_support::{cluster_url, redis_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_on_one_server() {
    timings_merge_and_round_trip(&common::store(&redis_url(), "timings").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_on_a_cluster() {
    timings_merge_and_round_trip(&common::store(&cluster_url(), "timings-cluster").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_streaks_on_one_server() {
    timings_pass_streaks(&common::store(&redis_url(), "streaks").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_streaks_on_a_cluster() {
    timings_pass_streaks(&common::store(&cluster_url(), "streaks-cluster").await).await;
}
