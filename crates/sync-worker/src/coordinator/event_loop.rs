//! The coordinator's loop: ticks (register, renew, balance), claim retries,
//! tier evaluations and `user.active` events (see the [module docs](super)).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use leasehold_core::{
    BucketChanges, BucketId, FencingToken, Lease, LeaseKey, Tier, Ttl, UserActiveSubscription, UserId, WorkerId,
};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::bucket_state::BucketOwnership;
use super::fenced::FenceBackoff;
use super::handle::{CoordinatorStats, Shared, SharedEntry};
use super::lookups::{self, Lookup};
use super::runner::{RunnerExit, RunnerHandle, RunnerSettings};
use super::tiers::{TierInputs, TierPolicy};
use super::Deps;
use crate::config::{Config, Ownership};
use crate::deadline::LeaseDeadline;
use crate::errors::SyncError;
use crate::events::{AccountChanged, EventSink, SyncEvent};
use crate::source::Fence;

/// Concurrent store or source calls in flight at once for per-key reads.
const CONCURRENCY: usize = 64;
/// Most keys one `claim_many` call carries.
const MAX_CLAIM_BATCH: usize = 4096;
/// Most keys a backoff (non-eager) sweep tries.
const BACKOFF_SWEEP_CAP: usize = 1024;
/// Longest backoff between sweeps of a worker short of its share, in ticks.
const MAX_SWEEP_BACKOFF: u32 = 4;
/// A tick this late is logged (debug): the loop was busy past its turn.
const LATE_TICK: std::time::Duration = std::time::Duration::from_millis(200);

pub(super) struct Owned {
    /// The account's lease; under bucket ownership, its bucket lease's owner
    /// and token with the account as key.
    pub(super) lease: Lease,
    /// The bucket whose lease covers the account (bucket ownership).
    pub(super) bucket: Option<BucketId>,
    pub(super) deadline: Instant,
    pub(super) user: Option<UserId>,
    latest_mail_ms: Option<u64>,
    pub(super) runner: RunnerHandle,
}

pub(super) struct Coord {
    pub(super) worker: WorkerId,
    pub(super) config: Config,
    pub(super) ttl: Ttl,
    settings: Arc<RunnerSettings>,
    policy: TierPolicy,
    pub(super) deps: Deps,
    pub(super) owned: HashMap<LeaseKey, Owned>,
    pub(super) shared: Arc<Shared>,
    /// Bucket ownership's state (`OWNERSHIP=buckets`); `None` under per-account leases.
    pub(super) buckets: Option<BucketOwnership>,
    last_workers: Vec<WorkerId>,
    last_live_sig: (usize, u64),
    eager_until: Instant,
    sweep_backoff: u32,
    ticks_since_sweep: u32,
    sweep_cursor: usize,
    pub(super) retry_claim_at: Option<Instant>,
    /// New accounts of held buckets, their tiers read, waiting to start: a
    /// slice a turn of the loop (see `buckets.rs`).
    pub(super) pending_starts: std::collections::VecDeque<super::bucket_state::PendingStart>,
    events: Option<Arc<dyn EventSink>>,
    fence_backoff: FenceBackoff,
    /// Answers of lookups done off the loop (see [`lookups`]).
    pub(super) lookups_tx: mpsc::UnboundedSender<Lookup>,
    lookups_rx: Option<mpsc::UnboundedReceiver<Lookup>>,
    /// Whether a tier evaluation's inputs are being gathered.
    tier_eval_running: bool,
}

fn tier_rank(t: Tier) -> u8 {
    match t {
        Tier::Cold => 0,
        Tier::Warm => 1,
        Tier::Hot => 2,
    }
}

