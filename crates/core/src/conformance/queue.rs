//! Conformance cases for [`UnitQueue`](crate::UnitQueue).
//!
//! Each case follows the seed's `transition.lua` reply by reply, adapted to
//! the trait. Entry ids and timestamps differ between backends, so cases
//! compare them only with each other (taking them from the store's own
//! replies), never with literals.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::support::*;
use super::{Fixture, LONG};
use crate::errors::{QueueError, SpecError};
use crate::events::Event;
use crate::ids::{EntryId, UnitId};
use crate::queue::{
    Ack, Budgets, Delivery, DeliveryOrigin, FinalizeReason, FinalizeRequest, InitOutcome, LivenessReply, Outcome,
    RequeueReply, RequeueRequest, ReserveReply, RunSpec, StreamName, MAX_KIND_LEN, MAX_SUMMARY_LEN,
};

// ---------------------------------------------------------------------------
// initialize
// ---------------------------------------------------------------------------

/// The first `initialize` creates the run; a second with the same units (in
/// another order, with other budgets) is told it already exists and gets the
/// frozen budgets; the run keeps the first caller's order.
pub async fn initialize_first_caller_wins(fx: Fixture) {
    let first = spec(RUN, &["a", "b"], Budgets::default());
    assert_eq!(fx.queue.initialize(&first).await.unwrap(), InitOutcome::Initialized);
    let second = spec(RUN, &["b", "a"], budgets(9, 0.9, 9));
    assert_eq!(
        fx.queue.initialize(&second).await.unwrap(),
        InitOutcome::AlreadyInitialized { budgets: Budgets::default() }
    );
    assert_eq!(
        fx.queue.initialize(&first).await.unwrap(),
        InitOutcome::AlreadyInitialized { budgets: Budgets::default() }
    );
    assert_eq!(fx.queue.budgets(&first.run).await.unwrap(), Some(Budgets::default()));
    assert_eq!(fx.queue.units(&first.run).await.unwrap(), first.units);
    assert_eq!(progress(&fx, &first.run).await, counters(2, 0, 0, 0, 2));
    assert_eq!(event_count(&fx, &first.run).await, 0, "initialize appends no event");
    let d = reserve(&fx, &first.run, "w1").await;
    assert_eq!(d.unit, unit("a"));
}

/// Budgets frozen by the first caller are the ones enforced, whatever later
/// callers pass.
pub async fn initialize_frozen_budgets_are_enforced(fx: Fixture) {
    let frozen = budgets(0, 1.0, 2);
    let r = init(&fx, &["a", "b"], frozen).await;
    let later = spec(RUN, &["a", "b"], budgets(5, 1.0, 5));
    assert_eq!(fx.queue.initialize(&later).await.unwrap(), InitOutcome::AlreadyInitialized { budgets: frozen });
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &d, "boom").await, RequeueReply::Finalized { retry_index: 0 });
    assert_eq!(fx.queue.budgets(&r).await.unwrap(), Some(frozen));
}

/// Re-initialising a run with another unit list (more, fewer, other ids, other
/// kinds) is `UnitListMismatch` and changes nothing.
pub async fn initialize_unit_list_mismatch_changes_nothing(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let before = snapshot(&fx, &r).await;
    let mut other_kind = spec(RUN, &["a", "b"], lenient());
    other_kind.units[1].kind = "test".into();
    let others: Vec<(RunSpec, u64)> = vec![
        (spec(RUN, &["a", "b", "c"], budgets(3, 0.5, 3)), 3),
        (spec(RUN, &["a"], lenient()), 1),
        (spec(RUN, &["a", "x"], lenient()), 2),
        (other_kind, 2),
    ];
    for (other, given_units) in others {
        match fx.queue.initialize(&other).await {
            Err(QueueError::UnitListMismatch { run: got_run, existing, given }) => {
                assert_eq!(got_run, r);
                assert_eq!(existing, 2);
                assert_eq!(given, given_units);
            }
            reply => panic!("expected UnitListMismatch for {:?}, got {reply:?}", other.units),
        }
    }
    assert_eq!(snapshot(&fx, &r).await, before);
    finalize_ok(&fx, &r, "w1", &d).await;
}

