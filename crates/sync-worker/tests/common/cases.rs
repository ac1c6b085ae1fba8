//! The acceptance cases, generic over the backend (see `Backend`). Paused
//! tokio time on the memory backend; real time, small TTLs, on Redis.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Lease, LeaseKey, Tier};
use sync_worker::config::Ownership;
use sync_worker::{Activity, CoordinatorHandle, Fence, MailSource, Scope};
use tokio::time::Instant;

use super::{user, wid, Backend, Env, Faulty};

/// A test's TTL as the stores take it.
fn ttl(d: Duration) -> leasehold_core::Ttl {
    leasehold_core::Ttl::new("test TTL", d).expect("a test's TTL is at least 1 ms")
}

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn total(ws: &[&CoordinatorHandle]) -> usize {
    ws.iter().map(|w| w.owned_count()).sum()
}

fn counts(ws: &[&CoordinatorHandle]) -> Vec<usize> {
    ws.iter().map(|w| w.owned_count()).collect()
}

/// Every account a worker owns is held in the store by that worker under the
/// token the worker runs with, and was polled with that token.
async fn assert_consistent(env: &Env, w: &CoordinatorHandle) {
    for view in w.owned() {
        let bucket = env.bucket_of(&view.account);
        let held =
            sync_worker::leases::account_holder(env.admin.as_ref(), &view.account, bucket).await.expect("holder");
        let held = held.unwrap_or_else(|| panic!("{} owns {} but the store has no holder", w.worker(), view.account));
        assert_eq!(&held.owner, w.worker(), "{}: holder", view.account);
        assert_eq!(held.token, view.token, "{}: token", view.account);
    }
}

async fn polled_with_token(env: &Env, w: &CoordinatorHandle, within: Duration) -> bool {
    env.wait_for(within, || {
        w.owned().iter().all(|v| {
            env.source.polls_of(&v.account).iter().any(|r| &r.worker == w.worker() && r.token == v.token && r.accepted)
        })
    })
    .await
}

// ---------------------------------------------------------------- leases

/// Three workers split ten accounts: all owned, none above ceil(10/3) = 4.
pub async fn claim_up_to_fair_share(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    env.accounts("fs", 10).await;
    let a = env.start("w-a").await;
    let bw = env.start("w-b").await;
    let c = env.start("w-c").await;
    let all = [&a, &bw, &c];
    assert!(env.wait_for(env.s.ttl * 2, || total(&all) == 10).await, "not all owned: {:?}", counts(&all));
    // Settled: stays so, within the share.
    env.sleep(env.s.ttl * 2).await;
    assert_eq!(total(&all), 10, "{:?}", counts(&all));
    for w in all {
        assert!(w.owned_count() <= 4, "{} owns {} > fair share 4: {:?}", w.worker(), w.owned_count(), counts(&all));
        assert!(w.owned_count() >= 2, "{} owns {}: {:?}", w.worker(), w.owned_count(), counts(&all));
        assert_consistent(&env, w).await;
        assert!(polled_with_token(&env, w, env.s.poll_warm).await, "{}: an owned account was not polled", w.worker());
    }
    env.assert_exclusive();
    for w in [a, bw, c] {
        w.shutdown().await.expect("shutdown");
    }
}

