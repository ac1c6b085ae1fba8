//! `reserve` and `reserve_batch`: stream order and delivery events.

use super::*;

/// The main stream hands each unit out once, in the initial order (not sorted),
/// with its kind, delivery count 1 and origin `Fresh`; then `NONE`.
pub async fn reserve_main_stream_in_initial_order(fx: Fixture) {
    let mut s = spec(RUN, &["c", "a", "b"], lenient());
    s.units[1].kind = "test".into();
    s.units[2].kind = String::new();
    let r = init_spec(&fx, &s).await;
    let mut last: Option<EntryId> = None;
    for (u, kind) in [("c", "file"), ("a", "test"), ("b", "")] {
        let d = reserve(&fx, &r, "w1").await;
        assert_eq!(d, fresh_delivery(u, kind, StreamName::Main, d.entry_id, 0));
        assert_eq!(d.ownership_generation(), 1);
        if let Some(prev) = last {
            assert!(d.entry_id > prev, "entries in stream order");
        }
        last = Some(d.entry_id);
    }
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
    assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None);
    assert_eq!(progress(&fx, &r).await, counters(3, 0, 0, 3, 0));
}

/// A requeued unit (priority stream) is handed out before the rest of the
/// main stream.
pub async fn reserve_reads_priority_before_main(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "flaky").await, RequeueReply::Requeued { retry_index: 1 });
    let again = reserve(&fx, &r, "w2").await;
    assert_eq!(again, fresh_delivery("a", "file", StreamName::Priority, again.entry_id, 1));
    assert_eq!(again.ownership_generation(), 2);
    for u in ["b", "c"] {
        let d = reserve(&fx, &r, "w2").await;
        assert_eq!(d, fresh_delivery(u, "file", StreamName::Main, d.entry_id, 0));
    }
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
}

/// A fresh delivery appends a `delivered` event with the stream, entry,
/// delivery count and generation, and sets the worker's current unit.
pub async fn reserve_appends_delivered_event(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let events = all_events(&fx, &r).await;
    assert_eq!(events.len(), 1);
    let ev = &events[0];
    assert_eq!(
        *ev,
        Event::Delivered {
            header: header("a", "w1", 0, 0, ev.at_ms()),
            stream: StreamName::Main,
            entry_id: d.entry_id,
            delivery_count: 1
        }
    );
    let rec = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec.current_unit, rec.processed), (Some(unit("a")), 0));

    assert_eq!(requeue_as(&fx, &r, "w1", &d, "x").await, RequeueReply::Requeued { retry_index: 1 });
    let d2 = reserve(&fx, &r, "w2").await;
    let ev = last_event(&fx, &r).await;
    assert_eq!(
        ev,
        Event::Delivered {
            header: header("a", "w2", 1, 0, ev.at_ms()),
            stream: StreamName::Priority,
            entry_id: d2.entry_id,
            delivery_count: 1
        }
    );
    let rec = worker_record(&fx, &r, "w2").await;
    assert_eq!((rec.current_unit, rec.processed), (Some(unit("a")), 0));
}

/// `reserve_batch` hands out up to `max` units in order and stops at `NONE`
/// (a batch of zero cannot be asked for: `max` is a `NonZeroUsize`).
pub async fn reserve_batch_hands_out_up_to_max(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d", "e"], lenient()).await;
    let w1 = worker("w1");
    let first = fx.queue.reserve_batch(&r, &w1, batch(3), LONG).await.unwrap();
    let units: Vec<&str> = first.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units, ["a", "b", "c"]);
    assert!(first.exhausted.is_empty() && !first.corrupt);
    for d in &first.deliveries {
        assert_eq!(*d, fresh_delivery(d.unit.as_str(), "file", StreamName::Main, d.entry_id, 0));
    }
    let second = fx.queue.reserve_batch(&r, &worker("w2"), batch(10), LONG).await.unwrap();
    let units: Vec<&str> = second.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units, ["d", "e"]);
    assert!(second.exhausted.is_empty() && !second.corrupt);
    let third = fx.queue.reserve_batch(&r, &w1, batch(5), LONG).await.unwrap();
    assert_eq!(third, Default::default());
    assert_eq!(progress(&fx, &r).await, counters(5, 0, 0, 5, 0));
    assert_eq!(events_of_type(&all_events(&fx, &r).await, "delivered").len(), 5);
}
