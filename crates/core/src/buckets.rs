//! Bucket leases: ownership whose per-tick cost depends on what a worker
//! owns, not on how many keys exist.
//!
//! Keys (sync-worker's accounts) hash into a fixed number of buckets
//! ([`BucketCount`], 4,096 by default, recorded at first start). A worker
//! leases buckets, and owning a bucket means owning its keys. Each bucket
//! has a **weight**, the number of its keys, and workers share the total
//! weight fairly: see [`BucketLeases`] for the contract and
//! [`BalancePolicy`] for the rules.

use std::fmt;
use std::num::NonZeroU32;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::errors::{LeaseError, SpecError};
use crate::ids::WorkerId;
use crate::lease::FencingToken;
use crate::notices::Notices;
use crate::ttl::Ttl;

/// How many buckets keys hash into. Fixed for the life of a key space:
/// [`BucketLeases::bind_buckets`] records the first one given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BucketCount(NonZeroU32);

impl BucketCount {
    /// The largest count accepted.
    pub const MAX: u32 = 65_536;
    /// 4,096: at a million keys about 244 per bucket, and at 50 workers
    /// about 82 buckets each, so a bucket is a fine enough grain to balance.
    pub const DEFAULT: BucketCount = BucketCount(NonZeroU32::new(4096).expect("4096 is not zero"));

    /// A count of 1 to [`BucketCount::MAX`].
    pub fn new(count: u32) -> Result<Self, SpecError> {
        match NonZeroU32::new(count) {
            Some(n) if count <= Self::MAX => Ok(Self(n)),
            _ => Err(SpecError::BadBucketCount { count }),
        }
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0.get()
    }

    /// The bucket of `key`: FNV-1a (64 bit) of its bytes, modulo the count.
    /// Stable across versions and platforms, as it must be: a key's bucket is
    /// stored beside it (sync-worker's accounts table has a bucket column).
    pub fn bucket_of(self, key: &str) -> BucketId {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let hash = key.bytes().fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        // The remainder is below the count, itself a u32.
        BucketId((hash % u64::from(self.get())) as u32)
    }
}

impl Default for BucketCount {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for BucketCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

/// One bucket, `0..count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BucketId(pub u32);

impl fmt::Display for BucketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A subscription to change notices: the bucket of each
/// [`BucketLeases::add_weight`], in order, from the moment of subscribing
/// (see [`Notices`]). Notices are hints; the change counts are the record.
pub type BucketChanges = Notices<BucketId>;

/// A held bucket lease. Its token fences every write of the bucket's keys:
/// a bucket's token only grows, so storage that keeps the highest token it
/// has seen per key refuses a stale owner's writes exactly as with per-key
/// leases.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketLease {
    /// The bucket.
    pub bucket: BucketId,
    /// The holder.
    pub owner: WorkerId,
    /// The fencing token of this claim.
    pub token: FencingToken,
}

/// The rules of one balancing step ([`BucketLeases::tick`]).
///
/// With `W` the total weight and `n` the live workers, a worker's **share**
/// is `W ÷ n` and its **cap** `ceil((100 + slack_pct) × W ÷ (100 × n))`.
/// * A worker under its share claims free buckets (released, expired, or
///   never owned, oldest first), looking at no more than `max_claims` of
///   them, while it stays under its share; it skips a bucket that would take
///   it over its cap, unless it holds nothing (so a bucket heavier than any
///   cap still gets an owner).
/// * A worker over its cap sheds buckets, heaviest first, until it is back
///   under the cap, never going under its share by doing so.
/// * A worker over its share but within its cap sheds at most `max_sheds`
///   buckets a tick, each only if moving it to the least loaded live worker
///   narrows the gap between them (`2 × weight ≤ gap`) and keeps it at or
///   over its share. This is "steal 1–2 per tick from the most loaded",
///   done by the loaded worker so that it can stop the bucket's work first.
///
/// The balance this reaches: every worker within its cap, up to the weight
/// of one bucket (a bucket is never split), and no two workers further apart
/// than twice the weight of the lightest bucket that could move between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalancePolicy {
    slack_pct: u32,
    max_claims: NonZeroU32,
    max_sheds: u32,
}

