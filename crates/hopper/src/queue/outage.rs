//! Riding out a queue outage: a Redis restart, a Sentinel or Cluster
//! failover, a storm of dropped connections. Each must cost a pause, never a
//! lost result.
//!
//! [`OutageQueue`] wraps any [`UnitQueue`] and retries a call that failed in
//! transport ([`QueueError::Backend`]) with backoff and jitter, for a window
//! of *time* (`--outage-grace`), not a count of attempts. The window runs
//! from the first failure of the current outage, shared by every call of the
//! process, so ten slots waiting on one outage give up together. The outage
//! is announced once when it begins and once when it ends.
//!
//! Re-sending is safe because every transition is fenced: a re-sent finalize
//! whose first send was applied before its reply was lost answers `STALE`
//! and changes nothing, so a result is never counted twice. (That `STALE`
//! is then checked against the event log: when the log holds this worker's
//! finalize of that very delivery, the answer is `OK`, so the worker does
//! not report its own result as refused.) A re-sent
//! reserve is the one call whose lost reply would strand work (units
//! delivered to nobody until the reclaim timeout): the `orphans` module
//! adopts what such a reply delivered.
//!
//! It wraps the batch forms of the queue's transitions; the single forms
//! (`reserve`, `heartbeat`, `finalize`, `release`) are the trait's own, a
//! batch of one, so they are retried and checked exactly as the batches.
//!
//! Two calls are not retried here, because their callers repeat them on
//! their own: `heartbeat` and `liveness`. Waiting inside them would stop the
//! caller from watching its unit (output, time limit, stop request). They
//! still mark the outage, so the announcement is the same.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::duration::jitter;
use leasehold_core::{
    AbandonReply, Ack, Budgets, Delivery, Event, EventId, EventRecord, FinalizeReply, FinalizeRequest, HeartbeatReply,
    InitOutcome, LivenessReply, PendingDelivery, Progress, QueueError, ReleaseReply, RequeueReply, RequeueRequest,
    ReserveBatch, ReserveLimit, RunId, RunLog, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, UnitState, WorkerId,
    WorkerRecord,
};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::orphans::Orphans;

/// The default `--outage-grace`: how long a queue may be unreachable before
/// hopper gives up.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(120);
/// The first pause after a failed call.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The window once the process is stopping (a signal): long enough for a
/// blip, short enough that a stop stays prompt.
const STOPPING_GRACE: Duration = Duration::from_secs(3);

/// What [`OutageQueue`] announces.
#[derive(Debug)]
pub enum OutageNotice<'a> {
    /// The first call of an outage failed; calls are retried for `grace`.
    Began {
        /// The failed operation.
        op: &'static str,
        /// Its error.
        error: &'a (dyn std::error::Error + 'static),
        /// How long calls are retried.
        grace: Duration,
    },
    /// A call succeeded again after `after` of outage.
    Ended {
        /// How long the outage lasted.
        after: Duration,
    },
}

impl std::fmt::Display for OutageNotice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutageNotice::Began { op, error, grace } => write!(
                f,
                "the queue is unreachable ({op}: {}); retrying for up to {:.0}s (--outage-grace)",
                root_cause(*error),
                grace.as_secs_f64()
            ),
            OutageNotice::Ended { after } => {
                write!(f, "the queue answers again after {:.1}s; carrying on", after.as_secs_f64())
            }
        }
    }
}

