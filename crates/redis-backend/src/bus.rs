//! [`RedisBus`]: per-user topics ([`UserBus`]) on Redis pub/sub.
//!
//! * **Channels.** A user's topic is the channel `<prefix>:bus:{<user>}`.
//!   Like every key of the lease space it starts with the prefix and carries
//!   one hash tag; the tag is the user (user ids are key-safe: no braces), so
//!   on a Redis Cluster each user's topic lives on the shard of its slot and
//!   the topics spread over the shards.
//! * **One server:** `PUBLISH` and `SUBSCRIBE`. **Cluster:** sharded pub/sub,
//!   `SPUBLISH` and `SSUBSCRIBE` (Redis 7), which the cluster client routes to
//!   the shard owning the channel's slot, so a message crosses no cluster bus
//!   (a classic `PUBLISH` on a cluster is broadcast to every node).
//! * **One connection per bus**, RESP3, for publishing and for every
//!   subscription: its push messages are routed to the subscriptions by
//!   channel, and a channel is subscribed once however many local
//!   subscribers it has (the first subscribes, the last to drop unsubscribes).
//! * **Reconnects.** The connection reconnects by itself and subscribes
//!   again to every channel it had (the redis crate tracks them: the
//!   connection manager with automatic resubscription, the cluster
//!   connection on its own). A watchdog pings every [`WATCHDOG_INTERVAL`], so
//!   a connection lost while nothing is published is noticed and remade.
//!   Messages published while it reconnects are lost (at most once).
//! * **Publishing** never waits: messages queue for one task that sends
//!   what has queued as one pipeline, in order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::bus::{AbortOnDrop, BusError, BusSubscription, UserBus};
use leasehold_core::UserId;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use crate::config::{ConnectError, RedisConfig};

/// How often an idle bus checks its connection.
pub const WATCHDOG_INTERVAL: Duration = Duration::from_secs(1);

/// Most messages sent in one pipeline.
const MAX_BATCH: usize = 256;

type Subscribers = HashMap<String, Vec<(u64, mpsc::Sender<Vec<u8>>)>>;

/// The map's lock; a panic elsewhere while it was held leaves a usable map.
fn lock(m: &Mutex<Subscribers>) -> MutexGuard<'_, Subscribers> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone)]
enum BusConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl BusConn {
    fn is_cluster(&self) -> bool {
        matches!(self, BusConn::Cluster(_))
    }

    async fn query(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        match self {
            BusConn::Single(c) => cmd.query_async(c).await,
            BusConn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    async fn pipeline(&mut self, pipe: &redis::Pipeline) -> RedisResult<()> {
        match self {
            BusConn::Single(c) => pipe.exec_async(c).await,
            BusConn::Cluster(c) => pipe.exec_async(c).await,
        }
    }

    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            BusConn::Single(c) => c.subscribe(channel).await,
            BusConn::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            BusConn::Single(c) => c.unsubscribe(channel).await,
            BusConn::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }
}

struct Inner {
    prefix: String,
    conn: BusConn,
    subscribers: Arc<Mutex<Subscribers>>,
    next_id: AtomicU64,
    outbox: mpsc::UnboundedSender<(String, Vec<u8>)>,
    /// Serialises subscribe/unsubscribe calls, so a channel's first
    /// subscriber and its last unsubscriber cannot interleave.
    membership: tokio::sync::Mutex<()>,
    _tasks: [AbortOnDrop; 2],
}

/// Per-user topics on Redis pub/sub (see the [module docs](self)). Cheap to
/// clone; clones share the connection. Its tasks stop when the last clone
/// and the last subscription are dropped.
#[derive(Clone)]
pub struct RedisBus {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBus")
            .field("prefix", &self.inner.prefix)
            .field("cluster", &self.inner.conn.is_cluster())
            .finish_non_exhaustive()
    }
}

/// Routes one push message to the subscribers of its channel.
fn route(subscribers: &Mutex<Subscribers>, info: PushInfo) {
    if !matches!(info.kind, PushKind::Message | PushKind::SMessage) {
        return;
    }
    let mut data = info.data.into_iter();
    let (Some(channel), Some(payload)) = (data.next(), data.next()) else { return };
    let (Ok(channel), Ok(payload)) =
        (redis::from_redis_value::<String>(channel), redis::from_redis_value::<Vec<u8>>(payload))
    else {
        return;
    };
    if let Some(subs) = lock(subscribers).get(&channel) {
        for (_, tx) in subs {
            if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(payload.clone()) {
                tracing::warn!(channel, "bus subscriber fell behind; message dropped for it");
            }
        }
    }
}

fn resp3(url: &str) -> Result<redis::ConnectionInfo, ConnectError> {
    let info =
        url.into_connection_info().map_err(|e| ConnectError::BadUrl { url: url.to_owned(), detail: e.to_string() })?;
    let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    Ok(info.set_redis_settings(settings))
}

