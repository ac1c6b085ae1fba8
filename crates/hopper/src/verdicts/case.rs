//! One test case as a tool's report gives it: what every report reader
//! returns, and what the verdicts are summed from.

use std::time::Duration;

use super::outside::OutsideError;

/// The state of one test case in a tool's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseStatus {
    /// It passed.
    Passed,
    /// It failed (a failure or an error).
    Failed,
    /// It did not run by design (skipped, ignored, pending).
    Skipped,
}

/// One test case as the tool reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedCase {
    /// The ids it answers to (see [`super::matching`]).
    pub ids: Vec<String>,
    /// Its state.
    pub status: CaseStatus,
    /// Its own duration, when reported.
    pub duration: Option<Duration>,
    /// The failure message, when it failed.
    pub message: Option<String>,
    /// Its failure text and captured output (may be empty).
    pub output: String,
    /// An error outside any test that the report gives with this case
    /// (pytest's JUnit puts a module fixture's teardown error on the test
    /// that ran last), or as a case of its own (a collection error, RSpec's
    /// errors outside of examples: such a case has no ids). An empty group
    /// means the file of the unit the case belongs to.
    pub outside: Option<OutsideError>,
}
