//! The single forms (`reserve`, `heartbeat`, `finalize`, `release`) are the
//! trait's own, built on the batch forms a backend implements: each must
//! reply exactly as a batch of one, and `reserve` exactly as a reserve call
//! limited to its first item ([`ReserveLimit::FirstItem`]).

use super::*;
use crate::queue::ReserveLimit;

/// Budgets with no reclaim allowed (a reclaim finalizes its unit) and a
/// failure limit of `max_failures`.
fn no_reclaims(max_failures: Option<u32>) -> Budgets {
    Budgets { max_failures, ..budgets(1, 1.0, 0) }
}

/// `reserve` maps a call limited to its first item to its reply: the one
/// delivery (`Delivered`), the one unit finalized over its reclaim budget
/// (`ReclaimExhausted`, even when that failure stopped the run: `STOPPED`
/// is the next call's), else `CORRUPT`, `STOPPED` or `NONE` as the call
/// ended. Such a call hands out one unit, and ends at the first unit it
/// finalizes over budget: the other idle deliveries stay where they are.
pub async fn reserve_is_a_reserve_call_ended_at_its_first_item(fx: Fixture) {
    let (w1, w2) = (worker("w1"), worker("w2"));
    let gone = run("never-made");
    assert_eq!(fx.queue.reserve(&gone, &w1, LONG).await.unwrap(), ReserveReply::Corrupt);
    let corrupt = fx.queue.reserve_up_to(&gone, &w1, ReserveLimit::FirstItem, LONG).await.unwrap();
    assert_eq!(corrupt, ReserveBatch { corrupt: true, ..ReserveBatch::default() });

    let r = init(&fx, &["a", "b", "c"], no_reclaims(Some(2))).await;
    let first = fx.queue.reserve_up_to(&r, &w1, ReserveLimit::FirstItem, LONG).await.unwrap();
    let [a] = first.deliveries.as_slice() else { panic!("one delivery: {first:?}") };
    assert_eq!(*a, fresh_delivery("a", "file", StreamName::Main, a.entry_id, 0));
    assert_eq!((first.exhausted.len(), first.corrupt, first.stopped), (0, false, false), "{first:?}");
    let b = reserve(&fx, &r, "w1").await;
    assert_eq!(b, fresh_delivery("b", "file", StreamName::Main, b.entry_id, 0));
    let c = reserve(&fx, &r, "w1").await;
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
    let none = fx.queue.reserve_up_to(&r, &w2, ReserveLimit::FirstItem, LONG).await.unwrap();
    assert_eq!(none, ReserveBatch::default());

    // Every delivery of w1 is idle: a call limited to its first item
    // finalizes a (over budget) and leaves b and c pending on w1.
    fx.time.advance(ms(300)).await;
    let exhausted = fx.queue.reserve_up_to(&r, &w2, ReserveLimit::FirstItem, ttl_ms(100)).await.unwrap();
    assert_eq!(exhausted, ReserveBatch { exhausted: vec![unit("a")], ..ReserveBatch::default() });
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&b, "w1"), row_of(&c, "w1")]);
    // b's failure reaches the limit: the reply is still b's.
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("b") });
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&c, "w1")]);
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::Stopped);
    let stopped = fx.queue.reserve_up_to(&r, &w2, ReserveLimit::FirstItem, ttl_ms(100)).await.unwrap();
    assert_eq!(stopped, ReserveBatch { stopped: true, ..ReserveBatch::default() });
    assert_eq!(progress(&fx, &r).await, Progress { stopped: true, ..counters_failed(3, 2, 0, 1, 0, 2) });
    assert_eq!(
        type_names(&all_events(&fx, &r).await),
        ["delivered", "delivered", "delivered", "finalized", "finalized"]
    );
}