impl Coord {
    pub(super) fn new(
        worker: WorkerId,
        config: Config,
        ttl: Ttl,
        deps: Deps,
        shared: Arc<Shared>,
        events: Option<Arc<dyn EventSink>>,
    ) -> Self {
        let (lookups_tx, lookups_rx) = mpsc::unbounded_channel();
        let buckets = (config.ownership == Ownership::Buckets)
            .then(|| BucketOwnership::new(deps.directory.bucket_count(), &worker));
        Coord {
            buckets,
            worker,
            settings: Arc::new(RunnerSettings::from(&config)),
            policy: TierPolicy::from(&config),
            config,
            ttl,
            deps,
            owned: HashMap::new(),
            shared,
            last_workers: Vec::new(),
            last_live_sig: (0, 0),
            eager_until: Instant::now(),
            sweep_backoff: 1,
            ticks_since_sweep: 0,
            sweep_cursor: 0,
            retry_claim_at: None,
            pending_starts: std::collections::VecDeque::new(),
            events,
            fence_backoff: FenceBackoff::default(),
            lookups_tx,
            lookups_rx: Some(lookups_rx),
            tier_eval_running: false,
        }
    }

    /// Announces that these accounts' owner or tier changed (those with a known user).
    pub(super) fn announce<'a>(&self, changed: impl IntoIterator<Item = (Option<&'a UserId>, &'a LeaseKey)>) {
        let Some(sink) = &self.events else { return };
        let events: Vec<SyncEvent> = changed
            .into_iter()
            .filter_map(|(user, key)| {
                let user = user?;
                Some(SyncEvent::Account(AccountChanged { user: user.to_string(), account: key.to_string() }))
            })
            .collect();
        if !events.is_empty() {
            sink.publish(events);
        }
    }

    fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// The local deadline of a lease claimed or renewed by a call sent at
    /// `sent_at`: its TTL less a tenth, for clock differences with the store.
    pub(super) fn deadline_from(&self, sent_at: Instant) -> Instant {
        sent_at + self.ttl.get() - self.ttl.get() / 10
    }

    pub(super) fn stats(&self, f: impl FnOnce(&mut CoordinatorStats)) {
        f(&mut self.shared.stats.lock());
    }

    pub(super) async fn run(
        mut self,
        mut shutdown: watch::Receiver<bool>,
        sub: UserActiveSubscription,
        changes: Option<BucketChanges>,
    ) -> Result<(), SyncError> {
        let mut sub = Some(sub);
        let mut changes = changes;
        // `run` consumes the coordinator, so the receiver is always there.
        let mut lookups_rx = self.lookups_rx.take().unwrap_or_else(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            self.lookups_tx = tx;
            rx
        });
        let every = self.config.renew_interval();
        let mut next_tick = Instant::now();
        let mut next_eval = Instant::now() + self.config.tier_eval_interval;
        loop {
            let retry = self.retry_claim_at;
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                _ = sleep_until(next_tick) => {
                    let started = Instant::now();
                    let late = started.saturating_duration_since(next_tick);
                    if late >= LATE_TICK {
                        tracing::debug!(worker = %self.worker, late_ms = late.as_millis() as u64, "tick started late: the loop was busy");
                    }
                    self.tick(true).await;
                    next_tick = started + every;
                }
                ev = async { sub.as_mut()?.recv().await }, if sub.is_some() => match ev {
                    Some(user) => self.on_user_active(&user).await,
                    None => {
                        tracing::warn!(worker = %self.worker, "user.active subscription closed");
                        sub = None;
                    }
                },
                notice = async { changes.as_mut()?.recv().await }, if changes.is_some() => match notice {
                    Some(bucket) => self.on_bucket_notice(bucket),
                    None => {
                        tracing::warn!(worker = %self.worker, "bucket change subscription closed");
                        changes = None;
                    }
                },
                _ = async { if let Some(at) = retry { sleep_until(at).await } }, if retry.is_some() => {
                    self.retry_claim_at = None;
                    self.tick(false).await;
                }
                _ = sleep_until(next_eval) => {
                    let started = Instant::now();
                    self.evaluate_tiers();
                    next_eval = started + self.config.tier_eval_interval;
                }
                Some(lookup) = lookups_rx.recv() => self.on_lookup(lookup).await,
                // Last: everything above comes first, so a takeover's starts never hold up a renew.
                () = std::future::ready(()), if !self.pending_starts.is_empty() => {
                    self.start_pending();
                    // The runners just started take their first turn before the next slice.
                    tokio::task::yield_now().await;
                }
            }
        }
        self.shutdown().await
    }

    /// One round: (full) register, expire, renew; then balance.
    async fn tick(&mut self, full: bool) {
        let ttl = self.ttl();
        let store = self.deps.store.clone();
        if full {
            self.stats(|s| s.ticks += 1);
            if let Err(e) = store.register_worker(&self.worker, ttl).await {
                tracing::warn!(worker = %self.worker, error = %e, "worker registration failed");
            }
            self.expire_overdue().await;
        }
        if self.buckets.is_some() {
            if !full {
                self.stats(|s| s.claim_retries += 1);
            }
            self.tick_buckets().await;
            return;
        }
        if full {
            self.renew().await;
        } else {
            self.stats(|s| s.claim_retries += 1);
        }
        let (live, workers) = match futures::try_join!(store.live_keys(), store.live_workers()) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(worker = %self.worker, error = %e, "could not read the live set or the live workers");
                return;
            }
        };
        self.drop_not_live(&live).await;

        let me_counted = workers.contains(&self.worker);
        let n_workers = workers.len() + usize::from(!me_counted);
        let share = live.len().div_ceil(n_workers.max(1));
        let slack = share / 100;
        let now = Instant::now();
        let sig = live_signature(&live);
        if workers != self.last_workers || sig != self.last_live_sig {
            self.eager_until = now + ttl.get() + 2 * self.config.renew_interval();
            self.sweep_backoff = 1;
            self.last_workers = workers.clone();
            self.last_live_sig = sig;
        }
        let eager = now < self.eager_until;
        let owned = self.owned.len();
        if owned > share + slack {
            self.shed(owned - share).await;
        } else if owned < share {
            if full {
                self.ticks_since_sweep += 1;
            }
            if eager || self.ticks_since_sweep >= self.sweep_backoff {
                self.ticks_since_sweep = 0;
                let won = self.claim(&live, &workers, share - owned, eager).await;
                self.sweep_backoff = if won > 0 { 1 } else { (self.sweep_backoff * 2).min(MAX_SWEEP_BACKOFF) };
            }
        }
        self.retry_claim_at =
            if self.owned.len() < share && eager { Some(Instant::now() + ttl.get() / 10) } else { None };
    }

    /// Stops the runners whose lease deadline passed (renews kept failing).
    async fn expire_overdue(&mut self) {
        let now = Instant::now();
        // A bucket's accounts go with their bucket (`drop_overdue_buckets`).
        let overdue: Vec<LeaseKey> = self
            .owned
            .iter()
            .filter(|(_, o)| o.bucket.is_none() && o.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in overdue {
            if let Some(o) = self.remove(&key) {
                tracing::warn!(worker = %self.worker, account = %key, "lease deadline passed without a renew; stopped");
                o.runner.abort().await;
                self.stats(|s| s.lost += 1);
                if o.bucket.is_none() {
                    // Harmless if it is gone: release is token-checked.
                    let _ = self.deps.store.release(&o.lease).await;
                }
                self.announce([(o.user.as_ref(), &key)]);
            }
        }
    }

    async fn renew(&mut self) {
        if self.owned.is_empty() {
            return;
        }
        let (keys, leases): (Vec<LeaseKey>, Vec<Lease>) =
            self.owned.iter().map(|(k, o)| (k.clone(), o.lease.clone())).unzip();
        let sent_at = Instant::now();
        let answers = match self.deps.store.renew_many(&leases, self.ttl()).await {
            Ok(a) if a.len() == leases.len() => a,
            Ok(a) => {
                tracing::error!(worker = %self.worker, asked = leases.len(), answered = a.len(), "renew_many answered the wrong number of leases");
                return;
            }
            Err(e) => {
                tracing::warn!(worker = %self.worker, error = %e, "renew failed; leases stay valid until their deadline");
                return;
            }
        };
        let deadline = self.deadline_from(sent_at);
        let mut lost = Vec::new();
        for (key, ok) in keys.into_iter().zip(answers) {
            if ok {
                if let Some(o) = self.owned.get_mut(&key) {
                    o.deadline = deadline;
                    o.runner.extend(deadline);
                }
            } else {
                lost.push(key);
            }
        }
        for key in lost {
            if let Some(o) = self.remove(&key) {
                o.runner.abort().await;
                tracing::info!(worker = %self.worker, account = %key, "lease lost; account stopped");
                self.stats(|s| s.lost += 1);
            }
        }
        self.check_finished_runners().await;
    }

    /// Deals with runners that ended by themselves while their lease is still held.
    pub(super) async fn check_finished_runners(&mut self) {
        // A runner that ended by itself while its lease is still held: fenced
        // (storage holds a token at or above its own), or a panic (restart it).
        let dead: Vec<LeaseKey> =
            self.owned.iter().filter(|(_, o)| o.runner.is_finished()).map(|(k, _)| k.clone()).collect();
        for key in dead {
            let exit = self.owned.get_mut(&key).and_then(|o| o.runner.exit());
            if let Some(RunnerExit::Fenced { held, stored }) = exit {
                self.on_fenced(&key, held, stored).await;
                continue;
            }
            if let Some(o) = self.owned.get_mut(&key) {
                tracing::error!(worker = %self.worker, account = %key, ?exit, "runner ended unexpectedly; restarting it");
                o.runner = o.runner.restart(self.deps.source.clone());
                if let Some(e) = self.shared.owned.lock().get_mut(&key) {
                    e.status = o.runner.status_handle();
                }
            }
        }
    }

    /// The runner of `key` was fenced although this worker still holds its
    /// lease: storage holds `stored`, at or above the lease's `held`, so the
    /// lease store's counter fell behind storage. Raise it past `stored`,
    /// give the lease back and claim again (at once the first time).
    async fn on_fenced(&mut self, key: &LeaseKey, held: FencingToken, stored: FencingToken) {
        if let Some(bucket) = self.owned.get(key).and_then(|o| o.bucket) {
            self.on_bucket_fenced(bucket, key, held, stored).await;
            return;
        }
        let Some(o) = self.remove(key) else { return };
        self.stats(|s| s.lost += 1);
        let wait = self.fence_backoff.strike(key, Instant::now(), self.config.renew_interval(), 8 * self.ttl.get());
        let raised = self.deps.store.raise_token(key, stored).await;
        // Harmless if it is gone: release is token-checked.
        let _ = self.deps.store.release(&o.lease).await;
        match raised {
            Ok(()) => tracing::warn!(
                worker = %self.worker, account = %key, %held, %stored, retry_in = ?wait,
                "fenced: this worker holds the lease with token {held} but storage holds token {stored}: \
                 the lease store's token counter fell behind storage (was Redis restarted empty or flushed?); \
                 raised it past {stored}, claiming again"
            ),
            Err(e) => tracing::warn!(
                worker = %self.worker, account = %key, %held, %stored, retry_in = ?wait, error = %e,
                "fenced: this worker holds the lease with token {held} but storage holds token {stored}, \
                 and raising the lease store's counter past it failed; claiming again later"
            ),
        }
        self.announce([(o.user.as_ref(), key)]);
    }

    /// Stops and releases owned accounts that are no longer live (`live` is sorted).
    async fn drop_not_live(&mut self, live: &[LeaseKey]) {
        if self.owned.is_empty() {
            return;
        }
        // The live set comes sorted: a binary search per owned key beats hashing the whole set.
        let gone: Vec<LeaseKey> = self.owned.keys().filter(|k| live.binary_search(k).is_err()).cloned().collect();
        for key in gone {
            if let Some(o) = self.remove(&key) {
                o.runner.abort().await;
                let _ = self.deps.store.release(&o.lease).await;
                tracing::info!(worker = %self.worker, account = %key, "account no longer live; stopped");
                self.stats(|s| s.lost += 1);
            }
        }
    }

    pub(super) fn remove(&mut self, key: &LeaseKey) -> Option<Owned> {
        self.shared.owned.lock().remove(key);
        let owned = self.owned.remove(key)?;
        if let (Some(bucket), Some(state)) = (owned.bucket, &mut self.buckets) {
            state.forget_account(bucket, key);
        }
        Some(owned)
    }

    /// Claims up to `deficit` free live accounts.
    async fn claim(&mut self, live: &[LeaseKey], workers: &[WorkerId], deficit: usize, eager: bool) -> usize {
        let n = live.len();
        if n == 0 {
            return 0;
        }
        let idx = workers.iter().position(|w| w == &self.worker).unwrap_or(workers.len());
        let offset = idx * n / workers.len().max(idx + 1);
        let now = Instant::now();
        let mut candidates: Vec<&LeaseKey> = live[offset..]
            .iter()
            .chain(&live[..offset])
            .filter(|k| !self.owned.contains_key(*k) && self.fence_backoff.allows(k, now))
            .collect();
        if !eager && candidates.len() > BACKOFF_SWEEP_CAP {
            // A bounded sweep that moves on each time, so all keys get looked at.
            let start = self.sweep_cursor % candidates.len();
            candidates.rotate_left(start);
            candidates.truncate(BACKOFF_SWEEP_CAP);
            self.sweep_cursor = self.sweep_cursor.wrapping_add(BACKOFF_SWEEP_CAP);
        }
        let ttl = self.ttl();
        let mut remaining = deficit;
        let mut cursor = 0;
        let mut hit_rate = 1.0f64;
        let mut total = 0;
        while remaining > 0 && cursor < candidates.len() {
            let want = ((remaining as f64 / hit_rate).ceil() as usize)
                .clamp(remaining, MAX_CLAIM_BATCH.max(remaining))
                .min(candidates.len() - cursor);
            let batch: Vec<LeaseKey> = candidates[cursor..cursor + want].iter().map(|k| (*k).clone()).collect();
            cursor += want;
            let sent_at = Instant::now();
            let mut won = match self.deps.store.claim_many(&batch, &self.worker, ttl).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(worker = %self.worker, error = %e, "claim failed");
                    break;
                }
            };
            hit_rate = (won.len() as f64 / want as f64).max(1.0 / 64.0);
            if won.len() > remaining {
                let surplus = won.split_off(remaining);
                let store = self.deps.store.clone();
                each(surplus, move |l| {
                    let store = store.clone();
                    async move {
                        let _ = store.release(&l).await;
                    }
                })
                .await;
            }
            remaining -= won.len();
            total += won.len();
            let deadline = self.deadline_from(sent_at);
            self.adopt(won, deadline).await;
        }
        total
    }

    /// Starts runners for freshly claimed leases (account ownership), valid
    /// until `deadline`, each at its stored tier.
    async fn adopt(&mut self, leases: Vec<Lease>, deadline: Instant) {
        if leases.is_empty() {
            return;
        }
        let keys: Vec<LeaseKey> = leases.iter().map(|l| l.key.clone()).collect();
        // A per-account claim stores warm when no tier is set.
        let tiers = checked_tiers(keys.len(), self.deps.presence.tiers_or_default(&keys, Tier::Warm).await);
        self.start_runners(leases, tiers, deadline, None, None);
    }

    /// Starts a runner for each of `leases` (of `bucket`, under bucket
    /// ownership) at its tier, valid until `deadline`. Their `users`, when
    /// read with them, are announced at once; otherwise looked up.
    pub(super) fn start_runners(
        &mut self,
        leases: Vec<Lease>,
        tiers: Vec<Tier>,
        deadline: Instant,
        bucket: Option<BucketId>,
        users: Option<Vec<Option<UserId>>>,
    ) {
        if leases.is_empty() {
            return;
        }
        let known = users.is_some();
        let mut users = users.unwrap_or_default().into_iter();
        if !known {
            let keys: Vec<LeaseKey> = leases.iter().map(|l| l.key.clone()).collect();
            // Off the loop: a slow database must not delay the next renew. The
            // users arrive as a `Lookup::Users`, and the claims are announced then.
            lookups::users(self.deps.directory.clone(), keys, self.lookups_tx.clone());
        }
        let n = leases.len() as u64;
        let mut shared = Vec::with_capacity(leases.len());
        let mut announced = Vec::new();
        for (lease, tier) in leases.into_iter().zip(tiers) {
            let user: Option<UserId> = users.next().flatten();
            if known {
                announced.push((user.clone(), lease.key.clone()));
            }
            let key = lease.key.clone();
            let shared_deadline = bucket.and_then(|b| self.buckets.as_ref()?.runners_deadline(b));
            let cell = shared_deadline.unwrap_or_else(|| LeaseDeadline::until(deadline));
            let runner = RunnerHandle::spawn_until(
                self.deps.source.clone(),
                Fence::from(&lease),
                tier,
                cell,
                self.settings.clone(),
            );
            tracing::debug!(worker = %self.worker, account = %key, token = %lease.token, %tier, "claimed");
            shared.push((
                key.clone(),
                SharedEntry { token: lease.token, tier, user: user.clone(), status: runner.status_handle() },
            ));
            if let (Some(bucket), Some(state)) = (bucket, &mut self.buckets) {
                state.note_account(bucket, &key);
            }
            self.owned.insert(key, Owned { lease, bucket, deadline, user, latest_mail_ms: None, runner });
        }
        self.shared.owned.lock().extend(shared);
        self.stats(|s| s.claimed += n);
        self.announce(announced.iter().map(|(u, k)| (u.as_ref(), k)));
    }

    /// Gives up `count` accounts gracefully: cold first, then warm, then hot.
    async fn shed(&mut self, count: usize) {
        let mut victims: Vec<(u8, LeaseKey)> =
            self.owned.iter().map(|(k, o)| (tier_rank(o.runner.tier()), k.clone())).collect();
        victims.sort();
        victims.truncate(count);
        let owned: Vec<Owned> = victims.iter().filter_map(|(_, k)| self.remove(k)).collect();
        tracing::info!(worker = %self.worker, count = owned.len(), "shedding accounts above the fair share");
        let n = self.release_all(owned).await;
        self.stats(|s| s.shed += n);
    }

    /// Stops the runners (each after its poll in progress, within half a
    /// tick), then releases the leases. Returns how many were released.
    pub(super) async fn release_all(&self, owned: Vec<Owned>) -> u64 {
        let grace = self.config.renew_interval() / 2;
        let changed: Vec<(Option<UserId>, LeaseKey)> =
            owned.iter().map(|o| (o.user.clone(), o.lease.key.clone())).collect();
        let mut leases = Vec::with_capacity(owned.len());
        let mut covered = 0;
        let stops = owned.into_iter().map(|o| {
            // An account under a bucket lease has no lease of its own to give back.
            if o.bucket.is_none() {
                leases.push(o.lease);
            } else {
                covered += 1;
            }
            o.runner.stop(grace)
        });
        futures::future::join_all(stops.collect::<Vec<_>>()).await;
        let store = self.deps.store.clone();
        let released: Vec<bool> = each(leases, move |l| {
            let store = store.clone();
            async move {
                match store.release(&l).await {
                    Ok(released) => released,
                    Err(e) => {
                        tracing::warn!(account = %l.key, error = %e, "release failed; the lease will lapse");
                        false
                    }
                }
            }
        })
        .await;
        self.announce(changed.iter().map(|(u, k)| (u.as_ref(), k)));
        covered + released.into_iter().filter(|r| *r).count() as u64
    }

    async fn shutdown(mut self) -> Result<(), SyncError> {
        let owned: Vec<Owned> = self.owned.drain().map(|(_, o)| o).collect();
        self.shared.owned.lock().clear();
        let count = owned.len();
        let released = self.release_all(owned).await;
        self.stats(|s| s.released += released);
        self.leave_buckets().await;
        let dereg = self.deps.store.deregister_worker(&self.worker).await;
        tracing::info!(worker = %self.worker, count, released, "coordinator shut down; leases released");
        dereg.map_err(SyncError::from)
    }

    fn set_tier_local(&mut self, key: &LeaseKey, tier: Tier) {
        if let Some(o) = self.owned.get(key) {
            o.runner.set_tier(tier);
        }
        if let Some(e) = self.shared.owned.lock().get_mut(key) {
            e.tier = tier;
        }
    }

    /// Applies tier changes: the store first, then the runners.
    async fn apply_tiers(&mut self, changes: Vec<(LeaseKey, Tier)>) {
        let presence = self.deps.presence.clone();
        each(changes.clone(), move |(k, t)| {
            let presence = presence.clone();
            async move {
                if let Err(e) = presence.set_tier(&k, t).await {
                    tracing::warn!(account = %k, tier = %t, error = %e, "could not store the tier");
                }
            }
        })
        .await;
        for (key, tier) in &changes {
            tracing::debug!(worker = %self.worker, account = %key, %tier, "tier changed");
            self.set_tier_local(key, *tier);
        }
        self.announce(changes.iter().map(|(k, _)| (self.owned.get(k).and_then(|o| o.user.as_ref()), k)));
    }

    async fn on_user_active(&mut self, user: &UserId) {
        let changes: Vec<(LeaseKey, Tier)> = self
            .owned
            .iter()
            .filter(|(_, o)| o.user.as_ref() == Some(user) && o.runner.tier() != Tier::Hot)
            .map(|(k, _)| (k.clone(), Tier::Hot))
            .collect();
        if changes.is_empty() {
            return;
        }
        let n = changes.len() as u64;
        tracing::info!(worker = %self.worker, %user, accounts = n, "user active; promoting to hot");
        self.apply_tiers(changes).await;
        self.stats(|s| s.promoted_by_event += n);
    }

    /// Starts a tier evaluation: its inputs are gathered off the loop (see
    /// [`lookups`]) and applied by [`Coord::apply_tier_inputs`] when they arrive.
    fn evaluate_tiers(&mut self) {
        self.stats(|s| s.tier_evaluations += 1);
        if self.owned.is_empty() || self.tier_eval_running {
            return;
        }
        let mut keys: Vec<LeaseKey> = self.owned.keys().cloned().collect();
        keys.sort();
        let known = keys.iter().map(|k| self.owned.get(k).and_then(|o| o.user.clone())).collect();
        self.tier_eval_running = true;
        lookups::tier_inputs(
            self.deps.directory.clone(),
            self.deps.presence.clone(),
            self.deps.source.clone(),
            keys,
            known,
            self.lookups_tx.clone(),
        );
    }

    async fn on_lookup(&mut self, lookup: Lookup) {
        match lookup {
            Lookup::Users(users) => {
                let mut claimed = Vec::new();
                for (k, u) in users {
                    self.set_user(&k, u.clone());
                    if self.owned.contains_key(&k) {
                        claimed.push((u, k));
                    }
                }
                self.announce(claimed.iter().map(|(u, k)| (u.as_ref(), k)));
            }
            Lookup::TierInputs { keys, users, active, latest } => {
                self.tier_eval_running = false;
                self.apply_tier_inputs(keys, users, active, latest).await;
            }
            Lookup::BucketAccounts { buckets, accounts } => self.apply_bucket_accounts(buckets, accounts).await,
            Lookup::BucketStarts { starts, tiers } => self.start_bucket_accounts(starts, tiers),
            // Every weight is back: claim now rather than at the next tick.
            Lookup::WeightsGiven => self.tick(false).await,
        }
    }

    fn set_user(&mut self, key: &LeaseKey, user: Option<UserId>) {
        if let Some(o) = self.owned.get_mut(key) {
            if o.user != user {
                o.user = user.clone();
                if let Some(e) = self.shared.owned.lock().get_mut(key) {
                    e.user = user;
                }
            }
        }
    }

    async fn apply_tier_inputs(
        &mut self,
        keys: Vec<LeaseKey>,
        users: Option<Vec<Option<UserId>>>,
        active: HashMap<UserId, bool>,
        latest: Vec<Result<Option<u64>, String>>,
    ) {
        if let Some(users) = users {
            for (k, u) in keys.iter().zip(users) {
                self.set_user(k, u);
            }
        }
        // Accounts given up while the inputs were gathered are left out.
        let mut evaluated = Vec::with_capacity(keys.len());
        let mut inputs = Vec::with_capacity(keys.len());
        for (k, l) in keys.into_iter().zip(latest) {
            let Some(o) = self.owned.get_mut(&k) else { continue };
            match l {
                Ok(l) => o.latest_mail_ms = l,
                Err(e) => {
                    tracing::warn!(account = %k, error = %e, "could not read the newest mail date; keeping the last")
                }
            }
            let session = o.user.as_ref().is_some_and(|u| active.get(u).copied().unwrap_or(false));
            inputs.push(TierInputs { session, latest_mail_ms: o.latest_mail_ms });
            evaluated.push(k);
        }
        let tiers = self.policy.assign(self.deps.clock.now_ms(), &inputs);
        let changes: Vec<(LeaseKey, Tier)> = evaluated
            .into_iter()
            .zip(tiers)
            .filter(|(k, t)| self.owned.get(k).is_some_and(|o| o.runner.tier() != *t))
            .collect();
        if !changes.is_empty() {
            tracing::debug!(worker = %self.worker, changes = changes.len(), "tiers re-evaluated");
            self.apply_tiers(changes).await;
        }
    }
}