/// A worker keeps its leases (same tokens) across many TTLs by renewing.
pub async fn renew_keeps_leases(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    env.accounts("rn", 5).await;
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 5).await);
    let before = a.owned();
    env.sleep(env.s.ttl * 5).await;
    let after = a.owned();
    let tokens = |v: &[sync_worker::AccountView]| v.iter().map(|x| (x.account.clone(), x.token)).collect::<Vec<_>>();
    assert_eq!(tokens(&before), tokens(&after), "leases changed hands instead of being renewed");
    let stats = a.stats();
    assert_eq!(stats.claimed, 5, "{stats:?}");
    assert_eq!(stats.lost, 0, "{stats:?}");
    assert!(stats.ticks >= 15, "renewed every TTL/3: {stats:?}");
    assert_consistent(&env, &a).await;
    // And a second worker cannot take any of them.
    match env.config.ownership {
        Ownership::Accounts => {
            let intruder = env.admin.claim(&before[0].account, &wid("intruder"), ttl(env.s.ttl)).await.expect("claim");
            assert!(intruder.is_none(), "a renewed lease was claimable");
        }
        Ownership::Buckets => {
            let policy = leasehold_core::BalancePolicy::default();
            let intruder = env.admin.tick(&wid("intruder"), &[], ttl(env.s.ttl), &policy).await.expect("tick");
            assert!(intruder.claimed.is_empty(), "a renewed bucket was claimable: {:?}", intruder.claimed);
        }
    }
    a.shutdown().await.expect("shutdown");
}

/// A second worker joins: the first sheds down to the share, gracefully.
pub async fn rebalance_when_worker_joins(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    env.accounts("rb", 10).await;
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 10).await);
    let joined = Instant::now();
    let bw = env.start("w-b").await;
    let ok = env.wait_for(env.s.ttl + env.s.tick() * 3, || a.owned_count() == 5 && bw.owned_count() == 5).await;
    assert!(ok, "not rebalanced: {:?} after {:?}", counts(&[&a, &bw]), joined.elapsed());
    let sa = a.stats();
    assert_eq!(sa.shed, 5, "{sa:?}");
    assert_eq!(sa.lost, 0, "shedding is graceful, nothing is lost: {sa:?}");
    env.sleep(env.s.ttl).await;
    assert_eq!(counts(&[&a, &bw]), vec![5, 5], "rebalancing must settle");
    assert_consistent(&env, &a).await;
    assert_consistent(&env, &bw).await;
    assert!(polled_with_token(&env, &bw, env.s.poll_warm).await);
    env.assert_exclusive();
    a.shutdown().await.expect("shutdown");
    bw.shutdown().await.expect("shutdown");
}

/// A killed worker's accounts are taken over once its leases expire, not before.
pub async fn takeover_after_kill(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    env.accounts("tk", 10).await;
    let a = env.start("w-a").await;
    let bw = env.start("w-b").await;
    assert!(env.wait_for(env.s.ttl * 2, || a.owned_count() == 5 && bw.owned_count() == 5).await);
    let a_keys = a.owned_keys();
    let killed = Instant::now();
    a.kill().await;
    // Leases were renewed at most one tick ago: they cannot be free before TTL - tick.
    env.sleep((env.s.ttl - env.s.tick()) / 2).await;
    assert!(a_keys.iter().all(|k| !bw.owns(k)), "taken over before the lease expired");
    let ok = env.wait_for(env.s.ttl + env.s.tick() * 2, || bw.owned_count() == 10).await;
    assert!(ok, "no takeover: {} owned {:?} after the kill", bw.owned_count(), killed.elapsed());
    let took = killed.elapsed();
    assert!(took <= env.s.ttl + env.s.tick() + env.s.jitter * 2, "takeover took {took:?}");
    assert_consistent(&env, &bw).await;
    assert!(polled_with_token(&env, &bw, env.s.poll_warm).await);
    env.assert_exclusive();
    bw.shutdown().await.expect("shutdown");
}

/// A worker that shuts down releases its leases: the other takes over at its
/// next tick, long before the TTL.
pub async fn takeover_after_graceful_release(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    env.accounts("gr", 10).await;
    let a = env.start("w-a").await;
    let bw = env.start("w-b").await;
    assert!(env.wait_for(env.s.ttl * 2, || a.owned_count() == 5 && bw.owned_count() == 5).await);
    let a_keys = a.owned_keys();
    a.shutdown().await.expect("shutdown");
    for k in &a_keys {
        assert!(env.admin.holder(k).await.expect("holder").is_none(), "{k} not released");
    }
    assert!(!env.admin.live_workers().await.expect("workers").contains(&wid("w-a")), "not deregistered");
    let released = Instant::now();
    let ok = env.wait_for(env.s.tick() + env.s.ttl / 10, || bw.owned_count() == 10).await;
    assert!(ok, "no immediate takeover: {} owned after {:?}", bw.owned_count(), released.elapsed());
    assert!(released.elapsed() < env.s.ttl, "took {:?}, not faster than a TTL", released.elapsed());
    env.assert_exclusive();
    bw.shutdown().await.expect("shutdown");
}

