//! Conformance cases for [`UnitQueue::release`](crate::UnitQueue::release):
//! handing a delivery back at once, with no budget spent.

use super::*;

/// The new priority entry of a `released` event.
fn released_entry(event: &Event) -> EntryId {
    match event {
        Event::Released { new_entry_id, .. } => *new_entry_id,
        other => panic!("expected a released event, got {other:?}"),
    }
}

/// A release puts the unit on the priority stream under a new entry, appends
/// a `released` event, fences off the old handle and spends nothing: with
/// every budget at zero, the unit can be released again and again and still
/// be delivered fresh, then finalized.
pub async fn release_hands_the_unit_back_without_budget(fx: Fixture) {
    let r = init(&fx, &["a", "b"], budgets(0, 0.0, 0)).await;
    let mut d = reserve(&fx, &r, "w1").await;
    for round in 0..3 {
        assert_eq!(fx.queue.release(&r, &worker("w1"), &d).await.unwrap(), Ack::Ok, "round {round}");
        let ev = last_event(&fx, &r).await;
        let new_entry = released_entry(&ev);
        assert_eq!(
            ev,
            Event::Released {
                header: header("a", "w1", 0, 0, ev.at_ms()),
                stream: d.stream,
                entry_id: d.entry_id,
                new_entry_id: new_entry,
            }
        );
        assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 0, false));
        assert_eq!(progress(&fx, &r).await, counters(2, 0, 0, 0, 2));
        assert!(pending_rows(&fx, &r).await.is_empty());
        let rec = worker_record(&fx, &r, "w1").await;
        assert_eq!((rec.current_unit, rec.processed), (None, 0));
        assert_all_stale(&fx, &r, "w1", &d).await;
        // Priority before main: the released unit comes back first.
        d = reserve(&fx, &r, "w1").await;
        assert_eq!(d, fresh_delivery("a", "file", StreamName::Priority, new_entry, 0));
    }
    finalize_ok(&fx, &r, "w1", &d).await;
    let b = reserve(&fx, &r, "w1").await;
    assert_eq!(b.unit, unit("b"));
    finalize_ok(&fx, &r, "w1", &b).await;
    assert_eq!(progress(&fx, &r).await, counters(2, 2, 0, 0, 0));
    let types = type_names(&all_events(&fx, &r).await);
    assert_eq!(types.iter().filter(|t| **t == "released").count(), 3);
    assert_eq!(types.iter().filter(|t| **t == "finalized").count(), 2);
}

/// A release keeps the counts the unit has: a reclaimed, then requeued unit
/// is released and delivered again with the same retry index and reclaim
/// count; the previous owner's handles stay fenced off.
pub async fn release_keeps_retry_and_reclaim_counts(fx: Fixture) {
    let r = init(&fx, &["a"], budgets(2, 1.0, 1)).await;
    let first = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let taken = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!((taken.reclaim_count, taken.delivery_count), (1, 2));
    assert_eq!(fx.queue.release(&r, &worker("w2"), &taken).await.unwrap(), Ack::Ok);
    let ev = last_event(&fx, &r).await;
    assert_eq!(ev.header(), Some(&header("a", "w2", 0, 1, ev.at_ms())));
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 1, false));
    assert_all_stale(&fx, &r, "w1", &first).await;
    assert_all_stale(&fx, &r, "w2", &taken).await;

    let again = reserve(&fx, &r, "w3").await;
    assert_eq!(
        (again.stream, again.delivery_count, again.retry_index, again.reclaim_count),
        (StreamName::Priority, 1, 0, 1)
    );
    assert_eq!(again.origin, DeliveryOrigin::Fresh);
    assert_eq!(requeue_as(&fx, &r, "w3", &again, "f").await, RequeueReply::Requeued { retry_index: 1 });
    let retried = reserve(&fx, &r, "w3").await;
    assert_eq!(fx.queue.release(&r, &worker("w3"), &retried).await.unwrap(), Ack::Ok);
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(1, 1, true));
    let last = reserve(&fx, &r, "w1").await;
    assert_eq!((last.retry_index, last.reclaim_count, last.ownership_generation()), (1, 1, 3));
    assert_eq!(progress(&fx, &r).await, counters(1, 0, 1, 1, 0));
    finalize_ok(&fx, &r, "w1", &last).await;
}

/// `release_batch` answers and records exactly what releasing each item in
/// order would: another worker's delivery is `STALE`, an item repeated within
/// the batch is released once, and the units come back in the batch's order.
pub async fn release_batch_matches_one_by_one(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d"], lenient()).await;
    let da = reserve(&fx, &r, "w1").await;
    let db = reserve(&fx, &r, "w1").await;
    let dc = reserve(&fx, &r, "w2").await;
    let batch = vec![da.clone(), dc.clone(), db.clone(), da.clone()];
    let replies = fx.queue.release_batch(&r, &worker("w1"), &batch).await.unwrap();
    assert_eq!(replies, vec![Ack::Ok, Ack::Stale, Ack::Ok, Ack::Stale]);
    assert_eq!(progress(&fx, &r).await, counters(4, 0, 0, 1, 3));
    let released = events_of_type(&all_events(&fx, &r).await, "released");
    let units: Vec<_> = released.iter().map(|e| e.unit_id().cloned()).collect();
    assert_eq!(units, vec![Some(unit("a")), Some(unit("b"))]);
    let rec = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec.current_unit, rec.processed), (None, 0));
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&dc, "w2")]);
    for (event, u) in released.iter().zip(["a", "b"]) {
        let next = reserve(&fx, &r, "w3").await;
        assert_eq!(next, fresh_delivery(u, "file", StreamName::Priority, released_entry(event), 0));
    }
    assert!(fx.queue.release_batch(&r, &worker("w1"), &[]).await.unwrap().is_empty());
    let missing = fx.queue.release_batch(&run("nope"), &worker("w1"), &[da.clone(), db.clone()]).await.unwrap();
    assert_eq!(missing, vec![Ack::Corrupt; 2]);
}
