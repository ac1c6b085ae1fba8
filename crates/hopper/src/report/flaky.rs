//! How a flaky unit (failed at least once, then passed on a retry) counts in
//! the build's verdict: `--flaky-result pass|fail`.
//!
//! The default is to pass, as nextest and ci-queue do: the retry budget is
//! there so that one bad attempt does not turn a build red. Teams that track
//! flakiness as a defect choose `fail`, and their dashboards then show the
//! unit as a failure whose earlier attempts are `<flakyFailure>` elements.

use std::fmt;

/// Whether a flaky unit passes or fails the build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlakyResult {
    /// A flaky unit passes (it is still listed as flaky).
    #[default]
    Pass,
    /// A flaky unit fails the build (exit 1) and is a failed JUnit case.
    Fail,
}

impl FlakyResult {
    /// The values `--flaky-result` takes, as it spells them.
    pub const NAMES: [&'static str; 2] = ["pass", "fail"];

    /// The value spelled `name` (one of [`Self::NAMES`]); `None` otherwise.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "pass" => Some(FlakyResult::Pass),
            "fail" => Some(FlakyResult::Fail),
            _ => None,
        }
    }
}

impl fmt::Display for FlakyResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlakyResult::Pass => "pass",
            FlakyResult::Fail => "fail",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in FlakyResult::NAMES {
            assert_eq!(FlakyResult::from_name(name).map(|r| r.to_string()).as_deref(), Some(name));
        }
        assert_eq!(FlakyResult::from_name("maybe"), None);
        assert_eq!(FlakyResult::default(), FlakyResult::Pass);
    }
}
