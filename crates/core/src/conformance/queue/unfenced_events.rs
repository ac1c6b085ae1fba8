//! The unfenced events: `worker_error` and `stale_rejected`.

use super::*;

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
