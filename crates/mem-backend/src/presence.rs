//! [`Presence`] in memory: tiers beside the leases (a key's tier goes with
//! its liveness), and users' presence with its broadcast.

use async_trait::async_trait;
use leasehold_core::{LeaseError, LeaseKey, Presence, Tier, Ttl, UserActiveSubscription, UserId};

use crate::lease::{alive, deadline};
use crate::MemoryStore;

#[async_trait]
impl Presence for MemoryStore {
    async fn set_tier(&self, key: &LeaseKey, tier: Tier) -> Result<(), LeaseError> {
        self.inner.leases.lock().tiers.insert(key.clone(), tier);
        Ok(())
    }

    async fn tier(&self, key: &LeaseKey) -> Result<Option<Tier>, LeaseError> {
        Ok(self.inner.leases.lock().tiers.get(key).copied())
    }

    async fn tiers_or_default(&self, keys: &[LeaseKey], default: Tier) -> Result<Vec<Tier>, LeaseError> {
        let mut state = self.inner.leases.lock();
        Ok(keys.iter().map(|k| *state.tiers.entry(k.clone()).or_insert(default)).collect())
    }

    async fn mark_user_active(&self, user: &UserId, grace: Ttl) -> Result<(), LeaseError> {
        let now = self.now_ms();
        self.inner.leases.lock().sessions.insert(user.clone(), deadline(now, grace));
        // No subscriber is not an error: presence is still recorded.
        let _ = self.inner.user_active.send(user.clone());
        Ok(())
    }

    async fn is_user_active(&self, user: &UserId) -> Result<bool, LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.leases.lock();
        match state.sessions.get(user) {
            Some(expires) if alive(*expires, now) => Ok(true),
            Some(_) => {
                state.sessions.remove(user);
                Ok(false)
            }
            None => Ok(false),
        }
    }

    async fn subscribe_user_active(&self) -> Result<UserActiveSubscription, LeaseError> {
        Ok(UserActiveSubscription::new(self.inner.user_active.subscribe()))
    }
}
