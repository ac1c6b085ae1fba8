//! The in-process [`UserBus`]: each subscription is a bounded channel that
//! `publish` fills directly (no task, no copy per other user).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::bus::{BusError, BusSubscription, UserBus};
use leasehold_core::UserId;
use parking_lot::Mutex;
use tokio::sync::mpsc;

type Subscribers = HashMap<UserId, Vec<(u64, mpsc::Sender<Vec<u8>>)>>;

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    subscribers: Subscribers,
}

/// Per-user topics within one process. Cheap to clone; clones share topics.
#[derive(Debug, Clone, Default)]
pub struct MemoryBus {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryBus {
    /// A bus with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Unsubscribes one subscription when dropped.
struct Unsubscribe {
    inner: Arc<Mutex<Inner>>,
    user: UserId,
    id: u64,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let mut inner = self.inner.lock();
        if let Some(subs) = inner.subscribers.get_mut(&self.user) {
            subs.retain(|(id, _)| *id != self.id);
            if subs.is_empty() {
                inner.subscribers.remove(&self.user);
            }
        }
    }
}

#[async_trait]
impl UserBus for MemoryBus {
    fn publish(&self, user: &UserId, payload: Vec<u8>) {
        let inner = self.inner.lock();
        let Some(subs) = inner.subscribers.get(user) else { return };
        for (_, tx) in subs {
            // A subscriber SUBSCRIBER_CAPACITY behind misses this one (the contract).
            let _ = tx.try_send(payload.clone());
        }
    }

    async fn subscribe(&self, user: &UserId) -> Result<BusSubscription, BusError> {
        let mut inner = self.inner.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        let guard = Unsubscribe { inner: self.inner.clone(), user: user.clone(), id };
        let (tx, sub) = BusSubscription::channel(guard);
        inner.subscribers.entry(user.clone()).or_default().push((id, tx));
        Ok(sub)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn user(s: &str) -> UserId {
        UserId::new(s).unwrap()
    }

    #[tokio::test]
    async fn a_subscriber_sees_only_its_users_messages_in_order_until_dropped() {
        let bus = MemoryBus::new();
        let mut alice = bus.subscribe(&user("alice")).await.unwrap();
        let mut alice2 = bus.subscribe(&user("alice")).await.unwrap();
        bus.publish(&user("bob"), b"b1".to_vec());
        bus.publish(&user("alice"), b"a1".to_vec());
        leasehold_core::bus::publish_json(&bus, &user("alice"), &serde_json::json!({"n": 2}));
        assert_eq!(alice.recv().await.unwrap(), b"a1");
        assert_eq!(alice.recv().await.unwrap(), br#"{"n":2}"#);
        assert_eq!(alice2.recv().await.unwrap(), b"a1");
        assert!(tokio::time::timeout(Duration::from_millis(50), alice.recv()).await.is_err());
        drop(alice);
        drop(alice2);
        assert!(bus.inner.lock().subscribers.is_empty(), "dropping unsubscribes");
    }
}
