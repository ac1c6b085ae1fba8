//! What both slot kinds do with the queue, written once: reserve (onto the
//! worker's [`HeldBoard`], which one beat heartbeats), wait while units are
//! in flight elsewhere, requeue a failed attempt, hand back what they stop,
//! and account for a transition the queue refused (fenced off). The slots
//! differ only in how they run what they reserved.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::{Ack, Delivery, EventId, RequeueReply, RequeueRequest, UnitId, UnitQueue, WorkerRecord};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::errors::HopperError;
use crate::worker::config::WorkerConfig;
use crate::worker::held::HeldBoard;
use crate::worker::observer::{AttemptEnd, RunObserver};

pub(crate) use leasehold_core::duration::millis;

/// The first wait of an idle slot; it doubles up to `idle_poll`.
pub(super) const MIN_WAIT: Duration = Duration::from_millis(2);

/// What a worker did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Whether this worker initialised the run.
    pub leader: bool,
    /// Invocations run.
    pub invocations: u64,
    /// Units finalized as passed by this worker.
    pub passed: u64,
    /// Units finalized as skipped (expected failures included) by this worker.
    pub skipped: u64,
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

impl WorkerSummary {
    /// Counts a unit this worker finalized as passed or skipped.
    pub(super) fn count(&mut self, end: AttemptEnd) {
        if end == AttemptEnd::Skipped {
            self.skipped += 1;
        } else {
            self.passed += 1;
        }
    }
}

/// What the worker's slots share.
pub(super) struct Shared {
    pub(super) queue: Arc<dyn UnitQueue>,
    pub(super) config: WorkerConfig,
    pub(super) observer: Arc<dyn RunObserver>,
    /// Signals (SIGINT/SIGTERM): stop, hand back, exit.
    pub(super) shutdown: CancellationToken,
    /// Stops the slots (shutdown, or another slot's fatal error).
    pub(super) stop: CancellationToken,
    /// Wakes idle slots when a local slot requeued or finished a unit.
    pub(super) wake: Notify,
    pub(super) running: Mutex<Vec<UnitId>>,
    /// Cancelled when the build reached its failure limit (a reserve replied
    /// `STOPPED`, or the progress says so): nothing more will be handed out,
    /// so slots hand back what they have not started and end once their
    /// running units are done, or at once with
    /// [`WorkerConfig::stop_running_on_halt`](crate::worker::WorkerConfig::stop_running_on_halt).
    pub(super) halt: CancellationToken,
    /// About how many units wait in the queue: the last progress read, less
    /// what this worker reserved since (other workers' reservations make it
    /// an over-estimate). Slots reserve less ahead as it falls, so that near
    /// the end no slot holds units another could already run.
    pub(super) queued_hint: AtomicU64,
    /// When the hint was last read from the queue.
    pub(super) hint_read_at: Mutex<Instant>,
    /// Live workers of the build at the last read (this one included): the
    /// queue's units are shared with their slots too.
    pub(super) fleet_workers: AtomicU64,
    /// The units of the build that are in a group (`--group`), set at join.
    pub(super) grouped: std::sync::OnceLock<std::collections::HashSet<UnitId>>,
    pub(super) summary: Mutex<WorkerSummary>,
    /// The newest event of the build's log this worker has heard of, held
    /// by the one idle slot that waits on the log for the others (see
    /// [`idle`]).
    pub(super) log_watch: tokio::sync::Mutex<Option<EventId>>,
    /// Every delivery the slots hold, heartbeated in one call per beat.
    pub(super) held: HeldBoard,
}

impl Shared {
    /// The build reached its failure limit: says so once, and stops the slots
    /// taking more (and, with `stop_running_on_halt`, running more).
    pub(super) fn halt(&self) {
        if !self.halt.is_cancelled() {
            tracing::info!("the build reached its failure limit (--max-failures): no more units for this worker");
            self.halt.cancel();
            self.wake.notify_waiters();
        }
    }

    /// Records a progress read: how many units wait in the queue.
    pub(super) fn saw_queued(&self, queued: u64) {
        self.queued_hint.store(queued, Ordering::Relaxed);
        *self.hint_read_at.lock() = Instant::now();
    }

    /// Reads the queue's progress again when the hint is older than
    /// [`HINT_FRESHNESS`]: other workers drain the queue too, and a stale
    /// hint lets a slot reserve the slow tail of a build all at once. At most
    /// a couple of reads a second per worker, whatever its slots.
    async fn refresh_hint(&self) {
        if self.hint_read_at.lock().elapsed() < HINT_FRESHNESS {
            return;
        }
        *self.hint_read_at.lock() = Instant::now();
        if let Ok(Some(progress)) = self.queue.progress(&self.config.run).await {
            self.saw_queued(progress.queued);
        }
        self.count_fleet().await;
    }