impl BalancePolicy {
    /// A policy; `slack_pct` is 0 to 100.
    pub fn new(slack_pct: u32, max_claims: NonZeroU32, max_sheds: u32) -> Result<Self, SpecError> {
        if slack_pct > 100 {
            return Err(SpecError::BadBalanceSlack { slack_pct });
        }
        Ok(Self { slack_pct, max_claims, max_sheds })
    }

    /// How far over its share a worker may be, in percent.
    pub fn slack_pct(&self) -> u32 {
        self.slack_pct
    }

    /// How many free buckets one tick looks at.
    pub fn max_claims(&self) -> u32 {
        self.max_claims.get()
    }

    /// How many buckets one tick sheds while its worker is within its cap.
    pub fn max_sheds(&self) -> u32 {
        self.max_sheds
    }

    /// The cap of each of `workers` workers sharing `total`.
    pub fn cap(&self, total: u64, workers: u64) -> u64 {
        let workers = workers.max(1);
        let numerator = (100 + u64::from(self.slack_pct)) * total;
        numerator.div_ceil(100 * workers)
    }

    /// Which of `kept` (bucket, weight) a worker with `load` sheds this tick,
    /// given the `total` weight, the number of live `workers` and the least
    /// load among the others (`None` when it is alone). The rules are in the
    /// type's docs; backends that cannot call this (Lua) follow it step by step.
    pub fn sheds(
        &self,
        kept: &[(BucketId, u64)],
        mut load: u64,
        total: u64,
        workers: u64,
        least_other: Option<u64>,
    ) -> Vec<BucketId> {
        let workers = workers.max(1);
        let Some(least) = least_other else { return Vec::new() };
        // Heaviest first; ties by bucket, so every backend picks the same.
        let mut order: Vec<(BucketId, u64)> = kept.to_vec();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let keeps_share = |load: u64, w: u64| (load - w) * workers >= total;
        let cap = self.cap(total, workers);
        let mut shed = Vec::new();
        let mut taken = vec![false; order.len()];
        while load > cap {
            let Some(i) = (0..order.len()).find(|&i| !taken[i] && order[i].1 <= load && keeps_share(load, order[i].1))
            else {
                break;
            };
            taken[i] = true;
            load -= order[i].1;
            shed.push(order[i].0);
        }
        let mut gap = load.saturating_sub(least);
        let mut fine = 0;
        while fine < self.max_sheds && load * workers > total {
            let Some(i) = (0..order.len())
                .find(|&i| !taken[i] && order[i].1 > 0 && 2 * order[i].1 <= gap && keeps_share(load, order[i].1))
            else {
                break;
            };
            taken[i] = true;
            load -= order[i].1;
            gap -= 2 * order[i].1;
            shed.push(order[i].0);
            fine += 1;
        }
        shed
    }
}

impl Default for BalancePolicy {
    /// 10 % slack, 64 claims and 2 sheds a tick.
    fn default() -> Self {
        Self { slack_pct: 10, max_claims: NonZeroU32::new(64).expect("64 is not zero"), max_sheds: 2 }
    }
}

/// What [`BucketLeases::bind_buckets`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketBinding {
    /// The key space's bucket count.
    pub count: BucketCount,
    /// Whether this call recorded it: the key space was new, or lost its
    /// state (a Redis restarted without its data, or flushed), so its
    /// weights must be given again ([`BucketLeases::set_weights`]).
    pub recorded_now: bool,
}

/// What one [`BucketLeases::tick`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketTick {
    /// The held leases that were still current, now renewed (in the order
    /// given). Includes `shed`.
    pub kept: Vec<BucketLease>,
    /// The held leases that were not current (expired, or taken over): the
    /// caller must stop their keys' work at once.
    pub lost: Vec<BucketLease>,
    /// Buckets claimed this tick.
    pub claimed: Vec<BucketLease>,
    /// Kept buckets the caller must hand on: stop their keys' work, then
    /// [`BucketLeases::release_buckets`] them. Until released they are still
    /// the caller's (no one else can claim them); a caller that passes one
    /// to its next tick again keeps it counted in its load.
    pub shed: Vec<BucketLease>,
    /// Live workers, this one included.
    pub workers: u64,
    /// The total weight of all buckets.
    pub total_weight: u64,
    /// This worker's load after the tick: kept plus claimed, minus shed.
    pub load: u64,
    /// The change count of each kept or claimed bucket (in that order): a
    /// count that differs from the one the caller saw last means its keys
    /// changed since ([`BucketLeases::add_weight`] and
    /// [`BucketLeases::set_weights`] count up), so the caller reads them again.
    pub versions: Vec<(BucketId, u64)>,
    /// The cap of each worker.
    pub cap: u64,
    /// How long from this tick until the soonest lease still running (of
    /// any worker, this one's just renewed included) runs out; `None` when
    /// no lease runs. Live workers renew well before their leases run out,
    /// so one that comes before the caller's next tick is most likely a
    /// dead worker's: its buckets are free from then, and a caller that
    /// ticks again just after it claims them a tick sooner.
    pub soonest_expiry: Option<std::time::Duration>,
}

