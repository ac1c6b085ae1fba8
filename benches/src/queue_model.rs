//! `queue-model`: what the Redis queue's data model costs Redis per unit,
//! the model in use (`leasehold_redis::keys::QUEUE_FORMAT`: since format 5, ranges of the unit list)
//! beside a measuring prototype of the range model (`benches/lua/ranges_model.lua`,
//! `docs/queue-model.md`), driven the same way on one private redis-server.
//!
//! Both sides run the steady state only: one initialization, then two
//! workers, each reserving `LEASEHOLD_BENCH_BATCH` units (default 64),
//! "running" them for `LEASEHOLD_BENCH_TEST_US` µs each (default 300, as
//! `redis-per-test`; 0 for a tight loop) and finalizing them all as passed,
//! until every unit is finalized. No
//! heartbeats, reclaims or retries: those are rare, and the prototype has
//! none. Figures: redis-server CPU (`INFO cpu`, less the idle rate) per
//! unit, for the initialization and for the run, and `INFO commandstats`.
//! The prototype's answers are checked (every unit finalized once, a second
//! finalize and a handle naming another unit refused) so that its figure is
//! one of work done, not skipped.
//!
//! Environment: `LEASEHOLD_BENCH_UNITS` (default 20000),
//! `LEASEHOLD_BENCH_BATCH` (default 64), `LEASEHOLD_BENCH_CHUNK` (the range
//! model's units per chunk, default 64).

use std::num::NonZeroUsize;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use leasehold_core::{
    Ack, Budgets, FinalizeRequest, Outcome, RunId, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
};
use leasehold_redis::keys::QUEUE_FORMAT;
use leasehold_redis::test_support::{unique_prefix, RedisServer};
use leasehold_redis::{RedisConfig, RedisStore};
use redis::aio::MultiplexedConnection;
use serde_json::json;
use tokio::time::Instant;

use crate::hopper_local::round3;
use crate::redis_queue::env_usize;
use crate::redis_stats::{commandstats, commandstats_json, cpu_s, idle_rate, print_commandstats, reset_stats};

const RECLAIM_AFTER: Ttl = Ttl::from_secs(30);
/// The tail a finalized event carries after its header (as hopper builds it).
const TAIL: &str = r#","outcome":"passed","duration_ms":3,"reason":null,"errors":null}"#;

fn unit_name(i: usize) -> String {
    format!("tests/test_file_{:02}.py::TestCase::test_fast_{}[p{}]", i / 1000, i % 1000, i % 7)
}

/// redis-server CPU seconds between `start` and `stop`, less the idle rate.
struct Meter<'a> {
    conn: &'a mut MultiplexedConnection,
    idle: f64,
}

impl Meter<'_> {
    async fn start(&mut self) -> Result<(Instant, f64)> {
        reset_stats(self.conn).await?;
        Ok((Instant::now(), cpu_s(self.conn).await?))
    }

    async fn stop(&mut self, (t0, c0): (Instant, f64)) -> Result<f64> {
        let c1 = cpu_s(self.conn).await?;
        Ok((c1 - c0 - self.idle * t0.elapsed().as_secs_f64()).max(0.0))
    }
}

/// How long a worker "runs" each unit it holds before finalizing them.
#[derive(Clone, Copy)]
struct Pace {
    per_unit: Duration,
}

impl Pace {
    async fn run(self, units: usize) {
        if !self.per_unit.is_zero() {
            tokio::time::sleep(self.per_unit * units as u32).await;
        }
    }
}

/// The format in use, through the real `RedisStore`.
async fn in_use(url: &str, meter: &mut Meter<'_>, units: usize, batch: NonZeroUsize, pace: Pace) -> Result<(f64, f64)> {
    let prefix = unique_prefix("queue-model");
    let run = RunId::new("queue-model")?;
    let spec = RunSpec {
        run: run.clone(),
        units: (0..units).map(|i| Ok(UnitSpec::new(UnitId::new(unit_name(i))?, "test"))).collect::<Result<_>>()?,
        budgets: Budgets::default(),
        ttl: Duration::from_secs(3600),
    };
    let mut workers = Vec::new();
    for w in 0..2 {
        let store = RedisStore::connect_with(RedisConfig::new(url).with_prefix(prefix.clone())).await?;
        store.load_scripts().await?;
        workers.push((store, WorkerId::new(format!("w{w}"))?));
    }
    let started = meter.start().await?;
    workers[0].0.initialize(&spec).await?;
    let init = meter.stop(started).await?;
    let started = meter.start().await?;
    let mut tasks = Vec::new();
    for (store, worker) in workers {
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let mut finalized = 0;
            loop {
                let reserved = store.reserve_batch(&run, &worker, batch, RECLAIM_AFTER).await?;
                if reserved.deliveries.is_empty() {
                    return Ok::<_, anyhow::Error>(finalized);
                }
                pace.run(reserved.deliveries.len()).await;
                let items: Vec<_> =
                    reserved.deliveries.into_iter().map(|d| (d, FinalizeRequest::new(Outcome::Passed, 3))).collect();
                for ack in store.finalize_batch(&run, &worker, &items).await? {
                    ensure!(ack == Ack::Ok, "in use: finalize replied {ack:?}");
                    finalized += 1;
                }
            }
        }));
    }
    let mut finalized = 0;
    for task in tasks {
        finalized += task.await??;
    }
    let run_s = meter.stop(started).await?;
    ensure!(finalized == units, "in use: {finalized} of {units} units finalized");
    Ok((init, run_s))
}

