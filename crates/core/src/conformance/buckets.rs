//! Conformance cases for [`BucketLeases`](crate::BucketLeases): weights,
//! bounded load, shed limits, token growth and hand-off order.
//!
//! Workers here are plain values ticked in turn; a worker releases what its
//! tick sheds before its next tick, as the contract asks of callers.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;

use super::support::{ms, ttl_ms, worker};
use super::Fixture;
use crate::buckets::{BalancePolicy, BucketBinding, BucketCount, BucketId, BucketLease};
use crate::ids::WorkerId;
use crate::lease::FencingToken;
use crate::ttl::Ttl;

const MINUTE: Ttl = Ttl::from_secs(60);

fn b(i: u32) -> BucketId {
    BucketId(i)
}

/// One worker as its caller sees it.
struct Member {
    id: WorkerId,
    held: Vec<BucketLease>,
}

impl Member {
    fn new(name: &str) -> Self {
        Self { id: worker(name), held: Vec::new() }
    }

    fn buckets(&self) -> BTreeSet<BucketId> {
        self.held.iter().map(|l| l.bucket).collect()
    }
}

/// One tick of `m`: keeps what was kept and claimed, releases what was shed.
/// Answers how many buckets moved (claimed plus shed).
async fn step(fx: &Fixture, m: &mut Member, policy: &BalancePolicy) -> usize {
    let tick = fx.buckets.tick(&m.id, &m.held, MINUTE, policy).await.unwrap();
    assert!(tick.lost.is_empty(), "{}: lost {:?} with no one else ticking past its TTL", m.id, tick.lost);
    let released = fx.buckets.release_buckets(&tick.shed).await.unwrap();
    assert!(released.iter().all(|r| *r), "{}: a shed bucket could not be released", m.id);
    let moved = tick.claimed.len() + tick.shed.len();
    m.held = tick.kept.into_iter().chain(tick.claimed).filter(|l| !tick.shed.contains(l)).collect();
    moved
}

/// Ticks every member in turn until two whole rounds in a row move nothing
/// (one quiet round may only mean a newcomer was not counted yet), at most
/// 30 rounds.
async fn settle(fx: &Fixture, members: &mut [Member], policy: &BalancePolicy) {
    let mut quiet = 0;
    for _ in 0..30 {
        let mut moved = 0;
        for m in members.iter_mut() {
            moved += step(fx, m, policy).await;
        }
        quiet = if moved == 0 { quiet + 1 } else { 0 };
        if quiet == 2 {
            return;
        }
    }
    panic!("the buckets did not settle within 30 rounds");
}

async fn set_weights(fx: &Fixture, weights: &BTreeMap<BucketId, u64>) {
    let pairs: Vec<_> = weights.iter().map(|(b, w)| (*b, *w)).collect();
    fx.buckets.set_weights(&pairs).await.unwrap();
}

fn load(m: &Member, weights: &BTreeMap<BucketId, u64>) -> u64 {
    m.held.iter().map(|l| weights.get(&l.bucket).copied().unwrap_or(0)).sum()
}

/// Every weighted bucket has exactly one holder among `members`, and the
/// store agrees with each.
async fn assert_owned_once(fx: &Fixture, members: &[Member], weights: &BTreeMap<BucketId, u64>) {
    let mut seen = BTreeSet::new();
    for m in members {
        for lease in &m.held {
            assert!(seen.insert(lease.bucket), "bucket {} is held twice", lease.bucket);
            assert_eq!(fx.buckets.bucket_holder(lease.bucket).await.unwrap().as_ref(), Some(lease));
        }
    }
    let weighted: BTreeSet<BucketId> = weights.iter().filter(|(_, w)| **w > 0).map(|(b, _)| *b).collect();
    assert!(
        weighted.is_subset(&seen),
        "unowned weighted buckets: {:?}",
        weighted.difference(&seen).collect::<Vec<_>>()
    );
}

fn ones(range: std::ops::Range<u32>) -> BTreeMap<BucketId, u64> {
    range.map(|i| (b(i), 1)).collect()
}

/// The first count bound is the count ever after.
pub async fn bucket_count_is_bound_once(fx: Fixture) {
    let first = BucketCount::new(64).unwrap();
    assert_eq!(fx.buckets.bind_buckets(first).await.unwrap(), BucketBinding { count: first, recorded_now: true });
    let again = fx.buckets.bind_buckets(BucketCount::DEFAULT).await.unwrap();
    assert_eq!(again, BucketBinding { count: first, recorded_now: false });
}

