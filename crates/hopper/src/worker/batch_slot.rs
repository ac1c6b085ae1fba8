//! A batch slot: reserves a batch of units, runs it as one invocation in its
//! own process group (the worker's beat heartbeats the deliveries while it
//! runs, see [`HeldBoard`](super::held::HeldBoard)), and reports
//! each unit's result through the fenced transitions (finalize, requeue,
//! release).
//!
//! A batch is the general case: a batch of one runs one unit per
//! invocation. A [`BatchResults`](crate::verdicts::BatchResults) turns an
//! invocation into one verdict per unit (from the exit code, or from the
//! tool's own report: see [`crate::verdicts`]); a unit it has no verdict for
//! is treated as failed and retried within the budgets.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::queue::MAX_SUMMARY_LEN;
use leasehold_core::{Ack, Delivery, Outcome, UnitId};

use crate::agent::child::SLOT_ENV;
use crate::errors::HopperError;
use crate::exec::process::{run_process_in, Termination};
use crate::verdicts::model::{UnitResult, UnitVerdict};
use crate::verdicts::{REPORT_ENV, REPORT_PLACEHOLDER};
use crate::worker::config::{BatchSlots, BatchStart};
use crate::worker::launch::Invocation;
use crate::worker::observer::AttemptEnd;
use crate::worker::shared_runs::Plan;
use crate::worker::transitions::{
    fenced_off, hand_back, idle, millis, requeue_failed, reserve, slot_number, Idle, Shared, MIN_WAIT,
};

/// Runs one slot's batches until every unit is finalized or the worker stops.
pub(super) async fn slot_loop(shared: Arc<Shared>, slot: usize, batches: BatchSlots) -> Result<(), HopperError> {
    let mut wait = MIN_WAIT;
    loop {
        if shared.stop.is_cancelled() {
            return Ok(());
        }
        let reserved = reserve(&shared, batches.size).await?;
        if !reserved.deliveries.is_empty() {
            wait = MIN_WAIT;
            run_batch(&shared, &batches, reserved.deliveries, slot).await?;
            continue;
        }
        if reserved.moved {
            continue;
        }
        match idle(&shared, &mut wait).await? {
            Idle::Complete => {
                tracing::debug!(slot, "every unit is finalized");
                return Ok(());
            }
            Idle::Stopped => return Ok(()),
            Idle::Again => {}
        }
    }
}

