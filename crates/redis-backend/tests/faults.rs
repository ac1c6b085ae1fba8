//! Faults: a Redis restart, dropped connections and re-sent commands,
//! flushed scripts, and corrupt state.

mod common;

use std::time::{Duration, Instant};

use leasehold_core::{
    Ack, Budgets, FinalizeRequest, InitOutcome, LeaseError, LeaseKey, LeaseStore, Outcome, Presence, QueueError,
    RequeueReply, RequeueRequest, ReserveReply, RunId, RunLog, RunSpec, Ttl, UnitId, UnitQueue, UnitSpec, UnitState,
    UserId, WorkerId,
};
use leasehold_redis::test_support::RedisServer;
use leasehold_redis::RedisStore;

const LONG: Ttl = Ttl::from_secs(600);

fn spec(run: &str, units: &[&str]) -> RunSpec {
    RunSpec {
        run: RunId::new(run).unwrap(),
        units: units.iter().map(|u| UnitSpec::new(UnitId::new(*u).unwrap(), "file")).collect(),
        budgets: Budgets { max_requeues: 2, requeue_tolerance: 1.0, max_reclaims: 2, max_failures: None },
        ttl: Duration::from_secs(3600),
    }
}

fn w(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
}

fn delivered(r: ReserveReply) -> leasehold_core::Delivery {
    match r {
        ReserveReply::Delivered(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

/// Retries `f` until it succeeds or `within` passes.
async fn eventually<T, E: std::fmt::Display, F, Fut>(within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "not yet");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("still failing after {within:?}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_gives_a_clear_error_and_the_store_reconnects() {
    let server = RedisServer::start().unwrap();
    let store = common::store(&server.url(), "restart").await;
    let s = spec("r1", &["a", "b"]);
    assert_eq!(store.initialize(&s).await.unwrap(), InitOutcome::Initialized);
    delivered(store.reserve(&s.run, &w("w1"), LONG).await.unwrap());
    let mut sub = store.subscribe_user_active().await.unwrap();

    server.kill();
    let err = store.reserve(&s.run, &w("w1"), LONG).await.expect_err("Redis is down");
    assert!(matches!(err, QueueError::Backend { op: "reserve", .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("reserve") && text.contains("r1"), "the error names the operation and the run: {text}");
    let err = store.claim(&LeaseKey::new("k").unwrap(), &w("w1"), LONG).await.expect_err("Redis is down");
    assert!(matches!(err, LeaseError::Backend { op: "claim", .. }), "{err:?}");
    assert!(err.to_string().contains('k'), "{err}");

    server.restart().unwrap();
    // The data is gone (no persistence) and so are the scripts: both come back.
    let init = eventually(Duration::from_secs(10), || store.initialize(&s)).await;
    assert_eq!(init, InitOutcome::Initialized);
    let d = delivered(store.reserve(&s.run, &w("w1"), LONG).await.unwrap());
    assert_eq!(store.finalize(&s.run, &w("w1"), &d, &FinalizeRequest::new(Outcome::Passed, 1)).await.unwrap(), Ack::Ok);
    assert!(store.claim(&LeaseKey::new("k").unwrap(), &w("w1"), LONG).await.unwrap().is_some());

    // The user.active subscriber reconnects too.
    let user = UserId::new("u1").unwrap();
    let got = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            store.mark_user_active(&user, LONG).await.unwrap();
            if let Ok(Some(u)) = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
                return u;
            }
        }
    })
    .await
    .expect("user.active flows again after the restart");
    assert_eq!(got, user);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_transitions_cannot_apply_twice() {
    // CLIENT KILL drops every connection of the server: this test owns it.
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let store = common::store(&url, "resend").await;
    let s = spec("r1", &["a", "b", "c"]);
    store.initialize(&s).await.unwrap();
    let done = FinalizeRequest::new(Outcome::Passed, 1);

    // finalize, sent twice (a retry after a lost reply): the second is fenced off.
    let d = delivered(store.reserve(&s.run, &w("w1"), LONG).await.unwrap());
    assert_eq!(store.finalize(&s.run, &w("w1"), &d, &done).await.unwrap(), Ack::Ok);
    assert_eq!(store.finalize(&s.run, &w("w1"), &d, &done).await.unwrap(), Ack::Stale);
    assert_eq!(
        store.finalize_many(&s.run, &w("w1"), &[(d.clone(), done.clone()), (d, done.clone())]).await.unwrap(),
        vec![Ack::Stale; 2]
    );

    // requeue, sent twice: one retry entry, not two.
    let d = delivered(store.reserve(&s.run, &w("w1"), LONG).await.unwrap());
    let again = RequeueRequest::default();
    assert!(matches!(store.requeue(&s.run, &w("w1"), &d, &again).await.unwrap(), RequeueReply::Requeued { .. }));
    assert_eq!(store.requeue(&s.run, &w("w1"), &d, &again).await.unwrap(), RequeueReply::Stale);
    let p = store.progress(&s.run).await.unwrap().unwrap();
    assert_eq!((p.finalized, p.requeued_units, p.queued, p.in_flight), (1, 1, 2, 0));

    // A dropped connection: the next call reconnects; a retried finalize applies once.
    let d = delivered(store.reserve(&s.run, &w("w1"), LONG).await.unwrap());
    let mut admin = raw(&url).await;
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    let mut replies = Vec::new();
    let w1 = w("w1");
    for _ in 0..2 {
        let r = eventually(Duration::from_secs(10), || store.finalize(&s.run, &w1, &d, &done)).await;
        replies.push(r);
    }
    assert_eq!(replies, vec![Ack::Ok, Ack::Stale]);
    assert_eq!(store.progress(&s.run).await.unwrap().unwrap().finalized, 2);

    // A claim re-sent after it applied does not hand out a second token.
    let key = LeaseKey::new("acct").unwrap();
    let lease = store.claim(&key, &w("w1"), LONG).await.unwrap().unwrap();
    assert!(store.claim(&key, &w("w1"), LONG).await.unwrap().is_none());
    assert_eq!(store.holder(&key).await.unwrap(), Some(lease));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_survive_script_flush() {
    // SCRIPT FLUSH empties the script cache of every client: this test owns the server.
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let store = common::store(&url, "flush").await;
    store.load_scripts().await.unwrap();
    let mut admin = raw(&url).await;
    let flush = || redis::cmd("SCRIPT").arg("FLUSH").to_owned();
    // The transitions are a function library: FUNCTION FLUSH (or a restart
    // without persistence) loses it the same way.
    let flush_functions = || redis::cmd("FUNCTION").arg("FLUSH").to_owned();

    let s = spec("r1", &["a", "b", "c", "d"]);
    store.initialize(&s).await.unwrap();
    let _: () = flush().query_async(&mut admin).await.unwrap();
    let _: () = flush_functions().query_async(&mut admin).await.unwrap();
    let batch = store.reserve_batch(&s.run, &w("w1"), std::num::NonZeroUsize::new(3).unwrap(), LONG).await.unwrap();
    assert_eq!(batch.deliveries.len(), 3);
    let _: () = flush().query_async(&mut admin).await.unwrap();
    let _: () = flush_functions().query_async(&mut admin).await.unwrap();
    let items: Vec<_> = batch.deliveries.into_iter().map(|d| (d, FinalizeRequest::new(Outcome::Passed, 1))).collect();
    assert_eq!(store.finalize_many(&s.run, &w("w1"), &items).await.unwrap(), vec![Ack::Ok; 3]);

    // Leases, including the pipelined renew_many.
    let keys: Vec<LeaseKey> = (0..5).map(|i| LeaseKey::new(format!("k{i}")).unwrap()).collect();
    let _: () = flush().query_async(&mut admin).await.unwrap();
    let leases = store.claim_many(&keys, &w("w1"), LONG).await.unwrap();
    assert_eq!(leases.len(), 5);
    let _: () = flush().query_async(&mut admin).await.unwrap();
    assert_eq!(store.renew_many(&leases, LONG).await.unwrap(), vec![true; 5]);
    let _: () = flush().query_async(&mut admin).await.unwrap();
    assert!(LeaseStore::release(&store, &leases[0]).await.unwrap());
    assert_eq!(store.progress(&s.run).await.unwrap().unwrap().finalized, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_gives_corrupt_or_a_clear_error() {
    let url = leasehold_redis::test_support::redis_url();
    let store: RedisStore = common::store(&url, "corrupt").await;
    let mut admin = raw(&url).await;
    let s = spec("r1", &["a", "b", "c"]);
    store.initialize(&s).await.unwrap();
    let keys = store.run_keys(&s.run);

    // A unit_state entry that is not valid JSON. The main queue hands its
    // units out as ranges without reading their states (format 5: a unit
    // never delivered has the state it was initialised with), so the first
    // transition that reads it answers CORRUPT, and nothing changes.
    let _: () =
        redis::cmd("HSET").arg(&keys.unit_state).arg("b").arg("{not json").query_async(&mut admin).await.unwrap();
    let batch = store.reserve_batch(&s.run, &w("w1"), std::num::NonZeroUsize::new(5).unwrap(), LONG).await.unwrap();
    assert!(!batch.corrupt, "{batch:?}");
    assert_eq!(batch.deliveries.iter().map(|d| d.unit.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    let err = store.unit_state(&s.run, &UnitId::new("b").unwrap()).await.expect_err("corrupt");
    assert!(matches!(err, QueueError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("unit_state"), "{err}");
    let done = FinalizeRequest::new(Outcome::Passed, 1);
    let b = batch.deliveries[1].clone();
    assert_eq!(store.finalize(&s.run, &w("w1"), &b, &done).await.unwrap(), Ack::Corrupt);
    // A fenced transition on a unit whose state is unreadable: CORRUPT, nothing changes.
    let a = batch.deliveries[0].clone();
    let _: () = redis::cmd("HSET").arg(&keys.unit_state).arg("a").arg("[]").query_async(&mut admin).await.unwrap();
    assert_eq!(store.finalize(&s.run, &w("w1"), &a, &done).await.unwrap(), Ack::Corrupt);
    assert_eq!(store.requeue(&s.run, &w("w1"), &a, &RequeueRequest::default()).await.unwrap(), RequeueReply::Corrupt);
    assert_eq!(store.progress(&s.run).await.unwrap().unwrap().finalized, 0);
    // The one untouched unit still finalizes.
    let c = batch.deliveries[2].clone();
    assert_eq!(store.finalize(&s.run, &w("w1"), &c, &done).await.unwrap(), Ack::Ok);

    // The range keys lost while the run's meta is not: a unit of a lost
    // range could be neither finalized nor reclaimed, so CORRUPT, not STALE.
    let s3 = spec("r3", &["p", "q", "r"]);
    store.initialize(&s3).await.unwrap();
    let k3 = store.run_keys(&s3.run);
    let lost = store.reserve_batch(&s3.run, &w("w1"), std::num::NonZeroUsize::new(2).unwrap(), LONG).await.unwrap();
    assert_eq!(lost.deliveries.len(), 2);
    let _: () = redis::cmd("DEL").arg(&k3.ranges).query_async(&mut admin).await.unwrap();
    assert_eq!(store.finalize(&s3.run, &w("w1"), &lost.deliveries[0], &done).await.unwrap(), Ack::Corrupt);
    assert_eq!(store.heartbeat(&s3.run, &w("w1"), &lost.deliveries[1]).await.unwrap(), Ack::Corrupt);
    let _: () = redis::cmd("DEL").arg(&k3.starts).arg(&k3.clocks).query_async(&mut admin).await.unwrap();
    assert_eq!(
        UnitQueue::release(&store, &s3.run, &w("w1"), &lost.deliveries[1]).await.unwrap(),
        Ack::Corrupt,
        "the starts of the ranges lost"
    );
    assert_eq!(store.reserve(&s3.run, &w("w2"), Ttl::from_millis(1)).await.unwrap(), ReserveReply::Corrupt);
    assert_eq!(store.progress(&s3.run).await.unwrap().unwrap().finalized, 0);
    // The state hash lost (evicted, say) while the streams are not: a fresh
    // unit's state is stored nowhere, so the loss is told by the hash itself.
    let s2 = spec("r2", &["x", "y"]);
    store.initialize(&s2).await.unwrap();
    let held = store.reserve(&s2.run, &w("w1"), LONG).await.unwrap();
    let _: () = redis::cmd("DEL").arg(store.run_keys(&s2.run).unit_state).query_async(&mut admin).await.unwrap();
    assert_eq!(store.reserve(&s2.run, &w("w1"), LONG).await.unwrap(), ReserveReply::Corrupt);
    let ReserveReply::Delivered(held) = held else { panic!("{held:?}") };
    assert_eq!(store.finalize(&s2.run, &w("w1"), &held, &done).await.unwrap(), Ack::Corrupt);

    // A worker record that is not valid JSON: a clear error from the read;
    // transitions rewrite it.
    let _: () = redis::cmd("HSET").arg(&keys.workers).arg("w9").arg("garbage").query_async(&mut admin).await.unwrap();
    assert!(matches!(store.workers(&s.run).await, Err(QueueError::Corrupt { .. })));
    assert_eq!(store.liveness(&s.run, &w("w9"), None).await.unwrap(), leasehold_core::LivenessReply::Ok);
    assert!(store.workers(&s.run).await.is_ok());

    // An event that is not valid JSON.
    let _: String =
        redis::cmd("XADD").arg(&keys.attempts).arg("*").arg("json").arg("nope").query_async(&mut admin).await.unwrap();
    let err = store.events(&s.run, None, 100).await.expect_err("corrupt event");
    assert!(matches!(err, QueueError::Corrupt { .. }), "{err:?}");

    // Meta of the wrong type: a clear CORRUPT error for every call, no panic.
    let _: () = redis::cmd("DEL").arg(&keys.meta).query_async(&mut admin).await.unwrap();
    let _: () = redis::cmd("SET").arg(&keys.meta).arg("x").query_async(&mut admin).await.unwrap();
    for result in [
        store.reserve(&s.run, &w("w1"), LONG).await.map(|_| ()),
        store.progress(&s.run).await.map(|_| ()),
        store.budgets(&s.run).await.map(|_| ()),
        store.initialize(&s).await.map(|_| ()),
    ] {
        let err = result.expect_err("wrong type");
        assert!(matches!(err, QueueError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("wrong type"), "{err}");
    }

    // Lease keys of the wrong type.
    let key = LeaseKey::new("acct").unwrap();
    let lk = store.lease_keys();
    let _: () = redis::cmd("RPUSH").arg(lk.lease(&key)).arg("x").query_async(&mut admin).await.unwrap();
    assert!(matches!(store.holder(&key).await, Err(LeaseError::Corrupt { .. })));
    let _: () = redis::cmd("SET").arg(lk.live()).arg("x").query_async(&mut admin).await.unwrap();
    let err = store.mark_live(&key).await.expect_err("wrong type");
    assert!(matches!(err, LeaseError::Corrupt { .. }), "{err:?}");
    let _: () = redis::cmd("SET").arg(lk.tier(&key)).arg("lukewarm").query_async(&mut admin).await.unwrap();
    assert!(matches!(store.tier(&key).await, Err(LeaseError::Corrupt { .. })));
    let other = LeaseKey::new("other").unwrap();
    let _: () = redis::cmd("SET").arg(lk.lease(&other)).arg("no-token-here").query_async(&mut admin).await.unwrap();
    assert!(matches!(store.holder(&other).await, Err(LeaseError::Corrupt { .. })));
}

/// The events of one call share one attempts entry: paging with `after` and
/// `limit` still sees every event once, in order, with increasing ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_events_page_exactly() {
    let url = leasehold_redis::test_support::redis_url();
    let store: RedisStore = common::store(&url, "packed").await;
    let units: Vec<String> = (0..7).map(|i| format!("u\"{i}\\")).collect();
    let names: Vec<&str> = units.iter().map(String::as_str).collect();
    let s = spec("r1", &names);
    store.initialize(&s).await.unwrap();
    let batch = store.reserve_batch(&s.run, &w("w1"), std::num::NonZeroUsize::new(5).unwrap(), LONG).await.unwrap();
    assert_eq!(batch.deliveries.len(), 5);
    let items: Vec<_> =
        batch.deliveries.iter().map(|d| (d.clone(), FinalizeRequest::new(Outcome::Passed, 3))).collect();
    assert!(store.finalize_batch(&s.run, &w("w1"), &items).await.unwrap().iter().all(|a| *a == Ack::Ok));
    let single = delivered(store.reserve(&s.run, &w("w2"), LONG).await.unwrap());
    assert_eq!(
        store.finalize(&s.run, &w("w2"), &single, &FinalizeRequest::new(Outcome::Failed, 1)).await.unwrap(),
        Ack::Ok
    );

    let all = store.events(&s.run, None, 1000).await.unwrap();
    assert_eq!(all.len(), 12, "{all:?}");
    let kinds: Vec<&str> = all.iter().map(|e| e.event.type_name()).collect();
    assert_eq!(
        kinds,
        [["delivered"; 5], ["finalized"; 5]].concat().into_iter().chain(["delivered", "finalized"]).collect::<Vec<_>>()
    );
    for (i, e) in all.iter().enumerate().take(10) {
        assert_eq!(e.event.unit_id().unwrap().as_str(), units[i % 5], "{e:?}");
    }
    assert!(all.windows(2).all(|p| p[0].id < p[1].id), "{all:?}");

    for limit in 1..=13 {
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let page = store.events(&s.run, after, limit).await.unwrap();
            assert!(page.len() <= limit);
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            got.extend(page);
        }
        assert_eq!(got, all, "limit {limit}");
    }
    for (i, e) in all.iter().enumerate() {
        assert_eq!(store.events(&s.run, Some(e.id), 1000).await.unwrap(), all[i + 1..].to_vec());
    }
}

/// A fresh unit's state is stored nowhere (format 4), so `unit_state` tells
/// it from a unit not in the run by the unit list, which it keeps under the
/// run's fingerprint: a run lost and started again under the same id with
/// other units is read afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_state_knows_a_run_started_again_with_other_units() {
    let url = leasehold_redis::test_support::redis_url();
    let store: RedisStore = common::store(&url, "restarted-run").await;
    let mut admin = raw(&url).await;
    let first = spec("r", &["a", "b"]);
    store.initialize(&first).await.unwrap();
    let a = UnitId::new("a").unwrap();
    let c = UnitId::new("c").unwrap();
    assert_eq!(store.unit_state(&first.run, &a).await.unwrap(), Some(UnitState::default()));
    assert_eq!(store.unit_state(&first.run, &c).await.unwrap(), None);

    // Every key of the run lost (a restart without persistence), then the
    // same run id started with another unit list.
    let _: () =
        redis::cmd("DEL").arg(store.run_keys(&first.run).all().as_slice()).query_async(&mut admin).await.unwrap();
    assert_eq!(store.unit_state(&first.run, &a).await.unwrap(), None);
    let second = spec("r", &["c"]);
    store.initialize(&second).await.unwrap();
    assert_eq!(store.unit_state(&second.run, &a).await.unwrap(), None);
    assert_eq!(store.unit_state(&second.run, &c).await.unwrap(), Some(UnitState::default()));
}
