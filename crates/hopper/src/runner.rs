//! The worker: reserves batches of units from a [`UnitQueue`], runs each
//! batch as one invocation in its own process group, heartbeats the
//! deliveries while it runs, and reports each unit's result through the
//! fenced transitions (finalize, requeue, release).
//!
//! A batch is the general case: `batch_size` 1 (the default) runs one unit
//! per invocation. A [`BatchResults`] turns an invocation into one verdict per
//! unit (from the exit code, or from the tool's own report: see
//! [`crate::verdicts`]); a unit it has no verdict for is treated as failed and
//! retried within the budgets.
//!
//! The worker only speaks the [`UnitQueue`] trait, so the same code runs a
//! local parallel runner (memory queue, `slots` local slots) and one worker of
//! a distributed build (Redis).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::queue::MAX_SUMMARY_LEN;
use leasehold_core::{
    Ack, Budgets, Delivery, InitOutcome, LivenessReply, Outcome, RequeueReply, RequeueRequest, RunId, RunSpec, Ttl,
    UnitId, UnitQueue, UnitSpec, WorkerId,
};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::agent::child::AgentCommand;
use crate::errors::HopperError;
use crate::launch::{Invocation, Launcher};
use crate::observer::{AttemptEnd, RunObserver};
use crate::process::{run_process_in, ProcessLimits, ProcessResult, Termination};
use crate::template::CommandTemplate;
use crate::verdicts::{REPORT_ENV, REPORT_PLACEHOLDER};

/// The verdict on one unit of an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitVerdict {
    /// It passed.
    Passed,
    /// It did not run by design (every test of it skipped).
    Skipped,
    /// It failed.
    Failed {
        /// `exit`, `timeout`, `signal`, `spawn` or `no_result`.
        reason: &'static str,
        /// A short description (`exit code 1`, ...).
        detail: String,
    },
}

/// What an invocation says about one of its units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitResult {
    /// The verdict.
    pub verdict: UnitVerdict,
    /// The unit's own duration, when the tool reports it (otherwise the
    /// unit gets an equal share of the invocation's).
    pub duration: Option<Duration>,
    /// The unit's own output (its failure), when the tool reports it
    /// (otherwise the tail of the invocation's output); for a skip, its reason.
    pub output: Option<String>,
}

impl From<UnitVerdict> for UnitResult {
    fn from(verdict: UnitVerdict) -> Self {
        Self { verdict, duration: None, output: None }
    }
}

/// Turns one invocation's result into one verdict per unit. Units missing
/// from the map have no result and are retried.
pub trait BatchResults: Send + Sync {
    /// Where the next invocation's tool writes its report (replacing
    /// `{report}` and set as `HOPPER_REPORT`); `None` when nothing is read.
    fn report_path(&self) -> Option<PathBuf> {
        None
    }

    /// The verdicts for `units`, all run by the invocation that gave
    /// `result` and wrote `report` (the path [`Self::report_path`] gave).
    fn verdicts(
        &self,
        units: &[UnitId],
        result: &ProcessResult,
        limits: &ProcessLimits,
        report: Option<&Path>,
    ) -> HashMap<UnitId, UnitResult>;

    /// The errors outside any test the reports read since the last call
    /// (see [`crate::verdicts::outside`]).
    fn take_outside_errors(&self) -> Vec<crate::verdicts::outside::OutsideError> {
        Vec::new()
    }
}

/// Every unit of the invocation gets the invocation's own verdict: exit 0
/// passes all of them, anything else fails all of them.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExitCodeResults;

/// The verdict an invocation's termination gives on its own.
pub fn termination_verdict(termination: &Termination, limits: &ProcessLimits) -> UnitVerdict {
    match termination {
        Termination::Exited(0) => UnitVerdict::Passed,
        Termination::Exited(code) => UnitVerdict::Failed { reason: "exit", detail: format!("exit code {code}") },
        Termination::Signaled(sig) => {
            UnitVerdict::Failed { reason: "signal", detail: format!("killed by signal {sig}") }
        }
        Termination::TimedOut => UnitVerdict::Failed {
            reason: "timeout",
            detail: match limits.timeout {
                Some(t) => format!("timed out after {:.1}s", t.as_secs_f64()),
                None => "timed out".to_owned(),
            },
        },
        Termination::Stopped => UnitVerdict::Failed { reason: "stopped", detail: "stopped".to_owned() },
        Termination::SpawnFailed(e) => UnitVerdict::Failed { reason: "spawn", detail: format!("could not start: {e}") },
    }
}