/// `mark_not_live` stops the account's loops within one renew interval.
pub async fn mark_not_live_stops_loops(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let keys = env.accounts("nl", 3).await;
    let mut config = env.config.clone();
    config.poll_warm = env.s.ttl / 6;
    let a = env.start_with("w-a", config.clone()).await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 3).await);
    env.mark_not_live(&keys[0]).await;
    let t0 = Instant::now();
    assert!(env.wait_for(env.s.tick(), || !a.owns(&keys[0])).await, "still owned after one renew interval");
    assert!(t0.elapsed() <= env.s.tick() + env.s.jitter);
    // Give a runner that survived time to show itself.
    env.sleep(env.s.tick() / 4).await;
    let seen = env.source.log_of(&keys[0]).len();
    env.sleep(config.poll_warm * 4).await;
    assert_eq!(env.source.log_of(&keys[0]).len(), seen, "the loops of a not-live account kept running");
    assert!(env.source.polls_of(&keys[1]).len() >= 3, "the other accounts keep polling");
    assert_eq!(a.owned_count(), 2);
    a.shutdown().await.expect("shutdown");
}

/// A worker whose renews fail (cut off from the store) stops the account's
/// loops before its lease can expire; the other worker takes over after
/// expiry; they never overlap.
pub async fn lost_lease_stops_writing(b: Arc<dyn Backend>) {
    let env = Env::new(b.clone()).await;
    let k = env.accounts("ll", 1).await.remove(0);
    let mut config = env.config.clone();
    config.poll_warm = env.s.ttl / 10;
    let faulty = Faulty::new(b.store().await);
    let a = env.start_on("w-a", faulty.clone(), config.clone()).await;
    assert!(env.wait_for(env.s.ttl, || a.owns(&k)).await);
    let bw = env.start_with("w-b", config.clone()).await;
    env.sleep(env.s.ttl).await;
    assert!(a.owns(&k) && !bw.owns(&k));
    faulty.set_failing(true);
    let cut_at = env.source.now();
    assert!(env.wait_for(env.s.ttl * 3, || bw.owns(&k)).await, "no takeover");
    assert!(!a.owns(&k), "A still believes it owns the account");
    // Owning comes before B's first poll: wait for that poll to be logged.
    let b_polled = || env.source.log_of(&k).iter().any(|r| r.worker == wid("w-b"));
    assert!(env.wait_for(env.s.ttl, b_polled).await, "B runs it");
    let a_last = env.source.log_of(&k).into_iter().filter(|r| r.worker == wid("w-a")).last().expect("A ran it");
    let b_first = env.source.log_of(&k).into_iter().find(|r| r.worker == wid("w-b")).expect("B runs it");
    assert!(a_last.at < b_first.at, "A ran at {:?}, after B started at {:?}", a_last.at, b_first.at);
    assert!(b_first.token > a_last.token);
    // A stopped writing no later than its lease's TTL after the cut.
    assert!(a_last.at <= cut_at + env.s.ttl + env.s.jitter, "A wrote until {:?}, cut at {cut_at:?}", a_last.at);
    env.sleep(env.s.ttl).await;
    assert_eq!(
        env.source.log_of(&k).iter().filter(|r| r.worker == wid("w-a")).count(),
        env.source.log_of(&k).iter().filter(|r| r.worker == wid("w-a") && r.at <= a_last.at).count(),
        "A wrote again"
    );
    assert!(a.stats().lost >= 1);
    env.assert_exclusive();
    faulty.set_failing(false);
    a.kill().await;
    bw.shutdown().await.expect("shutdown");
}