/// The range model's prototype, through its script.
struct Ranges {
    script: redis::Script,
    keys: Vec<String>,
}

impl Ranges {
    fn new() -> Self {
        let tag = unique_prefix("queue-model-ranges");
        let keys = ["meta", "chunks", "ranges", "starts", "clocks", "attempts", "workers", "unit_state"]
            .iter()
            .map(|k| format!("{tag}:{{run}}:{k}"))
            .collect();
        Ranges { script: redis::Script::new(include_str!("../lua/ranges_model.lua")), keys }
    }

    fn call(&self, mode: &str, worker: &str) -> redis::ScriptInvocation<'_> {
        let mut inv = self.script.prepare_invoke();
        for key in &self.keys {
            inv.key(key);
        }
        inv.arg(mode).arg(worker);
        inv
    }

    /// Reserves up to `max` units: the range id and (index, unit) of each.
    async fn reserve(
        &self,
        conn: &mut MultiplexedConnection,
        worker: &str,
        max: usize,
    ) -> Result<Option<(String, Vec<(usize, String)>)>> {
        let reply: Vec<String> = self.call("reserve", worker).arg(max).invoke_async(conn).await?;
        let [id, first, packed] = reply.as_slice() else {
            ensure!(reply.is_empty(), "reserve replied {reply:?}");
            return Ok(None);
        };
        let first: usize = first.parse()?;
        let units = packed
            .lines()
            .enumerate()
            .map(|(i, line)| Ok((first + i, line.split_once('\t').context("a packed unit has no kind")?.0.to_owned())))
            .collect::<Result<_>>()?;
        Ok(Some((id.clone(), units)))
    }

    async fn finalize(
        &self,
        conn: &mut MultiplexedConnection,
        worker: &str,
        id: &str,
        units: &[(usize, String)],
    ) -> Result<Vec<String>> {
        let mut inv = self.call("finalize", worker);
        inv.arg(1).arg(id).arg(1).arg(units.len());
        for (index, unit) in units {
            inv.arg(index).arg(unit).arg(TAIL);
        }
        Ok(inv.invoke_async(conn).await?)
    }
}

async fn ranges(
    url: &str,
    meter: &mut Meter<'_>,
    units: usize,
    (batch, chunk): (usize, usize),
    pace: Pace,
) -> Result<(f64, f64)> {
    let client = redis::Client::open(url)?;
    let conns = [client.get_multiplexed_async_connection().await?, client.get_multiplexed_async_connection().await?];
    let model = Ranges::new();
    let names: Vec<String> = (0..units).map(unit_name).collect();
    let started = meter.start().await?;
    let mut init = model.call("init", "w0");
    init.arg(chunk);
    for name in &names {
        init.arg(name);
    }
    let mut admin = client.get_multiplexed_async_connection().await?;
    let _: String = init.invoke_async(&mut admin).await?;
    let init_s = meter.stop(started).await?;

    let started = meter.start().await?;
    let model = std::sync::Arc::new(model);
    let names = std::sync::Arc::new(names);
    let mut tasks = Vec::new();
    for (w, mut conn) in conns.into_iter().enumerate() {
        let (model, names) = (std::sync::Arc::clone(&model), std::sync::Arc::clone(&names));
        tasks.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let mut got = Vec::new();
            while let Some((id, held)) = model.reserve(&mut conn, &worker, batch).await? {
                pace.run(held.len()).await;
                for ack in model.finalize(&mut conn, &worker, &id, &held).await? {
                    ensure!(ack == "OK", "ranges: finalize replied {ack}");
                }
                for (index, unit) in held {
                    ensure!(names.get(index) == Some(&unit), "ranges: unit {index} came back as {unit:?}");
                    got.push(index);
                }
            }
            Ok::<_, anyhow::Error>(got)
        }));
    }
    let mut delivered = vec![false; units];
    let mut finalized = 0;
    for task in tasks {
        for index in task.await?? {
            ensure!(!std::mem::replace(&mut delivered[index], true), "ranges: unit {index} delivered twice");
            finalized += 1;
        }
    }
    let run_s = meter.stop(started).await?;
    ensure!(finalized == units, "ranges: {finalized} of {units} units finalized");
    let left: usize = redis::cmd("HLEN").arg(&model.keys[2]).query_async(&mut admin).await?;
    ensure!(left == 0, "ranges: {left} ranges left after every unit was finalized");
    Ok((init_s, run_s))
}

