//! `sync-scale`: bucket ownership (`OWNERSHIP=buckets`) at growing numbers
//! of accounts, 8 coordinators on one private `redis-server`, the scripted
//! mail source, mostly cold accounts (no poll during the measurement).
//!
//! Sizes: `SYNC_SCALE_SIZES` (default `10000,100000`; add `1000000` for a
//! million, which needs several GB of this process's memory: one runner task
//! per owned account). For each size, a fresh key prefix and directory:
//! * `ownership_s`: from the workers' start until every account is owned
//!   (the weights are given by the first worker's bind, as on an empty Redis);
//! * `spread_pct`: once settled, (max − min) owned ÷ the fair share;
//! * `takeover_s`: from killing one worker until its accounts are owned again
//!   (`ttl_s` is the lease TTL);
//! * `redis_cmds_per_tick`, `redis_cpu_us_per_tick`: Redis commands (a
//!   script's inner commands counted) and redis-server CPU (less its idle
//!   rate) in a steady window, per coordinator tick;
//! * `redis_bytes_per_account`: the server's `used_memory` growth ÷ accounts
//!   (bucket leases, plus one tier key per account);
//! * `rss_bytes_per_account`: this process's RSS growth from before the
//!   workers start until full ownership ÷ accounts (runner tasks and the
//!   coordinators' maps; the directory is filled before the baseline).
//!
//! Differences from the set-up, said here and in the README:
//! workers are threads of this process with their own Redis connections
//! (as `sync-ownership`), the directory is in memory, not Postgres, and the
//! Redis is one server: every bucket-lease key shares one hash tag, so a
//! cluster would serve them from one node anyway.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_core::LeaseKey;
use leasehold_redis::test_support::{self, RedisServer};
use serde_json::json;
use sync_worker::config::Ownership;
use sync_worker::{Config, MemoryDirectory, ScriptedSource};
use tokio::time::Instant;

use crate::redis_stats;
use crate::sync_ownership::{counts, owned_total, round3, settle, start_workers, time_until, Command};
use crate::sync_support::rss_kib;

const WORKERS: usize = 8;
const LEASE_TTL: Duration = Duration::from_secs(3);
const STEADY_WINDOW: Duration = Duration::from_secs(6);

fn sizes() -> Result<Vec<usize>> {
    let raw = std::env::var("SYNC_SCALE_SIZES").unwrap_or_else(|_| "10000,100000".into());
    raw.split(',')
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("SYNC_SCALE_SIZES={raw}: {s:?} is not a number")))
        .collect()
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// Runs the benchmark; returns its figures.
pub async fn run() -> Result<serde_json::Value> {
    test_support::require_binary("redis-server");
    let server = RedisServer::start().map_err(anyhow::Error::msg).context("start a private redis-server")?;
    let url = server.url();
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut out = Vec::new();
    for accounts in sizes()? {
        out.push(one_size(&url, &mut conn, accounts).await?);
    }
    Ok(json!({ "bench": "sync-scale", "sizes": out }))
}

