//! Mail events: how the engine's writes reach the API's WebSockets.
//!
//! The storage publishes one [`MailEvent`] per message it stored, changed or
//! deleted, once the write's transaction has committed, to the
//! [`MailEventSink`] it was given ([`crate::storage::Storage::with_events`]).
//! An [`EventBus`] is a sink that API processes can also subscribe to, one
//! user at a time: [`MemoryBus`] within one process (`sync-worker serve`),
//! Redis pub/sub on a channel per user across processes (see
//! [`crate::wiring::connect_bus`]).
//!
//! Delivery is at most once per subscriber and only to subscribers present
//! when the event is published, like any pub/sub; a batch that a worker
//! stores twice after a crash publishes its `message.new` events twice, so
//! clients key messages by id.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::UserId;
use tokio::sync::{broadcast, mpsc};

use crate::runner::AbortOnDrop;

/// What happened to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MailEventKind {
    /// It was stored for the first time.
    #[serde(rename = "message.new")]
    New,
    /// Its flags changed.
    #[serde(rename = "message.updated")]
    Updated,
    /// It was expunged on the server and deleted here.
    #[serde(rename = "message.deleted")]
    Deleted,
}

impl MailEventKind {
    /// The event's name on the wire (`message.new`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            MailEventKind::New => "message.new",
            MailEventKind::Updated => "message.updated",
            MailEventKind::Deleted => "message.deleted",
        }
    }
}

/// One message stored, changed or deleted for one user's account.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MailEvent {
    /// The account's user (a UUID).
    pub user: String,
    /// The account (a UUID).
    pub account: String,
    /// What happened.
    pub kind: MailEventKind,
    /// The folder.
    pub folder: String,
    /// The folder's UIDVALIDITY.
    pub uidvalidity: u32,
    /// The message's UID.
    pub uid: u32,
}

/// Where the storage sends the events of committed writes. Publishing
/// never blocks the writer and never fails it: an event that cannot be
/// delivered is logged and dropped.
pub trait MailEventSink: Send + Sync + Debug + 'static {
    /// Publishes `events` (all of one account, in order).
    fn publish(&self, events: Vec<MailEvent>);
}

/// Why a subscription could not be made.
#[derive(Debug, thiserror::Error)]
#[error("could not subscribe to the mail events of user {user}")]
pub struct BusError {
    /// The user.
    pub user: String,
    /// Why.
    #[source]
    pub source: crate::errors::BoxError,
}

/// A [`MailEventSink`] that can also be listened to, per user.
#[async_trait]
pub trait EventBus: MailEventSink {
    /// The events of `user`'s accounts published from now on.
    async fn subscribe(&self, user: &UserId) -> Result<EventSubscription, BusError>;
}

/// How many events a subscriber may fall behind before it loses the oldest.
pub const SUBSCRIBER_CAPACITY: usize = 1024;

/// One user's events. Dropping it unsubscribes.
#[derive(Debug)]
pub struct EventSubscription {
    rx: mpsc::Receiver<MailEvent>,
    _forwarder: Option<AbortOnDrop<()>>,
}

impl EventSubscription {
    /// A subscription fed through `rx`, kept alive by `forwarder` (stopped on drop).
    pub fn new(rx: mpsc::Receiver<MailEvent>, forwarder: Option<tokio::task::JoinHandle<()>>) -> Self {
        Self { rx, _forwarder: forwarder.map(AbortOnDrop) }
    }

    /// The next event; `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<MailEvent> {
        self.rx.recv().await
    }
}

/// The in-process bus: one broadcast channel, each subscription keeps its user's events.
#[derive(Debug, Clone)]
pub struct MemoryBus {
    tx: broadcast::Sender<Arc<MailEvent>>,
}

impl Default for MemoryBus {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBus {
    /// A bus with no subscribers.
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self { tx }
    }
}

impl MailEventSink for MemoryBus {
    fn publish(&self, events: Vec<MailEvent>) {
        for e in events {
            // No subscriber is not an error.
            let _ = self.tx.send(Arc::new(e));
        }
    }
}

#[async_trait]
impl EventBus for MemoryBus {
    async fn subscribe(&self, user: &UserId) -> Result<EventSubscription, BusError> {
        let mut rx = self.tx.subscribe();
        let (out, sub_rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
        let user = user.as_str().to_string();
        let forwarder = tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(e) if e.user == user => {
                        if out.send(MailEvent::clone(&e)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(skipped)) => {
                        tracing::warn!(user, skipped, "mail event subscriber fell behind; skipped events");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(EventSubscription::new(sub_rx, Some(forwarder)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(user: &str, uid: u32) -> MailEvent {
        MailEvent {
            user: user.into(),
            account: "a".into(),
            kind: MailEventKind::New,
            folder: "INBOX".into(),
            uidvalidity: 1,
            uid,
        }
    }

    #[tokio::test]
    async fn a_subscriber_sees_only_its_users_events_in_order() {
        let bus = MemoryBus::new();
        let alice = UserId::new("alice").unwrap();
        let mut sub = bus.subscribe(&alice).await.unwrap();
        bus.publish(vec![event("bob", 1), event("alice", 2), event("alice", 3)]);
        assert_eq!(sub.recv().await.unwrap().uid, 2);
        assert_eq!(sub.recv().await.unwrap().uid, 3);
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), sub.recv()).await.is_err());
    }

    #[test]
    fn kinds_have_their_wire_names() {
        assert_eq!(serde_json::to_string(&MailEventKind::New).unwrap(), "\"message.new\"");
        assert_eq!(MailEventKind::Deleted.as_str(), "message.deleted");
    }
}
