//! The verdict model: what an invocation says about each of its units
//! ([`UnitVerdict`], [`UnitResult`]), the trait that reads it
//! ([`BatchResults`]), and the reading that needs no report: the exit code
//! ([`ExitCodeResults`], [`termination_verdict`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_core::UnitId;

use crate::exec::process::{ProcessLimits, ProcessResult, Termination};

/// The verdict on one unit of an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitVerdict {
    /// It passed.
    Passed,
    /// It did not run by design (every test of it skipped).
    Skipped,
    /// It failed.
    Failed {
        /// `exit`, `timeout`, `signal`, `spawn` or `no_result`.
        reason: &'static str,
        /// A short description (`exit code 1`, ...).
        detail: String,
    },
}

/// What an invocation says about one of its units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitResult {
    /// The verdict.
    pub verdict: UnitVerdict,
    /// The unit's own duration, when the tool reports it (otherwise the
    /// unit gets an equal share of the invocation's).
    pub duration: Option<Duration>,
    /// The unit's own output (its failure), when the tool reports it
    /// (otherwise the tail of the invocation's output); for a skip, its reason.
    pub output: Option<String>,
}

impl From<UnitVerdict> for UnitResult {
    fn from(verdict: UnitVerdict) -> Self {
        Self { verdict, duration: None, output: None }
    }
}

/// Turns one invocation's result into one verdict per unit. Units missing
/// from the map have no result and are retried.
pub trait BatchResults: Send + Sync {
    /// Where the next invocation's tool writes its report (replacing
    /// `{report}` and set as `HOPPER_REPORT`); `None` when nothing is read.
    fn report_path(&self) -> Option<PathBuf> {
        None
    }

    /// The verdicts for `units`, all run by the invocation that gave
    /// `result` and wrote `report` (the path [`Self::report_path`] gave).
    fn verdicts(
        &self,
        units: &[UnitId],
        result: &ProcessResult,
        limits: &ProcessLimits,
        report: Option<&Path>,
    ) -> HashMap<UnitId, UnitResult>;

    /// The errors outside any test the reports read since the last call
    /// (see [`super::outside`]).
    fn take_outside_errors(&self) -> Vec<super::outside::OutsideError> {
        Vec::new()
    }
}

/// Every unit of the invocation gets the invocation's own verdict: exit 0
/// passes all of them, anything else fails all of them.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExitCodeResults;

/// The verdict an invocation's termination gives on its own.
pub fn termination_verdict(termination: &Termination, limits: &ProcessLimits) -> UnitVerdict {
    match termination {
        Termination::Exited(0) => UnitVerdict::Passed,
        Termination::Exited(code) => UnitVerdict::Failed { reason: "exit", detail: format!("exit code {code}") },
        Termination::Signaled(sig) => {
            UnitVerdict::Failed { reason: "signal", detail: format!("killed by signal {sig}") }
        }
        Termination::TimedOut => UnitVerdict::Failed {
            reason: "timeout",
            detail: match limits.timeout {
                Some(t) => format!("timed out after {:.1}s", t.as_secs_f64()),
                None => "timed out".to_owned(),
            },
        },
        Termination::Stopped => UnitVerdict::Failed { reason: "stopped", detail: "stopped".to_owned() },
        Termination::SpawnFailed(e) => UnitVerdict::Failed { reason: "spawn", detail: format!("could not start: {e}") },
    }
}

impl BatchResults for ExitCodeResults {
    fn verdicts(
        &self,
        units: &[UnitId],
        result: &ProcessResult,
        limits: &ProcessLimits,
        _report: Option<&Path>,
    ) -> HashMap<UnitId, UnitResult> {
        let mut verdict = termination_verdict(&result.termination, limits);
        // A Rust test run alone (`cargo nextest run -E {unit}`) says why it
        // failed in its panic; a batch's would be one unit's only.
        if let (UnitVerdict::Failed { reason: "exit", detail }, [_]) = (&mut verdict, units) {
            if let Some(panic) = super::libtest::panic_message(&result.output.text(usize::MAX)) {
                *detail = format!("{panic} ({detail})");
            }
        }
        units.iter().map(|u| (u.clone(), UnitResult::from(verdict.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_verdicts() {
        let limits = ProcessLimits { timeout: Some(Duration::from_secs(2)), ..ProcessLimits::default() };
        assert_eq!(termination_verdict(&Termination::Exited(0), &limits), UnitVerdict::Passed);
        assert!(matches!(
            termination_verdict(&Termination::TimedOut, &limits),
            UnitVerdict::Failed { reason: "timeout", .. }
        ));
        assert!(matches!(
            termination_verdict(&Termination::Exited(2), &limits),
            UnitVerdict::Failed { reason: "exit", ref detail } if detail == "exit code 2"
        ));
    }

    #[test]
    fn a_lone_rust_tests_exit_code_verdict_names_its_panic() {
        let mut output = crate::exec::process::OutputTail::new(4096);
        output.push(
            b"    FAIL [0.01s] demo tests::b
thread 'tests::b' panicked at src/lib.rs:9:5:
deliberate
",
        );
        let result =
            ProcessResult { termination: Termination::Exited(100), duration: Duration::from_millis(10), output };
        let units: Vec<UnitId> = ["a", "b"].iter().map(|u| UnitId::new(*u).unwrap()).collect();
        let limits = ProcessLimits::default();
        let alone = ExitCodeResults.verdicts(&units[..1], &result, &limits, None);
        assert!(matches!(
            &alone[&units[0]].verdict,
            UnitVerdict::Failed { detail, .. } if detail == "deliberate (exit code 100)"
        ));
        // A batch's panic is one of its units' only.
        let batch = ExitCodeResults.verdicts(&units, &result, &limits, None);
        assert!(matches!(&batch[&units[1]].verdict, UnitVerdict::Failed { detail, .. } if detail == "exit code 100"));
    }
}
