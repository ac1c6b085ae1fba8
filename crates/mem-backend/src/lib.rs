//! # leasehold-mem
//!
//! The in-memory leasehold backend: one process, no server. It is the
//! embedded default of hopper and sync-worker and the **reference semantics**
//! every other backend is checked against (the conformance suite and the
//! differential property test compare their replies with this one's).
//!
//! [`MemoryStore`] implements [`leasehold_core::UnitQueue`] (the seed's
//! `transition.lua`, transition by transition), [`leasehold_core::LeaseStore`],
//! [`leasehold_core::Presence`]
//! and [`leasehold_core::BucketLeases`]. All state sits behind short
//! `parking_lot` mutexes, never held across an `.await`, so a store is safe to
//! share between many tasks (it is `Clone`; clones share state).
//!
//! It also keeps unit timings ([`leasehold_core::TimingsStore`]) for as long
//! as it lives; [`FileTimings`] keeps them in a local file across processes.
//!
//! Time comes from a [`leasehold_core::Clock`]: [`MemoryStore::new`] follows
//! tokio's clock (so `tokio::time::pause` drives TTLs in tests) and
//! [`MemoryStore::with_clock`] takes any other, such as a
//! [`leasehold_core::ManualClock`].
#![warn(missing_docs)]

mod buckets;
mod bus;
mod lease;
mod presence;
mod queue;
mod timings;

pub use bus::MemoryBus;
pub use timings::FileTimings;

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_core::{Clock, TokioClock, UserId};
use parking_lot::Mutex;

/// How many `user.active` events or bucket change notices a slow subscriber
/// may fall behind before it skips the oldest.
const NOTICE_CAPACITY: usize = 4096;

/// The in-memory store: leases and unit queues of one process.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Arc<dyn Clock>,
    runs: Mutex<queue::Runs>,
    leases: Mutex<lease::LeaseState>,
    buckets: Mutex<buckets::BucketState>,
    user_active: tokio::sync::broadcast::Sender<UserId>,
    bucket_changes: tokio::sync::broadcast::Sender<leasehold_core::BucketId>,
    timings: Mutex<HashMap<String, u64>>,
    streaks: Mutex<HashMap<String, leasehold_core::PassStreak>>,
    /// Woken after every queue call that may have changed a run (and so
    /// logged events): what `wait_for_events` waits on.
    changed: tokio::sync::Notify,
}

impl MemoryStore {
    /// A store on tokio's clock (wall time anchored now; paused time in tests).
    pub fn new() -> Self {
        Self::with_clock(Arc::new(TokioClock::new()))
    }

    /// A store reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let (user_active, _) = tokio::sync::broadcast::channel(NOTICE_CAPACITY);
        let (bucket_changes, _) = tokio::sync::broadcast::channel(NOTICE_CAPACITY);
        Self {
            inner: Arc::new(Inner {
                clock,
                runs: Mutex::new(queue::Runs::default()),
                leases: Mutex::new(lease::LeaseState::default()),
                buckets: Mutex::new(buckets::BucketState::default()),
                user_active,
                bucket_changes,
                timings: Mutex::new(HashMap::new()),
                streaks: Mutex::new(HashMap::new()),
                changed: tokio::sync::Notify::new(),
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}
