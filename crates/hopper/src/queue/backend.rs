//! The one wiring module: turns a `--queue` URL into a backend. Everything
//! else in hopper speaks only [`UnitQueue`] and [`TimingsStore`].
//!
//! * `mem://` (the default): [`leasehold_mem::MemoryStore`], private to this
//!   process; timings in a local JSON file.
//! * `redis://`, `rediss://`, `redis+cluster://`: the Redis backend, shared by
//!   every worker of the build; timings in a Redis hash with a long TTL.

use std::path::PathBuf;
use std::sync::Arc;

use leasehold_core::backend_url::is_redis_url;
use leasehold_core::{NoTimings, TimingsStore, UnitQueue};
use leasehold_mem::FileTimings;

use crate::errors::BackendError;

/// The default queue URL.
pub const DEFAULT_QUEUE: &str = "mem://";
/// The default prefix of every Redis key.
pub const DEFAULT_KEY_PREFIX: &str = leasehold_redis::DEFAULT_PREFIX;
/// The default timings file of memory mode.
pub const DEFAULT_TIMINGS_FILE: &str = ".hopper/timings.json";

/// Which backend a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueKind {
    /// In this process.
    Memory,
    /// A Redis server or cluster at this URL.
    Redis(String),
}

impl QueueKind {
    /// Whether several processes can share the queue.
    pub fn is_shared(&self) -> bool {
        matches!(self, QueueKind::Redis(_))
    }
}

/// Parses a `--queue` URL.
pub fn parse_queue_url(url: &str) -> Result<QueueKind, BackendError> {
    let url = url.trim();
    // Exactly these: `mem://foo` or an empty --queue would otherwise quietly
    // mean a private queue where the user meant a shared one.
    if ["mem://", "memory://"].contains(&url) {
        return Ok(QueueKind::Memory);
    }
    if is_redis_url(url) {
        return Ok(QueueKind::Redis(url.to_owned()));
    }
    Err(BackendError::UnsupportedScheme { url: url.to_owned() })
}

/// Where timings are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimingsChoice {
    /// Not at all.
    Off,
    /// The backend's default (a local file in memory mode, Redis otherwise).
    Default,
    /// This local file, whatever the backend.
    File(PathBuf),
}

/// Backend settings besides the URL.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Prefix of every Redis key.
    pub prefix: String,
    /// Where timings go.
    pub timings: TimingsChoice,
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self { prefix: DEFAULT_KEY_PREFIX.to_owned(), timings: TimingsChoice::Default }
    }
}

/// A connected backend.
pub struct Backend {
    /// The unit queue.
    pub queue: Arc<dyn UnitQueue>,
    /// The timings store.
    pub timings: Arc<dyn TimingsStore>,
    /// Whether other processes share the queue.
    pub shared: bool,
    /// The timings file this run makes in the project (the default one, not
    /// there yet): the run says what it is once it is written.
    pub new_timings_file: Option<&'static str>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("shared", &self.shared).finish_non_exhaustive()
    }
}

/// Connects to the backend `kind` names (checking that Redis answers).
pub async fn connect(kind: &QueueKind, options: &BackendOptions) -> Result<Backend, BackendError> {
    let file_timings = |default: Option<&str>| -> Arc<dyn TimingsStore> {
        match (&options.timings, default) {
            (TimingsChoice::Off, _) => Arc::new(NoTimings),
            (TimingsChoice::File(path), _) => Arc::new(FileTimings::new(path)),
            (TimingsChoice::Default, Some(path)) => Arc::new(FileTimings::new(path)),
            (TimingsChoice::Default, None) => Arc::new(NoTimings),
        }
    };
    match kind {
        QueueKind::Memory => Ok(Backend {
            queue: Arc::new(leasehold_mem::MemoryStore::new()),
            timings: file_timings(Some(DEFAULT_TIMINGS_FILE)),
            shared: false,
            new_timings_file: (matches!(options.timings, TimingsChoice::Default)
                && !std::path::Path::new(DEFAULT_TIMINGS_FILE).exists())
            .then_some(DEFAULT_TIMINGS_FILE),
        }),
        QueueKind::Redis(url) => redis_wiring::connect(url, options).await,
    }
}

mod redis_wiring {
    use leasehold_core::backend_url::redact_url;
    use leasehold_redis::{ConnectError, RedisConfig, RedisStore};

    use super::*;

    fn connect_error(url: &str, error: ConnectError) -> BackendError {
        let may_come_back = error.may_come_back();
        match error {
            ConnectError::Connect { source, .. } => {
                BackendError::Unreachable { url: redact_url(url), may_come_back, source: source.into() }
            }
            other => BackendError::BadConfig { source: other.into() },
        }
    }

    pub(super) async fn connect(url: &str, options: &BackendOptions) -> Result<Backend, BackendError> {
        let config = RedisConfig::new(url).with_prefix(&options.prefix);
        let store = RedisStore::connect_with(config).await.map_err(|e| connect_error(url, e))?;
        // A cheap round trip that fails now, with a clear message, when the
        // server is not usable (and saves loading the scripts later).
        store.load_scripts().await.map_err(|e| BackendError::Unreachable {
            url: redact_url(url),
            may_come_back: leasehold_redis::may_come_back(&e),
            source: e.into(),
        })?;
        let timings: Arc<dyn TimingsStore> = match &options.timings {
            TimingsChoice::Off => Arc::new(NoTimings),
            TimingsChoice::File(path) => Arc::new(FileTimings::new(path)),
            // The same store: its timings hash lives under the same prefix.
            TimingsChoice::Default => Arc::new(store.clone()),
        };
        Ok(Backend { queue: Arc::new(store), timings, shared: true, new_timings_file: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_queue_urls() {
        assert_eq!(parse_queue_url("mem://").unwrap(), QueueKind::Memory);
        assert_eq!(parse_queue_url("memory://").unwrap(), QueueKind::Memory);
        for bad in ["", " ", "mem", "mem://foo", "memory://x"] {
            assert!(parse_queue_url(bad).is_err(), "{bad:?} is not a queue URL");
        }
        assert!(parse_queue_url("redis://127.0.0.1:6379").unwrap().is_shared());
        assert!(parse_queue_url("redis+cluster://a:1,b:2").unwrap().is_shared());
        let err = parse_queue_url("amqp://x").unwrap_err().to_string();
        assert!(err.contains("amqp://x") && err.contains("redis://"), "{err}");
    }
}
