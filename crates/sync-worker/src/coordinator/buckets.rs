//! Bucket ownership (`OWNERSHIP=buckets`): the coordinator holds lease
//! buckets, and owns the accounts of the buckets it holds.
//!
//! **A tick** is one [`BucketLeases::tick`]: it renews the held buckets,
//! claims or sheds a few by the [`BalancePolicy`], and reports each held
//! bucket's change count. Then the coordinator
//! * stops at once every account of a bucket the store says is lost (and of
//!   a bucket whose local deadline passed: its renews kept failing);
//! * moves the deadline of every account of a kept bucket;
//! * for each shed bucket stops its accounts gracefully (each runner
//!   finishes the poll in progress), then releases the bucket, so its next
//!   owner never overlaps with this one;
//! * reads, off the loop, the accounts of every bucket claimed or whose
//!   change count moved (an account was added to or removed from it), and
//!   starts or stops their runners when the answer arrives.
//!
//! Nothing in a tick reads every account or every bucket: its cost is what
//! this worker holds.
//!
//! **Every `RECONCILE_INTERVAL`** the coordinator binds the bucket count
//! again; a binding recorded anew means the lease store lost its state (a
//! Redis restarted empty, or flushed), and every bucket's weight is given
//! again from the directory (one grouped count). It also recounts a slice of
//! 64 buckets (the rolling repair of a weight that drifted, for instance by
//! an add that raced such a recount), and reads its own buckets' accounts
//! again.
//!
//! **Fencing.** An account's writes carry its bucket's token; storage keeps
//! the highest token per account, and a bucket's token only grows, so a
//! stale owner's writes are refused as with per-account leases. A runner
//! fenced while its bucket is still held means the lease store's counter
//! fell behind storage: the bucket's accounts stop, and a task raises the
//! bucket's counter past the highest token stored for any of its accounts,
//! then releases the bucket, so the next claim (by anyone) is above them all.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use leasehold_core::{BucketId, BucketLease, FencingToken, Lease, LeaseKey, Tier, UserId};
use tokio::time::Instant;

use super::bucket_state::{BucketStart, HeldBucket, PendingStart};
use super::event_loop::{Coord, Owned};
use super::lookups;
use crate::deadline::LeaseDeadline;
use crate::directory::BucketAccount;
use crate::errors::error_chain;

/// Buckets whose weights one maintenance round recounts.
const REPAIR_SLICE: u32 = 64;
/// The wait before claiming again after a tick whose claims were all taken.
const CLAIM_AGAIN: std::time::Duration = std::time::Duration::from_millis(20);

/// How long after a lease is due to run out a worker ticks to claim it
/// (the store's clock and this one's differ by the reply's way back).
const LAPSE_MARGIN: std::time::Duration = std::time::Duration::from_millis(20);

/// About how many queued accounts one turn of the loop starts.
const START_SLICE: usize = 1024;

/// How a dropped bucket's accounts stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// At once: the bucket is lost, someone else may run them already.
    Now,
    /// Each after its poll in progress: the bucket is handed on.
    Gracefully,
}

