//! The report as JUnit XML, in the shape dashboards read retries in: Maven
//! Surefire's `<flakyFailure>` and `<rerunFailure>` elements, which nextest
//! writes too (and quick-junit models).
//!
//! * A unit that passed after failing is a passing case with one
//!   `<flakyFailure>` per failed attempt, in order.
//! * A unit that failed on every attempt is a failing case whose first
//!   attempt is the `<failure>` (or `<error>`), and each later attempt a
//!   `<rerunFailure>`: as Surefire has it, the first failure is the one that
//!   tells what went wrong; the reruns show that it kept going wrong.
//! * With `--flaky-result fail` a flaky unit is a failing case (type
//!   `flaky`) that keeps its `<flakyFailure>` elements; the attempt that
//!   passed is named in its `hopper.flaky` property and its system-out.
//! * A unit reclaimed from a worker that stopped responding says from whom
//!   in its `hopper.reclaimed` property.
//! * A quarantined unit keeps its real status; its `hopper.quarantined`
//!   property and its system-out say its outcome, that it does not fail
//!   the build, and when it is ready to leave the quarantine.

use std::path::Path;
use std::time::Duration;

use leasehold_core::Outcome;
use quick_junit::{FlakyOrRerun, NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestRerun, TestSuite};

use super::flaky::FlakyResult;
use super::quarantine::QUARANTINE_PROPERTY;
use super::run_report::RECLAIMED_PROPERTY;
use super::{FailedAttempt, RunReport, UnitReport};
use crate::errors::HopperError;
use crate::verdicts::names;

/// The property of a flaky case, with `--flaky-result fail`, that says which
/// attempt passed.
pub const FLAKY_PROPERTY: &str = "hopper.flaky";
/// The property of a worker-specific failure: where it failed and passed.
pub const WORKER_SPECIFIC_PROPERTY: &str = "hopper.worker-specific";

/// One failed attempt as a `<flakyFailure>` or `<rerunFailure>` (which of
/// the two is the case's to say).
fn rerun(attempt: &FailedAttempt) -> TestRerun {
    let mut rerun = TestRerun::new(NonSuccessKind::Failure);
    rerun
        .set_message(super::run_report::attempt_on_worker(attempt))
        .set_type(attempt.reason.as_str())
        .set_time(Duration::from_millis(attempt.duration_ms));
    if !attempt.output.is_empty() {
        rerun.set_system_out(attempt.output.as_str());
    }
    rerun
}

/// The attempt that passed, for a flaky unit: one after its failed ones.
fn passing_attempt(unit: &UnitReport) -> String {
    let by = unit.finalized_by.as_ref().map(|w| format!(" on worker {w}")).unwrap_or_default();
    format!("passed on attempt {}{by}", unit.failed_attempts.len() + 1)
}

/// The status of one unit's case.
fn status_of(unit: &UnitReport, flaky_result: FlakyResult, not_run: Option<&str>) -> TestCaseStatus {
    match unit.outcome {
        Some(Outcome::Passed) if unit.is_flaky() && flaky_result == FlakyResult::Fail => {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
            let failed = unit.failed_attempts.len();
            status
                .set_message(format!(
                    "flaky: failed {failed} time(s), then {}; --flaky-result fail counts it as a failure",
                    passing_attempt(unit)
                ))
                .set_type("flaky");
            status.add_reruns(unit.failed_attempts.iter().map(rerun));
            status.set_rerun_kind(FlakyOrRerun::Flaky);
            status
        }
        Some(Outcome::Passed) => {
            let mut status = TestCaseStatus::success();
            status.add_reruns(unit.failed_attempts.iter().map(rerun));
            status
        }
        Some(Outcome::Skipped) => {
            let mut status = TestCaseStatus::skipped();
            if let Some(reason) = &unit.skip_reason {
                status.set_message(reason.as_str());
            }
            status
        }
        Some(Outcome::Failed) => {
            let first = unit.failed_attempts.first().map(|a| a.detail.as_str()).unwrap_or_default();
            let kind = if names::is_error(first) { NonSuccessKind::Error } else { NonSuccessKind::Failure };
            let mut status = TestCaseStatus::non_success(kind);
            if let Some((first, later)) = unit.failed_attempts.split_first() {
                status.set_message(first.detail.as_str()).set_type(first.reason.as_str());
                if !first.output.is_empty() {
                    status.set_description(first.output.as_str());
                }
                status.add_reruns(later.iter().map(rerun));
                status.set_rerun_kind(FlakyOrRerun::Rerun);
            }
            status
        }
        // Never finished: skipped when the build stopped at its failure limit
        // first (`not_run` says so), else an error.
        None => match not_run {
            Some(reason) => {
                let mut status = TestCaseStatus::skipped();
                status.set_message(reason).set_type("not_run");
                status
            }
            None => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
                status.set_message("unfinished: no worker finished this unit").set_type("unfinished");
                status
            }
        },
    }
}

