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
//! token equal to the stored one at claim time, recorded by another worker,
//! means two claims were handed the same number (a lease store that lost its
//! counters counted up to it again), and two owners must never share one.
//! The same worker may record its own token again: one bucket lease covers
//! every account of the bucket, and an account's runner can start again
//! under it (a restart, or the account read again after a change).

use std::fmt;

use leasehold_core::{FencingToken, Lease, LeaseKey};
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
        let recorded = sqlx::query(
            "UPDATE accounts SET fence_token = $1, fence_owner = $2 \
                 WHERE id = $3 AND (fence_token < $1 OR (fence_token = $1 AND fence_owner = $2))",
        )
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
        self.fence_token(&fence.account).await
    }

    /// The fencing token stored for `account`; `None` when it does not exist.
    pub async fn fence_token(&self, account: &LeaseKey) -> Result<Option<FencingToken>, StorageError> {
        let a = account.as_str();
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

/// What an account's sync is doing, in words, for `account status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncState {
    /// Its owner's lease token is below the stored one: storage rejects
    /// every write of it until it claims again above the stored token.
    Fenced {
        /// The lease.
        lease: Lease,
        /// The stored token.
        stored: FencingToken,
    },
    /// It synced once, and the last poll failed.
    NotSyncedSince {
        /// The last good poll (ms since the epoch).
        at_ms: i64,
        /// The last poll's error.
        error: String,
    },
    /// It has never synced.
    NeverSynced {
        /// The last error, if any.
        error: Option<String>,
    },
    /// The last poll went well.
    Syncing,
}

impl SyncState {
    /// The state of an account held by `holder` (from the lease store, when
    /// shared), whose stored token, last good poll and last error are given.
    pub fn of(
        holder: Option<&Lease>,
        stored: FencingToken,
        last_sync_at: Option<i64>,
        last_error: Option<&str>,
    ) -> Self {
        if let Some(lease) = holder.filter(|l| l.token < stored) {
            return SyncState::Fenced { lease: lease.clone(), stored };
        }
        match (last_sync_at, last_error) {
            (None, error) => SyncState::NeverSynced { error: error.map(str::to_string) },
            (Some(at_ms), Some(error)) => SyncState::NotSyncedSince { at_ms, error: error.to_string() },
            (Some(_), None) => SyncState::Syncing,
        }
    }
}

impl fmt::Display for SyncState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncState::Fenced { lease, stored } => write!(
                f,
                "fenced: owner {} holds lease token {}, storage holds token {stored}; \
                 it writes nothing until it claims again above {stored}",
                lease.owner, lease.token
            ),
            SyncState::NotSyncedSince { at_ms, error } => {
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis((*at_ms).max(0) as u64);
                write!(f, "not synced since {} ({error})", humantime::format_rfc3339_seconds(at))
            }
            SyncState::NeverSynced { error: Some(error) } => write!(f, "not synced yet ({error})"),
            SyncState::NeverSynced { error: None } => f.write_str("not synced yet"),
            SyncState::Syncing => f.write_str("syncing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::WorkerId;

    use super::*;

    #[test]
    fn the_state_says_fenced_or_not_synced_since_when_that_is_the_truth() {
        let lease = |t| Lease {
            key: LeaseKey::new("acct-1").unwrap(),
            owner: WorkerId::new("w1").unwrap(),
            token: FencingToken(t),
        };
        let fenced = SyncState::of(Some(&lease(3)), FencingToken(5), Some(1), None);
        assert_eq!(
            fenced.to_string(),
            "fenced: owner w1 holds lease token 3, storage holds token 5; it writes nothing until it claims again above 5"
        );
        let stale = SyncState::of(Some(&lease(5)), FencingToken(5), Some(1_700_000_000_000), Some("boom"));
        assert_eq!(stale.to_string(), "not synced since 2023-11-14T22:13:20Z (boom)");
        assert_eq!(SyncState::of(None, FencingToken(5), None, None).to_string(), "not synced yet");
        assert_eq!(SyncState::of(Some(&lease(6)), FencingToken(5), Some(1), None), SyncState::Syncing);
    }
}
