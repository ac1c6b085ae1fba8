//! The worker: its slots reserve units from a [`UnitQueue`], run them, and
//! report each unit's result through the fenced transitions, while one
//! liveness loop tells the queue the worker is alive and heartbeats what
//! every slot holds, in one call per beat.
//!
//! A slot runs batches ([`batch_slot`]: one process per batch) or feeds a
//! persistent agent ([`agent_slot`]), as [`WorkerConfig::invocations`] says;
//! what both do with the queue is written once, in [`transitions`].
//!
//! The worker only speaks the [`UnitQueue`] trait, so the same code runs a
//! local parallel runner (memory queue, `slots` local slots) and one worker of
//! a distributed build (Redis).

mod agent_slot;
mod batch_slot;
pub mod config;
mod held;
pub mod launch;
pub mod observer;
pub mod shared_runs;
mod transitions;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Budgets, InitOutcome, LivenessReply, RunSpec, UnitQueue, UnitSpec};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::errors::HopperError;
use crate::worker::observer::RunObserver;
use transitions::Shared;

pub use config::{BatchSlots, BatchStart, Invocations, WorkerConfig};
pub use transitions::WorkerSummary;

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
                halt: CancellationToken::new(),
                queued_hint: std::sync::atomic::AtomicU64::new(u64::MAX),
                hint_read_at: Mutex::new(std::time::Instant::now()),
                fleet_workers: std::sync::atomic::AtomicU64::new(1),
                grouped: std::sync::OnceLock::new(),
                summary: Mutex::new(WorkerSummary::default()),
                log_watch: tokio::sync::Mutex::new(None),
                held: held::HeldBoard::default(),
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
        let grouped = spec.units.iter().filter(|u| u.group.is_some()).map(|u| u.id.clone()).collect();
        let _ = shared.grouped.set(grouped);
        let outcome = shared.queue.initialize(&spec).await?;
        let leader = match outcome {
            InitOutcome::Initialized => true,
            InitOutcome::AlreadyInitialized { budgets } => {
                tracing::info!(run = %spec.run, ?budgets, "joined a run another worker initialised");
                false
            }
        };
        shared.summary.lock().leader = leader;
        shared.saw_queued(total);
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
            let task = match shared.config.invocations.clone() {
                Invocations::Agents(agent) => slots.spawn(agent_slot::slot_loop(shared, slot, agent)),
                Invocations::Batches(batches) => slots.spawn(batch_slot::slot_loop(shared, slot, batches)),
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
        // A retry this worker failed may then go back to a worker still
        // running without waiting for this one to look dead. Best effort: a
        // worker that cannot say so is simply not live after the timeout.
        let (run, worker) = (&shared.config.run, &shared.config.worker);
        if let Err(error) = shared.queue.leave(run, worker).await {
            tracing::debug!(%error, "could not tell the queue this worker left");
        }
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
        // Every slot's deliveries in one call.
        shared.held.beat(&shared).await;
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
            // A slot busy with one long unit reserves nothing, so it learns
            // of a stop here.
            if progress.stopped {
                shared.halt();
            }
            shared.saw_queued(progress.queued);
            shared.observer.progress(&progress);
        }
        shared.count_fleet().await;
    }
}
