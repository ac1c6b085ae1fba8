//! The delivery loop each worker runs.
//!
//! Every `poll` it reads the open batches from SQL and, for each, makes
//! sure the batch's run exists in the unit queue (one unit per delivery,
//! `max_requeues` = `WEBHOOK_RETRIES`), then reserves what it has room
//! for. Each reserved delivery is one task: it reads the delivery's row,
//! POSTs it while heartbeating the queue, records the outcome in SQL, then
//! finalizes the unit, or, after a failure, waits out the backoff (still
//! heartbeating) and requeues it. A requeue the budget refuses ends the
//! delivery as failed and pauses its webhook.
//!
//! A worker that dies holding a delivery stops heartbeating; after
//! `WEBHOOK_RECLAIM_AFTER` another worker's `reserve` takes it over (the
//! queue's reclaim), so no delivery is lost. SQL is written before the
//! queue is told, so a delivery recorded as delivered is never POSTed
//! again, and a run lost with an in-memory queue (a restart of `serve`) is
//! made again from the rows.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::duration::jitter;
use leasehold_core::{
    Ack, Budgets, Delivery, FinalizeReason, FinalizeRequest, IdError, Outcome, QueueError, RequeueReply,
    RequeueRequest, RunId, RunSpec, UnitId, UnitQueue, UnitSpec, WorkerId,
};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use super::recorder::{RecordError, Recorder};
use super::sender::Sender;
use super::settings::WebhookSettings;
use crate::errors::error_chain;
use crate::storage::{AttemptOutcome, DeliveryState, Storage, StorageError};

/// Deliveries one worker holds at once (posting or waiting to retry).
const MAX_IN_HAND: usize = 256;
/// Deliveries reserved from one batch per look.
const RESERVE_AT_ONCE: usize = 64;
/// Open batches looked at per poll, oldest first.
const OPEN_BATCHES: u32 = 100;
/// Reclaims of one delivery (its workers died) before it fails.
const MAX_RECLAIMS: u32 = 3;
/// A batch's run is dropped from the queue after this long without a transition.
const RUN_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often delivered deliveries past their retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The longest failure summary handed to the queue.
const MAX_SUMMARY: usize = 4096;

