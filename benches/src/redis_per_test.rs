//! `redis-per-test`: Redis CPU per test when the real `leasehold-redis` queue
//! is driven the way hopper's agent slots drive it (crates/hopper/src/worker/agent_slot.rs),
//! without pytest, so the figure is quick to get and does not depend on the
//! machine's load.
//!
//! A private `redis-server`; 2 workers (each its own connection, as two
//! `hopper run` processes) × 2 slots; 20,000 units named like pytest node ids.
//! Both workers initialize the run with the full unit list (leader and
//! follower, as hopper does). Each slot, like hopper's:
//!
//! * reserves with `reserve_batch` when fewer than 2 units are buffered, the
//!   prefetch being 500 ms of work at the running average test time (2..64),
//!   and finalizes what is done (`finalize_batch`) first;
//! * finalizes passed tests in batches of 64, or after 200 ms;
//! * heartbeats every held delivery each heartbeat interval (one
//!   `heartbeat_batch` call); each worker
//!   sends `liveness` and reads `progress` at the same cadence;
//! * "runs" each test for `LEASEHOLD_BENCH_TEST_US` µs (default 300), slept
//!   in steps of at least 1 ms.
//!
//! Figures: redis-server CPU (`INFO cpu`, user + sys of the whole process)
//! over the initialization and over the run, minus the idle rate measured
//! first, per unit; and the time Redis spent in each script mode (`SLOWLOG`
//! with a 0 µs threshold, grouped by transition mode: execution time only,
//! without reading and parsing the request).
//!
//! The slow log costs Redis some CPU per command (inner commands of scripts
//! included); `LEASEHOLD_BENCH_SLOWLOG=0` turns it off for a clean CPU figure.
//!
//! Environment: `LEASEHOLD_BENCH_REDIS_URL` (a server to use instead of a
//! private one; it must be empty), `LEASEHOLD_BENCH_UNITS` (default 20000), `LEASEHOLD_BENCH_SLOTS`
//! (slots per worker, default 2), `LEASEHOLD_BENCH_TEST_US` (default 300),
//! `LEASEHOLD_BENCH_HEARTBEAT_MS` (default 10000: hopper's `--timeout 30` / 3).

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use leasehold_core::{
    Ack, Budgets, Delivery, FinalizeRequest, Outcome, RunId, RunLog, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec,
    WorkerId,
};
use leasehold_redis::test_support::{unique_prefix, RedisServer};
use leasehold_redis::{RedisConfig, RedisStore};
use serde_json::json;
use tokio::time::Instant;

use crate::hopper_local::round3;
use crate::redis_stats::{
    commandstats, commandstats_json, cpu_s, idle_rate, print_commandstats, reset_stats, slowlog_by_mode,
};

const WORKERS: usize = 2;
/// hopper's agent slot constants (crates/hopper/src/worker/agent_slot.rs).
const PIPELINE: usize = 2;
const PREFETCH_WINDOW_MS: f64 = 500.0;
const MAX_PREFETCH: usize = 64;
const FLUSH_AT: usize = 64;
const FLUSH_EVERY: Duration = Duration::from_millis(200);
const RECLAIM_AFTER: Ttl = Ttl::from_secs(30);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Worker {
    store: RedisStore,
    run: RunId,
    worker: WorkerId,
    running: Running,
}

/// The units a worker holds (for liveness' current unit).
#[derive(Default)]
struct Running(std::sync::Mutex<Vec<UnitId>>);

impl Running {
    fn extend(&self, units: impl IntoIterator<Item = UnitId>) {
        if let Ok(mut r) = self.0.lock() {
            r.extend(units);
        }
    }

    fn remove(&self, unit: &UnitId) {
        if let Ok(mut r) = self.0.lock() {
            if let Some(at) = r.iter().position(|u| u == unit) {
                r.swap_remove(at);
            }
        }
    }

    fn first(&self) -> Option<UnitId> {
        self.0.lock().ok().and_then(|r| r.first().cloned())
    }
}

struct Slot {
    w: Arc<Worker>,
    buffer: VecDeque<Delivery>,
    done: Vec<Delivery>,
    last_flush: Instant,
    avg_ms: f64,
    test_us: u64,
    debt_us: u64,
    heartbeat_every: Duration,
    finalized: u64,
}

impl Slot {
    fn prefetch(&self) -> usize {
        ((PREFETCH_WINDOW_MS / self.avg_ms.max(0.1)) as usize).clamp(PIPELINE, MAX_PREFETCH)
    }

