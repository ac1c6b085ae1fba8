//! Differential property test: random operation sequences from several
//! workers applied to the memory backend (the reference) and to Redis must
//! give identical replies and identical final state.
//!
//! Time: Redis keeps its own clock, so time is only ever compared where the
//! outcome is decided with a wide margin. Every operation that depends on
//! time passing is a compound step "let time pass, then act": the memory
//! clock is advanced by [`STEP`] and Redis sleeps [`STEP`] for real. Reclaims
//! use a timeout of [`IDLE`] (< `STEP`), so right after a step *every* pending
//! delivery is idle on both backends; every other reserve uses a timeout
//! of ten minutes, so nothing is ever idle. Short leases ([`IDLE`]) are
//! claimed or renewed right before a step, so they have expired on both
//! backends by the next operation; other leases last ten minutes. No
//! outcome depends on how long Redis took between two operations.
//!
//! Normalisation: entry ids become ordinals (in order of first appearance),
//! `at_ms`, `idle_ms` and `last_seen_ms` are ignored, event ids are compared
//! by order only. Fencing tokens are compared as they are (both count from 1).
//!
//! Cases: `PROPTEST_CASES` (default 2000; 500 for the bucket leases alone).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    BalancePolicy, BucketId, BucketLease, BucketLeases, Budgets, Delivery, EntryId, Event, FinalizeReason,
    FinalizeRequest, Lease, LeaseKey, LeaseStore, ManualClock, Outcome, Presence, RequeueRequest, ReserveReply, RunId,
    RunSpec, StreamName, Tier, Ttl, UnitGroup, UnitId, UnitQueue, UnitSpec, WorkerId,
};
use leasehold_mem::MemoryStore;
use leasehold_redis::RedisStore;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// How far time moves in one step.
const STEP: Duration = Duration::from_millis(6);
/// Reclaim timeout and short lease TTL: well under one step.
const IDLE: Ttl = Ttl::from_millis(2);
/// Timeouts that no test reaches.
const LONG: Ttl = Ttl::from_secs(600);

const WORKERS: usize = 3;
const KEYS: usize = 3;
const BUCKETS: u32 = 6;

#[derive(Debug, Clone)]
enum Op {
    Init { same_units: bool },
    Reserve { w: usize },
    ReserveBatch { w: usize, max: usize },
    ReserveIdle { w: usize, batch: Option<usize> },
    Heartbeat { d: usize, who: Option<usize> },
    HeartbeatBatch { w: usize, skip: usize },
    Finalize { d: usize, who: Option<usize>, outcome: u8 },
    FinalizeMany { w: usize, through_trait: bool },
    Requeue { d: usize, who: Option<usize>, summary: bool, elsewhere: bool },
    Abandon { d: usize, who: Option<usize> },
    HandBack { d: usize, who: Option<usize> },
    HandBackBatch { w: usize, skip: usize },
    Liveness { w: usize, unit: Option<usize> },
    Leave { w: usize },
    StaleRecord { d: usize },
    WorkerError { w: usize },
    Step,
    Claim { k: usize, w: usize, short: bool },
    ClaimMany { w: usize },
    Renew { l: usize, short: bool },
    RenewMany,
    Release { l: usize },
    MarkLive { k: usize },
    MarkNotLive { k: usize },
    SetTier { k: usize, tier: u8 },
    RegisterWorker { w: usize, short: bool },
    DeregisterWorker { w: usize },
    BucketWeight { b: u32, delta: i64 },
    BucketTick { w: usize, short: bool, slack: u32, max_claims: u32, max_sheds: u32 },
    BucketReleaseShed { w: usize },
    BucketLeave { w: usize },
}