/// Weights add up, never go below zero, and the total follows every change.
pub async fn weights_keep_their_total(fx: Fixture) {
    assert_eq!(fx.buckets.add_weight(b(7), 3).await.unwrap(), 3);
    assert_eq!(fx.buckets.add_weight(b(7), -5).await.unwrap(), 0);
    assert_eq!(fx.buckets.weight(b(7)).await.unwrap(), 0);
    fx.buckets.set_weights(&[(b(1), 2), (b(2), 5)]).await.unwrap();
    assert_eq!(fx.buckets.add_weight(b(2), 1).await.unwrap(), 6);
    let tick = fx.buckets.tick(&worker("w1"), &[], MINUTE, &BalancePolicy::default()).await.unwrap();
    assert_eq!(tick.total_weight, 8);
    assert_eq!((tick.workers, tick.load, tick.cap), (1, 8, 9));
    fx.buckets.set_weights(&[(b(2), 0)]).await.unwrap();
    let tick = fx.buckets.tick(&worker("w1"), &tick.claimed, MINUTE, &BalancePolicy::default()).await.unwrap();
    assert_eq!((tick.total_weight, tick.load), (2, 2));
}

/// A lone worker claims every bucket with weight, under tokens above zero,
/// and never one of weight 0; a bucket that gains weight is claimed next tick.
pub async fn a_lone_worker_claims_every_weighted_bucket(fx: Fixture) {
    let weights = ones(0..10);
    set_weights(&fx, &weights).await;
    fx.buckets.add_weight(b(10), 0).await.unwrap();
    let mut w1 = Member::new("w1");
    settle(&fx, std::slice::from_mut(&mut w1), &BalancePolicy::default()).await;
    assert_eq!(w1.buckets(), weights.keys().copied().collect());
    assert!(w1.held.iter().all(|l| l.token > FencingToken(0) && l.owner == worker("w1")));
    assert_eq!(fx.buckets.bucket_holder(b(10)).await.unwrap(), None);
    fx.buckets.add_weight(b(10), 1).await.unwrap();
    step(&fx, &mut w1, &BalancePolicy::default()).await;
    assert!(w1.buckets().contains(&b(10)), "a bucket that gained weight is claimable");
}

/// Ten accounts in ten buckets on two workers: five each, whoever came first.
pub async fn two_workers_split_ten_five_and_five(fx: Fixture) {
    let weights = ones(0..10);
    set_weights(&fx, &weights).await;
    let policy = BalancePolicy::default();
    let mut members = [Member::new("w1"), Member::new("w2")];
    settle(&fx, &mut members[..1], &policy).await;
    assert_eq!(load(&members[0], &weights), 10);
    settle(&fx, &mut members, &policy).await;
    assert_eq!((load(&members[0], &weights), load(&members[1], &weights)), (5, 5));
    assert_owned_once(&fx, &members, &weights).await;
}

/// The share is by weight, not by bucket count: one heavy bucket against six light ones.
pub async fn the_share_is_by_weight_not_by_bucket_count(fx: Fixture) {
    let mut weights = ones(1..7);
    weights.insert(b(0), 6);
    set_weights(&fx, &weights).await;
    let policy = BalancePolicy::default();
    let mut members = [Member::new("w1"), Member::new("w2")];
    settle(&fx, &mut members, &policy).await;
    let loads = (load(&members[0], &weights), load(&members[1], &weights));
    assert_eq!(loads, (6, 6), "buckets {:?} / {:?}", members[0].buckets(), members[1].buckets());
    assert_owned_once(&fx, &members, &weights).await;
}

/// Three workers joining one by one over uneven buckets: each ends within
/// its cap, every bucket has one owner, and no two loads are further apart
/// than twice the heaviest bucket.
pub async fn bounded_load_holds_as_workers_join(fx: Fixture) {
    let weights: BTreeMap<BucketId, u64> = (0..60).map(|i| (b(i), u64::from(i % 3 + 1))).collect();
    set_weights(&fx, &weights).await;
    let policy = BalancePolicy::default();
    let mut members = [Member::new("w1"), Member::new("w2"), Member::new("w3")];
    for joined in 1..=3 {
        settle(&fx, &mut members[..joined], &policy).await;
        assert_owned_once(&fx, &members[..joined], &weights).await;
    }
    let total: u64 = weights.values().sum();
    let cap = policy.cap(total, 3);
    let loads: Vec<u64> = members.iter().map(|m| load(m, &weights)).collect();
    assert_eq!(loads.iter().sum::<u64>(), total);
    assert!(loads.iter().all(|l| *l <= cap), "loads {loads:?} over the cap {cap}");
    let spread = loads.iter().max().unwrap() - loads.iter().min().unwrap();
    assert!(spread <= 6, "loads {loads:?} spread by {spread}");
}

