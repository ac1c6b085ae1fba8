//! Time, made replaceable so TTL and idle-time behaviour is testable.
//!
//! Backends that keep time themselves (the memory backend) read a [`Clock`];
//! the Redis backend uses the server's clock. [`TokioClock`] follows tokio's
//! clock, so `tokio::time::pause` / `advance` drive it in tests; [`ManualClock`]
//! moves only when told to.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock milliseconds (since the Unix epoch).
pub trait Clock: Send + Sync + Debug + 'static {
    /// Milliseconds since the Unix epoch. Never goes backwards for one clock.
    fn now_ms(&self) -> u64;
}

fn system_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_ms()
    }
}

/// Wall-clock time that advances with tokio's clock: anchored to the system
/// time when made, then moved by `tokio::time::Instant`, so a paused tokio
/// runtime (`#[tokio::test(start_paused = true)]`) controls it.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    anchor_ms: u64,
    anchor: tokio::time::Instant,
}

impl TokioClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        Self { anchor_ms: system_ms(), anchor: tokio::time::Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.anchor_ms + tokio::time::Instant::now().saturating_duration_since(self.anchor).as_millis() as u64
    }
}

/// A clock that moves only when [`ManualClock::advance`] is called.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self { now: AtomicU64::new(start_ms) }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(1_700_000_000_000)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        let t0 = clock.now_ms();
        tokio::time::advance(Duration::from_secs(120)).await;
        assert_eq!(clock.now_ms() - t0, 120_000);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(10);
        assert_eq!(clock.now_ms(), 10);
        clock.advance(Duration::from_millis(5));
        assert_eq!(clock.now_ms(), 15);
    }
}