async fn one_size(
    url: &str,
    conn: &mut redis::aio::MultiplexedConnection,
    accounts: usize,
) -> Result<serde_json::Value> {
    println!(
        "sync-scale: {accounts} accounts, {WORKERS} coordinators (threads), bucket ownership, lease TTL {LEASE_TTL:?}"
    );
    let prefix = test_support::unique_prefix("bench-scale");
    let directory = MemoryDirectory::new();
    for i in 0..accounts {
        let key = LeaseKey::new(format!("acct-{i:07}"))?;
        directory.insert(key, leasehold_core::UserId::new(format!("u{i}"))?);
    }
    let config = Config {
        ownership: Ownership::Buckets,
        lease_ttl: LEASE_TTL,
        poll_warm: Duration::from_secs(3600),
        poll_cold: Duration::from_secs(7200),
        tier_eval_interval: Duration::from_secs(3600),
        reconcile_interval: Duration::from_secs(3600),
        ..Config::default()
    };
    let idle = redis_stats::idle_rate(conn, Duration::from_millis(500)).await?;
    let memory_before = used_memory(conn).await?;
    let rss_before = rss_kib();
    let source = ScriptedSource::new();
    let (mut workers, started) = start_workers(WORKERS, "scale-w", url, &prefix, &config, &source, &directory).await?;
    let full = {
        let ws = &workers;
        time_until(Duration::from_secs(600), "full ownership", || owned_total(ws) == accounts).await?
    };
    let ownership_s = (full - started).as_secs_f64();
    let rss_bytes_per_account = (rss_kib().saturating_sub(rss_before) * 1024) as f64 / accounts as f64;
    let redis_bytes_per_account = used_memory(conn).await?.saturating_sub(memory_before) as f64 / accounts as f64;
    println!("  full ownership after {ownership_s:.2} s: {:?}", counts(&workers));

    let last = settle(&workers, accounts, 2 * LEASE_TTL, Duration::from_secs(300)).await?;
    let share = accounts as f64 / WORKERS as f64;
    let (max, min) = (*last.iter().max().unwrap_or(&0), *last.iter().min().unwrap_or(&0));
    let spread_pct = (max - min) as f64 / share * 100.0;
    println!("  settled: {last:?}; spread {spread_pct:.2} % of the fair share");

    // Redis work per tick in a steady window.
    redis_stats::reset_stats(conn).await?;
    let cpu0 = redis_stats::cpu_s(conn).await?;
    let ticks0: u64 = workers.iter().map(|w| w.observer.stats().ticks).sum();
    tokio::time::sleep(STEADY_WINDOW).await;
    let ticks = workers.iter().map(|w| w.observer.stats().ticks).sum::<u64>() - ticks0;
    let cpu = redis_stats::cpu_s(conn).await? - cpu0 - idle * STEADY_WINDOW.as_secs_f64();
    let stats = redis_stats::commandstats(conn).await?;
    // Our own INFO calls are not the workers'.
    let calls: u64 = stats.iter().filter(|s| s.name != "info" && s.name != "config|resetstat").map(|s| s.calls).sum();
    ensure!(ticks > 0, "no tick in the steady window");
    let redis_cmds_per_tick = calls as f64 / ticks as f64;
    let redis_cpu_us_per_tick = cpu.max(0.0) * 1e6 / ticks as f64;
    println!("  steady: {ticks} ticks, {redis_cmds_per_tick:.1} Redis commands and {redis_cpu_us_per_tick:.0} µs of Redis CPU per tick");
    redis_stats::print_commandstats(&stats, ticks as f64);

    // Kill one worker; time until its accounts are owned again.
    let mut victim = workers.remove(0);
    let orphans = victim.observer.owned_count();
    let killed = Instant::now();
    victim.send(Command::Kill);
    victim.join().await?;
    let takeover = {
        let ws = &workers;
        time_until(Duration::from_secs(120), "takeover", || owned_total(ws) == accounts).await?
    };
    let takeover_s = (takeover - killed).as_secs_f64();
    println!("  killed a worker ({orphans} accounts): all owned again after {takeover_s:.2} s");
    let exclusive = source.check_exclusive();
    for w in &mut workers {
        w.send(Command::Shutdown);
    }
    for w in &mut workers {
        w.join().await?;
    }
    ensure!(exclusive.is_ok(), "an account was run by two workers at once: {:?}", exclusive.err());
    Ok(json!({
        "accounts": accounts,
        "workers": WORKERS,
        "ownership_s": round3(ownership_s),
        "spread_pct": round3(spread_pct),
        "takeover_s": round3(takeover_s),
        "ttl_s": LEASE_TTL.as_secs_f64(),
        "redis_cmds_per_tick": round3(redis_cmds_per_tick),
        "redis_cpu_us_per_tick": round3(redis_cpu_us_per_tick),
        "redis_bytes_per_account": round3(redis_bytes_per_account),
        "rss_bytes_per_account": round3(rss_bytes_per_account),
    }))
}
