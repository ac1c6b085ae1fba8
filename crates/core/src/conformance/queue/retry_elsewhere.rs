//! Conformance cases for retry elsewhere ([`RequeueRequest::retry_elsewhere`])
//! and [`UnitQueue::leave`](crate::UnitQueue::leave): a retry does not go
//! back to the worker that failed it while another worker is live.

use super::*;
use crate::queue::RETRY_ALONE_AFTER;

/// A failure of `d` by `w`, to be retried on another worker.
async fn fail_elsewhere(fx: &Fixture, run: &crate::ids::RunId, w: &str, d: &Delivery) {
    let request = RequeueRequest { retry_elsewhere: true, ..failure("broken on this machine") };
    let reply = fx.queue.requeue(run, &worker(w), d, &request).await.expect("requeue");
    assert!(matches!(reply, RequeueReply::Requeued { .. }), "{reply:?}");
}

/// Says `w` is alive (a worker record with a fresh transition).
async fn alive(fx: &Fixture, run: &crate::ids::RunId, w: &str) {
    assert_eq!(fx.queue.liveness(run, &worker(w), None).await.unwrap(), LivenessReply::Ok);
}

/// While another worker is live, the failing worker gets the next unit, not
/// its own retry; the other worker gets the retry, as an ordinary delivery
/// with its retry index.
pub async fn a_retry_skips_the_worker_that_failed_it(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    alive(&fx, &r, "w2").await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    let next = reserve(&fx, &r, "w1").await;
    assert_eq!((next.unit.as_str(), next.stream), ("b", StreamName::Main));
    let retry = reserve(&fx, &r, "w2").await;
    assert_eq!((retry.unit.as_str(), retry.stream, retry.retry_index), ("a", StreamName::Priority, 1));
    assert_eq!(retry.origin, DeliveryOrigin::Fresh);
    finalize_ok(&fx, &r, "w2", &retry).await;
    finalize_ok(&fx, &r, "w1", &next).await;
    assert!(progress(&fx, &r).await.is_complete());
}

/// Holding a retry back spends nothing and records nothing: no event, the
/// unit's state unchanged, still counted as queued; the failing worker gets
/// `NONE` as long as another worker is live and nothing else is queued.
pub async fn a_held_back_retry_spends_nothing_and_stays_queued(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    alive(&fx, &r, "w2").await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    let events = event_count(&fx, &r).await;
    for _ in 0..3 {
        assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None);
    }
    assert_eq!(event_count(&fx, &r).await, events, "holding back appends no event");
    assert_eq!(state_of(&fx, &r, "a").await, unit_state(1, 0, true));
    assert_eq!(progress(&fx, &r).await, counters(1, 0, 1, 0, 1));
    assert!(pending_rows(&fx, &r).await.is_empty());
    let retry = reserve(&fx, &r, "w2").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// With no other worker in the run, the failing worker retries its unit
/// once the retry is [`RETRY_ALONE_AFTER`] old (time for a worker to join).
pub async fn a_lone_worker_gets_its_own_retry_after_a_short_wait(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None, "a worker may still join");
    // Half-way (not to the millisecond: a Redis store's clock is its own).
    fx.time.advance(RETRY_ALONE_AFTER / 2).await;
    assert_eq!(reserve_with(&fx, &r, "w1", LONG).await, ReserveReply::None, "not before the wait is over");
    fx.time.advance(RETRY_ALONE_AFTER / 2).await;
    let retry = reserve(&fx, &r, "w1").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// A worker that joins during a lone worker's wait takes the retry.