/// The innermost cause of `error`, which says what actually went wrong
/// (`Connection refused`, `broken pipe`) without the layers above it.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Connects with `connect`, riding out a server that is not up yet (a
/// Redis restarting as the job starts) for `grace`, announced like an
/// outage. `may_come_back` tells such an error from one that waiting cannot
/// mend (a bad certificate, a wrong password).
pub async fn connect_within<T, E, F, Fut>(
    grace: Duration,
    notify: &OutageNotify,
    may_come_back: impl Fn(&E) -> bool,
    mut connect: F,
) -> Result<T, E>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut delay = FIRST_BACKOFF;
    let mut failed = false;
    loop {
        match connect().await {
            Ok(connected) => {
                if failed {
                    notify(&OutageNotice::Ended { after: started.elapsed() });
                }
                return Ok(connected);
            }
            Err(error) if may_come_back(&error) && started.elapsed() < grace => {
                if !failed {
                    failed = true;
                    notify(&OutageNotice::Began { op: "connect", error: &error, grace });
                }
                tokio::time::sleep(jitter(delay, 0.5).min(grace.saturating_sub(started.elapsed()))).await;
                delay = (delay * 2).min(MAX_BACKOFF);
            }
            Err(error) => return Err(error),
        }
    }
}

/// The cause of a [`QueueError::Backend`] when the grace window ran out.
#[derive(Debug, thiserror::Error)]
#[error("the queue did not answer for {:.1}s, longer than --outage-grace ({:.0}s)", waited.as_secs_f64(), grace.as_secs_f64())]
pub struct GraceExhausted {
    /// How long the outage has lasted.
    pub waited: Duration,
    /// The window.
    pub grace: Duration,
    /// The last transport error.
    #[source]
    pub last: leasehold_core::errors::BoxError,
}

/// Receives the outage announcements.
pub type OutageNotify = Arc<dyn Fn(&OutageNotice<'_>) + Send + Sync>;

/// When the current outage began, shared by every call.
struct OutageClock {
    grace: Duration,
    began: Mutex<Option<Instant>>,
    notify: OutageNotify,
}

impl OutageClock {
    /// Marks a failed call; returns how long the outage has lasted.
    fn failed(&self, op: &'static str, error: &QueueError) -> Duration {
        let now = Instant::now();
        let earlier = {
            let mut began = self.began.lock();
            let earlier = *began;
            began.get_or_insert(now);
            earlier
        };
        if let Some(began) = earlier {
            return now.saturating_duration_since(began);
        }
        tracing::debug!(op, %error, "queue call failed; riding out the outage");
        (self.notify)(&OutageNotice::Began { op, error, grace: self.grace });
        Duration::ZERO
    }

    fn succeeded(&self) {
        let began = self.began.lock().take();
        if let Some(at) = began {
            let after = at.elapsed();
            tracing::debug!(?after, "the queue answers again");
            (self.notify)(&OutageNotice::Ended { after });
        }
    }
}

/// A [`UnitQueue`] that rides out transport errors of the queue it wraps.
pub struct OutageQueue {
    inner: Arc<dyn UnitQueue>,
    clock: OutageClock,
    stop: CancellationToken,
    orphans: Orphans,
}

impl std::fmt::Debug for OutageQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutageQueue").field("grace", &self.clock.grace).finish_non_exhaustive()
    }
}

impl OutageQueue {
    /// Wraps `inner`: transport errors are retried for `grace`, announced
    /// through `notify`. Once `stop` is cancelled the window shrinks to a
    /// few seconds, so a stopping worker can still hand its units back
    /// through a blip but never hangs on a dead queue.
    pub fn new(inner: Arc<dyn UnitQueue>, grace: Duration, notify: OutageNotify, stop: CancellationToken) -> Self {
        Self { inner, clock: OutageClock { grace, began: Mutex::new(None), notify }, stop, orphans: Orphans::default() }
    }

    /// [`OutageQueue::new`] as an `Arc<dyn UnitQueue>`.
    pub fn wrap(
        inner: Arc<dyn UnitQueue>,
        grace: Duration,
        notify: OutageNotify,
        stop: CancellationToken,
    ) -> Arc<dyn UnitQueue> {
        Arc::new(Self::new(inner, grace, notify, stop))
    }

