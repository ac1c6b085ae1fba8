//! Conformance cases for [`LeaseStore`](crate::LeaseStore).
//!
//! Fencing tokens differ between backends, so cases compare them only with
//! each other.

use std::time::Duration;

use super::support::{key, ms, ttl_ms, user, worker};
use super::Fixture;
use crate::errors::SpecError;
use crate::lease::{FencingToken, Lease};
use crate::presence::Tier;
use crate::ttl::Ttl;

const MINUTE: Ttl = Ttl::from_secs(60);

/// Two claims of one key: the first wins, the second gets `None`; `holder`
/// reports the exact lease.
pub async fn claim_gives_one_holder(fx: Fixture) {
    let k = key("acct-1");
    assert_eq!(fx.leases.holder(&k).await.unwrap(), None);
    let lease = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().expect("first claim wins");
    assert_eq!((lease.key.clone(), lease.owner.clone()), (k.clone(), worker("w1")));
    assert!(fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().is_none());
    assert_eq!(fx.leases.holder(&k).await.unwrap(), Some(lease));
}

/// A claim of a held key by its own holder is refused and leaves the lease as it was.
pub async fn claim_of_held_key_by_its_holder_is_refused(fx: Fixture) {
    let k = key("acct-1");
    let lease = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().is_none());
    assert_eq!(fx.leases.holder(&k).await.unwrap(), Some(lease.clone()));
    assert!(fx.leases.renew(&lease, MINUTE).await.unwrap());
}

/// Tokens strictly increase across claims of a key, through release, expiry
/// and `mark_not_live`.
pub async fn tokens_increase_across_release_expiry_and_not_live(fx: Fixture) {
    let k = key("acct-1");
    let l1 = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(fx.leases.release(&l1).await.unwrap());
    let l2 = fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().unwrap();
    assert!(l2.token > l1.token, "{:?} after release must exceed {:?}", l2.token, l1.token);
    assert!(fx.leases.release(&l2).await.unwrap());
    let l3 = fx.leases.claim(&k, &worker("w1"), ttl_ms(100)).await.unwrap().unwrap();
    assert!(l3.token > l2.token);
    fx.time.advance(ms(300)).await;
    let l4 = fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().expect("expired key is free");
    assert!(l4.token > l3.token, "{:?} after expiry must exceed {:?}", l4.token, l3.token);
    fx.leases.mark_live(&k).await.unwrap();
    fx.leases.mark_not_live(&k).await.unwrap();
    let l5 = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().expect("dropped key is free");
    assert!(l5.token > l4.token, "{:?} after mark_not_live must exceed {:?}", l5.token, l4.token);
}

/// Renew and release by anyone but the owner answer `false`, also after the
/// key was taken over by another worker.
pub async fn renew_and_release_check_the_owner(fx: Fixture) {
    let k = key("acct-1");
    let lease = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    let forged = Lease { owner: worker("w2"), ..lease.clone() };
    assert!(!fx.leases.renew(&forged, MINUTE).await.unwrap());
    assert!(!fx.leases.release(&forged).await.unwrap());
    assert_eq!(fx.leases.holder(&k).await.unwrap(), Some(lease));

    let k2 = key("acct-2");
    let old = fx.leases.claim(&k2, &worker("w1"), ttl_ms(100)).await.unwrap().unwrap();
    fx.time.advance(ms(300)).await;
    let taker = fx.leases.claim(&k2, &worker("w2"), MINUTE).await.unwrap().expect("takeover");
    assert!(!fx.leases.renew(&old, MINUTE).await.unwrap());
    assert!(!fx.leases.release(&old).await.unwrap());
    assert_eq!(fx.leases.holder(&k2).await.unwrap(), Some(taker));
}

/// Renew and release check the token: the same owner's earlier lease (or a
/// made-up token) is refused and the current lease is untouched.
pub async fn renew_and_release_check_the_token(fx: Fixture) {
    let k = key("acct-1");
    let l1 = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(fx.leases.release(&l1).await.unwrap());
    let l2 = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(!fx.leases.renew(&l1, MINUTE).await.unwrap());
    assert!(!fx.leases.release(&l1).await.unwrap());
    let newer = Lease { token: FencingToken(l2.token.0 + 1), ..l2.clone() };
    assert!(!fx.leases.renew(&newer, MINUTE).await.unwrap());
    assert!(!fx.leases.release(&newer).await.unwrap());
    assert_eq!(fx.leases.holder(&k).await.unwrap(), Some(l2.clone()));
    assert!(fx.leases.renew(&l2, MINUTE).await.unwrap());
}

