//! At most [`ConnectRate::per_second`] new IMAP connections a second, per
//! process (`CONNECT_RATE`), each start drawn a little later at random: a
//! worker that takes over thousands of accounts at once, or whose accounts
//! all reconnect after their server came back, ramps up instead of
//! stampeding (EmailEngine's docs name exactly this startup storm as what
//! wakes the OOM killer). A GCRA limiter (`governor`): a burst of at most
//! one second's worth, then one start every `1 / rate`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Jitter, Quota, RateLimiter};

/// The default of `CONNECT_RATE`.
pub const DEFAULT_CONNECT_RATE: u32 = 20;

/// The process's connection starts. Cheap to clone; clones share the limit.
#[derive(Clone)]
pub struct ConnectRate {
    per_second: NonZeroU32,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl std::fmt::Debug for ConnectRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRate").field("per_second", &self.per_second).finish_non_exhaustive()
    }
}

impl PartialEq for ConnectRate {
    fn eq(&self, other: &Self) -> bool {
        self.per_second == other.per_second && Arc::ptr_eq(&self.limiter, &other.limiter)
    }
}

impl Eq for ConnectRate {}

impl Default for ConnectRate {
    fn default() -> Self {
        Self::new(NonZeroU32::new(DEFAULT_CONNECT_RATE).unwrap_or(NonZeroU32::MIN))
    }
}

impl ConnectRate {
    /// At most `per_second` starts a second.
    pub fn new(per_second: NonZeroU32) -> Self {
        Self { per_second, limiter: Arc::new(RateLimiter::direct(Quota::per_second(per_second))) }
    }

    /// Starts a second.
    pub fn per_second(&self) -> NonZeroU32 {
        self.per_second
    }

    /// Waits for this connection's turn, plus up to one interval at random
    /// so that starts released together spread out.
    pub(crate) async fn wait_turn(&self) {
        let interval = Duration::from_secs(1) / self.per_second.get();
        self.limiter.until_ready_with_jitter(Jitter::up_to(interval)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_beyond_the_burst_wait_their_turn() {
        let rate = ConnectRate::new(NonZeroU32::new(50).unwrap());
        let started = std::time::Instant::now();
        // 50 at once (the burst), then 25 more at 50/s: about half a second.
        for _ in 0..75 {
            rate.wait_turn().await;
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(450), "75 starts at 50/s took {took:?}");
        assert!(took < Duration::from_secs(3), "75 starts at 50/s took {took:?}");
    }
}
