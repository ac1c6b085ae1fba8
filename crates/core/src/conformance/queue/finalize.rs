//! `abandon`, `finalize` and `liveness`.

use super::*;

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
            slot: Some(3),
        },
        FinalizeRequest {
            outcome: Outcome::Skipped,
            duration_ms: 0,
            reason: Some(FinalizeReason::Other("no tests".into())),
            errors: Some(json!(["x", 1, null, { "deep": [true] }])),
            slot: None,
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
                slot: req.slot,
            }
        );
    }
    let p = progress(&fx, &r).await;
    assert_eq!(p, counters_failed(3, 3, 0, 0, 0, 1));
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