    /// Reads how many workers of the build are live (see [`live_workers`]).
    pub(super) async fn count_fleet(&self) {
        if let Ok(records) = self.queue.workers(&self.config.run).await {
            let window = u64::try_from(self.config.reclaim_after.as_millis()).unwrap_or(u64::MAX);
            self.fleet_workers.store(live_workers(&records, window), Ordering::Relaxed);
        }
    }

    /// How many units one slot should reserve ahead at most now: about half
    /// its share of what waits, so that the queue's last units spread over
    /// every slot of the fleet (taking the other live workers to have as many
    /// slots as this one; never fewer than one).
    pub(super) fn share_per_slot(&self) -> usize {
        let share = self.queued_hint.load(Ordering::Relaxed).div_ceil(2 * self.fleet_slots());
        usize::try_from(share).unwrap_or(usize::MAX).max(1)
    }

    /// Whether the build is near its end: no more than [`END_PER_SLOT`]
    /// units wait for each slot of the fleet. From here a slot reserves one
    /// unit at a time, when it has nothing else, so that no unit waits
    /// behind a running one while another slot is idle. It costs a queue
    /// round trip per unit for only the build's last few units.
    pub(super) fn near_end(&self) -> bool {
        self.queued_hint.load(Ordering::Relaxed) <= self.fleet_slots().saturating_mul(END_PER_SLOT)
    }

    /// The fleet's slots, taking the other live workers to have as many as
    /// this one.
    fn fleet_slots(&self) -> u64 {
        let fleet = self.fleet_workers.load(Ordering::Relaxed).max(1);
        (self.config.slots.max(1) as u64).saturating_mul(fleet)
    }

    /// Whether `unit` is in a group (`--group`).
    pub(super) fn in_group(&self, unit: &UnitId) -> bool {
        self.grouped.get().is_some_and(|grouped| grouped.contains(unit))
    }

    /// Whether running units are stopped now: the build halted and the worker
    /// was told to stop them (`--max-failures-kill`).
    pub(super) fn kills_running(&self) -> bool {
        self.config.stop_running_on_halt && self.halt.is_cancelled()
    }
}

/// The live workers among `records` (at least 1, the caller): not left, and
/// seen within `window_ms` of the newest record (the store's clock, so a
/// skewed local clock does not matter).
fn live_workers(records: &[WorkerRecord], window_ms: u64) -> u64 {
    let newest = records.iter().map(|r| r.last_seen_ms).max().unwrap_or(0);
    (records.iter().filter(|r| r.is_live(newest, window_ms)).count() as u64).max(1)
}

/// Units waiting per slot of the fleet below which the build is near its
/// end (see [`Shared::near_end`]).
const END_PER_SLOT: u64 = 8;

/// How old the queued hint may be when a slot reserves.
const HINT_FRESHNESS: Duration = Duration::from_millis(500);

/// What one reservation gave.
pub(super) struct Reserved {
    /// The units now this slot's to run.
    pub(super) deliveries: Vec<Delivery>,
    /// Whether the queue moved at all (units given, or units whose reclaim
    /// budget ran out finalized): worth asking again at once.
    pub(super) moved: bool,
}

/// Reserves up to `want` units, reporting the ones whose reclaim budget ran
/// out. A run whose state is gone is an error: the worker joined it, so it
/// existed.
pub(super) async fn reserve(shared: &Shared, want: NonZeroUsize) -> Result<Reserved, HopperError> {
    let config = &shared.config;
    let reclaim_after = config.queue_reclaim_after()?;
    shared.refresh_hint().await;
    let batch = shared.queue.reserve_batch(&config.run, &config.worker, want, reclaim_after).await?;
    shared.held.hold(&batch.deliveries);
    let taken = batch.deliveries.len() as u64;
    let _ = shared.queued_hint.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(q.saturating_sub(taken)));
    for unit in &batch.exhausted {
        shared.observer.attempt_ended(
            unit,
            AttemptEnd::ReclaimExhausted,
            Duration::ZERO,
            Some("reclaim budget exhausted"),
        );
        shared.wake.notify_waiters();
    }
    if batch.stopped {
        shared.halt();
    }
    if batch.corrupt && batch.deliveries.is_empty() {
        return Err(HopperError::StateLost { run: config.run.clone() });
    }
    let moved = !batch.deliveries.is_empty() || !batch.exhausted.is_empty();
    Ok(Reserved { deliveries: batch.deliveries, moved })
}