/// Invalid specs are `QueueError::Spec` and write nothing: afterwards the run
/// does not exist and a valid spec still initialises it.
pub async fn initialize_rejects_invalid_specs(fx: Fixture) {
    type Check = fn(&SpecError) -> bool;
    let good = spec(RUN, &["a", "b"], lenient());
    let mut empty = good.clone();
    empty.units.clear();
    let mut zero_ttl = good.clone();
    zero_ttl.ttl = Duration::ZERO;
    let mut sub_ms_ttl = good.clone();
    sub_ms_ttl.ttl = Duration::from_micros(500);
    let mut long_kind = good.clone();
    long_kind.units[0].kind = "k".repeat(MAX_KIND_LEN + 1);
    let checks: Vec<(RunSpec, Check)> = vec![
        (empty, |e| matches!(e, SpecError::NoUnits { .. })),
        (
            spec(RUN, &["a", "b", "a"], lenient()),
            |e| matches!(e, SpecError::DuplicateUnit { unit, .. } if unit.as_str() == "a"),
        ),
        (spec(RUN, &["a"], budgets(1, f64::NAN, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (spec(RUN, &["a"], budgets(1, -0.1, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (spec(RUN, &["a"], budgets(1, 1.5, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (spec(RUN, &["a"], budgets(1, f64::INFINITY, 1)), |e| matches!(e, SpecError::BadTolerance { .. })),
        (zero_ttl, |e| matches!(e, SpecError::ZeroTtl { .. })),
        (sub_ms_ttl, |e| matches!(e, SpecError::ZeroTtl { .. })),
        (long_kind, |e| matches!(e, SpecError::KindTooLong { .. })),
    ];
    for (bad, expected) in checks {
        match fx.queue.initialize(&bad).await {
            Err(QueueError::Spec(e)) => assert!(expected(&e), "wrong spec error {e:?} for {bad:?}"),
            reply => panic!("expected a spec error for {bad:?}, got {reply:?}"),
        }
        assert_run_absent(&fx, &good.run).await;
        assert_eq!(event_count(&fx, &good.run).await, 0);
    }
    assert_eq!(fx.queue.initialize(&good).await.unwrap(), InitOutcome::Initialized);
    assert_eq!(progress(&fx, &good.run).await, counters(2, 0, 0, 0, 2));
}

/// An invalid spec for a run that exists is still a spec error, and the run
/// is left as it was.
pub async fn initialize_invalid_spec_on_existing_run_changes_nothing(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    reserve(&fx, &r, "w1").await;
    let before = snapshot(&fx, &r).await;
    let nan = spec(RUN, &["a", "b"], budgets(1, f64::NAN, 2));
    assert!(matches!(fx.queue.initialize(&nan).await, Err(QueueError::Spec(SpecError::BadTolerance { .. }))));
    let dup = spec(RUN, &["a", "b", "b"], lenient());
    assert!(matches!(fx.queue.initialize(&dup).await, Err(QueueError::Spec(SpecError::DuplicateUnit { .. }))));
    assert_eq!(snapshot(&fx, &r).await, before);
}

/// Eight concurrent initialisations of one run elect exactly one leader, and
/// every other caller gets the leader's budgets.
pub async fn initialize_concurrent_callers_elect_one_leader(fx: Fixture) {
    let names = unit_names(20);
    let base = spec(RUN, &as_strs(&names), lenient());
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let queue = fx.queue.clone();
        let mut s = base.clone();
        s.budgets.max_requeues = i;
        tasks.push(tokio::spawn(async move { (i, queue.initialize(&s).await.unwrap()) }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let leaders: Vec<u32> = outcomes.iter().filter(|(_, o)| *o == InitOutcome::Initialized).map(|(i, _)| *i).collect();
    assert_eq!(leaders.len(), 1, "exactly one leader: {outcomes:?}");
    let frozen = Budgets { max_requeues: leaders[0], ..lenient() };
    for (i, outcome) in &outcomes {
        if *i != leaders[0] {
            assert_eq!(*outcome, InitOutcome::AlreadyInitialized { budgets: frozen });
        }
    }
    assert_eq!(fx.queue.budgets(&base.run).await.unwrap(), Some(frozen));
    assert_eq!(progress(&fx, &base.run).await, counters(20, 0, 0, 0, 20));
    assert_eq!(fx.queue.units(&base.run).await.unwrap(), base.units);
}

// ---------------------------------------------------------------------------
// reserve
// ---------------------------------------------------------------------------

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

/// `reserve_batch` hands out up to `max` units in order, stops at `NONE`, and
/// rejects a batch of zero.
pub async fn reserve_batch_hands_out_up_to_max(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d", "e"], lenient()).await;
    let w1 = worker("w1");
    assert!(matches!(fx.queue.reserve_batch(&r, &w1, 0, LONG).await, Err(QueueError::Spec(SpecError::ZeroBatch))));
    let first = fx.queue.reserve_batch(&r, &w1, 3, LONG).await.unwrap();
    let units: Vec<&str> = first.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units, ["a", "b", "c"]);
    assert!(first.exhausted.is_empty() && !first.corrupt);
    for d in &first.deliveries {
        assert_eq!(*d, fresh_delivery(d.unit.as_str(), "file", StreamName::Main, d.entry_id, 0));
    }
    let second = fx.queue.reserve_batch(&r, &worker("w2"), 10, LONG).await.unwrap();
    let units: Vec<&str> = second.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units, ["d", "e"]);
    assert!(second.exhausted.is_empty() && !second.corrupt);
    let third = fx.queue.reserve_batch(&r, &w1, 5, LONG).await.unwrap();
    assert_eq!(third, Default::default());
    assert_eq!(progress(&fx, &r).await, counters(5, 0, 0, 5, 0));
    assert_eq!(events_of_type(&all_events(&fx, &r).await, "delivered").len(), 5);
}

// ---------------------------------------------------------------------------
// fences
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// requeue
// ---------------------------------------------------------------------------

/// A requeue puts the unit on the priority stream under a new entry, appends
/// a `requeued` event with every field, and fences off the old handle.
pub async fn requeue_puts_unit_on_priority_stream(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let req = RequeueRequest {
        duration_ms: 250,
        failure_summary: Some("assertion failed: left == right".into()),
        errors: Some(json!({ "failures": [{ "name": "t1", "message": "boom" }], "count": 1 })),
    };
    let reply = fx.queue.requeue(&r, &worker("w1"), &d, &req).await.unwrap();
    assert_eq!(reply, RequeueReply::Requeued { retry_index: 1 });
    let ev = last_event(&fx, &r).await;
    let new_entry = match &ev {
        Event::Requeued { new_entry_id, .. } => *new_entry_id,
        other => panic!("expected a requeued event, got {other:?}"),
    };
    assert_eq!(
        ev,
        Event::Requeued {
            header: header("a", "w1", 1, 0, ev.at_ms()),
            previous_retry_index: 0,
            duration_ms: 250,
            failure_summary: req.failure_summary.clone(),
            errors: req.errors.clone(),
            stream: StreamName::Main,
            entry_id: d.entry_id,
            new_entry_id: new_entry,
        }
    );
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(1, 0, true));
    assert_eq!(progress(&fx, &r).await, counters(2, 0, 1, 0, 2));
    assert!(pending_rows(&fx, &r).await.is_empty());
    let rec = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec.current_unit, rec.processed), (None, 1));
    assert_all_stale(&fx, &r, "w1", &d).await;
    let again = reserve(&fx, &r, "w2").await;
    assert_eq!(again, fresh_delivery("a", "file", StreamName::Priority, new_entry, 1));
}

/// Past the per-unit cap (`retry_index + 1 > max_requeues`) a requeue
/// finalizes the unit as failed (`retry_budget_exhausted`), with the failure
/// in the finalized event.
pub async fn requeue_over_unit_cap_finalizes_failed(fx: Fixture) {
    let r = init(&fx, &["a", "b"], budgets(2, 1.0, 2)).await;
    let d0 = reserve(&fx, &r, "w1").await;
    let reply = fx.queue.requeue(&r, &worker("w1"), &d0, &RequeueRequest::default()).await.unwrap();
    assert_eq!(reply, RequeueReply::Requeued { retry_index: 1 });
    match last_event(&fx, &r).await {
        Event::Requeued { failure_summary, errors, duration_ms, previous_retry_index, .. } => {
            assert_eq!((failure_summary, errors, duration_ms, previous_retry_index), (None, None, 0, 0));
        }
        other => panic!("expected a requeued event, got {other:?}"),
    }
    let d1 = reserve(&fx, &r, "w1").await;
    assert_eq!((d1.unit.as_str(), d1.retry_index), ("a", 1));
    assert_eq!(requeue_as(&fx, &r, "w1", &d1, "again").await, RequeueReply::Requeued { retry_index: 2 });
    let d2 = reserve(&fx, &r, "w1").await;
    assert_eq!((d2.unit.as_str(), d2.retry_index, d2.stream), ("a", 2, StreamName::Priority));
    let req = failure("final");
    assert_eq!(
        fx.queue.requeue(&r, &worker("w1"), &d2, &req).await.unwrap(),
        RequeueReply::Finalized { retry_index: 2 }
    );
    let ev = last_event(&fx, &r).await;
    assert_eq!(
        ev,
        Event::Finalized {
            header: header("a", "w1", 2, 0, ev.at_ms()),
            outcome: Outcome::Failed,
            duration_ms: req.duration_ms,
            reason: Some(FinalizeReason::RetryBudgetExhausted),
            errors: req.errors.clone(),
            stream: StreamName::Priority,
            entry_id: d2.entry_id,
            previous_worker_id: None,
            delivery_count: None,
            failure_summary: Some("final".into()),
        }
    );
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(2, 0, true));
    assert_eq!(progress(&fx, &r).await, counters(2, 1, 1, 0, 1));
    assert!(pending_rows(&fx, &r).await.is_empty());
    let rec = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec.current_unit, rec.processed), (None, 3));
    assert_all_stale(&fx, &r, "w1", &d2).await;
    assert_eq!(reserve(&fx, &r, "w1").await.unit, unit("b"));
    assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None);
}

/// With `max_requeues` 0 the first requeue finalizes the unit.
pub async fn requeue_with_zero_max_requeues_finalizes_first(fx: Fixture) {
    let r = init(&fx, &["a", "b"], budgets(0, 1.0, 2)).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &d, "x").await, RequeueReply::Finalized { retry_index: 0 });
    let ev = last_event(&fx, &r).await;
    assert_eq!(
        ev,
        Event::Finalized {
            header: header("a", "w1", 0, 0, ev.at_ms()),
            outcome: Outcome::Failed,
            duration_ms: 10,
            reason: Some(FinalizeReason::RetryBudgetExhausted),
            errors: failure("x").errors,
            stream: StreamName::Main,
            entry_id: d.entry_id,
            previous_worker_id: None,
            delivery_count: None,
            failure_summary: Some("x".into()),
        }
    );
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 0, false));
    assert_eq!(progress(&fx, &r).await, counters(2, 1, 0, 0, 1));
}

