//! The conformance kit: one suite every backend must pass unchanged.
//!
//! Modelled on sqlx's test support: a backend provides a [`Backend`] factory
//! whose [`Backend::fresh`] hands each test its own isolated store (the memory
//! backend a new store, the Redis backend a new key prefix / hash tag), and a
//! [`TimeControl`] that lets time pass for that store (a manual clock in
//! memory, real sleeps on a server). [`conformance_suite!`](crate::conformance_suite)
//! then expands to one `#[tokio::test]` per case:
//!
//! ```ignore
//! // crates/<backend>/tests/conformance.rs
//! leasehold_core::conformance_suite!(my_backend::TestBackend::new());
//! ```
//!
//! Tests keep their timings robust on slow machines: positive time checks use
//! short timeouts after an explicit [`TimeControl::advance`]; negative checks
//! use timeouts far longer than any stall ([`LONG`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::lease::LeaseStore;
use crate::queue::UnitQueue;

pub mod lease;
pub mod queue;
pub mod release;
pub mod support;

/// A timeout no test run will ever reach by stalling: negative time checks use it.
pub const LONG: Duration = Duration::from_secs(600);

/// Lets time pass for one fixture's store.
#[async_trait]
pub trait TimeControl: Send + Sync {
    /// Moves the store's clock forward by at least `by` (a server backend sleeps).
    async fn advance(&self, by: Duration);
}

/// One isolated store for one test.
pub struct Fixture {
    /// The store's unit queue.
    pub queue: Arc<dyn UnitQueue>,
    /// The store's leases.
    pub leases: Arc<dyn LeaseStore>,
    /// The store's clock.
    pub time: Arc<dyn TimeControl>,
}

/// A backend under test: a factory of fresh, isolated fixtures.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// A new store that shares no state with any other fixture.
    async fn fresh(&self) -> Fixture;
}

/// Expands to one `#[tokio::test]` per conformance case, each on a fresh
/// fixture from `$backend` (an expression evaluated once per test).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::__conformance_cases! { $backend;
            queue: [
                initialize_first_caller_wins,
                initialize_frozen_budgets_are_enforced,
                initialize_unit_list_mismatch_changes_nothing,
                initialize_rejects_invalid_specs,
                initialize_invalid_spec_on_existing_run_changes_nothing,
                initialize_concurrent_callers_elect_one_leader,
                reserve_main_stream_in_initial_order,
                reserve_reads_priority_before_main,
                reserve_appends_delivered_event,
                reserve_batch_hands_out_up_to_max,
                fence_rejects_another_worker,
                fence_rejects_wrong_delivery_count,
                fence_rejects_wrong_entry_or_stream,
                fence_rejects_handle_with_another_units_entry,
                transitions_after_finalize_are_stale,
                requeue_puts_unit_on_priority_stream,
                requeue_over_unit_cap_finalizes_failed,
                requeue_with_zero_max_requeues_finalizes_first,
                requeue_tolerance_caps_distinct_units,
                requeue_tolerance_uses_seed_epsilon,
                requeue_of_unit_in_retry_ignores_used_tolerance,
                requeue_with_zero_tolerance_finalizes,
                requeued_units_counts_each_unit_once,
                reclaim_waits_for_idle_timeout,
                reclaim_moves_idle_delivery_to_new_worker,
                reclaim_takes_priority_stream_first,
                reclaim_only_after_both_streams_are_empty,
                reclaim_fences_off_previous_worker,
                reclaimed_unit_requeue_keeps_reclaim_count,
                reclaim_over_budget_finalizes_failed,
                reclaim_with_zero_max_reclaims_finalizes_first,
                heartbeat_keeps_delivery_from_reclaim,
                heartbeat_ok_keeps_the_fence,
                abandon_records_event_and_unit_stays_pending,
                finalize_records_outcome_and_event,
                finalize_counts_each_unit_once,
                finalize_batch_matches_one_by_one,
                finalize_and_requeue_update_worker_record,
                liveness_creates_and_updates_worker_records,
                record_worker_error_needs_no_run,
                record_stale_rejected_appends_event,
                events_page_with_after_and_limit,
                events_cover_every_type_in_order,
                transitions_on_missing_run_are_corrupt,
                progress_tracks_every_counter,
                pending_lists_priority_first_in_entry_order,
                reads_report_units_states_and_budgets,
                run_expires_after_inactivity_ttl,
                transitions_renew_run_ttl,
                concurrent_workers_deliver_each_unit_once,
                concurrent_requeues_deliver_each_retry_once,
                invalid_transition_arguments_change_nothing,
            ],
            release: [
                release_hands_the_unit_back_without_budget,
                release_keeps_retry_and_reclaim_counts,
                release_batch_matches_one_by_one,
            ],
            lease: [
                claim_gives_one_holder,
                claim_of_held_key_by_its_holder_is_refused,
                tokens_increase_across_release_expiry_and_not_live,
                renew_and_release_check_the_owner,
                renew_and_release_check_the_token,
                renew_extends_the_lease,
                expired_lease_frees_the_key,
                release_frees_the_key_at_once,
                live_set_is_sorted_and_idempotent,
                mark_not_live_drops_lease_and_tier,
                tier_defaults_to_warm_on_claim,
                worker_registry_expires_and_refreshes,
                deregister_worker_removes_it,
                presence_expires_after_grace,
                presence_refresh_extends_grace,
                subscribers_receive_user_active_in_order,
                zero_ttl_is_rejected_and_changes_nothing,
                claim_many_and_renew_many_behave_like_loops,
                concurrent_claims_elect_one_holder,
                lease_keys_are_independent,
            ]
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($backend:expr; $($module:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        $($(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $backend;
                let fixture = $crate::conformance::Backend::fresh(&backend).await;
                $crate::conformance::$module::$case(fixture).await;
            }
        )*)*
    };
}