/// What an idle slot found.
pub(super) enum Idle {
    /// Every unit of the run is finalized, or the run stopped at its failure
    /// limit: the slot is done.
    Complete,
    /// The worker is stopping.
    Stopped,
    /// Woken or waited: look again.
    Again,
}

/// Units are in flight elsewhere (they may come back by requeue or reclaim):
/// unless the run is complete, waits for a local slot's wake-up or for
/// `wait`, which doubles up to `idle_poll` each time.
pub(super) async fn idle(shared: &Shared, wait: &mut Duration) -> Result<Idle, HopperError> {
    let run = &shared.config.run;
    let progress = shared.queue.progress(run).await?;
    if let Some(p) = &progress {
        shared.saw_queued(p.queued);
    }
    match progress {
        None => return Err(HopperError::StateLost { run: run.clone() }),
        // Stopped at the failure limit: nothing more will come to this slot.
        Some(p) if p.is_complete() || p.stopped => {
            shared.wake.notify_waiters();
            return Ok(Idle::Complete);
        }
        Some(_) => {}
    }
    let idle = tokio::select! {
        _ = shared.stop.cancelled() => Idle::Stopped,
        _ = shared.wake.notified() => Idle::Again,
        () = wait_for_change(shared, *wait) => Idle::Again,
    };
    *wait = (*wait * 2).min(shared.config.idle_poll);
    Ok(idle)
}

/// Waits at most `wait` for a change to the build: one idle slot of the
/// worker waits on the build's event log (a finalize, a requeue or a
/// delivery anywhere in the fleet appends to it) and wakes the others, so
/// that the build's end or a retry is seen at once, not at the next poll;
/// the other slots sleep until it wakes them. A failed wait sleeps its
/// time out.
async fn wait_for_change(shared: &Shared, wait: Duration) {
    let Ok(mut seen) = shared.log_watch.try_lock() else {
        tokio::time::sleep(wait).await;
        return;
    };
    let started = tokio::time::Instant::now();
    match shared.queue.wait_for_events(&shared.config.run, *seen, wait).await {
        Ok(newest) if newest > *seen => {
            *seen = newest;
            drop(seen);
            shared.wake.notify_waiters();
        }
        Ok(_) => {}
        Err(error) => {
            tracing::debug!(%error, "could not wait on the build's event log; sleeping instead");
            tokio::time::sleep_until(started + wait).await;
        }
    }
}

/// A slot's index as the queue's events keep it (a worker has far fewer
/// than `u32::MAX` slots).
pub(super) fn slot_number(slot: usize) -> u32 {
    u32::try_from(slot).unwrap_or(u32::MAX)
}

/// Requeues a failed attempt (within the budgets; over them the queue
/// finalizes it as failed) and accounts for the queue's answer.
pub(super) async fn requeue_failed(
    shared: &Shared,
    delivery: &Delivery,
    reason: &str,
    detail: &str,
    output: &str,
    duration: Duration,
    slot: usize,
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
        retry_elsewhere: !shared.config.retry_same_worker,
        slot: Some(slot_number(slot)),
    };
    shared.held.let_go([delivery]);
    match shared.queue.requeue(run, worker, delivery, &request).await? {
        RequeueReply::Requeued { retry_index } => {
            shared.summary.lock().retried += 1;
            let note = format!("{detail}; retry {retry_index}");
            shared.observer.attempt_ended(&delivery.unit, AttemptEnd::Retrying, duration, Some(&note));
        }
        RequeueReply::Finalized { .. } => {
            shared.summary.lock().failed += 1;
            shared.observer.attempt_ended(&delivery.unit, AttemptEnd::Failed, duration, Some(detail));
            // This failure may have reached the build's limit: learn it now,
            // not at the next reserve, which a slot with units reserved ahead
            // may not make for a while (a read only when a unit fails for good).
            if let Ok(Some(progress)) = shared.queue.progress(run).await {
                if progress.stopped {
                    shared.halt();
                }
            }
        }
        RequeueReply::Stale => fenced_off(shared, delivery, "requeue", Ack::Stale).await,
        RequeueReply::Corrupt => fenced_off(shared, delivery, "requeue", Ack::Corrupt).await,
    }
    Ok(())
}

/// Hands deliveries this worker stopped (or never started) back to the
/// queue at once, spending no budget, so another worker picks them up now
/// rather than after the reclaim timeout.
pub(super) async fn hand_back(shared: &Shared, deliveries: &[Delivery], ran: Duration) {
    if deliveries.is_empty() {
        return;
    }
    shared.held.let_go(deliveries);
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
pub(super) async fn fenced_off(shared: &Shared, delivery: &Delivery, transition: &str, reply: Ack) {
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