    async fn flush(&mut self) -> Result<()> {
        self.last_flush = Instant::now();
        if self.done.is_empty() {
            return Ok(());
        }
        let items: Vec<(Delivery, FinalizeRequest)> = std::mem::take(&mut self.done)
            .into_iter()
            .map(|d| (d, FinalizeRequest::new(Outcome::Passed, self.test_us / 1000)))
            .collect();
        let replies = self.w.store.finalize_batch(&self.w.run, &self.w.worker, &items).await?;
        for reply in replies {
            if reply != Ack::Ok {
                bail!("finalize replied {reply:?}");
            }
            self.finalized += 1;
        }
        Ok(())
    }

    async fn heartbeat(&mut self) -> Result<()> {
        let held: Vec<Delivery> = self.buffer.iter().chain(self.done.iter()).cloned().collect();
        if held.is_empty() {
            return Ok(());
        }
        for reply in self.w.store.heartbeat_batch(&self.w.run, &self.w.worker, &held).await? {
            if reply != Ack::Ok {
                bail!("heartbeat replied {reply:?}");
            }
        }
        Ok(())
    }

    async fn run(mut self) -> Result<u64> {
        let mut beat = tokio::time::interval(self.heartbeat_every);
        beat.reset();
        let mut wait = Duration::from_millis(2);
        loop {
            if self.buffer.len() < PIPELINE {
                self.flush().await?;
                let want = NonZeroUsize::new(self.prefetch()).unwrap_or(NonZeroUsize::MIN);
                let batch = self.w.store.reserve_batch(&self.w.run, &self.w.worker, want, RECLAIM_AFTER).await?;
                if batch.corrupt || !batch.exhausted.is_empty() {
                    bail!("reserve: corrupt {} exhausted {:?}", batch.corrupt, batch.exhausted);
                }
                self.w.running.extend(batch.deliveries.iter().map(|d| d.unit.clone()));
                self.buffer.extend(batch.deliveries);
            }
            if self.buffer.is_empty() {
                self.flush().await?;
                let progress = self.w.store.progress(&self.w.run).await?.context("the run vanished")?;
                if progress.is_complete() {
                    return Ok(self.finalized);
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(500));
                continue;
            }
            // Run one test.
            let Some(d) = self.buffer.pop_front() else { continue };
            self.debt_us += self.test_us;
            if self.debt_us >= 1000 {
                tokio::time::sleep(Duration::from_micros(self.debt_us)).await;
                self.debt_us = 0;
            }
            self.avg_ms = self.avg_ms * 0.9 + self.test_us as f64 / 1000.0 * 0.1;
            self.w.running.remove(&d.unit);
            self.done.push(d);
            if self.done.len() >= FLUSH_AT || self.last_flush.elapsed() >= FLUSH_EVERY {
                self.flush().await?;
            }
            if tokio::time::timeout(Duration::ZERO, beat.tick()).await.is_ok() {
                self.heartbeat().await?;
            }
        }
    }
}