/// Renew extends the lease from now and keeps its token.
pub async fn renew_extends_the_lease(fx: Fixture) {
    let k = key("acct-1");
    let lease = fx.leases.claim(&k, &worker("w1"), Ttl::from_secs(1)).await.unwrap().unwrap();
    fx.time.advance(ms(600)).await;
    assert!(fx.leases.renew(&lease, Ttl::from_secs(1)).await.unwrap());
    fx.time.advance(ms(600)).await;
    assert_eq!(fx.leases.holder(&k).await.unwrap(), Some(lease.clone()), "renewed lease still held");
    assert!(fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().is_none());
    assert!(fx.leases.renew(&lease, MINUTE).await.unwrap());
}

/// An expired lease frees its key: no holder, renew and release `false`,
/// another worker may claim.
pub async fn expired_lease_frees_the_key(fx: Fixture) {
    let k = key("acct-1");
    let lease = fx.leases.claim(&k, &worker("w1"), ttl_ms(100)).await.unwrap().unwrap();
    fx.time.advance(ms(300)).await;
    assert_eq!(fx.leases.holder(&k).await.unwrap(), None);
    assert!(!fx.leases.renew(&lease, MINUTE).await.unwrap());
    assert!(!fx.leases.release(&lease).await.unwrap());
    let next = fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().expect("free after expiry");
    assert_eq!(next.owner, worker("w2"));
}

/// Release frees the key at once; a second release or a renew answers `false`.
pub async fn release_frees_the_key_at_once(fx: Fixture) {
    let k = key("acct-1");
    let lease = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(fx.leases.release(&lease).await.unwrap());
    assert_eq!(fx.leases.holder(&k).await.unwrap(), None);
    assert!(!fx.leases.release(&lease).await.unwrap());
    assert!(!fx.leases.renew(&lease, MINUTE).await.unwrap());
    let next = fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().expect("free after release");
    assert!(next.token > lease.token);
}

/// The live set: add, remove, both idempotent; listed sorted; liveness does
/// not claim.
pub async fn live_set_is_sorted_and_idempotent(fx: Fixture) {
    assert!(fx.leases.live_keys().await.unwrap().is_empty());
    for k in ["b", "a", "c", "a"] {
        fx.leases.mark_live(&key(k)).await.unwrap();
    }
    assert_eq!(fx.leases.live_keys().await.unwrap(), [key("a"), key("b"), key("c")]);
    fx.leases.mark_not_live(&key("b")).await.unwrap();
    fx.leases.mark_not_live(&key("b")).await.unwrap();
    fx.leases.mark_not_live(&key("never")).await.unwrap();
    assert_eq!(fx.leases.live_keys().await.unwrap(), [key("a"), key("c")]);
    assert_eq!(fx.leases.holder(&key("a")).await.unwrap(), None);
}

/// `mark_not_live` drops the key's lease (the owner's renew answers `false`)
/// and its tier; a later claim gets a new token and the default tier.
pub async fn mark_not_live_drops_lease_and_tier(fx: Fixture) {
    let k = key("acct-1");
    fx.leases.mark_live(&k).await.unwrap();
    let lease = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    fx.presence.set_tier(&k, Tier::Hot).await.unwrap();
    assert_eq!(fx.presence.tier(&k).await.unwrap(), Some(Tier::Hot));
    fx.leases.mark_not_live(&k).await.unwrap();
    assert_eq!(fx.leases.holder(&k).await.unwrap(), None);
    assert!(!fx.leases.renew(&lease, MINUTE).await.unwrap());
    assert!(!fx.leases.release(&lease).await.unwrap());
    assert_eq!(fx.presence.tier(&k).await.unwrap(), None);
    assert!(fx.leases.live_keys().await.unwrap().is_empty());
    let again = fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().unwrap();
    assert!(again.token > lease.token);
    assert_eq!(fx.presence.tier(&k).await.unwrap(), Some(Tier::Warm));
}