/// A lease taken over behind the worker's back (released and re-claimed by
/// someone else who wrote): the stale worker's writes are rejected by their
/// token, and it stops at its next renew.
pub async fn stolen_lease_is_fenced(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let k = env.accounts("st", 1).await.remove(0);
    let mut config = env.config.clone();
    config.poll_warm = env.s.ttl / 10;
    let a = env.start_with("w-a", config).await;
    assert!(env.wait_for(env.s.ttl, || a.owns(&k)).await);
    let (held, thief) = match env.config.ownership {
        Ownership::Accounts => {
            let held = env.admin.holder(&k).await.expect("holder").expect("held");
            assert!(env.admin.release(&held).await.expect("release"));
            let thief = env.admin.claim(&k, &wid("thief"), ttl(env.s.ttl * 10)).await.expect("claim").expect("free");
            (held, thief)
        }
        // The account's bucket is handed back behind A's back, and the thief's tick claims it.
        Ownership::Buckets => {
            let bucket = env.admin.bucket_holder(env.bucket_of(&k)).await.expect("holder").expect("held");
            assert_eq!(env.admin.release_buckets(std::slice::from_ref(&bucket)).await.expect("release"), vec![true]);
            let policy = leasehold_core::BalancePolicy::default();
            let tick = env.admin.tick(&wid("thief"), &[], ttl(env.s.ttl * 10), &policy).await.expect("tick");
            let stolen = tick.claimed.into_iter().find(|l| l.bucket == bucket.bucket).expect("the bucket was free");
            let lease = |owner, token| Lease { key: k.clone(), owner, token };
            (lease(bucket.owner, bucket.token), lease(stolen.owner, stolen.token))
        }
    };
    assert!(thief.token > held.token);
    let mut conn = env.source.connect(&Fence::from(&thief)).await.expect("connect");
    conn.poll(Scope::All).await.expect("the new owner writes");
    let stolen_at = Instant::now();
    assert!(env.wait_for(env.s.tick(), || !a.owns(&k)).await, "A kept running after its renew failed");
    assert!(stolen_at.elapsed() <= env.s.tick() + env.s.jitter);
    env.sleep(env.s.ttl).await;
    let log = env.source.log_of(&k);
    let thief_at = log.iter().find(|r| r.worker == wid("thief")).expect("thief wrote").at;
    for r in log.iter().filter(|r| r.worker == wid("w-a") && r.at > thief_at) {
        assert!(!r.accepted || r.activity == Activity::Connect, "a stale write was accepted: {r:?}");
    }
    if let Err(report) = env.source.check_accepted_exclusive() {
        panic!("storage accepted writes of two owners at once:\n{report}");
    }
    assert!(a.stats().lost >= 1);
    a.shutdown().await.expect("shutdown");
}

