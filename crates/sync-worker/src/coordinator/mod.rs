//! The coordinator: which accounts this worker owns, and how hot each is.
//!
//! Its parts, top-down: this file starts it ([`Coordinator`], [`Deps`]);
//! `event_loop` is its task and `handle` what its owner holds
//! ([`CoordinatorHandle`]); [`tiers`] is the tier policy it applies,
//! [`runner`] the loops of one owned account, and [`reconcile`] keeps the
//! live set equal to the accounts table.
//!
//! One task per worker loops over four events:
//!
//! * **the tick**, every `LEASE_TTL / 3`: re-register the worker (TTL
//!   `LEASE_TTL`); stop the runners of leases whose local deadline passed
//!   (renews kept failing); renew every owned lease in one
//!   [`LeaseStore::renew_many`] call and stop *at once* the runner of every
//!   lease the store answers is lost (taken over, expired, or dropped by
//!   `mark_not_live`); read the live set and the live workers; stop accounts
//!   that left the live set; then balance against the **fair share**
//!   `ceil(live / workers)`: above `share + slack` (slack = 1 % of the share,
//!   rounded down, so small shares get none) it sheds the excess gracefully
//!   (cold accounts first, then warm, then hot: runners finish the poll in
//!   progress, then the leases are released so the new owner starts at once);
//!   below the share it claims free accounts with [`LeaseStore::claim_many`].
//! * **the claim retry**: for `LEASE_TTL + 2 ticks` after the live workers or
//!   the live set changed (a worker joined, left or died; accounts came or
//!   went), a worker short of its share retries claims every `LEASE_TTL / 10`,
//!   so a dead worker's accounts are taken about as soon as its leases
//!   expire. Outside that window a worker short of its share (the rounding of
//!   `ceil` leaves one short when the live count does not divide evenly)
//!   re-checks with backoff (every 1, 2, 4 ticks) and a bounded sweep.
//! * **tier evaluation**, every `TIER_EVAL_INTERVAL`: see [`tiers`].
//!   Tiers are written to the store (`sync:tier:{id}`) and the runners are
//!   reshaped in place. A newly claimed account starts in the tier the store
//!   holds (warm by default on claim; a previous owner's evaluation carries
//!   over).
//! * **`user.active` events**: the user's owned accounts are promoted to hot
//!   at once.
//!
//! **A fenced runner** (storage holds a token at or above its lease's, see
//! [`runner`]) is noticed at the next tick. If this worker still holds
//! the lease, the lease store has lost its counters (Redis restarted empty,
//! or flushed): the coordinator says so with both tokens, raises the key's
//! counter past the stored token ([`LeaseStore::raise_token`]), releases the
//! lease and claims again, at once the first time and with a growing backoff
//! when the same key is fenced again soon (see `fenced.rs`).
//!
//! With [`PreparedCoordinator::with_events`], every claim, release, loss by
//! deadline and tier change is announced as an
//! [`AccountChanged`](crate::events::AccountChanged) (the API's
//! `account.status`).
//!
//! Claims are spread: each worker starts its sweep of the (sorted) live set at
//! `index_of_worker * live / workers`, so workers that start together claim
//! disjoint ranges on the first try.
//!
//! On [`CoordinatorHandle::shutdown`] (SIGTERM in the binary) every runner is
//! stopped, every lease released and the worker deregistered, so the others
//! take over at their next tick. [`CoordinatorHandle::kill`] drops everything
//! without a word to the store, as a crash would.
//!
//! **The loop never waits on the database.** Which user owns a claimed
//! account, and a tier evaluation's inputs (users, presence, newest mail),
//! are looked up by tasks of their own whose answers the loop applies when
//! they arrive (see `lookups.rs`): a slow or stopped database delays tier
//! changes and `account.status` announcements, never a renew. Runners
//! record their claims in storage themselves, off the loop too.
//!
//! **Bucket ownership** (`OWNERSHIP=buckets`, see `buckets.rs`) replaces the
//! per-account leases, the live set and the balancing above: the tick is one
//! [`BucketLeases::tick`], and a worker owns the accounts of the buckets it
//! holds, read from the directory per owned bucket. Tiers, presence, runners
//! and fencing work as above, each account's writes fenced by its bucket's token.
//!
//! The coordinator depends only on the core traits: it runs on any
//! [`LeaseStore`] and [`BucketLeases`] behind `Arc<dyn …>`.