fn who() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![4 => Just(None), 1 => (0..WORKERS).prop_map(Some)]
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    let d = 0..64usize;
    prop_oneof![
        1 => any::<bool>().prop_map(|same_units| Op::Init { same_units }),
        8 => w.clone().prop_map(|w| Op::Reserve { w }),
        2 => (w.clone(), 1..4usize).prop_map(|(w, max)| Op::ReserveBatch { w, max }),
        2 => (w.clone(), proptest::option::of(1..4usize)).prop_map(|(w, batch)| Op::ReserveIdle { w, batch }),
        3 => (d.clone(), who()).prop_map(|(d, who)| Op::Heartbeat { d, who }),
        6 => (d.clone(), who(), 0..3u8).prop_map(|(d, who, outcome)| Op::Finalize { d, who, outcome }),
        1 => (w.clone(), any::<bool>()).prop_map(|(w, through_trait)| Op::FinalizeMany { w, through_trait }),
        5 => (d.clone(), who(), any::<bool>(), any::<bool>())
            .prop_map(|(d, who, summary, elsewhere)| Op::Requeue { d, who, summary, elsewhere }),
        2 => (d.clone(), who()).prop_map(|(d, who)| Op::Abandon { d, who }),
        3 => (d.clone(), who()).prop_map(|(d, who)| Op::HandBack { d, who }),
        1 => (w.clone(), 0..4usize).prop_map(|(w, skip)| Op::HandBackBatch { w, skip }),
        1 => (w.clone(), 0..4usize).prop_map(|(w, skip)| Op::HeartbeatBatch { w, skip }),
        1 => (w.clone(), proptest::option::of(0..4usize)).prop_map(|(w, unit)| Op::Liveness { w, unit }),
        1 => w.clone().prop_map(|w| Op::Leave { w }),
        1 => d.clone().prop_map(|d| Op::StaleRecord { d }),
        1 => w.clone().prop_map(|w| Op::WorkerError { w }),
        1 => Just(Op::Step),
        4 => (0..KEYS, w.clone(), any::<bool>()).prop_map(|(k, w, short)| Op::Claim { k, w, short }),
        1 => w.clone().prop_map(|w| Op::ClaimMany { w }),
        3 => (0..16usize, any::<bool>()).prop_map(|(l, short)| Op::Renew { l, short }),
        1 => Just(Op::RenewMany),
        2 => (0..16usize).prop_map(|l| Op::Release { l }),
        1 => (0..KEYS).prop_map(|k| Op::MarkLive { k }),
        1 => (0..KEYS).prop_map(|k| Op::MarkNotLive { k }),
        1 => (0..KEYS, 0..3u8).prop_map(|(k, tier)| Op::SetTier { k, tier }),
        1 => (w.clone(), any::<bool>()).prop_map(|(w, short)| Op::RegisterWorker { w, short }),
        1 => w.clone().prop_map(|w| Op::DeregisterWorker { w }),
        1 => bucket_op(),
    ]
}

/// Bucket-lease operations (also run on their own, where they are dense
/// enough for sheds and takeovers to happen often).
fn bucket_op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    prop_oneof![
        3 => (0..BUCKETS, -2..6i64).prop_map(|(b, delta)| Op::BucketWeight { b, delta }),
        6 => (w.clone(), prop::bool::weighted(0.2), prop_oneof![Just(0u32), Just(10), Just(100)], 1..4u32, 0..3u32)
            .prop_map(|(w, short, slack, max_claims, max_sheds)| Op::BucketTick { w, short, slack, max_claims, max_sheds }),
        3 => w.clone().prop_map(|w| Op::BucketReleaseShed { w }),
        1 => w.prop_map(|w| Op::BucketLeave { w }),
        1 => Just(Op::Step),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    units: usize,
    /// Units `0, every, 2 × every, ...` are in one group of this limit.
    group: Option<(usize, u32)>,
    /// Whether the odd units are quarantined (their failures not counted).
    quarantine_odd: bool,
    budgets: Budgets,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1..6usize,
        0..3u32,
        prop_oneof![Just(0.0), Just(0.34), Just(0.5), Just(1.0)],
        0..3u32,
        // The fail-fast limit: none, or low enough to be reached.
        proptest::option::of(1..4u32),
        prop::collection::vec(op(), 1..40),
        (proptest::option::of((1..3usize, 1..3u32)), any::<bool>()),
    )
        .prop_map(
            |(units, max_requeues, requeue_tolerance, max_reclaims, max_failures, ops, (group, quarantine_odd))| Case {
                units,
                group,
                quarantine_odd,
                budgets: Budgets { max_requeues, requeue_tolerance, max_reclaims, max_failures },
                ops,
            },
        )
}

