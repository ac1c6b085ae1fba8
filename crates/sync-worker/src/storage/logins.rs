//! Refused IMAP logins in a row, per account (`login_failures`,
//! `login_retry_at`): the owner's engine decides the waits, storage keeps
//! them, so they hold across restarts and takeovers.

use leasehold_core::LeaseKey;
use sqlx::Row;

use super::{query_err, FencedTx, Storage, StorageError};

/// An account's refused logins in a row, and the earliest next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginFailures {
    /// Refusals in a row since the last login that worked (or the last
    /// update of the account's login).
    pub count: u32,
    /// The earliest next attempt (ms since the epoch); `None` once no
    /// attempt is owed until the login is updated, or when `count` is 0.
    pub retry_at_ms: Option<i64>,
}

impl Storage {
    /// The refused logins in a row of `account`.
    pub async fn login_failures(&self, account: &LeaseKey) -> Result<LoginFailures, StorageError> {
        let id = account.as_str();
        let row = sqlx::query("SELECT login_failures, login_retry_at FROM accounts WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_err(format!("read the refused logins of {id}")))?
            .ok_or_else(|| StorageError::NotFound { what: "account", key: id.to_string() })?;
        let count: i64 = row.try_get(0).map_err(query_err(format!("read login_failures of {id}")))?;
        let retry_at_ms: Option<i64> = row.try_get(1).map_err(query_err(format!("read login_retry_at of {id}")))?;
        Ok(LoginFailures { count: u32::try_from(count.max(0)).unwrap_or(u32::MAX), retry_at_ms })
    }

    /// Claims the next login attempt of `account`, whose logins were
    /// refused: `true` when `seen` is still what is stored and its wait is
    /// over at `now_ms`; other attempts are then held off until
    /// `hold_until_ms` (the attempt's own time limit), so that one account's
    /// two connections never both try a login the server refused.
    pub async fn claim_login_attempt(
        &self,
        account: &LeaseKey,
        seen: &LoginFailures,
        now_ms: i64,
        hold_until_ms: i64,
    ) -> Result<bool, StorageError> {
        let id = account.as_str();
        let claimed = sqlx::query(
            "UPDATE accounts SET login_retry_at = $1 \
             WHERE id = $2 AND login_failures = $3 AND login_retry_at IS NOT NULL AND login_retry_at <= $4",
        )
        .bind(hold_until_ms)
        .bind(id)
        .bind(i64::from(seen.count))
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(query_err(format!("claim a login attempt of {id}")))?
        .rows_affected();
        Ok(claimed == 1)
    }
}

impl FencedTx {
    /// Records that the server refused the login again: `count` refusals in
    /// a row now, the next attempt at `retry_at_ms` (`None`: no more until
    /// the login is updated).
    pub async fn record_login_refused(&mut self, count: u32, retry_at_ms: Option<i64>) -> Result<(), StorageError> {
        sqlx::query("UPDATE accounts SET login_failures = $1, login_retry_at = $2 WHERE id = $3")
            .bind(i64::from(count))
            .bind(retry_at_ms)
            .bind(&self.account)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("record a refused login of {}", self.account)))?;
        Ok(())
    }

    /// Forgets the refused logins: a login worked.
    pub async fn clear_login_failures(&mut self) -> Result<(), StorageError> {
        sqlx::query("UPDATE accounts SET login_failures = 0, login_retry_at = NULL WHERE id = $1")
            .bind(&self.account)
            .execute(&mut *self.tx)
            .await
            .map_err(query_err(format!("clear the refused logins of {}", self.account)))?;
        Ok(())
    }
}