impl RunReport {
    /// The report as JUnit XML: one test case per unit (see the module doc
    /// for retries and flaky units); unfinished units are errors; each
    /// group skipped whole, or failed outside its tests, is a case of its own.
    pub fn junit(&self) -> Report {
        let mut suite = TestSuite::new(format!("hopper {}", self.run));
        let mut total_ms = 0u64;
        let not_run = self.not_run_reason();
        for unit in &self.units {
            total_ms += unit.duration_ms;
            let id = unit.unit.as_str();
            let mut case = TestCase::new(names::own_name(id), status_of(unit, self.flaky_result, not_run.as_deref()));
            let kind = if unit.kind.is_empty() { "hopper" } else { unit.kind.as_str() };
            case.set_classname(names::classname_of(id).unwrap_or(kind));
            case.add_property(Property::new(names::UNIT_PROPERTY, id));
            let mut notes = String::new();
            if unit.is_flaky() && self.flaky_result == FlakyResult::Fail {
                case.add_property(Property::new(FLAKY_PROPERTY, passing_attempt(unit)));
                notes.push_str(&format!(
                    "hopper: {}; --flaky-result fail counts it as a failure\n",
                    passing_attempt(unit)
                ));
            }
            if let Some((failed_on, passed_on)) = unit.worker_specific() {
                let failed_on: Vec<&str> = failed_on.iter().map(|w| w.as_str()).collect();
                let note = format!("failed on {}, passed on {passed_on}", failed_on.join(", "));
                notes.push_str(&format!("hopper: worker-specific failure: {note}\n"));
                case.add_property(Property::new(WORKER_SPECIFIC_PROPERTY, note));
            }
            if !unit.reclaimed_from.is_empty() {
                case.add_property(Property::new(RECLAIMED_PROPERTY, unit.reclaim_note()));
            }
            // Its real status stays (a dashboard sees it fail), marked as
            // not failing the build.
            if let Some(note) = self.quarantine_note(unit) {
                notes.push_str(&format!("hopper: {note}\n"));
                case.add_property(Property::new(QUARANTINE_PROPERTY, note));
            }
            if !notes.is_empty() {
                case.set_system_out(notes);
            }
            case.set_time(Duration::from_millis(unit.duration_ms));
            suite.add_test_case(case);
        }
        // A group skipped whole is a skipped case of its own, with its reason.
        for skip in &self.outside_skips {
            let mut status = TestCaseStatus::skipped();
            status.set_message(skip.message.as_str()).set_type("skipped");
            let mut case = TestCase::new(skip.group.as_str(), status);
            case.set_classname(skip.group.as_str());
            suite.add_test_case(case);
        }
        // One case per group that failed outside its tests, named for the group.
        for (group, errors) in self.outside_by_group() {
            let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
            let message: Vec<String> = errors.iter().map(|e| format!("{} error: {}", e.phase, e.message)).collect();
            let phases: Vec<&str> = errors.iter().map(|e| e.phase.as_str()).collect();
            status.set_message(message.join("; ")).set_type(phases.join(", "));
            let output: Vec<&str> = errors.iter().map(|e| e.output.as_str()).filter(|o| !o.is_empty()).collect();
            if !output.is_empty() {
                status.set_description(output.join("\n"));
            }
            let mut case = TestCase::new(group, status);
            case.set_classname(group);
            suite.add_test_case(case);
        }
        let mut report = Report::new("hopper");
        report.set_time(Duration::from_millis(total_ms));
        report.add_test_suite(suite);
        report
    }