impl RedisBus {
    /// Connects as `config` says (one server or a cluster), topics under its prefix.
    pub async fn connect(config: &RedisConfig) -> Result<Self, ConnectError> {
        config.validate()?;
        if config.url.starts_with("rediss") {
            // As the store does: say which rustls provider, once.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let subscribers: Arc<Mutex<Subscribers>> = Arc::default();
        let push = {
            let subscribers = subscribers.clone();
            move |info: PushInfo| -> Result<(), std::convert::Infallible> {
                route(&subscribers, info);
                Ok(())
            }
        };
        let connect_err = |source| ConnectError::Connect { url: config.url.clone(), source };
        let bad_url = |e: redis::RedisError| ConnectError::BadUrl { url: config.url.clone(), detail: e.to_string() };
        let conn = if config.is_cluster() {
            let nodes = config.node_urls()?.iter().map(|u| resp3(u)).collect::<Result<Vec<_>, _>>()?;
            let client = ClusterClientBuilder::new(nodes)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(push)
                .connection_timeout(config.connection_timeout)
                .response_timeout(config.response_timeout)
                .build()
                .map_err(bad_url)?;
            BusConn::Cluster(client.get_async_connection().await.map_err(connect_err)?)
        } else {
            let client = redis::Client::open(resp3(&config.url)?).map_err(bad_url)?;
            let manager_config = ConnectionManagerConfig::new()
                .set_push_sender(push)
                .set_automatic_resubscription()
                .set_response_timeout(Some(config.response_timeout))
                .set_connection_timeout(Some(config.connection_timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(1));
            BusConn::Single(ConnectionManager::new_with_config(client, manager_config).await.map_err(connect_err)?)
        };
        let (outbox, queue) = mpsc::unbounded_channel();
        let publisher = AbortOnDrop(tokio::spawn(publish_loop(conn.clone(), queue)));
        let watchdog = AbortOnDrop(tokio::spawn(watchdog(conn.clone())));
        let inner = Inner {
            prefix: config.prefix.clone(),
            conn,
            subscribers,
            next_id: AtomicU64::new(0),
            outbox,
            membership: tokio::sync::Mutex::new(()),
            _tasks: [publisher, watchdog],
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The channel of `user`'s topic.
    pub fn channel(&self, user: &UserId) -> String {
        channel(&self.inner.prefix, user)
    }
}

/// The channel of `user`'s topic under `prefix`: `<prefix>:bus:{<user>}`.
pub fn channel(prefix: &str, user: &UserId) -> String {
    format!("{prefix}:bus:{{{user}}}")
}

async fn publish_loop(mut conn: BusConn, mut queue: mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    let command = if conn.is_cluster() { "SPUBLISH" } else { "PUBLISH" };
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let result = if conn.is_cluster() {
            // One by one, each routed to its channel's shard, in order.
            let mut result = Ok(());
            for (channel, payload) in &batch {
                if let Err(e) = conn.query(redis::cmd(command).arg(channel).arg(payload)).await {
                    result = Err(e);
                }
            }
            result
        } else {
            let mut pipe = redis::pipe();
            for (channel, payload) in &batch {
                pipe.cmd(command).arg(channel).arg(payload).ignore();
            }
            conn.pipeline(&pipe).await
        };
        if let Err(e) = result {
            tracing::warn!(messages = batch.len(), error = %e, "could not publish bus messages; some dropped");
        }
        batch.clear();
    }
}

async fn watchdog(mut conn: BusConn) {
    let mut tick = tokio::time::interval(WATCHDOG_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut down = false;
    loop {
        tick.tick().await;
        // A failed command makes the connection reconnect (and resubscribe).
        match conn.query(&redis::cmd("PING")).await {
            Ok(_) if down => {
                tracing::info!("bus connection restored");
                down = false;
            }
            Ok(_) => {}
            Err(e) if !down => {
                tracing::warn!(error = %e, "bus connection lost; reconnecting");
                down = true;
            }
            Err(_) => {}
        }
    }
}

/// Removes one subscriber when dropped; the last one of a channel unsubscribes.
struct Unsubscribe {
    inner: Weak<Inner>,
    channel: String,
    id: u64,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else { return };
        let last = {
            let mut subs = lock(&inner.subscribers);
            match subs.get_mut(&self.channel) {
                Some(list) => {
                    list.retain(|(id, _)| *id != self.id);
                    list.is_empty()
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let channel = std::mem::take(&mut self.channel);
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        rt.spawn(async move {
            let _serial = inner.membership.lock().await;
            // Someone may have subscribed again meanwhile.
            let still_empty = {
                let mut subs = lock(&inner.subscribers);
                let empty = subs.get(&channel).is_some_and(Vec::is_empty);
                if empty {
                    subs.remove(&channel);
                }
                empty
            };
            if still_empty {
                let mut conn = inner.conn.clone();
                if let Err(e) = conn.unsubscribe(&channel).await {
                    tracing::debug!(channel, error = %e, "could not unsubscribe a bus channel");
                }
            }
        });
    }
}

#[async_trait]
impl UserBus for RedisBus {
    fn publish(&self, user: &UserId, payload: Vec<u8>) {
        // The publisher task lives as long as `self`.
        let _ = self.inner.outbox.send((self.channel(user), payload));
    }

    async fn subscribe(&self, user: &UserId) -> Result<BusSubscription, BusError> {
        let channel = self.channel(user);
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let _serial = self.inner.membership.lock().await;
        let guard = Unsubscribe { inner: Arc::downgrade(&self.inner), channel: channel.clone(), id };
        let (tx, sub) = BusSubscription::channel(guard);
        let first = {
            let mut subs = lock(&self.inner.subscribers);
            let list = subs.entry(channel.clone()).or_default();
            list.push((id, tx));
            list.len() == 1
        };
        if first {
            let mut conn = self.inner.conn.clone();
            if let Err(e) = conn.subscribe(&channel).await {
                drop(_serial);
                // `sub` drops here and takes its entry out again.
                return Err(BusError { user: user.to_string(), source: Box::new(e) });
            }
        }
        Ok(sub)
    }
}
