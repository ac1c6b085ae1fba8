//! Every error of the sync-worker, each saying what failed and what to do.

use std::time::Duration;

use leasehold_core::{FencingToken, IdError, LeaseError, LeaseKey};

/// An error with its causes, `a: b: c`, for `last_error` and logs: the
/// workspace's one formatter, used through this path by every caller in the crate.
pub use leasehold_core::errors::error_chain;

/// A configuration value from the environment is missing, malformed or
/// inconsistent with another one. Raised once, at start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A variable could not be parsed.
    #[error("{var}={value:?} is invalid: {expected}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value as given.
        value: String,
        /// What is expected instead.
        expected: String,
    },
    /// A duration is zero (or rounds to zero milliseconds).
    #[error("{var} is {value:?}: it must be greater than zero")]
    Zero {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: Duration,
    },
    /// Two values contradict each other.
    #[error("{detail}")]
    Inconsistent {
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// `IMAP_CA_FILE` cannot be read or holds no certificate.
    #[error("IMAP_CA_FILE cannot be used")]
    CaFile(#[source] crate::imap::tls::CaFileError),
}

/// A boxed cause, kept whole so callers can tell a transport error from a
/// refusal (`#[source]`, never flattened into a string).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The mail source (the IMAP engine, or a scripted stand-in) failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Could not reach the account's server (TCP, TLS or the greeting).
    #[error("account {account}: could not connect to {server}")]
    Connect {
        /// The account.
        account: LeaseKey,
        /// `host:port`.
        server: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The server refused the login. Retrying soon will not help: the
    /// password or the username must change.
    #[error("account {account}: authentication failed: {answer} ({})", next_login(*refusals, *next_attempt_ms, account))]
    Auth {
        /// The account.
        account: LeaseKey,
        /// The server's answer.
        answer: String,
        /// Refusals in a row, this one included.
        refusals: u32,
        /// When the next login may be tried (ms since the epoch); `None`
        /// when no more are, until the account's login is updated.
        next_attempt_ms: Option<i64>,
    },
    /// Logins of the account were refused, and its next attempt is not due
    /// yet: nothing was sent to the server.
    #[error("account {account}: authentication failed {refusals} time(s) in a row; {}", next_login(*refusals, Some(*next_attempt_ms), account))]
    LoginWaiting {
        /// The account.
        account: LeaseKey,
        /// Refusals in a row.
        refusals: u32,
        /// When the next login may be tried (ms since the epoch).
        next_attempt_ms: i64,
    },
    /// Logins of the account were refused as many times in a row as
    /// `IMAP_LOGIN_ATTEMPTS` allows: none is tried until its login is updated.
    #[error("account {account}: authentication failed {refusals} times in a row; {}", next_login(*refusals, None, account))]
    LoginGivenUp {
        /// The account.
        account: LeaseKey,
        /// Refusals in a row.
        refusals: u32,
    },
    /// A command on an open connection failed; reconnect.
    #[error("account {account}: {op} failed")]
    Io {
        /// The account.
        account: LeaseKey,
        /// The operation (`poll`, `watch`, `SELECT INBOX`, ...).
        op: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// Storage failed (not a fencing rejection: that is [`SourceError::Fenced`]).
    #[error("account {account}: storage failed")]
    Storage {
        /// The account.
        account: LeaseKey,
        /// Why.
        #[source]
        source: crate::storage::StorageError,
    },
    /// Storage rejected a claim or a write: it holds a fencing token at or
    /// above this one (a newer owner claimed the account, or the lease store
    /// lost its counters and handed out a token storage has already seen).
    #[error("account {account}: fenced: this worker holds fencing token {token}, storage holds token {current}")]
    Fenced {
        /// The account.
        account: LeaseKey,
        /// The token this write carried.
        token: FencingToken,
        /// The highest token storage has seen.
        current: FencingToken,
    },
    /// The account's stored IMAP password does not decrypt with this
    /// `SECRET_KEY`. Retrying soon will not help: the key must change.
    #[error("account {account}: its stored IMAP password does not decrypt with this SECRET_KEY")]
    Secret {
        /// The account.
        account: LeaseKey,
        /// Why.
        #[source]
        source: crate::secret::SecretError,
    },
    /// A write was refused because the lease's deadline had passed (no
    /// renew in time): nothing of it was committed.
    #[error("account {account}: the lease (fencing token {token}) ran out before the write could commit; rolled back")]
    LeaseExpired {
        /// The account.
        account: LeaseKey,
        /// The lease's token.
        token: FencingToken,
    },
}

impl SourceError {
    /// `e`, of a storage call for `account`: a fencing rejection or a lease
    /// past its deadline as themselves, anything else as [`SourceError::Storage`].
    pub fn from_storage(account: &LeaseKey, e: crate::storage::StorageError) -> Self {
        use crate::storage::StorageError;
        match e {
            StorageError::Fenced { account, token, current } => SourceError::Fenced { account, token, current },
            StorageError::LeaseExpired { account, token } => SourceError::LeaseExpired { account, token },
            source => SourceError::Storage { account: account.clone(), source },
        }
    }

    /// Whether retrying soon is pointless (a refused login, a password that
    /// does not decrypt): the runner then
    /// waits a whole poll interval instead of backing off from one second.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            SourceError::Auth { .. }
                | SourceError::LoginWaiting { .. }
                | SourceError::LoginGivenUp { .. }
                | SourceError::Secret { .. }
        )
    }
}

/// When the next login of `account` comes, after `refusals` in a row: at a
/// time (UTC, to the second, so the text of one wait stays the same), or
/// not until its login is updated, and how to update it.
fn next_login(refusals: u32, next_attempt_ms: Option<i64>, account: &LeaseKey) -> String {
    match next_attempt_ms {
        Some(ms) => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
            format!(
                "refused logins in a row: {refusals}; the next login is tried at {}",
                humantime::format_rfc3339_seconds(at)
            )
        }
        None => format!(
            "refused logins in a row: {refusals}; no more logins are tried until the account's login is updated \
             (`sync-worker account update {account}`, or PATCH /v1/accounts/{account})"
        ),
    }
}

/// Looking up which user owns an account failed.
#[derive(Debug, thiserror::Error)]
#[error("account directory: {op} failed")]
pub struct DirectoryError {
    /// The operation.
    pub op: &'static str,
    /// Why.
    #[source]
    pub source: BoxError,
}

/// Anything the coordinator or the binary can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Invalid configuration.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// An invalid id.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The lease store failed.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The mail source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The account directory failed.
    #[error(transparent)]
    Directory(#[from] DirectoryError),
    /// The backend named by `REDIS_URL` could not be set up.
    #[error("backend {url}: check REDIS_URL and that Redis is reachable")]
    Backend {
        /// The URL (password removed).
        url: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The SQL storage failed.
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
    /// The database and the lease store's key space belong to different
    /// deployments: they share one Redis key prefix.
    #[error(
        "this database is deployment {database}, but the Redis key space is bound to deployment {key_space}: \
         two deployments share one Redis key prefix; give each its own REDIS_KEY_PREFIX (or its own Redis)"
    )]
    OtherDeployment {
        /// The database's deployment id.
        database: String,
        /// The id the key space records.
        key_space: String,
    },
    /// The webhook dispatcher's HTTP client could not be made.
    #[error(transparent)]
    Webhooks(#[from] crate::webhooks::ClientError),
    /// The coordinator task ended abnormally (panicked or was aborted).
    #[error("coordinator of worker {worker} ended abnormally")]
    Coordinator {
        /// The worker.
        worker: String,
        /// The panic or the abort.
        #[source]
        source: tokio::task::JoinError,
    },
}