/// 10 units × tolerance 0.7: exactly 7 distinct units may be requeued; the
/// 8th (and later) first requeue finalizes the unit.
pub async fn requeue_tolerance_caps_distinct_units(fx: Fixture) {
    let names = unit_names(10);
    let r = init(&fx, &as_strs(&names), budgets(3, 0.7, 2)).await;
    let mut ds = Vec::new();
    for _ in 0..10 {
        ds.push(reserve(&fx, &r, "w1").await);
    }
    for (i, d) in ds.iter().enumerate() {
        let reply = requeue_as(&fx, &r, "w1", d, "f").await;
        if i < 7 {
            assert_eq!(reply, RequeueReply::Requeued { retry_index: 1 }, "unit {i}");
        } else {
            assert_eq!(reply, RequeueReply::Finalized { retry_index: 0 }, "unit {i}");
        }
    }
    assert_eq!(progress(&fx, &r).await, counters(10, 3, 7, 0, 7));
    let events = all_events(&fx, &r).await;
    for (i, name) in names.iter().enumerate() {
        if i < 7 {
            assert_eq!(state_of(&fx, &r, name).await, unit_state(1, 0, true));
        } else {
            assert_eq!(state_of(&fx, &r, name).await, unit_state(0, 0, false));
            match finalized_event_of(&events, name) {
                Event::Finalized { reason, outcome, .. } => {
                    assert_eq!((reason, outcome), (Some(FinalizeReason::RetryBudgetExhausted), Outcome::Failed));
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

/// 100 units × 0.7 allows 70 requeued units, not 71 (the seed's epsilon).
pub async fn requeue_tolerance_uses_seed_epsilon(fx: Fixture) {
    let names = unit_names(100);
    let r = init(&fx, &as_strs(&names), budgets(1, 0.7, 2)).await;
    let mut ds = Vec::new();
    for _ in 0..100 {
        ds.push(reserve(&fx, &r, "w1").await);
    }
    for (i, d) in ds.iter().enumerate() {
        if i < 70 {
            assert_eq!(requeue_as(&fx, &r, "w1", d, "f").await, RequeueReply::Requeued { retry_index: 1 }, "unit {i}");
        } else if i == 70 {
            assert_eq!(requeue_as(&fx, &r, "w1", d, "f").await, RequeueReply::Finalized { retry_index: 0 }, "unit {i}");
        } else {
            finalize_ok(&fx, &r, "w1", d).await;
        }
    }
    assert_eq!(progress(&fx, &r).await, counters(100, 30, 70, 0, 70));
}

/// A unit already in retry may requeue again after the run's tolerance is
/// used up, as long as its own cap allows.
pub async fn requeue_of_unit_in_retry_ignores_used_tolerance(fx: Fixture) {
    // ceil(4 × 0.25) = 1 unit may be requeued.
    let r = init(&fx, &["a", "b", "c", "d"], budgets(3, 0.25, 2)).await;
    let a = reserve(&fx, &r, "w1").await;
    let b = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "f").await, RequeueReply::Requeued { retry_index: 1 });
    assert_eq!(requeue_as(&fx, &r, "w1", &b, "f").await, RequeueReply::Finalized { retry_index: 0 });
    for next in [2, 3] {
        let again = reserve(&fx, &r, "w1").await;
        assert_eq!((again.unit.as_str(), again.stream), ("a", StreamName::Priority));
        assert_eq!(requeue_as(&fx, &r, "w1", &again, "f").await, RequeueReply::Requeued { retry_index: next });
    }
    let last = reserve(&fx, &r, "w1").await;
    assert_eq!((last.unit.as_str(), last.retry_index), ("a", 3));
    assert_eq!(requeue_as(&fx, &r, "w1", &last, "f").await, RequeueReply::Finalized { retry_index: 3 });
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(3, 0, true));
    assert_eq!(progress(&fx, &r).await, counters(4, 2, 1, 0, 2));
}

/// With tolerance 0 no unit may be requeued at all.
pub async fn requeue_with_zero_tolerance_finalizes(fx: Fixture) {
    let r = init(&fx, &["a", "b"], budgets(5, 0.0, 2)).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &d, "f").await, RequeueReply::Finalized { retry_index: 0 });
    match last_event(&fx, &r).await {
        Event::Finalized { reason, failure_summary, .. } => {
            assert_eq!(reason, Some(FinalizeReason::RetryBudgetExhausted));
            assert_eq!(failure_summary.as_deref(), Some("f"));
        }
        other => panic!("expected a finalized event, got {other:?}"),
    }
    assert_eq!(progress(&fx, &r).await, counters(2, 1, 0, 0, 1));
}

