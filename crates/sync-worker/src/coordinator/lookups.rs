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
use leasehold_core::{BucketId, BucketLeases, FencingToken, Lease, LeaseKey, Presence, Tier, UserId};
use tokio::sync::mpsc;

use crate::directory::AccountDirectory;
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
        accounts: Result<Vec<(BucketId, LeaseKey)>, String>,
    },
    /// The tiers of accounts new to held buckets, to start them at: each
    /// bucket with the token it was held under and the leases to start.
    BucketStarts {
        /// (bucket, its token when the read came in, the leases to start).
        starts: Vec<(BucketId, FencingToken, Vec<Lease>)>,
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
        let accounts = directory.accounts_in_buckets(&ids).await.map_err(|e| crate::errors::error_chain(&e));
        let _ = tx.send(Lookup::BucketAccounts { buckets, accounts });
    });
}

/// Reads the tiers of the accounts in `starts` (storing warm where none is
/// stored) and sends them to the loop: a takeover of many buckets costs the
/// loop no wait on the lease store, so its ticks keep renewing.
pub(super) fn bucket_starts(
    presence: Arc<dyn Presence>,
    starts: Vec<(BucketId, FencingToken, Vec<Lease>)>,
    tx: mpsc::UnboundedSender<Lookup>,
) {
    tokio::spawn(async move {
        let keys: Vec<LeaseKey> =
            starts.iter().flat_map(|(_, _, leases)| leases.iter().map(|l| l.key.clone())).collect();
        let tiers = presence.tiers_or_default(&keys, Tier::Warm).await.map_err(|e| crate::errors::error_chain(&e));
        let _ = tx.send(Lookup::BucketStarts { starts, tiers });
    });
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
                tracing::warn!(error = %e, accounts = keys.len(), "could not look up account users");
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
