//! Per-user topics: fire-and-forget messages from the processes that change
//! a user's data to the processes that hold the user's connections (a
//! sync worker's writes to the API's WebSockets).
//!
//! Each backend crate has a bus: in one process (`leasehold-mem`), Redis
//! pub/sub across machines (`leasehold-redis`). Messages are opaque bytes;
//! [`publish_json`] sends a value as JSON.
//!
//! # Contract
//!
//! * A subscription receives the messages published on its user's topic
//!   after [`UserBus::subscribe`] returned, and no other user's.
//! * Messages from one publisher arrive in the order they were published.
//! * Delivery is at most once, like any pub/sub: a message published while
//!   nobody listens, while a subscriber is reconnecting, or past a slow
//!   subscriber's [`SUBSCRIBER_CAPACITY`] is not seen by it.
//! * [`UserBus::publish`] never blocks and never fails the caller: what
//!   cannot be sent is logged and dropped.
//! * Dropping a [`BusSubscription`] unsubscribes.

use std::any::Any;
use std::fmt::Debug;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::errors::BoxError;
use crate::ids::UserId;

/// How many messages a subscriber may fall behind before new ones are dropped for it.
pub const SUBSCRIBER_CAPACITY: usize = 1024;

/// Why a subscription could not be made.
#[derive(Debug, thiserror::Error)]
#[error("could not subscribe to the topic of user {user}")]
pub struct BusError {
    /// The user.
    pub user: String,
    /// Why.
    #[source]
    pub source: BoxError,
}

/// Per-user topics of opaque messages (see the [module docs](self) for the contract).
#[async_trait]
pub trait UserBus: Send + Sync + Debug + 'static {
    /// Publishes `payload` on `user`'s topic.
    fn publish(&self, user: &UserId, payload: Vec<u8>);

    /// The messages published on `user`'s topic from now on.
    async fn subscribe(&self, user: &UserId) -> Result<BusSubscription, BusError>;
}

/// Publishes `value` as JSON on `user`'s topic; a value that cannot be
/// encoded is logged and dropped.
pub fn publish_json<T: serde::Serialize + ?Sized>(bus: &dyn UserBus, user: &UserId, value: &T) {
    match serde_json::to_vec(value) {
        Ok(payload) => bus.publish(user, payload),
        Err(e) => tracing::warn!(%user, error = %e, "could not encode a bus message; dropped"),
    }
}

/// One user's messages. Dropping it unsubscribes.
pub struct BusSubscription {
    rx: mpsc::Receiver<Vec<u8>>,
    _guard: Box<dyn Any + Send + Sync>,
}

impl Debug for BusSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusSubscription").finish_non_exhaustive()
    }
}

impl BusSubscription {
    /// A subscription fed through `rx`; `guard` is dropped with it (its
    /// `Drop` unsubscribes or stops a forwarding task).
    pub fn new(rx: mpsc::Receiver<Vec<u8>>, guard: impl Any + Send + Sync) -> Self {
        Self { rx, _guard: Box::new(guard) }
    }

    /// A sender/subscription pair with room for [`SUBSCRIBER_CAPACITY`] messages.
    pub fn channel(guard: impl Any + Send + Sync) -> (mpsc::Sender<Vec<u8>>, Self) {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_CAPACITY);
        (tx, Self::new(rx, guard))
    }

    /// The next message; `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await
    }
}

/// Aborts a task when dropped (a guard for [`BusSubscription::new`]).
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
