//! Open WebSockets per user in this process: what `WS_PER_USER` bounds
//! ([`super::ws`]) and `/metrics` counts.

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_core::UserId;
use parking_lot::Mutex;

/// Open WebSockets per user in this process.
#[derive(Debug, Default)]
pub struct SocketCounts {
    open: Mutex<HashMap<UserId, usize>>,
}

/// One open socket of a user, counted until dropped.
#[derive(Debug)]
pub struct SocketSlot {
    counts: Arc<SocketCounts>,
    user: UserId,
}

impl SocketCounts {
    /// A slot for one more socket of `user`; `None` at `limit`.
    pub fn take(self: &Arc<Self>, user: &UserId, limit: usize) -> Option<SocketSlot> {
        let mut open = self.open.lock();
        let n = open.entry(user.clone()).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(SocketSlot { counts: self.clone(), user: user.clone() })
    }

    /// Sockets open in this process, over all users.
    pub fn total(&self) -> usize {
        self.open.lock().values().sum()
    }
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock();
        if let Some(n) = open.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.user);
            }
        }
    }
}
