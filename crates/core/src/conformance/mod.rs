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
            ],
            lease: [
                claim_gives_one_holder,
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
