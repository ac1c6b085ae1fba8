//! Leases: one owner per key at a time, fenced.
//!
//! See [`LeaseStore`] for the contract.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::errors::LeaseError;
use crate::ids::{LeaseKey, WorkerId};
use crate::ttl::Ttl;

/// A number that strictly increases with every successful claim of one key.
///
/// Downstream storage keeps the highest token it has seen per key and rejects
/// writes that carry a lower one, so an owner that paused past its lease (and
/// was replaced) can never write over its successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A held lease: who holds which key, under which token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The leased key.
    pub key: LeaseKey,
    /// The holder.
    pub owner: WorkerId,
    /// The fencing token of this claim.
    pub token: FencingToken,
}

/// Leases, the live set and the worker registry. Tiers and user presence
/// are [`Presence`](crate::Presence), bucket leases are
/// [`BucketLeases`](crate::BucketLeases); every leasehold store is all three.
///
/// # Contract
///
/// * **Claim** is atomic: at most one holder per key at any instant. A
///   successful claim returns a [`Lease`] whose [`FencingToken`] is strictly
///   greater than every token ever returned for that key (tokens survive
///   release and expiry). A claim of a held, unexpired key returns `None`,
///   even when the caller is the holder. A key need not be live to be claimed;
///   callers draw keys from [`LeaseStore::live_keys`].
/// * A lease **expires** `ttl` after its claim or last renew; once expired it
///   is free to claim and every renew or release of it answers `false`.
/// * **Renew** and **release** are checked against owner *and* token: they act
///   only while the exact lease given is still the current one, and answer
///   `false` otherwise (taken over, expired, dropped). A caller whose renew
///   answers `false` has lost the key and must stop working on it at once.
/// * [`LeaseStore::raise_token`] is the repair for a store that lost its
///   counters (a Redis restarted without its data, or flushed): downstream
///   storage still holds the tokens it has seen, and a caller that finds one
///   at or above its own raises the key's counter past it, so its next claim
///   is above every token ever stored. It never lowers a counter and leaves
///   the current lease, if any, as it is.
/// * **Deployment**: [`LeaseStore::bind_deployment`] records, once, which
///   deployment (whose database) this key space belongs to, and answers the
///   recorded one ever after, so two deployments that share a key space can
///   tell and refuse to run on it.
/// * [`LeaseStore::mark_not_live`] removes the key from the live set and drops
///   its lease (and, in a store that is also a [`Presence`](crate::Presence),
///   its tier): the owner's next renew answers `false`.
/// * **Workers** register with a TTL and must re-register before it runs out
///   to stay counted in [`LeaseStore::live_workers`].
/// * TTLs and graces are [`Ttl`]s: never zero, checked where they are made.
///   Backend failures are [`LeaseError::Backend`]; a caller that gets
///   one from `renew` must treat the lease as lost once its TTL has passed.
///
/// # Example
///
/// One key, two workers: `a` claims and renews it, stalls past its TTL, and
/// `b` takes over under a greater token; `a`'s lease then acts on nothing.
/// (On the memory backend, here on tokio's paused clock; a Redis store from
/// `leasehold-redis` behaves the same. The program `examples/library/lease_job.rs`
/// runs this loop on either, picked from a URL.)
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{LeaseKey, LeaseStore, Ttl, WorkerId};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = leasehold_mem::MemoryStore::new();
/// let key = LeaseKey::new("nightly-report")?;
/// let (a, b) = (WorkerId::new("worker-a")?, WorkerId::new("worker-b")?);
/// let ttl = Ttl::from_secs(10);
///
/// let lease = store.claim(&key, &a, ttl).await?.expect("the key is free");
/// // While a holds the key, b's claim answers None.
/// assert!(store.claim(&key, &b, ttl).await?.is_none());
/// // a renews while it works...
/// assert!(store.renew(&lease, ttl).await?);
/// // ...until it stalls for longer than its TTL: the lease expires.
/// tokio::time::sleep(Duration::from_secs(11)).await;
/// let takeover = store.claim(&key, &b, ttl).await?.expect("the lease expired");
/// assert!(takeover.token > lease.token, "storage fenced by the token refuses a's late writes");
///
/// // a is fenced: renew and release check owner and token, and answer false.
/// assert!(!store.renew(&lease, ttl).await?);
/// assert!(!store.release(&lease).await?);
/// assert_eq!(store.holder(&key).await?, Some(takeover.clone()));
/// // b releases when done; the key is free, and the next claim's token is greater still.
/// assert!(store.release(&takeover).await?);
/// let next = store.claim(&key, &a, ttl).await?.expect("the key was released");
/// assert!(next.token > takeover.token);
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Claims `key` for `owner` for `ttl`. `Some(lease)` iff the caller now holds it.
    async fn claim(&self, key: &LeaseKey, owner: &WorkerId, ttl: Ttl) -> Result<Option<Lease>, LeaseError>;

    /// Claims each key in order (see [`LeaseStore::claim`]); returns the leases won.
    /// Backends may batch this into fewer round trips.
    async fn claim_many(&self, keys: &[LeaseKey], owner: &WorkerId, ttl: Ttl) -> Result<Vec<Lease>, LeaseError> {
        let mut won = Vec::new();
        for key in keys {
            if let Some(lease) = self.claim(key, owner, ttl).await? {
                won.push(lease);
            }
        }
        Ok(won)
    }

    /// Extends `lease` to `ttl` from now. `true` iff it was still current.
    async fn renew(&self, lease: &Lease, ttl: Ttl) -> Result<bool, LeaseError>;

    /// Renews each lease (see [`LeaseStore::renew`]); one answer per lease, in order.
    async fn renew_many(&self, leases: &[Lease], ttl: Ttl) -> Result<Vec<bool>, LeaseError> {
        let mut answers = Vec::with_capacity(leases.len());
        for lease in leases {
            answers.push(self.renew(lease, ttl).await?);
        }
        Ok(answers)
    }

    /// Deletes `lease`. `true` iff it was still current (and is now free).
    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError>;

    /// Raises the token counter of `key` so that every later claim of it
    /// returns a token strictly greater than `past` (and than every token
    /// returned before). A counter already at or above `past` is left as it
    /// is; the current lease, if any, is untouched. Used after the store lost
    /// its counters, when storage reports a token the store no longer knows.
    async fn raise_token(&self, key: &LeaseKey, past: FencingToken) -> Result<(), LeaseError>;

    /// Records `deployment` as the deployment this key space belongs to, if
    /// none is recorded yet (atomically: of two racing callers one wins), and
    /// returns the recorded one. A caller that gets back another id shares
    /// the key space with another deployment and must not use it.
    async fn bind_deployment(&self, deployment: &str) -> Result<String, LeaseError>;

    /// The current holder of `key`, if any.
    async fn holder(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError>;

    /// Adds `key` to the live set (idempotent).
    async fn mark_live(&self, key: &LeaseKey) -> Result<(), LeaseError>;

    /// Removes `key` from the live set and drops its lease and tier (idempotent).
    async fn mark_not_live(&self, key: &LeaseKey) -> Result<(), LeaseError>;

    /// Every key in the live set, sorted.
    async fn live_keys(&self) -> Result<Vec<LeaseKey>, LeaseError>;

    /// Registers (or refreshes) `worker` for `ttl`.
    async fn register_worker(&self, worker: &WorkerId, ttl: Ttl) -> Result<(), LeaseError>;

    /// Removes `worker` from the registry (idempotent).
    async fn deregister_worker(&self, worker: &WorkerId) -> Result<(), LeaseError>;

    /// Registered workers whose registration has not expired, sorted.
    async fn live_workers(&self) -> Result<Vec<WorkerId>, LeaseError>;
}