/// The prototype's fence: a unit finalized twice, or a handle naming
/// another unit than its index's, is refused.
async fn check_fence(url: &str) -> Result<()> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let model = Ranges::new();
    let mut init = model.call("init", "w0");
    init.arg(4);
    for i in 0..10 {
        init.arg(unit_name(i));
    }
    let _: String = init.invoke_async(&mut conn).await?;
    let (id, held) = model.reserve(&mut conn, "w0", 6).await?.context("nothing reserved")?;
    ensure!(held.len() == 6 && held[5].1 == unit_name(5), "reserve across chunks: {held:?}");
    let forged = [(held[0].0, held[1].1.clone())];
    ensure!(model.finalize(&mut conn, "w0", &id, &forged).await? == ["STALE"], "a forged handle was accepted");
    ensure!(model.finalize(&mut conn, "w1", &id, &held[..1]).await? == ["STALE"], "another worker was accepted");
    ensure!(model.finalize(&mut conn, "w0", &id, &held[..2]).await? == ["OK", "OK"], "a real handle was refused");
    ensure!(model.finalize(&mut conn, "w0", &id, &held[..1]).await? == ["STALE"], "a unit was finalized twice");
    Ok(())
}

/// Runs the benchmark; prints readable lines and returns its JSON figures.
pub async fn run() -> Result<serde_json::Value> {
    let units = env_usize("LEASEHOLD_BENCH_UNITS", 20_000).max(1);
    let batch = env_usize("LEASEHOLD_BENCH_BATCH", 64).max(1);
    let chunk = env_usize("LEASEHOLD_BENCH_CHUNK", 64).max(1);
    let test_us = env_usize("LEASEHOLD_BENCH_TEST_US", 300);
    let pace = Pace { per_unit: Duration::from_micros(test_us as u64) };
    let server = RedisServer::start().map_err(anyhow::Error::msg).context("cannot start a private redis-server")?;
    let url = server.url();
    println!("queue-model: {units} units, 2 workers, {batch} units a call, {test_us} µs a unit, chunks of {chunk}");
    let client = redis::Client::open(url.as_str())?;
    let mut stats = client.get_multiplexed_async_connection().await?;
    check_fence(&url).await?;
    let idle = idle_rate(&mut stats, Duration::from_secs(1)).await?;
    let mut meter = Meter { conn: &mut stats, idle };

    let (used_init, used_run) =
        in_use(&url, &mut meter, units, NonZeroUsize::new(batch).unwrap_or(NonZeroUsize::MIN), pace).await?;
    let used_stats = commandstats(meter.conn).await?;
    let (r_init, r_run) = ranges(&url, &mut meter, units, (batch, chunk), pace).await?;
    let r_stats = commandstats(meter.conn).await?;

    let in_use_name = format!("format {QUEUE_FORMAT} (in use)");
    let n = units as f64;
    let per = |s: f64| round3(s * 1e6 / n);
    for (name, init, run, stats) in
        [(in_use_name.as_str(), used_init, used_run, &used_stats), ("range model (prototype)", r_init, r_run, &r_stats)]
    {
        println!(
            "{name}: {:.2} µs of redis-server CPU per unit = {:.2} initialize + {:.2} run",
            per(init + run),
            per(init),
            per(run)
        );
        print_commandstats(stats, n);
    }
    if used_run <= 0.0 {
        bail!("no CPU measured for {in_use_name}");
    }
    Ok(json!({
        "bench": "queue-model",
        "units": units,
        "batch": batch,
        "chunk": chunk,
        "test_us": test_us,
        "queue_format": QUEUE_FORMAT,
        "in_use_us_per_unit": per(used_init + used_run),
        "in_use_init_us_per_unit": per(used_init),
        "in_use_run_us_per_unit": per(used_run),
        "ranges_us_per_unit": per(r_init + r_run),
        "ranges_init_us_per_unit": per(r_init),
        "ranges_run_us_per_unit": per(r_run),
        "in_use_commands": commandstats_json(&used_stats, n),
        "ranges_commands": commandstats_json(&r_stats, n),
    }))
}
