//! An in-memory [`AccountDirectory`] for tests and benchmarks: account ->
//! user, set by the test. Accounts hash into [`BucketCount::DEFAULT`] buckets.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{BucketCount, BucketId, FencingToken, LeaseKey, UserId};
use parking_lot::RwLock;

use crate::directory::AccountDirectory;
use crate::errors::DirectoryError;

/// An in-memory directory. Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct MemoryDirectory {
    map: Arc<RwLock<HashMap<LeaseKey, UserId>>>,
}

impl MemoryDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `user` owns `account` (replacing any earlier owner).
    pub fn insert(&self, account: LeaseKey, user: UserId) {
        self.map.write().insert(account, user);
    }

    /// Forgets `account`.
    pub fn remove(&self, account: &LeaseKey) {
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

    async fn accounts_in_buckets(&self, buckets: &[BucketId]) -> Result<Vec<(BucketId, LeaseKey)>, DirectoryError> {
        let count = BucketCount::DEFAULT;
        let wanted: std::collections::HashSet<&BucketId> = buckets.iter().collect();
        let mut found: Vec<(BucketId, LeaseKey)> = self
            .map
            .read()
            .keys()
            .map(|k| (count.bucket_of(k.as_str()), k.clone()))
            .filter(|(b, _)| wanted.contains(b))
            .collect();
        found.sort_by(|a, b| a.1.cmp(&b.1));
        Ok(found)
    }

    async fn bucket_weights(&self) -> Result<Vec<(BucketId, u64)>, DirectoryError> {
        let mut weights: HashMap<BucketId, u64> = HashMap::new();
        for key in self.map.read().keys() {
            *weights.entry(BucketCount::DEFAULT.bucket_of(key.as_str())).or_insert(0) += 1;
        }
        Ok(weights.into_iter().collect())
    }

    async fn highest_token_in_bucket(&self, _bucket: BucketId) -> Result<FencingToken, DirectoryError> {
        // No tokens here: a fenced runner's own report is what the coordinator raises past.
        Ok(FencingToken(0))
    }
}
