//! Which user owns which account, and which accounts a lease bucket holds.
//! The SQL storage implements
//! [`AccountDirectory`] ([`crate::storage::Storage`]); with the `test-support`
//! feature, `testing::MemoryDirectory` serves tests and benchmarks.

use async_trait::async_trait;
use leasehold_core::{BucketCount, BucketId, FencingToken, LeaseKey, UserId};

use crate::errors::DirectoryError;

/// An account of a lease bucket, with its user: what a worker that claims
/// the bucket starts, read in one query with no lookup per account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAccount {
    /// The bucket it hashes into.
    pub bucket: BucketId,
    /// The account.
    pub key: LeaseKey,
    /// The user owning it, `None` when unknown.
    pub user: Option<UserId>,
}

/// Maps accounts to the users who own them, and lease buckets to their accounts.
#[async_trait]
pub trait AccountDirectory: Send + Sync + 'static {
    /// The user owning `account`, `None` when unknown.
    async fn user_of(&self, account: &LeaseKey) -> Result<Option<UserId>, DirectoryError>;

    /// The users owning each of `accounts`, in order. Implementations may
    /// batch this into one query.
    async fn users_of(&self, accounts: &[LeaseKey]) -> Result<Vec<Option<UserId>>, DirectoryError> {
        let mut users = Vec::with_capacity(accounts.len());
        for account in accounts {
            users.push(self.user_of(account).await?);
        }
        Ok(users)
    }

    /// How many lease buckets accounts hash into.
    fn bucket_count(&self) -> BucketCount;

    /// The accounts of `buckets`, each with its bucket and user, sorted by account.
    async fn accounts_in_buckets(&self, buckets: &[BucketId]) -> Result<Vec<BucketAccount>, DirectoryError>;

    /// How many accounts each bucket holds: with `only`, one answer per
    /// bucket named (0 for an empty one); without, every bucket that holds any.
    async fn bucket_weights(&self, only: Option<&[BucketId]>) -> Result<Vec<(BucketId, u64)>, DirectoryError>;

    /// The highest fencing token stored for an account of `bucket` (0 when
    /// none, or when this directory keeps no tokens).
    async fn highest_token_in_bucket(&self, bucket: BucketId) -> Result<FencingToken, DirectoryError>;
}
