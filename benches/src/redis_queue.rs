//! `redis-queue`: no-op units through one Redis, 8 concurrent workers in one
//! process.
//!
//! Uses `REDIS_URL` when it is set, otherwise a private `redis-server` on a
//! free loopback port. Each worker loops `reserve_batch` (one script call for
//! a batch) → `finalize_many` (one script call for the batch) until the run is
//! done. Figures:
//!
//! * `units_per_s`: units finalized per second of wall time;
//! * `server_us_per_unit`: the sum of `usec` over `INFO commandstats` (after
//!   `CONFIG RESETSTAT`) divided by units: the measure. Redis also
//!   counts the commands a script runs, inside the script's own time, so this
//!   counts script work twice;
//! * `script_us_per_unit`: `usec` of the script calls alone (each includes the
//!   commands it runs), the Redis time spent on the queue without the double count;
//! * `server_cpu_us_per_unit`: `used_cpu_sys + used_cpu_user` of the server
//!   process over the run (includes network I/O), divided by units.
//!
//! A second, smaller pass measures the plain trait path (one `reserve` and
//! one `finalize` per unit, as the seed did) for comparison.
//!
//! Environment: `LEASEHOLD_BENCH_UNITS` (default 200000), `LEASEHOLD_BENCH_BATCH` (default 64),
//! `LEASEHOLD_BENCH_SINGLE_UNITS` (units of the per-unit pass; default a tenth; 0 skips it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use leasehold_core::{
    Budgets, FinalizeRequest, Outcome, ReserveReply, RunId, RunLog, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
};
use leasehold_redis::test_support::{unique_prefix, RedisServer};
use leasehold_redis::{RedisConfig, RedisStore};
use serde_json::json;

use crate::redis_stats::{commandstats, cpu_s};

const WORKERS: usize = 8;
const RECLAIM_AFTER: Ttl = Ttl::from_secs(600);

/// A count from the environment variable `name`, or `default`.
pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Server statistics since the last reset: (sum of usec, usec of script calls, calls, cpu seconds).
async fn server_stats(conn: &mut redis::aio::MultiplexedConnection) -> Result<(f64, f64, u64, f64)> {
    let (mut usec, mut script_usec, mut calls) = (0.0, 0.0, 0u64);
    for stat in commandstats(conn).await? {
        usec += stat.usec as f64;
        calls += stat.calls;
        if matches!(stat.name.as_str(), "evalsha" | "eval" | "fcall") {
            script_usec += stat.usec as f64;
        }
    }
    Ok((usec, script_usec, calls, cpu_s(conn).await?))
}

fn spec(run: &str, units: usize) -> Result<RunSpec> {
    Ok(RunSpec {
        run: RunId::new(run)?,
        units: (0..units)
            .map(|i| Ok(UnitSpec::new(UnitId::new(format!("tests/unit_{i:07}.rs"))?, "file")))
            .collect::<Result<_>>()?,
        budgets: Budgets::default(),
        ttl: Duration::from_secs(3600),
    })
}

struct Pass {
    units: u64,
    secs: f64,
    usec: f64,
    script_usec: f64,
    calls: u64,
    cpu_s: f64,
}

impl Pass {
    fn print(&self, label: &str) {
        let n = self.units as f64;
        println!(
            "redis-queue [{label}]: {} units in {:.2} s = {:.0} units/s; Redis: {:.1} µs/unit (commandstats sum), \
             {:.1} µs/unit (script calls), {:.1} µs/unit (process CPU), {:.1} commands/unit",
            self.units,
            self.secs,
            n / self.secs,
            self.usec / n,
            self.script_usec / n,
            self.cpu_s * 1e6 / n,
            self.calls as f64 / n
        );
    }
}

