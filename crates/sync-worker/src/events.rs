//! Sync events: how the engine's writes and the coordinator's decisions
//! reach the API's WebSockets.
//!
//! * The storage publishes one [`MailEvent`] per message it stored, changed
//!   or deleted, and an [`AccountChanged`] when a poll recorded its outcome
//!   (last sync time or last error), once the write's transaction has
//!   committed, to the [`EventSink`] it was given
//!   ([`crate::storage::Storage::with_events`]).
//! * The coordinator publishes an [`AccountChanged`] when it claims, loses,
//!   sheds or releases an account (its owner changes) and when it changes
//!   an account's tier ([`crate::PreparedCoordinator::with_events`]).
//!
//! An [`EventBus`] is a sink that API processes can also subscribe to, one
//! user at a time. It sends each event as JSON on the user's topic of a
//! [`UserBus`]: in one process (`sync-worker serve`) the in-memory bus, across
//! processes Redis pub/sub (see [`crate::app::wiring::connect_bus`]).
//!
//! Delivery is at most once per subscriber and only to subscribers present
//! when the event is published, like any pub/sub; a batch that a worker
//! stores twice after a crash publishes its `message.new` events twice, so
//! clients key messages by id. An [`AccountChanged`] carries no values: the
//! API reads the account as it is when it sends the `account.status`.
//!
//! **Gaps are told, never silent.** Each publishing process numbers the
//! events of each user (1, 2, 3, ...), and a subscription that sees a number
//! skipped from a process (a full subscriber queue, a Redis reconnect)
//! marks the next event it gets as [`Received::after_gap`]; the API then
//! tells the client to fetch again (`{"type":"resync"}`).

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use parking_lot::Mutex;

use leasehold_core::bus::{publish_json, BusError, BusSubscription, UserBus};
use leasehold_core::UserId;

/// What happened to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
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

    /// Every kind, in the order of their names on the wire.
    pub const ALL: [MailEventKind; 3] = [MailEventKind::New, MailEventKind::Updated, MailEventKind::Deleted];

    /// The kind named `name` on the wire; `None` for any other name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
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
    /// When the write that made it was committed (ms since the epoch; 0
    /// from a publisher that did not say): what push latency is measured from.
    #[serde(default)]
    pub committed_at_ms: i64,
}

/// One account's tier, owner, last sync time or last error changed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AccountChanged {
    /// The account's user (a UUID).
    pub user: String,
    /// The account (a UUID).
    pub account: String,
}

/// One of the user's sessions ended (logout): its WebSockets close, in
/// every API process. Carries the hash of the token, never the token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionEnded {
    /// The session's user (a UUID).
    pub user: String,
    /// The hash of the session's token (what the database stores).
    pub token_hash: String,
}

/// Anything a user's WebSockets hear of.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SyncEvent {
    /// A message event.
    Mail(MailEvent),
    /// An account's status changed.
    Account(AccountChanged),
    /// A session ended.
    SessionEnded(SessionEnded),
}

impl SyncEvent {
    /// The user whose account it concerns.
    pub fn user(&self) -> &str {
        match self {
            SyncEvent::Mail(e) => &e.user,
            SyncEvent::Account(e) => &e.user,
            SyncEvent::SessionEnded(e) => &e.user,
        }
    }
}

impl From<MailEvent> for SyncEvent {
    fn from(e: MailEvent) -> Self {
        SyncEvent::Mail(e)
    }
}

impl From<AccountChanged> for SyncEvent {
    fn from(e: AccountChanged) -> Self {
        SyncEvent::Account(e)
    }
}

/// Where the storage and the coordinator send their events. Publishing
/// never blocks the caller and never fails it: an event that cannot be
/// delivered is logged and dropped.
pub trait EventSink: Send + Sync + Debug + 'static {
    /// Publishes `events` (in order).
    fn publish(&self, events: Vec<SyncEvent>);
}

/// An event as it travels on the bus: numbered per user by its publisher.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Envelope {
    /// The publishing process (a random id per [`EventBus`]).
    origin: String,
    /// This user's events from `origin`, counted from 1.
    seq: u64,
    event: SyncEvent,
}

/// Events as JSON on a [`UserBus`], one topic per user. Cheap to clone;
/// clones share the numbering.
#[derive(Debug, Clone)]
pub struct EventBus {
    bus: Arc<dyn UserBus>,
    origin: Arc<str>,
    /// The last number given to each user's events. Held while publishing,
    /// so numbers go out in order.
    numbers: Arc<Mutex<HashMap<String, u64>>>,
}

