//! Fencing at claim time: a new owner's token takes effect in the account's
//! row before the owner syncs anything.
//!
//! Every write transaction checks and advances the stored token as its first
//! statement (see [`Storage::write`]), but that alone lets a paused old owner
//! write while its successor is still fetching its first batch: the new token
//! would reach the row only with the successor's first commit. So a runner
//! calls [`Storage::record_claim`] first, in one short statement of its own,
//! and from its commit on every write under an older token is rejected.
//!
//! The claim-time check is *strict* (`fence_token < new`), unlike the write
//! check (`fence_token <= token`, so an owner's own later writes pass): a
//! token equal to the stored one at claim time means two claims were handed
//! the same number (a lease store that lost its counters counted up to it
//! again), and two owners must never share one.

use leasehold_core::FencingToken;
use sqlx::Row;

use super::{query_err, Storage, StorageError};
use crate::source::Fence;

impl Storage {
    /// Records `fence`'s token as the account's current one, before its
    /// owner syncs anything: `fence_token = token` only if the stored one is
    /// lower. A stored token at or above it is [`StorageError::Fenced`]
    /// (with both tokens), and the row is left as it was.
    pub async fn record_claim(&self, fence: &Fence) -> Result<(), StorageError> {
        let a = fence.account.as_str();
        let token = i64::try_from(fence.token.0).map_err(|_| StorageError::Corrupt {
            account: a.to_string(),
            field: "fencing token",
            value: fence.token.to_string(),
        })?;
        // One statement, so one short transaction of its own: it holds the
        // row's lock only for itself, and waits (up to `lock_timeout` on
        // Postgres) for a write transaction of the old owner to end.
        let recorded =
            sqlx::query("UPDATE accounts SET fence_token = $1, fence_owner = $2 WHERE id = $3 AND fence_token < $1")
                .bind(token)
                .bind(fence.worker.as_str())
                .bind(a)
                .execute(&self.pool)
                .await
                .map_err(query_err(format!("record the claim of {a} with fencing token {}", fence.token)))?
                .rows_affected();
        if recorded == 1 {
            return Ok(());
        }
        Err(match self.stored_token(fence).await? {
            None => StorageError::NotFound { what: "account", key: a.to_string() },
            Some(current) => StorageError::Fenced { account: fence.account.clone(), token: fence.token, current },
        })
    }

    /// The fencing token stored for `fence`'s account; `None` when the account does not exist.
    pub async fn stored_token(&self, fence: &Fence) -> Result<Option<FencingToken>, StorageError> {
        let a = fence.account.as_str();
        let row = sqlx::query("SELECT fence_token FROM accounts WHERE id = $1")
            .bind(a)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read the fencing token of {a}")))?;
        row.map(|r| {
            let t: i64 = r.try_get(0).map_err(query_err(format!("read the fencing token of {a}")))?;
            Ok(FencingToken(t.max(0) as u64))
        })
        .transpose()
    }
}