    /// Writes the JUnit XML to `path`.
    pub fn write_junit(&self, path: &Path) -> Result<(), HopperError> {
        let xml =
            self.junit().to_string().map_err(|source| HopperError::JunitSerialize { path: path.to_owned(), source })?;
        let write = |source| HopperError::JunitWrite { path: path.to_owned(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(write)?;
        }
        std::fs::write(path, xml).map_err(write)
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::{RunId, UnitId, WorkerId};

    use super::*;

    fn attempt(detail: &str) -> FailedAttempt {
        FailedAttempt {
            reason: "exit".into(),
            detail: detail.into(),
            output: format!("output of {detail}\n"),
            duration_ms: 5,
            worker: Some(WorkerId::new("w1").unwrap()),
        }
    }

    fn unit(name: &str, outcome: Outcome, failed: &[&str]) -> UnitReport {
        UnitReport {
            unit: UnitId::new(name).unwrap(),
            kind: "test".into(),
            outcome: Some(outcome),
            reason: None,
            duration_ms: 7,
            finalized_by: Some(WorkerId::new("w2").unwrap()),
            failed_attempts: failed.iter().map(|d| attempt(d)).collect(),
            reclaimed_from: vec![],
            requeues: failed.len() as u32,
            abandoned: 0,
            finalized_events: 1,
            skip_reason: None,
            xpassed: false,
        }
    }

    fn report() -> RunReport {
        RunReport {
            run: RunId::new("b1").unwrap(),
            units: vec![
                unit("t.py::ok", Outcome::Passed, &[]),
                unit("t.py::flaky", Outcome::Passed, &["first try", "second try"]),
                unit("t.py::bad", Outcome::Failed, &["attempt 1", "attempt 2", "attempt 3"]),
            ],
            stale_rejected: 0,
            worker_errors: vec![],
            outside_errors: vec![],
            outside_skips: vec![],
            finished_workers: vec![],
            flaky_result: FlakyResult::Pass,
            quarantine: Default::default(),
            stopped_after: None,
        }
    }

    #[test]
    fn a_unit_a_stopped_build_never_ran_is_skipped_saying_why() {
        let mut stopped = report();
        stopped.units.push(UnitReport::new(UnitId::new("t.py::later").unwrap(), "test".into()));
        let TestCaseStatus::NonSuccess { .. } = &case(&stopped.junit(), "later").status else {
            panic!("an unfinished unit of a build that did not stop is an error")
        };
        stopped.stopped_after = Some(3);
        let junit = stopped.junit();
        let TestCaseStatus::Skipped { message, .. } = &case(&junit, "later").status else { panic!("skipped") };
        let message = message.as_ref().unwrap().as_str();
        assert_eq!(message, "not run: the build stopped after 3 failures (--max-failures 3)");
        assert!(matches!(case(&junit, "bad").status, TestCaseStatus::NonSuccess { .. }), "failures stay failures");
    }

    fn case<'a>(report: &'a Report, name: &str) -> &'a TestCase {
        report.test_suites[0].test_cases.iter().find(|c| c.name.as_str() == name).unwrap()
    }

    #[test]
    fn a_flaky_unit_passes_with_a_flaky_failure_per_failed_attempt() {
        let junit = report().junit();
        let TestCaseStatus::Success { flaky_runs } = &case(&junit, "flaky").status else { panic!("passes") };
        let messages: Vec<_> = flaky_runs.iter().map(|r| r.message.as_ref().unwrap().as_str()).collect();
        assert_eq!(messages, ["first try on w1", "second try on w1"], "each attempt names its worker");
        let xml = junit.to_string().unwrap();
        assert_eq!(xml.matches("<flakyFailure").count(), 2, "{xml}");
        // It failed only on w1 and passed on w2: a worker-specific failure.
        let flaky = case(&junit, "flaky");
        let property = flaky.properties.iter().find(|p| p.name.as_str() == WORKER_SPECIFIC_PROPERTY).unwrap();
        assert_eq!(property.value.as_str(), "failed on w1, passed on w2");
        assert!(case(&junit, "bad").properties.iter().all(|p| p.name.as_str() != WORKER_SPECIFIC_PROPERTY));
    }

    #[test]
    fn a_failed_unit_is_its_first_attempt_then_a_rerun_failure_per_retry() {
        let junit = report().junit();
        let TestCaseStatus::NonSuccess { message, reruns, description, .. } = &case(&junit, "bad").status else {
            panic!("fails")
        };
        assert_eq!(message.as_ref().unwrap().as_str(), "attempt 1");
        assert_eq!(description.as_ref().unwrap().as_str(), "output of attempt 1\n");
        assert_eq!(reruns.kind, FlakyOrRerun::Rerun);
        let later: Vec<_> = reruns.runs.iter().map(|r| r.message.as_ref().unwrap().as_str()).collect();
        assert_eq!(later, ["attempt 2 on w1", "attempt 3 on w1"]);
        let xml = junit.to_string().unwrap();
        assert_eq!(xml.matches("<rerunFailure").count(), 2, "{xml}");
        assert!(xml.contains("<failure message=\"attempt 1\" type=\"exit\">"), "{xml}");
    }

    #[test]
    fn with_flaky_result_fail_a_flaky_unit_is_a_failure_that_keeps_its_flaky_failures() {
        let mut report = report();
        report.flaky_result = FlakyResult::Fail;
        let junit = report.junit();
        let flaky = case(&junit, "flaky");
        let TestCaseStatus::NonSuccess { kind, message, ty, reruns, .. } = &flaky.status else { panic!("fails") };
        assert_eq!(*kind, NonSuccessKind::Failure);
        assert_eq!(ty.as_ref().unwrap().as_str(), "flaky");
        assert!(
            message.as_ref().unwrap().as_str().contains("failed 2 time(s), then passed on attempt 3"),
            "{message:?}"
        );
        assert_eq!((reruns.kind, reruns.runs.len()), (FlakyOrRerun::Flaky, 2));
        let property = flaky.properties.iter().find(|p| p.name.as_str() == FLAKY_PROPERTY).unwrap();
        assert_eq!(property.value.as_str(), "passed on attempt 3 on worker w2");
        let xml = junit.to_string().unwrap();
        assert_eq!(xml.matches("<flakyFailure").count(), 2, "{xml}");
        // The others are as they were.
        assert!(matches!(case(&junit, "ok").status, TestCaseStatus::Success { .. }));
    }
}
