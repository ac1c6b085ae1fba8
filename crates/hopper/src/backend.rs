//! The one wiring module: turns a `--queue` URL into a backend. Everything
//! else in hopper speaks only [`UnitQueue`] and [`TimingsStore`].
//!
//! * `mem://` (the default): [`leasehold_mem::MemoryStore`], private to this
//!   process; timings in a local JSON file.
//! * `redis://`, `rediss://`, `redis+cluster://`: the Redis backend, shared by
//!   every worker of the build; timings in a Redis hash with a long TTL.

use std::path::PathBuf;
use std::sync::Arc;

use leasehold_core::UnitQueue;

use crate::errors::BackendError;
use crate::timings::{FileTimings, NoTimings, TimingsStore};

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
    const REDIS: [&str; 4] = ["redis://", "rediss://", "redis+cluster://", "rediss+cluster://"];
    if REDIS.iter().any(|s| url.starts_with(s)) {
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
        }),
        QueueKind::Redis(url) => redis_wiring::connect(url, options).await,
    }
}

mod redis_wiring {
    use std::collections::HashMap;

    use async_trait::async_trait;
    use leasehold_redis::{ConnectError, RedisConfig, RedisStore};
    use redis::aio::{ConnectionManager, ConnectionManagerConfig};
    use redis::cluster::ClusterClientBuilder;
    use redis::cluster_async::ClusterConnection;

    use super::*;
    use crate::errors::TimingsError;

    /// Timings outlive builds: a month after the last build that wrote them.
    const TIMINGS_TTL_SECS: u64 = 30 * 24 * 3600;
    /// Units written per HSET.
    const CHUNK: usize = 1000;

    /// The URL without its password, for messages.
    pub(super) fn redact(url: &str) -> String {
        match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => format!("{}***@{}", &url[..scheme + 3], &url[at + 1..]),
            _ => url.to_owned(),
        }
    }

    fn connect_error(url: &str, error: ConnectError) -> BackendError {
        match error {
            ConnectError::Connect { source, .. } => {
                BackendError::Unreachable { url: redact(url), source: source.into() }
            }
            other => BackendError::BadConfig { source: other.into() },
        }
    }

    pub(super) async fn connect(url: &str, options: &BackendOptions) -> Result<Backend, BackendError> {
        let config = RedisConfig::new(url).with_prefix(&options.prefix);
        let store = RedisStore::connect_with(config.clone()).await.map_err(|e| connect_error(url, e))?;
        // A cheap round trip that fails now, with a clear message, when the
        // server is not usable (and saves loading the scripts later).
        store.load_scripts().await.map_err(|e| BackendError::Unreachable { url: redact(url), source: e.into() })?;
        let timings: Arc<dyn TimingsStore> = match &options.timings {
            TimingsChoice::Off => Arc::new(NoTimings),
            TimingsChoice::File(path) => Arc::new(FileTimings::new(path)),
            TimingsChoice::Default => {
                Arc::new(RedisTimings::connect(&config).await.map_err(|e| connect_error(url, e))?)
            }
        };
        Ok(Backend { queue: Arc::new(store), timings, shared: true })
    }

    #[derive(Clone)]
    enum Conn {
        Single(ConnectionManager),
        Cluster(ClusterConnection),
    }

    /// Timings in one Redis hash (`<prefix>:hopper:timings`, unit → ms),
    /// whose TTL every write renews.
    struct RedisTimings {
        conn: Conn,
        key: String,
    }

    impl RedisTimings {
        async fn connect(config: &RedisConfig) -> Result<Self, ConnectError> {
            let connect_err = |source| ConnectError::Connect { url: config.url.clone(), source };
            let bad_url =
                |e: redis::RedisError| ConnectError::BadUrl { url: config.url.clone(), detail: e.to_string() };
            let conn = if config.is_cluster() {
                let client = ClusterClientBuilder::new(config.node_urls()?)
                    .connection_timeout(config.connection_timeout)
                    .response_timeout(config.response_timeout)
                    .build()
                    .map_err(bad_url)?;
                Conn::Cluster(client.get_async_connection().await.map_err(connect_err)?)
            } else {
                let client = redis::Client::open(config.url.as_str()).map_err(bad_url)?;
                let manager_config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.response_timeout))
                    .set_connection_timeout(Some(config.connection_timeout))
                    .set_number_of_retries(2);
                Conn::Single(ConnectionManager::new_with_config(client, manager_config).await.map_err(connect_err)?)
            };
            Ok(Self { conn, key: format!("{}:hopper:timings", config.prefix) })
        }

        async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, TimingsError> {
            let backend = |e: redis::RedisError| TimingsError::Backend { source: e.into() };
            match self.conn.clone() {
                Conn::Single(mut c) => cmd.query_async(&mut c).await.map_err(backend),
                Conn::Cluster(mut c) => cmd.query_async(&mut c).await.map_err(backend),
            }
        }
    }

    #[async_trait]
    impl TimingsStore for RedisTimings {
        async fn load(&self) -> Result<HashMap<String, u64>, TimingsError> {
            self.query(redis::cmd("HGETALL").arg(&self.key)).await
        }

        async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError> {
            for chunk in timings.chunks(CHUNK) {
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&self.key);
                for (unit, ms) in chunk {
                    cmd.arg(unit).arg(*ms);
                }
                self.query::<i64>(&cmd).await?;
            }
            if !timings.is_empty() {
                self.query::<i64>(redis::cmd("EXPIRE").arg(&self.key).arg(TIMINGS_TTL_SECS)).await?;
            }
            Ok(())
        }
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

    #[test]
    fn redacts_passwords() {
        assert_eq!(redis_wiring::redact("redis://user:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redis_wiring::redact("redis://h:1"), "redis://h:1");
    }
}
