//! At most [`ConnectRate::per_second`] new IMAP connections a second, per
//! process (`CONNECT_RATE`), each start drawn a little later at random: a
//! worker that takes over thousands of accounts at once, or whose accounts
//! all reconnect after their server came back, ramps up instead of
//! stampeding (EmailEngine's docs name exactly this startup storm as what
//! wakes the OOM killer).
//!
//! The limit is GCRA kept as a schedule: a burst of at most one second's
//! worth, then one start every `1 / rate`. Each waiter is given its start
//! time once, in arrival order, and sleeps once. A limiter that is asked
//! again on each wake-up (`governor`'s `until_ready`, which this replaced)
//! wakes every waiter about once an interval to give one of them the slot:
//! a takeover of 100,000 accounts at 20 a second would cost 2 million
//! wake-ups a second for an hour and a half.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The default of `CONNECT_RATE`.
pub const DEFAULT_CONNECT_RATE: u32 = 20;

/// The process's connection starts. Cheap to clone; clones share the limit.
#[derive(Debug, Clone)]
pub struct ConnectRate {
    per_second: NonZeroU32,
    /// GCRA's theoretical arrival time of the next start (`None`: none yet).
    next: Arc<Mutex<Option<Instant>>>,
}

impl PartialEq for ConnectRate {
    fn eq(&self, other: &Self) -> bool {
        self.per_second == other.per_second && Arc::ptr_eq(&self.next, &other.next)
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
        Self { per_second, next: Arc::default() }
    }

    /// Starts a second.
    pub fn per_second(&self) -> NonZeroU32 {
        self.per_second
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(1) / self.per_second.get()
    }

    /// Waits for this connection's turn: at once within the burst, else
    /// its booked time plus up to one interval at random, so that starts
    /// released together spread out.
    pub(crate) async fn wait_turn(&self) {
        let now = Instant::now();
        let at = self.reserve(now);
        if at > now {
            tokio::time::sleep_until(at + self.interval().mul_f64(fastrand::f64())).await;
        }
    }

    /// Books the next start at or after `now` and returns its time: at
    /// once while a second's worth of starts is left, then one an interval.
    fn reserve(&self, now: Instant) -> Instant {
        let interval = self.interval();
        let burst = interval * (self.per_second.get() - 1);
        let mut next = self.next.lock();
        let due = next.map_or(now, |n| n.max(now));
        let at = due.checked_sub(burst).map_or(now, |early| early.max(now));
        *next = Some(due + interval);
        at
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

    #[test]
    fn each_start_is_booked_once_in_arrival_order() {
        let rate = ConnectRate::new(NonZeroU32::new(20).unwrap());
        let now = Instant::now();
        let booked: Vec<Duration> = (0..100).map(|_| rate.reserve(now) - now).collect();
        // The burst: twenty at once; then one every 50 ms, in order.
        assert!(booked[..20].iter().all(|d| d.is_zero()), "{booked:?}");
        for (i, d) in booked[20..].iter().enumerate() {
            assert_eq!(*d, Duration::from_millis(50) * (i as u32 + 1), "start {} of {booked:?}", i + 20);
        }
        // After an idle spell the burst is back.
        let later = now + Duration::from_secs(60);
        assert_eq!(rate.reserve(later), later);
    }
}