/// hopper's liveness loop (crates/hopper/src/worker/mod.rs): liveness and progress each tick.
async fn liveness_loop(w: Arc<Worker>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let current = w.running.first();
        let _ = w.store.liveness(&w.run, &w.worker, current.as_ref()).await;
        let _ = w.store.progress(&w.run).await;
    }
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    let units = env_u64("LEASEHOLD_BENCH_UNITS", 20_000) as usize;
    let slots = env_u64("LEASEHOLD_BENCH_SLOTS", 2) as usize;
    let test_us = env_u64("LEASEHOLD_BENCH_TEST_US", 300);
    let heartbeat_every = Duration::from_millis(env_u64("LEASEHOLD_BENCH_HEARTBEAT_MS", 10_000).max(10));
    // `LEASEHOLD_BENCH_REDIS_URL`: a server started by hand (e.g. under
    // valgrind, to count its instructions); otherwise a private one.
    let (url, _server) = match std::env::var("LEASEHOLD_BENCH_REDIS_URL") {
        Ok(url) if !url.is_empty() => (url, None),
        _ => {
            let server =
                RedisServer::start().map_err(anyhow::Error::msg).context("cannot start a private redis-server")?;
            (server.url(), Some(server))
        }
    };
    println!(
        "redis-per-test: {units} units, {WORKERS} workers × {slots} slots, {test_us} µs per test, heartbeats every {heartbeat_every:?}"
    );
    let client = redis::Client::open(url.as_str())?;
    let mut stats = client.get_multiplexed_async_connection().await?;
    let prefix = unique_prefix("redis-per-test");
    let run = RunId::new("bench-per-test")?;
    let spec = RunSpec {
        run: run.clone(),
        units: (0..units)
            .map(|i| {
                Ok(UnitSpec::new(
                    UnitId::new(format!("tests/test_file_{:02}.py::test_fast_{}", i / 1000, i % 1000))?,
                    "test",
                ))
            })
            .collect::<Result<_>>()?,
        budgets: Budgets::default(),
        ttl: Duration::from_secs(3600),
    };
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let store = RedisStore::connect_with(RedisConfig::new(&url).with_prefix(prefix.clone())).await?;
        store.load_scripts().await?;
        workers.push(Arc::new(Worker {
            store,
            run: run.clone(),
            worker: WorkerId::new(format!("w{w}"))?,
            running: Default::default(),
        }));
    }

    let info: String = redis::cmd("INFO").arg("server").query_async(&mut stats).await?;
    let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).unwrap_or("?").trim().to_owned();
    println!("  redis-server pid {pid}");
    // The idle rate, to subtract.
    let idle_rate = idle_rate(&mut stats, Duration::from_secs(1)).await?;

    let slowlog = if env_u64("LEASEHOLD_BENCH_SLOWLOG", 1) == 1 { "0" } else { "-1" };
    for (cmd, arg) in [("slowlog-log-slower-than", slowlog), ("slowlog-max-len", "1000000")] {
        redis::cmd("CONFIG").arg("SET").arg(cmd).arg(arg).query_async::<()>(&mut stats).await?;
    }
    redis::cmd("SLOWLOG").arg("RESET").query_async::<()>(&mut stats).await?;
    reset_stats(&mut stats).await?;

    // Initialization: both workers, as hopper's leader and follower.
    let t0 = Instant::now();
    let c0 = cpu_s(&mut stats).await?;
    for w in &workers {
        w.store.initialize(&spec).await?;
    }
    let c1 = cpu_s(&mut stats).await?;
    let init_s = (c1 - c0 - idle_rate * t0.elapsed().as_secs_f64()).max(0.0);
    let init_log = slowlog_by_mode(&mut stats).await?;
    redis::cmd("SLOWLOG").arg("RESET").query_async::<()>(&mut stats).await?;
    reset_stats(&mut stats).await?;

    // The run.
    let started = Instant::now();
    let c0 = cpu_s(&mut stats).await?;
    let mut tickers = Vec::new();
    let mut tasks = Vec::new();
    for w in &workers {
        tickers.push(tokio::spawn(liveness_loop(Arc::clone(w), heartbeat_every)));
        for _ in 0..slots {
            let slot = Slot {
                w: Arc::clone(w),
                buffer: VecDeque::new(),
                done: Vec::new(),
                last_flush: Instant::now(),
                avg_ms: 50.0,
                test_us,
                debt_us: 0,
                heartbeat_every,
                finalized: 0,
            };
            tasks.push(tokio::spawn(slot.run()));
        }
    }
    let mut finalized = 0;
    for t in tasks {
        finalized += t.await??;
    }
    for t in tickers {
        t.abort();
    }
    let wall = started.elapsed().as_secs_f64();
    let c1 = cpu_s(&mut stats).await?;
    let run_s = (c1 - c0 - idle_rate * wall).max(0.0);
    let stats_list = commandstats(&mut stats).await?;
    let run_log = slowlog_by_mode(&mut stats).await?;
    if finalized != units as u64 {
        bail!("{finalized} of {units} units finalized");
    }

    let n = units as f64;
    let run_us = run_s * 1e6 / n;
    let init_us = init_s * 1e6 / n;
    println!(
        "  idle: {:.2} ms CPU/s; run {wall:.2} s; Redis CPU per unit: {:.2} µs total = {init_us:.2} initialize + {run_us:.2} run",
        idle_rate * 1e3,
        init_us + run_us
    );
    let mut modes = serde_json::Map::new();
    for (label, log) in [("initialize", &init_log), ("run", &run_log)] {
        for (mode, (calls, us)) in log {
            println!(
                "  {label:<10} {mode:<16} {calls:>7} calls {:>9.1} µs/call {:>7.2} µs/unit",
                *us as f64 / *calls as f64,
                *us as f64 / n
            );
            modes.insert(format!("{label}:{mode}"), json!({"calls": calls, "us_per_unit": round3(*us as f64 / n)}));
        }
    }
    print_commandstats(&stats_list, n);
    Ok(json!({
        "bench": "redis-per-test",
        "units": units,
        "workers": WORKERS,
        "slots": slots,
        "test_us": test_us,
        "run_s": round3(wall),
        "redis_cpu_us_per_unit": round3(init_us + run_us),
        "init_cpu_us_per_unit": round3(init_us),
        "run_cpu_us_per_unit": round3(run_us),
        "script_time": modes,
        "commands": commandstats_json(&stats_list, n),
    }))
}
