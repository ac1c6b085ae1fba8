//! Which user owns which account. The SQL storage implements
//! [`AccountDirectory`] ([`crate::storage::Storage`]); with the `test-support`
//! feature, `MemoryDirectory` serves tests and benchmarks.

#[cfg(feature = "test-support")]
use std::collections::HashMap;
#[cfg(feature = "test-support")]
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::{LeaseKey, UserId};
#[cfg(feature = "test-support")]
use parking_lot::RwLock;

use crate::errors::DirectoryError;

/// Maps accounts to the users who own them.
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
}

/// An in-memory directory. Cheap to clone; clones share state.
#[cfg(feature = "test-support")]
#[derive(Debug, Clone, Default)]
pub struct MemoryDirectory {
    map: Arc<RwLock<HashMap<LeaseKey, UserId>>>,
}

#[cfg(feature = "test-support")]
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

#[cfg(feature = "test-support")]
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
