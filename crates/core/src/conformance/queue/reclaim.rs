//! Reclaim of idle deliveries, its budget, and heartbeats that prevent it.

use super::*;

/// Nothing is reclaimed before it has been idle for the reclaim timeout.
pub async fn reclaim_waits_for_idle_timeout(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
    fx.time.advance(ms(300)).await;
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&d, "w1")]);
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 0, false));
    assert_eq!(type_names(&all_events(&fx, &r).await), ["delivered"]);
}

/// After the timeout an idle delivery goes to the reserving worker with
/// delivery count + 1, reclaim count + 1, origin `Reclaimed`, and exactly one
/// new event: `reclaimed`.
pub async fn reclaim_moves_idle_delivery_to_new_worker(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let before = event_count(&fx, &r).await;
    let got = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(
        got,
        Delivery {
            unit: unit("a"),
            kind: "file".into(),
            stream: StreamName::Main,
            entry_id: d.entry_id,
            delivery_count: 2,
            retry_index: 0,
            reclaim_count: 1,
            origin: DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w1")) },
        }
    );
    assert_eq!(got.ownership_generation(), 2);
    let new = events_since(&fx, &r, before).await;
    assert_eq!(new.len(), 1, "one new event: {new:?}");
    assert_eq!(
        new[0],
        Event::Reclaimed {
            header: header("a", "w2", 0, 1, new[0].at_ms()),
            previous_worker_id: Some(worker("w1")),
            stream: StreamName::Main,
            entry_id: d.entry_id,
            delivery_count: 2,
        }
    );
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 1, false));
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&got, "w2")]);
    assert_eq!(progress(&fx, &r).await, counters(1, 0, 0, 1, 0));
    assert_eq!(worker_record(&fx, &r, "w2").await.current_unit, Some(unit("a")));
    finalize_ok(&fx, &r, "w2", &got).await;
    assert_eq!(progress(&fx, &r).await, counters(1, 1, 0, 0, 0));
}

/// Idle priority-stream deliveries are reclaimed before idle main-stream ones,
/// even when the main-stream one is older.
pub async fn reclaim_takes_priority_stream_first(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    let b = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &b, "f").await, RequeueReply::Requeued { retry_index: 1 });
    let b2 = reserve(&fx, &r, "w1").await;
    assert_eq!((b2.unit.as_str(), b2.stream), ("b", StreamName::Priority));
    fx.time.advance(ms(300)).await;
    let first = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!((first.unit.as_str(), first.stream, first.entry_id), ("b", StreamName::Priority, b2.entry_id));
    assert_eq!((first.retry_index, first.reclaim_count, first.delivery_count), (1, 1, 2));
    assert_eq!(first.ownership_generation(), 3);
    let second = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!((second.unit.as_str(), second.stream, second.entry_id), ("a", StreamName::Main, a.entry_id));
    assert_eq!(second.origin, DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w1")) });
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::None);
}

/// Reclaim happens only once both streams are empty: a worker is first given
/// the priority entry, then the main entry, and only then the idle delivery.
pub async fn reclaim_only_after_both_streams_are_empty(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    let b = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &b, "f").await, RequeueReply::Requeued { retry_index: 1 });
    fx.time.advance(ms(300)).await;
    let d1 = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(d1, fresh_delivery("b", "file", StreamName::Priority, d1.entry_id, 1));
    let d2 = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(d2, fresh_delivery("c", "file", StreamName::Main, d2.entry_id, 0));
    let d3 = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!((d3.unit.as_str(), d3.entry_id, d3.delivery_count), ("a", a.entry_id, 2));
    assert_eq!(d3.origin, DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w1")) });
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
}

/// After a reclaim the previous worker's transitions are `STALE` and change
/// nothing; so is the new owner using the old handle (old delivery count).
pub async fn reclaim_fences_off_previous_worker(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let got = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_all_stale(&fx, &r, "w1", &d).await;
    assert_all_stale(&fx, &r, "w2", &d).await;
    assert_all_stale(&fx, &r, "w1", &got).await;
    assert_eq!(fx.queue.heartbeat(&r, &worker("w2"), &got).await.unwrap(), Ack::Ok);
    finalize_ok(&fx, &r, "w2", &got).await;
    assert_eq!(progress(&fx, &r).await, counters(1, 1, 0, 0, 0));
    assert_eq!(events_of_type(&all_events(&fx, &r).await, "finalized").len(), 1);
}