/// Entry ids of one backend as ordinals in order of first appearance.
#[derive(Default)]
struct Ordinals(HashMap<(StreamName, EntryId), usize>);

impl Ordinals {
    /// Entry ids are per stream (each stream numbers its own entries).
    fn of(&mut self, stream: StreamName, id: EntryId) -> usize {
        let n = self.0.len();
        *self.0.entry((stream, id)).or_insert(n)
    }
}

/// A delivery with its entry id replaced by an ordinal.
fn norm_delivery(d: &Delivery, o: &mut Ordinals) -> String {
    format!(
        "{}|{}|{:?}|#{}|dc{}|r{}|c{}|{:?}",
        d.unit,
        d.kind,
        d.stream,
        o.of(d.stream, d.entry_id),
        d.delivery_count,
        d.retry_index,
        d.reclaim_count,
        d.origin
    )
}

fn norm_reserve(r: &ReserveReply, o: &mut Ordinals) -> String {
    match r {
        ReserveReply::Delivered(d) => format!("Delivered({})", norm_delivery(d, o)),
        other => format!("{other:?}"),
    }
}

fn norm_event(e: &Event, o: &mut Ordinals) -> String {
    let mut e = e.clone();
    let mut id = |stream: StreamName, x: &mut EntryId| *x = EntryId::new(o.of(stream, *x) as u64, 0);
    match &mut e {
        Event::Delivered { header, entry_id, stream, .. } | Event::Abandoned { header, entry_id, stream, .. } => {
            header.at_ms = 0;
            id(*stream, entry_id);
        }
        Event::Reclaimed { header, entry_id, stream, .. } | Event::Finalized { header, entry_id, stream, .. } => {
            header.at_ms = 0;
            id(*stream, entry_id);
        }
        Event::Requeued { header, entry_id, new_entry_id, stream, .. }
        | Event::Released { header, entry_id, new_entry_id, stream } => {
            header.at_ms = 0;
            id(*stream, entry_id);
            id(StreamName::Priority, new_entry_id);
        }
        Event::WorkerError { at_ms, .. } => *at_ms = 0,
        Event::StaleRejected { at_ms, entry_id, stream, .. } => {
            *at_ms = 0;
            id(*stream, entry_id);
        }
    }
    format!("{e:?}")
}

/// One backend under test, with its handles.
struct Side {
    queue: Arc<dyn UnitQueue>,
    leases: Arc<dyn LeaseStore>,
    redis: Option<RedisStore>,
    clock: Option<Arc<ManualClock>>,
    deliveries: Vec<(usize, Delivery)>,
    leases_held: Vec<Lease>,
    buckets: Arc<dyn BucketLeases>,
    presence: Arc<dyn Presence>,
    /// Per worker: the bucket leases it holds, and those its last tick shed.
    buckets_held: Vec<Vec<BucketLease>>,
    buckets_shed: Vec<Vec<BucketLease>>,
    ordinals: Ordinals,
}

impl Side {
    async fn step(&self) {
        match &self.clock {
            Some(clock) => clock.advance(STEP),
            None => tokio::time::sleep(STEP).await,
        }
    }
}

fn wid(w: usize) -> WorkerId {
    WorkerId::new(format!("w{w}")).expect("worker id")
}

fn kid(k: usize) -> LeaseKey {
    LeaseKey::new(format!("k{k}")).expect("lease key")
}

fn spec(case: &Case, run: &RunId, same: bool) -> RunSpec {
    let n = if same { case.units } else { case.units + 1 };
    RunSpec {
        run: run.clone(),
        units: (0..n)
            .map(|i| {
                let mut unit = UnitSpec::new(UnitId::new(format!("unit \"{i}\"")).expect("unit id"), "file");
                unit.quarantined = case.quarantine_odd && i % 2 == 1;
                match case.group {
                    Some((every, limit)) if i % every == 0 => unit.in_group(UnitGroup {
                        name: "db: one".into(),
                        limit: std::num::NonZeroU32::new(limit).expect("limit >= 1"),
                    }),
                    _ => unit,
                }
            })
            .collect(),
        budgets: case.budgets,
        ttl: Duration::from_secs(3600),
    }
}

