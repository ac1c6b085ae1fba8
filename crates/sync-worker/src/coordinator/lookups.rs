//! Lookups the coordinator needs from the database, done off its loop.
//!
//! The loop renews leases; a lookup that waits on a slow or stopped database
//! (which user owns an account, the newest mail date for tier evaluation)
//! must never delay a renew, or a worker whose lease store is healthy would
//! let its leases lapse. So each lookup runs as a task of its own and sends
//! its answer back to the loop as a [`Lookup`]; the loop applies it when it
//! arrives (a claimed account runs at once, its user filled in later; a tier
//! evaluation takes effect when its inputs are in).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use leasehold_core::{BucketId, BucketLeases, LeaseKey, Presence, Tier, UserId};
use tokio::sync::mpsc;

use super::bucket_state::BucketStart;
use crate::directory::{AccountDirectory, BucketAccount};
use crate::source::MailSource;

/// Concurrent reads per lookup.
const CONCURRENCY: usize = 64;

/// An answer for the loop.
#[derive(Debug)]
pub(super) enum Lookup {
    /// The users of freshly claimed accounts (`None`: unknown, or the lookup failed).
    Users(Vec<(LeaseKey, Option<UserId>)>),
    /// What a tier evaluation needs, per key, in order.
    TierInputs {
        /// The owned keys when the evaluation began.
        keys: Vec<LeaseKey>,
        /// Their users, freshly read; `None` when the directory failed (keep the known ones).
        users: Option<Vec<Option<UserId>>>,
        /// Whether each of the users has a current session.
        active: HashMap<UserId, bool>,
        /// The newest mail date of each key, or why it could not be read.
        latest: Vec<Result<Option<u64>, String>>,
    },
    /// The accounts of owned buckets, read at the given change counts (or
    /// why they could not be read).
    BucketAccounts {
        /// Each bucket read, with the change count that asked for the read.
        buckets: Vec<(BucketId, u64)>,
        /// Their accounts.
        accounts: Result<Vec<BucketAccount>, String>,
    },
    /// The tiers of accounts new to held buckets, to start them at: each
    /// bucket with the token it was held under and the leases to start.
    BucketStarts {
        /// Each bucket's accounts to start.
        starts: Vec<BucketStart>,
        /// The tier of each lease, in order over every bucket (warm where
        /// none was stored), or why they could not be read.
        tiers: Result<Vec<Tier>, String>,
    },
    /// Every bucket's weight was given to the lease store again.
    WeightsGiven,
}

/// Reads the accounts of `buckets` and sends them to the loop.
pub(super) fn bucket_accounts(
    directory: Arc<dyn AccountDirectory>,
    buckets: Vec<(BucketId, u64)>,
    tx: mpsc::UnboundedSender<Lookup>,
) {
    tokio::spawn(async move {
        let ids: Vec<BucketId> = buckets.iter().map(|(b, _)| *b).collect();
        let started = std::time::Instant::now();
        let accounts = directory.accounts_in_buckets(&ids).await.map_err(|e| crate::errors::error_chain(&e));
        tracing::debug!(
            buckets = ids.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "read the accounts of buckets"
        );
        let _ = tx.send(Lookup::BucketAccounts { buckets, accounts });
    });
}

/// Reads the tiers of the accounts in `starts` (storing warm where none is
/// stored) and sends them to the loop: a takeover of many buckets costs the
/// loop no wait on the lease store, so its ticks keep renewing. The buckets
/// go in groups of about [`STARTS_PER_READ`] accounts, each sent as soon as
/// its tiers are read, so the first accounts start while the rest are read.
pub(super) fn bucket_starts(presence: Arc<dyn Presence>, starts: Vec<BucketStart>, tx: mpsc::UnboundedSender<Lookup>) {
    tokio::spawn(async move {
        for group in start_groups(starts, STARTS_PER_READ) {
            let keys: Vec<LeaseKey> = group.iter().flat_map(|s| s.leases.iter().map(|l| l.key.clone())).collect();
            let started = std::time::Instant::now();
            let tiers = presence.tiers_or_default(&keys, Tier::Warm).await.map_err(|e| crate::errors::error_chain(&e));
            tracing::debug!(
                accounts = keys.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "read the tiers of accounts to start"
            );
            if tx.send(Lookup::BucketStarts { starts: group, tiers }).is_err() {
                return;
            }
        }
    });
}

/// Accounts whose tiers one read of [`bucket_starts`] asks for (a bucket is
/// never split, so a group can hold one bucket more than this).
const STARTS_PER_READ: usize = 1024;

