//! Bucket ownership's state in the coordinator: the buckets held, and the
//! accounts running under each (the loop's part is in `buckets.rs`).

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU32;

use leasehold_core::{
    BalancePolicy, BucketCount, BucketId, BucketLease, FencingToken, Lease, LeaseKey, Tier, UserId, WorkerId,
};
use tokio::time::Instant;

use crate::deadline::LeaseDeadline;

/// One held bucket.
pub(super) struct HeldBucket {
    pub(super) lease: BucketLease,
    /// Until when this worker may act on it (its TTL less a tenth from the
    /// last renew sent, as for account leases).
    pub(super) deadline: Instant,
    /// The same deadline as its runners hold it: one cell for the bucket, so
    /// a renew moves it once, whatever the number of accounts.
    pub(super) runners_deadline: LeaseDeadline,
    /// The change count its accounts were last read at.
    pub(super) seen: Option<u64>,
    /// A read of its accounts is under way.
    pub(super) reading: bool,
    /// The accounts this worker runs under it (so dropping or reading a
    /// bucket costs its accounts, not every owned one).
    pub(super) accounts: BTreeSet<LeaseKey>,
}

/// A held bucket's accounts new to this worker, as a read found them.
#[derive(Debug)]
pub(super) struct BucketStart {
    pub(super) bucket: BucketId,
    /// The bucket's token when its accounts were read.
    pub(super) token: FencingToken,
    pub(super) leases: Vec<Lease>,
    /// The user of each lease, read with it.
    pub(super) users: Vec<Option<UserId>>,
}

/// A held bucket's new accounts, their tiers read, waiting to start.
pub(super) struct PendingStart {
    pub(super) start: BucketStart,
    pub(super) tiers: Vec<Tier>,
}

/// Bucket ownership's state in the coordinator.
pub(super) struct BucketOwnership {
    pub(super) count: BucketCount,
    pub(super) policy: BalancePolicy,
    pub(super) held: HashMap<BucketId, HeldBucket>,
    pub(super) next_maintenance: Instant,
    pub(super) repair_cursor: u32,
}

impl BucketOwnership {
    /// The state of a worker that holds nothing yet, its accounts hashed into `count` buckets.
    pub(super) fn new(count: BucketCount, worker: &WorkerId) -> Self {
        // Workers start their repair at different buckets.
        let spread = worker.as_str().bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        Self {
            count,
            policy: BalancePolicy::new(10, NonZeroU32::new(256).unwrap_or(NonZeroU32::MIN), 2).unwrap_or_default(),
            held: HashMap::new(),
            next_maintenance: Instant::now(),
            repair_cursor: spread % count.get(),
        }
    }

    pub(super) fn leases(&self) -> Vec<BucketLease> {
        self.held.values().map(|h| h.lease.clone()).collect()
    }

    /// `account` now runs under `bucket`.
    pub(super) fn note_account(&mut self, bucket: BucketId, account: &LeaseKey) {
        if let Some(h) = self.held.get_mut(&bucket) {
            h.accounts.insert(account.clone());
        }
    }

    /// `account` no longer runs under `bucket`.
    pub(super) fn forget_account(&mut self, bucket: BucketId, account: &LeaseKey) {
        if let Some(h) = self.held.get_mut(&bucket) {
            h.accounts.remove(account);
        }
    }

    /// The deadline the runners of `bucket` share, if it is held.
    pub(super) fn runners_deadline(&self, bucket: BucketId) -> Option<LeaseDeadline> {
        self.held.get(&bucket).map(|h| h.runners_deadline.clone())
    }

    /// The accounts running under `bucket`.
    pub(super) fn accounts_of(&self, bucket: BucketId) -> Vec<LeaseKey> {
        self.held.get(&bucket).map(|h| h.accounts.iter().cloned().collect()).unwrap_or_default()
    }
}