/// Applies `op` to one side; returns its normalised reply.
async fn apply(side: &mut Side, case: &Case, run: &RunId, op: &Op) -> String {
    let q = side.queue.clone();
    let l = side.leases.clone();
    let pick = |side: &Side, d: usize| -> Option<(usize, Delivery)> {
        (!side.deliveries.is_empty()).then(|| side.deliveries[d % side.deliveries.len()].clone())
    };
    match op {
        Op::Init { same_units } => {
            format!("{:?}", q.initialize(&spec(case, run, *same_units)).await.map_err(|e| e.to_string()))
        }
        Op::Reserve { w } => {
            let r = q.reserve(run, &wid(*w), LONG).await.expect("reserve");
            if let ReserveReply::Delivered(d) = &r {
                side.deliveries.push((*w, d.clone()));
            }
            norm_reserve(&r, &mut side.ordinals)
        }
        Op::ReserveBatch { w, max } => batch(side, run, *w, *max, LONG).await,
        Op::ReserveIdle { w, batch: b } => {
            side.step().await;
            match b {
                Some(max) => batch(side, run, *w, *max, IDLE).await,
                None => {
                    let r = q.reserve(run, &wid(*w), IDLE).await.expect("reserve");
                    if let ReserveReply::Delivered(d) = &r {
                        side.deliveries.push((*w, d.clone()));
                    }
                    norm_reserve(&r, &mut side.ordinals)
                }
            }
        }
        Op::Heartbeat { d, who } => match pick(side, *d) {
            Some((owner, d)) => {
                format!("{:?}", q.heartbeat(run, &wid(who.unwrap_or(owner)), &d).await.expect("heartbeat"))
            }
            None => "no delivery".into(),
        },
        Op::Finalize { d, who, outcome } => match pick(side, *d) {
            Some((owner, d)) => {
                let mut req =
                    FinalizeRequest::new([Outcome::Passed, Outcome::Failed, Outcome::Skipped][*outcome as usize], 7);
                // Slot 0, 1 or none: the events keep what the worker said.
                req.slot = (*outcome != 2).then_some(u32::from(*outcome));
                if *outcome == 1 {
                    req.reason = Some(FinalizeReason::Timeout);
                    req.errors = Some(serde_json::json!([{"message": "boom \"x\""}]));
                }
                format!("{:?}", q.finalize(run, &wid(who.unwrap_or(owner)), &d, &req).await.expect("finalize"))
            }
            None => "no delivery".into(),
        },
        Op::FinalizeMany { w, through_trait } => {
            // Everything this worker was ever handed, in order (stale ones included).
            let mine: Vec<Delivery> = side.deliveries.iter().filter(|(o, _)| o == w).map(|(_, d)| d.clone()).collect();
            let req = FinalizeRequest::new(Outcome::Passed, 1).on_slot(5);
            match &side.redis {
                // Both backends' own batch, through the trait.
                _ if *through_trait => {
                    let items: Vec<_> = mine.into_iter().map(|d| (d, req.clone())).collect();
                    format!("{:?}", q.finalize_batch(run, &wid(*w), &items).await.expect("finalize_batch"))
                }
                // Redis's batch against memory's single forms (each a batch of one).
                Some(redis) => {
                    let items: Vec<_> = mine.into_iter().map(|d| (d, req.clone())).collect();
                    format!("{:?}", redis.finalize_many(run, &wid(*w), &items).await.expect("finalize_many"))
                }
                None => {
                    let mut acks = Vec::new();
                    for d in mine {
                        acks.push(q.finalize(run, &wid(*w), &d, &req).await.expect("finalize"));
                    }
                    format!("{acks:?}")
                }
            }
        }
        Op::Requeue { d, who, summary, elsewhere } => match pick(side, *d) {
            Some((owner, d)) => {
                let req = RequeueRequest {
                    duration_ms: 3,
                    failure_summary: summary.then(|| "assertion failed: \\ \"ü\"".to_owned()),
                    errors: summary.then(|| serde_json::json!({"n": 1})),
                    retry_elsewhere: *elsewhere,
                    slot: summary.then_some(2),
                };
                format!("{:?}", q.requeue(run, &wid(who.unwrap_or(owner)), &d, &req).await.expect("requeue"))
            }
            None => "no delivery".into(),
        },
        Op::Abandon { d, who } => match pick(side, *d) {
            Some((owner, d)) => {
                format!("{:?}", q.abandon(run, &wid(who.unwrap_or(owner)), &d, 11).await.expect("abandon"))
            }
            None => "no delivery".into(),
        },
        Op::HandBack { d, who } => match pick(side, *d) {
            Some((owner, d)) => {
                format!("{:?}", q.release(run, &wid(who.unwrap_or(owner)), &d).await.expect("release"))
            }
            None => "no delivery".into(),
        },
        Op::HeartbeatBatch { w, skip } => {
            // This worker's deliveries (stale ones included) and one of
            // another worker's, oldest first: each is fenced on its own.
            let mut held: Vec<Delivery> =
                side.deliveries.iter().filter(|(o, _)| o == w).skip(*skip).map(|(_, d)| d.clone()).collect();
            if let Some((_, other)) = side.deliveries.iter().find(|(o, _)| o != w) {
                held.insert(held.len() / 2, other.clone());
            }
            format!("{:?}", q.heartbeat_batch(run, &wid(*w), &held).await.expect("heartbeat_batch"))
        }
        Op::HandBackBatch { w, skip } => {
            // This worker's latest deliveries (stale ones included), newest first.
            let mine: Vec<Delivery> =
                side.deliveries.iter().rev().filter(|(o, _)| o == w).skip(*skip).map(|(_, d)| d.clone()).collect();
            format!("{:?}", q.release_batch(run, &wid(*w), &mine).await.expect("release_batch"))
        }
        Op::Liveness { w, unit } => {
            let unit = unit.map(|u| UnitId::new(format!("unit \"{u}\"")).expect("unit id"));
            format!("{:?}", q.liveness(run, &wid(*w), unit.as_ref()).await.expect("liveness"))
        }
        Op::Leave { w } => format!("{:?}", q.leave(run, &wid(*w)).await.expect("leave")),
        Op::StaleRecord { d } => match pick(side, *d) {
            Some((owner, d)) => format!(
                "{:?}",
                q.record_stale_rejected(run, &wid(owner), &d, "finalize").await.map_err(|e| e.to_string())
            ),
            None => "no delivery".into(),
        },
        Op::WorkerError { w } => format!(
            "{:?}",
            q.record_worker_error(run, &wid(*w), None, "crashed \"hard\"").await.map_err(|e| e.to_string())
        ),
        Op::Step => {
            side.step().await;
            "step".into()
        }
        Op::Claim { k, w, short } => {
            let r = l.claim(&kid(*k), &wid(*w), if *short { IDLE } else { LONG }).await.expect("claim");
            if let Some(lease) = &r {
                side.leases_held.push(lease.clone());
            }
            if *short {
                side.step().await;
            }
            format!("{r:?}")
        }
        Op::ClaimMany { w } => {
            let keys: Vec<LeaseKey> = (0..KEYS).map(kid).collect();
            let won = l.claim_many(&keys, &wid(*w), LONG).await.expect("claim_many");
            side.leases_held.extend(won.iter().cloned());
            format!("{won:?}")
        }
        Op::Renew { l: i, short } => {
            if side.leases_held.is_empty() {
                return "no lease".into();
            }
            let lease = side.leases_held[i % side.leases_held.len()].clone();
            let r = l.renew(&lease, if *short { IDLE } else { LONG }).await.expect("renew");
            if *short {
                side.step().await;
            }
            format!("{r:?}")
        }
        Op::RenewMany => format!("{:?}", l.renew_many(&side.leases_held, LONG).await.expect("renew_many")),
        Op::Release { l: i } => {
            if side.leases_held.is_empty() {
                return "no lease".into();
            }
            let lease = side.leases_held[i % side.leases_held.len()].clone();
            format!("{:?}", l.release(&lease).await.expect("release"))
        }
        Op::MarkLive { k } => format!("{:?}", l.mark_live(&kid(*k)).await.map_err(|e| e.to_string())),
        Op::MarkNotLive { k } => format!("{:?}", l.mark_not_live(&kid(*k)).await.map_err(|e| e.to_string())),
        Op::SetTier { k, tier } => {
            format!(
                "{:?}",
                side.presence
                    .set_tier(&kid(*k), [Tier::Hot, Tier::Warm, Tier::Cold][*tier as usize])
                    .await
                    .map_err(|e| e.to_string())
            )
        }
        Op::RegisterWorker { w, short } => {
            let r = l.register_worker(&wid(*w), if *short { IDLE } else { LONG }).await.map_err(|e| e.to_string());
            if *short {
                side.step().await;
            }
            format!("{r:?}")
        }
        Op::DeregisterWorker { w } => format!("{:?}", l.deregister_worker(&wid(*w)).await.map_err(|e| e.to_string())),
        Op::BucketWeight { b, delta } => {
            format!("{:?}", side.buckets.add_weight(BucketId(*b), *delta).await.expect("add_weight"))
        }
        Op::BucketTick { w, short, slack, max_claims, max_sheds } => {
            let max_claims = std::num::NonZeroU32::new(*max_claims).expect("the strategy gives 1 or more");
            let policy = BalancePolicy::new(*slack, max_claims, *max_sheds).expect("a slack of 100 % or less");
            let ttl = if *short { IDLE } else { LONG };
            let mut tick = side.buckets.tick(&wid(*w), &side.buckets_held[*w], ttl, &policy).await.expect("tick");
            // Redis's clock runs on while the memory one steps: compare whether a lease runs, not the ms.
            tick.soonest_expiry = tick.soonest_expiry.map(|_| std::time::Duration::ZERO);
            side.buckets_held[*w] = tick.kept.iter().chain(&tick.claimed).cloned().collect();
            side.buckets_shed[*w] = tick.shed.clone();
            if *short {
                side.step().await;
            }
            format!("{tick:?}")
        }
        Op::BucketReleaseShed { w } => {
            let shed = std::mem::take(&mut side.buckets_shed[*w]);
            side.buckets_held[*w].retain(|l| !shed.contains(l));
            format!("{:?}", side.buckets.release_buckets(&shed).await.expect("release_buckets"))
        }
        Op::BucketLeave { w } => {
            let held = std::mem::take(&mut side.buckets_held[*w]);
            side.buckets_shed[*w].clear();
            format!("{:?}", side.buckets.leave(&wid(*w), &held).await.expect("leave"))
        }
    }
}