/// `starts` in order, cut into groups of whole buckets of at least `per`
/// accounts each (the last may hold fewer).
fn start_groups(starts: Vec<BucketStart>, per: usize) -> Vec<Vec<BucketStart>> {
    let mut groups = Vec::new();
    let mut group = Vec::new();
    let mut size = 0;
    for start in starts {
        size += start.leases.len();
        group.push(start);
        if size >= per {
            groups.push(std::mem::take(&mut group));
            size = 0;
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// Gives the bucket weights of `buckets` (every bucket when `None`) again
/// from the directory: after the lease store lost them, or as the rolling
/// repair of a few buckets a round. Logs its outcome; after every bucket,
/// tells the loop ([`Lookup::WeightsGiven`]).
pub(super) fn repair_weights(
    directory: Arc<dyn AccountDirectory>,
    leases: Arc<dyn BucketLeases>,
    buckets: Option<Vec<BucketId>>,
    tx: mpsc::UnboundedSender<Lookup>,
) {
    tokio::spawn(async move {
        let weights = directory.bucket_weights(buckets.as_deref()).await;
        let weights = match weights {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %crate::errors::error_chain(&e), "could not count the accounts per bucket");
                return;
            }
        };
        match leases.set_weights(&weights).await {
            Ok(()) if buckets.is_none() => {
                tracing::info!(buckets = weights.len(), "gave the lease store every bucket's weight again");
                let _ = tx.send(Lookup::WeightsGiven);
            }
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %crate::errors::error_chain(&e), "could not store the bucket weights"),
        }
    });
}

/// Looks up the users of `keys` and sends them to the loop.
pub(super) fn users(directory: Arc<dyn AccountDirectory>, keys: Vec<LeaseKey>, tx: mpsc::UnboundedSender<Lookup>) {
    tokio::spawn(async move {
        let users = match directory.users_of(&keys).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %crate::errors::error_chain(&e), accounts = keys.len(), "could not look up account users");
                vec![None; keys.len()]
            }
        };
        let _ = tx.send(Lookup::Users(keys.into_iter().zip(users).collect()));
    });
}

/// Gathers a tier evaluation's inputs for `keys` (whose users, as known so
/// far, are `known`) and sends them to the loop.
pub(super) fn tier_inputs(
    directory: Arc<dyn AccountDirectory>,
    presence: Arc<dyn Presence>,
    source: Arc<dyn MailSource>,
    keys: Vec<LeaseKey>,
    known: Vec<Option<UserId>>,
    tx: mpsc::UnboundedSender<Lookup>,
) {
    tokio::spawn(async move {
        // Users may have been recorded after the claim: refresh them.
        let users = directory.users_of(&keys).await.ok();
        let all: HashSet<UserId> = users.as_ref().unwrap_or(&known).iter().flatten().cloned().collect();
        let active: HashMap<UserId, bool> = stream::iter(all)
            .map(|u| {
                let presence = presence.clone();
                async move {
                    let active = presence.is_user_active(&u).await.unwrap_or_else(|e| {
                        tracing::warn!(user = %u, error = %e, "could not read presence; taking it as absent");
                        false
                    });
                    (u, active)
                }
            })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        let latest: Vec<Result<Option<u64>, String>> = stream::iter(keys.clone())
            .map(|k| {
                let source = source.clone();
                async move { source.latest_internal_date(&k).await.map_err(|e| e.to_string()) }
            })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        let _ = tx.send(Lookup::TierInputs { keys, users, active, latest });
    });
}

#[cfg(test)]
mod tests {
    use leasehold_core::{FencingToken, Lease, WorkerId};

    use super::*;

    fn start(bucket: u32, accounts: usize) -> BucketStart {
        let owner = WorkerId::new("w1").expect("worker id");
        let leases: Vec<Lease> = (0..accounts)
            .map(|i| Lease {
                key: LeaseKey::new(format!("a{i}")).expect("key"),
                owner: owner.clone(),
                token: FencingToken(1),
            })
            .collect();
        BucketStart { bucket: BucketId(bucket), token: FencingToken(1), users: vec![None; leases.len()], leases }
    }

    fn shape(groups: &[Vec<BucketStart>]) -> Vec<Vec<u32>> {
        groups.iter().map(|g| g.iter().map(|s| s.bucket.0).collect()).collect()
    }

    #[test]
    fn starts_are_grouped_by_whole_buckets_in_order() {
        let starts = vec![start(1, 600), start(2, 600), start(3, 100), start(4, 2000), start(5, 10)];
        assert_eq!(shape(&start_groups(starts, 1024)), vec![vec![1, 2], vec![3, 4], vec![5]]);
        assert!(start_groups(Vec::new(), 1024).is_empty());
        assert_eq!(shape(&start_groups(vec![start(7, 1)], 1024)), vec![vec![7]]);
    }
}
