//! An in-memory [`AccountDirectory`] for tests and benchmarks: account ->
//! user, set by the test.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{LeaseKey, UserId};
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
}
