//! An in-memory [`AccountDirectory`] for tests and benchmarks: account ->
//! user, set by the test. Accounts hash into [`BucketCount::DEFAULT`] buckets.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{BucketCount, BucketId, FencingToken, LeaseKey, UserId};
use parking_lot::RwLock;

use crate::directory::{AccountDirectory, BucketAccount};
use crate::errors::DirectoryError;

/// An in-memory directory. Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct MemoryDirectory {
    map: Arc<RwLock<HashMap<LeaseKey, UserId>>>,
    /// The accounts of each bucket, so reading a bucket costs its accounts.
    buckets: Arc<RwLock<HashMap<BucketId, std::collections::BTreeSet<LeaseKey>>>>,
}

impl MemoryDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `user` owns `account` (replacing any earlier owner).
    pub fn insert(&self, account: LeaseKey, user: UserId) {
        let bucket = BucketCount::DEFAULT.bucket_of(account.as_str());
        self.buckets.write().entry(bucket).or_default().insert(account.clone());
        self.map.write().insert(account, user);
    }

    /// Forgets `account`.
    pub fn remove(&self, account: &LeaseKey) {
        let bucket = BucketCount::DEFAULT.bucket_of(account.as_str());
        if let Some(keys) = self.buckets.write().get_mut(&bucket) {
            keys.remove(account);
        }
        self.map.write().remove(account);
    }
}

#[async_trait]
impl AccountDirectory for MemoryDirectory {
    async fn user_of(&self, account: &LeaseKey) -> Result<Option<UserId>, DirectoryError> {
        Ok(self.map.read().get(account).cloned())
    }

    async fn users_of(&self, accounts: &[LeaseKey]) -> Result<Vec<Option<UserId>>, DirectoryError> {
        let map = self.map.read();
        Ok(accounts.iter().map(|a| map.get(a).cloned()).collect())
    }

    fn bucket_count(&self) -> BucketCount {
        BucketCount::DEFAULT
    }

    async fn accounts_in_buckets(&self, buckets: &[BucketId]) -> Result<Vec<BucketAccount>, DirectoryError> {
        let index = self.buckets.read();
        let users = self.map.read();
        let mut found: Vec<BucketAccount> = buckets
            .iter()
            .flat_map(|b| {
                index.get(b).into_iter().flatten().map(|k| BucketAccount {
                    bucket: *b,
                    key: k.clone(),
                    user: users.get(k).cloned(),
                })
            })
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    async fn bucket_weights(&self, only: Option<&[BucketId]>) -> Result<Vec<(BucketId, u64)>, DirectoryError> {
        let index = self.buckets.read();
        let count = |b: &BucketId| index.get(b).map_or(0, |keys| keys.len() as u64);
        Ok(match only {
            Some(only) => only.iter().map(|b| (*b, count(b))).collect(),
            None => index.keys().map(|b| (*b, count(b))).filter(|(_, n)| *n > 0).collect(),
        })
    }

    async fn highest_token_in_bucket(&self, _bucket: BucketId) -> Result<FencingToken, DirectoryError> {
        // No tokens here: a fenced runner's own report is what the coordinator raises past.
        Ok(FencingToken(0))
    }
}