async fn run_batch(
    shared: &Shared,
    batches: &BatchSlots,
    deliveries: Vec<Delivery>,
    slot: usize,
) -> Result<(), HopperError> {
    let config = &shared.config;
    let (run, worker) = (&config.run, &config.worker);
    let units: Vec<UnitId> = deliveries.iter().map(|d| d.unit.clone()).collect();
    let report = batches.results.report_path();
    let invocation = match &batches.start {
        BatchStart::Launcher(launcher) => launcher.invocation(&units),
        BatchStart::Template(command) => Invocation { argv: command.render(&units), ..Invocation::default() },
    };
    let mut argv = invocation.argv;
    let mut env = config.env.clone();
    env.extend(invocation.env);
    if let Some(path) = &report {
        let path = path.to_string_lossy();
        for arg in &mut argv {
            if arg.contains(REPORT_PLACEHOLDER) {
                *arg = arg.replace(REPORT_PLACEHOLDER, &path);
            }
        }
        env.push((REPORT_ENV.into(), path.into_owned()));
    }
    env.push(("HOPPER_BUILD".into(), run.to_string()));
    env.push(("HOPPER_WORKER".into(), worker.to_string()));
    env.push((SLOT_ENV.into(), slot.to_string()));
    if let [single] = deliveries.as_slice() {
        env.push(("HOPPER_UNIT".into(), single.unit.to_string()));
        env.push(("HOPPER_ATTEMPT".into(), (single.retry_index + 1).to_string()));
    }
    shared.running.lock().extend(units.iter().cloned());

    // `lost[i]`: the queue no longer lets us report delivery i.
    let mut lost = vec![false; deliveries.len()];
    let stop_unit = shared.stop.child_token();
    // A unit run together with others of its key (cargo's doctests) may
    // take its verdict from a run another slot of this worker already ran.
    let process = async {
        if let (Some(memo), [delivery]) = (&batches.shared, deliveries.as_slice()) {
            if let Plan::Shared { result, own, ran_now } = memo.plan(delivery, &env, config.limits, &stop_unit).await {
                return (result, Some(own), ran_now);
            }
        }
        let result = run_process_in(invocation.cwd.as_deref(), &argv, &env, config.limits, &stop_unit).await;
        (Arc::new(result), None, true)
    };
    tokio::pin!(process);
    let mut lost_beats = shared.held.watch_lost();
    let mut halted_here = false;
    let (result, shared_verdict, ran_now) = loop {
        tokio::select! {
            ran = &mut process => break ran,
            // `--max-failures-kill`: the build stopped, so this batch stops too.
            _ = shared.halt.cancelled(), if config.stop_running_on_halt && !halted_here => {
                halted_here = true;
                stop_unit.cancel();
            }
            Ok(()) = lost_beats.changed() => {
                for (delivery, lost) in deliveries.iter().zip(lost.iter_mut()) {
                    *lost |= shared.held.is_lost(delivery);
                }
                if lost.iter().all(|l| *l) {
                    // Nobody will take this attempt's result: stop wasting the slot.
                    stop_unit.cancel();
                }
            }
        }
    };
    {
        let mut running = shared.running.lock();
        running.retain(|u| !units.contains(u));
    }
    if ran_now {
        shared.summary.lock().invocations += 1;
    }

    if (shared.stop.is_cancelled() || halted_here) && result.termination == Termination::Stopped {
        let owned: Vec<Delivery> =
            deliveries.iter().zip(&lost).filter(|(_, lost)| !**lost).map(|(d, _)| d.clone()).collect();
        hand_back(shared, &owned, result.duration).await;
        return Ok(());
    }

    let verdicts = match shared_verdict {
        Some(own) => units.iter().map(|u| (u.clone(), own.clone())).collect(),
        None => batches.results.verdicts(&units, &result, &config.limits, report.as_deref()),
    };
    let outside = batches.results.take_outside_errors();
    crate::verdicts::outside::record(&*shared.queue, run, worker, &outside).await?;
    let share = result.duration / deliveries.len().max(1) as u32;
    let output = result.output.text(MAX_SUMMARY_LEN / 2);
    let mut alone = Vec::new();
    let rerun_alone = crate::verdicts::solo::rerun_alone(&units, &verdicts);
    for (i, delivery) in deliveries.iter().enumerate() {
        if lost[i] {
            shared.held.let_go([delivery]);
            continue;
        }
        if rerun_alone.contains(&delivery.unit) {
            alone.push(delivery.clone());
            continue;
        }
        let unit_result = verdicts.get(&delivery.unit).cloned().unwrap_or_else(|| {
            UnitResult::from(UnitVerdict::Failed {
                reason: "no_result",
                detail: "the invocation reported no result for this unit".into(),
            })
        });
        let per_unit = unit_result.duration.unwrap_or(share);
        let per_unit_ms = millis(per_unit);
        let output = unit_result.output.as_ref().unwrap_or(&output);
        shared.summary.lock().timings.push((delivery.unit.to_string(), per_unit_ms));
        match unit_result.verdict {
            verdict @ (UnitVerdict::Passed | UnitVerdict::Skipped) => {
                let outcome = if verdict == UnitVerdict::Skipped { Outcome::Skipped } else { Outcome::Passed };
                // A skip's reason comes as its output (see `UnitResult::output`).
                let reason = unit_result.output.as_deref().filter(|_| outcome == Outcome::Skipped);
                let request =
                    crate::verdicts::skips::finalize_request(outcome, per_unit_ms, reason).on_slot(slot_number(slot));
                shared.held.let_go([delivery]);
                match shared.queue.finalize(run, worker, delivery, &request).await? {
                    Ack::Ok => {
                        let end = if outcome == Outcome::Skipped { AttemptEnd::Skipped } else { AttemptEnd::Passed };
                        shared.summary.lock().count(end);
                        shared.observer.attempt_ended(&delivery.unit, end, per_unit, reason);
                    }
                    reply => fenced_off(shared, delivery, "finalize", reply).await,
                }
            }
            UnitVerdict::Failed { reason, detail } => {
                requeue_failed(shared, delivery, reason, &detail, output, per_unit, slot).await?;
            }
        }
    }
    shared.wake.notify_waiters();
    run_alone(shared, batches, alone, slot).await
}

/// Runs each of `deliveries` (units a crashed batch left without result)
/// in an invocation of its own; the worker's beat heartbeats those still
/// waiting, and one it found lost meanwhile is not run (see
/// [`crate::verdicts::solo`]).
async fn run_alone(
    shared: &Shared,
    batches: &BatchSlots,
    deliveries: Vec<Delivery>,
    slot: usize,
) -> Result<(), HopperError> {
    let mut waiting: std::collections::VecDeque<Delivery> = deliveries.into();
    while let Some(delivery) = waiting.pop_front() {
        if shared.stop.is_cancelled() {
            waiting.push_front(delivery);
            hand_back(shared, waiting.make_contiguous(), Duration::ZERO).await;
            return Ok(());
        }
        if shared.held.is_lost(&delivery) {
            shared.held.let_go([&delivery]);
            continue;
        }
        Box::pin(run_batch(shared, batches, vec![delivery], slot)).await?;
    }
    Ok(())
}