/// A reclaimed unit keeps its reclaim count through a requeue: the next
/// delivery's generation is `1 + retry + reclaim`.
pub async fn reclaimed_unit_requeue_keeps_reclaim_count(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let got = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(requeue_as(&fx, &r, "w2", &got, "f").await, RequeueReply::Requeued { retry_index: 1 });
    let ev = last_event(&fx, &r).await;
    assert_eq!(ev.header(), Some(&header("a", "w2", 1, 1, ev.at_ms())));
    let next = reserve(&fx, &r, "w3").await;
    assert_eq!((next.retry_index, next.reclaim_count, next.delivery_count), (1, 1, 1));
    assert_eq!((next.origin.clone(), next.ownership_generation()), (DeliveryOrigin::Fresh, 3));
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(1, 1, true));
    let ev = last_event(&fx, &r).await;
    assert_eq!(ev.header(), Some(&header("a", "w3", 1, 1, ev.at_ms())));
}

/// A reclaim past `max_reclaims` finalizes the unit as failed
/// (`reclaim_budget_exhausted`) and replies `FINALIZED`.
pub async fn reclaim_over_budget_finalizes_failed(fx: Fixture) {
    let r = init(&fx, &["a"], budgets(1, 1.0, 1)).await;
    let d = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let d2 = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!((d2.reclaim_count, d2.delivery_count), (1, 2));
    fx.time.advance(ms(300)).await;
    let before = event_count(&fx, &r).await;
    assert_eq!(reserve_with(&fx, &r, "w3", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("a") });
    let new = events_since(&fx, &r, before).await;
    assert_eq!(new.len(), 1, "one new event: {new:?}");
    // As in the seed, the refused reclaim has already counted as a delivery
    // (XAUTOCLAIM moved the entry): the event says 3.
    assert_eq!(
        new[0],
        Event::Finalized {
            header: header("a", "w3", 0, 1, new[0].at_ms()),
            outcome: Outcome::Failed,
            duration_ms: 0,
            reason: Some(FinalizeReason::ReclaimBudgetExhausted),
            errors: None,
            stream: StreamName::Main,
            entry_id: d.entry_id,
            previous_worker_id: Some(worker("w2")),
            delivery_count: Some(3),
            failure_summary: None,
            slot: None,
        }
    );
    assert_eq!(progress(&fx, &r).await, counters_failed(1, 1, 0, 0, 0, 1));
    assert!(pending_rows(&fx, &r).await.is_empty());
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 1, false));
    let rec = worker_record(&fx, &r, "w3").await;
    assert_eq!((rec.current_unit, rec.processed), (None, 0));
    assert_all_stale(&fx, &r, "w2", &d2).await;
    assert_eq!(reserve_with(&fx, &r, "w3", ms(100)).await, ReserveReply::None);
}

/// With `max_reclaims` 0 the first reclaim of each idle unit finalizes it,
/// oldest first.
pub async fn reclaim_with_zero_max_reclaims_finalizes_first(fx: Fixture) {
    let r = init(&fx, &["a", "b"], budgets(1, 1.0, 0)).await;
    let da = reserve(&fx, &r, "w1").await;
    let db = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("a") });
    let ev = last_event(&fx, &r).await;
    assert_eq!(
        ev,
        Event::Finalized {
            header: header("a", "w2", 0, 0, ev.at_ms()),
            outcome: Outcome::Failed,
            duration_ms: 0,
            reason: Some(FinalizeReason::ReclaimBudgetExhausted),
            errors: None,
            stream: StreamName::Main,
            entry_id: da.entry_id,
            previous_worker_id: Some(worker("w1")),
            delivery_count: Some(2),
            failure_summary: None,
            slot: None,
        }
    );
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("b") });
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::None);
    assert_eq!(progress(&fx, &r).await, counters_failed(2, 2, 0, 0, 0, 2));
    assert_all_stale(&fx, &r, "w1", &db).await;
}

/// A heartbeat resets the idle time: a delivery idle for longer than the
/// timeout but just heartbeated is not reclaimed; without heartbeats it is.
pub async fn heartbeat_keeps_delivery_from_reclaim(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(400)).await;
    assert_eq!(fx.queue.heartbeat(&r, &worker("w1"), &d).await.unwrap(), Ack::Ok);
    assert_eq!(reserve_with(&fx, &r, "w2", ms(300)).await, ReserveReply::None);
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&d, "w1")]);
    fx.time.advance(ms(550)).await;
    let got = delivered(reserve_with(&fx, &r, "w2", ms(300)).await);
    assert_eq!(got.origin, DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w1")) });
    assert_eq!((got.delivery_count, got.reclaim_count), (2, 1));
}

