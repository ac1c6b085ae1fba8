//! `leasehold-benches`: the benchmarks behind `cargo xtask bench NAME`.
//!
//! Each benchmark prints readable lines and ends with one JSON line of its
//! figures (`{"bench":"NAME", ...}`). Numbers are measured here, never
//! asserted in timed tests.

mod hopper_local;
mod hopper_nextest;
mod hopper_pytest;
mod hopper_pytest_skewed;
mod hopper_redis;
mod hopper_tail;
mod machine;
mod mem_queue;
mod queue_model;
mod redis_per_test;
mod redis_queue;
mod redis_stats;
mod sync_api;
mod sync_hot;
mod sync_initial;
mod sync_noop;
mod sync_ownership;
mod sync_scale;
mod sync_scale_worker;
mod sync_support;
mod sync_webhooks;

use anyhow::{bail, Context as _, Result};

/// (name, what it measures).
const BENCHES: &[(&str, &str)] = &[
    ("mem-queue", "unit lifecycles per second through the memory backend, 1 task and 8 tasks"),
    ("redis-queue", "no-op units per second and Redis CPU per unit, 8 workers on one Redis"),
    ("redis-per-test", "Redis CPU per test with hopper's agent-slot pattern: 20,000 units, 2 workers × 2 slots"),
    (
        "queue-model",
        "Redis CPU per unit of the queue's data model in use beside a prototype of the range model",
    ),
    ("hopper-local", "hopper -j 2 on 2,000 units of `true` against xargs -P 2"),
    ("hopper-redis", "2,000 units through a private Redis with two hopper workers"),
    ("hopper-pytest", "20,000 pytest tests: one pytest, hopper -j 2 agents, per file, and on Redis (CPU per test)"),
    (
        "hopper-tail",
        "2,000 long-tailed pytest tests, slowest last, 2 workers x 2 slots on Redis: tail idle, wall vs ideal",
    ),
    ("hopper-nextest", "2,000 Rust tests after a warm build: hopper -j 2 against cargo nextest run -j 2"),
    ("sync-ownership", "10,000 accounts, 4 workers: time to full ownership, spread, takeover"),
    ("sync-scale", "bucket ownership at 10k and 100k accounts (SYNC_SCALE_SIZES), 8 worker processes, Redis Cluster, Postgres: ownership, spread, takeover, Redis work per tick, bytes per account"),
    ("sync-initial", "initial IMAP sync of a 10,000-message Dovecot INBOX: messages/s, peak RSS"),
    ("sync-hot", "hot accounts on one worker (SYNC_HOT_ACCOUNTS, default 500), plain and over TLS: RSS per hot account, APPEND-to-DB latency p50/p99, churn"),
    ("sync-noop", "poll of an unchanged 20-folder account: IMAP commands sent, wall time"),
    ("sync-api", "sync-worker serve from a client: push latency, message-list and login requests/s"),
];

// The allocator of the `sync-worker` binary, with its settings: the worker
// processes of `sync-scale` and the worker of `sync-hot` run in this binary,
// and their RSS is what a deployed worker's would be.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    sync_worker::allocator::restart_with_commit_on_demand().context("restart with the worker's allocator settings")?;
    let arg = std::env::args().nth(1);
    let Some(name) = arg.as_deref().filter(|a| *a != "--list") else {
        for (name, what) in BENCHES {
            println!("{name:<16} {what}");
        }
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // Not a benchmark: one worker process of `sync-scale`, started by it.
    if name == "sync-scale-worker" {
        return runtime.block_on(sync_scale_worker::run());
    }
    let figures = runtime.block_on(async {
        match name {
            "mem-queue" => mem_queue::run().await,
            "redis-queue" => redis_queue::run().await,
            "redis-per-test" => redis_per_test::run().await,
            "queue-model" => queue_model::run().await,
            "hopper-local" => hopper_local::run().await,
            "hopper-redis" => hopper_redis::run().await,
            "sync-ownership" => sync_ownership::run().await,
            "sync-scale" => sync_scale::run().await,
            "hopper-pytest" => hopper_pytest::run().await,
            "hopper-nextest" => hopper_nextest::run().await,
            "hopper-tail" => hopper_tail::run().await,
            "sync-initial" => sync_initial::run().await,
            "sync-hot" => sync_hot::run().await,
            "sync-noop" => sync_noop::run().await,
            "sync-api" => sync_api::run().await,
            other => bail!("unknown benchmark {other:?}: `cargo xtask bench --list` names them"),
        }
    })?;
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}
