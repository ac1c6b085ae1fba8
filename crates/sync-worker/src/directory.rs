//! Which user owns which account. The SQL storage implements
//! [`AccountDirectory`] ([`crate::storage::Storage`]); with the `test-support`
//! feature, `testing::MemoryDirectory` serves tests and benchmarks.

use async_trait::async_trait;
use leasehold_core::{LeaseKey, UserId};

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