/// Churn (joins, a crash, a graceful leave, accounts going and coming):
/// the poll log never shows an account run by two workers at once.
pub async fn never_two_workers_at_once(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let keys = env.accounts("ex", 20).await;
    let mut config = env.config.clone();
    config.poll_warm = env.s.ttl / 5;
    config.poll_cold = env.s.ttl / 2;
    let a = env.start_with("w-a", config.clone()).await;
    let bw = env.start_with("w-b", config.clone()).await;
    assert!(env.wait_for(env.s.ttl * 2, || total(&[&a, &bw]) == 20).await);
    let c = env.start_with("w-c", config.clone()).await;
    env.sleep(env.s.ttl).await;
    bw.kill().await;
    env.sleep(env.s.ttl / 2).await;
    env.mark_not_live(&keys[0]).await;
    env.mark_not_live(&keys[1]).await;
    env.sleep(env.s.ttl).await;
    a.shutdown().await.expect("shutdown");
    let d = env.start_with("w-d", config.clone()).await;
    env.mark_live(&keys[0]).await;
    env.mark_live(&keys[1]).await;
    let ok = env.wait_for(env.s.ttl * 3, || total(&[&c, &d]) == 20 && c.owned_count() == 10).await;
    assert!(ok, "not settled: {:?}", counts(&[&c, &d]));
    env.sleep(env.s.ttl).await;
    assert!(env.source.log_len() > 100, "too little activity to prove anything: {}", env.source.log_len());
    env.assert_exclusive();
    assert_consistent(&env, &c).await;
    assert_consistent(&env, &d).await;
    c.shutdown().await.expect("shutdown");
    d.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------------------- tiers

async fn wait_tier(env: &Env, w: &CoordinatorHandle, k: &LeaseKey, tier: Tier, within: Duration) -> bool {
    env.wait_for(within, || w.tier_of(k) == Some(tier)).await
}

async fn stored_tier(env: &Env, k: &LeaseKey) -> Option<Tier> {
    env.admin.tier(k).await.expect("tier")
}

/// A user with a live session gets their accounts promoted to hot at the next
/// evaluation (the account's mail alone would keep it warm); when the session
/// lapses, the account goes back to warm.
pub async fn tier_session_promotion(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let alice = user("alice");
    let k = env.account_of("acct-alice", &alice).await;
    env.source.set_latest(&k, Some(env.ago(24 * HOUR)));
    // Presence before the worker exists: it sees no event, only the session key.
    let grace = env.s.tier_eval + env.s.tier_eval / 2;
    env.admin.mark_user_active(&alice, ttl(grace)).await.expect("presence");
    let started = Instant::now();
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owns(&k)).await);
    assert_eq!(a.tier_of(&k), Some(Tier::Warm), "default warm on claim");
    assert_eq!(stored_tier(&env, &k).await, Some(Tier::Warm));
    assert!(wait_tier(&env, &a, &k, Tier::Hot, env.s.tier_eval + env.s.tick()).await, "session did not promote");
    assert!(started.elapsed() >= env.s.tier_eval - env.s.jitter, "promoted before an evaluation");
    assert_eq!(stored_tier(&env, &k).await, Some(Tier::Hot));
    assert!(
        env.wait_for(env.s.tick(), || env.source.log_of(&k).iter().any(|r| r.activity == Activity::Watch)).await,
        "hot account has no INBOX watch"
    );
    // The session lapses; the next evaluation demotes.
    assert!(wait_tier(&env, &a, &k, Tier::Warm, env.s.tier_eval * 2).await, "no demotion after the session lapsed");
    a.shutdown().await.expect("shutdown");
}

/// Recent mail (within TIER_HOT_ACTIVITY_H) promotes to hot; older stays warm.
pub async fn tier_recent_mail_promotion(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let fresh = env.account_of("acct-fresh", &user("u1")).await;
    let older = env.account_of("acct-older", &user("u2")).await;
    env.source.set_latest(&fresh, Some(env.ago(10 * MIN)));
    env.source.set_latest(&older, Some(env.ago(5 * HOUR)));
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 2).await);
    assert_eq!(a.tier_of(&fresh), Some(Tier::Warm), "default warm on claim");
    assert!(
        wait_tier(&env, &a, &fresh, Tier::Hot, env.s.tier_eval + env.s.tick()).await,
        "recent mail did not promote"
    );
    assert_eq!(a.tier_of(&older), Some(Tier::Warm));
    assert_eq!(stored_tier(&env, &fresh).await, Some(Tier::Hot));
    // Hot means watched: new mail is polled at once, not at the next POLL_WARM.
    assert!(
        env.wait_for(env.s.tick(), || env.source.log_of(&fresh).iter().any(|r| r.activity == Activity::Watch)).await
    );
    let inbox_polls =
        || env.source.polls_of(&fresh).iter().filter(|r| r.activity == Activity::Poll(Scope::Inbox)).count();
    let before = inbox_polls();
    let delivered = Instant::now();
    env.source.deliver(&fresh, env.ago(Duration::ZERO));
    assert!(env.wait_for(env.s.poll_warm / 4, || inbox_polls() > before).await, "watch did not pick up new mail");
    assert!(delivered.elapsed() < env.s.poll_warm);
    a.shutdown().await.expect("shutdown");
}