/// `requeued_units` counts distinct units (a second requeue of one unit does
/// not count), and the cap is `ceil(total × tolerance)`: 3 × 0.5 → 2.
pub async fn requeued_units_counts_each_unit_once(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], budgets(3, 0.5, 2)).await;
    let a = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "f").await, RequeueReply::Requeued { retry_index: 1 });
    assert_eq!(progress(&fx, &r).await.requeued_units, 1);
    let a = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "f").await, RequeueReply::Requeued { retry_index: 2 });
    assert_eq!(progress(&fx, &r).await.requeued_units, 1);
    let a = reserve(&fx, &r, "w1").await;
    let b = reserve(&fx, &r, "w1").await;
    let c = reserve(&fx, &r, "w1").await;
    assert_eq!((a.unit.as_str(), b.unit.as_str(), c.unit.as_str()), ("a", "b", "c"));
    assert_eq!(requeue_as(&fx, &r, "w1", &b, "f").await, RequeueReply::Requeued { retry_index: 1 });
    assert_eq!(progress(&fx, &r).await.requeued_units, 2);
    assert_eq!(requeue_as(&fx, &r, "w1", &c, "f").await, RequeueReply::Finalized { retry_index: 0 });
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "f").await, RequeueReply::Requeued { retry_index: 3 });
    assert_eq!(progress(&fx, &r).await, counters(3, 1, 2, 0, 2));
}