impl BatchResults for ExitCodeResults {
    fn verdicts(
        &self,
        units: &[UnitId],
        result: &ProcessResult,
        limits: &ProcessLimits,
        _report: Option<&Path>,
    ) -> HashMap<UnitId, UnitResult> {
        let verdict = termination_verdict(&result.termination, limits);
        units.iter().map(|u| (u.clone(), UnitResult::from(verdict.clone()))).collect()
    }
}

/// Everything a worker needs besides the queue.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The build.
    pub run: RunId,
    /// This worker.
    pub worker: WorkerId,
    /// The command each batch runs.
    pub command: CommandTemplate,
    /// Local slots (invocations running at once).
    pub slots: usize,
    /// Units per invocation.
    pub batch_size: usize,
    /// A delivery idle this long may be reclaimed by another worker.
    pub reclaim_after: Duration,
    /// How often running deliveries are heartbeated (and liveness refreshed).
    pub heartbeat_every: Duration,
    /// Limits of each invocation.
    pub limits: ProcessLimits,
    /// Longest wait between polls when nothing is available.
    pub idle_poll: Duration,
    /// Extra environment for every invocation.
    pub env: Vec<(String, String)>,
    /// How batch results are read.
    pub results: Arc<dyn BatchResults>,
    /// Feed units to a persistent agent per slot instead of running `command`.
    pub agent: Option<Arc<AgentCommand>>,
    /// Start each invocation this way instead of with `command`.
    pub launcher: Option<Arc<dyn Launcher>>,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("run", &self.run)
            .field("worker", &self.worker)
            .field("command", &self.command)
            .field("slots", &self.slots)
            .field("batch_size", &self.batch_size)
            .field("reclaim_after", &self.reclaim_after)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl WorkerConfig {
    /// The reclaim timeout as the queue takes it (the queue counts idle time
    /// in whole milliseconds).
    pub(crate) fn queue_reclaim_after(&self) -> Result<Ttl, HopperError> {
        Ttl::new("reclaim timeout", self.reclaim_after)
            .map_err(|source| HopperError::BadDuration { what: "--timeout", source })
    }

    /// Checks slots, batch size and durations.
    pub fn validate(&self) -> Result<(), HopperError> {
        if self.slots == 0 {
            return Err(HopperError::ZeroSlots);
        }
        if self.batch_size == 0 {
            return Err(HopperError::ZeroBatchSize);
        }
        if self.reclaim_after.is_zero() {
            return Err(HopperError::ZeroDuration { what: "--timeout" });
        }
        // The queue counts idle time in milliseconds: check it as the queue
        // will, before anything is written.
        self.queue_reclaim_after()?;
        if self.limits.timeout.is_some_and(|t| t.is_zero()) {
            return Err(HopperError::ZeroDuration { what: "--unit-timeout" });
        }
        Ok(())
    }
}

/// What a worker did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Whether this worker initialised the run.
    pub leader: bool,
    /// Invocations run.
    pub invocations: u64,
    /// Units finalized as passed by this worker.
    pub passed: u64,
    /// Units finalized as failed by this worker.
    pub failed: u64,
    /// Attempts that failed and were requeued.
    pub retried: u64,
    /// Results dropped because another worker owned the unit (STALE).
    pub stale: u64,
    /// Deliveries handed back on shutdown.
    pub released: u64,
    /// Latest duration of each unit this worker ran (milliseconds).
    pub timings: Vec<(String, u64)>,
}