/// Runs `f` on every item, [`CONCURRENCY`] at a time; answers in order.
async fn each<T, R, Fut>(items: Vec<T>, f: impl FnMut(T) -> Fut) -> Vec<R>
where
    Fut: std::future::Future<Output = R>,
{
    stream::iter(items).map(f).buffered(CONCURRENCY).collect().await
}

/// A cheap fingerprint of the live set, to notice when it changed.
fn live_signature(live: &[LeaseKey]) -> (usize, u64) {
    let mut h = DefaultHasher::new();
    live.hash(&mut h);
    (live.len(), h.finish())
}

/// The tiers a lookup of `asked` keys answered, or warm for each (logged)
/// when it failed or answered the wrong number.
pub(super) fn checked_tiers<E: std::fmt::Display>(asked: usize, answer: Result<Vec<Tier>, E>) -> Vec<Tier> {
    match answer {
        Ok(t) if t.len() == asked => t,
        Ok(t) => {
            tracing::error!(
                asked,
                answered = t.len(),
                "tiers_or_default answered the wrong number of keys; starting warm"
            );
            vec![Tier::Warm; asked]
        }
        Err(e) => {
            tracing::warn!(accounts = asked, error = %e, "could not read the tiers; starting warm");
            vec![Tier::Warm; asked]
        }
    }
}