/// No session and no mail within TIER_COLD_AFTER_H (or none at all): cold,
/// polled every POLL_COLD.
pub async fn tier_cold(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let stale = env.account_of("acct-stale", &user("u1")).await;
    let empty = env.account_of("acct-empty", &user("u2")).await;
    let mid = env.account_of("acct-mid", &user("u3")).await;
    env.source.set_latest(&stale, Some(env.ago(10 * 24 * HOUR)));
    env.source.set_latest(&mid, Some(env.ago(30 * HOUR)));
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 3).await);
    assert!(wait_tier(&env, &a, &stale, Tier::Cold, env.s.tier_eval + env.s.tick()).await, "not cold");
    assert_eq!(a.tier_of(&empty), Some(Tier::Cold));
    assert_eq!(a.tier_of(&mid), Some(Tier::Warm));
    assert_eq!(stored_tier(&env, &stale).await, Some(Tier::Cold));
    let went_cold = Instant::now();
    let polls_since = |k: &LeaseKey, after: usize| env.source.polls_of(k).len() - after;
    let (n_stale, n_mid) = (env.source.polls_of(&stale).len(), env.source.polls_of(&mid).len());
    env.sleep(env.s.poll_cold * 2 - went_cold.elapsed()).await;
    let cold_polls = polls_since(&stale, n_stale);
    let warm_polls = polls_since(&mid, n_mid);
    assert!((1..=3).contains(&cold_polls), "cold account polled {cold_polls} times in 2 x POLL_COLD");
    assert!(warm_polls > cold_polls * 2, "warm {warm_polls} vs cold {cold_polls}");
    assert!(env.source.log_of(&stale).iter().all(|r| r.activity != Activity::Watch), "cold accounts are not watched");
    // Spacing of consecutive cold polls is POLL_COLD, less the stagger of
    // at most a tenth that keeps accounts from polling in step.
    let stale_polls = env.source.polls_of(&stale);
    let tail: Vec<_> = stale_polls.iter().rev().take(2).collect();
    if tail.len() == 2 && tail[1].at >= went_cold.elapsed().saturating_sub(env.s.poll_cold) {
        let gap = tail[0].at - tail[1].at;
        let least = env.s.poll_cold.mul_f64(0.9);
        assert!(gap + env.s.jitter >= least && gap <= env.s.poll_cold + env.s.jitter, "cold polls {gap:?} apart");
    }
    a.shutdown().await.expect("shutdown");
}

/// A `user.active` event promotes that user's owned accounts to hot within 5 s.
pub async fn tier_user_active_promotion(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let bob = user("bob");
    let k1 = env.account_of("acct-bob-1", &bob).await;
    let k2 = env.account_of("acct-bob-2", &bob).await;
    let other = env.account_of("acct-carol", &user("carol")).await;
    for k in [&k1, &k2, &other] {
        env.source.set_latest(k, Some(env.ago(24 * HOUR)));
    }
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 3).await);
    assert_eq!(a.tier_of(&k1), Some(Tier::Warm));
    let t0 = Instant::now();
    env.admin.mark_user_active(&bob, ttl(15 * MIN)).await.expect("presence");
    let ok = env
        .wait_for(Duration::from_secs(5), || a.tier_of(&k1) == Some(Tier::Hot) && a.tier_of(&k2) == Some(Tier::Hot))
        .await;
    let took = t0.elapsed();
    assert!(ok && took <= Duration::from_secs(5), "not promoted within 5 s ({took:?})");
    assert_eq!(a.tier_of(&other), Some(Tier::Warm), "another user's account was promoted");
    assert_eq!(stored_tier(&env, &k1).await, Some(Tier::Hot));
    assert!(
        env.wait_for(Duration::from_secs(1), || env.source.log_of(&k1).iter().any(|r| r.activity == Activity::Watch))
            .await
    );
    assert!(a.stats().promoted_by_event >= 2);
    // The next evaluation keeps them hot (the session is live).
    env.sleep(env.s.tier_eval + env.s.tick()).await;
    assert_eq!(a.tier_of(&k1), Some(Tier::Hot));
    a.shutdown().await.expect("shutdown");
}