/// Bucket leases: who owns which bucket, and a fair share of the weight for
/// each live worker.
///
/// # Contract
///
/// * **Tokens** follow [`crate::LeaseStore`]'s: every claim of a bucket
///   gets a token strictly greater than every earlier one of that bucket,
///   through release and expiry; [`BucketLeases::raise_bucket_token`] is the
///   repair for a store that lost its counters.
/// * **One holder**: at any instant a bucket has at most one current lease.
///   A lease is current from its claim until `ttl` after its last renew, or
///   until it is released.
/// * **Weights** are kept by the callers: [`BucketLeases::add_weight`] as
///   keys come and go, [`BucketLeases::set_weights`] to repair (from the
///   keys' own table) after the store lost them. A bucket of weight 0 is
///   never claimed; one that gains weight becomes claimable. Each call counts
///   up the bucket's **change count**, which every tick reports for the
///   buckets it keeps or claims: this is how an owner learns, within one
///   tick and without a message that could be lost, that a key was added to
///   or removed from its bucket.
/// * **Change notices**: [`BucketLeases::add_weight`] also publishes its
///   bucket to every current [`BucketChanges`] subscription, so an owner can
///   take up an added key at once instead of at its next tick. A notice is a
///   hint: one published while a subscriber reconnects, or one it fell too
///   far behind to keep, is lost; the change count stays the record.
/// * **A tick** ([`BucketLeases::tick`]) is one worker's whole periodic
///   call, atomic: it registers the worker as live for `ttl`, forgets
///   workers whose registration ran out, renews the held leases that are
///   still current, and applies [`BalancePolicy`]. Its cost depends on the
///   leases held, the claims looked at and the workers that died since, never
///   on the number of buckets or keys.
/// * **Hand-off is graceful**: a shed bucket stays its owner's until the
///   owner releases it, so the owner can stop the bucket's work before
///   anyone else can start it. A worker that stops ticking loses its buckets
///   `ttl` after its last tick; they are then free to claim.
/// * [`BucketLeases::leave`] releases a worker's leases and forgets it at
///   once (a clean shutdown), so the others take its buckets on their next
///   tick.
#[async_trait]
pub trait BucketLeases: Send + Sync + 'static {
    /// Records `count` as the key space's bucket count if none is recorded
    /// yet (of two racing callers one wins) and returns the recorded one,
    /// saying whether this call recorded it. A caller given another count
    /// must use that one, or refuse to run. Callers bind again now and then:
    /// a binding recorded anew means the store lost its state.
    async fn bind_buckets(&self, count: BucketCount) -> Result<BucketBinding, LeaseError>;

    /// Adds `delta` to `bucket`'s weight (never below 0) and counts up its
    /// change count (also for a `delta` of 0: a key of it changed); returns
    /// the new weight.
    async fn add_weight(&self, bucket: BucketId, delta: i64) -> Result<u64, LeaseError>;

    /// Sets each bucket's weight, keeping the total consistent, and counts up
    /// each one's change count (a repair: no change notice is published).
    async fn set_weights(&self, weights: &[(BucketId, u64)]) -> Result<(), LeaseError>;

    /// Subscribes to change notices: the bucket of each
    /// [`BucketLeases::add_weight`] made from now on, in order.
    async fn subscribe_bucket_changes(&self) -> Result<BucketChanges, LeaseError>;

    /// Counts `owner` as a live worker for `ttl`, holding nothing, without
    /// claiming: workers that start together join first, so their first
    /// ticks already share the weight instead of one claiming it all and
    /// shedding it again.
    async fn join(&self, owner: &WorkerId, ttl: Ttl) -> Result<(), LeaseError>;

    /// `owner`'s balancing step (see the contract): `held` are the leases it
    /// believes it holds.
    async fn tick(
        &self,
        owner: &WorkerId,
        held: &[BucketLease],
        ttl: Ttl,
        policy: &BalancePolicy,
    ) -> Result<BucketTick, LeaseError>;

    /// Releases each lease that is still current; one answer per lease.
    async fn release_buckets(&self, leases: &[BucketLease]) -> Result<Vec<bool>, LeaseError>;

    /// Releases `held` (those still current) and forgets `owner` as a live worker.
    async fn leave(&self, owner: &WorkerId, held: &[BucketLease]) -> Result<(), LeaseError>;

    /// The current lease of `bucket`, if any.
    async fn bucket_holder(&self, bucket: BucketId) -> Result<Option<BucketLease>, LeaseError>;

    /// The weight of `bucket`.
    async fn weight(&self, bucket: BucketId) -> Result<u64, LeaseError>;

    /// Raises `bucket`'s token counter so its next claim's token exceeds
    /// `past`; never lowers it, and leaves the current lease as it is.
    async fn raise_bucket_token(&self, bucket: BucketId, past: FencingToken) -> Result<(), LeaseError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(i: u32) -> BucketId {
        BucketId(i)
    }

    #[test]
    fn counts_are_checked_and_buckets_stable() {
        assert!(BucketCount::new(0).is_err());
        assert!(BucketCount::new(65_537).is_err());
        let count = BucketCount::new(4096).unwrap();
        assert_eq!(count, BucketCount::DEFAULT);
        // Fixed values: a change of hash would move every stored key.
        assert_eq!(count.bucket_of(""), BucketId((0xcbf2_9ce4_8422_2325_u64 % 4096) as u32));
        assert_eq!(count.bucket_of("a"), BucketId((0xaf63_dc4c_8601_ec8c_u64 % 4096) as u32));
        assert!(BucketCount::new(1).unwrap().bucket_of("anything") == BucketId(0));
    }

    #[test]
    fn cap_rounds_up() {
        let policy = BalancePolicy::default();
        assert_eq!(policy.cap(10, 2), 6);
        assert_eq!(policy.cap(0, 3), 0);
        assert_eq!(policy.cap(1_000_000, 8), 137_500);
        assert!(BalancePolicy::new(101, NonZeroU32::MIN, 1).is_err());
    }

    #[test]
    fn fine_sheds_narrow_the_gap_and_keep_the_share() {
        let policy = BalancePolicy::default();
        let kept: Vec<_> = (0..6).map(|i| (b(i), 1)).collect();
        // 6 against 4 of 10: one moves, 5/5.
        assert_eq!(policy.sheds(&kept, 6, 10, 2, Some(4)).len(), 1);
        // 5 against 5: nothing.
        assert!(policy.sheds(&kept[..5], 5, 10, 2, Some(5)).is_empty());
        // Alone: nothing.
        assert!(policy.sheds(&kept, 6, 6, 1, None).is_empty());
        // A bucket too heavy to narrow the gap stays.
        assert!(policy.sheds(&[(b(0), 3), (b(1), 3)], 6, 10, 2, Some(4)).is_empty());
    }

    #[test]
    fn over_the_cap_sheds_down_to_it_at_once() {
        let policy = BalancePolicy::default();
        let kept: Vec<_> = (0..100).map(|i| (b(i), 1)).collect();
        // 100 held of 100, a second worker with nothing: cap 55.
        let shed = policy.sheds(&kept, 100, 100, 2, Some(0));
        assert_eq!(shed.len(), 45 + 2, "down to the cap, then two fine steps");
        // Heaviest first, never under the share.
        let kept = [(b(0), 40), (b(1), 30), (b(2), 20), (b(3), 10)];
        let shed = policy.sheds(&kept, 100, 100, 2, Some(0));
        assert_eq!(shed, vec![b(0), b(3)], "40 then 10 (30 or 20 would go under the share of 50)");
    }
}
