//! Pub/sub channels (`user.active` events, bucket change notices): Redis
//! pub/sub on a connection of its own per channel, forwarded into a
//! broadcast channel.
//!
//! The subscriber task starts with the first subscription and keeps its
//! connection up (reconnecting with backoff, trying each node of a cluster in
//! turn: a plain `PUBLISH` reaches every node of a cluster). Events published
//! while it is reconnecting are not seen, like any pub/sub message published
//! while nobody listens. The task stops when the store is dropped.

use std::time::Duration;

use futures_util::StreamExt;
use leasehold_core::{BucketId, UserId};
use tokio::sync::{broadcast, oneshot, Mutex};
use tokio::task::JoinHandle;

/// How many events a slow subscriber may fall behind before it skips the oldest.
const CAPACITY: usize = 4096;

/// What a channel carries, parsed from each message's payload.
pub(crate) trait Notice: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// The channel's name in logs.
    const WHAT: &'static str;
    /// The notice in `payload`; `None` if it is not one (logged, skipped).
    fn parse(payload: &str) -> Option<Self>;
}

impl Notice for UserId {
    const WHAT: &'static str = "user.active";
    fn parse(payload: &str) -> Option<Self> {
        UserId::new(payload).ok()
    }
}

impl Notice for BucketId {
    const WHAT: &'static str = "bucket change";
    fn parse(payload: &str) -> Option<Self> {
        payload.parse().ok().map(BucketId)
    }
}

#[derive(Debug)]
pub(crate) struct Channel<T: Notice> {
    tx: broadcast::Sender<T>,
    nodes: Vec<String>,
    channel: String,
    connect_timeout: Duration,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl<T: Notice> Channel<T> {
    pub(crate) fn new(nodes: Vec<String>, channel: String, connect_timeout: Duration) -> Self {
        let (tx, _) = broadcast::channel(CAPACITY);
        Self { tx, nodes, channel, connect_timeout, task: Mutex::new(None) }
    }

    /// A receiver of every notice published after it returns.
    pub(crate) async fn subscribe(&self) -> Result<broadcast::Receiver<T>, String> {
        let rx = self.tx.subscribe();
        let mut task = self.task.lock().await;
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            let (ready_tx, ready_rx) = oneshot::channel();
            let handle = tokio::spawn(forward(
                self.nodes.clone(),
                self.channel.clone(),
                self.connect_timeout,
                self.tx.clone(),
                ready_tx,
            ));
            *task = Some(handle);
            match ready_rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(format!("the {} subscriber stopped before it was ready", T::WHAT)),
            }
        }
        Ok(rx)
    }
}

impl<T: Notice> Drop for Channel<T> {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().take() {
            task.abort();
        }
    }
}

async fn connect(url: &str, channel: &str, timeout: Duration) -> Result<redis::aio::PubSub, String> {
    let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
    let fut = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(pubsub)) => Ok(pubsub),
        Ok(Err(e)) => Err(format!("subscribing to {channel} at {url} failed: {e}")),
        Err(_) => Err(format!("subscribing to {channel} at {url} timed out after {timeout:?}")),
    }
}

async fn forward<T: Notice>(
    nodes: Vec<String>,
    channel: String,
    timeout: Duration,
    tx: broadcast::Sender<T>,
    ready: oneshot::Sender<Result<(), String>>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(50);
    let mut node = 0usize;
    loop {
        let url = &nodes[node % nodes.len()];
        match connect(url, &channel, timeout).await {
            Ok(pubsub) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                } else {
                    tracing::info!(url, channel, what = T::WHAT, "subscription restored");
                }
                backoff = Duration::from_millis(50);
                let mut messages = pubsub.into_on_message();
                while let Some(msg) = messages.next().await {
                    let payload: String = match msg.get_payload() {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::warn!(error = %e, what = T::WHAT, "a message that is not a string; ignored");
                            continue;
                        }
                    };
                    match T::parse(&payload) {
                        // No receiver is not an error.
                        Some(notice) => {
                            let _ = tx.send(notice);
                        }
                        None => tracing::warn!(payload, what = T::WHAT, "a message that is no notice; ignored"),
                    }
                }
                tracing::warn!(url, channel, what = T::WHAT, "subscription lost; reconnecting");
            }
            Err(e) => {
                if let Some(ready) = ready.take() {
                    // Nobody has a subscription yet: report and stop; the next
                    // subscribe starts a new task.
                    let _ = ready.send(Err(e));
                    return;
                }
                tracing::warn!(error = %e, retry_in = ?backoff, what = T::WHAT, "subscriber cannot reconnect yet");
                node += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}
