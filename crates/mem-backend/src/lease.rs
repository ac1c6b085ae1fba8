//! [`LeaseStore`] in memory: the seed's lease primitives plus fencing tokens.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use leasehold_core::{FencingToken, Lease, LeaseError, LeaseKey, LeaseStore, Tier, Ttl, UserId, WorkerId};

use crate::MemoryStore;

/// An entry lives while `now <= expires_at_ms` (Redis expires a key once `now > when`).
pub(crate) fn alive(expires_at_ms: u64, now: u64) -> bool {
    now <= expires_at_ms
}

pub(crate) fn deadline(now: u64, ttl: Ttl) -> u64 {
    now.saturating_add(ttl.as_millis())
}

#[derive(Debug)]
struct Held {
    owner: WorkerId,
    token: FencingToken,
    expires_at_ms: u64,
}

#[derive(Debug, Default)]
pub(crate) struct LeaseState {
    held: HashMap<LeaseKey, Held>,
    /// Last token handed out per key; outlives the lease so tokens never repeat.
    fences: HashMap<LeaseKey, u64>,
    live: BTreeSet<LeaseKey>,
    deployment: Option<String>,
    workers: HashMap<WorkerId, u64>,
    pub(crate) tiers: HashMap<LeaseKey, Tier>,
    pub(crate) sessions: HashMap<UserId, u64>,
}

impl LeaseState {
    fn current(&self, key: &LeaseKey, now: u64) -> Option<&Held> {
        self.held.get(key).filter(|h| alive(h.expires_at_ms, now))
    }

    fn is_current(&self, lease: &Lease, now: u64) -> bool {
        self.current(&lease.key, now).is_some_and(|h| h.owner == lease.owner && h.token == lease.token)
    }

    fn claim(&mut self, key: &LeaseKey, owner: &WorkerId, ttl: Ttl, now: u64) -> Option<Lease> {
        if self.current(key, now).is_some() {
            return None;
        }
        let counter = self.fences.entry(key.clone()).or_insert(0);
        *counter += 1;
        let token = FencingToken(*counter);
        self.held.insert(key.clone(), Held { owner: owner.clone(), token, expires_at_ms: deadline(now, ttl) });
        self.tiers.entry(key.clone()).or_insert(Tier::Warm);
        Some(Lease { key: key.clone(), owner: owner.clone(), token })
    }

    fn renew(&mut self, lease: &Lease, ttl: Ttl, now: u64) -> bool {
        if !self.is_current(lease, now) {
            return false;
        }
        if let Some(held) = self.held.get_mut(&lease.key) {
            held.expires_at_ms = deadline(now, ttl);
        }
        true
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn claim(&self, key: &LeaseKey, owner: &WorkerId, ttl: Ttl) -> Result<Option<Lease>, LeaseError> {
        let now = self.now_ms();
        Ok(self.inner.leases.lock().claim(key, owner, ttl, now))
    }

    async fn claim_many(&self, keys: &[LeaseKey], owner: &WorkerId, ttl: Ttl) -> Result<Vec<Lease>, LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.leases.lock();
        Ok(keys.iter().filter_map(|key| state.claim(key, owner, ttl, now)).collect())
    }

    async fn renew(&self, lease: &Lease, ttl: Ttl) -> Result<bool, LeaseError> {
        let now = self.now_ms();
        Ok(self.inner.leases.lock().renew(lease, ttl, now))
    }

    async fn renew_many(&self, leases: &[Lease], ttl: Ttl) -> Result<Vec<bool>, LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.leases.lock();
        Ok(leases.iter().map(|lease| state.renew(lease, ttl, now)).collect())
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.leases.lock();
        if !state.is_current(lease, now) {
            return Ok(false);
        }
        state.held.remove(&lease.key);
        Ok(true)
    }

    async fn bind_deployment(&self, deployment: &str) -> Result<String, LeaseError> {
        let mut state = self.inner.leases.lock();
        Ok(state.deployment.get_or_insert_with(|| deployment.to_string()).clone())
    }

    async fn raise_token(&self, key: &LeaseKey, past: FencingToken) -> Result<(), LeaseError> {
        let mut state = self.inner.leases.lock();
        let counter = state.fences.entry(key.clone()).or_insert(0);
        *counter = (*counter).max(past.0);
        Ok(())
    }

    async fn holder(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        let now = self.now_ms();
        let state = self.inner.leases.lock();
        Ok(state.current(key, now).map(|h| Lease { key: key.clone(), owner: h.owner.clone(), token: h.token }))
    }

    async fn mark_live(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        self.inner.leases.lock().live.insert(key.clone());
        Ok(())
    }

    async fn mark_not_live(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        let mut state = self.inner.leases.lock();
        state.live.remove(key);
        state.held.remove(key);
        state.tiers.remove(key);
        Ok(())
    }

    async fn live_keys(&self) -> Result<Vec<LeaseKey>, LeaseError> {
        Ok(self.inner.leases.lock().live.iter().cloned().collect())
    }

    async fn register_worker(&self, worker: &WorkerId, ttl: Ttl) -> Result<(), LeaseError> {
        let now = self.now_ms();
        self.inner.leases.lock().workers.insert(worker.clone(), deadline(now, ttl));
        Ok(())
    }

    async fn deregister_worker(&self, worker: &WorkerId) -> Result<(), LeaseError> {
        self.inner.leases.lock().workers.remove(worker);
        Ok(())
    }

    async fn live_workers(&self) -> Result<Vec<WorkerId>, LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.leases.lock();
        state.workers.retain(|_, expires| alive(*expires, now));
        let mut workers: Vec<WorkerId> = state.workers.keys().cloned().collect();
        workers.sort();
        Ok(workers)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use leasehold_core::ManualClock;

    use super::*;

    fn key(s: &str) -> LeaseKey {
        LeaseKey::new(s).unwrap()
    }
    fn worker(s: &str) -> WorkerId {
        WorkerId::new(s).unwrap()
    }

    #[tokio::test]
    async fn lease_lives_until_its_ttl_inclusive() {
        let clock = Arc::new(ManualClock::new(1000));
        let store = MemoryStore::with_clock(clock.clone());
        let lease = store.claim(&key("a"), &worker("w1"), Ttl::from_millis(100)).await.unwrap().unwrap();
        clock.advance(Duration::from_millis(100));
        assert_eq!(store.holder(&key("a")).await.unwrap(), Some(lease.clone()));
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.holder(&key("a")).await.unwrap(), None);
        assert!(!store.renew(&lease, Ttl::from_secs(1)).await.unwrap());
        let next = store.claim(&key("a"), &worker("w2"), Ttl::from_secs(1)).await.unwrap().unwrap();
        assert!(next.token > lease.token);
    }

    #[tokio::test(start_paused = true)]
    async fn default_clock_follows_paused_tokio_time() {
        let store = MemoryStore::new();
        let lease = store.claim(&key("a"), &worker("w1"), Ttl::from_secs(30)).await.unwrap().unwrap();
        store.register_worker(&worker("w1"), Ttl::from_secs(30)).await.unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(store.renew(&lease, Ttl::from_secs(30)).await.unwrap());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(store.live_workers().await.unwrap().is_empty(), "worker registration outlived its TTL");
        // Renewed at 29 s for 30 s: held until 59 s.
        tokio::time::advance(Duration::from_secs(27)).await;
        assert_eq!(store.holder(&key("a")).await.unwrap(), Some(lease.clone()));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(store.holder(&key("a")).await.unwrap(), None);
    }
}