/// Registered workers are listed sorted until their TTL runs out; a
/// re-registration refreshes the TTL.
pub async fn worker_registry_expires_and_refreshes(fx: Fixture) {
    fx.leases.register_worker(&worker("w2"), MINUTE).await.unwrap();
    fx.leases.register_worker(&worker("w1"), MINUTE).await.unwrap();
    fx.leases.register_worker(&worker("w3"), ttl_ms(100)).await.unwrap();
    fx.leases.register_worker(&worker("w4"), ttl_ms(600)).await.unwrap();
    assert_eq!(fx.leases.live_workers().await.unwrap(), [worker("w1"), worker("w2"), worker("w3"), worker("w4")]);
    fx.time.advance(ms(400)).await;
    assert_eq!(fx.leases.live_workers().await.unwrap(), [worker("w1"), worker("w2"), worker("w4")]);
    fx.leases.register_worker(&worker("w4"), ttl_ms(600)).await.unwrap();
    fx.time.advance(ms(400)).await;
    assert_eq!(fx.leases.live_workers().await.unwrap(), [worker("w1"), worker("w2"), worker("w4")]);
}

/// Deregistering removes a worker at once, idempotently.
pub async fn deregister_worker_removes_it(fx: Fixture) {
    fx.leases.register_worker(&worker("w1"), MINUTE).await.unwrap();
    fx.leases.register_worker(&worker("w2"), MINUTE).await.unwrap();
    fx.leases.deregister_worker(&worker("w1")).await.unwrap();
    assert_eq!(fx.leases.live_workers().await.unwrap(), [worker("w2")]);
    fx.leases.deregister_worker(&worker("w1")).await.unwrap();
    fx.leases.deregister_worker(&worker("never")).await.unwrap();
    assert_eq!(fx.leases.live_workers().await.unwrap(), [worker("w2")]);
    fx.leases.register_worker(&worker("w1"), MINUTE).await.unwrap();
    assert_eq!(fx.leases.live_workers().await.unwrap(), [worker("w1"), worker("w2")]);
}

/// A zero (or sub-millisecond) TTL or grace cannot reach a store: making
/// one is `SpecError::ZeroTtl`, naming what it was for. The shortest TTL,
/// 1 ms, is taken by every call and expires like any other.
pub async fn zero_ttl_is_rejected_and_changes_nothing(fx: Fixture) {
    for bad in [Duration::ZERO, Duration::from_micros(500)] {
        assert!(matches!(Ttl::new("lease TTL", bad), Err(SpecError::ZeroTtl { what: "lease TTL", .. })), "{bad:?}");
    }
    let shortest = Ttl::new("lease TTL", Duration::from_micros(1500)).expect("1.5 ms is a TTL");
    let k = key("acct-1");
    let lease = fx.leases.claim(&k, &worker("w1"), shortest).await.unwrap().expect("a free key");
    assert!(fx.leases.claim_many(std::slice::from_ref(&k), &worker("w2"), shortest).await.unwrap().len() <= 1);
    fx.leases.register_worker(&worker("w1"), shortest).await.unwrap();
    fx.presence.mark_user_active(&user("u1"), shortest).await.unwrap();
    fx.time.advance(ms(300)).await;
    assert!(!fx.leases.renew(&lease, MINUTE).await.unwrap(), "a 1 ms lease has expired");
    assert_eq!(fx.leases.renew_many(std::slice::from_ref(&lease), MINUTE).await.unwrap(), vec![false]);
    assert!(fx.leases.live_workers().await.unwrap().is_empty());
    assert!(!fx.presence.is_user_active(&user("u1")).await.unwrap());
}

/// `claim_many` claims each free key in order and skips held ones;
/// `renew_many` answers per lease, in order.
pub async fn claim_many_and_renew_many_behave_like_loops(fx: Fixture) {
    let held = fx.leases.claim(&key("b"), &worker("w2"), MINUTE).await.unwrap().unwrap();
    let keys = [key("a"), key("b"), key("c")];
    let won = fx.leases.claim_many(&keys, &worker("w1"), MINUTE).await.unwrap();
    let won_keys: Vec<_> = won.iter().map(|l| (l.key.clone(), l.owner.clone())).collect();
    assert_eq!(won_keys, [(key("a"), worker("w1")), (key("c"), worker("w1"))]);
    for lease in &won {
        assert_eq!(fx.leases.holder(&lease.key).await.unwrap(), Some(lease.clone()));
    }
    assert!(fx.leases.claim_many(&keys, &worker("w3"), MINUTE).await.unwrap().is_empty());
    assert!(fx.leases.claim_many(&[], &worker("w3"), MINUTE).await.unwrap().is_empty());

    let forged = Lease { owner: worker("w1"), ..held.clone() };
    let answers = fx.leases.renew_many(&[won[0].clone(), forged, won[1].clone()], MINUTE).await.unwrap();
    assert_eq!(answers, [true, false, true]);
    assert_eq!(fx.leases.holder(&key("b")).await.unwrap(), Some(held));
    assert!(fx.leases.renew_many(&[], MINUTE).await.unwrap().is_empty());
}

