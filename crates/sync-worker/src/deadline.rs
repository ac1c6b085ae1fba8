//! The lease deadline a fence carries: until when its holder may commit.
//!
//! The coordinator moves it forward after each successful renew. A plain
//! shared cell, not a channel or a timer: extending it wakes nobody
//! (thousands of idle runners would otherwise wake on every renew); it is
//! read where it matters: before each poll, before each write transaction
//! begins (so between FETCH batches), and before each commit.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Until when the holder of a lease may write; shared by its clones.
#[derive(Debug, Clone, Default)]
pub struct LeaseDeadline(Option<Arc<Mutex<Instant>>>);

impl LeaseDeadline {
    /// A deadline at `at`, to be moved with [`LeaseDeadline::extend`].
    pub fn until(at: Instant) -> Self {
        Self(Some(Arc::new(Mutex::new(at))))
    }

    /// No deadline (tools and tests that write without a lease loop); the default.
    pub fn unbounded() -> Self {
        Self(None)
    }

    /// The deadline, `None` when unbounded.
    pub fn get(&self) -> Option<Instant> {
        self.0.as_ref().map(|d| *d.lock())
    }

    /// Moves the deadline to `at` (for every clone). No-op when unbounded.
    pub fn extend(&self, at: Instant) {
        if let Some(d) = &self.0 {
            *d.lock() = at;
        }
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        self.get().is_some_and(|at| Instant::now() >= at)
    }
}
