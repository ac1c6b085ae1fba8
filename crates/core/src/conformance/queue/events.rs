//! The event log: paging and order.

use super::*;

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

/// A log of batches (one call's events may be stored together) pages the
/// same as one of single events: pages of any size, from any position,
/// concatenate to the whole log, including a page that ends inside a batch.
pub async fn events_page_through_batches(fx: Fixture) {
    let names = unit_names(60);
    let r = init(&fx, &as_strs(&names), lenient()).await;
    // 20 single reserves and finalizes, then two batches of 20.
    for _ in 0..20 {
        let d = reserve(&fx, &r, "w1").await;
        finalize_ok(&fx, &r, "w1", &d).await;
    }
    for _ in 0..2 {
        let batch = fx.queue.reserve_batch(&r, &worker("w1"), batch(20), LONG).await.unwrap();
        assert_eq!(batch.deliveries.len(), 20);
        let items: Vec<_> = batch.deliveries.into_iter().map(|d| (d, passed(1))).collect();
        let replies = fx.queue.finalize_batch(&r, &worker("w1"), &items).await.unwrap();
        assert!(replies.iter().all(|a| *a == Ack::Ok), "{replies:?}");
    }
    let all = event_records(&fx, &r).await;
    assert_eq!(all.len(), 120);
    assert_log_invariants(&all);
    for limit in [1, 7, 16, 33, 50, 1000] {
        let mut paged = Vec::new();
        let mut after = None;
        loop {
            let page = fx.queue.events(&r, after, limit).await.unwrap();
            assert!(page.len() <= limit, "a page of {} for a limit of {limit}", page.len());
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            paged.extend(page);
        }
        assert_eq!(paged, all, "pages of {limit}");
    }
    for start in [0, 19, 45, 70, 99, 118] {
        assert_eq!(
            fx.queue.events(&r, Some(all[start].id), 25).await.unwrap(),
            all[start + 1..].iter().take(25).cloned().collect::<Vec<_>>(),
            "25 after event {start}"
        );
    }
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

/// How long a wait that must be woken may last: a wait that was not woken
/// returns what it was given, which the cases tell apart from a wake-up.
const WOKEN_WITHIN: Duration = Duration::from_secs(30);

/// A caller behind the log is answered at once, with the newest event.
pub async fn wait_for_events_answers_a_caller_behind_with_the_newest(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    for _ in 0..2 {
        let d = reserve(&fx, &r, "w1").await;
        finalize_ok(&fx, &r, "w1", &d).await;
    }
    let all = event_records(&fx, &r).await;
    let newest = all.last().map(|e| e.id);
    assert_eq!(fx.queue.wait_for_events(&r, Some(all[0].id), WOKEN_WITHIN).await.unwrap(), newest);
}

/// A wait from "now" (`None`) or from the newest event is woken by the next
/// transition (a finalize, then a reserve), which another task makes while
/// it waits, and returns an event of the log newer than it was given.
pub async fn wait_for_events_is_woken_by_a_transition(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    for (round, after) in [None, Some(event_records(&fx, &r).await.last().map(|e| e.id))].into_iter().enumerate() {
        let after = after.flatten();
        let queue = std::sync::Arc::clone(&fx.queue);
        let run = r.clone();
        let waiter = tokio::spawn(async move { queue.wait_for_events(&run, after, WOKEN_WITHIN).await });
        // Let the waiter block first; an event before it blocks must wake it too.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if round == 0 {
            finalize_ok(&fx, &r, "w1", &a).await;
        } else {
            reserve(&fx, &r, "w1").await;
        }
        let woken = waiter.await.unwrap().unwrap();
        let logged = event_records(&fx, &r).await;
        assert!(woken.is_some() && woken > after, "the wait from {after:?} was not woken: {woken:?}");
        assert!(logged.iter().any(|e| Some(e.id) == woken), "{woken:?} is not an event of the log");
    }
}

/// With nothing new, a wait returns what it was given once its time is up,
/// for a run whose log has events, and for a run that does not exist.
pub async fn wait_for_events_times_out_with_what_it_was_given(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let d = reserve(&fx, &r, "w1").await;
    finalize_ok(&fx, &r, "w1", &d).await;
    let newest = event_records(&fx, &r).await.last().map(|e| e.id);
    let short = Duration::from_millis(200);
    assert_eq!(fx.queue.wait_for_events(&r, newest, short).await.unwrap(), newest);
    assert_eq!(fx.queue.wait_for_events(&r, None, short).await.unwrap(), None);
    let missing = crate::ids::RunId::new(format!("{r}-never-made")).unwrap();
    assert_eq!(fx.queue.wait_for_events(&missing, None, short).await.unwrap(), None);
}
