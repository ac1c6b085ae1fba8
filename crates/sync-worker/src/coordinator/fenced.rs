//! Backing off accounts whose runners were fenced.
//!
//! A runner is fenced when storage holds a token at or above its own. While
//! this worker still holds the lease, that means the lease store's counter
//! fell behind storage (a Redis restarted without its data, or flushed): the
//! coordinator raises the counter past the stored token and claims again.
//! The first re-claim goes ahead at once, since the raise repairs the usual
//! cause; a key fenced again soon after waits longer each time, so a cause
//! the raise does not cure (another deployment writing the same database,
//! say) costs one short database statement per backoff, never a loop of
//! take-overs, and never an IMAP login (a runner records its claim before
//! it connects).

use std::collections::HashMap;
use std::time::Duration;

use leasehold_core::LeaseKey;
use tokio::time::Instant;

/// Recent fencings per account, and when each may be claimed again.
#[derive(Debug, Default)]
pub(super) struct FenceBackoff {
    keys: HashMap<LeaseKey, Strikes>,
}

#[derive(Debug, Clone, Copy)]
struct Strikes {
    count: u32,
    not_before: Instant,
}

impl FenceBackoff {
    /// Records a fencing of `key` at `now`; returns how long until it may be
    /// claimed again: nothing the first time, then `base`, doubling up to `cap`.
    /// Strikes are forgotten once a key has stayed unfenced for `2 * cap`.
    pub(super) fn strike(&mut self, key: &LeaseKey, now: Instant, base: Duration, cap: Duration) -> Duration {
        self.keys.retain(|_, s| now < s.not_before + 2 * cap);
        let count = self.keys.get(key).map_or(0, |s| s.count) + 1;
        let wait = if count == 1 { Duration::ZERO } else { base.saturating_mul(1 << (count - 2).min(16)).min(cap) };
        self.keys.insert(key.clone(), Strikes { count, not_before: now + wait });
        wait
    }

    /// Whether `key` may be claimed at `now`.
    pub(super) fn allows(&self, key: &LeaseKey, now: Instant) -> bool {
        self.keys.get(key).is_none_or(|s| now >= s.not_before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_fencing_waits_nothing_then_the_wait_doubles_up_to_the_cap() {
        let k = LeaseKey::new("acct-1").unwrap();
        let other = LeaseKey::new("acct-2").unwrap();
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(5));
        let mut b = FenceBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.strike(&k, t0, base, cap), Duration::ZERO);
        assert!(b.allows(&k, t0));
        let waits: Vec<Duration> = (0..4).map(|_| b.strike(&k, t0, base, cap)).collect();
        assert_eq!(waits, [1, 2, 4, 5].map(Duration::from_secs));
        assert!(!b.allows(&k, t0 + Duration::from_secs(4)));
        assert!(b.allows(&k, t0 + Duration::from_secs(5)));
        assert!(b.allows(&other, t0), "keys back off independently");
        // Unfenced for twice the cap: the strikes are forgotten.
        let later = t0 + Duration::from_secs(5) + 2 * cap;
        assert_eq!(b.strike(&k, later, base, cap), Duration::ZERO);
    }
}
