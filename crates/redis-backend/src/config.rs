//! Connection settings.

use std::time::Duration;

use leasehold_core::backend_url::is_redis_cluster_url;
use leasehold_core::ids::is_key_safe_char;

/// The key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "leasehold";

/// How to reach Redis and where to keep the keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host:port[/db]` for one server, or
    /// `redis+cluster://host:port,host:port,...` for a Redis Cluster (any
    /// reachable subset of its nodes).
    pub url: String,
    /// Prefix of every key (non-empty; no whitespace, control characters or braces).
    pub prefix: String,
    /// How long one command may wait for its reply before it fails.
    /// Scripts are short, but initialising a huge run writes every unit in one call.
    pub response_timeout: Duration,
    /// How long one connection attempt may take.
    pub connection_timeout: Duration,
}

impl RedisConfig {
    /// Settings for `url` with the default prefix and timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(2),
        }
    }

    /// The same settings with another key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Whether the URL names a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        is_redis_cluster_url(&self.url)
    }

    /// The node URLs of a cluster URL (`redis+cluster://a:1,b:2` → `redis://a:1`, `redis://b:2`),
    /// or the URL itself for one server.
    pub fn node_urls(&self) -> Result<Vec<String>, ConnectError> {
        let (scheme, rest) = if let Some(rest) = self.url.strip_prefix("redis+cluster://") {
            ("redis://", rest)
        } else if let Some(rest) = self.url.strip_prefix("rediss+cluster://") {
            ("rediss://", rest)
        } else {
            return Ok(vec![self.url.clone()]);
        };
        // Credentials (user:pass@) apply to every node.
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let hosts = hosts.trim_end_matches('/');
        let nodes: Vec<String> =
            hosts.split(',').filter(|h| !h.trim().is_empty()).map(|h| format!("{scheme}{auth}{}", h.trim())).collect();
        if nodes.is_empty() {
            return Err(ConnectError::BadUrl { url: self.url.clone(), detail: "names no host:port".into() });
        }
        Ok(nodes)
    }

    /// Checks the prefix.
    pub fn validate(&self) -> Result<(), ConnectError> {
        let p = &self.prefix;
        if p.is_empty() {
            return Err(ConnectError::BadPrefix { prefix: p.clone(), detail: "it is empty".into() });
        }
        if let Some(c) = p.chars().find(|&c| !is_key_safe_char(c)) {
            return Err(ConnectError::BadPrefix {
                prefix: p.escape_debug().to_string(),
                detail: format!("it contains {c:?}"),
            });
        }
        Ok(())
    }
}

/// A [`crate::RedisStore`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL is not a Redis URL.
    #[error(
        "Redis URL {url:?} is invalid: {detail} (expected redis://host:port or redis+cluster://host:port,host:port)"
    )]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        detail: String,
    },
    /// The key prefix is not allowed.
    #[error("key prefix {prefix:?} is invalid: {detail} (use a non-empty prefix without whitespace, control characters or braces)")]
    BadPrefix {
        /// The prefix.
        prefix: String,
        /// What is wrong.
        detail: String,
    },
    /// Redis did not answer.
    #[error("could not connect to Redis at {url}: {source}")]
    Connect {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: redis::RedisError,
    },
}

impl ConnectError {
    /// Whether trying again later may succeed: the server refused, dropped
    /// or did not answer the connection, as a restarting server does. A bad
    /// URL, a refused certificate or a failed login will not mend.
    pub fn may_come_back(&self) -> bool {
        match self {
            ConnectError::Connect { source, .. } => may_come_back(source),
            _ => false,
        }
    }
}

/// Whether a Redis error says the server may answer later: a refused,
/// dropped or timed-out connection, or a server still loading its data.
pub fn may_come_back(error: &redis::RedisError) -> bool {
    error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_split_into_nodes() {
        let c = RedisConfig::new("redis+cluster://127.0.0.1:7000,127.0.0.1:7001");
        assert!(c.is_cluster());
        assert_eq!(c.node_urls().unwrap(), vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
        let c = RedisConfig::new("redis+cluster://u:p@h1:1,h2:2/");
        assert_eq!(c.node_urls().unwrap(), vec!["redis://u:p@h1:1", "redis://u:p@h2:2"]);
        let c = RedisConfig::new("redis://h:1");
        assert!(!c.is_cluster());
        assert_eq!(c.node_urls().unwrap(), vec!["redis://h:1"]);
        assert!(RedisConfig::new("redis+cluster://").node_urls().is_err());
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(RedisConfig::new("redis://h:1").validate().is_ok());
        assert!(RedisConfig::new("redis://h:1").with_prefix("").validate().is_err());
        assert!(RedisConfig::new("redis://h:1").with_prefix("a{b").validate().is_err());
        assert!(RedisConfig::new("redis://h:1").with_prefix("a b").validate().is_err());
    }
}
