//! Every error of the sync-worker, each saying what failed and what to do.

use std::time::Duration;

use leasehold_core::{FencingToken, IdError, LeaseError, LeaseKey};

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
}

/// The mail source (the IMAP engine, or a scripted stand-in) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// Could not connect to (or log in to) the account's server.
    #[error("account {account}: connect failed: {detail}")]
    Connect {
        /// The account.
        account: LeaseKey,
        /// What went wrong.
        detail: String,
    },
    /// A poll or watch on an open connection failed; reconnect.
    #[error("account {account}: {op} failed: {detail}")]
    Io {
        /// The account.
        account: LeaseKey,
        /// The operation (`poll`, `watch`, ...).
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// Storage rejected a write because a newer owner (higher fencing token) has written.
    #[error("account {account}: write with fencing token {token} rejected: a newer owner holds token {current}; this worker has lost the account")]
    Fenced {
        /// The account.
        account: LeaseKey,
        /// The token this write carried.
        token: FencingToken,
        /// The highest token storage has seen.
        current: FencingToken,
    },
}

/// Looking up which user owns an account failed.
#[derive(Debug, thiserror::Error)]
#[error("account directory: {op} failed: {detail}")]
pub struct DirectoryError {
    /// The operation.
    pub op: &'static str,
    /// What went wrong.
    pub detail: String,
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
    #[error("backend {url}: {detail}")]
    Backend {
        /// The URL (password removed).
        url: String,
        /// What went wrong and what to do.
        detail: String,
    },
    /// The coordinator task ended abnormally (panicked or was aborted).
    #[error("coordinator of worker {worker} ended abnormally: {detail}")]
    Coordinator {
        /// The worker.
        worker: String,
        /// What happened.
        detail: String,
    },
}
