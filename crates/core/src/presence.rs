//! Tiers and user presence: what sync-worker's coordinator shares about
//! accounts and users beside their leases.
//!
//! See [`Presence`] for the contract.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::errors::LeaseError;
use crate::ids::{LeaseKey, UserId};
use crate::notices::Notices;
use crate::ttl::Ttl;

/// How hard an owned account is watched (sync-worker's tiers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Persistent watch (IMAP IDLE) plus a secondary poll.
    Hot,
    /// Transient polls at the warm rate. The default on claim.
    Warm,
    /// Transient polls at the cold rate.
    Cold,
}

impl Tier {
    /// The stored name: `hot`, `warm` or `cold`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Hot => "hot",
            Tier::Warm => "warm",
            Tier::Cold => "cold",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hot" => Ok(Tier::Hot),
            "warm" => Ok(Tier::Warm),
            "cold" => Ok(Tier::Cold),
            other => Err(format!("unknown tier {other:?}: expected hot, warm or cold")),
        }
    }
}

/// A subscription to `user.active` events: each published user id, in
/// order, from the moment of subscribing (see [`Notices`]).
pub type UserActiveSubscription = Notices<UserId>;

/// Per-key tiers and per-user presence, shared by every worker of a
/// deployment.
///
/// # Contract
///
/// * The **tier** of a key is whatever was last set. A key with none set
///   has none ([`Presence::tier`] answers `None`) until
///   [`Presence::set_tier`] or [`Presence::tiers_or_default`] gives it one.
///   In a store that is also a [`LeaseStore`](crate::LeaseStore), a key's
///   tier is dropped with its liveness
///   ([`LeaseStore::mark_not_live`](crate::LeaseStore::mark_not_live)),
///   and a claim of a key with none sets `Warm`.
/// * [`Presence::tiers_or_default`] answers one tier per key, in order, and
///   sets `default` only on keys that had none: a tier already set is never
///   overwritten.
/// * **Presence**: [`Presence::mark_user_active`] makes the user active for
///   `grace` from now (a later call extends it) and publishes a `user.active`
///   event to every current subscriber. Events published before a
///   subscription was made are not seen by it.
/// * Backend failures are [`LeaseError::Backend`].
#[async_trait]
pub trait Presence: Send + Sync + 'static {
    /// Sets the tier of `key`.
    async fn set_tier(&self, key: &LeaseKey, tier: Tier) -> Result<(), LeaseError>;

    /// The tier of `key`, if one is set.
    async fn tier(&self, key: &LeaseKey) -> Result<Option<Tier>, LeaseError>;

    /// The tier of each of `keys`, in order, first setting `default` on those
    /// that have none. Backends do this in few round trips (Redis: one
    /// script call per chunk of keys), so an owner taking up many keys at
    /// once does not pay a round trip per key.
    async fn tiers_or_default(&self, keys: &[LeaseKey], default: Tier) -> Result<Vec<Tier>, LeaseError> {
        let mut tiers = Vec::with_capacity(keys.len());
        for key in keys {
            let tier = match self.tier(key).await? {
                Some(t) => t,
                None => {
                    self.set_tier(key, default).await?;
                    default
                }
            };
            tiers.push(tier);
        }
        Ok(tiers)
    }

    /// Refreshes `user`'s presence for `grace` and publishes `user.active`.
    async fn mark_user_active(&self, user: &UserId, grace: Ttl) -> Result<(), LeaseError>;

    /// Whether `user`'s presence is current.
    async fn is_user_active(&self, user: &UserId) -> Result<bool, LeaseError>;

    /// Subscribes to `user.active` events published from now on.
    async fn subscribe_user_active(&self) -> Result<UserActiveSubscription, LeaseError>;
}