async fn batch(side: &mut Side, run: &RunId, w: usize, max: usize, reclaim_after: Ttl) -> String {
    let max = std::num::NonZeroUsize::new(max).expect("the strategy makes batches of 1 or more");
    let b = side.queue.reserve_batch(run, &wid(w), max, reclaim_after).await.expect("reserve_batch");
    let mut out = Vec::new();
    for d in &b.deliveries {
        side.deliveries.push((w, d.clone()));
        out.push(norm_delivery(d, &mut side.ordinals));
    }
    format!("{out:?} exhausted={:?} corrupt={} stopped={}", b.exhausted, b.corrupt, b.stopped)
}

/// Everything observable at the end, normalised.
async fn final_state(side: &mut Side, case: &Case, run: &RunId) -> Vec<String> {
    let q = side.queue.clone();
    let l = side.leases.clone();
    let mut out = vec![
        format!("progress {:?}", q.progress(run).await.expect("progress")),
        format!("budgets {:?}", q.budgets(run).await.expect("budgets")),
        format!("units {:?}", q.units(run).await.expect("units")),
    ];
    for i in 0..=case.units {
        let unit = UnitId::new(format!("unit \"{i}\"")).expect("unit id");
        out.push(format!("state {i} {:?}", q.unit_state(run, &unit).await.expect("unit_state")));
    }
    for mut p in q.pending(run).await.expect("pending") {
        p.idle_ms = 0;
        let ord = side.ordinals.of(p.stream, p.entry_id);
        out.push(format!("pending #{ord} {} {:?} {} dc{}", p.unit, p.stream, p.worker, p.delivery_count));
    }
    for mut wr in q.workers(run).await.expect("workers") {
        wr.last_seen_ms = 0;
        out.push(format!("worker {wr:?}"));
    }
    for e in q.events(run, None, 10_000).await.expect("events") {
        out.push(format!("event {}", norm_event(&e.event, &mut side.ordinals)));
    }
    for k in 0..KEYS {
        out.push(format!("holder k{k} {:?}", l.holder(&kid(k)).await.expect("holder")));
        out.push(format!("tier k{k} {:?}", side.presence.tier(&kid(k)).await.expect("tier")));
    }
    out.push(format!("live {:?}", l.live_keys().await.expect("live_keys")));
    out.push(format!("workers {:?}", l.live_workers().await.expect("live_workers")));
    for b in 0..BUCKETS {
        let bucket = BucketId(b);
        out.push(format!("bucket {b} {:?}", side.buckets.bucket_holder(bucket).await.expect("bucket_holder")));
        out.push(format!("weight {b} {:?}", side.buckets.weight(bucket).await.expect("weight")));
    }
    out
}