    /// Calls `call` until it succeeds, fails with anything but a transport
    /// error, or the outage has lasted longer than the grace window.
    async fn retry<T, F, Fut>(&self, op: &'static str, call: F) -> Result<T, QueueError>
    where
        F: FnMut() -> Fut + Send,
        Fut: std::future::Future<Output = Result<T, QueueError>> + Send,
        T: Send,
    {
        self.retry_noting(op, call).await.map(|(reply, _)| reply)
    }

    /// [`OutageQueue::retry`], also saying whether the call had to be re-sent.
    async fn retry_noting<T, F, Fut>(&self, op: &'static str, mut call: F) -> Result<(T, bool), QueueError>
    where
        F: FnMut() -> Fut + Send,
        Fut: std::future::Future<Output = Result<T, QueueError>> + Send,
        T: Send,
    {
        let mut delay = FIRST_BACKOFF;
        let mut resent = false;
        loop {
            match call().await {
                Err(QueueError::Backend { op: failed_op, run, source }) => {
                    resent = true;
                    let error = QueueError::Backend { op: failed_op, run, source };
                    let lasted = self.clock.failed(op, &error);
                    let stopping = self.stop.is_cancelled();
                    let grace = if stopping { self.clock.grace.min(STOPPING_GRACE) } else { self.clock.grace };
                    let left = grace.saturating_sub(lasted);
                    if left.is_zero() {
                        return Err(self.gave_up(error, lasted));
                    }
                    tracing::debug!(op, %error, ?delay, "queue call failed; retrying");
                    let pause = tokio::time::sleep(jitter(delay, 0.5).min(left));
                    if stopping {
                        pause.await;
                    } else {
                        tokio::select! {
                            _ = pause => {}
                            // A stop shortens the window: go round once more with it.
                            _ = self.stop.cancelled() => {}
                        }
                    }
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
                Ok(reply) => {
                    self.clock.succeeded();
                    return Ok((reply, resent));
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Calls `call` once, marking the outage when it fails in transport.
    async fn once<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        let result = call.await;
        match &result {
            Ok(_) => self.clock.succeeded(),
            Err(error @ QueueError::Backend { .. }) => {
                self.clock.failed(op, error);
            }
            Err(_) => {}
        }
        result
    }

    /// After a reserve that had to be re-sent: adopt what a lost reply delivered.
    async fn adopt_lost(&self, run: &RunId, worker: &WorkerId) {
        match self.orphans.adopt_lost(self, run, worker).await {
            Ok(0) => {}
            Ok(adopted) => tracing::debug!(adopted, "adopted deliveries whose reserve reply was lost"),
            // The reclaim timeout remains the fallback for these.
            Err(error) => tracing::debug!(%error, "could not look for deliveries of lost reserve replies"),
        }
    }

    /// Which of `deliveries` (by index) this worker has finalized, by the
    /// event log: a re-sent finalize answers `STALE` when its first send was
    /// applied and only the reply was lost, and that is this worker's result,
    /// not a refused one. Only called after such a re-send.
    async fn finalized_by(&self, run: &RunId, worker: &WorkerId, deliveries: &[&Delivery]) -> Vec<usize> {
        const PAGE: usize = 1000;
        let mut applied = Vec::new();
        let mut after = None;
        loop {
            let page = match self.events(run, after, PAGE).await {
                Ok(page) => page,
                // Unknown: the STALE stands, which drops nothing the queue holds.
                Err(_) => return applied,
            };
            let full = page.len() == PAGE;
            after = page.last().map(|record| record.id);
            for record in page {
                if let Event::Finalized { header, stream, entry_id, previous_worker_id: None, .. } = record.event {
                    let ours = |d: &&Delivery| {
                        header.worker_id == *worker
                            && header.unit_id == d.unit
                            && stream == d.stream
                            && entry_id == d.entry_id
                    };
                    if let Some(i) = deliveries.iter().position(ours) {
                        applied.push(i);
                    }
                }
            }
            if !full {
                return applied;
            }
        }
    }

    /// A transition on `delivery` was answered: it is no longer handed out.
    fn done<T>(&self, run: &RunId, worker: &WorkerId, delivery: &Delivery, reply: &Result<T, QueueError>) {
        if reply.is_ok() {
            self.orphans.done(run, worker, delivery);
        }
    }

    fn gave_up(&self, error: QueueError, waited: Duration) -> QueueError {
        match error {
            QueueError::Backend { op, run, source } => QueueError::Backend {
                op,
                run,
                source: Box::new(GraceExhausted { waited, grace: self.clock.grace, last: source }),
            },
            other => other,
        }
    }
}

#[async_trait]
impl UnitQueue for OutageQueue {
    async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError> {
        self.retry("initialize", || self.inner.initialize(spec)).await
    }

    async fn reserve_up_to(
        &self,
        run: &RunId,
        worker: &WorkerId,
        limit: ReserveLimit,
        reclaim_after: Ttl,
    ) -> Result<ReserveBatch, QueueError> {
        let adopted = self.orphans.take_adopted(run, worker, limit.max_deliveries().get());
        if !adopted.is_empty() {
            return Ok(ReserveBatch { deliveries: adopted, ..ReserveBatch::default() });
        }
        let (batch, resent) = self
            .retry_noting("reserve", || async {
                let _reserving = self.orphans.reserving().await;
                let batch = self.inner.reserve_up_to(run, worker, limit, reclaim_after).await?;
                self.orphans.handed_out(run, worker, &batch);
                Ok(batch)
            })
            .await?;
        if resent {
            self.adopt_lost(run, worker).await;
        }
        Ok(batch)
    }

    async fn heartbeat_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<HeartbeatReply>, QueueError> {
        self.once("heartbeat", self.inner.heartbeat_batch(run, worker, deliveries)).await
    }

    async fn finalize_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<FinalizeReply>, QueueError> {
        let replies = match self.retry_noting("finalize", || self.inner.finalize_batch(run, worker, items)).await {
            Ok((mut replies, true)) if replies.contains(&Ack::Stale) => {
                let stale: Vec<&Delivery> =
                    items.iter().zip(&replies).filter(|(_, r)| **r == Ack::Stale).map(|((d, _), _)| d).collect();
                let applied = self.finalized_by(run, worker, &stale).await;
                for (nth_stale, reply) in replies.iter_mut().filter(|r| **r == Ack::Stale).enumerate() {
                    if applied.contains(&nth_stale) {
                        *reply = Ack::Ok;
                    }
                }
                Ok(replies)
            }
            other => other.map(|(replies, _)| replies),
        };
        for (delivery, _) in items {
            self.done(run, worker, delivery, &replies);
        }
        replies
    }

    async fn requeue(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &RequeueRequest,
    ) -> Result<RequeueReply, QueueError> {
        let reply = self.retry("requeue", || self.inner.requeue(run, worker, delivery, request)).await;
        self.done(run, worker, delivery, &reply);
        reply
    }

    async fn abandon(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        elapsed_ms: u64,
    ) -> Result<AbandonReply, QueueError> {
        let reply = self.retry("abandon", || self.inner.abandon(run, worker, delivery, elapsed_ms)).await;
        self.done(run, worker, delivery, &reply);
        reply
    }

    async fn release_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<ReleaseReply>, QueueError> {
        let replies = self.retry("release", || self.inner.release_batch(run, worker, deliveries)).await;
        for delivery in deliveries {
            self.done(run, worker, delivery, &replies);
        }
        replies
    }

    async fn liveness(
        &self,
        run: &RunId,
        worker: &WorkerId,
        current_unit: Option<&UnitId>,
    ) -> Result<LivenessReply, QueueError> {
        self.once("liveness", self.inner.liveness(run, worker, current_unit)).await
    }

    async fn leave(&self, run: &RunId, worker: &WorkerId) -> Result<LivenessReply, QueueError> {
        self.once("leave", self.inner.leave(run, worker)).await
    }

    async fn record_worker_error(
        &self,
        run: &RunId,
        worker: &WorkerId,
        unit: Option<&UnitId>,
        message: &str,
    ) -> Result<(), QueueError> {
        self.retry("record_worker_error", || self.inner.record_worker_error(run, worker, unit, message)).await
    }

    async fn record_stale_rejected(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        transition: &str,
    ) -> Result<(), QueueError> {
        self.retry("record_stale_rejected", || self.inner.record_stale_rejected(run, worker, delivery, transition))
            .await
    }
}

#[async_trait]
impl RunLog for OutageQueue {
    async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError> {
        self.retry("progress", || self.inner.progress(run)).await
    }

    async fn budgets(&self, run: &RunId) -> Result<Option<Budgets>, QueueError> {
        self.retry("budgets", || self.inner.budgets(run)).await
    }

    async fn units(&self, run: &RunId) -> Result<Vec<UnitSpec>, QueueError> {
        self.retry("units", || self.inner.units(run)).await
    }

    async fn unit_state(&self, run: &RunId, unit: &UnitId) -> Result<Option<UnitState>, QueueError> {
        self.retry("unit_state", || self.inner.unit_state(run, unit)).await
    }

    async fn events(&self, run: &RunId, after: Option<EventId>, limit: usize) -> Result<Vec<EventRecord>, QueueError> {
        self.retry("events", || self.inner.events(run, after, limit)).await
    }

    /// Not retried: a wait is a wake-up hint, and a caller whose wait
    /// failed sleeps its time instead (the outage is announced by the calls
    /// that matter).
    async fn wait_for_events(
        &self,
        run: &RunId,
        after: Option<EventId>,
        timeout: Duration,
    ) -> Result<Option<EventId>, QueueError> {
        self.inner.wait_for_events(run, after, timeout).await
    }

    async fn workers(&self, run: &RunId) -> Result<Vec<WorkerRecord>, QueueError> {
        self.retry("workers", || self.inner.workers(run)).await
    }

    async fn pending(&self, run: &RunId) -> Result<Vec<PendingDelivery>, QueueError> {
        self.retry("pending", || self.inner.pending(run)).await
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::queue::test_queue::flaky;

    fn recorder() -> (OutageNotify, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        (Arc::new(move |notice: &OutageNotice<'_>| sink.lock().push(notice.to_string())), lines)
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_shorter_than_the_grace_costs_a_pause_and_is_announced_once() {
        let inner = flaky(30);
        let (notify, lines) = recorder();
        let queue = OutageQueue::new(inner.clone(), Duration::from_secs(120), notify, CancellationToken::new());
        let run = RunId::new("b").unwrap();
        let started = Instant::now();
        assert_eq!(queue.progress(&run).await.unwrap(), None, "the call got through once the queue answered");
        assert_eq!(inner.calls.load(Ordering::SeqCst), 31);
        // 30 failures with backoff capped at 2 s: time passed, but well within the window.
        let waited = started.elapsed();
        assert!(waited > Duration::from_secs(10) && waited < Duration::from_secs(120), "{waited:?}");
        let lines = lines.lock();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("unreachable (progress: broken pipe)") && lines[0].contains("120s"), "{lines:?}");
        assert!(lines[1].contains("answers again"), "{lines:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_longer_than_the_grace_gives_up_with_the_cause() {
        let inner = flaky(u32::MAX);
        let (notify, _) = recorder();
        let queue = OutageQueue::new(inner, Duration::from_secs(5), notify, CancellationToken::new());
        let run = RunId::new("b").unwrap();
        let started = Instant::now();
        let error = queue.progress(&run).await.unwrap_err();
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited < Duration::from_secs(8), "{waited:?}");
        let QueueError::Backend { source, .. } = &error else { panic!("{error:?}") };
        let exhausted = source.downcast_ref::<GraceExhausted>().expect("the cause says the window ran out");
        assert!(exhausted.to_string().contains("--outage-grace (5s)"), "{exhausted}");
        assert_eq!(root_cause(&error), "broken pipe");
    }

    #[tokio::test(start_paused = true)]
    async fn units_delivered_by_a_lost_reserve_reply_are_run_not_stranded() {
        let inner = flaky(0);
        let (notify, _) = recorder();
        let queue = OutageQueue::new(inner.clone(), Duration::from_secs(120), notify, CancellationToken::new());
        let run = RunId::new("b").unwrap();
        let worker = WorkerId::new("w").unwrap();
        let units: Vec<UnitSpec> =
            ["u1", "u2", "u3"].iter().map(|u| UnitSpec::new(UnitId::new(*u).unwrap(), "file")).collect();
        let budgets = Budgets { max_reclaims: 0, ..Budgets::default() };
        let spec = RunSpec { run: run.clone(), units, budgets, ttl: Duration::from_secs(600) };
        queue.initialize(&spec).await.unwrap();
        let reclaim_after = Ttl::new("reclaim", Duration::from_secs(30)).unwrap();

        // u1's reply is lost: the re-sent reserve delivers u2, and u1 is adopted.
        inner.lost_reserves.store(1, Ordering::SeqCst);
        let mut order = Vec::new();
        for _ in 0..3 {
            let batch = queue.reserve_batch(&run, &worker, NonZeroUsize::MIN, reclaim_after).await.unwrap();
            let [delivery] = batch.deliveries.as_slice() else { panic!("one delivery: {batch:?}") };
            assert_eq!(delivery.kind, "file");
            let request = FinalizeRequest::new(leasehold_core::Outcome::Passed, 1);
            assert_eq!(queue.finalize(&run, &worker, delivery, &request).await.unwrap(), leasehold_core::Ack::Ok);
            order.push(delivery.unit.to_string());
        }
        assert_eq!(order, ["u2", "u1", "u3"]);
        assert!(queue.progress(&run).await.unwrap().unwrap().is_complete());
        for unit in ["u1", "u2", "u3"] {
            let state = queue.unit_state(&run, &UnitId::new(unit).unwrap()).await.unwrap().unwrap();
            assert_eq!(state.reclaim_count, 0, "{unit} spent no reclaim");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_finalize_whose_reply_was_lost_is_ok_not_stale_but_a_second_one_is_stale() {
        let inner = flaky(0);
        let (notify, _) = recorder();
        let queue = OutageQueue::new(inner.clone(), Duration::from_secs(120), notify, CancellationToken::new());
        let run = RunId::new("b").unwrap();
        let worker = WorkerId::new("w").unwrap();
        let units = vec![UnitSpec::new(UnitId::new("u1").unwrap(), "file")];
        let spec = RunSpec { run: run.clone(), units, budgets: Budgets::default(), ttl: Duration::from_secs(600) };
        queue.initialize(&spec).await.unwrap();
        let batch = queue
            .reserve_batch(&run, &worker, NonZeroUsize::MIN, Ttl::new("reclaim", Duration::from_secs(30)).unwrap())
            .await
            .unwrap();
        let delivery = &batch.deliveries[0];
        let request = FinalizeRequest::new(leasehold_core::Outcome::Passed, 1);

        inner.lost_finalizes.store(1, Ordering::SeqCst);
        assert_eq!(queue.finalize(&run, &worker, delivery, &request).await.unwrap(), Ack::Ok, "the result is ours");
        assert!(queue.progress(&run).await.unwrap().unwrap().is_complete());
        assert_eq!(queue.finalize(&run, &worker, delivery, &request).await.unwrap(), Ack::Stale, "sent twice: STALE");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_request_shortens_the_wait() {
        let inner = flaky(u32::MAX);
        let (notify, _) = recorder();
        let stop = CancellationToken::new();
        let queue = OutageQueue::new(inner, Duration::from_secs(120), notify, stop.clone());
        let run = RunId::new("b").unwrap();
        let stopper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stop.cancel();
        });
        let started = Instant::now();
        assert!(queue.progress(&run).await.is_err());
        let waited = started.elapsed();
        assert!(waited >= STOPPING_GRACE && waited < STOPPING_GRACE * 2, "{waited:?}");
        stopper.await.unwrap();
    }
}