/// Why a step of the loop failed (it is retried at the next poll).
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The database failed.
    #[error("webhook deliveries: the database failed")]
    Storage(#[from] StorageError),
    /// The unit queue failed.
    #[error("webhook deliveries: the unit queue failed")]
    Queue(#[from] QueueError),
    /// An attempt's outcome could not be stored.
    #[error("webhook deliveries: an attempt's outcome was not stored")]
    Record(#[from] RecordError),
    /// A stored batch or delivery id is not a valid run or unit id.
    #[error("webhook deliveries: a stored id is not a valid queue id")]
    Id(#[from] IdError),
}

#[derive(Clone)]
struct Ctx {
    storage: Storage,
    queue: Arc<dyn UnitQueue>,
    worker: WorkerId,
    settings: Arc<WebhookSettings>,
    sender: Sender,
    recorder: Recorder,
    posting: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

/// The running loop. [`DispatcherHandle::shutdown`] hands back what it
/// holds; dropping the handle stops it at once, as a crash would (its
/// deliveries are reclaimed by other workers).
#[derive(Debug)]
pub struct DispatcherHandle {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    grace: Duration,
}

impl DispatcherHandle {
    /// Stops reserving, lets running POSTs end (up to `WEBHOOK_TIMEOUT`) and
    /// releases the deliveries waiting to retry, so another worker takes
    /// them at once.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(self.grace, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

impl Drop for DispatcherHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Starts worker `worker`'s delivery loop.
pub fn spawn(
    storage: Storage,
    queue: Arc<dyn UnitQueue>,
    worker: WorkerId,
    settings: WebhookSettings,
    sender: Sender,
) -> DispatcherHandle {
    let (stop, stopped) = watch::channel(false);
    let grace = settings.timeout + Duration::from_secs(2);
    let ctx = Ctx {
        recorder: Recorder::spawn(storage.clone()),
        storage,
        queue,
        worker,
        posting: Arc::new(Semaphore::new(settings.concurrency.get())),
        settings: Arc::new(settings),
        sender,
        stop: stopped,
    };
    DispatcherHandle { stop, task: Some(tokio::spawn(run(ctx))), grace }
}

async fn run(ctx: Ctx) {
    let mut stop = ctx.stop.clone();
    let mut known: HashSet<String> = HashSet::new();
    let in_hand = Arc::new(Semaphore::new(MAX_IN_HAND));
    let mut tasks = JoinSet::new();
    let mut failing = false;
    let mut pruned_at: Option<Instant> = None;
    let mut reserved = 0;
    loop {
        // After a look that found work, look again at once (a burst of mail
        // drains at the POST rate, not one look per poll), as soon as there
        // is room; otherwise once per poll.
        let pause = if reserved > 0 { Duration::ZERO } else { ctx.settings.poll };
        let full = in_hand.available_permits() == 0;
        tokio::select! {
            _ = stop.changed() => break,
            _ = tokio::time::sleep(pause), if !full => {}
            _ = tokio::time::sleep(ctx.settings.poll), if full => {}
            Some(_) = tasks.join_next(), if full => {}
        }
        while tasks.try_join_next().is_some() {}
        reserved = 0;
        match look(&ctx, &mut known, &in_hand, &mut tasks).await {
            Ok(n) if failing => {
                tracing::info!("webhook deliveries work again");
                failing = false;
                reserved = n;
            }
            Ok(n) => reserved = n,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %error_chain(&e), "webhook deliveries stalled; retrying at every poll");
                }
                failing = true;
            }
        }
        if pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            pruned_at = Some(Instant::now());
            let before =
                crate::storage::now_ms() - i64::try_from(ctx.settings.retention.as_millis()).unwrap_or(i64::MAX);
            if let Err(e) = ctx.storage.prune_webhook_batches(before).await {
                tracing::warn!(error = %error_chain(&e), "could not delete old webhook deliveries");
            }
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// One look at the open batches.
async fn look(
    ctx: &Ctx,
    known: &mut HashSet<String>,
    in_hand: &Arc<Semaphore>,
    tasks: &mut JoinSet<()>,
) -> Result<usize, DispatchError> {
    let mut total = 0;
    let open = ctx.storage.open_webhook_batches(OPEN_BATCHES).await?;
    // Batches another worker finished are no longer listed: forget them.
    known.retain(|name| open.contains(name));
    for name in open {
        let run = RunId::new(&name)?;
        if !known.contains(&name) {
            if !ensure_run(ctx, &run, &name).await? {
                continue;
            }
            known.insert(name.clone());
        }
        let mut reserved = 0;
        if let Some(room) = NonZeroUsize::new(in_hand.available_permits().min(RESERVE_AT_ONCE)) {
            let batch = ctx.queue.reserve_batch(&run, &ctx.worker, room, ctx.settings.reclaim_after).await?;
            reserved = batch.deliveries.len();
            total += reserved;
            for unit in &batch.exhausted {
                give_up_reclaimed(ctx, unit).await?;
            }
            for delivery in batch.deliveries {
                let Ok(permit) = in_hand.clone().try_acquire_owned() else { break };
                tasks.spawn(attempt(ctx.clone(), run.clone(), delivery, permit));
            }
        }
        if reserved == 0 {
            match ctx.queue.progress(&run).await? {
                // Gone from the queue (an in-memory queue restarted, or its
                // TTL ran out): made again from the rows at the next look.
                None => {
                    known.remove(&name);
                }
                Some(p) if p.is_complete() => {
                    ctx.storage.finish_webhook_batch(&name).await?;
                    known.remove(&name);
                }
                Some(_) => {}
            }
        }
    }
    Ok(total)
}

/// Makes sure batch `name` has its run; `false` when it has no deliveries
/// left (their webhook was removed) and was finished instead.
async fn ensure_run(ctx: &Ctx, run: &RunId, name: &str) -> Result<bool, DispatchError> {
    if ctx.queue.progress(run).await?.is_some() {
        return Ok(true);
    }
    let units = ctx.storage.webhook_batch_units(name).await?;
    if units.is_empty() {
        ctx.storage.finish_webhook_batch(name).await?;
        return Ok(false);
    }
    let units = units.iter().map(|u| Ok(UnitSpec::new(UnitId::new(u)?, "webhook"))).collect::<Result<_, IdError>>()?;
    let spec = RunSpec {
        run: run.clone(),
        units,
        budgets: Budgets {
            max_requeues: ctx.settings.retries,
            requeue_tolerance: 1.0,
            max_reclaims: MAX_RECLAIMS,
            ..Budgets::default()
        },
        ttl: RUN_TTL,
    };
    match ctx.queue.initialize(&spec).await {
        // Another worker made it first, perhaps before a webhook (and its
        // deliveries) was removed: its list stands; removed ones are skipped.
        Ok(_) | Err(QueueError::UnitListMismatch { .. }) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// A delivery whose workers kept dying: it fails (its webhook stays as it is).
async fn give_up_reclaimed(ctx: &Ctx, unit: &UnitId) -> Result<(), DispatchError> {
    if let Some(job) = ctx.storage.delivery_job(unit.as_str()).await? {
        tracing::warn!(delivery = %unit, webhook = %job.webhook_id, "a webhook delivery's workers died {MAX_RECLAIMS} times; it failed");
        ctx.storage.end_delivery(&job.webhook_id, unit.as_str(), DeliveryState::Failed, None).await?;
    }
    Ok(())
}

async fn attempt(ctx: Ctx, run: RunId, delivery: Delivery, _in_hand: OwnedSemaphorePermit) {
    if let Err(e) = attempt_once(&ctx, &run, &delivery).await {
        tracing::warn!(delivery = %delivery.unit, error = %error_chain(&e), "a webhook delivery failed here; handed back to be tried again");
        if let Err(e) = ctx.queue.release(&run, &ctx.worker, &delivery).await {
            tracing::warn!(delivery = %delivery.unit, error = %error_chain(&e), "could not hand a webhook delivery back; it will be reclaimed");
        }
    }
}

fn finalize_as(outcome: Outcome, reason: &str) -> FinalizeRequest {
    FinalizeRequest { reason: Some(FinalizeReason::from(reason)), ..FinalizeRequest::new(outcome, 0) }
}

async fn attempt_once(ctx: &Ctx, run: &RunId, delivery: &Delivery) -> Result<(), DispatchError> {
    let id = delivery.unit.as_str();
    let finalize = |request: FinalizeRequest| async move {
        ctx.queue.finalize(run, &ctx.worker, delivery, &request).await.map(drop)
    };
    let Some(job) = ctx.storage.delivery_job(id).await? else {
        return Ok(finalize(finalize_as(Outcome::Skipped, "webhook_removed")).await?);
    };
    if job.run_id != run.as_str() {
        // Resumed into a new batch since this run was made: that run sends it.
        return Ok(finalize(finalize_as(Outcome::Skipped, "moved_to_another_batch")).await?);
    }
    match job.state {
        DeliveryState::Pending => {}
        DeliveryState::Delivered => return Ok(finalize(finalize_as(Outcome::Passed, "already_delivered")).await?),
        DeliveryState::Failed | DeliveryState::Held => {
            return Ok(finalize(finalize_as(Outcome::Skipped, "not_pending")).await?);
        }
    }
    if job.paused {
        ctx.storage.end_delivery(&job.webhook_id, id, DeliveryState::Held, None).await?;
        return Ok(finalize(finalize_as(Outcome::Skipped, "webhook_paused")).await?);
    }
    let started = Instant::now();
    let outcome = {
        let _slot = ctx.posting.acquire().await;
        match with_heartbeats(ctx, run, delivery, ctx.sender.send(&job)).await {
            Some(outcome) => outcome,
            // Another worker has it now (this one stalled past the reclaim).
            None => return Ok(()),
        }
    };
    ctx.recorder.record(&job.webhook_id, id, outcome.clone()).await?;
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let AttemptOutcome::Failed { error, .. } = outcome else {
        return Ok(finalize(FinalizeRequest::new(Outcome::Passed, ms)).await?);
    };
    tracing::debug!(delivery = id, webhook = %job.webhook_id, %error, retry = delivery.retry_index, "a webhook delivery attempt failed");
    if delivery.retry_index < ctx.settings.retries {
        let wait = jitter(ctx.settings.backoff_after(delivery.retry_index), 0.2);
        match with_heartbeats(ctx, run, delivery, wait_unless_stopped(wait, ctx.stop.clone())).await {
            None => return Ok(()),
            Some(false) => {
                ctx.queue.release(run, &ctx.worker, delivery).await?;
                return Ok(());
            }
            Some(true) => {}
        }
    }
    let mut summary = error.clone();
    summary.truncate(summary.floor_char_boundary(MAX_SUMMARY));
    let request = RequeueRequest { duration_ms: ms, failure_summary: Some(summary), ..RequeueRequest::default() };
    if let RequeueReply::Finalized { .. } = ctx.queue.requeue(run, &ctx.worker, delivery, &request).await? {
        let reason = format!("{} attempts of one delivery failed; the last: {error}", job.attempts + 1);
        tracing::warn!(webhook = %job.webhook_id, %reason, "webhook paused");
        ctx.storage.end_delivery(&job.webhook_id, id, DeliveryState::Failed, Some(&reason)).await?;
    }
    Ok(())
}

/// `fut`, heartbeating `delivery` every third of the reclaim timeout;
/// `None` when the queue says the delivery is no longer this worker's.
async fn with_heartbeats<T>(
    ctx: &Ctx,
    run: &RunId,
    delivery: &Delivery,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(fut);
    let every = (ctx.settings.reclaim_after.get() / 3).max(Duration::from_millis(1));
    loop {
        tokio::select! {
            v = &mut fut => return Some(v),
            _ = tokio::time::sleep(every) => match ctx.queue.heartbeat(run, &ctx.worker, delivery).await {
                Ok(Ack::Ok) => {}
                Ok(Ack::Stale | Ack::Corrupt) => return None,
                // The queue is unreachable: keep going; the outcome is what counts.
                Err(e) => tracing::debug!(delivery = %delivery.unit, error = %error_chain(&e), "a webhook heartbeat failed"),
            },
        }
    }
}

/// Waits `wait`; `false` when the worker is stopping first.
async fn wait_unless_stopped(wait: Duration, mut stop: watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(wait) => true,
        _ = stop.changed() => false,
    }
}
