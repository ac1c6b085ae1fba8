//! Fail fast: the run's failure limit (`max_failures`), the failed-for-good
//! count and the `STOPPED` reply of `reserve`.

use super::*;

/// Budgets with no retries and the given failure limit.
fn limited(max_failures: Option<u32>) -> Budgets {
    Budgets { max_failures, ..budgets(0, 1.0, 0) }
}

fn failed_result() -> FinalizeRequest {
    FinalizeRequest::new(Outcome::Failed, 5)
}

/// Each unit finalized as failed counts once, whether by `finalize` or by a
/// requeue over budget; at the limit `reserve` replies `STOPPED` to every
/// worker (one that never reserved before included), changes nothing and
/// appends no event, while a delivery handed out before the stop is still
/// finalized. With nothing in flight the stopped run is complete.
pub async fn failures_stop_the_run_at_the_limit(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d", "e"], limited(Some(2))).await;
    let a = reserve(&fx, &r, "w1").await;
    let ack = fx.queue.finalize(&r, &worker("w1"), &a, &failed_result()).await.expect("finalize");
    assert_eq!(ack, Ack::Ok);
    let p = progress(&fx, &r).await;
    assert_eq!((p.failed, p.stopped), (1, false));
    let b = reserve(&fx, &r, "w1").await;
    let c = reserve(&fx, &r, "w2").await;
    // A pass does not count.
    let d = reserve(&fx, &r, "w2").await;
    finalize_ok(&fx, &r, "w2", &d).await;
    assert_eq!(progress(&fx, &r).await.failed, 1);
    // Out of retries (max_requeues 0): b fails for good, the second failure.
    assert_eq!(requeue_as(&fx, &r, "w1", &b, "boom").await, RequeueReply::Finalized { retry_index: 0 });
    assert_eq!(progress(&fx, &r).await, Progress { stopped: true, ..counters_failed(5, 3, 0, 1, 1, 2) });

    let before = event_count(&fx, &r).await;
    for w in ["w1", "w2", "late"] {
        assert_eq!(reserve_with(&fx, &r, w, LONG).await, ReserveReply::Stopped, "reserve by {w}");
        assert_eq!(reserve_with(&fx, &r, w, ms(1)).await, ReserveReply::Stopped, "reserve by {w}, reclaiming");
        let got = fx.queue.reserve_batch(&r, &worker(w), batch(3), LONG).await.expect("reserve_batch");
        assert_eq!(got, ReserveBatch { stopped: true, ..ReserveBatch::default() }, "batch by {w}");
    }
    assert_eq!(event_count(&fx, &r).await, before, "a stopped reserve appends nothing");
    assert_eq!(ReserveReply::Stopped.status().as_str(), "STOPPED");

    // c, handed out before the stop, still finishes (and a failure past the
    // limit still counts).
    let p = progress(&fx, &r).await;
    assert!(!p.is_complete(), "c is still in flight: {p:?}");
    let ack = fx.queue.finalize(&r, &worker("w2"), &c, &failed_result()).await.expect("finalize");
    assert_eq!(ack, Ack::Ok);
    let p = progress(&fx, &r).await;
    assert_eq!(p, Progress { stopped: true, ..counters_failed(5, 4, 0, 0, 1, 3) });
    assert!(p.is_complete(), "stopped with nothing in flight: {p:?}");
    assert_eq!(p.not_run(), 1, "e never ran");
}

/// A reclaim over budget fails its unit for good and counts; a batch that
/// reaches the limit that way ends at once with `stopped`, keeping what it
/// had already handed out.
pub async fn reclaim_exhaustion_counts_and_stops_a_batch(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], limited(Some(1))).await;
    let _a = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let got = fx.queue.reserve_batch(&r, &worker("w2"), batch(1), ttl_ms(100)).await.expect("reserve_batch");
    assert_eq!(got.deliveries.len(), 1, "b, fresh: {got:?}");
    assert!(!got.stopped);
    let got = fx.queue.reserve_batch(&r, &worker("w2"), batch(3), ttl_ms(100)).await.expect("reserve_batch");
    assert_eq!(got.deliveries.iter().map(|d| d.unit.clone()).collect::<Vec<_>>(), vec![unit("c")]);
    assert_eq!(got.exhausted, vec![unit("a")]);
    assert!(got.stopped, "a's failure reached the limit: {got:?}");
    assert!(!got.corrupt);
    let p = progress(&fx, &r).await;
    assert_eq!(p, Progress { stopped: true, ..counters_failed(3, 1, 0, 2, 0, 1) });
    assert_eq!(reserve_with(&fx, &r, "w3", ttl_ms(100)).await, ReserveReply::Stopped);
}