async fn run_case(url: &str, case: &Case, init: bool) -> Result<(), TestCaseError> {
    let run = RunId::new("diff").expect("run id");
    let clock = Arc::new(ManualClock::default());
    let mem = MemoryStore::with_clock(clock.clone());
    let redis = common::store(url, "diff").await;
    let mut m = Side {
        queue: Arc::new(mem.clone()),
        leases: Arc::new(mem.clone()),
        buckets: Arc::new(mem.clone()),
        presence: Arc::new(mem),
        buckets_held: vec![Vec::new(); WORKERS],
        buckets_shed: vec![Vec::new(); WORKERS],
        redis: None,
        clock: Some(clock),
        deliveries: Vec::new(),
        leases_held: Vec::new(),
        ordinals: Ordinals::default(),
    };
    let mut r = Side {
        queue: Arc::new(redis.clone()),
        leases: Arc::new(redis.clone()),
        buckets: Arc::new(redis.clone()),
        presence: Arc::new(redis.clone()),
        buckets_held: vec![Vec::new(); WORKERS],
        buckets_shed: vec![Vec::new(); WORKERS],
        redis: Some(redis),
        clock: None,
        deliveries: Vec::new(),
        leases_held: Vec::new(),
        ordinals: Ordinals::default(),
    };
    // Most cases start from an initialised run; some exercise the missing run.
    let init_op = Op::Init { same_units: true };
    let ops = init.then_some(&init_op).into_iter().chain(case.ops.iter());
    for (i, op) in ops.enumerate() {
        let a = apply(&mut m, case, &run, op).await;
        let b = apply(&mut r, case, &run, op).await;
        prop_assert_eq!(&a, &b, "op #{} {:?}: memory and Redis differ", i, op);
    }
    let a = final_state(&mut m, case, &run).await;
    let b = final_state(&mut r, case, &run).await;
    prop_assert_eq!(a, b, "final state differs");
    Ok(())
}

/// Runs `cases` cases of `strategy` (`PROPTEST_CASES` overrides), each from
/// an initialised run when `init`; panics with the first difference.
fn agree(what: &str, default_cases: u32, strategy: impl Strategy<Value = Case>, init: bool) {
    let url = leasehold_redis::test_support::redis_url();
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |case| runtime.block_on(run_case(&url, &case, init)));
    eprintln!("differential ({what}): {cases} cases in {:.1} s", started.elapsed().as_secs_f64());
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn memory_and_redis_agree() {
    agree("everything", 2000, case(), true);
}

#[test]
fn memory_and_redis_agree_on_bucket_leases() {
    let buckets_only = prop::collection::vec(bucket_op(), 1..60).prop_map(|ops| Case {
        units: 1,
        group: None,
        quarantine_odd: false,
        budgets: Budgets { max_requeues: 0, requeue_tolerance: 0.0, max_reclaims: 0, max_failures: None },
        ops,
    });
    agree("bucket leases", 500, buckets_only, false);
}
