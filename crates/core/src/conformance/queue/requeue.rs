//! `requeue`: the per-unit cap and the run's tolerance.

use super::*;

/// A requeue puts the unit on the priority stream under a new entry, appends
/// a `requeued` event with every field, and fences off the old handle.
pub async fn requeue_puts_unit_on_priority_stream(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let req = RequeueRequest {
        duration_ms: 250,
        failure_summary: Some("assertion failed: left == right".into()),
        errors: Some(json!({ "failures": [{ "name": "t1", "message": "boom" }], "count": 1 })),
        retry_elsewhere: false,
        slot: Some(1),
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
            slot: Some(1),
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
    let req = RequeueRequest { slot: Some(0), ..failure("final") };
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
            slot: Some(0),
        }
    );
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(2, 0, true));
    assert_eq!(progress(&fx, &r).await, counters_failed(2, 1, 1, 0, 1, 1));
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
            slot: None,
        }
    );
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(0, 0, false));
    assert_eq!(progress(&fx, &r).await, counters_failed(2, 1, 0, 0, 1, 1));
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
    assert_eq!(progress(&fx, &r).await, counters_failed(10, 3, 7, 0, 7, 3));
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
    assert_eq!(progress(&fx, &r).await, counters_failed(100, 30, 70, 0, 70, 1));
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
    assert_eq!(progress(&fx, &r).await, counters_failed(4, 2, 1, 0, 2, 2));
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
    assert_eq!(progress(&fx, &r).await, counters_failed(2, 1, 0, 0, 1, 1));
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
    assert_eq!(progress(&fx, &r).await, counters_failed(3, 1, 2, 0, 2, 1));
}
