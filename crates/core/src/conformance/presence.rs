//! Conformance cases for [`Presence`](crate::Presence): tiers and users'
//! presence (with the lease cases where the two meet: a claim's default
//! tier, and `mark_not_live` in `lease.rs`).
//!
//! Subscriptions are read with real-time timeouts (the fixture's clock may
//! be a manual one, so tokio's paused time is never relied on).

use std::time::Duration;

use super::support::{key, ms, ttl_ms, user, worker};
use super::Fixture;
use crate::ids::UserId;
use crate::presence::{Tier, UserActiveSubscription};
use crate::ttl::Ttl;

const MINUTE: Ttl = Ttl::from_secs(60);

async fn next_user(sub: &mut UserActiveSubscription) -> UserId {
    tokio::time::timeout(Duration::from_secs(5), sub.recv())
        .await
        .expect("a user.active event within 5 s")
        .expect("the subscription is open")
}

/// A claim sets tier `Warm` unless a tier is already set; `set_tier` and
/// `tier` read back, with or without a lease.
pub async fn tier_defaults_to_warm_on_claim(fx: Fixture) {
    let k = key("acct-1");
    assert_eq!(fx.presence.tier(&k).await.unwrap(), None);
    let lease = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert_eq!(fx.presence.tier(&k).await.unwrap(), Some(Tier::Warm));
    fx.presence.set_tier(&k, Tier::Hot).await.unwrap();
    assert_eq!(fx.presence.tier(&k).await.unwrap(), Some(Tier::Hot));
    assert!(fx.leases.release(&lease).await.unwrap());
    fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().unwrap();
    assert_eq!(fx.presence.tier(&k).await.unwrap(), Some(Tier::Hot), "a claim keeps a tier already set");

    let k2 = key("acct-2");
    fx.presence.set_tier(&k2, Tier::Cold).await.unwrap();
    assert_eq!(fx.presence.tier(&k2).await.unwrap(), Some(Tier::Cold));
    fx.leases.claim(&k2, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert_eq!(fx.presence.tier(&k2).await.unwrap(), Some(Tier::Cold));
    fx.presence.set_tier(&k2, Tier::Warm).await.unwrap();
    assert_eq!(fx.presence.tier(&k2).await.unwrap(), Some(Tier::Warm));
}

/// Presence lasts for its grace and then lapses; other users are not active.
pub async fn presence_expires_after_grace(fx: Fixture) {
    assert!(!fx.presence.is_user_active(&user("u1")).await.unwrap());
    fx.presence.mark_user_active(&user("u1"), ttl_ms(100)).await.unwrap();
    assert!(fx.presence.is_user_active(&user("u1")).await.unwrap());
    assert!(!fx.presence.is_user_active(&user("u2")).await.unwrap());
    fx.time.advance(ms(300)).await;
    assert!(!fx.presence.is_user_active(&user("u1")).await.unwrap());
}

/// Marking a user active again refreshes the grace from now.
pub async fn presence_refresh_extends_grace(fx: Fixture) {
    fx.presence.mark_user_active(&user("u1"), ttl_ms(600)).await.unwrap();
    fx.time.advance(ms(400)).await;
    assert!(fx.presence.is_user_active(&user("u1")).await.unwrap());
    fx.presence.mark_user_active(&user("u1"), ttl_ms(600)).await.unwrap();
    fx.time.advance(ms(400)).await;
    assert!(fx.presence.is_user_active(&user("u1")).await.unwrap(), "refreshed presence still current");
}

/// Every subscriber receives each published user id, in order; a later
/// subscriber sees only later events.
pub async fn subscribers_receive_user_active_in_order(fx: Fixture) {
    let mut s1 = fx.presence.subscribe_user_active().await.unwrap();
    let mut s2 = fx.presence.subscribe_user_active().await.unwrap();
    for u in ["u1", "u2", "u1"] {
        fx.presence.mark_user_active(&user(u), MINUTE).await.unwrap();
    }
    for sub in [&mut s1, &mut s2] {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(next_user(sub).await);
        }
        assert_eq!(got, [user("u1"), user("u2"), user("u1")]);
    }
    let mut s3 = fx.presence.subscribe_user_active().await.unwrap();
    fx.presence.mark_user_active(&user("u3"), MINUTE).await.unwrap();
    assert_eq!(next_user(&mut s3).await, user("u3"));
    assert_eq!(next_user(&mut s1).await, user("u3"));
}

/// `tiers_or_default` answers each key's tier in order, setting the default
/// only on keys that had none.
pub async fn tiers_or_default_sets_only_missing_tiers(fx: Fixture) {
    let (hot, fresh) = (key("acct-hot"), key("acct-fresh"));
    fx.presence.set_tier(&hot, Tier::Hot).await.unwrap();
    let tiers = fx.presence.tiers_or_default(&[hot.clone(), fresh.clone()], Tier::Warm).await.unwrap();
    assert_eq!(tiers, vec![Tier::Hot, Tier::Warm]);
    assert_eq!(fx.presence.tier(&fresh).await.unwrap(), Some(Tier::Warm));
    assert_eq!(fx.presence.tier(&hot).await.unwrap(), Some(Tier::Hot));
    assert!(fx.presence.tiers_or_default(&[], Tier::Cold).await.unwrap().is_empty());
}
