//! The shared conformance suite on the memory backend, each test on a fresh
//! store with its own manual clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::conformance::{Backend, Fixture, TimeControl};
use leasehold_core::ManualClock;
use leasehold_mem::MemoryStore;

struct MemBackend;

struct ManualTime(Arc<ManualClock>);

#[async_trait]
impl TimeControl for ManualTime {
    async fn advance(&self, by: Duration) {
        self.0.advance(by);
    }
}

#[async_trait]
impl Backend for MemBackend {
    async fn fresh(&self) -> Fixture {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::with_clock(clock.clone());
        Fixture {
            queue: Arc::new(store.clone()),
            leases: Arc::new(store.clone()),
            buckets: Arc::new(store.clone()),
            presence: Arc::new(store),
            time: Arc::new(ManualTime(clock)),
        }
    }
}

leasehold_core::conformance_suite!(MemBackend);
