//! [`BucketLeases`] in memory: the reference the Lua scripts follow.
//!
//! The free pool and the live workers are ordered as Redis orders its sorted
//! sets (by score, then by the member's bytes), so both backends claim the
//! same buckets in the same order.

use std::collections::{BTreeSet, HashMap};

use async_trait::async_trait;
use leasehold_core::{
    BalancePolicy, BucketBinding, BucketChanges, BucketCount, BucketId, BucketLease, BucketLeases, BucketTick,
    FencingToken, LeaseError, Ttl, WorkerId,
};

use crate::MemoryStore;

#[derive(Debug, Clone)]
struct Owner {
    worker: WorkerId,
    token: FencingToken,
}

#[derive(Debug, Default)]
pub(crate) struct BucketState {
    count: Option<BucketCount>,
    weights: HashMap<BucketId, u64>,
    versions: HashMap<BucketId, u64>,
    total: u64,
    fences: HashMap<BucketId, u64>,
    owners: HashMap<BucketId, Owner>,
    /// Every bucket of weight > 0 or with an owner, by (expiry, member):
    /// 0 for a released or never-owned bucket.
    expiry: BTreeSet<(u64, String)>,
    expiry_of: HashMap<BucketId, u64>,
    /// Live workers by (expiry, name).
    workers: BTreeSet<(u64, String)>,
    worker_expiry: HashMap<WorkerId, u64>,
    /// Each live worker's load as of its last tick.
    loads: HashMap<WorkerId, u64>,
}

impl BucketState {
    fn weight(&self, bucket: BucketId) -> u64 {
        self.weights.get(&bucket).copied().unwrap_or(0)
    }

    fn set_expiry(&mut self, bucket: BucketId, at: Option<u64>) {
        if let Some(old) = self.expiry_of.remove(&bucket) {
            self.expiry.remove(&(old, bucket.to_string()));
        }
        if let Some(at) = at {
            self.expiry.insert((at, bucket.to_string()));
            self.expiry_of.insert(bucket, at);
        }
    }

    fn is_current(&self, lease: &BucketLease, now: u64) -> bool {
        let alive = self.expiry_of.get(&lease.bucket).is_some_and(|&at| at >= now);
        alive && self.owners.get(&lease.bucket).is_some_and(|o| o.worker == lease.owner && o.token == lease.token)
    }

    fn set_weight(&mut self, bucket: BucketId, weight: u64) {
        *self.versions.entry(bucket).or_insert(0) += 1;
        let old = self.weight(bucket);
        self.total = self.total - old + weight;
        if weight == 0 {
            self.weights.remove(&bucket);
            if !self.owners.contains_key(&bucket) {
                self.set_expiry(bucket, None);
            }
        } else {
            self.weights.insert(bucket, weight);
            if !self.expiry_of.contains_key(&bucket) {
                self.set_expiry(bucket, Some(0));
            }
        }
    }

    /// Frees a current lease: into the pool if it has weight.
    fn release(&mut self, lease: &BucketLease, now: u64) -> bool {
        if !self.is_current(lease, now) {
            return false;
        }
        self.owners.remove(&lease.bucket);
        let free = (self.weight(lease.bucket) > 0).then_some(0);
        self.set_expiry(lease.bucket, free);
        true
    }

    fn forget_worker(&mut self, worker: &WorkerId) {
        if let Some(at) = self.worker_expiry.remove(worker) {
            self.workers.remove(&(at, worker.to_string()));
        }
        self.loads.remove(worker);
    }

    fn register(&mut self, owner: &WorkerId, until: u64) {
        if let Some(at) = self.worker_expiry.remove(owner) {
            self.workers.remove(&(at, owner.to_string()));
        }
        self.workers.insert((until, owner.to_string()));
        self.worker_expiry.insert(owner.clone(), until);
    }

