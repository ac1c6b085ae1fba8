//! Subscriptions to a store's notices (`user.active` events, bucket change
//! notices): each published value, in order, from the moment of subscribing.

use tokio::sync::broadcast;

/// A subscription to one kind of notice: each published value, in order.
///
/// Notices published before the subscription was made are not seen. A
/// subscriber that falls far behind skips the oldest (it is told how many
/// through `tracing`) rather than blocking publishers.
#[derive(Debug)]
pub struct Notices<T> {
    rx: broadcast::Receiver<T>,
}

impl<T: Clone> Notices<T> {
    /// Wraps the receiving end of a broadcast channel that carries the notices.
    pub fn new(rx: broadcast::Receiver<T>) -> Self {
        Self { rx }
    }

    /// The next notice; `None` once the store is gone.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            match self.rx.recv().await {
                Ok(value) => return Some(value),
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::warn!(
                        skipped,
                        kind = std::any::type_name::<T>(),
                        "a subscriber fell behind; skipped notices"
                    );
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}
