//! At most [`ConnectGate::per_host`] connection attempts at once to one
//! server host, per process: a restart with hundreds of accounts on one
//! provider queues its logins instead of opening them all at once (Dovecot
//! answered 132 of 400 such connects with greeting timeouts). An attempt
//! holds its place from the TCP connect to the login's answer; an open
//! session holds none.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default of `IMAP_CONNECTS_PER_HOST`.
pub const DEFAULT_CONNECTS_PER_HOST: usize = 8;

/// The places per host. Cheap to clone; clones share the places.
#[derive(Debug, Clone)]
pub struct ConnectGate {
    per_host: NonZeroUsize,
    hosts: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

impl Default for ConnectGate {
    fn default() -> Self {
        Self::new(NonZeroUsize::new(DEFAULT_CONNECTS_PER_HOST).unwrap_or(NonZeroUsize::MIN))
    }
}

impl PartialEq for ConnectGate {
    fn eq(&self, other: &Self) -> bool {
        self.per_host == other.per_host && Arc::ptr_eq(&self.hosts, &other.hosts)
    }
}

impl Eq for ConnectGate {}

/// A place in the gate: the attempt may go on while it is held.
#[derive(Debug)]
pub(crate) struct Place {
    _permit: OwnedSemaphorePermit,
    gate: ConnectGate,
    host: String,
}

impl ConnectGate {
    /// A gate of `per_host` places per host.
    pub fn new(per_host: NonZeroUsize) -> Self {
        Self { per_host, hosts: Arc::default() }
    }

    /// Places per host.
    pub fn per_host(&self) -> NonZeroUsize {
        self.per_host
    }

    /// Waits for a place for `host` (case-insensitive).
    pub(crate) async fn enter(&self, host: &str) -> Place {
        let host = host.to_ascii_lowercase();
        let semaphore = self
            .hosts
            .lock()
            .entry(host.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_host.get())))
            .clone();
        let permit = match semaphore.acquire_owned().await {
            Ok(p) => p,
            // Acquiring fails only on a closed semaphore, and these are never closed.
            Err(_) => unreachable!("a connect gate's semaphore is never closed"),
        };
        Place { _permit: permit, gate: self.clone(), host }
    }
}

impl Drop for Place {
    /// Forgets a host no attempt waits for, so the map holds only busy hosts.
    fn drop(&mut self) {
        let mut hosts = self.gate.hosts.lock();
        if let Some(s) = hosts.get(&self.host) {
            // The map's and this place's permit's are the only references:
            // no other place, and no one waiting.
            if Arc::strong_count(s) == 2 {
                hosts.remove(&self.host);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_host_gets_at_most_n_places_and_others_are_not_held_up() {
        let gate = ConnectGate::new(NonZeroUsize::new(2).unwrap());
        let a1 = gate.enter("imap.example.org").await;
        let _a2 = gate.enter("IMAP.example.org").await;
        let third = tokio::time::timeout(std::time::Duration::from_millis(50), gate.enter("imap.example.org")).await;
        assert!(third.is_err(), "a third place was given");
        let _b = tokio::time::timeout(std::time::Duration::from_millis(50), gate.enter("other.example.org"))
            .await
            .expect("another host waits for nobody");
        drop(a1);
        let _a3 = tokio::time::timeout(std::time::Duration::from_millis(50), gate.enter("imap.example.org"))
            .await
            .expect("a freed place is given");
    }

    #[tokio::test]
    async fn idle_hosts_are_forgotten() {
        let gate = ConnectGate::new(NonZeroUsize::new(3).unwrap());
        drop(gate.enter("a.example").await);
        assert!(gate.hosts.lock().is_empty());
        let held = gate.enter("a.example").await;
        let _other = gate.enter("a.example").await;
        drop(held);
        assert_eq!(gate.hosts.lock().len(), 1, "still in use");
    }
}