pub(crate) struct Shared {
    pub(crate) queue: Arc<dyn UnitQueue>,
    pub(crate) config: WorkerConfig,
    pub(crate) observer: Arc<dyn RunObserver>,
    /// Signals (SIGINT/SIGTERM): stop, hand back, exit.
    shutdown: CancellationToken,
    /// Stops the slots (shutdown, or another slot's fatal error).
    pub(crate) stop: CancellationToken,
    /// Wakes idle slots when a local slot requeued or finished a unit.
    pub(crate) wake: Notify,
    pub(crate) running: Mutex<Vec<UnitId>>,
    pub(crate) summary: Mutex<WorkerSummary>,
}

/// One worker of a build.
pub struct Worker {
    shared: Arc<Shared>,
}

impl Worker {
    /// A worker on `queue`. `shutdown` is cancelled on SIGINT/SIGTERM.
    pub fn new(
        queue: Arc<dyn UnitQueue>,
        config: WorkerConfig,
        observer: Arc<dyn RunObserver>,
        shutdown: CancellationToken,
    ) -> Result<Self, HopperError> {
        config.validate()?;
        let stop = shutdown.child_token();
        Ok(Self {
            shared: Arc::new(Shared {
                queue,
                config,
                observer,
                shutdown,
                stop,
                wake: Notify::new(),
                running: Mutex::new(Vec::new()),
                summary: Mutex::new(WorkerSummary::default()),
            }),
        })
    }

    /// Initialises the run with `units` and `budgets`, or joins it when
    /// another worker was first. Returns whether this worker is the leader.
    ///
    /// Initialisation is one atomic step of the queue, so a follower never
    /// sees a half-written run and has nothing to wait for; a follower whose
    /// unit list differs gets [`HopperError::BuildReused`].
    pub async fn join(&self, units: Vec<UnitSpec>, budgets: Budgets, ttl: Duration) -> Result<bool, HopperError> {
        let shared = &self.shared;
        let spec = RunSpec { run: shared.config.run.clone(), units, budgets, ttl };
        spec.validate()?;
        let total = spec.units.len() as u64;
        let outcome = shared.queue.initialize(&spec).await?;
        let leader = match outcome {
            InitOutcome::Initialized => true,
            InitOutcome::AlreadyInitialized { budgets } => {
                tracing::info!(run = %spec.run, ?budgets, "joined a run another worker initialised");
                false
            }
        };
        shared.summary.lock().leader = leader;
        shared.observer.run_started(&spec.run, total, leader);
        Ok(leader)
    }

    /// Runs units until every unit of the run is finalized, or until shutdown.
    /// On shutdown, running units are stopped and released (another worker
    /// takes them at once) and [`HopperError::Interrupted`] is returned.
    pub async fn run(&self) -> Result<WorkerSummary, HopperError> {
        let shared = &self.shared;
        let mut slots = JoinSet::new();
        let mut slot_of = HashMap::new();
        for slot in 0..shared.config.slots {
            let shared = Arc::clone(shared);
            let task = match shared.config.agent.clone() {
                Some(agent) => slots.spawn(crate::agent::slot::slot_loop(shared, slot, agent)),
                None => slots.spawn(async move { slot_loop(shared, slot).await }),
            };
            slot_of.insert(task.id(), slot);
        }
        let ticker = tokio::spawn(liveness_loop(Arc::clone(shared)));
        let mut first_error = None;
        while let Some(joined) = slots.join_next().await {
            let result = match joined {
                Ok(result) => result,
                Err(source) => {
                    Err(HopperError::SlotPanicked { slot: slot_of.get(&source.id()).copied().unwrap_or(0), source })
                }
            };
            if let Err(error) = result {
                // Returned to the caller, which reports it; here it only stops the other slots.
                tracing::debug!(%error, "worker slot failed; stopping the others");
                shared.stop.cancel();
                first_error.get_or_insert(error);
            }
        }
        ticker.abort();
        shared.observer.finished();
        // A signal explains whatever the slots ran into while stopping.
        if shared.shutdown.is_cancelled() {
            return Err(HopperError::Interrupted);
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        Ok(shared.summary.lock().clone())
    }

    /// What the worker did so far.
    pub fn summary(&self) -> WorkerSummary {
        self.shared.summary.lock().clone()
    }
}

async fn liveness_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.config.heartbeat_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let current = shared.running.lock().first().cloned();
        let (run, worker) = (&shared.config.run, &shared.config.worker);
        // Failures here are the queue's outage, announced by the queue; the
        // slots find out whether the run is gone.
        match shared.queue.liveness(run, worker, current.as_ref()).await {
            Ok(LivenessReply::Ok) => {}
            Ok(LivenessReply::Corrupt) => tracing::debug!(%run, "liveness: the run is gone"),
            Err(error) => tracing::debug!(%error, "liveness update failed"),
        }
        if let Ok(Some(progress)) = shared.queue.progress(run).await {
            shared.observer.progress(&progress);
        }
    }
}