/// Over HOT_BUDGET_PER_WORKER, the least recently active session-less hot
/// accounts are demoted to warm; accounts with a session stay hot.
pub async fn tier_budget_demotion(b: Arc<dyn Backend>) {
    let env = Env::new(b).await;
    let a1 = env.account_of("acct-b1", &user("b1")).await;
    let a2 = env.account_of("acct-b2", &user("b2")).await;
    let a3 = env.account_of("acct-b3", &user("b3")).await;
    let a4 = env.account_of("acct-b4", &user("b4")).await;
    env.source.set_latest(&a1, Some(env.ago(10 * MIN)));
    env.source.set_latest(&a2, Some(env.ago(30 * MIN)));
    env.source.set_latest(&a3, Some(env.ago(60 * MIN)));
    env.source.set_latest(&a4, Some(env.ago(24 * HOUR)));
    env.admin.mark_user_active(&user("b4"), ttl(24 * HOUR)).await.expect("presence");
    let mut config = env.config.clone();
    config.hot_budget_per_worker = 2;
    let a = env.start_with("w-a", config).await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 4).await);
    assert!(wait_tier(&env, &a, &a1, Tier::Hot, env.s.tier_eval + env.s.tick()).await);
    let tiers: Vec<_> = [&a1, &a2, &a3, &a4].iter().map(|k| a.tier_of(k)).collect();
    assert_eq!(
        tiers,
        vec![Some(Tier::Hot), Some(Tier::Warm), Some(Tier::Warm), Some(Tier::Hot)],
        "budget 2: the two least recently active session-less accounts go warm; the session one stays hot"
    );
    assert_eq!(stored_tier(&env, &a2).await, Some(Tier::Warm));
    a.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------- bucket ownership only

/// An account added to a bucket its owner holds (as every bucket is held at
/// scale) starts at once: the bucket's change notice reaches the owner, so
/// its first poll comes within half a tick interval of the add, where the
/// owner's next tick is a whole interval away.
pub async fn an_account_added_to_a_held_bucket_starts_at_once(b: Arc<dyn Backend>) {
    assert_eq!(b.ownership(), Ownership::Buckets, "a case of bucket ownership");
    let env = Env::new(b).await;
    let first = env.accounts("nt", 3).await;
    let w = env.start("w-n").await;
    assert!(env.wait_for(env.s.ttl * 2, || w.owned_count() == 3).await, "not all owned: {}", w.owned_count());
    env.sleep(env.s.tick()).await;
    // An account name that hashes into a bucket the worker holds.
    let bucket = env.bucket_of(&first[0]);
    let added = (0..)
        .map(|i| super::key(&format!("nt-added-{i}")))
        .find(|k| env.bucket_of(k) == bucket)
        .expect("some name hashes into the bucket");
    // Right after a tick, so the next one is a whole interval away.
    let ticks = w.stats().ticks;
    assert!(env.wait_for(env.s.tick() * 2, || w.stats().ticks > ticks).await, "no tick");
    let at = Instant::now();
    env.directory.insert(added.clone(), user("u-nt-added"));
    env.mark_live(&added).await;
    let within = env.s.tick() / 2;
    loop {
        if env.source.polls_of(&added).iter().any(|r| r.accepted) {
            break;
        }
        assert!(
            at.elapsed() < within,
            "the added account was not polled within {within:?} (a tick is {:?})",
            env.s.tick()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("an account added to a held bucket was polled {:?} after the add", at.elapsed());
    w.shutdown().await.expect("shutdown");
}
