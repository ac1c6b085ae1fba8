//! A test double: a memory queue with injected transport failures, lost
//! replies and slow answers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::AbandonReply;
use leasehold_core::{
    Budgets, Delivery, EventId, EventRecord, FinalizeReply, FinalizeRequest, HeartbeatReply, InitOutcome,
    LivenessReply, PendingDelivery, Progress, QueueError, ReleaseReply, RequeueReply, RequeueRequest, ReserveBatch,
    ReserveLimit, RunId, RunLog, RunSpec, UnitId, UnitQueue, UnitSpec, UnitState, WorkerId, WorkerRecord,
};
use leasehold_mem::MemoryStore;
use parking_lot::Mutex;

/// A queue whose `progress` fails in transport `failures` times, then
/// answers from a memory store, and whose reserves lose their reply
/// (after the store ran them) `lost_reserves` times.
pub(crate) struct Flaky {
    pub(crate) store: MemoryStore,
    pub(crate) failures: AtomicU32,
    pub(crate) calls: AtomicU32,
    pub(crate) lost_reserves: AtomicU32,
    /// Finalizes that lose their reply (after the store applied them).
    pub(crate) lost_finalizes: AtomicU32,
    /// How long each `progress` call takes.
    pub(crate) progress_delay: Mutex<Duration>,
}

impl Flaky {
    fn lose_reply<T>(&self, run: &RunId, reply: Result<T, QueueError>) -> Result<T, QueueError> {
        if self.lost_reserves.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
            return Err(QueueError::backend("reserve", run, io));
        }
        reply
    }

    /// A finalize's reply, or a lost one (after the store applied it) while
    /// `lost_finalizes` lasts.
    fn lose_finalize<T>(&self, run: &RunId, op: &'static str, reply: Result<T, QueueError>) -> Result<T, QueueError> {
        if self.lost_finalizes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
            return Err(QueueError::backend(op, run, io));
        }
        reply
    }
}

#[async_trait]
impl UnitQueue for Flaky {
    async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError> {
        self.store.initialize(spec).await
    }
    async fn reserve_up_to(
        &self,
        r: &RunId,
        w: &WorkerId,
        limit: ReserveLimit,
        t: leasehold_core::Ttl,
    ) -> Result<ReserveBatch, QueueError> {
        let reply = self.store.reserve_up_to(r, w, limit, t).await;
        self.lose_reply(r, reply)
    }
    async fn heartbeat_batch(
        &self,
        r: &RunId,
        w: &WorkerId,
        d: &[Delivery],
    ) -> Result<Vec<HeartbeatReply>, QueueError> {
        self.store.heartbeat_batch(r, w, d).await
    }
    // A lost reply loses the whole batch's, as it does on the wire (and a
    // single `finalize`, the trait's batch of one, loses its one reply).
    async fn finalize_batch(
        &self,
        r: &RunId,
        w: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<FinalizeReply>, QueueError> {
        let reply = self.store.finalize_batch(r, w, items).await;
        self.lose_finalize(r, "finalize_batch", reply)
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
    async fn release_batch(&self, r: &RunId, w: &WorkerId, d: &[Delivery]) -> Result<Vec<ReleaseReply>, QueueError> {
        self.store.release_batch(r, w, d).await
    }
    async fn liveness(&self, r: &RunId, w: &WorkerId, u: Option<&UnitId>) -> Result<LivenessReply, QueueError> {
        self.store.liveness(r, w, u).await
    }
    async fn leave(&self, r: &RunId, w: &WorkerId) -> Result<LivenessReply, QueueError> {
        self.store.leave(r, w).await
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
    async fn record_stale_rejected(&self, r: &RunId, w: &WorkerId, d: &Delivery, t: &str) -> Result<(), QueueError> {
        self.store.record_stale_rejected(r, w, d, t).await
    }
}

#[async_trait]
impl RunLog for Flaky {
    async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let delay = *self.progress_delay.lock();
        tokio::time::sleep(delay).await;
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
    async fn wait_for_events(&self, r: &RunId, a: Option<EventId>, t: Duration) -> Result<Option<EventId>, QueueError> {
        self.store.wait_for_events(r, a, t).await
    }
    async fn workers(&self, r: &RunId) -> Result<Vec<WorkerRecord>, QueueError> {
        self.store.workers(r).await
    }
    async fn pending(&self, r: &RunId) -> Result<Vec<PendingDelivery>, QueueError> {
        self.store.pending(r).await
    }
}

/// A [`Flaky`] whose `progress` fails `failures` times.
pub(crate) fn flaky(failures: u32) -> Arc<Flaky> {
    Arc::new(Flaky {
        store: MemoryStore::new(),
        failures: AtomicU32::new(failures),
        calls: AtomicU32::new(0),
        lost_reserves: AtomicU32::new(0),
        lost_finalizes: AtomicU32::new(0),
        progress_delay: Mutex::new(Duration::ZERO),
    })
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use leasehold_core::{Outcome, Ttl};

    use super::*;

    async fn two_reserved(queue: &Flaky) -> (RunId, WorkerId, Vec<Delivery>) {
        let run = RunId::new("b").unwrap();
        let worker = WorkerId::new("w").unwrap();
        let units = ["u1", "u2"].map(|u| UnitSpec::new(UnitId::new(u).unwrap(), "file")).to_vec();
        let spec = RunSpec { run: run.clone(), units, budgets: Budgets::default(), ttl: Duration::from_secs(600) };
        queue.initialize(&spec).await.unwrap();
        let two = NonZeroUsize::new(2).unwrap();
        let reclaim = Ttl::new("reclaim", Duration::from_secs(30)).unwrap();
        let batch = queue.reserve_batch(&run, &worker, two, reclaim).await.unwrap();
        assert_eq!(batch.deliveries.len(), 2);
        (run, worker, batch.deliveries)
    }

    #[tokio::test]
    async fn a_lost_batch_finalize_reply_loses_the_whole_batch_after_the_store_applied_it() {
        let queue = flaky(0);
        let (run, worker, deliveries) = two_reserved(&queue).await;
        let items: Vec<_> = deliveries.iter().map(|d| (d.clone(), FinalizeRequest::new(Outcome::Passed, 1))).collect();
        queue.lost_finalizes.store(1, Ordering::SeqCst);
        assert!(queue.finalize_batch(&run, &worker, &items).await.is_err());
        // Calling `finalize` per item would have stopped at the first lost reply.
        assert!(queue.progress(&run).await.unwrap().unwrap().is_complete(), "both were applied");
    }
}
