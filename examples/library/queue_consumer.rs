//! A consumer of the fenced unit queue, with retries.
//!
//! ```text
//! cargo run -p leasehold-examples --example queue_consumer -- [mem:// | redis://host:port]
//! ```
//!
//! A run of six units, drained by two workers at once. `flaky-*` units fail
//! their first attempt and pass the second; `broken` fails every attempt.
//! Each worker initializes the run (the first one makes it, the other joins
//! it under the budgets frozen in it), then loops: reserve a unit, run it
//! while heartbeating so no one reclaims it, and finalize a pass or requeue
//! a failure. The queue applies the budgets: one retry per unit, for at most
//! half of the run's units; a requeue past them finalizes the unit as failed.
//!
//! At the end the program reads each unit's verdict from the run's event log,
//! prints it, and exits non-zero unless every unit was finalized exactly once
//! with the verdict the budgets promise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use leasehold_core::{
    Ack, Budgets, Delivery, Event, FinalizeReason, FinalizeRequest, InitOutcome, Outcome, RequeueReply, RequeueRequest,
    ReserveReply, RunId, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, WorkerId,
};

const UNITS: [&str; 6] = ["alpha", "beta", "flaky-gamma", "flaky-delta", "broken", "zeta"];
/// How long one attempt of a unit runs.
const WORK: Duration = Duration::from_millis(150);
/// Heartbeats come well inside the reclaim timeout.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);
/// A delivery idle this long may be taken over by another worker.
const RECLAIM_AFTER: Ttl = Ttl::from_secs(5);

#[tokio::main]
async fn main() -> Result<()> {
    let url = leasehold_examples::url_from_args();
    let queue = leasehold_examples::connect(&url).await?.queue;
    // A fresh run each time: on a shared Redis an old run of the same id
    // would already be done.
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let run = RunId::new(format!("example-{}-{started_ms}", std::process::id()))?;
    println!("queue_consumer on {url}, run {run}");
    let spec = RunSpec {
        run: run.clone(),
        units: UNITS.iter().map(|u| Ok(UnitSpec::new(UnitId::new(u)?, "job"))).collect::<Result<_>>()?,
        budgets: Budgets { max_requeues: 1, requeue_tolerance: 0.5, max_reclaims: 2, max_failures: None },
        ttl: Duration::from_secs(600),
    };

    let workers: Vec<_> = ["worker-1", "worker-2"]
        .into_iter()
        .map(|name| Ok(tokio::spawn(consume(queue.clone(), spec.clone(), WorkerId::new(name)?))))
        .collect::<Result<_>>()?;
    for worker in workers {
        worker.await.context("a worker panicked")??;
    }

    // The verdicts, as the run's event log records them.
    let mut verdicts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in queue.events(&run, None, 1_000).await? {
        if let Event::Finalized { header, outcome, reason, .. } = record.event {
            let reason = reason.map(|r| format!(" ({r})")).unwrap_or_default();
            let attempts = header.retry_index + 1;
            verdicts
                .entry(header.unit_id.to_string())
                .or_default()
                .push(format!("{} after {attempts} attempt(s){reason}", outcome.as_str()));
        }
    }
    println!("verdicts:");
    for (unit, finals) in &verdicts {
        println!("  {unit}: {}", finals.join("; "));
    }

    let expected = |unit: &str| match unit {
        "broken" => format!("failed after 2 attempt(s) ({})", FinalizeReason::RetryBudgetExhausted),
        flaky if flaky.starts_with("flaky-") => "passed after 2 attempt(s)".to_owned(),
        _ => "passed after 1 attempt(s)".to_owned(),
    };
    for unit in UNITS {
        let finals = verdicts.get(unit).map(Vec::as_slice).unwrap_or_default();
        ensure!(
            finals == [expected(unit)],
            "{unit}: expected one verdict, {:?}; the log says {finals:?}",
            expected(unit)
        );
    }
    let progress = queue.progress(&run).await?.context("the run is gone")?;
    ensure!(progress.is_complete() && progress.total == UNITS.len() as u64, "the run is not complete: {progress:?}");
    ensure!(progress.requeued_units == 3, "expected 3 units retried, the run counts {}", progress.requeued_units);
    println!("ok: every unit finalized once, with the verdict its budgets promise");
    Ok(())
}

/// One worker: joins the run, then takes units until every unit is final.
async fn consume(queue: Arc<dyn UnitQueue>, spec: RunSpec, me: WorkerId) -> Result<()> {
    match queue.initialize(&spec).await? {
        InitOutcome::Initialized => println!("{me}: made the run"),
        InitOutcome::AlreadyInitialized { budgets } => println!("{me}: joined the run (budgets {budgets:?})"),
    }
    let run = &spec.run;
    loop {
        match queue.reserve(run, &me, RECLAIM_AFTER).await? {
            ReserveReply::Delivered(delivery) => attempt(&*queue, run, &me, delivery).await?,
            ReserveReply::ReclaimExhausted { unit } => println!("{me}: {unit} ran out of reclaims: failed"),
            // Nothing to hand out: done when every unit is final, otherwise
            // units are in flight elsewhere and may come back requeued.
            ReserveReply::None => {
                let progress = queue.progress(run).await?.context("the run is gone")?;
                if progress.is_complete() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The run's failure limit was reached (none is set here): take no more.
            ReserveReply::Stopped => return Ok(()),
            ReserveReply::Corrupt => bail!("{me}: the run's state is gone (expired or deleted)"),
        }
    }
}

/// Runs one delivery and reports its result to the queue.
async fn attempt(queue: &dyn UnitQueue, run: &RunId, me: &WorkerId, delivery: Delivery) -> Result<()> {
    let unit = delivery.unit.as_str();
    let started = Instant::now();
    let work = tokio::time::sleep(WORK);
    tokio::pin!(work);
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    loop {
        tokio::select! {
            () = &mut work => break,
            _ = heartbeat.tick() => {
                // Not OK: another worker owns it now (it was reclaimed), or the
                // run is gone. Either way this attempt's result is not wanted.
                if queue.heartbeat(run, me, &delivery).await? != Ack::Ok {
                    println!("{me}: lost {unit}; dropping its result");
                    return Ok(());
                }
            }
        }
    }
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let passed = match unit {
        "broken" => false,
        flaky if flaky.starts_with("flaky-") => delivery.retry_index > 0,
        _ => true,
    };
    if passed {
        let reply = queue.finalize(run, me, &delivery, &FinalizeRequest::new(Outcome::Passed, duration_ms)).await?;
        match reply {
            Ack::Ok => println!("{me}: {unit} passed"),
            Ack::Stale => println!("{me}: {unit} passed, but it is no longer ours: result dropped"),
            Ack::Corrupt => bail!("{me}: the run's state is gone"),
        }
        return Ok(());
    }
    let failure = RequeueRequest { duration_ms, failure_summary: Some(format!("{unit} failed")), ..Default::default() };
    match queue.requeue(run, me, &delivery, &failure).await? {
        RequeueReply::Requeued { retry_index } => println!("{me}: {unit} failed; retry {retry_index} queued"),
        RequeueReply::Finalized { .. } => println!("{me}: {unit} failed; no retry left, so it failed for good"),
        RequeueReply::Stale => println!("{me}: {unit} failed, but it is no longer ours: result dropped"),
        RequeueReply::Corrupt => bail!("{me}: the run's state is gone"),
    }
    Ok(())
}