    fn tick(
        &mut self,
        owner: &WorkerId,
        held: &[BucketLease],
        ttl: Ttl,
        policy: &BalancePolicy,
        now: u64,
    ) -> BucketTick {
        let until = now.saturating_add(ttl.as_millis());
        self.register(owner, until);
        let dead: Vec<String> = self.workers.iter().take_while(|(at, _)| *at < now).map(|(_, w)| w.clone()).collect();
        for name in dead {
            if let Ok(worker) = WorkerId::new(&name) {
                self.forget_worker(&worker);
            }
        }

        let mut tick = BucketTick::default();
        let mut load = 0;
        let mut kept_weights = Vec::new();
        for lease in held {
            if self.is_current(lease, now) {
                self.set_expiry(lease.bucket, Some(until));
                let weight = self.weight(lease.bucket);
                load += weight;
                kept_weights.push((lease.bucket, weight));
                tick.kept.push(lease.clone());
            } else {
                tick.lost.push(lease.clone());
            }
        }

        let workers = self.workers.len() as u64;
        let total = self.total;
        let cap = policy.cap(total, workers);
        if load * workers < total {
            let candidates: Vec<(u64, String)> = self
                .expiry
                .iter()
                .take_while(|(at, _)| *at < now)
                .take(policy.max_claims() as usize)
                .cloned()
                .collect();
            for (_, member) in candidates {
                let Ok(raw) = member.parse::<u32>() else { continue };
                let bucket = BucketId(raw);
                let weight = self.weight(bucket);
                if weight == 0 {
                    self.owners.remove(&bucket);
                    self.set_expiry(bucket, None);
                    continue;
                }
                if load * workers >= total {
                    break;
                }
                if load > 0 && load + weight > cap {
                    continue;
                }
                let counter = self.fences.entry(bucket).or_insert(0);
                *counter += 1;
                let token = FencingToken(*counter);
                self.owners.insert(bucket, Owner { worker: owner.clone(), token });
                self.set_expiry(bucket, Some(until));
                load += weight;
                tick.claimed.push(BucketLease { bucket, owner: owner.clone(), token });
            }
        } else {
            let least_other = self.loads.iter().filter(|(w, _)| *w != owner).map(|(_, l)| *l).min();
            for bucket in policy.sheds(&kept_weights, load, total, workers, least_other) {
                load -= self.weight(bucket);
                if let Some(lease) = tick.kept.iter().find(|l| l.bucket == bucket) {
                    tick.shed.push(lease.clone());
                }
            }
        }
        self.loads.insert(owner.clone(), load);
        tick.versions = tick
            .kept
            .iter()
            .chain(&tick.claimed)
            .map(|l| (l.bucket, self.versions.get(&l.bucket).copied().unwrap_or(0)))
            .collect();
        tick.workers = workers;
        tick.total_weight = total;
        tick.load = load;
        tick.cap = cap;
        tick.soonest_expiry =
            self.expiry.range((now, String::new())..).next().map(|(at, _)| std::time::Duration::from_millis(at - now));
        tick
    }
}

#[async_trait]
impl BucketLeases for MemoryStore {
    async fn bind_buckets(&self, count: BucketCount) -> Result<BucketBinding, LeaseError> {
        let mut state = self.inner.buckets.lock();
        let recorded_now = state.count.is_none();
        Ok(BucketBinding { count: *state.count.get_or_insert(count), recorded_now })
    }

    async fn add_weight(&self, bucket: BucketId, delta: i64) -> Result<u64, LeaseError> {
        let weight = {
            let mut state = self.inner.buckets.lock();
            let weight = state.weight(bucket).saturating_add_signed(delta);
            state.set_weight(bucket, weight);
            weight
        };
        // No subscriber is not an error: the change count is the record.
        let _ = self.inner.bucket_changes.send(bucket);
        Ok(weight)
    }

    async fn subscribe_bucket_changes(&self) -> Result<BucketChanges, LeaseError> {
        Ok(BucketChanges::new(self.inner.bucket_changes.subscribe()))
    }

    async fn set_weights(&self, weights: &[(BucketId, u64)]) -> Result<(), LeaseError> {
        let mut state = self.inner.buckets.lock();
        for &(bucket, weight) in weights {
            state.set_weight(bucket, weight);
        }
        Ok(())
    }

    async fn join(&self, owner: &WorkerId, ttl: Ttl) -> Result<(), LeaseError> {
        let until = self.now_ms().saturating_add(ttl.as_millis());
        let mut state = self.inner.buckets.lock();
        state.register(owner, until);
        state.loads.entry(owner.clone()).or_insert(0);
        Ok(())
    }

    async fn tick(
        &self,
        owner: &WorkerId,
        held: &[BucketLease],
        ttl: Ttl,
        policy: &BalancePolicy,
    ) -> Result<BucketTick, LeaseError> {
        let now = self.now_ms();
        Ok(self.inner.buckets.lock().tick(owner, held, ttl, policy, now))
    }

    async fn release_buckets(&self, leases: &[BucketLease]) -> Result<Vec<bool>, LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.buckets.lock();
        Ok(leases.iter().map(|lease| state.release(lease, now)).collect())
    }

    async fn leave(&self, owner: &WorkerId, held: &[BucketLease]) -> Result<(), LeaseError> {
        let now = self.now_ms();
        let mut state = self.inner.buckets.lock();
        for lease in held {
            state.release(lease, now);
        }
        state.forget_worker(owner);
        Ok(())
    }

    async fn bucket_holder(&self, bucket: BucketId) -> Result<Option<BucketLease>, LeaseError> {
        let now = self.now_ms();
        let state = self.inner.buckets.lock();
        let alive = state.expiry_of.get(&bucket).is_some_and(|&at| at >= now);
        Ok(state.owners.get(&bucket).filter(|_| alive).map(|o| BucketLease {
            bucket,
            owner: o.worker.clone(),
            token: o.token,
        }))
    }

    async fn weight(&self, bucket: BucketId) -> Result<u64, LeaseError> {
        Ok(self.inner.buckets.lock().weight(bucket))
    }

    async fn raise_bucket_token(&self, bucket: BucketId, past: FencingToken) -> Result<(), LeaseError> {
        let mut state = self.inner.buckets.lock();
        let counter = state.fences.entry(bucket).or_insert(0);
        *counter = (*counter).max(past.0);
        Ok(())
    }
}
