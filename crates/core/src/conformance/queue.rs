//! Conformance cases for [`UnitQueue`](crate::UnitQueue).

use super::support::*;
use super::{Fixture, LONG};
use crate::queue::{Budgets, InitOutcome};

/// The first `initialize` creates the run; a second with the same units is
/// told it already exists and gets the frozen budgets.
pub async fn initialize_first_caller_wins(fx: Fixture) {
    let first = spec("r1", &["a", "b"], Budgets::default());
    assert_eq!(fx.queue.initialize(&first).await.unwrap(), InitOutcome::Initialized);
    let mut second = spec("r1", &["b", "a"], Budgets::default());
    second.budgets.max_requeues = 9;
    assert_eq!(
        fx.queue.initialize(&second).await.unwrap(),
        InitOutcome::AlreadyInitialized { budgets: Budgets::default() }
    );
    let d = delivered(fx.queue.reserve(&first.run, &worker("w1"), LONG).await.unwrap());
    assert_eq!(d.unit, unit("a"));
}
