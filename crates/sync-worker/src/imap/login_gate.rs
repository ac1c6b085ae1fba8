//! Refused logins back off ([`LoginBackoff`]), for the whole fleet: the
//! count and the next attempt live in the account's row, so a restarted or
//! a new owner waits them out too, and of an owner's two connections (the
//! periodic poll and the INBOX watch) only one tries a login that was
//! refused. A login that works, or an update of the account's login,
//! clears them.

use leasehold_core::LeaseKey;

use super::settings::LoginBackoff;
use crate::errors::SourceError;
use crate::source::Fence;
use crate::storage::{now_ms, LoginFailures, Storage};

/// Whether a login of `account` may be tried now: `Ok` with its refusals
/// so far when it may (an attempt after refusals is claimed in storage
/// for `attempt_ms`), [`SourceError::LoginWaiting`] or
/// [`SourceError::LoginGivenUp`] when not, with nothing sent to the server.
pub(super) async fn admit(
    storage: &Storage,
    account: &LeaseKey,
    backoff: &LoginBackoff,
    attempt_ms: i64,
) -> Result<LoginFailures, SourceError> {
    let seen = storage.login_failures(account).await.map_err(|e| SourceError::from_storage(account, e))?;
    if seen.count == 0 {
        return Ok(seen);
    }
    let refusals = seen.count;
    let Some(next_attempt_ms) = seen.retry_at_ms.filter(|_| refusals < backoff.attempts.get()) else {
        return Err(SourceError::LoginGivenUp { account: account.clone(), refusals });
    };
    let now = now_ms();
    let waiting = || SourceError::LoginWaiting { account: account.clone(), refusals, next_attempt_ms };
    if now < next_attempt_ms {
        return Err(waiting());
    }
    match storage.claim_login_attempt(account, &seen, now, now + attempt_ms).await {
        Ok(true) => Ok(seen),
        // The other connection claimed it (or the login was updated meanwhile: the next pass sees that).
        Ok(false) => Err(waiting()),
        Err(e) => Err(SourceError::from_storage(account, e)),
    }
}

/// How final a refusal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The server refused: try again after the backoff.
    Retry,
    /// Nothing but an updated login can help (a revoked OAuth2 grant): no
    /// attempt until then.
    Final,
}

/// Records a refusal after `seen` (its count and the next attempt, with
/// the error as the account's `last_error`) and returns that error.
pub(super) async fn refused(
    storage: &Storage,
    fence: &Fence,
    seen: LoginFailures,
    backoff: &LoginBackoff,
    answer: String,
    refusal: Refusal,
) -> Result<SourceError, SourceError> {
    metrics::counter!("sync_worker_imap_login_refusals_total").increment(1);
    let refusals = seen.count.saturating_add(1);
    let next_attempt_ms = match refusal {
        Refusal::Retry => backoff.wait_after(refusals).map(|wait| now_ms().saturating_add(wait.as_millis() as i64)),
        Refusal::Final => None,
    };
    let error = SourceError::Auth { account: fence.account.clone(), answer, refusals, next_attempt_ms };
    let text = crate::errors::error_chain(&error);
    let write = async {
        let mut tx = storage.write(fence).await?;
        tx.record_login_refused(refusals, next_attempt_ms).await?;
        tx.record_poll(Some(&text)).await?;
        tx.commit().await
    };
    write.await.map_err(|e| SourceError::from_storage(&fence.account, e))?;
    Ok(error)
}

/// Forgets `fence`'s account's refusals once a login worked.
pub(super) async fn worked(storage: &Storage, fence: &Fence, seen: LoginFailures) -> Result<(), SourceError> {
    if seen.count == 0 {
        return Ok(());
    }
    let write = async {
        let mut tx = storage.write(fence).await?;
        tx.clear_login_failures().await?;
        tx.commit().await
    };
    write.await.map_err(|e| SourceError::from_storage(&fence.account, e))
}
