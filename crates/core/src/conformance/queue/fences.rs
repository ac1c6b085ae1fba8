//! The fence: every transition on a delivery the caller no longer owns is `STALE`.

use super::*;

/// Another worker's heartbeat, finalize, requeue and abandon are `STALE` and
/// change nothing (not even a worker record); the owner still holds it.
pub async fn fence_rejects_another_worker(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_all_stale(&fx, &r, "w2", &d).await;
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&d, "w1")]);
    let workers = fx.queue.workers(&r).await.unwrap();
    assert!(workers.iter().all(|w| w.worker != worker("w2")), "a stale reply made a worker record: {workers:?}");
    finalize_ok(&fx, &r, "w1", &d).await;
}

/// A handle with the wrong delivery count is `STALE`.
pub async fn fence_rejects_wrong_delivery_count(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    for count in [0, 2, 7] {
        let wrong = Delivery { delivery_count: count, ..d.clone() };
        assert_all_stale(&fx, &r, "w1", &wrong).await;
    }
    finalize_ok(&fx, &r, "w1", &d).await;
}

/// A handle naming an entry that is not pending, or the wrong stream, is `STALE`.
pub async fn fence_rejects_wrong_entry_or_stream(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let other_entry = Delivery { entry_id: EntryId::new(d.entry_id.ms, d.entry_id.seq + 1000), ..d.clone() };
    assert_all_stale(&fx, &r, "w1", &other_entry).await;
    let other_stream = Delivery { stream: StreamName::Priority, ..d.clone() };
    assert_all_stale(&fx, &r, "w1", &other_stream).await;
    finalize_ok(&fx, &r, "w1", &d).await;
}

/// A handle whose unit is not the unit of its entry is not the caller's:
/// swapping the unit of one pending delivery onto another's entry is `STALE`.
pub async fn fence_rejects_handle_with_another_units_entry(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let da = reserve(&fx, &r, "w1").await;
    let db = reserve(&fx, &r, "w1").await;
    let swapped = Delivery { unit: db.unit.clone(), ..da.clone() };
    assert_all_stale(&fx, &r, "w1", &swapped).await;
    finalize_ok(&fx, &r, "w1", &da).await;
    finalize_ok(&fx, &r, "w1", &db).await;
    assert_eq!(progress(&fx, &r).await, counters(2, 2, 0, 0, 0));
}

/// `finalize_batch` answers and records exactly what finalizing each item in
/// order would: a stale item in the middle is `STALE` and changes nothing,
/// and an item repeated within the batch is finalized once.
pub async fn finalize_batch_matches_one_by_one(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d"], lenient()).await;
    let da = reserve(&fx, &r, "w1").await;
    let db = reserve(&fx, &r, "w1").await;
    let dc = reserve(&fx, &r, "w2").await;
    let stale_c = dc.clone();
    let items =
        vec![(da.clone(), passed(10)), (stale_c, passed(11)), (db.clone(), passed(12)), (da.clone(), passed(13))];
    let replies = fx.queue.finalize_batch(&r, &worker("w1"), &items).await.unwrap();
    assert_eq!(replies, vec![Ack::Ok, Ack::Stale, Ack::Ok, Ack::Stale]);
    assert_eq!(progress(&fx, &r).await, counters(4, 2, 0, 1, 1));
    let finalized = events_of_type(&all_events(&fx, &r).await, "finalized");
    assert_eq!(finalized.len(), 2);
    assert_eq!(finalized[0].unit_id(), Some(&unit("a")));
    assert_eq!(finalized[1].unit_id(), Some(&unit("b")));
    match &finalized[1] {
        Event::Finalized { duration_ms, .. } => assert_eq!(*duration_ms, 12),
        other => panic!("expected a finalized event, got {other:?}"),
    }
    let rec = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec.current_unit, rec.processed), (None, 2));
    let none = fx.queue.finalize_batch(&r, &worker("w1"), &[]).await.unwrap();
    assert!(none.is_empty());
    let missing = fx.queue.finalize_batch(&run("nope"), &worker("w1"), &[(dc.clone(), passed(1))]).await.unwrap();
    assert_eq!(missing, vec![Ack::Corrupt]);
}

/// After a delivery is finalized every transition on it is `STALE`: a double
/// finalize never counts twice.
pub async fn transitions_after_finalize_are_stale(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    finalize_ok(&fx, &r, "w1", &d).await;
    assert_all_stale(&fx, &r, "w1", &d).await;
    assert_eq!(progress(&fx, &r).await, counters(2, 1, 0, 0, 1));
    assert_eq!(events_of_type(&all_events(&fx, &r).await, "finalized").len(), 1);
    assert_eq!(worker_record(&fx, &r, "w1").await.processed, 1);
}
