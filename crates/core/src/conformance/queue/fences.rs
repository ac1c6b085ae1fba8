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

/// A batch of every other entry finalizes only its own: the entries between
/// them (another worker's, and the caller's own that the batch does not
/// name) stay pending on their owners, and a handle in the batch naming
/// another worker's entry is `STALE`.
pub async fn finalize_batch_passes_over_entries_between_its_own(fx: Fixture) {
    let names: Vec<String> = (0..12).map(|i| format!("u{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let r = init(&fx, &names, lenient()).await;
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..12 {
        let w = if i % 3 == 1 { "w2" } else { "w1" };
        let d = reserve(&fx, &r, w).await;
        if w == "w1" {
            mine.push(d)
        } else {
            theirs.push(d)
        }
    }
    // Every other of w1's entries, and one of w2's in the middle.
    let mut items: Vec<(Delivery, FinalizeRequest)> = mine.iter().step_by(2).map(|d| (d.clone(), passed(5))).collect();
    items.insert(2, (theirs[1].clone(), passed(5)));
    let replies = fx.queue.finalize_batch(&r, &worker("w1"), &items).await.unwrap();
    let mut expected = vec![Ack::Ok; items.len()];
    expected[2] = Ack::Stale;
    assert_eq!(replies, expected);
    let skipped: Vec<&Delivery> = mine.iter().skip(1).step_by(2).collect();
    let mut left: Vec<PendingRow> =
        skipped.iter().map(|d| row_of(d, "w1")).chain(theirs.iter().map(|d| row_of(d, "w2"))).collect();
    left.sort_by_key(|row| row.2);
    let mut pending = pending_rows(&fx, &r).await;
    pending.sort_by_key(|row| row.2);
    assert_eq!(pending, left);
    assert_eq!(progress(&fx, &r).await, counters(12, 4, 0, 8, 0));
    for d in skipped {
        finalize_ok(&fx, &r, "w1", d).await;
    }
    for d in &theirs {
        finalize_ok(&fx, &r, "w2", d).await;
    }
    assert_eq!(progress(&fx, &r).await, counters(12, 12, 0, 0, 0));
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