/// Each delivery has an idle clock of its own, also among the units one
/// `reserve_batch` call handed out together: a heartbeat of one of them
/// keeps that one alone from reclaim. Its batch-mates age on and are
/// reclaimed oldest first, each fencing off only its own old handle.
pub async fn deliveries_of_one_reserve_call_age_apart(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], lenient()).await;
    let got = fx.queue.reserve_batch(&r, &worker("w1"), batch(3), LONG).await.expect("reserve_batch");
    let [da, db, dc] = <[Delivery; 3]>::try_from(got.deliveries).expect("three deliveries in one call");
    fx.time.advance(ms(400)).await;
    assert_eq!(fx.queue.heartbeat_batch(&r, &worker("w1"), std::slice::from_ref(&db)).await.unwrap(), vec![Ack::Ok]);
    let first = delivered(reserve_with(&fx, &r, "w2", ms(300)).await);
    let second = delivered(reserve_with(&fx, &r, "w2", ms(300)).await);
    assert_eq!((first.unit.clone(), second.unit.clone()), (unit("a"), unit("c")), "the idle two, oldest first");
    assert_eq!((first.delivery_count, second.delivery_count), (2, 2));
    assert_eq!(reserve_with(&fx, &r, "w2", ms(300)).await, ReserveReply::None, "the renewed one stays");
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&first, "w2"), row_of(&db, "w1"), row_of(&second, "w2")]);
    assert_all_stale(&fx, &r, "w1", &da).await;
    assert_all_stale(&fx, &r, "w1", &dc).await;
    finalize_ok(&fx, &r, "w1", &db).await;
    finalize_ok(&fx, &r, "w2", &first).await;
    finalize_ok(&fx, &r, "w2", &second).await;
    assert_eq!(progress(&fx, &r).await, counters(3, 3, 0, 0, 0));
}

/// A heartbeat replies `OK`, appends no event, keeps the delivery count (the
/// handle stays valid) and sets the worker's current unit.
pub async fn heartbeat_ok_keeps_the_fence(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(fx.queue.liveness(&r, &worker("w1"), None).await.unwrap(), LivenessReply::Ok);
    assert_eq!(worker_record(&fx, &r, "w1").await.current_unit, None);
    for _ in 0..3 {
        assert_eq!(fx.queue.heartbeat(&r, &worker("w1"), &d).await.unwrap(), Ack::Ok);
    }
    assert_eq!(worker_record(&fx, &r, "w1").await.current_unit, Some(unit("a")));
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&d, "w1")]);
    assert_eq!(type_names(&all_events(&fx, &r).await), ["delivered"]);
    assert_eq!(progress(&fx, &r).await, counters(2, 0, 0, 1, 1));
    finalize_ok(&fx, &r, "w1", &d).await;
}

/// `heartbeat_batch` answers and records exactly what heartbeating each item
/// in order would: each item is fenced on its own (another worker's delivery
/// is `STALE`, the rest are still renewed), a repeated item is renewed
/// twice, the worker's current unit is the last renewed item's, and no event
/// is appended. Renewed deliveries are not reclaimed; the stale one is.
pub async fn heartbeat_batch_matches_one_by_one(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], lenient()).await;
    let da = reserve(&fx, &r, "w1").await;
    let db = reserve(&fx, &r, "w1").await;
    let dc = reserve(&fx, &r, "w2").await;
    assert_eq!(fx.queue.liveness(&r, &worker("w1"), None).await.unwrap(), LivenessReply::Ok);
    fx.time.advance(ms(400)).await;
    let batch = [db.clone(), dc.clone(), da.clone(), db.clone()];
    let replies = fx.queue.heartbeat_batch(&r, &worker("w1"), &batch).await.unwrap();
    assert_eq!(replies, vec![Ack::Ok, Ack::Stale, Ack::Ok, Ack::Ok]);
    assert_eq!(worker_record(&fx, &r, "w1").await.current_unit, Some(unit("b")));
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&da, "w1"), row_of(&db, "w1"), row_of(&dc, "w2")]);
    assert_eq!(type_names(&all_events(&fx, &r).await), ["delivered", "delivered", "delivered"]);
    let got = delivered(reserve_with(&fx, &r, "w3", ms(300)).await);
    assert_eq!(got.unit, unit("c"));
    assert_eq!(got.origin, DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w2")) });
    assert_eq!(reserve_with(&fx, &r, "w3", ms(300)).await, ReserveReply::None);
    // A batch whose every item is stale changes nothing.
    let before = snapshot(&fx, &r).await;
    let stale = fx.queue.heartbeat_batch(&r, &worker("w2"), &[dc.clone(), da.clone()]).await.unwrap();
    assert_eq!(stale, vec![Ack::Stale, Ack::Stale]);
    assert_eq!(snapshot(&fx, &r).await, before);
    assert!(fx.queue.heartbeat_batch(&r, &worker("w1"), &[]).await.unwrap().is_empty());
    let missing = fx.queue.heartbeat_batch(&run("nope"), &worker("w1"), &[da.clone(), db.clone()]).await.unwrap();
    assert_eq!(missing, vec![Ack::Corrupt, Ack::Corrupt]);
    finalize_ok(&fx, &r, "w1", &da).await;
    finalize_ok(&fx, &r, "w1", &db).await;
}