pub async fn a_worker_that_joins_during_the_wait_takes_the_retry(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    fx.time.advance(RETRY_ALONE_AFTER / 2).await;
    let retry = reserve(&fx, &r, "w2").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// The lone worker's wait is no longer than the caller's reclaim timeout.
pub async fn a_lone_workers_wait_is_at_most_the_reclaim_timeout(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    assert_eq!(reserve_with(&fx, &r, "w1", ms(200)).await, ReserveReply::None);
    fx.time.advance(ms(200)).await;
    let retry = delivered(reserve_with(&fx, &r, "w1", ms(200)).await);
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// A worker that left does not hold a retry back; its next transition makes
/// it live again.
pub async fn a_worker_that_left_holds_no_retry_back(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c"], budgets(3, 1.0, 2)).await;
    alive(&fx, &r, "w2").await;
    assert_eq!(fx.queue.leave(&r, &worker("w2")).await.unwrap(), LivenessReply::Ok);
    let record = worker_record(&fx, &r, "w2").await;
    assert!(record.left && record.current_unit.is_none(), "{record:?}");
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    assert_eq!(reserve(&fx, &r, "w1").await.unit.as_str(), "b", "alone, the retry waits a moment");
    fx.time.advance(RETRY_ALONE_AFTER).await;
    let retry = reserve(&fx, &r, "w1").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
    fail_elsewhere(&fx, &r, "w1", &retry).await;
    alive(&fx, &r, "w2").await;
    assert!(!worker_record(&fx, &r, "w2").await.left, "a transition after leave makes the worker live");
    fx.time.advance(RETRY_ALONE_AFTER).await;
    alive(&fx, &r, "w2").await;
    assert_eq!(reserve(&fx, &r, "w1").await.unit.as_str(), "c", "w2 is live again, so the retry waits for it");
}

/// Leaving a run that does not exist is `CORRUPT`.
pub async fn leaving_a_missing_run_is_corrupt(fx: Fixture) {
    assert_eq!(fx.queue.leave(&run("nope"), &worker("w1")).await.unwrap(), LivenessReply::Corrupt);
}

/// A worker not seen within the caller's reclaim timeout is not live: it
/// holds no retry back.
pub async fn a_silent_worker_holds_no_retry_back(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let window = RETRY_ALONE_AFTER * 3;
    alive(&fx, &r, "w2").await;
    fx.time.advance(window + ms(100)).await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    // w2 was seen longer ago than the window: w1 is alone, and waits the short wait only.
    assert_eq!(reserve_with(&fx, &r, "w1", window).await, ReserveReply::None);
    fx.time.advance(RETRY_ALONE_AFTER).await;
    let retry = delivered(reserve_with(&fx, &r, "w1", window).await);
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// A retry waits for the live worker however long it takes that worker to
/// reserve (its slots may all be in long tests): it is held back past the
/// caller's reclaim timeout while the other worker stays live, and goes to
/// the failing worker only once the other has been silent that long.
pub async fn a_retry_waits_for_a_live_worker_past_the_reclaim_timeout(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    let window = ms(400);
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    for _ in 0..3 {
        // w2 is seen within every window, busy elsewhere: it stays live.
        alive(&fx, &r, "w2").await;
        assert_eq!(reserve_with(&fx, &r, "w1", window).await, ReserveReply::None, "w2 is live: held back");
        fx.time.advance(ms(300)).await;
    }
    // w2 falls silent: a window after its last sign of life, w1 takes its retry.
    fx.time.advance(window).await;
    let retry = delivered(reserve_with(&fx, &r, "w1", window).await);
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// A batch reads each stream once: an entry held back is moved behind the
/// others and not read again by the same call, and the batch fills up from
/// the main stream.
pub async fn a_batch_passes_over_a_held_back_retry_once(fx: Fixture) {
    let r = init(&fx, &["a", "b", "c", "d"], lenient()).await;
    alive(&fx, &r, "w2").await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    let batch = fx.queue.reserve_batch(&r, &worker("w1"), batch(3), LONG).await.unwrap();
    let units: Vec<&str> = batch.deliveries.iter().map(|d| d.unit.as_str()).collect();
    assert_eq!(units, ["b", "c", "d"]);
    assert!(batch.deliveries.iter().all(|d| d.stream == StreamName::Main));
    assert_eq!(progress(&fx, &r).await.queued, 1, "the retry is still queued");
    let retry = reserve(&fx, &r, "w2").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// A requeue without `retry_elsewhere` lets the failing worker take the retry
/// at once, whoever else is live.
pub async fn a_plain_retry_may_come_back_to_its_worker(fx: Fixture) {
    let r = init(&fx, &["a", "b"], lenient()).await;
    alive(&fx, &r, "w2").await;
    let a = reserve(&fx, &r, "w1").await;
    requeue_as(&fx, &r, "w1", &a, "flaky").await;
    let retry = reserve(&fx, &r, "w1").await;
    assert_eq!((retry.unit.as_str(), retry.retry_index), ("a", 1));
}

/// A retry handed out and then released loses its mark: the worker that
/// failed it may take it.
pub async fn a_released_retry_loses_its_mark(fx: Fixture) {
    let r = init(&fx, &["a"], lenient()).await;
    alive(&fx, &r, "w2").await;
    let a = reserve(&fx, &r, "w1").await;
    fail_elsewhere(&fx, &r, "w1", &a).await;
    let retry = reserve(&fx, &r, "w2").await;
    assert_eq!(fx.queue.release(&r, &worker("w2"), &retry).await.unwrap(), Ack::Ok);
    let again = reserve(&fx, &r, "w1").await;
    assert_eq!((again.unit.as_str(), again.retry_index), ("a", 1));
}
