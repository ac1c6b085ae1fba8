//! The deliveries a worker holds, across all its slots, so that one
//! heartbeat call per beat renews them all (not one call per slot).
//!
//! A slot puts what it reserves on the board and takes a delivery off
//! *before* the transition that ends it (finalize, requeue, release): a beat
//! whose call crossed that transition may then hear `STALE` for it, and since
//! it is no longer on the board, that reply is ignored. So a delivery the
//! board marks lost is one another worker really owns now.

use std::collections::HashMap;

use leasehold_core::{Ack, Delivery, EntryId, StreamName};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::transitions::{fenced_off, Shared};

/// One delivery: its entry and the delivery count that fences it.
type Key = (StreamName, EntryId, u32);

fn key(delivery: &Delivery) -> Key {
    (delivery.stream, delivery.entry_id, delivery.delivery_count)
}

/// The worker's held deliveries, each live or lost.
pub(super) struct HeldBoard {
    /// Each held delivery, and whether a heartbeat found it lost.
    deliveries: Mutex<HashMap<Key, (Delivery, bool)>>,
    /// Counts the beats that found a delivery lost (a watch, so a slot busy
    /// elsewhere when one did still hears of it).
    lost_beats: watch::Sender<u64>,
}

impl Default for HeldBoard {
    fn default() -> Self {
        Self { deliveries: Mutex::default(), lost_beats: watch::Sender::new(0) }
    }
}

impl HeldBoard {
    /// Puts freshly reserved deliveries on the board.
    pub(super) fn hold(&self, deliveries: &[Delivery]) {
        let mut held = self.deliveries.lock();
        for delivery in deliveries {
            held.insert(key(delivery), (delivery.clone(), false));
        }
    }

    /// Takes deliveries off the board, before the transition that ends them.
    pub(super) fn let_go<'a>(&self, deliveries: impl IntoIterator<Item = &'a Delivery>) {
        let mut held = self.deliveries.lock();
        for delivery in deliveries {
            held.remove(&key(delivery));
        }
    }

    /// Whether a heartbeat found `delivery` owned by another worker.
    pub(super) fn is_lost(&self, delivery: &Delivery) -> bool {
        self.deliveries.lock().get(&key(delivery)).is_some_and(|(_, lost)| *lost)
    }

    /// A receiver that changes each time a beat finds a delivery lost.
    pub(super) fn watch_lost(&self) -> watch::Receiver<u64> {
        self.lost_beats.subscribe()
    }

    /// Heartbeats every live delivery of the worker in one call. A delivery
    /// the queue no longer lets this worker own, and that is still on the
    /// board after the reply, is marked lost and reported (see
    /// [`fenced_off`]). A failed call loses nothing: the next beat tries again.
    pub(super) async fn beat(&self, shared: &Shared) {
        let live: Vec<Delivery> =
            self.deliveries.lock().values().filter(|(_, lost)| !lost).map(|(d, _)| d.clone()).collect();
        if live.is_empty() {
            return;
        }
        let (run, worker) = (&shared.config.run, &shared.config.worker);
        let replies = match shared.queue.heartbeat_batch(run, worker, &live).await {
            Ok(replies) => replies,
            Err(error) => {
                // The queue announces its outage itself (see `queue::outage`):
                // saying it again at every beat would only repeat it.
                tracing::debug!(units = live.len(), %error, "heartbeat failed; will try again");
                return;
            }
        };
        let mut lost = Vec::new();
        {
            let mut held = self.deliveries.lock();
            for (delivery, reply) in live.into_iter().zip(replies) {
                if reply == Ack::Ok {
                    continue;
                }
                if let Some((_, is_lost)) = held.get_mut(&key(&delivery)) {
                    *is_lost = true;
                    lost.push((delivery, reply));
                }
            }
        }
        if lost.is_empty() {
            return;
        }
        for (delivery, reply) in &lost {
            fenced_off(shared, delivery, "heartbeat", *reply).await;
        }
        self.lost_beats.send_modify(|beats| *beats += 1);
    }
}
