//! Deliveries whose reserve reply was lost.
//!
//! When a connection drops after the queue ran a `reserve` but before its
//! reply arrived, the units are pending on this worker and nobody runs
//! them: they would wait for the reclaim timeout and then spend a reclaim,
//! which with `--max-reclaims 0` fails a unit that never failed. So
//! [`crate::queue::outage::OutageQueue`] keeps the set of deliveries it handed out
//! and, after a reserve that had to be re-sent, asks the queue what is
//! pending on this worker: whatever it did not hand out is adopted and
//! handed out by the next reserves, under the same fence.
//!
//! The scan waits for every other reserve in flight to finish (a write lock
//! against their read locks), so a delivery that is merely on its way to
//! another slot of this worker is never taken for lost.

use std::collections::{HashMap, HashSet, VecDeque};

use leasehold_core::{
    Delivery, DeliveryOrigin, EntryId, QueueError, ReserveBatch, RunId, RunLog, StreamName, WorkerId,
};
use parking_lot::Mutex;
use tokio::sync::{RwLock, RwLockReadGuard};

type Key = (RunId, WorkerId, StreamName, EntryId);

fn key(run: &RunId, worker: &WorkerId, delivery: &Delivery) -> Key {
    (run.clone(), worker.clone(), delivery.stream, delivery.entry_id)
}

/// The deliveries handed out, and the adopted ones not handed out yet.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    handed_out: Mutex<HashSet<Key>>,
    adopted: Mutex<VecDeque<(RunId, WorkerId, Delivery)>>,
    reserving: RwLock<()>,
}

impl Orphans {
    /// Held while a reserve is in flight.
    pub(crate) async fn reserving(&self) -> RwLockReadGuard<'_, ()> {
        self.reserving.read().await
    }

    /// Up to `max` adopted deliveries of `worker` in `run`, handed out now.
    pub(crate) fn take_adopted(&self, run: &RunId, worker: &WorkerId, max: usize) -> Vec<Delivery> {
        let mut adopted = self.adopted.lock();
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(adopted.len());
        while let Some((r, w, delivery)) = adopted.pop_front() {
            if taken.len() < max && &r == run && &w == worker {
                taken.push(delivery);
            } else {
                kept.push_back((r, w, delivery));
            }
        }
        *adopted = kept;
        taken
    }

    /// Notes the deliveries of a reserve reply (call before its read guard is dropped).
    pub(crate) fn handed_out(&self, run: &RunId, worker: &WorkerId, batch: &ReserveBatch) {
        let mut handed_out = self.handed_out.lock();
        for delivery in &batch.deliveries {
            handed_out.insert(key(run, worker, delivery));
        }
    }

    /// Forgets a delivery the worker is done with (any reply of a transition).
    pub(crate) fn done(&self, run: &RunId, worker: &WorkerId, delivery: &Delivery) {
        self.handed_out.lock().remove(&key(run, worker, delivery));
    }

    /// Finds what is pending on `worker` but was never handed out, and
    /// adopts it; returns how many were adopted.
    pub(crate) async fn adopt_lost(
        &self,
        queue: &dyn RunLog,
        run: &RunId,
        worker: &WorkerId,
    ) -> Result<usize, QueueError> {
        let _alone = self.reserving.write().await;
        let pending = queue.pending(run).await?;
        let lost: Vec<_> = {
            let handed_out = self.handed_out.lock();
            pending
                .into_iter()
                .filter(|p| &p.worker == worker)
                .filter(|p| !handed_out.contains(&(run.clone(), worker.clone(), p.stream, p.entry_id)))
                .collect()
        };
        if lost.is_empty() {
            return Ok(0);
        }
        let kinds: HashMap<_, _> = queue.units(run).await?.into_iter().map(|u| (u.id, u.kind)).collect();
        let mut adopted = Vec::with_capacity(lost.len());
        for pending in lost {
            let state = queue.unit_state(run, &pending.unit).await?.unwrap_or_default();
            let origin = if pending.delivery_count > 1 {
                DeliveryOrigin::Reclaimed { previous_worker: None }
            } else {
                DeliveryOrigin::Fresh
            };
            adopted.push(Delivery {
                kind: kinds.get(&pending.unit).cloned().unwrap_or_default(),
                unit: pending.unit,
                stream: pending.stream,
                entry_id: pending.entry_id,
                delivery_count: pending.delivery_count,
                retry_index: state.retry_index,
                reclaim_count: state.reclaim_count,
                origin,
            });
        }
        let count = adopted.len();
        let mut handed_out = self.handed_out.lock();
        let mut queue_of_adopted = self.adopted.lock();
        for delivery in adopted {
            tracing::info!(unit = %delivery.unit, "a reserve reply was lost in the outage: running the unit it delivered");
            handed_out.insert(key(run, worker, &delivery));
            queue_of_adopted.push_back((run.clone(), worker.clone(), delivery));
        }
        Ok(count)
    }
}
