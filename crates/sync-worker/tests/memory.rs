//! The acceptance cases on the memory backend, in paused tokio time.

mod common;

macro_rules! memory_cases {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(start_paused = true)]
        async fn $name() {
            common::cases::$name(common::Mem::backend()).await;
        }
    )*};
}

memory_cases!(
    claim_up_to_fair_share,
    renew_keeps_leases,
    rebalance_when_worker_joins,
    takeover_after_kill,
    takeover_after_graceful_release,
    mark_not_live_stops_loops,
    lost_lease_stops_writing,
    stolen_lease_is_fenced,
    never_two_workers_at_once,
    tier_session_promotion,
    tier_recent_mail_promotion,
    tier_cold,
    tier_user_active_promotion,
    tier_budget_demotion,
);