mod bucket_state;
mod buckets;
mod event_loop;
mod fenced;
mod handle;
mod lookups;
pub mod reconcile;
pub mod runner;
mod task;
pub mod tiers;

use std::sync::Arc;

use leasehold_core::{BucketChanges, BucketLeases, Clock, LeaseStore, Presence, Ttl, UserActiveSubscription, WorkerId};

use crate::config::Config;
use crate::directory::AccountDirectory;
use crate::errors::SyncError;
use crate::events::EventSink;
use crate::source::MailSource;

pub use handle::{AccountView, CoordinatorHandle, CoordinatorObserver, CoordinatorStats};

/// What the coordinator needs from the outside world.
#[derive(Clone)]
pub struct Deps {
    /// Per-account leases, the live set and workers.
    pub store: Arc<dyn LeaseStore>,
    /// Bucket leases (`OWNERSHIP=buckets`).
    pub buckets: Arc<dyn BucketLeases>,
    /// Tiers and users' presence.
    pub presence: Arc<dyn Presence>,
    /// The mail engine.
    pub source: Arc<dyn MailSource>,
    /// Account -> user.
    pub directory: Arc<dyn AccountDirectory>,
    /// Wall-clock time, for mail ages (tokio's clock follows paused time in tests).
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps").field("clock", &self.clock).finish_non_exhaustive()
    }
}

/// Starts coordinators.
#[derive(Debug)]
pub struct Coordinator;

/// A coordinator whose worker is registered but whose loop has not started
/// (see [`Coordinator::prepare`]).
pub struct PreparedCoordinator {
    worker: WorkerId,
    config: Config,
    ttl: Ttl,
    deps: Deps,
    sub: UserActiveSubscription,
    changes: Option<BucketChanges>,
    events: Option<Arc<dyn EventSink>>,
}

impl std::fmt::Debug for PreparedCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCoordinator").field("worker", &self.worker).finish_non_exhaustive()
    }
}

impl Coordinator {
    /// Validates `config`, registers `worker`, subscribes to `user.active`
    /// and starts the coordinator task. The first tick runs at once.
    pub async fn start(worker: WorkerId, config: Config, deps: Deps) -> Result<CoordinatorHandle, SyncError> {
        Ok(Self::prepare(worker, config, deps).await?.spawn())
    }

    /// The first half of [`Coordinator::start`]: validates, registers the
    /// worker and subscribes, without claiming anything yet. Workers that
    /// start together can all register first, so their first ticks already
    /// see each other and split the accounts without shedding.
    pub async fn prepare(worker: WorkerId, config: Config, deps: Deps) -> Result<PreparedCoordinator, SyncError> {
        config.validate()?;
        let ttl = config.checked_lease_ttl()?;
        deps.store.register_worker(&worker, ttl).await?;
        let mut changes = None;
        if config.ownership == crate::config::Ownership::Buckets {
            deps.buckets.join(&worker, ttl).await?;
            // Notices are hints (the change counts are the record): without
            // them an added account waits for the next tick.
            changes = match deps.buckets.subscribe_bucket_changes().await {
                Ok(changes) => Some(changes),
                Err(e) => {
                    tracing::warn!(%worker, error = %crate::errors::error_chain(&e), "no bucket change notices: added accounts start at the next tick");
                    None
                }
            };
        }
        let sub = deps.presence.subscribe_user_active().await?;
        Ok(PreparedCoordinator { worker, config, ttl, deps, sub, changes, events: None })
    }
}

impl PreparedCoordinator {
    /// The same coordinator, announcing to `events` every account it claims,
    /// releases or gives up and every tier change (an
    /// [`AccountChanged`](crate::events::AccountChanged) each, for accounts
    /// whose user it knows), so the API can push `account.status`.
    pub fn with_events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = Some(events);
        self
    }

    /// Starts the coordinator task; the first tick runs at once.
    pub fn spawn(self) -> CoordinatorHandle {
        let PreparedCoordinator { worker, config, ttl, deps, sub, changes, events } = self;
        let shared = Arc::new(handle::Shared::default());
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let coord = event_loop::Coord::new(worker.clone(), config, ttl, deps, shared.clone(), events);
        tracing::info!(%worker, "coordinator started");
        let task = tokio::spawn(coord.run(shutdown_rx, sub, changes));
        CoordinatorHandle { worker, shutdown: shutdown_tx, task, shared }
    }
}