/// `reserve_batch` with `max` 1 is not `reserve`: a unit finalized over its
/// reclaim budget does not count toward `max`, so the batch goes on to the
/// next idle delivery, where `reserve` ends at the finalized unit.
pub async fn a_batch_of_one_goes_on_past_a_unit_over_its_reclaim_budget(fx: Fixture) {
    // In each run: a has been reclaimed once (its last reclaim allowed) and
    // is idle on w2; b has never been reclaimed and is idle on w1.
    let mut runs = Vec::new();
    let mut held_b = Vec::new();
    for name in ["single", "batch"] {
        let r = init_spec(&fx, &spec(name, &["a", "b"], budgets(1, 1.0, 1))).await;
        let _a = reserve(&fx, &r, "w1").await;
        held_b.push(reserve(&fx, &r, "w1").await);
        runs.push(r);
    }
    fx.time.advance(ms(300)).await;
    for r in &runs {
        let a = delivered(reserve_with(&fx, r, "w2", ms(100)).await);
        assert_eq!((a.unit.as_str(), a.reclaim_count), ("a", 1));
    }
    fx.time.advance(ms(300)).await;

    let (single, batch_run) = (&runs[0], &runs[1]);
    assert_eq!(reserve_with(&fx, single, "w3", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("a") });
    assert_eq!(pending_rows(&fx, single).await, vec![row_of(&held_b[0], "w1")], "b is still w1's");

    let got = fx.queue.reserve_batch(batch_run, &worker("w3"), batch(1), ttl_ms(100)).await.unwrap();
    assert_eq!(got.exhausted, vec![unit("a")]);
    let [b] = got.deliveries.as_slice() else { panic!("b, reclaimed: {got:?}") };
    assert_eq!((b.unit.as_str(), b.reclaim_count, b.delivery_count), ("b", 1, 2));
    assert_eq!(b.origin, DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w1")) });
    assert!(!got.corrupt && !got.stopped, "{got:?}");
    assert_eq!(pending_rows(&fx, batch_run).await, vec![row_of(b, "w3")]);
}

/// `heartbeat`, `finalize` and `release` reply exactly what their batch of
/// one replies (`OK`, `STALE`, `CORRUPT`), with the same events and state;
/// an invalid finalize request is the same error either way and changes
/// nothing.
pub async fn heartbeat_finalize_and_release_are_a_batch_of_one(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d"], lenient()).await;
    let (w1, w2) = (worker("w1"), worker("w2"));
    let a = reserve(&fx, &r, "w1").await;
    let b = reserve(&fx, &r, "w1").await;
    let c = reserve(&fx, &r, "w1").await;
    let d = reserve(&fx, &r, "w1").await;

    // Heartbeat: OK for the owner, STALE for anyone else; no event.
    assert_eq!(fx.queue.heartbeat(&r, &w1, &a).await.unwrap(), Ack::Ok);
    assert_eq!(fx.queue.heartbeat_batch(&r, &w1, std::slice::from_ref(&b)).await.unwrap(), vec![Ack::Ok]);
    assert_eq!(worker_record(&fx, &r, "w1").await.current_unit, Some(unit("b")));
    assert_eq!(fx.queue.heartbeat(&r, &w1, &a).await.unwrap(), Ack::Ok);
    assert_eq!(worker_record(&fx, &r, "w1").await.current_unit, Some(unit("a")));
    let before = snapshot(&fx, &r).await;
    assert_eq!(fx.queue.heartbeat(&r, &w2, &a).await.unwrap(), Ack::Stale);
    assert_eq!(fx.queue.heartbeat_batch(&r, &w2, std::slice::from_ref(&a)).await.unwrap(), vec![Ack::Stale]);
    assert_eq!(snapshot(&fx, &r).await, before);

    // An invalid request: the same error, nothing changed.
    let bad = FinalizeRequest { reason: Some(FinalizeReason::Other("x".repeat(MAX_KIND_LEN + 1))), ..passed(1) };
    let single = fx.queue.finalize(&r, &w1, &a, &bad).await.unwrap_err();
    let batched = fx.queue.finalize_batch(&r, &w1, &[(a.clone(), bad.clone())]).await.unwrap_err();
    assert!(matches!(single, QueueError::Spec(SpecError::TextTooLong { .. })), "{single}");
    assert_eq!(single.to_string(), batched.to_string());
    assert_eq!(snapshot(&fx, &r).await, before);

    // Finalize: a alone, b as a batch of one; each is STALE the second time, either way.
    let result = FinalizeRequest::new(Outcome::Passed, 7).on_slot(2);
    assert_eq!(fx.queue.finalize(&r, &w1, &a, &result).await.unwrap(), Ack::Ok);
    assert_eq!(fx.queue.finalize_batch(&r, &w1, &[(b.clone(), result.clone())]).await.unwrap(), vec![Ack::Ok]);
    for done in [&a, &b] {
        assert_eq!(fx.queue.finalize(&r, &w1, done, &result).await.unwrap(), Ack::Stale);
        let again = fx.queue.finalize_batch(&r, &w1, &[(done.clone(), result.clone())]).await.unwrap();
        assert_eq!(again, vec![Ack::Stale]);
    }
    let events = all_events(&fx, &r).await;
    let expected = |d: &Delivery, at_ms| Event::Finalized {
        header: header(d.unit.as_str(), "w1", 0, 0, at_ms),
        outcome: Outcome::Passed,
        duration_ms: 7,
        reason: None,
        errors: None,
        stream: StreamName::Main,
        entry_id: d.entry_id,
        previous_worker_id: None,
        delivery_count: None,
        failure_summary: None,
        slot: Some(2),
    };
    for d in [&a, &b] {
        let event = finalized_event_of(&events, d.unit.as_str());
        assert_eq!(event, expected(d, event.at_ms()));
    }
    let record = worker_record(&fx, &r, "w1").await;
    assert_eq!((record.current_unit, record.processed), (None, 2));

    // Release: c alone, d as a batch of one; each is STALE the second time.
    assert_eq!(fx.queue.release(&r, &w1, &c).await.unwrap(), Ack::Ok);
    assert_eq!(fx.queue.release_batch(&r, &w1, std::slice::from_ref(&d)).await.unwrap(), vec![Ack::Ok]);
    for done in [&c, &d] {
        assert_eq!(fx.queue.release(&r, &w1, done).await.unwrap(), Ack::Stale);
        assert_eq!(fx.queue.release_batch(&r, &w1, std::slice::from_ref(done)).await.unwrap(), vec![Ack::Stale]);
    }
    let released = events_of_type(&all_events(&fx, &r).await, "released");
    assert_eq!(released.iter().map(|e| e.unit_id().cloned()).collect::<Vec<_>>(), [Some(unit("c")), Some(unit("d"))]);
    assert_eq!(progress(&fx, &r).await, counters(4, 2, 0, 0, 2));
    let back: Vec<Delivery> = [reserve(&fx, &r, "w2").await, reserve(&fx, &r, "w2").await].into();
    assert_eq!(
        back.iter().map(|d| (d.unit.as_str(), d.stream)).collect::<Vec<_>>(),
        [("c", StreamName::Priority), ("d", StreamName::Priority)]
    );

    // A run that is gone: CORRUPT either way, and nothing made.
    let gone = run("gone");
    let ghost = ghost_delivery("a");
    assert_eq!(fx.queue.heartbeat(&gone, &w1, &ghost).await.unwrap(), Ack::Corrupt);
    assert_eq!(fx.queue.finalize(&gone, &w1, &ghost, &result).await.unwrap(), Ack::Corrupt);
    assert_eq!(
        fx.queue.finalize_batch(&gone, &w1, &[(ghost.clone(), result.clone())]).await.unwrap(),
        vec![Ack::Corrupt]
    );
    assert_eq!(fx.queue.release(&gone, &w1, &ghost).await.unwrap(), Ack::Corrupt);
    assert_run_absent(&fx, &gone).await;
}
