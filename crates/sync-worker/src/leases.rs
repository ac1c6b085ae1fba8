//! What sync-worker needs from its lease store, as one object: per-account
//! leases, the live set and workers ([`LeaseStore`]), bucket leases
//! ([`BucketLeases`]), and tiers and presence ([`Presence`]). Every
//! leasehold store is all three.

use leasehold_core::{BucketId, BucketLeases, Lease, LeaseError, LeaseKey, LeaseStore, Presence};

/// A store that is a [`LeaseStore`], [`BucketLeases`] and [`Presence`]. An
/// `Arc<dyn Leases>` converts to each trait object.
pub trait Leases: LeaseStore + BucketLeases + Presence {}

impl<T: LeaseStore + BucketLeases + Presence> Leases for T {}

/// Tells the store that `account` (in `bucket`) was added: it joins the live
/// set (per-account leases) and its bucket's weight (bucket leases), so
/// workers take it up under either ownership.
pub async fn account_added(store: &dyn Leases, account: &LeaseKey, bucket: BucketId) -> Result<(), LeaseError> {
    store.mark_live(account).await?;
    store.add_weight(bucket, 1).await.map(|_| ())
}

/// Tells the store that `account` (in `bucket`) was removed: its owner stops
/// it at its next tick under either ownership.
pub async fn account_removed(store: &dyn Leases, account: &LeaseKey, bucket: BucketId) -> Result<(), LeaseError> {
    store.mark_not_live(account).await?;
    store.add_weight(bucket, -1).await.map(|_| ())
}

/// Who holds `account` (in `bucket`): its own lease, or its bucket's, given
/// as a lease of the account.
pub async fn account_holder(
    store: &dyn Leases,
    account: &LeaseKey,
    bucket: BucketId,
) -> Result<Option<Lease>, LeaseError> {
    if let Some(lease) = store.holder(account).await? {
        return Ok(Some(lease));
    }
    Ok(store.bucket_holder(bucket).await?.map(|b| Lease { key: account.clone(), owner: b.owner, token: b.token }))
}