/// Within its cap, a worker sheds at most `max_sheds` buckets a tick.
pub async fn within_the_cap_a_tick_sheds_at_most_max_sheds(fx: Fixture) {
    let weights = ones(0..20);
    set_weights(&fx, &weights).await;
    // 100 % slack: the cap is twice the share, so 20 of 20 on two workers is within it.
    let policy = BalancePolicy::new(100, NonZeroU32::new(64).unwrap(), 2).unwrap();
    let mut w1 = Member::new("w1");
    let mut w2 = Member::new("w2");
    step(&fx, &mut w1, &policy).await;
    assert_eq!(w1.held.len(), 20);
    assert_eq!(step(&fx, &mut w2, &policy).await, 0, "nothing is free");
    let tick = fx.buckets.tick(&w1.id, &w1.held, MINUTE, &policy).await.unwrap();
    assert_eq!((tick.cap, tick.shed.len()), (20, 2));
}

/// A shed bucket stays its owner's until released (the owner stops its work
/// first); once released, the next tick elsewhere claims it under a greater token.
pub async fn a_shed_bucket_is_its_owners_until_released(fx: Fixture) {
    let weights = ones(0..4);
    set_weights(&fx, &weights).await;
    let policy = BalancePolicy::default();
    let mut w1 = Member::new("w1");
    let mut w2 = Member::new("w2");
    step(&fx, &mut w1, &policy).await;
    step(&fx, &mut w2, &policy).await;
    let tick = fx.buckets.tick(&w1.id, &w1.held, MINUTE, &policy).await.unwrap();
    assert_eq!(tick.shed.len(), 2, "4 of 4 on two workers: cap 3, then 3 against 0");
    step(&fx, &mut w2, &policy).await;
    assert!(w2.held.is_empty(), "w2 claimed {:?} before w1 released it", w2.held);
    for lease in &tick.shed {
        assert_eq!(fx.buckets.bucket_holder(lease.bucket).await.unwrap().as_ref(), Some(lease));
    }
    assert_eq!(fx.buckets.release_buckets(&tick.shed).await.unwrap(), vec![true, true]);
    step(&fx, &mut w2, &policy).await;
    let shed: BTreeMap<BucketId, FencingToken> = tick.shed.iter().map(|l| (l.bucket, l.token)).collect();
    assert_eq!(w2.buckets(), shed.keys().copied().collect());
    assert!(w2.held.iter().all(|l| l.token > shed[&l.bucket]), "tokens grow across a hand-off");
}

/// A worker that stops ticking loses its buckets after its TTL: another
/// takes them under greater tokens, and the silent one's next tick reports
/// them lost (and the store no longer counts it).
pub async fn a_silent_workers_buckets_are_taken_over_after_its_ttl(fx: Fixture) {
    let weights = ones(0..4);
    set_weights(&fx, &weights).await;
    let policy = BalancePolicy::default();
    let short = ttl_ms(300);
    let first = fx.buckets.tick(&worker("w1"), &[], short, &policy).await.unwrap();
    assert_eq!(first.claimed.len(), 4);
    let mut w2 = Member::new("w2");
    step(&fx, &mut w2, &policy).await;
    assert!(w2.held.is_empty());
    fx.time.advance(ms(700)).await;
    let tick = fx.buckets.tick(&w2.id, &[], MINUTE, &policy).await.unwrap();
    assert_eq!(tick.workers, 1, "w1's registration ran out");
    assert_eq!(tick.claimed.len(), 4);
    for lease in &tick.claimed {
        let old = first.claimed.iter().find(|l| l.bucket == lease.bucket).unwrap();
        assert!(lease.token > old.token);
    }
    let late = fx.buckets.tick(&worker("w1"), &first.claimed, short, &policy).await.unwrap();
    assert_eq!((late.kept.len(), late.lost.len(), late.claimed.len()), (0, 4, 0));
    assert_eq!(fx.buckets.release_buckets(&first.claimed).await.unwrap(), vec![false; 4]);
}

