//! Shared harness of the acceptance tests: a backend factory, a test
//! environment (scripted source, directory, an admin store handle) and a
//! fault-injecting store wrapper. The cases in `cases.rs` run unchanged on
//! every backend.
#![allow(dead_code)]

pub mod cases;

/// Invokes `$each!` with the name of every acceptance case in `cases`: the one
/// list both backends' test files expand.
macro_rules! acceptance_cases {
    ($each:ident) => {
        $each!(
            claim_up_to_fair_share,
            renew_keeps_leases,
            rebalance_when_worker_joins,
            takeover_after_kill,
            takeover_after_graceful_release,
            mark_not_live_stops_loops,
            lost_lease_stops_writing,
            stolen_lease_is_fenced,
            never_two_workers_at_once,
            tier_session_promotion,
            tier_recent_mail_promotion,
            tier_cold,
            tier_user_active_promotion,
            tier_budget_demotion,
        );
    };
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    BalancePolicy, BucketBinding, BucketChanges, BucketCount, BucketId, BucketLease, BucketLeases, BucketTick, Clock,
    FencingToken, Lease, LeaseError, LeaseKey, LeaseStore, Presence, Tier, TokioClock, Ttl, UserActiveSubscription,
    UserId, WorkerId,
};
use sync_worker::config::Ownership;
use sync_worker::{
    AccountDirectory, Config, Coordinator, CoordinatorHandle, Deps, Leases, MemoryDirectory, ScriptedSource,
};
use tokio::time::Instant;

/// The time scale of a backend's tests.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Lease TTL.
    pub ttl: Duration,
    /// POLL_WARM.
    pub poll_warm: Duration,
    /// POLL_COLD.
    pub poll_cold: Duration,
    /// TIER_EVAL_INTERVAL.
    pub tier_eval: Duration,
    /// Slack added to timing bounds (0 in paused time).
    pub jitter: Duration,
}

impl Scale {
    /// Paused tokio time: the production-like numbers.
    pub fn paused() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            poll_warm: Duration::from_secs(60),
            poll_cold: Duration::from_secs(600),
            tier_eval: Duration::from_secs(120),
            jitter: Duration::ZERO,
        }
    }

    /// Real time (Redis): small numbers.
    pub fn real() -> Self {
        Self {
            ttl: Duration::from_millis(1500),
            poll_warm: Duration::from_millis(400),
            poll_cold: Duration::from_millis(2000),
            tier_eval: Duration::from_millis(1000),
            jitter: Duration::from_millis(400),
        }
    }

    /// The renew interval.
    pub fn tick(&self) -> Duration {
        self.ttl / 3
    }
}

/// Makes stores that share one backend state.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A store handle for one worker (its own connection where that means anything).
    async fn store(&self) -> Arc<dyn Leases>;
    /// The time scale.
    fn scale(&self) -> Scale;
    /// How the workers share the accounts.
    fn ownership(&self) -> Ownership {
        Ownership::Accounts
    }
}

/// The memory backend: clones of one store (tokio clock: paused time drives TTLs).
pub struct Mem {
    store: leasehold_mem::MemoryStore,
    ownership: Ownership,
}

impl Mem {
    /// Per-account leases.
    pub fn backend() -> Arc<dyn Backend> {
        Arc::new(Self { store: leasehold_mem::MemoryStore::new(), ownership: Ownership::Accounts })
    }

    /// Bucket leases.
    pub fn buckets() -> Arc<dyn Backend> {
        Arc::new(Self { store: leasehold_mem::MemoryStore::new(), ownership: Ownership::Buckets })
    }
}

#[async_trait]
impl Backend for Mem {
    async fn store(&self) -> Arc<dyn Leases> {
        Arc::new(self.store.clone())
    }
    fn scale(&self) -> Scale {
        Scale::paused()
    }
    fn ownership(&self) -> Ownership {
        self.ownership
    }
}

/// One test's world.
pub struct Env {
    pub backend: Arc<dyn Backend>,
    pub s: Scale,
    pub admin: Arc<dyn Leases>,
    pub source: ScriptedSource,
    pub directory: MemoryDirectory,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
    /// The users of accounts removed with [`Env::mark_not_live`], for when they come back.
    removed: parking_lot::Mutex<std::collections::HashMap<LeaseKey, UserId>>,
}

pub fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).expect("valid key")
}

pub fn user(name: &str) -> UserId {
    UserId::new(name).expect("valid user")
}

pub fn wid(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid worker")
}

impl Env {
    pub async fn new(backend: Arc<dyn Backend>) -> Self {
        let s = backend.scale();
        let admin = backend.store().await;
        let config = Config {
            poll_warm: s.poll_warm,
            poll_cold: s.poll_cold,
            tier_eval_interval: s.tier_eval,
            tier_hot_activity: Duration::from_secs(2 * 3600),
            tier_cold_after: Duration::from_secs(48 * 3600),
            tier_session_grace: Duration::from_secs(15 * 60),
            hot_budget_per_worker: 1000,
            lease_ttl: s.ttl,
            ownership: backend.ownership(),
            ..Config::default()
        };
        Self {
            backend,
            s,
            admin,
            source: ScriptedSource::new(),
            directory: MemoryDirectory::new(),
            clock: Arc::new(TokioClock::new()),
            config,
            removed: Default::default(),
        }
    }

