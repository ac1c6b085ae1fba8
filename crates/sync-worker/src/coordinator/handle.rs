//! The handle of a running coordinator and its read-only views.

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_core::{FencingToken, LeaseKey, Tier, UserId, WorkerId};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::runner::RunnerStatus;
use crate::errors::SyncError;

/// One owned account, as seen from outside the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountView {
    /// The account.
    pub account: LeaseKey,
    /// The lease's fencing token.
    pub token: FencingToken,
    /// Its tier.
    pub tier: Tier,
    /// Its user, when known.
    pub user: Option<UserId>,
    /// What its runner last did.
    pub status: RunnerStatus,
}

/// Counters of one coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Full ticks (register, renew, balance) done.
    pub ticks: u64,
    /// Claim-only retries done.
    pub claim_retries: u64,
    /// Accounts claimed.
    pub claimed: u64,
    /// Accounts lost (renew said lost, or the lease deadline passed).
    pub lost: u64,
    /// Accounts shed to other workers.
    pub shed: u64,
    /// Accounts released at shutdown.
    pub released: u64,
    /// Tier evaluations done.
    pub tier_evaluations: u64,
    /// Accounts promoted by `user.active` events.
    pub promoted_by_event: u64,
}

pub(super) struct SharedEntry {
    pub(super) token: FencingToken,
    pub(super) tier: Tier,
    pub(super) user: Option<UserId>,
    pub(super) status: Arc<Mutex<RunnerStatus>>,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) owned: Mutex<HashMap<LeaseKey, SharedEntry>>,
    pub(super) stats: Mutex<CoordinatorStats>,
}

/// A running coordinator. Dropping it without [`CoordinatorHandle::shutdown`]
/// leaves the coordinator running in the background.
pub struct CoordinatorHandle {
    pub(super) worker: WorkerId,
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) task: JoinHandle<Result<(), SyncError>>,
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for CoordinatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorHandle").field("worker", &self.worker).finish_non_exhaustive()
    }
}

impl CoordinatorHandle {
    /// This coordinator's worker id.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// How many accounts it owns.
    pub fn owned_count(&self) -> usize {
        self.shared.owned.lock().len()
    }

    /// The accounts it owns, sorted.
    pub fn owned_keys(&self) -> Vec<LeaseKey> {
        let mut keys: Vec<LeaseKey> = self.shared.owned.lock().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Every owned account with its token, tier, user and runner status, sorted.
    pub fn owned(&self) -> Vec<AccountView> {
        owned_views(&self.shared)
    }

    /// Whether it owns `account`.
    pub fn owns(&self, account: &LeaseKey) -> bool {
        self.shared.owned.lock().contains_key(account)
    }

    /// The tier of `account`, when owned.
    pub fn tier_of(&self, account: &LeaseKey) -> Option<Tier> {
        self.shared.owned.lock().get(account).map(|e| e.tier)
    }

    /// Its counters.
    pub fn stats(&self) -> CoordinatorStats {
        *self.shared.stats.lock()
    }

    /// A cloneable read-only view, usable from any thread.
    pub fn observer(&self) -> CoordinatorObserver {
        CoordinatorObserver { worker: self.worker.clone(), shared: self.shared.clone() }
    }

    /// Whether the coordinator task has ended (it only ends on shutdown or a panic).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the coordinator task to end by itself (it does not, unless it panics).
    pub async fn finished(&mut self) -> Result<(), SyncError> {
        match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(SyncError::Coordinator { worker: self.worker.to_string(), source: e }),
        }
    }

    /// Graceful shutdown: stops every runner (after its poll in progress),
    /// releases every lease so other workers take over at once, deregisters
    /// the worker.
    pub async fn shutdown(self) -> Result<(), SyncError> {
        self.shutdown.send_replace(true);
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(SyncError::Coordinator { worker: self.worker.to_string(), source: e }),
        }
    }

    /// Ends the coordinator and all its runners at once *without* releasing
    /// anything, as a crash would: its leases lapse after their TTL.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
        self.shared.owned.lock().clear();
    }
}

/// A read-only, cloneable view of a running coordinator (for status pages,
/// benchmarks and tests), usable from any thread.
#[derive(Clone)]
pub struct CoordinatorObserver {
    worker: WorkerId,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CoordinatorObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorObserver").field("worker", &self.worker).finish_non_exhaustive()
    }
}

impl CoordinatorObserver {
    /// The worker id.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// How many accounts it owns.
    pub fn owned_count(&self) -> usize {
        self.shared.owned.lock().len()
    }

    /// Whether it owns `account`.
    pub fn owns(&self, account: &LeaseKey) -> bool {
        self.shared.owned.lock().contains_key(account)
    }

    /// The accounts it owns, sorted.
    pub fn owned_keys(&self) -> Vec<LeaseKey> {
        let mut keys: Vec<LeaseKey> = self.shared.owned.lock().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Its counters.
    pub fn stats(&self) -> CoordinatorStats {
        *self.shared.stats.lock()
    }

    /// Every owned account with its token, tier, user and runner status, sorted.
    pub fn owned(&self) -> Vec<AccountView> {
        owned_views(&self.shared)
    }
}

fn owned_views(shared: &Shared) -> Vec<AccountView> {
    let mut views: Vec<AccountView> = shared
        .owned
        .lock()
        .iter()
        .map(|(k, e)| AccountView {
            account: k.clone(),
            token: e.token,
            tier: e.tier,
            user: e.user.clone(),
            status: e.status.lock().clone(),
        })
        .collect();
    views.sort_by(|a, b| a.account.cmp(&b.account));
    views
}