/// A tick tells how long until the soonest running lease runs out, the
/// caller's own just renewed included: a silent worker's come first.
pub async fn a_tick_tells_when_the_soonest_lease_runs_out(fx: Fixture) {
    let policy = BalancePolicy::default();
    let short = ttl_ms(2_000);
    let none = fx.buckets.tick(&worker("w1"), &[], short, &policy).await.unwrap();
    assert_eq!(none.soonest_expiry, None, "no bucket has weight, so no lease runs");
    set_weights(&fx, &ones(0..4)).await;
    let first = fx.buckets.tick(&worker("w1"), &[], short, &policy).await.unwrap();
    assert_eq!(first.claimed.len(), 4);
    let soonest = first.soonest_expiry.expect("w1's leases run");
    assert!(soonest > ms(1_000) && soonest <= ms(2_000), "w1's own leases, just taken: {soonest:?}");
    fx.time.advance(ms(500)).await;
    let other = fx.buckets.tick(&worker("w2"), &[], MINUTE, &policy).await.unwrap();
    assert!(other.claimed.is_empty(), "w1's leases still run");
    let soonest = other.soonest_expiry.expect("w1's leases run");
    assert!(soonest <= ms(1_500), "w1's leases come before w2's minute: {soonest:?}");
    fx.time.advance(soonest + ms(100)).await;
    let after = fx.buckets.tick(&worker("w2"), &[], MINUTE, &policy).await.unwrap();
    assert_eq!(after.claimed.len(), 4, "free from the moment told");
    let soonest = after.soonest_expiry.expect("w2's leases run");
    assert!(soonest > ms(50_000), "only w2's minute-long leases run: {soonest:?}");
}

/// `leave` hands every bucket back at once: the next tick elsewhere takes them all.
pub async fn leave_hands_every_bucket_back_at_once(fx: Fixture) {
    let weights = ones(0..6);
    set_weights(&fx, &weights).await;
    let policy = BalancePolicy::default();
    let mut members = [Member::new("w1"), Member::new("w2")];
    settle(&fx, &mut members, &policy).await;
    let [w1, w2] = &mut members;
    fx.buckets.leave(&w1.id, &w1.held).await.unwrap();
    for lease in &w1.held {
        assert_eq!(fx.buckets.bucket_holder(lease.bucket).await.unwrap(), None);
    }
    let tick = fx.buckets.tick(&w2.id, &w2.held, MINUTE, &policy).await.unwrap();
    assert_eq!((tick.workers, tick.claimed.len(), tick.load), (1, 3, 6));
}

/// Tokens grow through release; a stale lease renews and releases nothing;
/// `raise_bucket_token` puts the next claim past a given token.
pub async fn bucket_tokens_grow_and_can_be_raised(fx: Fixture) {
    fx.buckets.set_weights(&[(b(3), 1)]).await.unwrap();
    let policy = BalancePolicy::default();
    let w1 = worker("w1");
    let first = fx.buckets.tick(&w1, &[], MINUTE, &policy).await.unwrap().claimed;
    assert_eq!(first.len(), 1);
    let stale = BucketLease { token: FencingToken(first[0].token.0 + 7), ..first[0].clone() };
    let tick = fx.buckets.tick(&w1, std::slice::from_ref(&stale), MINUTE, &policy).await.unwrap();
    assert_eq!(tick.lost, vec![stale.clone()]);
    assert_eq!(fx.buckets.release_buckets(&[stale]).await.unwrap(), vec![false]);
    assert_eq!(fx.buckets.release_buckets(&first).await.unwrap(), vec![true]);
    let second = fx.buckets.tick(&w1, &[], MINUTE, &policy).await.unwrap().claimed;
    assert!(second[0].token > first[0].token);
    fx.buckets.raise_bucket_token(b(3), FencingToken(1000)).await.unwrap();
    fx.buckets.raise_bucket_token(b(3), FencingToken(10)).await.unwrap();
    assert_eq!(fx.buckets.bucket_holder(b(3)).await.unwrap().as_ref(), Some(&second[0]), "the lease is untouched");
    fx.buckets.release_buckets(&second).await.unwrap();
    let third = fx.buckets.tick(&w1, &[], MINUTE, &policy).await.unwrap().claimed;
    assert!(third[0].token > FencingToken(1000));
}