impl EventBus {
    /// Events over `bus`.
    pub fn new(bus: Arc<dyn UserBus>) -> Self {
        let origin = uuid::Uuid::new_v4().simple().to_string().into();
        Self { bus, origin, numbers: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// The events of `user`'s accounts published from now on.
    pub async fn subscribe(&self, user: &UserId) -> Result<EventSubscription, BusError> {
        Ok(EventSubscription { user: user.clone(), sub: self.bus.subscribe(user).await?, seen: HashMap::new() })
    }
}

impl EventSink for EventBus {
    fn publish(&self, events: Vec<SyncEvent>) {
        let mut numbers = self.numbers.lock();
        for event in events {
            let user = match UserId::new(event.user()) {
                Ok(user) => user,
                Err(err) => {
                    tracing::warn!(user = event.user(), error = %err, "an event's user is not a user id; dropped");
                    continue;
                }
            };
            let n = numbers.entry(user.to_string()).or_insert(0);
            *n += 1;
            let envelope = Envelope { origin: self.origin.to_string(), seq: *n, event };
            publish_json(self.bus.as_ref(), &user, &envelope);
        }
    }
}

/// One event as a subscription received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The event.
    pub event: SyncEvent,
    /// Whether events were lost before it (a number skipped by its publisher).
    pub after_gap: bool,
}

/// One user's events. Dropping it unsubscribes.
#[derive(Debug)]
pub struct EventSubscription {
    user: UserId,
    sub: BusSubscription,
    /// The highest number seen from each publisher.
    seen: HashMap<String, u64>,
}

impl EventSubscription {
    /// The next event; `None` once the bus is gone. Messages on the topic
    /// that are not this user's events are logged and skipped.
    pub async fn recv(&mut self) -> Option<Received> {
        loop {
            let payload = self.sub.recv().await?;
            // A process of an older version publishes bare events, unnumbered.
            let (event, numbered) = match serde_json::from_slice::<Envelope>(&payload) {
                Ok(e) => (Ok(e.event), Some((e.origin, e.seq))),
                Err(_) => (serde_json::from_slice::<SyncEvent>(&payload), None),
            };
            match event {
                Ok(event) if event.user() == self.user.as_str() => {
                    let after_gap = numbered.is_some_and(|(origin, seq)| self.gap_before(origin, seq));
                    return Some(Received { event, after_gap });
                }
                Ok(_) => tracing::warn!(user = %self.user, "another user's event on the user's topic; ignored"),
                Err(err) => tracing::warn!(user = %self.user, error = %err, "a bus message is not an event; ignored"),
            }
        }
    }

    /// Records `seq` from `origin`; whether numbers were skipped before it.
    /// The first event from a publisher has nothing to compare with.
    fn gap_before(&mut self, origin: String, seq: u64) -> bool {
        match self.seen.get_mut(&origin) {
            Some(last) => {
                let gap = seq > *last + 1;
                *last = (*last).max(seq);
                gap
            }
            None => {
                self.seen.insert(origin, seq);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(user: &str, uid: u32) -> SyncEvent {
        SyncEvent::Mail(MailEvent {
            user: user.into(),
            account: "a".into(),
            kind: MailEventKind::New,
            folder: "INBOX".into(),
            uidvalidity: 1,
            uid,
            committed_at_ms: 0,
        })
    }

    #[tokio::test]
    async fn a_subscriber_sees_only_its_users_events_in_order() {
        let bus = crate::app::wiring::memory_bus();
        let alice = UserId::new("alice").unwrap();
        let mut sub = bus.subscribe(&alice).await.unwrap();
        let changed = SyncEvent::Account(AccountChanged { user: "alice".into(), account: "a".into() });
        bus.publish(vec![event("bob", 1), event("alice", 2), changed.clone(), event("alice", 3)]);
        assert_eq!(sub.recv().await.unwrap().event, event("alice", 2));
        assert_eq!(sub.recv().await.unwrap().event, changed);
        assert_eq!(sub.recv().await.unwrap().event, event("alice", 3));
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), sub.recv()).await.is_err());
    }

    #[tokio::test]
    async fn a_subscriber_that_fell_behind_is_told_once_at_the_next_event() {
        let bus = crate::app::wiring::memory_bus();
        let alice = UserId::new("alice").unwrap();
        let mut sub = bus.subscribe(&alice).await.unwrap();
        // More than the subscriber's queue holds, while it reads nothing.
        let n = leasehold_core::bus::SUBSCRIBER_CAPACITY as u32 + 10;
        bus.publish((1..=n).map(|uid| event("alice", uid)).collect());
        let mut received = Vec::new();
        while let Ok(Some(r)) = tokio::time::timeout(std::time::Duration::from_millis(50), sub.recv()).await {
            received.push(r);
        }
        assert!(received.len() < n as usize, "the queue dropped nothing: no gap to see");
        assert!(received.iter().all(|r| !r.after_gap), "the gap is at the end: nothing after it yet");
        bus.publish(vec![event("alice", n + 1)]);
        let next = sub.recv().await.unwrap();
        assert!(next.after_gap, "{next:?}");
        bus.publish(vec![event("alice", n + 2)]);
        assert!(!sub.recv().await.unwrap().after_gap, "told once");
    }

    #[tokio::test]
    async fn numbers_are_per_user_so_other_users_events_are_no_gap() {
        let bus = crate::app::wiring::memory_bus();
        let alice = UserId::new("alice").unwrap();
        let mut sub = bus.subscribe(&alice).await.unwrap();
        bus.publish(vec![event("alice", 1), event("bob", 2), event("bob", 3), event("alice", 4)]);
        assert!(!sub.recv().await.unwrap().after_gap);
        assert!(!sub.recv().await.unwrap().after_gap);
    }

    #[test]
    fn kinds_have_their_wire_names() {
        assert_eq!(serde_json::to_string(&MailEventKind::New).unwrap(), "\"message.new\"");
        assert_eq!(MailEventKind::Deleted.as_str(), "message.deleted");
    }
}