    /// Makes `n` live accounts `{prefix}-{i:03}`, each owned by user `u-{prefix}-{i:03}`.
    pub async fn accounts(&self, prefix: &str, n: usize) -> Vec<LeaseKey> {
        let mut keys = Vec::new();
        for i in 0..n {
            let k = key(&format!("{prefix}-{i:03}"));
            self.directory.insert(k.clone(), user(&format!("u-{prefix}-{i:03}")));
            self.mark_live(&k).await;
            keys.push(k);
        }
        keys
    }

    /// One account owned by `owner`.
    pub async fn account_of(&self, name: &str, owner: &UserId) -> LeaseKey {
        let k = key(name);
        self.directory.insert(k.clone(), owner.clone());
        self.mark_live(&k).await;
        k
    }

    /// The bucket of `account`.
    pub fn bucket_of(&self, account: &LeaseKey) -> BucketId {
        self.directory.bucket_count().bucket_of(account.as_str())
    }

    /// Tells the store `account` is to be synced, as the API does: live, and
    /// counted into its bucket (back in the directory if it was removed).
    pub async fn mark_live(&self, account: &LeaseKey) {
        if let Some(user) = self.removed.lock().remove(account) {
            self.directory.insert(account.clone(), user);
        }
        sync_worker::leases::account_added(self.admin.as_ref(), account, self.bucket_of(account))
            .await
            .expect("account_added");
    }

    /// Tells the store `account` is gone, as the API does (its row first).
    pub async fn mark_not_live(&self, account: &LeaseKey) {
        if let Ok(Some(user)) = self.directory.user_of(account).await {
            self.removed.lock().insert(account.clone(), user);
        }
        self.directory.remove(account);
        sync_worker::leases::account_removed(self.admin.as_ref(), account, self.bucket_of(account))
            .await
            .expect("account_removed");
    }

    pub async fn start(&self, name: &str) -> CoordinatorHandle {
        let store = self.backend.store().await;
        self.start_on(name, store, self.config.clone()).await
    }

    pub async fn start_with(&self, name: &str, config: Config) -> CoordinatorHandle {
        let store = self.backend.store().await;
        self.start_on(name, store, config).await
    }

    pub async fn start_on(&self, name: &str, store: Arc<dyn Leases>, config: Config) -> CoordinatorHandle {
        let deps = Deps {
            store: store.clone(),
            buckets: store.clone(),
            presence: store,
            source: Arc::new(self.source.clone()),
            directory: Arc::new(self.directory.clone()),
            clock: self.clock.clone(),
        };
        Coordinator::start(wid(name), config, deps).await.expect("coordinator starts")
    }

    /// Ms since the epoch, `ago` before now (the coordinator's clock).
    pub fn ago(&self, ago: Duration) -> u64 {
        self.clock.now_ms() - ago.as_millis() as u64
    }

    /// Waits until `cond` holds, checking often; `false` after `within`.
    pub async fn wait_for(&self, within: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + within + self.s.jitter;
        let step = (self.s.ttl / 30).max(Duration::from_millis(10));
        loop {
            if cond() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(step).await;
        }
    }

    pub async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Asserts the log never shows an account run by two workers at once.
    pub fn assert_exclusive(&self) {
        if let Err(report) = self.source.check_exclusive() {
            panic!("an account was run by two workers at once:\n{report}");
        }
    }
}

/// A store wrapper that can be told to fail renews and claims (a worker cut
/// off from the store, or whose renews time out).
pub struct Faulty {
    inner: Arc<dyn Leases>,
    pub fail: AtomicBool,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Leases>) -> Arc<Self> {
        Arc::new(Self { inner, fail: AtomicBool::new(false) })
    }

    pub fn set_failing(&self, on: bool) {
        self.fail.store(on, Ordering::SeqCst);
    }

    fn check(&self, op: &'static str, key: &LeaseKey) -> Result<(), LeaseError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(LeaseError::backend(op, key, "injected fault: store unreachable"));
        }
        Ok(())
    }
}

