//! The runner's loops in paused time, without a store: tier shapes, in-place
//! reshaping without skipped or doubled polls, the INBOX watch, the lease
//! deadline and fencing.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencingToken, LeaseKey, Tier, WorkerId};
use sync_worker::deadline::LeaseDeadline;
use sync_worker::{
    Activity, Fence, MailSource, RunnerExit, RunnerHandle, RunnerSettings, Scope, ScriptedSource, SourceError,
};
use tokio::time::{sleep_until, Instant};

const S: Duration = Duration::from_secs(1);

fn settings() -> RunnerSettings {
    // No stagger: these tests check the schedule to the second.
    RunnerSettings {
        poll_warm: 60 * S,
        poll_cold: 600 * S,
        idle_reissue: 25 * 60 * S,
        retry_base: S,
        poll_stagger: 0.0,
    }
}

fn fence(token: u64) -> Fence {
    Fence {
        account: LeaseKey::new("acct").expect("key"),
        worker: WorkerId::new("w").expect("worker"),
        token: FencingToken(token),
        deadline: LeaseDeadline::unbounded(),
    }
}

fn far() -> Instant {
    Instant::now() + 1_000_000 * S
}

/// (seconds, scope) of every poll so far.
fn polls(source: &ScriptedSource) -> Vec<(u64, Scope)> {
    source
        .log()
        .iter()
        .filter_map(|r| match r.activity {
            Activity::Poll(scope) => Some((r.at.as_secs(), scope)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn tier_changes_reshape_without_skipping_or_doubling_a_poll() {
    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let at = |s: u64| sleep_until(t0 + Duration::from_secs(s));
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Warm, far(), settings());
    at(30).await;
    r.set_tier(Tier::Cold); // next poll stays anchored at the last one: 0 + 600
    at(100).await;
    r.set_tier(Tier::Warm); // 0 + 60 is past: poll now, once
    at(130).await;
    r.set_tier(Tier::Hot); // watch starts (INBOX catch-up); special folders keep the schedule: 160, 220
    at(250).await;
    r.set_tier(Tier::Warm); // watch stops; next full poll at 220 + 60 = 280
    at(300).await;
    assert_eq!(
        polls(&source),
        vec![
            (0, Scope::All),
            (100, Scope::All),
            (130, Scope::Inbox),
            (160, Scope::Special),
            (220, Scope::Special),
            (280, Scope::All),
        ]
    );
    r.stop(S).await;
}

#[tokio::test(start_paused = true)]
async fn warm_and_cold_poll_at_their_rates() {
    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let warm = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Warm, far(), settings());
    sleep_until(t0 + 250 * S).await;
    warm.stop(S).await;
    assert_eq!(
        polls(&source),
        vec![(0, Scope::All), (60, Scope::All), (120, Scope::All), (180, Scope::All), (240, Scope::All)]
    );
    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let cold = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Cold, far(), settings());
    sleep_until(t0 + 1300 * S).await;
    cold.stop(S).await;
    assert_eq!(polls(&source), vec![(0, Scope::All), (600, Scope::All), (1200, Scope::All)]);
    assert!(source.log().iter().all(|r| r.activity != Activity::Watch), "warm and cold keep no watch");
}

#[tokio::test(start_paused = true)]
async fn hot_watches_inbox_and_reissues_idle_before_29_minutes() {
    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let key = fence(1).account;
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Hot, far(), settings());
    sleep_until(t0 + 10 * S).await;
    source.deliver(&key, 1);
    sleep_until(t0 + 11 * S).await;
    let inbox: Vec<u64> = polls(&source).iter().filter(|(_, s)| *s == Scope::Inbox).map(|(t, _)| *t).collect();
    assert_eq!(inbox, vec![0, 10], "catch-up at start, then at once on new mail");
    sleep_until(t0 + 3630 * S).await;
    let watches: Vec<u64> =
        source.log().iter().filter(|r| r.activity == Activity::Watch).map(|r| r.at.as_secs()).collect();
    // Issued at 0, re-issued after the wake-up at 10, then every 25 minutes (hard deadline).
    assert_eq!(watches, vec![0, 10, 10 + 1500, 10 + 3000]);
    assert!(watches.windows(2).all(|w| w[1] - w[0] < 29 * 60));
    let special = polls(&source).iter().filter(|(_, s)| *s == Scope::Special).count();
    assert_eq!(special, 61, "secondary poll every POLL_WARM: 0, 60, ..., 3600 s");
    r.stop(S).await;
}

#[tokio::test(start_paused = true)]
async fn hot_watch_reconnects_with_backoff() {
    let source = ScriptedSource::new();
    let key = fence(1).account;
    source.fail_connects(&key, 4);
    let t0 = Instant::now();
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Hot, far(), settings());
    sleep_until(t0 + 30 * S).await;
    assert!(source.log().iter().any(|r| r.activity == Activity::Watch), "watch never connected");
    assert!(r.status().polls >= 1);
    r.stop(S).await;
}

#[tokio::test(start_paused = true)]
async fn runner_stops_at_its_lease_deadline() {
    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let mut s = settings();
    s.poll_warm = 10 * S;
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Hot, t0 + 25 * S, s);
    sleep_until(t0 + 100 * S).await;
    assert!(r.is_finished());
    assert!(source.log().iter().all(|e| e.at <= 25 * S), "ran past its deadline: {:?}", source.log().last());
    // Extending the deadline keeps a runner going.
    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Warm, t0 + 25 * S, s);
    sleep_until(t0 + 20 * S).await;
    r.extend(t0 + 1000 * S);
    sleep_until(t0 + 100 * S).await;
    assert!(!r.is_finished());
    assert_eq!(polls(&source).len(), 10);
    r.stop(S).await;
}

