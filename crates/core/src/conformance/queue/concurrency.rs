//! Concurrent workers, and invalid arguments that change nothing.

use super::*;

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

/// Invalid transition arguments (over-long summary, reason or message; a
/// zero reclaim timeout cannot be made, see `Ttl`) are `QueueError::Spec` and change nothing.
pub async fn invalid_transition_arguments_change_nothing(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    let w1 = worker("w1");
    let before = snapshot(&fx, &r).await;
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