/// A tick looks at no more than `max_claims` free buckets.
pub async fn a_tick_claims_at_most_max_claims(fx: Fixture) {
    set_weights(&fx, &ones(0..50)).await;
    let policy = BalancePolicy::new(10, NonZeroU32::new(8).unwrap(), 2).unwrap();
    let mut w1 = Member::new("w1");
    assert_eq!(step(&fx, &mut w1, &policy).await, 8);
    assert_eq!(step(&fx, &mut w1, &policy).await, 8);
    assert_eq!(w1.held.len(), 16);
}

/// Each weight change counts up the bucket's change count, which the
/// owner's next tick reports: how it learns a key came or went.
pub async fn a_tick_reports_each_buckets_change_count(fx: Fixture) {
    fx.buckets.set_weights(&[(b(0), 1), (b(1), 1)]).await.unwrap();
    let policy = BalancePolicy::default();
    let w1 = worker("w1");
    let first = fx.buckets.tick(&w1, &[], MINUTE, &policy).await.unwrap();
    let seen: BTreeMap<BucketId, u64> = first.versions.iter().copied().collect();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![b(0), b(1)], "one count per claimed bucket");
    let quiet = fx.buckets.tick(&w1, &first.claimed, MINUTE, &policy).await.unwrap();
    assert_eq!(quiet.versions.iter().copied().collect::<BTreeMap<_, _>>(), seen, "nothing changed");
    fx.buckets.add_weight(b(0), 0).await.unwrap();
    fx.buckets.add_weight(b(1), 1).await.unwrap();
    fx.buckets.add_weight(b(1), -1).await.unwrap();
    let after = fx.buckets.tick(&w1, &first.claimed, MINUTE, &policy).await.unwrap();
    let after: BTreeMap<BucketId, u64> = after.versions.iter().copied().collect();
    assert!(after[&b(0)] > seen[&b(0)], "a key of bucket 0 changed");
    assert!(after[&b(1)] > seen[&b(1)], "an add and a delete leave the weight as it was, not the count");
}

/// A worker that joined counts before its first tick: another worker's tick
/// claims only its own share.
pub async fn a_joined_worker_counts_before_its_first_tick(fx: Fixture) {
    set_weights(&fx, &ones(0..10)).await;
    fx.buckets.join(&worker("w2"), MINUTE).await.unwrap();
    let tick = fx.buckets.tick(&worker("w1"), &[], MINUTE, &BalancePolicy::default()).await.unwrap();
    assert_eq!((tick.workers, tick.claimed.len()), (2, 5));
    // Joining again after a tick keeps the recorded load.
    let mut w2 = Member::new("w2");
    step(&fx, &mut w2, &BalancePolicy::default()).await;
    fx.buckets.join(&worker("w2"), MINUTE).await.unwrap();
    let again = fx.buckets.tick(&worker("w1"), &tick.claimed, MINUTE, &BalancePolicy::default()).await.unwrap();
    assert!(again.shed.is_empty(), "w2 holds its five: nothing to shed toward it");
}

/// Every subscription gets each `add_weight`'s bucket, in order (removals
/// too); `set_weights`, a repair, publishes nothing; a later subscription
/// sees only later notices. Read with real-time timeouts (the fixture's
/// clock may be a manual one).
pub async fn add_weight_notifies_every_subscriber_in_order(fx: Fixture) {
    use std::time::Duration;
    async fn next(sub: &mut crate::buckets::BucketChanges) -> BucketId {
        tokio::time::timeout(Duration::from_secs(5), sub.recv())
            .await
            .expect("a bucket change notice within 5 s")
            .expect("the subscription is open")
    }
    let mut s1 = fx.buckets.subscribe_bucket_changes().await.unwrap();
    let mut s2 = fx.buckets.subscribe_bucket_changes().await.unwrap();
    fx.buckets.set_weights(&[(b(9), 4)]).await.unwrap();
    fx.buckets.add_weight(b(3), 1).await.unwrap();
    fx.buckets.add_weight(b(7), 2).await.unwrap();
    fx.buckets.add_weight(b(3), -1).await.unwrap();
    for sub in [&mut s1, &mut s2] {
        let got = [next(sub).await, next(sub).await, next(sub).await];
        assert_eq!(got, [b(3), b(7), b(3)], "set_weights publishes nothing; add_weight each bucket in order");
    }
    let mut s3 = fx.buckets.subscribe_bucket_changes().await.unwrap();
    fx.buckets.add_weight(b(5), 1).await.unwrap();
    assert_eq!(next(&mut s3).await, b(5));
    assert_eq!(next(&mut s1).await, b(5));
}
