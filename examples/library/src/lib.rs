//! The wiring the two example programs share: a backend picked from a URL.
//!
//! This is all a library user writes to choose a backend. Everything after
//! it speaks only [`LeaseStore`] and [`UnitQueue`], so the same program runs
//! in one process on `mem://` and across machines on `redis://`:
//!
//! * `mem://`: [`leasehold_mem::MemoryStore`], private to this process (the
//!   reference semantics; good for tests and single-process use).
//! * `redis://`, `rediss://` (TLS), `redis+cluster://host:port,host:port`:
//!   [`leasehold_redis::RedisStore`], shared by every process that connects.
//!
//! The programs: `lease_job.rs` (a job that works only while it holds a
//! lease) and `queue_consumer.rs` (two workers draining a fenced queue with
//! retries). Run them with
//! `cargo run -p leasehold-examples --example lease_job -- redis://127.0.0.1:6379`.
#![warn(missing_docs)]

use std::sync::Arc;

use leasehold_core::backend_url::{is_redis_url, redact_url, REDIS_SCHEMES_HELP};
use leasehold_core::{LeaseStore, UnitQueue};

/// The environment variable the programs read the URL from when no argument gives one.
pub const URL_ENV: &str = "LEASEHOLD_URL";

/// The URL used when neither the argument nor [`URL_ENV`] gives one.
pub const DEFAULT_URL: &str = "mem://";

/// Why no backend could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL names no backend.
    #[error("backend URL {url:?} names no backend: expected mem:// or {REDIS_SCHEMES_HELP}")]
    UnknownScheme {
        /// The URL, without its password.
        url: String,
    },
    /// The Redis backend could not be reached or configured.
    #[error("could not connect to the Redis backend at {url}")]
    Redis {
        /// The URL, without its password.
        url: String,
        /// Why.
        #[source]
        source: leasehold_redis::ConnectError,
    },
}

/// One backend, seen through the two contracts. Both are the same store.
#[derive(Clone)]
pub struct Backend {
    /// Leases with fencing tokens.
    pub leases: Arc<dyn LeaseStore>,
    /// The fenced unit queue.
    pub queue: Arc<dyn UnitQueue>,
}

/// The URL to use: the first program argument, else [`URL_ENV`], else [`DEFAULT_URL`].
pub fn url_from_args() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var(URL_ENV).ok().filter(|url| !url.is_empty()))
        .unwrap_or_else(|| DEFAULT_URL.to_owned())
}

/// Connects to the backend `url` names.
pub async fn connect(url: &str) -> Result<Backend, ConnectError> {
    if url == "mem://" {
        let store = Arc::new(leasehold_mem::MemoryStore::new());
        return Ok(Backend { leases: store.clone(), queue: store });
    }
    if !is_redis_url(url) {
        return Err(ConnectError::UnknownScheme { url: redact_url(url) });
    }
    let store = leasehold_redis::RedisStore::connect(url)
        .await
        .map_err(|source| ConnectError::Redis { url: redact_url(url), source })?;
    let store = Arc::new(store);
    Ok(Backend { leases: store.clone(), queue: store })
}
