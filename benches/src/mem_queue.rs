//! `mem-queue`: unit lifecycles (reserve with delivery accounting, then
//! finalize) per second through the memory backend, on one task and on 8.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use leasehold_core::{
    Budgets, FinalizeRequest, Outcome, ReserveReply, RunId, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
};
use leasehold_mem::MemoryStore;
use serde_json::json;

/// Units per run; several runs keep each run's event log a modest size.
const UNITS_PER_RUN: usize = 100_000;
const RUNS: usize = 10;
const RECLAIM_AFTER: Ttl = Ttl::from_secs(600);

fn spec(run: &str) -> Result<RunSpec> {
    let units = (0..UNITS_PER_RUN)
        .map(|i| Ok(UnitSpec::new(UnitId::new(format!("tests/unit_{i}.rs"))?, "file")))
        .collect::<Result<Vec<_>>>()?;
    Ok(RunSpec { run: RunId::new(run)?, units, budgets: Budgets::default(), ttl: Duration::from_secs(3600) })
}

/// Drains `run` as `worker`; returns the lifecycles completed.
async fn drain(queue: &MemoryStore, run: &RunId, worker: &WorkerId) -> Result<u64> {
    let done = FinalizeRequest::new(Outcome::Passed, 1);
    let mut n = 0;
    loop {
        match queue.reserve(run, worker, RECLAIM_AFTER).await? {
            ReserveReply::Delivered(delivery) => {
                queue.finalize(run, worker, &delivery, &done).await?;
                n += 1;
            }
            ReserveReply::None => return Ok(n),
            other => anyhow::bail!("unexpected reserve reply {other:?}"),
        }
    }
}

async fn one_task(store: &MemoryStore) -> Result<f64> {
    let worker = WorkerId::new("bench-1")?;
    let mut elapsed = Duration::ZERO;
    let mut total = 0;
    for r in 0..RUNS {
        let spec = spec(&format!("single-{r}"))?;
        store.initialize(&spec).await?;
        let start = Instant::now();
        total += drain(store, &spec.run, &worker).await?;
        elapsed += start.elapsed();
    }
    ensure!(total == (UNITS_PER_RUN * RUNS) as u64, "lost units: {total}");
    Ok(total as f64 / elapsed.as_secs_f64())
}

async fn eight_tasks(store: &MemoryStore) -> Result<f64> {
    let mut elapsed = Duration::ZERO;
    let mut total = 0;
    for r in 0..RUNS {
        let spec = spec(&format!("eight-{r}"))?;
        store.initialize(&spec).await?;
        let run = Arc::new(spec.run.clone());
        let start = Instant::now();
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let (store, run) = (store.clone(), run.clone());
                tokio::spawn(async move { drain(&store, &run, &WorkerId::new(format!("bench-{t}"))?).await })
            })
            .collect();
        for task in tasks {
            total += task.await??;
        }
        elapsed += start.elapsed();
    }
    ensure!(total == (UNITS_PER_RUN * RUNS) as u64, "lost units: {total}");
    Ok(total as f64 / elapsed.as_secs_f64())
}

/// Runs the benchmark and returns its figures.
pub async fn run() -> Result<serde_json::Value> {
    let store = MemoryStore::new();
    let single = one_task(&store).await?;
    println!("mem-queue: 1 task:  {single:>12.0} lifecycles/s ({} units)", UNITS_PER_RUN * RUNS);
    let store = MemoryStore::new();
    let eight = eight_tasks(&store).await?;
    println!("mem-queue: 8 tasks: {eight:>12.0} lifecycles/s ({} units)", UNITS_PER_RUN * RUNS);
    Ok(json!({
        "bench": "mem-queue",
        "lifecycles_per_s": single.round(),
        "lifecycles_per_s_8_tasks": eight.round(),
    }))
}
