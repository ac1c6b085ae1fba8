//! The run's inactivity TTL.

use super::*;

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