// ---------------------------------------------------------------------------
// reclaim
// ---------------------------------------------------------------------------

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
        }
    );
    assert_eq!(progress(&fx, &r).await, counters(1, 1, 0, 0, 0));
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
        }
    );
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::ReclaimExhausted { unit: unit("b") });
    assert_eq!(reserve_with(&fx, &r, "w2", ms(100)).await, ReserveReply::None);
    assert_eq!(progress(&fx, &r).await, counters(2, 2, 0, 0, 0));
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

// ---------------------------------------------------------------------------
// abandon, finalize, liveness
// ---------------------------------------------------------------------------

/// Abandon replies `OK` with an `abandoned` event; the unit stays pending on
/// the worker and is reclaimed by another after the timeout.
pub async fn abandon_records_event_and_unit_stays_pending(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(fx.queue.abandon(&r, &worker("w1"), &d, 1234).await.unwrap(), Ack::Ok);
    let ev = last_event(&fx, &r).await;
    assert_eq!(
        ev,
        Event::Abandoned {
            header: header("a", "w1", 0, 0, ev.at_ms()),
            elapsed_ms: 1234,
            stream: StreamName::Main,
            entry_id: d.entry_id,
        }
    );
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&d, "w1")]);
    assert_eq!(progress(&fx, &r).await, counters(1, 0, 0, 1, 0));
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 0, false));
    assert_eq!(worker_record(&fx, &r, "w1").await.processed, 0);
    assert_eq!(reserve_with(&fx, &r, "w2", LONG).await, ReserveReply::None);
    fx.time.advance(ms(300)).await;
    let got = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(got.origin, DeliveryOrigin::Reclaimed { previous_worker: Some(worker("w1")) });
    assert_eq!((got.unit.as_str(), got.delivery_count, got.reclaim_count), ("a", 2, 1));
    finalize_ok(&fx, &r, "w2", &got).await;
    assert_eq!(progress(&fx, &r).await, counters(1, 1, 0, 0, 0));
}

/// Finalize replies `OK` and appends a `finalized` event carrying the
/// outcome, duration, reason and errors exactly as given.
pub async fn finalize_records_outcome_and_event(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], lenient()).await;
    let requests = [
        FinalizeRequest::new(Outcome::Passed, 42),
        FinalizeRequest {
            outcome: Outcome::Failed,
            duration_ms: 99,
            reason: Some(FinalizeReason::Timeout),
            errors: Some(json!({ "signal": 9, "output": "killed" })),
        },
        FinalizeRequest {
            outcome: Outcome::Skipped,
            duration_ms: 0,
            reason: Some(FinalizeReason::Other("no tests".into())),
            errors: Some(json!(["x", 1, null, { "deep": [true] }])),
        },
    ];
    for (u, req) in ["a", "b", "c"].into_iter().zip(requests) {
        let d = reserve(&fx, &r, "w1").await;
        assert_eq!(d.unit, unit(u));
        assert_eq!(fx.queue.finalize(&r, &worker("w1"), &d, &req).await.unwrap(), Ack::Ok);
        let ev = last_event(&fx, &r).await;
        assert_eq!(
            ev,
            Event::Finalized {
                header: header(u, "w1", 0, 0, ev.at_ms()),
                outcome: req.outcome,
                duration_ms: req.duration_ms,
                reason: req.reason.clone(),
                errors: req.errors.clone(),
                stream: StreamName::Main,
                entry_id: d.entry_id,
                previous_worker_id: None,
                delivery_count: None,
                failure_summary: None,
            }
        );
    }
    let p = progress(&fx, &r).await;
    assert_eq!(p, counters(3, 3, 0, 0, 0));
    assert!(p.is_complete());
}

/// `finalized` climbs by one per unit and reaches `total` exactly once; the
/// run is complete only then, and hands out nothing more.
pub async fn finalize_counts_each_unit_once(fx: Fixture) {
    let names = unit_names(5);
    let r = init(&fx, &as_strs(&names), lenient()).await;
    let mut done = Vec::new();
    for i in 0..5u64 {
        let d = reserve(&fx, &r, "w1").await;
        assert!(!progress(&fx, &r).await.is_complete());
        finalize_ok(&fx, &r, "w1", &d).await;
        assert_eq!(progress(&fx, &r).await.finalized, i + 1);
        done.push(d);
    }
    for d in &done {
        assert_eq!(fx.queue.finalize(&r, &worker("w1"), d, &passed(1)).await.unwrap(), Ack::Stale);
    }
    let p = progress(&fx, &r).await;
    assert_eq!(p, counters(5, 5, 0, 0, 0));
    assert!(p.is_complete());
    assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None);
    let events = all_events(&fx, &r).await;
    for name in &names {
        finalized_event_of(&events, name);
    }
}

