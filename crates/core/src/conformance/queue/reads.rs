//! `CORRUPT` replies and the read calls.

use super::*;

/// Every transition on a run that does not exist replies `CORRUPT` (not an
/// error) and creates nothing, even while another run exists.
pub async fn transitions_on_missing_run_are_corrupt(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let before = snapshot(&fx, &r).await;
    let ghost = run("ghost");
    assert_all_corrupt(&fx, &ghost, "w1", &ghost_delivery("a")).await;
    assert_all_corrupt(&fx, &ghost, "w1", &d).await;
    assert_eq!(snapshot(&fx, &r).await, before);
}

/// Progress tracks total, finalized, requeued units, in flight and queued
/// through each transition.
pub async fn progress_tracks_every_counter(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d"], lenient()).await;
    assert_eq!(progress(&fx, &r).await, counters(4, 0, 0, 0, 4));
    let a = reserve(&fx, &r, "w1").await;
    assert_eq!(progress(&fx, &r).await, counters(4, 0, 0, 1, 3));
    let b = reserve(&fx, &r, "w2").await;
    assert_eq!(progress(&fx, &r).await, counters(4, 0, 0, 2, 2));
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "f").await, RequeueReply::Requeued { retry_index: 1 });
    assert_eq!(progress(&fx, &r).await, counters(4, 0, 1, 1, 3));
    finalize_ok(&fx, &r, "w2", &b).await;
    assert_eq!(progress(&fx, &r).await, counters(4, 1, 1, 0, 3));
    let a2 = reserve(&fx, &r, "w1").await;
    assert_eq!(a2.stream, StreamName::Priority);
    assert_eq!(progress(&fx, &r).await, counters(4, 1, 1, 1, 2));
    finalize_ok(&fx, &r, "w1", &a2).await;
    assert_eq!(progress(&fx, &r).await, counters(4, 2, 1, 0, 2));
}

/// Pending deliveries are listed priority stream first, then in entry order,
/// with their worker, delivery count and an idle time that grows with time.
pub async fn pending_lists_priority_first_in_entry_order(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], lenient()).await;
    let da = reserve(&fx, &r, "w1").await;
    let db = reserve(&fx, &r, "w2").await;
    let dc = reserve(&fx, &r, "w1").await;
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&da, "w1"), row_of(&db, "w2"), row_of(&dc, "w1")]);
    assert_eq!(requeue_as(&fx, &r, "w2", &db, "f").await, RequeueReply::Requeued { retry_index: 1 });
    let db2 = reserve(&fx, &r, "w3").await;
    assert_eq!(db2.stream, StreamName::Priority);
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&db2, "w3"), row_of(&da, "w1"), row_of(&dc, "w1")]);
    fx.time.advance(ms(300)).await;
    for p in fx.queue.pending(&r).await.unwrap() {
        assert!(p.idle_ms >= 250, "idle time grows with the clock: {p:?}");
    }
}

/// `units`, `budgets` and `unit_state` read back what was initialised; unknown
/// runs and units read as empty / `None`.
pub async fn reads_report_units_states_and_budgets(fx: Fixture) {
    let mut s = spec(RUN, &["z", "y", "x"], budgets(4, 0.3, 6));
    s.units[0].kind = "test".into();
    let r = init_spec(&fx, &s).await;
    assert_eq!(fx.queue.units(&r).await.unwrap(), s.units);
    assert_eq!(fx.queue.budgets(&r).await.unwrap(), Some(budgets(4, 0.3, 6)));
    for u in ["x", "y", "z"] {
        assert_eq!(state_of(&fx, &r, u).await, unit_state(0, 0, false));
    }
    assert_eq!(fx.queue.unit_state(&r, &unit("nope")).await.unwrap(), None);
    assert!(fx.queue.workers(&r).await.unwrap().is_empty());
    assert!(fx.queue.pending(&r).await.unwrap().is_empty());
    assert!(event_records(&fx, &r).await.is_empty());
    assert_eq!(progress(&fx, &r).await, counters(3, 0, 0, 0, 3));
    let ghost = run("ghost");
    assert_run_absent(&fx, &ghost).await;
    assert_eq!(fx.queue.unit_state(&ghost, &unit("x")).await.unwrap(), None);
    assert!(event_records(&fx, &ghost).await.is_empty());
}
