//! [`RedisStore`]: the connection, the key layout and error mapping.

use std::sync::Arc;

use leasehold_core::{BucketId, LeaseError, QueueError, RunId, UserId};
use redis::RedisError;

use crate::config::{ConnectError, RedisConfig};
use crate::conn::{self, Call, Conn};
use crate::keys::{LeaseKeys, RunKeys};
use crate::pubsub::Channel;
use crate::reply::ReplyError;
use crate::scripts::{self, Library};

/// The Redis store: unit queues and leases on one Redis or a Redis Cluster.
///
/// Cheap to clone: clones share one multiplexed, reconnecting connection
/// (concurrent calls are pipelined on the wire) and one `user.active`
/// subscriber connection.
#[derive(Clone, Debug)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) config: RedisConfig,
    pub(crate) lease_keys: LeaseKeys,
    pub(crate) user_active: Channel<UserId>,
    pub(crate) bucket_changes: Channel<BucketId>,
    /// A connection of its own for blocking reads (`XREAD BLOCK`), made on
    /// first use: a blocked call on the shared connection would hold up
    /// every call pipelined behind it.
    pub(crate) blocking: tokio::sync::Mutex<Option<Conn>>,
    /// The unit ids of the last run `unit_state` looked a fresh unit up in,
    /// under that run's fingerprint (which names its unit list exactly): a
    /// run's states are stored only once they change, so telling a fresh
    /// unit from one not in the run reads the unit list, once.
    pub(crate) unit_ids: std::sync::Mutex<Option<(String, Arc<std::collections::HashSet<leasehold_core::UnitId>>)>>,
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port` or `redis+cluster://host:port,...`)
    /// with the default prefix ([`crate::DEFAULT_PREFIX`]).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with(RedisConfig::new(url)).await
    }

    /// Connects as `config` says.
    pub async fn connect_with(config: RedisConfig) -> Result<Self, ConnectError> {
        config.validate()?;
        let conn = Conn::connect(&config).await?;
        let lease_keys = LeaseKeys::new(&config.prefix);
        let user_active =
            Channel::new(config.node_urls()?, lease_keys.user_active_channel().to_owned(), config.connection_timeout);
        let bucket_changes =
            Channel::new(config.node_urls()?, lease_keys.bucket_change_channel().to_owned(), config.connection_timeout);
        tracing::debug!(url = %config.url, prefix = %config.prefix, "connected to Redis");
        let blocking = tokio::sync::Mutex::new(None);
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                config,
                lease_keys,
                user_active,
                bucket_changes,
                blocking,
                unit_ids: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The settings this store was made with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    /// The keys of `run`.
    pub fn run_keys(&self, run: &RunId) -> RunKeys {
        RunKeys::new(&self.inner.config.prefix, run)
    }

    /// The keys of the lease space.
    pub fn lease_keys(&self) -> &LeaseKeys {
        &self.inner.lease_keys
    }

    /// Loads every script and the transitions' function library now (they
    /// are also loaded on first use, and after a `NOSCRIPT` or a function
    /// not found), so a misconfigured server fails early.
    pub async fn load_scripts(&self) -> Result<(), RedisError> {
        let mut conn = self.conn();
        conn::load_library(&mut conn, &scripts::TRANSITION).await?;
        for script in [
            &*scripts::INITIALIZE,
            &*scripts::PROGRESS,
            &*scripts::PENDING,
            &*scripts::LEASE_CLAIM,
            &*scripts::LEASE_RENEW,
            &*scripts::LEASE_RELEASE,
            &*scripts::LEASE_RAISE_TOKEN,
            &*scripts::DEPLOYMENT_BIND,
            &*scripts::LEASE_NOT_LIVE,
            &*scripts::WORKER_REGISTER,
            &*scripts::WORKER_LIVE,
            &*scripts::USER_ACTIVE,
            &*scripts::TIMINGS_OUTCOMES,
        ] {
            script.prepare_invoke().load_async(&mut conn).await?;
        }
        Ok(())
    }

    pub(crate) fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    pub(crate) async fn eval(&self, script: &redis::Script, call: &Call) -> Result<redis::Value, RedisError> {
        conn::eval(&mut self.conn(), script, call).await
    }

    /// Calls the function of `library` (loaded on first use and whenever
    /// Redis has lost it).
    pub(crate) async fn fcall(&self, library: &Library, call: &Call) -> Result<redis::Value, RedisError> {
        conn::fcall(&mut self.conn(), library, call).await
    }
}

/// Whether a Redis error says a key holds the wrong type (state written by
/// something else).
fn is_wrong_type(err: &RedisError) -> bool {
    err.code() == Some("WRONGTYPE")
}

/// A Redis error of a queue call on `run`.
pub(crate) fn queue_err(op: &'static str, run: &RunId, err: RedisError) -> QueueError {
    if is_wrong_type(&err) {
        return QueueError::Corrupt {
            run: run.clone(),
            detail: format!("{op}: a key of the run holds the wrong type: {err}"),
        };
    }
    tracing::warn!(op, %run, error = %err, "Redis call failed");
    QueueError::backend(op, run, err)
}

/// A malformed reply of a queue call on `run`.
pub(crate) fn queue_reply_err(op: &'static str, run: &RunId, err: ReplyError) -> QueueError {
    QueueError::Corrupt { run: run.clone(), detail: format!("{op}: {err}") }
}

/// A Redis error of a lease call on `key`.
pub(crate) fn lease_err(op: &'static str, key: &str, err: RedisError) -> LeaseError {
    if is_wrong_type(&err) {
        return LeaseError::Corrupt {
            key: key.to_owned(),
            detail: format!("{op}: the key holds the wrong type: {err}"),
        };
    }
    tracing::warn!(op, key, error = %err, "Redis call failed");
    LeaseError::Backend { op, key: key.to_owned(), source: Box::new(err) }
}

/// A malformed reply of a lease call on `key`.
pub(crate) fn lease_reply_err(op: &'static str, key: &str, err: ReplyError) -> LeaseError {
    LeaseError::Corrupt { key: key.to_owned(), detail: format!("{op}: {err}") }
}
