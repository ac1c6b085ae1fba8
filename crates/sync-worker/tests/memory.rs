//! The acceptance cases on the memory backend, in paused tokio time.

#[macro_use]
mod common;

macro_rules! memory_cases {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(start_paused = true)]
        async fn $name() {
            common::cases::$name(common::Mem::backend()).await;
        }
    )*};
}

acceptance_cases!(memory_cases);

/// The same cases under bucket ownership.
mod buckets {
    macro_rules! memory_bucket_cases {
        ($($name:ident),* $(,)?) => {$(
            #[tokio::test(start_paused = true)]
            async fn $name() {
                crate::common::cases::$name(crate::common::Mem::buckets()).await;
            }
        )*};
    }

    acceptance_cases!(memory_bucket_cases);

    /// Bucket ownership only: the change notice of an added account.
    #[tokio::test(start_paused = true)]
    async fn an_account_added_to_a_held_bucket_starts_at_once() {
        crate::common::cases::an_account_added_to_a_held_bucket_starts_at_once(crate::common::Mem::buckets()).await;
    }
}

/// Warm accounts claimed together poll together once (each new owner
/// catches up at once); after that each wait is drawn from 0.9 to 1 times
/// POLL_WARM, so they do not stay in step (109 connections in one second
/// every POLL_WARM, before).
#[tokio::test(start_paused = true)]
async fn warm_accounts_started_together_do_not_poll_in_step() {
    use std::time::Duration;
    use sync_worker::{Activity, Scope};

    let env = common::Env::new(common::Mem::backend()).await;
    let mut accounts = Vec::new();
    for i in 0..8 {
        let account = env.account_of(&format!("acct-{i}"), &common::user(&format!("u{i}"))).await;
        // Mail a day old: warm, neither hot nor cold.
        env.source.set_latest(&account, Some(env.ago(Duration::from_secs(24 * 3600))));
        accounts.push(account);
    }
    let a = env.start("w-a").await;
    assert!(env.wait_for(env.s.ttl, || a.owned_count() == 8).await);
    env.sleep(env.s.poll_warm * 4).await;
    let poll_warm = env.s.poll_warm;
    let mut second_polls = Vec::new();
    for account in &accounts {
        let at: Vec<Duration> = env
            .source
            .polls_of(account)
            .iter()
            .filter(|r| r.activity == Activity::Poll(Scope::All))
            .map(|r| r.at)
            .collect();
        assert!(at.len() >= 4, "{account}: {at:?}");
        for pair in at.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= poll_warm.mul_f64(0.9) && gap <= poll_warm + env.s.tick(), "{account}: polls {gap:?} apart");
        }
        second_polls.push(at[1]);
    }
    second_polls.sort();
    second_polls.dedup();
    assert!(second_polls.len() >= 4, "the second polls came at {second_polls:?}");
    a.shutdown().await.expect("shutdown");
}