async fn pass(
    store: &RedisStore,
    stats: &mut redis::aio::MultiplexedConnection,
    units: usize,
    batch: std::num::NonZeroUsize,
    batched: bool,
) -> Result<Pass> {
    let run = format!("bench-{}", if batched { "batched" } else { "single" });
    let spec = spec(&run, units)?;
    store.initialize(&spec).await.context("initialize the benchmark run")?;
    redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(stats).await?;
    let (_, _, _, cpu0) = server_stats(stats).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let store = store.clone();
        let run = spec.run.clone();
        let worker = WorkerId::new(format!("w{w}"))?;
        tasks.push(tokio::spawn(async move {
            let request = FinalizeRequest::new(Outcome::Passed, 0);
            let mut done = 0u64;
            loop {
                if batched {
                    let got = store.reserve_batch(&run, &worker, batch, RECLAIM_AFTER).await?;
                    if got.deliveries.is_empty() {
                        break;
                    }
                    let items: Vec<_> = got.deliveries.into_iter().map(|d| (d, request.clone())).collect();
                    done += store.finalize_many(&run, &worker, &items).await?.len() as u64;
                } else {
                    match store.reserve(&run, &worker, RECLAIM_AFTER).await? {
                        ReserveReply::Delivered(d) => {
                            store.finalize(&run, &worker, &d, &request).await?;
                            done += 1;
                        }
                        _ => break,
                    }
                }
            }
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let (usec, script_usec, calls, cpu1) = server_stats(stats).await?;
    let progress = store.progress(&spec.run).await?.context("the run vanished")?;
    anyhow::ensure!(
        progress.finalized == units as u64 && total == units as u64,
        "not every unit was finalized: {progress:?}"
    );
    Ok(Pass { units: total, secs, usec, script_usec, calls, cpu_s: cpu1 - cpu0 })
}

/// Runs the benchmark; prints readable lines and returns the JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    let units = env_usize("LEASEHOLD_BENCH_UNITS", 200_000);
    let batch =
        std::num::NonZeroUsize::new(env_usize("LEASEHOLD_BENCH_BATCH", 64)).unwrap_or(std::num::NonZeroUsize::MIN);
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let server = RedisServer::start().map_err(anyhow::Error::msg)?;
            (server.url(), Some(Arc::new(server)))
        }
    };
    println!("redis-queue: {units} no-op units, {WORKERS} workers, batches of {batch}, Redis at {url}");
    let store = RedisStore::connect_with(RedisConfig::new(&url).with_prefix(unique_prefix("bench"))).await?;
    store.load_scripts().await?;
    let client = redis::Client::open(url.as_str())?;
    let mut stats = client.get_multiplexed_async_connection().await?;

    let batched = pass(&store, &mut stats, units, batch, true).await?;
    batched.print("reserve_batch + finalize_many");
    let single_units = env_usize("LEASEHOLD_BENCH_SINGLE_UNITS", (units / 10).max(1000));
    let single = if single_units > 0 {
        let single = pass(&store, &mut stats, single_units, batch, false).await?;
        single.print("reserve + finalize per unit");
        single
    } else {
        Pass { units: 0, secs: 1.0, usec: 0.0, script_usec: 0.0, calls: 0, cpu_s: 0.0 }
    };

    let n = batched.units as f64;
    Ok(json!({
        "bench": "redis-queue",
        "units": batched.units,
        "workers": WORKERS,
        "batch": batch,
        "units_per_s": (n / batched.secs).round(),
        "server_us_per_unit": (batched.usec / n * 100.0).round() / 100.0,
        "script_us_per_unit": (batched.script_usec / n * 100.0).round() / 100.0,
        "server_cpu_us_per_unit": (batched.cpu_s * 1e6 / n * 100.0).round() / 100.0,
        "single_units_per_s": (single.units as f64 / single.secs).round(),
        "single_server_us_per_unit": (single.usec / (single.units.max(1)) as f64 * 100.0).round() / 100.0,
        "single_script_us_per_unit": (single.script_usec / (single.units.max(1)) as f64 * 100.0).round() / 100.0,
    }))
}
