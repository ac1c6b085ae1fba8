//! What a worker is told: the build, its pace (slots, heartbeats, limits),
//! and how its slots start an invocation ([`Invocations`]), chosen once when
//! the config is built.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{RunId, Ttl, WorkerId};

use crate::agent::child::AgentCommand;
use crate::errors::HopperError;
use crate::exec::process::ProcessLimits;
use crate::exec::template::CommandTemplate;
use crate::verdicts::model::BatchResults;
use crate::worker::launch::Launcher;
use crate::worker::shared_runs::{SharedRunMemo, SharedRuns};

/// Everything a worker needs besides the queue.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The build.
    pub run: RunId,
    /// This worker.
    pub worker: WorkerId,
    /// Local slots (invocations running at once).
    pub slots: usize,
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
    /// How each slot starts an invocation.
    pub invocations: Invocations,
    /// When the build stops at its failure limit, stop the units running
    /// here too and hand them back (they are reported as not run), instead
    /// of letting them finish (`--max-failures-kill`).
    pub stop_running_on_halt: bool,
    /// Let a failed unit's retry come back to this worker even while another
    /// worker could take it (`--retry-same-worker`). By default a retry goes
    /// to another live worker, so a failure caused by one machine is told
    /// apart from a failing test.
    pub retry_same_worker: bool,
}

/// How a worker's slots start invocations: batches, each one process, or one
/// persistent agent per slot.
#[derive(Clone)]
pub enum Invocations {
    /// Each slot runs batches of units, one process per batch.
    Batches(BatchSlots),
    /// Each slot feeds its units, one at a time, to a persistent agent.
    Agents(Arc<AgentCommand>),
}

/// How a batch slot runs its batches.
#[derive(Clone)]
pub struct BatchSlots {
    /// Units per invocation.
    pub size: NonZeroUsize,
    /// How the batch's process is started.
    pub start: BatchStart,
    /// How each unit's result is read from the invocation.
    pub results: Arc<dyn BatchResults>,
    /// Units run together once per worker instead of one by one (cargo's
    /// doctests), for batches of one.
    pub shared: Option<Arc<SharedRunMemo>>,
}

/// How a batch's process is started.
#[derive(Clone)]
pub enum BatchStart {
    /// The `{unit}` command template.
    Template(CommandTemplate),
    /// A launcher that knows how to start the units itself.
    Launcher(Arc<dyn Launcher>),
}

impl Invocations {
    /// Units per invocation (an agent runs one at a time).
    pub fn batch_size(&self) -> usize {
        match self {
            Invocations::Batches(batches) => batches.size.get(),
            Invocations::Agents(_) => 1,
        }
    }
}

impl BatchSlots {
    /// Batches of `size` units run by `command`, results read by `results`.
    pub fn template(
        size: usize,
        command: CommandTemplate,
        results: Arc<dyn BatchResults>,
    ) -> Result<Self, HopperError> {
        let size = NonZeroUsize::new(size).ok_or(HopperError::ZeroBatchSize)?;
        Ok(Self { size, start: BatchStart::Template(command), results, shared: None })
    }

    /// Batches of up to `size` units, each started by `launcher`, judged by
    /// `results`.
    pub fn launched(
        size: usize,
        launcher: Arc<dyn Launcher>,
        results: Arc<dyn BatchResults>,
    ) -> Result<Self, HopperError> {
        let size = NonZeroUsize::new(size).ok_or(HopperError::ZeroBatchSize)?;
        Ok(Self { size, start: BatchStart::Launcher(launcher), results, shared: None })
    }

    /// One unit per process, started by `launcher`, judged by `results`
    /// (as nextest runs its tests).
    pub fn one_per_process(launcher: Arc<dyn Launcher>, results: Arc<dyn BatchResults>) -> Self {
        Self { size: NonZeroUsize::MIN, start: BatchStart::Launcher(launcher), results, shared: None }
    }

    /// The same, with the units `runs` names run together once per worker
    /// (see [`crate::worker::shared_runs`]).
    pub fn sharing(self, runs: Arc<dyn SharedRuns>) -> Self {
        Self { shared: Some(Arc::new(SharedRunMemo::new(runs))), ..self }
    }
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let invocations = match &self.invocations {
            Invocations::Batches(BatchSlots { size, start: BatchStart::Template(command), .. }) => {
                format!("batches of {size}: {command:?}")
            }
            Invocations::Batches(BatchSlots { size, .. }) => format!("batches of {size}: launcher"),
            Invocations::Agents(agent) => format!("agents: {:?}", agent.argv),
        };
        f.debug_struct("WorkerConfig")
            .field("run", &self.run)
            .field("worker", &self.worker)
            .field("slots", &self.slots)
            .field("invocations", &invocations)
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
        queue_reclaim_after(self.reclaim_after)
    }

    /// Checks slots, batch size and durations.
    pub fn validate(&self) -> Result<(), HopperError> {
        validate_pace(self.slots, self.invocations.batch_size(), self.reclaim_after, &self.limits)
    }
}

fn queue_reclaim_after(reclaim_after: Duration) -> Result<Ttl, HopperError> {
    Ttl::new("reclaim timeout", reclaim_after).map_err(|source| HopperError::BadDuration { what: "--timeout", source })
}

/// Checks a worker's slots, batch size and durations as
/// [`WorkerConfig::validate`] will, for callers that check them before slow
/// work (discovery) builds the rest.
pub fn validate_pace(
    slots: usize,
    batch_size: usize,
    reclaim_after: Duration,
    limits: &ProcessLimits,
) -> Result<(), HopperError> {
    if slots == 0 {
        return Err(HopperError::ZeroSlots);
    }
    if batch_size == 0 {
        return Err(HopperError::ZeroBatchSize);
    }
    if reclaim_after.is_zero() {
        return Err(HopperError::ZeroDuration { what: "--timeout" });
    }
    // The queue counts idle time in milliseconds: check it as the queue
    // will, before anything is written.
    queue_reclaim_after(reclaim_after)?;
    if limits.timeout.is_some_and(|t| t.is_zero()) {
        return Err(HopperError::ZeroDuration { what: "--unit-timeout" });
    }
    Ok(())
}