#[tokio::test(start_paused = true)]
async fn fenced_runner_stops_writing() {
    let source = ScriptedSource::new();
    let mut s = settings();
    s.poll_warm = 10 * S;
    let stale = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Warm, far(), s);
    tokio::time::sleep(15 * S).await;
    // A newer owner writes.
    let mut conn = source.connect(&fence(2)).await.expect("connect");
    conn.poll(Scope::All).await.expect("poll");
    tokio::time::sleep(60 * S).await;
    assert!(stale.is_finished(), "a fenced-off runner must stop");
    let rejected: Vec<_> = source.log().into_iter().filter(|r| !r.accepted).collect();
    assert_eq!(rejected.len(), 1, "one rejected write, then it stopped: {rejected:?}");
    assert!(source.check_accepted_exclusive().is_ok());
}

#[tokio::test(start_paused = true)]
async fn graceful_stop_lets_the_poll_in_progress_finish() {
    let source = ScriptedSource::new();
    source.set_poll_delay(5 * S);
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Warm, far(), settings());
    tokio::time::sleep(S).await; // the first poll is in progress
    r.stop(10 * S).await;
    assert_eq!(polls(&source).len(), 1, "the poll in progress completed");
    let source = ScriptedSource::new();
    source.set_poll_delay(5 * S);
    let r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Warm, far(), settings());
    tokio::time::sleep(S).await;
    r.abort().await;
    tokio::time::sleep(10 * S).await;
    assert!(polls(&source).is_empty(), "abort ends the poll in progress");
}

#[tokio::test(start_paused = true)]
async fn a_runner_records_its_claim_before_it_connects_and_a_fenced_take_over_connects_nowhere() {
    let source = ScriptedSource::new();
    // Storage already holds token 5 (a newer owner's, or one a lease store
    // that lost its counters no longer knows).
    source.take_over(&fence(5)).await.expect("token 5 recorded");
    for held in [3, 5] {
        let mut r = RunnerHandle::spawn(Arc::new(source.clone()), fence(held), Tier::Hot, far(), settings());
        tokio::time::sleep(10 * S).await;
        assert_eq!(
            r.exit(),
            Some(RunnerExit::Fenced { held: FencingToken(held), stored: FencingToken(5) }),
            "token {held} against a stored 5 (equal is a duplicate, not the same owner)"
        );
        let e = r.status().last_error.expect("last_error says why");
        assert!(e.contains(&format!("holds fencing token {held}")) && e.contains("storage holds token 5"), "{e}");
    }
    assert!(source.log().is_empty(), "a fenced take-over connects to nothing: {:?}", source.log());
    // A runner above the stored token records it before anything else: from
    // then on the older owner is fenced, though the new one has written nothing.
    let mut idle = settings();
    idle.poll_warm = 1000 * S;
    source.set_poll_delay(500 * S);
    let new = RunnerHandle::spawn(Arc::new(source.clone()), fence(6), Tier::Warm, far(), idle);
    tokio::time::sleep(S).await;
    assert!(polls(&source).is_empty(), "the new owner has not written yet");
    source.set_poll_delay(Duration::ZERO);
    let mut old = source.connect(&fence(5)).await.expect("connect");
    match old.poll(Scope::All).await {
        Err(SourceError::Fenced { token, current, .. }) => {
            assert_eq!((token, current), (FencingToken(5), FencingToken(6)))
        }
        other => panic!("the old owner's write was not fenced: {other:?}"),
    }
    new.abort().await;
}

/// A hot runner whose INBOX watch is fenced (a newer owner wrote, then new
/// mail woke the watch) ends as `Fenced` with both tokens, though its
/// periodic poll is far off; a watch that outlives its lease deadline ends
/// the runner as `LeaseExpired` and drops its connection.
#[tokio::test(start_paused = true)]
async fn a_fenced_inbox_watch_ends_its_runner_with_both_tokens() {
    let source = ScriptedSource::new();
    let mut idle = settings();
    idle.poll_warm = 1000 * S;
    let mut r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Hot, far(), idle);
    tokio::time::sleep(5 * S).await;
    assert!(source.log().iter().any(|e| e.activity == Activity::Watch), "the watch connected");
    assert_eq!(r.exit(), None);
    // A newer owner records its token; then new mail wakes the old watch.
    source.take_over(&fence(2)).await.expect("token 2 recorded");
    source.deliver(&fence(1).account, 1);
    tokio::time::sleep(5 * S).await;
    assert_eq!(r.exit(), Some(RunnerExit::Fenced { held: FencingToken(1), stored: FencingToken(2) }));

    let source = ScriptedSource::new();
    let t0 = Instant::now();
    let mut r = RunnerHandle::spawn(Arc::new(source.clone()), fence(1), Tier::Hot, t0 + 10 * S, idle);
    source.deliver(&fence(1).account, 1);
    tokio::time::sleep(5 * S).await;
    assert_eq!(r.exit(), None, "within its deadline");
    tokio::time::sleep(30 * S).await;
    source.deliver(&fence(1).account, 2);
    tokio::time::sleep(30 * S).await;
    assert_eq!(r.exit(), Some(RunnerExit::LeaseExpired));
    assert!(source.log().iter().all(|e| e.at <= 10 * S), "acted past its deadline: {:?}", source.log().last());
}
