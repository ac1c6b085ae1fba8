//! The one place that turns configuration into a backend: no `REDIS_URL`
//! means the in-memory store (one process), a `redis://` URL the Redis store
//! (`redis+cluster://host:port,...` a Redis Cluster), with the keys under
//! `REDIS_KEY_PREFIX` (default `leasehold`).

use std::sync::Arc;

use leasehold_core::LeaseStore;

use crate::config::{redact_url, Config};
use crate::errors::SyncError;

/// Which backend a configuration selects, for logs.
pub fn backend_name(config: &Config) -> String {
    match &config.redis_url {
        None => "memory".into(),
        Some(url) => format!("redis ({})", redact_url(url)),
    }
}

/// Connects the backend `config` selects.
pub async fn connect_store(config: &Config) -> Result<Arc<dyn LeaseStore>, SyncError> {
    match &config.redis_url {
        None => Ok(Arc::new(leasehold_mem::MemoryStore::new())),
        Some(url) => {
            let prefix = if config.redis_key_prefix.is_empty() {
                leasehold_redis::DEFAULT_PREFIX.to_string()
            } else {
                config.redis_key_prefix.clone()
            };
            let store = leasehold_redis::RedisStore::connect_with(
                leasehold_redis::RedisConfig::new(url.clone()).with_prefix(prefix),
            )
            .await
            .map_err(|e| SyncError::Backend { url: redact_url(url), source: Box::new(e) })?;
            Ok(Arc::new(store))
        }
    }
}

/// Connects the event bus `config` selects: no `REDIS_URL` means the
/// in-process [`MemoryBus`](crate::events::MemoryBus) (the worker and the
/// API in one process); a Redis URL means pub/sub on a channel per user,
/// so mail a worker stores on one machine reaches WebSockets on another.
pub async fn connect_bus(config: &Config) -> Result<Arc<dyn crate::events::EventBus>, SyncError> {
    match &config.redis_url {
        None => Ok(Arc::new(crate::events::MemoryBus::new())),
        Some(url) => {
            let prefix = if config.redis_key_prefix.is_empty() {
                leasehold_redis::DEFAULT_PREFIX.to_string()
            } else {
                config.redis_key_prefix.clone()
            };
            let nodes = leasehold_redis::RedisConfig::new(url.clone())
                .node_urls()
                .map_err(|e| SyncError::Backend { url: redact_url(url), source: Box::new(e) })?;
            let bus = redis_bus::RedisBus::connect(nodes, prefix)
                .await
                .map_err(|e| SyncError::Backend { url: redact_url(url), source: Box::new(e) })?;
            Ok(Arc::new(bus))
        }
    }
}

/// Mail events over Redis pub/sub: channel `{prefix}:mail:{user}`, JSON
/// [`MailEvent`](crate::events::MailEvent)s. Publishing goes through one
/// multiplexed connection, in order; each subscription has a connection of
/// its own (a plain `PUBLISH` reaches every node of a cluster, so the first
/// node serves).
mod redis_bus {
    use async_trait::async_trait;
    use futures::StreamExt;
    use leasehold_core::UserId;
    use tokio::sync::mpsc;

    use crate::events::{BusError, EventBus, EventSubscription, MailEvent, MailEventSink, SUBSCRIBER_CAPACITY};

    #[derive(Debug)]
    pub(super) struct RedisBus {
        client: redis::Client,
        prefix: String,
        outbox: mpsc::UnboundedSender<(String, String)>,
    }

    impl RedisBus {
        pub(super) async fn connect(nodes: Vec<String>, prefix: String) -> Result<Self, redis::RedisError> {
            let url = nodes.into_iter().next().unwrap_or_default();
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let (outbox, mut queue) = mpsc::unbounded_channel::<(String, String)>();
            tokio::spawn(async move {
                while let Some((channel, payload)) = queue.recv().await {
                    let sent: Result<(), _> =
                        redis::cmd("PUBLISH").arg(&channel).arg(&payload).query_async(&mut conn).await;
                    if let Err(e) = sent {
                        tracing::warn!(channel, error = %e, "could not publish a mail event; dropped");
                    }
                }
            });
            Ok(Self { client, prefix, outbox })
        }

        fn channel(&self, user: &str) -> String {
            format!("{}:mail:{user}", self.prefix)
        }
    }

    impl MailEventSink for RedisBus {
        fn publish(&self, events: Vec<MailEvent>) {
            for e in events {
                match serde_json::to_string(&e) {
                    Ok(payload) => {
                        let _ = self.outbox.send((self.channel(&e.user), payload));
                    }
                    Err(err) => tracing::warn!(error = %err, "could not encode a mail event; dropped"),
                }
            }
        }
    }

    #[async_trait]
    impl EventBus for RedisBus {
        async fn subscribe(&self, user: &UserId) -> Result<EventSubscription, BusError> {
            let fail = |e: redis::RedisError| BusError { user: user.to_string(), source: Box::new(e) };
            let mut pubsub = self.client.get_async_pubsub().await.map_err(fail)?;
            pubsub.subscribe(self.channel(user.as_str())).await.map_err(fail)?;
            let (tx, rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
            let user = user.to_string();
            let forwarder = tokio::spawn(async move {
                let mut messages = pubsub.into_on_message();
                while let Some(msg) = messages.next().await {
                    let event =
                        msg.get_payload::<String>().ok().and_then(|p| serde_json::from_str::<MailEvent>(&p).ok());
                    match event {
                        Some(e) if e.user == user => {
                            if tx.send(e).await.is_err() {
                                return;
                            }
                        }
                        _ => tracing::warn!(user, "a mail event on the user's channel is not one; ignored"),
                    }
                }
                tracing::warn!(user, "mail event subscription lost");
            });
            Ok(EventSubscription::new(rx, Some(forwarder)))
        }
    }
}