/// Without a limit a run never stops, however many units fail; the count
/// is kept all the same.
pub async fn no_limit_never_stops(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], limited(None)).await;
    for _ in 0..2 {
        let d = reserve(&fx, &r, "w1").await;
        let ack = fx.queue.finalize(&r, &worker("w1"), &d, &failed_result()).await.expect("finalize");
        assert_eq!(ack, Ack::Ok);
    }
    let last = reserve(&fx, &r, "w1").await;
    assert_eq!(last.unit, unit("c"));
    let p = progress(&fx, &r).await;
    assert_eq!(p, counters_failed(3, 2, 0, 1, 0, 2));
    assert_eq!(p.not_run(), 0);
}

/// The limit is frozen at initialisation: a later initializer with another
/// limit gets the leader's, and `budgets` reads it back.
pub async fn max_failures_is_frozen_at_initialize(fx: Fixture) {
    let leader = spec(RUN, &["a", "b"], limited(Some(3)));
    init_spec(&fx, &leader).await;
    let joiner = RunSpec { budgets: limited(Some(7)), ..leader.clone() };
    let outcome = fx.queue.initialize(&joiner).await.expect("initialize");
    assert_eq!(outcome, InitOutcome::AlreadyInitialized { budgets: limited(Some(3)) });
    assert_eq!(fx.queue.budgets(&leader.run).await.expect("budgets"), Some(limited(Some(3))));
    let none = spec("other-run", &["a"], limited(None));
    init_spec(&fx, &none).await;
    let outcome = fx.queue.initialize(&RunSpec { budgets: limited(Some(1)), ..none.clone() }).await.expect("init");
    assert_eq!(outcome, InitOutcome::AlreadyInitialized { budgets: limited(None) });
    assert_eq!(fx.queue.budgets(&none.run).await.expect("budgets"), Some(limited(None)));
}

/// A quarantined unit's failures do not count toward the limit, whichever
/// transition finalizes it as failed (`finalize`, a requeue over budget, a
/// reclaim over budget); the others still stop the run. Its state and the
/// unit list say it is quarantined.
pub async fn quarantined_failures_do_not_count_toward_the_limit(fx: Fixture) {
    let mut s = spec(RUN, &["q1", "q2", "q3", "a"], limited(Some(1)));
    for u in s.units.iter_mut().filter(|u| u.id.as_str().starts_with('q')) {
        u.quarantined = true;
    }
    let r = init_spec(&fx, &s).await;
    assert!(state_of(&fx, &r, "q1").await.quarantined);
    assert!(!state_of(&fx, &r, "a").await.quarantined);
    let listed = fx.queue.units(&r).await.unwrap();
    assert_eq!(listed.iter().map(|u| u.quarantined).collect::<Vec<_>>(), [true, true, true, false]);

    let q1 = reserve(&fx, &r, "w1").await;
    assert_eq!(fx.queue.finalize(&r, &worker("w1"), &q1, &failed_result()).await.unwrap(), Ack::Ok);
    let q2 = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &q2, "boom").await, RequeueReply::Finalized { retry_index: 0 });
    let _q3 = reserve(&fx, &r, "dead").await;
    let a = reserve(&fx, &r, "w2").await;
    fx.time.advance(ms(300)).await;
    // max_reclaims 0: q3 is finalized as failed at its reclaim, not counted.
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("q3") });
    let p = progress(&fx, &r).await;
    assert_eq!((p.finalized, p.failed, p.stopped), (3, 0, false), "{p:?}");
    assert_eq!(fx.queue.finalize(&r, &worker("w2"), &a, &failed_result()).await.unwrap(), Ack::Ok);
    let p = progress(&fx, &r).await;
    assert_eq!((p.failed, p.stopped), (1, true), "{p:?}");
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::Stopped);
}