/// Finalize and requeue count in the worker's `processed` and clear its
/// current unit; reserve sets it.
pub async fn finalize_and_requeue_update_worker_record(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let da = reserve(&fx, &r, "w1").await;
    let rec = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec.current_unit.clone(), rec.processed), (Some(unit("a")), 0));
    finalize_ok(&fx, &r, "w1", &da).await;
    let rec2 = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec2.current_unit, rec2.processed), (None, 1));
    assert!(rec2.last_seen_ms >= rec.last_seen_ms);
    let db = reserve(&fx, &r, "w1").await;
    assert_eq!(worker_record(&fx, &r, "w1").await.current_unit, Some(unit("b")));
    assert_eq!(requeue_as(&fx, &r, "w1", &db, "f").await, RequeueReply::Requeued { retry_index: 1 });
    let rec3 = worker_record(&fx, &r, "w1").await;
    assert_eq!((rec3.current_unit, rec3.processed), (None, 2));
    assert_eq!(fx.queue.workers(&r).await.unwrap().len(), 1);
}

/// Liveness replies `OK`, creates or updates the worker's record (current
/// unit set and cleared), appends no event; records are sorted by worker.
pub async fn liveness_creates_and_updates_worker_records(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    assert!(fx.queue.workers(&r).await.unwrap().is_empty());
    assert_eq!(fx.queue.liveness(&r, &worker("w2"), Some(&unit("a"))).await.unwrap(), LivenessReply::Ok);
    assert_eq!(fx.queue.liveness(&r, &worker("w1"), None).await.unwrap(), LivenessReply::Ok);
    let records = fx.queue.workers(&r).await.unwrap();
    let summary: Vec<_> = records.iter().map(|w| (w.worker.as_str(), w.current_unit.clone(), w.processed)).collect();
    assert_eq!(summary, [("w1", None, 0), ("w2", Some(unit("a")), 0)]);
    assert_eq!(fx.queue.liveness(&r, &worker("w2"), None).await.unwrap(), LivenessReply::Ok);
    let w2 = worker_record(&fx, &r, "w2").await;
    assert_eq!(w2.current_unit, None);
    assert!(w2.last_seen_ms >= records[1].last_seen_ms);
    assert_eq!(event_count(&fx, &r).await, 0);
    assert_eq!(progress(&fx, &r).await, counters(2, 0, 0, 0, 2));
}

// ---------------------------------------------------------------------------
// worker_error / stale_rejected
// ---------------------------------------------------------------------------

/// `record_worker_error` appends a `worker_error` event even for a run that
/// does not exist, without creating the run.
pub async fn record_worker_error_needs_no_run(fx: Fixture) {
    let ghost = run("ghost");
    fx.queue.record_worker_error(&ghost, &worker("w1"), Some(&unit("a")), "disk full").await.unwrap();
    fx.queue.record_worker_error(&ghost, &worker("w2"), None, "boom").await.unwrap();
    let events = all_events(&fx, &ghost).await;
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0],
        Event::WorkerError {
            worker_id: worker("w1"),
            unit_id: Some(unit("a")),
            message: "disk full".into(),
            at_ms: events[0].at_ms()
        }
    );
    assert_eq!(
        events[1],
        Event::WorkerError { worker_id: worker("w2"), unit_id: None, message: "boom".into(), at_ms: events[1].at_ms() }
    );
    assert_eq!(fx.queue.progress(&ghost).await.unwrap(), None);
    assert_eq!(fx.queue.budgets(&ghost).await.unwrap(), None);

    let r = init(&fx, &["a"], lenient()).await;
    fx.queue.record_worker_error(&r, &worker("w1"), None, "oops").await.unwrap();
    assert_eq!(type_names(&all_events(&fx, &r).await), ["worker_error"]);
    assert_eq!(progress(&fx, &r).await, counters(1, 0, 0, 0, 1));
}

/// `record_stale_rejected` appends a `stale_rejected` event naming the
/// refused delivery, changes nothing else, and needs no run.
pub async fn record_stale_rejected_appends_event(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    assert_eq!(fx.queue.finalize(&r, &worker("w2"), &d, &passed(1)).await.unwrap(), Ack::Stale);
    fx.queue.record_stale_rejected(&r, &worker("w2"), &d, "finalize").await.unwrap();
    let ev = last_event(&fx, &r).await;
    assert_eq!(
        ev,
        Event::StaleRejected {
            worker_id: worker("w2"),
            unit_id: unit("a"),
            stream: StreamName::Main,
            entry_id: d.entry_id,
            delivery_count: 1,
            transition: "finalize".into(),
            at_ms: ev.at_ms(),
        }
    );
    assert_eq!(progress(&fx, &r).await, counters(1, 0, 0, 1, 0));
    assert_eq!(pending_rows(&fx, &r).await, vec![row_of(&d, "w1")]);

    let ghost = run("ghost");
    let gd = ghost_delivery("x");
    fx.queue.record_stale_rejected(&ghost, &worker("w1"), &gd, "heartbeat").await.unwrap();
    let events = all_events(&fx, &ghost).await;
    assert_eq!(
        events,
        [Event::StaleRejected {
            worker_id: worker("w1"),
            unit_id: unit("x"),
            stream: StreamName::Main,
            entry_id: gd.entry_id,
            delivery_count: 1,
            transition: "heartbeat".into(),
            at_ms: events[0].at_ms(),
        }]
    );
    assert_eq!(fx.queue.progress(&ghost).await.unwrap(), None);
}