/// Eight concurrent claims of one key: exactly one wins.
pub async fn concurrent_claims_elect_one_holder(fx: Fixture) {
    let k = key("acct-1");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let leases = fx.leases.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move { leases.claim(&k, &worker(&format!("w{i}")), MINUTE).await.unwrap() }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        winners.extend(task.await.unwrap());
    }
    assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
    assert_eq!(fx.leases.holder(&k).await.unwrap(), winners.pop());
}

/// Keys are independent: releasing or dropping one leaves the others held.
pub async fn lease_keys_are_independent(fx: Fixture) {
    let a = fx.leases.claim(&key("a"), &worker("w1"), MINUTE).await.unwrap().unwrap();
    let b = fx.leases.claim(&key("b"), &worker("w1"), MINUTE).await.unwrap().unwrap();
    let c = fx.leases.claim(&key("c"), &worker("w2"), MINUTE).await.unwrap().unwrap();
    assert!(fx.leases.release(&a).await.unwrap());
    fx.leases.mark_not_live(&key("b")).await.unwrap();
    assert_eq!(fx.leases.holder(&key("a")).await.unwrap(), None);
    assert_eq!(fx.leases.holder(&key("b")).await.unwrap(), None);
    assert_eq!(fx.leases.holder(&key("c")).await.unwrap(), Some(c.clone()));
    assert!(fx.leases.renew(&c, MINUTE).await.unwrap());
    assert!(!fx.leases.renew(&b, MINUTE).await.unwrap());
}

/// `raise_token` puts the next claim's token above the given one, never
/// lowers the counter, leaves the current lease as it is, and touches no
/// other key.
pub async fn raise_token_puts_the_next_claim_above_it(fx: Fixture) {
    let k = key("acct-1");
    // A key never claimed: the first claim lands above the raised token.
    fx.leases.raise_token(&k, FencingToken(41)).await.unwrap();
    let l1 = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(l1.token > FencingToken(41), "{:?} after raise_token(41)", l1.token);
    // Raising while held changes nothing about the lease.
    fx.leases.raise_token(&k, FencingToken(l1.token.0 + 100)).await.unwrap();
    assert_eq!(fx.leases.holder(&k).await.unwrap(), Some(l1.clone()));
    assert!(fx.leases.renew(&l1, MINUTE).await.unwrap());
    assert!(fx.leases.release(&l1).await.unwrap());
    let l2 = fx.leases.claim(&k, &worker("w2"), MINUTE).await.unwrap().unwrap();
    assert!(l2.token > FencingToken(l1.token.0 + 100), "{:?} after raising past {}", l2.token, l1.token.0 + 100);
    // Raising below the counter never lowers it.
    assert!(fx.leases.release(&l2).await.unwrap());
    fx.leases.raise_token(&k, FencingToken(1)).await.unwrap();
    let l3 = fx.leases.claim(&k, &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(l3.token > l2.token, "{:?} must exceed {:?} after a lower raise", l3.token, l2.token);
    // Other keys keep their own counters.
    let other = fx.leases.claim(&key("acct-2"), &worker("w1"), MINUTE).await.unwrap().unwrap();
    assert!(other.token < FencingToken(41), "an unrelated key's token {:?} was raised", other.token);
}

/// `bind_deployment` records the first id and answers it to every later caller.
pub async fn bind_deployment_keeps_the_first_id(fx: Fixture) {
    assert_eq!(fx.leases.bind_deployment("dep-a").await.unwrap(), "dep-a");
    assert_eq!(fx.leases.bind_deployment("dep-a").await.unwrap(), "dep-a", "idempotent for its own id");
    assert_eq!(fx.leases.bind_deployment("dep-b").await.unwrap(), "dep-a", "another deployment sees the first");
}
