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
//! and changes nothing, so a result is never counted twice. A re-sent
//! reserve is the one call whose lost reply would strand work (units
//! delivered to nobody until the reclaim timeout): the `orphans` module
//! adopts what such a reply delivered.
//!
//! Two calls are not retried here, because their callers repeat them on
//! their own: `heartbeat` and `liveness`. Waiting inside them would stop the
//! caller from watching its unit (output, time limit, stop request). They
//! still mark the outage, so the announcement is the same.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AbandonReply, Budgets, Delivery, EventId, EventRecord, FinalizeReply, FinalizeRequest, HeartbeatReply, InitOutcome,
    LivenessReply, PendingDelivery, Progress, QueueError, ReleaseReply, RequeueReply, RequeueRequest, ReserveBatch,
    ReserveReply, RunId, RunSpec, UnitId, UnitQueue, UnitSpec, UnitState, WorkerId, WorkerRecord,
};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::orphans::Orphans;

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
        error: &'a QueueError,
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

/// A random factor in [0.5, 1.0), so workers that lost Redis together do not
/// come back in lockstep.
fn jitter(delay: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    delay.mul_f64(0.5 + (random % 1000) as f64 / 2000.0)
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
                    let pause = tokio::time::sleep(jitter(delay).min(left));
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

    async fn reserve(
        &self,
        run: &RunId,
        worker: &WorkerId,
        reclaim_after: Duration,
    ) -> Result<ReserveReply, QueueError> {
        if let Some(delivery) = self.orphans.take_adopted(run, worker, 1).pop() {
            return Ok(ReserveReply::Delivered(delivery));
        }
        let (reply, resent) = self
            .retry_noting("reserve", || async {
                let _reserving = self.orphans.reserving().await;
                let reply = self.inner.reserve(run, worker, reclaim_after).await?;
                if let ReserveReply::Delivered(delivery) = &reply {
                    let batch = ReserveBatch { deliveries: vec![delivery.clone()], ..ReserveBatch::default() };
                    self.orphans.handed_out(run, worker, &batch);
                }
                Ok(reply)
            })
            .await?;
        if resent {
            self.adopt_lost(run, worker).await;
        }
        Ok(reply)
    }

    async fn reserve_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        max: usize,
        reclaim_after: Duration,
    ) -> Result<ReserveBatch, QueueError> {
        let adopted = self.orphans.take_adopted(run, worker, max);
        if !adopted.is_empty() {
            return Ok(ReserveBatch { deliveries: adopted, ..ReserveBatch::default() });
        }
        let (batch, resent) = self
            .retry_noting("reserve", || async {
                let _reserving = self.orphans.reserving().await;
                let batch = self.inner.reserve_batch(run, worker, max, reclaim_after).await?;
                self.orphans.handed_out(run, worker, &batch);
                Ok(batch)
            })
            .await?;
        if resent {
            self.adopt_lost(run, worker).await;
        }
        Ok(batch)
    }

    async fn heartbeat(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
    ) -> Result<HeartbeatReply, QueueError> {
        self.once("heartbeat", self.inner.heartbeat(run, worker, delivery)).await
    }

    async fn finalize(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &FinalizeRequest,
    ) -> Result<FinalizeReply, QueueError> {
        let reply = self.retry("finalize", || self.inner.finalize(run, worker, delivery, request)).await;
        self.done(run, worker, delivery, &reply);
        reply
    }

    async fn finalize_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<FinalizeReply>, QueueError> {
        let replies = self.retry("finalize", || self.inner.finalize_batch(run, worker, items)).await;
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

    async fn release(&self, run: &RunId, worker: &WorkerId, delivery: &Delivery) -> Result<ReleaseReply, QueueError> {
        let reply = self.retry("release", || self.inner.release(run, worker, delivery)).await;
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

    async fn workers(&self, run: &RunId) -> Result<Vec<WorkerRecord>, QueueError> {
        self.retry("workers", || self.inner.workers(run)).await
    }

    async fn pending(&self, run: &RunId) -> Result<Vec<PendingDelivery>, QueueError> {
        self.retry("pending", || self.inner.pending(run)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use leasehold_mem::MemoryStore;

    use super::*;

    /// A queue whose `progress` fails in transport `failures` times, then
    /// answers from a memory store, and whose reserves lose their reply
    /// (after the store ran them) `lost_reserves` times.
    struct Flaky {
        store: MemoryStore,
        failures: AtomicU32,
        calls: AtomicU32,
        lost_reserves: AtomicU32,
    }

    impl Flaky {
        fn lose_reply<T>(&self, run: &RunId, reply: Result<T, QueueError>) -> Result<T, QueueError> {
            if self.lost_reserves.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
                return Err(QueueError::backend("reserve", run, io));
            }
            reply
        }
    }

    #[async_trait]
    impl UnitQueue for Flaky {
        async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError> {
            self.store.initialize(spec).await
        }
        async fn reserve(&self, r: &RunId, w: &WorkerId, t: Duration) -> Result<ReserveReply, QueueError> {
            let reply = self.store.reserve(r, w, t).await;
            self.lose_reply(r, reply)
        }
        async fn reserve_batch(
            &self,
            r: &RunId,
            w: &WorkerId,
            max: usize,
            t: Duration,
        ) -> Result<ReserveBatch, QueueError> {
            let reply = self.store.reserve_batch(r, w, max, t).await;
            self.lose_reply(r, reply)
        }
        async fn heartbeat(&self, r: &RunId, w: &WorkerId, d: &Delivery) -> Result<HeartbeatReply, QueueError> {
            self.store.heartbeat(r, w, d).await
        }
        async fn finalize(
            &self,
            r: &RunId,
            w: &WorkerId,
            d: &Delivery,
            q: &FinalizeRequest,
        ) -> Result<FinalizeReply, QueueError> {
            self.store.finalize(r, w, d, q).await
        }
        async fn requeue(
            &self,
            r: &RunId,
            w: &WorkerId,
            d: &Delivery,
            q: &RequeueRequest,
        ) -> Result<RequeueReply, QueueError> {
            self.store.requeue(r, w, d, q).await
        }
        async fn abandon(&self, r: &RunId, w: &WorkerId, d: &Delivery, ms: u64) -> Result<AbandonReply, QueueError> {
            self.store.abandon(r, w, d, ms).await
        }
        async fn release(&self, r: &RunId, w: &WorkerId, d: &Delivery) -> Result<ReleaseReply, QueueError> {
            self.store.release(r, w, d).await
        }
        async fn liveness(&self, r: &RunId, w: &WorkerId, u: Option<&UnitId>) -> Result<LivenessReply, QueueError> {
            self.store.liveness(r, w, u).await
        }
        async fn record_worker_error(
            &self,
            r: &RunId,
            w: &WorkerId,
            u: Option<&UnitId>,
            m: &str,
        ) -> Result<(), QueueError> {
            self.store.record_worker_error(r, w, u, m).await
        }
        async fn record_stale_rejected(
            &self,
            r: &RunId,
            w: &WorkerId,
            d: &Delivery,
            t: &str,
        ) -> Result<(), QueueError> {
            self.store.record_stale_rejected(r, w, d, t).await
        }
        async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let left = self.failures.load(Ordering::SeqCst);
            if left > 0 {
                self.failures.store(left - 1, Ordering::SeqCst);
                let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
                return Err(QueueError::backend("progress", run, io));
            }
            self.store.progress(run).await
        }
        async fn budgets(&self, r: &RunId) -> Result<Option<Budgets>, QueueError> {
            self.store.budgets(r).await
        }
        async fn units(&self, r: &RunId) -> Result<Vec<UnitSpec>, QueueError> {
            self.store.units(r).await
        }
        async fn unit_state(&self, r: &RunId, u: &UnitId) -> Result<Option<UnitState>, QueueError> {
            self.store.unit_state(r, u).await
        }
        async fn events(&self, r: &RunId, a: Option<EventId>, l: usize) -> Result<Vec<EventRecord>, QueueError> {
            self.store.events(r, a, l).await
        }
        async fn workers(&self, r: &RunId) -> Result<Vec<WorkerRecord>, QueueError> {
            self.store.workers(r).await
        }
        async fn pending(&self, r: &RunId) -> Result<Vec<PendingDelivery>, QueueError> {
            self.store.pending(r).await
        }
    }

    fn flaky(failures: u32) -> Arc<Flaky> {
        Arc::new(Flaky {
            store: MemoryStore::new(),
            failures: AtomicU32::new(failures),
            calls: AtomicU32::new(0),
            lost_reserves: AtomicU32::new(0),
        })
    }

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
        let reclaim_after = Duration::from_secs(30);

        // u1's reply is lost: the re-sent reserve delivers u2, and u1 is adopted.
        inner.lost_reserves.store(1, Ordering::SeqCst);
        let mut order = Vec::new();
        for _ in 0..3 {
            let batch = queue.reserve_batch(&run, &worker, 1, reclaim_after).await.unwrap();
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