#[async_trait]
impl LeaseStore for Faulty {
    async fn claim(&self, key: &LeaseKey, owner: &WorkerId, ttl: Ttl) -> Result<Option<Lease>, LeaseError> {
        self.check("claim", key)?;
        self.inner.claim(key, owner, ttl).await
    }
    async fn claim_many(&self, keys: &[LeaseKey], owner: &WorkerId, ttl: Ttl) -> Result<Vec<Lease>, LeaseError> {
        if let Some(k) = keys.first() {
            self.check("claim", k)?;
        }
        self.inner.claim_many(keys, owner, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Ttl) -> Result<bool, LeaseError> {
        self.check("renew", &lease.key)?;
        self.inner.renew(lease, ttl).await
    }
    async fn renew_many(&self, leases: &[Lease], ttl: Ttl) -> Result<Vec<bool>, LeaseError> {
        if let Some(l) = leases.first() {
            self.check("renew", &l.key)?;
        }
        self.inner.renew_many(leases, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LeaseError> {
        self.check("release", &lease.key)?;
        self.inner.release(lease).await
    }
    async fn bind_deployment(&self, deployment: &str) -> Result<String, LeaseError> {
        self.inner.bind_deployment(deployment).await
    }
    async fn raise_token(&self, key: &LeaseKey, past: FencingToken) -> Result<(), LeaseError> {
        self.check("raise_token", key)?;
        self.inner.raise_token(key, past).await
    }
    async fn holder(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        self.inner.holder(key).await
    }
    async fn mark_live(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        self.inner.mark_live(key).await
    }
    async fn mark_not_live(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        self.inner.mark_not_live(key).await
    }
    async fn live_keys(&self) -> Result<Vec<LeaseKey>, LeaseError> {
        self.inner.live_keys().await
    }
    async fn register_worker(&self, worker: &WorkerId, ttl: Ttl) -> Result<(), LeaseError> {
        self.inner.register_worker(worker, ttl).await
    }
    async fn deregister_worker(&self, worker: &WorkerId) -> Result<(), LeaseError> {
        self.inner.deregister_worker(worker).await
    }
    async fn live_workers(&self) -> Result<Vec<WorkerId>, LeaseError> {
        self.inner.live_workers().await
    }
}

#[async_trait]
impl Presence for Faulty {
    async fn set_tier(&self, key: &LeaseKey, tier: Tier) -> Result<(), LeaseError> {
        self.inner.set_tier(key, tier).await
    }
    async fn tier(&self, key: &LeaseKey) -> Result<Option<Tier>, LeaseError> {
        self.inner.tier(key).await
    }
    async fn tiers_or_default(&self, keys: &[LeaseKey], default: Tier) -> Result<Vec<Tier>, LeaseError> {
        self.inner.tiers_or_default(keys, default).await
    }
    async fn mark_user_active(&self, user: &UserId, grace: Ttl) -> Result<(), LeaseError> {
        self.inner.mark_user_active(user, grace).await
    }
    async fn is_user_active(&self, user: &UserId) -> Result<bool, LeaseError> {
        self.inner.is_user_active(user).await
    }
    async fn subscribe_user_active(&self) -> Result<UserActiveSubscription, LeaseError> {
        self.inner.subscribe_user_active().await
    }
}

#[async_trait]
impl BucketLeases for Faulty {
    async fn bind_buckets(&self, count: BucketCount) -> Result<BucketBinding, LeaseError> {
        self.inner.bind_buckets(count).await
    }
    async fn add_weight(&self, bucket: BucketId, delta: i64) -> Result<u64, LeaseError> {
        self.inner.add_weight(bucket, delta).await
    }
    async fn set_weights(&self, weights: &[(BucketId, u64)]) -> Result<(), LeaseError> {
        self.inner.set_weights(weights).await
    }
    async fn subscribe_bucket_changes(&self) -> Result<BucketChanges, LeaseError> {
        self.inner.subscribe_bucket_changes().await
    }
    async fn join(&self, owner: &WorkerId, ttl: Ttl) -> Result<(), LeaseError> {
        self.check("join", &key(owner.as_str()))?;
        self.inner.join(owner, ttl).await
    }
    async fn tick(
        &self,
        owner: &WorkerId,
        held: &[BucketLease],
        ttl: Ttl,
        policy: &BalancePolicy,
    ) -> Result<BucketTick, LeaseError> {
        self.check("tick", &key(owner.as_str()))?;
        self.inner.tick(owner, held, ttl, policy).await
    }
    async fn release_buckets(&self, leases: &[BucketLease]) -> Result<Vec<bool>, LeaseError> {
        self.check("release_buckets", &key("buckets"))?;
        self.inner.release_buckets(leases).await
    }
    async fn leave(&self, owner: &WorkerId, held: &[BucketLease]) -> Result<(), LeaseError> {
        self.check("leave", &key(owner.as_str()))?;
        self.inner.leave(owner, held).await
    }
    async fn bucket_holder(&self, bucket: BucketId) -> Result<Option<BucketLease>, LeaseError> {
        self.inner.bucket_holder(bucket).await
    }
    async fn weight(&self, bucket: BucketId) -> Result<u64, LeaseError> {
        self.inner.weight(bucket).await
    }
    async fn raise_bucket_token(&self, bucket: BucketId, past: FencingToken) -> Result<(), LeaseError> {
        self.check("raise_bucket_token", &key("buckets"))?;
        self.inner.raise_bucket_token(bucket, past).await
    }
}
