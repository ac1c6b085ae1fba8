//! Helpers shared by the conformance cases.

use std::time::Duration;

use crate::ids::{RunId, UnitId, WorkerId};
use crate::queue::{Budgets, Delivery, ReserveReply, RunSpec, UnitSpec};

/// A run id.
pub fn run(name: &str) -> RunId {
    RunId::new(name).expect("valid run id")
}

/// A worker id.
pub fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid worker id")
}

/// A unit id.
pub fn unit(name: &str) -> UnitId {
    UnitId::new(name).expect("valid unit id")
}

/// A run spec named `run` with the given units (kind `file`) and budgets.
pub fn spec(run_name: &str, units: &[&str], budgets: Budgets) -> RunSpec {
    RunSpec {
        run: run(run_name),
        units: units.iter().map(|u| UnitSpec::new(unit(u), "file")).collect(),
        budgets,
        ttl: Duration::from_secs(3600),
    }
}

/// Unwraps a `Delivered` reply, failing the test with the reply otherwise.
pub fn delivered(reply: ReserveReply) -> Delivery {
    match reply {
        ReserveReply::Delivered(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}