// ---------------------------------------------------------------------------
// events
// ---------------------------------------------------------------------------

/// The log pages with `after` and `limit`: consecutive pages concatenate to
/// the whole log, and the page after the last event is empty.
pub async fn events_page_with_after_and_limit(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d"], lenient()).await;
    for _ in 0..4 {
        let d = reserve(&fx, &r, "w1").await;
        finalize_ok(&fx, &r, "w1", &d).await;
    }
    let all = event_records(&fx, &r).await;
    assert_eq!(all.len(), 8);
    assert_log_invariants(&all);
    let mut paged = Vec::new();
    let mut after = None;
    let mut sizes = Vec::new();
    for _ in 0..10 {
        let page = fx.queue.events(&r, after, 3).await.unwrap();
        if page.is_empty() {
            break;
        }
        sizes.push(page.len());
        after = Some(page.last().unwrap().id);
        paged.extend(page);
    }
    assert_eq!(sizes, [3, 3, 2]);
    assert_eq!(paged, all);
    assert_eq!(fx.queue.events(&r, Some(all[0].id), 1).await.unwrap(), vec![all[1].clone()]);
    assert_eq!(fx.queue.events(&r, Some(all[3].id), 100).await.unwrap(), all[4..].to_vec());
    assert!(fx.queue.events(&r, Some(all[7].id), 100).await.unwrap().is_empty());
}

/// A lifecycle that produces every event type logs them in order, with ids
/// increasing, `at_ms` non-decreasing and the right ownership generations.
pub async fn events_cover_every_type_in_order(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], budgets(1, 1.0, 1)).await;
    let a = reserve(&fx, &r, "w1").await;
    assert_eq!(requeue_as(&fx, &r, "w1", &a, "f").await, RequeueReply::Requeued { retry_index: 1 });
    let a2 = reserve(&fx, &r, "w1").await;
    finalize_ok(&fx, &r, "w1", &a2).await;
    let b = reserve(&fx, &r, "w1").await;
    assert_eq!(fx.queue.abandon(&r, &worker("w1"), &b, 7).await.unwrap(), Ack::Ok);
    let c = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(300)).await;
    let b2 = delivered(reserve_with(&fx, &r, "w2", ms(100)).await);
    assert_eq!(b2.unit, unit("b"));
    assert_eq!(fx.queue.finalize(&r, &worker("w1"), &b, &passed(1)).await.unwrap(), Ack::Stale);
    fx.queue.record_stale_rejected(&r, &worker("w1"), &b, "finalize").await.unwrap();
    fx.queue.record_worker_error(&r, &worker("w1"), Some(&c.unit), "crash").await.unwrap();

    let records = event_records(&fx, &r).await;
    assert_log_invariants(&records);
    let events: Vec<Event> = records.into_iter().map(|e| e.event).collect();
    assert_eq!(
        type_names(&events),
        [
            "delivered",
            "requeued",
            "delivered",
            "finalized",
            "delivered",
            "abandoned",
            "delivered",
            "reclaimed",
            "stale_rejected",
            "worker_error"
        ]
    );
    let generations: Vec<(Option<&str>, Option<u32>)> =
        events.iter().map(|e| (e.unit_id().map(UnitId::as_str), e.header().map(|h| h.ownership_generation))).collect();
    assert_eq!(
        generations,
        [
            (Some("a"), Some(1)),
            (Some("a"), Some(2)),
            (Some("a"), Some(2)),
            (Some("a"), Some(2)),
            (Some("b"), Some(1)),
            (Some("b"), Some(1)),
            (Some("c"), Some(1)),
            (Some("b"), Some(2)),
            (Some("b"), None),
            (Some("c"), None),
        ]
    );
}

// ---------------------------------------------------------------------------
// CORRUPT and reads
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// inactivity TTL
// ---------------------------------------------------------------------------

/// A run that sees no transition for its TTL disappears: reads are empty,
/// transitions reply `CORRUPT`, and the run id can be initialised afresh.
pub async fn run_expires_after_inactivity_ttl(fx: Fixture) {
    let s = spec_ttl(RUN, &["a", "b"], lenient(), ms(200));
    let r = init_spec(&fx, &s).await;
    let d = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(400)).await;
    assert_all_corrupt(&fx, &r, "w1", &d).await;
    assert_eq!(fx.queue.initialize(&s).await.unwrap(), InitOutcome::Initialized);
    assert_eq!(progress(&fx, &r).await, counters(2, 0, 0, 0, 2));
}

/// Every transition renews the inactivity TTL: a run kept busy outlives it.
pub async fn transitions_renew_run_ttl(fx: Fixture) {
    let s = spec_ttl(RUN, &["a", "b"], lenient(), ms(700));
    let r = init_spec(&fx, &s).await;
    let d = reserve(&fx, &r, "w1").await;
    fx.time.advance(ms(450)).await;
    assert_eq!(fx.queue.heartbeat(&r, &worker("w1"), &d).await.unwrap(), Ack::Ok);
    fx.time.advance(ms(450)).await;
    assert_eq!(fx.queue.liveness(&r, &worker("w1"), Some(&d.unit)).await.unwrap(), LivenessReply::Ok);
    fx.time.advance(ms(450)).await;
    finalize_ok(&fx, &r, "w1", &d).await;
    assert_eq!(progress(&fx, &r).await, counters(2, 1, 0, 0, 1));
    assert_eq!(reserve(&fx, &r, "w1").await.unit, unit("b"));
}