impl Coord {
    /// A full tick under bucket ownership (after the worker's registration
    /// and the accounts' deadline check).
    pub(super) async fn tick_buckets(&mut self) {
        self.maintain_buckets().await;
        self.drop_overdue_buckets().await;
        let Some(state) = &self.buckets else { return };
        let held = state.leases();
        let policy = state.policy;
        let sent_at = Instant::now();
        let tick = match self.deps.buckets.tick(&self.worker, &held, self.ttl, &policy).await {
            Ok(tick) => tick,
            Err(e) => {
                tracing::warn!(worker = %self.worker, error = %error_chain(&e), "bucket tick failed; buckets stay valid until their deadline");
                return;
            }
        };
        let deadline = self.deadline_from(sent_at);
        tracing::debug!(
            worker = %self.worker, workers = tick.workers, total = tick.total_weight, load = tick.load, cap = tick.cap,
            kept = tick.kept.len(), claimed = tick.claimed.len(), lost = tick.lost.len(), shed = tick.shed.len(),
            took_ms = sent_at.elapsed().as_millis() as u64, "bucket tick"
        );
        for lease in &tick.lost {
            tracing::info!(worker = %self.worker, bucket = %lease.bucket, "bucket lost; its accounts stopped");
            self.drop_bucket(lease.bucket, Stop::Now).await;
        }
        if let Some(state) = &mut self.buckets {
            // The bucket's runners share its deadline cell: moved once per bucket.
            for lease in &tick.kept {
                if let Some(h) = state.held.get_mut(&lease.bucket) {
                    h.deadline = deadline;
                    h.runners_deadline.extend(deadline);
                }
            }
            for lease in &tick.claimed {
                tracing::debug!(worker = %self.worker, bucket = %lease.bucket, token = %lease.token, "bucket claimed");
                let held = HeldBucket {
                    lease: lease.clone(),
                    deadline,
                    runners_deadline: LeaseDeadline::until(deadline),
                    seen: None,
                    reading: false,
                    accounts: BTreeSet::new(),
                };
                state.held.insert(lease.bucket, held);
            }
        }
        // A full tick of claims while still under the share: more are free, claim again soon.
        let more = tick.claimed.len() >= policy.max_claims() as usize && tick.load * tick.workers < tick.total_weight;
        let again = more.then(|| Instant::now() + CLAIM_AGAIN);
        // A lease that runs out before the next tick is most likely a dead
        // worker's: tick again just after it, so its buckets are claimed
        // within the TTL of its last renew rather than up to a tick later.
        let lapse = tick
            .soonest_expiry
            .filter(|soonest| *soonest + LAPSE_MARGIN < self.config.renew_interval())
            .map(|soonest| Instant::now() + soonest + LAPSE_MARGIN);
        self.retry_claim_at = again.into_iter().chain(lapse).min();
        if !tick.shed.is_empty() {
            self.shed_buckets(tick.shed).await;
        }
        let reads: Vec<(BucketId, u64)> = match &mut self.buckets {
            Some(state) => tick
                .versions
                .iter()
                .filter_map(|&(bucket, version)| {
                    let h = state.held.get_mut(&bucket)?;
                    (h.seen != Some(version) && !h.reading).then(|| {
                        h.reading = true;
                        (bucket, version)
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        if !reads.is_empty() {
            lookups::bucket_accounts(self.deps.directory.clone(), reads, self.lookups_tx.clone());
        }
        self.check_finished_runners().await;
    }

    /// A change notice for `bucket` (an account added or removed): read its
    /// accounts now if this worker holds it and no read is under way. The
    /// read is taken at the change count last seen, so the next tick, which
    /// reports the moved count, reads once more: a notice can only make a
    /// change arrive sooner.
    pub(super) fn on_bucket_notice(&mut self, bucket: BucketId) {
        let Some(state) = &mut self.buckets else { return };
        let Some(h) = state.held.get_mut(&bucket) else { return };
        let Some(seen) = h.seen.filter(|_| !h.reading) else { return };
        h.reading = true;
        lookups::bucket_accounts(self.deps.directory.clone(), vec![(bucket, seen)], self.lookups_tx.clone());
    }

    /// Every `RECONCILE_INTERVAL`: bind the count (repairing every weight
    /// if the store lost its state), recount a slice of buckets, and read
    /// the held buckets' accounts again.
    async fn maintain_buckets(&mut self) {
        let now = Instant::now();
        let every = self.config.reconcile_interval;
        let Some(state) = &mut self.buckets else { return };
        if now < state.next_maintenance {
            return;
        }
        state.next_maintenance = now + every;
        let count = state.count;
        let slice: Vec<BucketId> =
            (0..REPAIR_SLICE.min(count.get())).map(|i| BucketId((state.repair_cursor + i) % count.get())).collect();
        state.repair_cursor = (state.repair_cursor + REPAIR_SLICE) % count.get();
        for h in state.held.values_mut() {
            h.seen = None;
        }
        match self.deps.buckets.bind_buckets(count).await {
            Ok(binding) if binding.count != count => tracing::error!(
                worker = %self.worker, database = %count, key_space = %binding.count,
                "the lease store's bucket count is not this database's: another deployment shares this key space; \
                 give each deployment its own REDIS_KEY_PREFIX (its weights are not given again meanwhile)"
            ),
            Ok(binding) => {
                let every_bucket = binding.recorded_now.then_some(());
                if every_bucket.is_some() {
                    tracing::info!(worker = %self.worker, "the lease store holds no bucket weights (new, or it lost its data): giving them again");
                }
                let which = if every_bucket.is_some() { None } else { Some(slice) };
                lookups::repair_weights(
                    self.deps.directory.clone(),
                    self.deps.buckets.clone(),
                    which,
                    self.lookups_tx.clone(),
                );
            }
            Err(e) => {
                tracing::warn!(worker = %self.worker, error = %error_chain(&e), "could not bind the bucket count; trying at the next round")
            }
        }
    }

    /// Drops the held buckets whose local deadline passed (renews kept failing).
    async fn drop_overdue_buckets(&mut self) {
        let now = Instant::now();
        let overdue: Vec<BucketId> = match &self.buckets {
            Some(state) => state.held.iter().filter(|(_, h)| h.deadline <= now).map(|(b, _)| *b).collect(),
            None => return,
        };
        for bucket in overdue {
            tracing::warn!(worker = %self.worker, %bucket, "bucket deadline passed without a renew; its accounts stopped");
            self.drop_bucket(bucket, Stop::Now).await;
        }
    }

    /// Forgets `bucket` and stops its accounts; answers its lease.
    async fn drop_bucket(&mut self, bucket: BucketId, stop: Stop) -> Option<BucketLease> {
        let state = self.buckets.as_mut()?;
        let keys = state.accounts_of(bucket);
        let lease = state.held.remove(&bucket).map(|h| h.lease);
        let owned: Vec<Owned> = keys.iter().filter_map(|k| self.remove(k)).collect();
        let n = owned.len() as u64;
        if stop == Stop::Gracefully {
            self.release_all(owned).await;
            self.stats(|s| s.shed += n);
        } else {
            let changed: Vec<(Option<UserId>, LeaseKey)> =
                owned.iter().map(|o| (o.user.clone(), o.lease.key.clone())).collect();
            futures::future::join_all(owned.into_iter().map(|o| o.runner.abort())).await;
            self.announce(changed.iter().map(|(u, k)| (u.as_ref(), k)));
            self.stats(|s| s.lost += n);
        }
        lease
    }

    /// Hands `shed` on: stops their accounts gracefully, then releases them.
    async fn shed_buckets(&mut self, shed: Vec<BucketLease>) {
        let mut leases = Vec::with_capacity(shed.len());
        for lease in &shed {
            if let Some(lease) = self.drop_bucket(lease.bucket, Stop::Gracefully).await {
                leases.push(lease);
            }
        }
        tracing::info!(worker = %self.worker, buckets = leases.len(), "shedding buckets above the fair share");
        if let Err(e) = self.deps.buckets.release_buckets(&leases).await {
            tracing::warn!(worker = %self.worker, error = %error_chain(&e), "could not release shed buckets; they will lapse");
        }
    }

    /// A read of buckets' accounts arrived: stop those that left a bucket
    /// this worker still holds, and look up the tiers of those new to it (off
    /// the loop: [`Coord::start_bucket_accounts`] starts them). A bucket
    /// stays `reading` until its new accounts start, so no second read
    /// starts them twice.
    pub(super) async fn apply_bucket_accounts(
        &mut self,
        buckets: Vec<(BucketId, u64)>,
        accounts: Result<Vec<BucketAccount>, String>,
    ) {
        let Some(state) = &mut self.buckets else { return };
        let accounts = match accounts {
            Ok(a) => a,
            Err(e) => {
                for (bucket, _) in &buckets {
                    if let Some(h) = state.held.get_mut(bucket) {
                        h.reading = false;
                    }
                }
                tracing::warn!(worker = %self.worker, error = %e, "could not read the accounts of owned buckets; trying at the next tick");
                return;
            }
        };
        let mut wanted: HashMap<BucketId, BTreeMap<LeaseKey, Option<UserId>>> = HashMap::new();
        for account in accounts {
            wanted.entry(account.bucket).or_default().insert(account.key, account.user);
        }
        let mut starts: Vec<BucketStart> = Vec::new();
        let mut stop: Vec<LeaseKey> = Vec::new();
        for (bucket, version) in buckets {
            let Some(h) = state.held.get_mut(&bucket) else { continue };
            h.seen = Some(version);
            let wanted = wanted.remove(&bucket).unwrap_or_default();
            let mut leases = Vec::new();
            let mut users = Vec::new();
            for (key, user) in &wanted {
                match self.owned.get(key) {
                    Some(o) if o.bucket == Some(bucket) && o.lease.token == h.lease.token => {}
                    _ => {
                        leases.push(Lease { key: key.clone(), owner: self.worker.clone(), token: h.lease.token });
                        users.push(user.clone());
                    }
                }
            }
            stop.extend(h.accounts.iter().filter(|k| !wanted.contains_key(*k)).cloned());
            if leases.is_empty() {
                h.reading = false;
            } else {
                starts.push(BucketStart { bucket, token: h.lease.token, leases, users });
            }
        }
        for key in stop {
            if let Some(o) = self.remove(&key) {
                tracing::info!(worker = %self.worker, account = %key, "account left its bucket; stopped");
                o.runner.abort().await;
                self.announce([(o.user.as_ref(), &key)]);
                self.stats(|s| s.lost += 1);
            }
        }
        // An account still running under an older lease of its bucket starts over under the new one.
        for lease in starts.iter().flat_map(|s| &s.leases) {
            if let Some(o) = self.remove(&lease.key) {
                o.runner.abort().await;
            }
        }
        if !starts.is_empty() {
            lookups::bucket_starts(self.deps.presence.clone(), starts, self.lookups_tx.clone());
        }
    }

    /// The tiers of a read's new accounts arrived: queue them to start, a
    /// slice a turn of the loop ([`Coord::start_pending`]).
    pub(super) fn start_bucket_accounts(&mut self, starts: Vec<BucketStart>, tiers: Result<Vec<Tier>, String>) {
        let asked = starts.iter().map(|s| s.leases.len()).sum();
        let mut tiers = super::event_loop::checked_tiers(asked, tiers).into_iter();
        for start in starts {
            let tiers: Vec<Tier> = tiers.by_ref().take(start.leases.len()).collect();
            self.pending_starts.push_back(PendingStart { start, tiers });
        }
    }

    /// Starts the next [`START_SLICE`] or so queued accounts, each bucket's
    /// at once, in each bucket still held under the token its read came in
    /// under (a bucket lost or claimed again meanwhile reads its accounts
    /// anew). A takeover of a hundred thousand accounts would otherwise
    /// queue as many runners' first turns ahead of the loop's next renew.
    pub(super) fn start_pending(&mut self) {
        let mut started = 0;
        while started < START_SLICE {
            let Some(PendingStart { start, tiers }) = self.pending_starts.pop_front() else { break };
            let BucketStart { bucket, token, leases, users } = start;
            let Some(h) = self.buckets.as_mut().and_then(|s| s.held.get_mut(&bucket)) else { continue };
            if h.lease.token != token {
                continue;
            }
            h.reading = false;
            let deadline = h.deadline;
            let mut fresh = (Vec::new(), Vec::new(), Vec::new());
            for ((lease, tier), user) in leases.into_iter().zip(tiers).zip(users) {
                if !self.owned.contains_key(&lease.key) {
                    fresh.0.push(lease);
                    fresh.1.push(tier);
                    fresh.2.push(user);
                }
            }
            let (leases, tiers, users) = fresh;
            started += leases.len();
            self.start_runners(leases, tiers, deadline, Some(bucket), Some(users));
        }
    }

    /// A runner of `key`, in held bucket `bucket`, was fenced: storage holds
    /// `stored`, at or above the bucket's token `held`. Stops the bucket and
    /// has a task raise its counter past every stored token, then release it.
    pub(super) async fn on_bucket_fenced(
        &mut self,
        bucket: BucketId,
        key: &LeaseKey,
        held: FencingToken,
        stored: FencingToken,
    ) {
        let Some(lease) = self.drop_bucket(bucket, Stop::Now).await else { return };
        tracing::warn!(
            worker = %self.worker, account = %key, %bucket, %held, %stored,
            "fenced: this worker holds bucket {bucket} with token {held} but storage holds token {stored} for \
             account {key}: the lease store's token counter fell behind storage (was Redis restarted empty or \
             flushed?); raising the bucket's counter past its accounts' tokens and handing it back"
        );
        let directory = self.deps.directory.clone();
        let leases = self.deps.buckets.clone();
        tokio::spawn(async move {
            let highest = match directory.highest_token_in_bucket(bucket).await {
                Ok(t) => t.max(stored),
                Err(e) => {
                    tracing::warn!(%bucket, error = %error_chain(&e), "could not read the bucket's highest stored token; raising past the one reported");
                    stored
                }
            };
            if let Err(e) = leases.raise_bucket_token(bucket, highest).await {
                tracing::warn!(%bucket, error = %error_chain(&e), "could not raise the bucket's token counter; it will be fenced again");
            }
            let _ = leases.release_buckets(std::slice::from_ref(&lease)).await;
        });
    }

    /// At shutdown: hands every held bucket back at once (the accounts are
    /// already stopped) and leaves the bucket workers.
    pub(super) async fn leave_buckets(&mut self) {
        let Some(state) = &mut self.buckets else { return };
        let held: Vec<BucketLease> = state.held.drain().map(|(_, h)| h.lease).collect();
        if let Err(e) = self.deps.buckets.leave(&self.worker, &held).await {
            tracing::warn!(worker = %self.worker, error = %error_chain(&e), "could not hand the buckets back; they will lapse");
        }
    }
}