async fn slot_loop(shared: Arc<Shared>, slot: usize) -> Result<(), HopperError> {
    let config = &shared.config;
    let (run, worker) = (&config.run, &config.worker);
    let min_wait = Duration::from_millis(2);
    let mut wait = min_wait;
    let batch_size = NonZeroUsize::new(config.batch_size).ok_or(HopperError::ZeroBatchSize)?;
    let reclaim_after = config.queue_reclaim_after()?;
    loop {
        if shared.stop.is_cancelled() {
            return Ok(());
        }
        let batch = shared.queue.reserve_batch(run, worker, batch_size, reclaim_after).await?;
        for unit in &batch.exhausted {
            shared.observer.attempt_ended(
                unit,
                AttemptEnd::ReclaimExhausted,
                Duration::ZERO,
                Some("reclaim budget exhausted"),
            );
            shared.wake.notify_waiters();
        }
        if !batch.deliveries.is_empty() {
            wait = min_wait;
            run_batch(&shared, batch.deliveries).await?;
            continue;
        }
        if batch.corrupt {
            // The worker joined the run, so its state existed: it was lost since.
            return Err(HopperError::StateLost { run: run.clone() });
        }
        if !batch.exhausted.is_empty() {
            continue;
        }
        match shared.queue.progress(run).await? {
            None => return Err(HopperError::StateLost { run: run.clone() }),
            Some(p) if p.is_complete() => {
                tracing::debug!(slot, "every unit is finalized");
                shared.wake.notify_waiters();
                return Ok(());
            }
            Some(_) => {}
        }
        // Units are in flight elsewhere: they may come back (requeue or reclaim).
        tokio::select! {
            _ = shared.stop.cancelled() => return Ok(()),
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(config.idle_poll);
    }
}

async fn run_batch(shared: &Shared, deliveries: Vec<Delivery>) -> Result<(), HopperError> {
    let config = &shared.config;
    let (run, worker) = (&config.run, &config.worker);
    let units: Vec<UnitId> = deliveries.iter().map(|d| d.unit.clone()).collect();
    let report = config.results.report_path();
    let invocation = match &config.launcher {
        Some(launcher) => launcher.invocation(&units),
        None => Invocation { argv: config.command.render(&units), ..Invocation::default() },
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
    if let [single] = deliveries.as_slice() {
        env.push(("HOPPER_UNIT".into(), single.unit.to_string()));
        env.push(("HOPPER_ATTEMPT".into(), (single.retry_index + 1).to_string()));
    }
    shared.running.lock().extend(units.iter().cloned());
    let started = Instant::now();

    // `lost[i]`: the queue no longer lets us report delivery i.
    let mut lost = vec![false; deliveries.len()];
    let stop_unit = shared.stop.child_token();
    let process = run_process_in(invocation.cwd.as_deref(), &argv, &env, config.limits, &stop_unit);
    tokio::pin!(process);
    let mut beat = tokio::time::interval_at(started + config.heartbeat_every, config.heartbeat_every);
    beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let result = loop {
        tokio::select! {
            result = &mut process => break result,
            _ = beat.tick() => {
                // The deliveries still ours, heartbeated in one call.
                let (held_at, held): (Vec<usize>, Vec<Delivery>) = deliveries
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !lost[*i])
                    .map(|(i, d)| (i, d.clone()))
                    .unzip();
                match shared.queue.heartbeat_batch(run, worker, &held).await {
                    Ok(replies) => {
                        for ((i, delivery), reply) in held_at.into_iter().zip(&held).zip(replies) {
                            if reply != Ack::Ok {
                                lost[i] = true;
                                fenced_off(shared, delivery, "heartbeat", reply).await;
                            }
                        }
                    }
                    // The queue announces the outage; the next beat tries again.
                    Err(error) => tracing::debug!(units = held.len(), %error, "heartbeat failed; will try again"),
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
    shared.summary.lock().invocations += 1;

    if shared.stop.is_cancelled() && result.termination == Termination::Stopped {
        let owned: Vec<Delivery> =
            deliveries.iter().zip(&lost).filter(|(_, lost)| !**lost).map(|(d, _)| d.clone()).collect();
        hand_back(shared, &owned, result.duration).await;
        return Ok(());
    }

    let verdicts = config.results.verdicts(&units, &result, &config.limits, report.as_deref());
    let outside = config.results.take_outside_errors();
    crate::verdicts::outside::record(&*shared.queue, run, worker, &outside).await?;
    let share = result.duration / deliveries.len().max(1) as u32;
    let output = result.output.text(MAX_SUMMARY_LEN / 2);
    let mut alone = Vec::new();
    let rerun_alone = crate::verdicts::solo::rerun_alone(&units, &verdicts);
    for (i, delivery) in deliveries.iter().enumerate() {
        if lost[i] {
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
                let request = crate::verdicts::skips::finalize_request(outcome, per_unit_ms, reason);
                match shared.queue.finalize(run, worker, delivery, &request).await? {
                    Ack::Ok => {
                        shared.summary.lock().passed += 1;
                        shared.observer.attempt_ended(&delivery.unit, AttemptEnd::Passed, per_unit, None);
                    }
                    reply => fenced_off(shared, delivery, "finalize", reply).await,
                }
            }
            UnitVerdict::Failed { reason, detail } => {
                requeue_failed(shared, delivery, reason, &detail, output, per_unit).await?;
            }
        }
    }
    shared.wake.notify_waiters();
    run_alone(shared, alone).await
}

/// Runs each of `deliveries` (units a crashed batch left without result)
/// in an invocation of its own, heartbeating those still waiting (see
/// [`crate::verdicts::solo`]).
async fn run_alone(shared: &Shared, deliveries: Vec<Delivery>) -> Result<(), HopperError> {
    let (run, worker) = (&shared.config.run, &shared.config.worker);
    let mut waiting: std::collections::VecDeque<Delivery> = deliveries.into();
    while let Some(delivery) = waiting.pop_front() {
        if shared.stop.is_cancelled() {
            waiting.push_front(delivery);
            hand_back(shared, waiting.make_contiguous(), Duration::ZERO).await;
            return Ok(());
        }
        let rest: Vec<Delivery> = waiting.iter().cloned().collect();
        let beat_rest = async {
            let mut beat = tokio::time::interval(shared.config.heartbeat_every);
            beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                beat.tick().await;
                if rest.is_empty() {
                    continue;
                }
                if let Err(error) = shared.queue.heartbeat_batch(run, worker, &rest).await {
                    tracing::debug!(units = rest.len(), %error, "heartbeat failed; will try again");
                }
            }
        };
        tokio::select! {
            done = Box::pin(run_batch(shared, vec![delivery])) => done?,
            () = beat_rest => {}
        }
    }
    Ok(())
}

/// Requeues a failed attempt (within the budgets; over them the queue
/// finalizes it as failed) and accounts for the queue's answer.
pub(crate) async fn requeue_failed(
    shared: &Shared,
    delivery: &Delivery,
    reason: &str,
    detail: &str,
    output: &str,
    duration: Duration,
) -> Result<(), HopperError> {
    let (run, worker) = (&shared.config.run, &shared.config.worker);
    let request = RequeueRequest {
        duration_ms: millis(duration),
        failure_summary: Some(detail.to_owned()),
        errors: Some(serde_json::json!({
            "reason": reason,
            "detail": detail,
            "attempt": delivery.retry_index + 1,
            "worker": worker.as_str(),
            "output": output,
        })),
    };
    match shared.queue.requeue(run, worker, delivery, &request).await? {
        RequeueReply::Requeued { retry_index } => {
            shared.summary.lock().retried += 1;
            let note = format!("{detail}; retry {retry_index}");
            shared.observer.attempt_ended(&delivery.unit, AttemptEnd::Retrying, duration, Some(&note));
        }
        RequeueReply::Finalized { .. } => {
            shared.summary.lock().failed += 1;
            shared.observer.attempt_ended(&delivery.unit, AttemptEnd::Failed, duration, Some(detail));
        }
        RequeueReply::Stale => fenced_off(shared, delivery, "requeue", Ack::Stale).await,
        RequeueReply::Corrupt => fenced_off(shared, delivery, "requeue", Ack::Corrupt).await,
    }
    Ok(())
}

/// Hands deliveries this worker stopped (or never started) back to the
/// queue at once, spending no budget, so another worker picks them up now
/// rather than after the reclaim timeout.
pub(crate) async fn hand_back(shared: &Shared, deliveries: &[Delivery], ran: Duration) {
    if deliveries.is_empty() {
        return;
    }
    let (run, worker) = (&shared.config.run, &shared.config.worker);
    match shared.queue.release_batch(run, worker, deliveries).await {
        Ok(replies) => {
            for (delivery, reply) in deliveries.iter().zip(replies) {
                match reply {
                    Ack::Ok => {
                        shared.summary.lock().released += 1;
                        shared.observer.attempt_ended(
                            &delivery.unit,
                            AttemptEnd::Released,
                            ran,
                            Some("stopped; handed back to the queue"),
                        );
                    }
                    reply => fenced_off(shared, delivery, "release", reply).await,
                }
            }
        }
        Err(error) => {
            let units: Vec<UnitId> = deliveries.iter().map(|d| d.unit.clone()).collect();
            shared.observer.warn(&format!(
                "could not hand back {} ({}); another worker takes over after --timeout",
                crate::errors::name_units(&units),
                crate::errors::chain_message(&error)
            ));
        }
    }
}

/// A transition was refused: drop the result, log it, go on.
pub(crate) async fn fenced_off(shared: &Shared, delivery: &Delivery, transition: &str, reply: Ack) {
    let (run, worker) = (&shared.config.run, &shared.config.worker);
    match reply {
        Ack::Stale => {
            shared.summary.lock().stale += 1;
            // The observer shows it; the log need not say it again.
            tracing::debug!(unit = %delivery.unit, transition, "STALE: another worker owns this unit now; result dropped");
            shared.observer.attempt_ended(
                &delivery.unit,
                AttemptEnd::Stale,
                Duration::ZERO,
                Some(&format!("{transition} refused: another worker owns it now; result dropped")),
            );
            if let Err(error) = shared.queue.record_stale_rejected(run, worker, delivery, transition).await {
                tracing::warn!(%error, "could not record the stale result");
            }
        }
        Ack::Corrupt => {
            shared
                .observer
                .warn(&format!("{transition} of {}: the queue no longer holds the build's state", delivery.unit));
        }
        Ack::Ok => {}
    }
}

pub(crate) use leasehold_core::duration::millis;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_verdicts() {
        let limits = ProcessLimits { timeout: Some(Duration::from_secs(2)), ..ProcessLimits::default() };
        assert_eq!(termination_verdict(&Termination::Exited(0), &limits), UnitVerdict::Passed);
        assert!(matches!(
            termination_verdict(&Termination::TimedOut, &limits),
            UnitVerdict::Failed { reason: "timeout", .. }
        ));
        assert!(matches!(
            termination_verdict(&Termination::Exited(2), &limits),
            UnitVerdict::Failed { reason: "exit", ref detail } if detail == "exit code 2"
        ));
    }
}