// ---------------------------------------------------------------------------
// concurrency and argument checks
// ---------------------------------------------------------------------------

/// Eight workers reserving and finalizing concurrently over 200 units: every
/// unit is delivered exactly once and the run completes.
pub async fn concurrent_workers_deliver_each_unit_once(fx: Fixture) {
    let names = unit_names(200);
    let r = init(&fx, &as_strs(&names), lenient()).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let queue = fx.queue.clone();
        let r = r.clone();
        tasks.push(tokio::spawn(async move {
            let w = worker(&format!("w{i}"));
            let mut got = Vec::new();
            for _ in 0..1000 {
                match queue.reserve(&r, &w, LONG).await.unwrap() {
                    ReserveReply::Delivered(d) => {
                        assert_eq!(d.delivery_count, 1);
                        assert_eq!(queue.finalize(&r, &w, &d, &passed(1)).await.unwrap(), Ack::Ok);
                        got.push(d.unit.as_str().to_owned());
                    }
                    ReserveReply::None => break,
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            got
        }));
    }
    let mut delivered_units = Vec::new();
    for task in tasks {
        delivered_units.extend(task.await.unwrap());
    }
    delivered_units.sort();
    assert_eq!(delivered_units, names, "every unit delivered exactly once");
    assert_eq!(progress(&fx, &r).await, counters(200, 200, 0, 0, 0));
    let events = all_events(&fx, &r).await;
    assert_eq!(events_of_type(&events, "delivered").len(), 200);
    assert_eq!(events_of_type(&events, "finalized").len(), 200);
    let processed: u64 = fx.queue.workers(&r).await.unwrap().iter().map(|w| w.processed).sum();
    assert_eq!(processed, 200);
}

/// Eight workers concurrently failing each unit once and passing its retry:
/// each unit is delivered exactly twice (main, then priority) and finalized once.
pub async fn concurrent_requeues_deliver_each_retry_once(fx: Fixture) {
    let names = unit_names(100);
    let r = init(&fx, &as_strs(&names), lenient()).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let queue = fx.queue.clone();
        let r = r.clone();
        tasks.push(tokio::spawn(async move {
            let w = worker(&format!("w{i}"));
            let mut got = Vec::new();
            for _ in 0..1000 {
                match queue.reserve(&r, &w, LONG).await.unwrap() {
                    ReserveReply::Delivered(d) => {
                        if d.retry_index == 0 {
                            let reply = queue.requeue(&r, &w, &d, &RequeueRequest::default()).await.unwrap();
                            assert_eq!(reply, RequeueReply::Requeued { retry_index: 1 });
                        } else {
                            assert_eq!(queue.finalize(&r, &w, &d, &passed(1)).await.unwrap(), Ack::Ok);
                        }
                        got.push((d.unit.as_str().to_owned(), d.stream));
                    }
                    ReserveReply::None => break,
                    other => panic!("unexpected reply {other:?}"),
                }
            }
            got
        }));
    }
    let mut per_unit: BTreeMap<String, Vec<StreamName>> = BTreeMap::new();
    for task in tasks {
        for (u, stream) in task.await.unwrap() {
            per_unit.entry(u).or_default().push(stream);
        }
    }
    assert_eq!(per_unit.len(), 100);
    for (u, mut streams) in per_unit {
        streams.sort();
        assert_eq!(streams, [StreamName::Main, StreamName::Priority], "deliveries of {u}");
    }
    assert_eq!(progress(&fx, &r).await, counters(100, 100, 100, 0, 0));
}

/// Invalid transition arguments (zero reclaim timeout, over-long summary,
/// reason or message) are `QueueError::Spec` and change nothing.
pub async fn invalid_transition_arguments_change_nothing(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let w1 = worker("w1");
    let before = snapshot(&fx, &r).await;
    assert!(matches!(
        fx.queue.reserve(&r, &w1, Duration::ZERO).await,
        Err(QueueError::Spec(SpecError::ZeroTtl { .. }))
    ));
    let long_summary =
        RequeueRequest { failure_summary: Some("s".repeat(MAX_SUMMARY_LEN + 1)), ..RequeueRequest::default() };
    assert!(matches!(
        fx.queue.requeue(&r, &w1, &d, &long_summary).await,
        Err(QueueError::Spec(SpecError::TextTooLong { .. }))
    ));
    let long_reason = FinalizeRequest {
        reason: Some(FinalizeReason::Other("r".repeat(MAX_KIND_LEN + 1))),
        ..FinalizeRequest::new(Outcome::Failed, 1)
    };
    assert!(matches!(
        fx.queue.finalize(&r, &w1, &d, &long_reason).await,
        Err(QueueError::Spec(SpecError::TextTooLong { .. }))
    ));
    assert!(matches!(
        fx.queue.record_worker_error(&r, &w1, None, &"m".repeat(MAX_SUMMARY_LEN + 1)).await,
        Err(QueueError::Spec(SpecError::TextTooLong { .. }))
    ));
    assert_eq!(snapshot(&fx, &r).await, before);
    finalize_ok(&fx, &r, "w1", &d).await;
}
