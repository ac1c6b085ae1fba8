//! JUnit XML (pytest's `--junitxml`, nextest's `[profile.*.junit]`, and most
//! other tools'), read with quick-junit's deserializer (quick-xml underneath).

use quick_junit::{NonSuccessKind, Report, TestCaseStatus};

use super::case::{CaseStatus, ReportedCase};
use super::outside::OutsideError;
use super::skips;

/// How pytest's JUnit words an error in a test's teardown.
const PYTEST_TEARDOWN: &str = "failed on teardown with ";
/// How pytest's JUnit words a file that did not collect.
const PYTEST_COLLECTION: &str = "collection failure";

/// Parses a JUnit XML report into its test cases, in report order.
///
/// A report whose root is a single `<testsuite>` (rspec_junit_formatter,
/// Maven's surefire) is read as if it were wrapped in `<testsuites>`.
///
/// A case with several status elements (pytest 9's subtests, a failed call
/// with a teardown error) is read as one failed case with all its messages
/// (see [`super::junit_merge`]).
pub fn parse(xml: &str) -> Result<Vec<ReportedCase>, quick_junit::DeserializeError> {
    let mut taken = Vec::new();
    let report = match deserialize(xml) {
        Ok(report) => report,
        Err(error) => match super::junit_merge::merge_statuses(xml) {
            Some((merged, teardowns)) => {
                taken = teardowns;
                deserialize(&merged).map_err(|_| error)?
            }
            None => return Err(error),
        },
    };
    let mut cases = Vec::new();
    for suite in report.test_suites {
        for case in suite.test_cases {
            let name = case.name.as_str().to_owned();
            let mut ids = vec![name.clone()];
            if let Some(classname) = case.classname.as_ref().map(|c| c.as_str()).filter(|c| !c.is_empty()) {
                ids.push(format!("{classname}.{name}"));
                ids.push(format!("{classname}::{name}"));
            }
            let mut output = String::new();
            let (status, message) = match &case.status {
                TestCaseStatus::Success { .. } => (CaseStatus::Passed, None),
                // pytest's expected failures are skips of type `pytest.xfail`.
                TestCaseStatus::Skipped { message, ty, .. } => {
                    let reason = message.as_ref().map(|m| m.as_str().to_owned());
                    let xfail = ty.as_ref().is_some_and(|t| t.as_str() == "pytest.xfail");
                    let reason = match (xfail, reason) {
                        (true, r) => Some(skips::xfail_reason(r.as_deref())),
                        (false, r) => r,
                    };
                    (CaseStatus::Skipped, reason)
                }
                TestCaseStatus::NonSuccess { kind, message, ty, description, .. } => {
                    if let Some(text) = description {
                        output.push_str(text.as_str());
                    }
                    let what = match kind {
                        NonSuccessKind::Failure => "failure",
                        NonSuccessKind::Error => "error",
                    };
                    let message = message
                        .as_ref()
                        .map(|m| m.as_str().to_owned())
                        .or_else(|| ty.as_ref().map(|t| t.as_str().to_owned()))
                        .unwrap_or_else(|| format!("reported as a test {what}"));
                    (CaseStatus::Failed, Some(message))
                }
            };
            for stream in [&case.system_out, &case.system_err].into_iter().flatten() {
                if !output.is_empty() && !output.ends_with('\n') {
                    output.push('\n');
                }
                output.push_str(stream.as_str());
            }
            let mut reported = ReportedCase { ids, status, duration: case.time, message, output, outside: None };
            pytest_outside_error(&mut reported, &case);
            if let Some(teardown) = taken.iter().find(|t| t.case == cases.len()) {
                let what = teardown.message.strip_prefix(PYTEST_TEARDOWN).unwrap_or(&teardown.message);
                reported.outside = Some(OutsideError {
                    group: String::new(),
                    phase: "teardown".into(),
                    message: what.trim().trim_matches('"').to_owned(),
                    output: teardown.text.clone(),
                });
            }
            cases.push(reported);
        }
    }
    Ok(cases)
}

/// pytest's JUnit gives an error outside a test as a case: a teardown
/// error on the test that ran last before it (whatever fixture's it was),
/// a collection error as a case named for the module with no class. Such
/// an error is kept apart from the test (whose own call passed: a failed
/// call would be a second element), attached to the file.
fn pytest_outside_error(reported: &mut ReportedCase, case: &quick_junit::TestCase) {
    let TestCaseStatus::NonSuccess { kind: NonSuccessKind::Error, message: Some(message), description, .. } =
        &case.status
    else {
        return;
    };
    let output = description.as_ref().map(|d| d.as_str().to_owned()).unwrap_or_default();
    if let Some(what) = message.as_str().strip_prefix(PYTEST_TEARDOWN) {
        let what = what.trim().trim_matches('"').to_owned();
        reported.status = CaseStatus::Passed;
        reported.message = None;
        // The file is the unit's: filled in when the case is matched.
        reported.outside = Some(OutsideError { group: String::new(), phase: "teardown".into(), message: what, output });
    } else if message.as_str() == PYTEST_COLLECTION && case.classname.as_ref().is_none_or(|c| c.is_empty()) {
        // `tests.test_a` is the module of `tests/test_a.py`; no unit is this case.
        let file = format!("{}.py", case.name.as_str().replace('.', "/"));
        let last = output.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or(PYTEST_COLLECTION);
        let what = last.strip_prefix("E ").map(str::trim).unwrap_or(last).to_owned();
        reported.ids.clear();
        reported.outside = Some(OutsideError { group: file, phase: "collection".into(), message: what, output });
    }
}

fn deserialize(xml: &str) -> Result<Report, quick_junit::DeserializeError> {
    match Report::deserialize_from_str(xml) {
        Ok(report) => Ok(report),
        Err(error) => match wrap_bare_suite(xml) {
            Some(wrapped) => Report::deserialize_from_str(&wrapped).map_err(|_| error),
            None => Err(error),
        },
    }
}

fn wrap_bare_suite(xml: &str) -> Option<String> {
    let body = match xml.trim_start().strip_prefix("<?xml") {
        Some(rest) => &rest[rest.find("?>")? + 2..],
        None => xml,
    };
    body.trim_start().starts_with("<testsuite").then(|| format!("<testsuites>{body}</testsuites>"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// What pytest 9 writes for a file with a pass, a failure, a skip and parameters.
    const PYTEST: &str = r#"<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="0.079" timestamp="2026-12-01T08:22:25.139142+00:00" hostname="vm"><testcase classname="test_a" name="test_ok" time="0.250" /><testcase classname="test_a" name="test_bad" time="0.001"><failure message="AssertionError: one is not two&#10;assert 1 == 2">def test_bad():
&gt;       assert 1 == 2, "one is not two"
E       AssertionError: one is not two</failure></testcase><testcase classname="test_a" name="test_p[a b]" time="0.000" /><testcase classname="test_a" name="test_skip" time="0.000"><skipped type="pytest.skip" message="nope">test_a.py:8: nope</skipped></testcase></testsuite></testsuites>"#;

    #[test]
    fn reads_pytest_junit() {
        let cases = parse(PYTEST).unwrap();
        assert_eq!(cases.len(), 4);
        assert_eq!(cases[0].ids, vec!["test_ok", "test_a.test_ok", "test_a::test_ok"]);
        assert_eq!(cases[0].status, CaseStatus::Passed);
        assert_eq!(cases[0].duration, Some(Duration::from_millis(250)));
        assert_eq!(cases[1].status, CaseStatus::Failed);
        assert_eq!(cases[1].message.as_deref(), Some("AssertionError: one is not two\nassert 1 == 2"));
        assert!(cases[1].output.contains(">       assert 1 == 2"), "{}", cases[1].output);
        assert_eq!(cases[2].ids[1], "test_a.test_p[a b]");
        assert_eq!(cases[3].status, CaseStatus::Skipped);
    }

    #[test]
    fn reads_a_bare_testsuite_root_and_errors() {
        let xml = r#"<?xml version="1.0"?>
<testsuite name="rspec" tests="1"><testcase classname="spec.a_spec" name="x" time="0.1"><error message="boom"/><system-out>printed</system-out></testcase></testsuite>"#;
        let cases = parse(xml).unwrap();
        assert_eq!(cases.len(), 1);
        assert_eq!(cases[0].status, CaseStatus::Failed);
        assert_eq!(cases[0].message.as_deref(), Some("boom"));
        assert_eq!(cases[0].output, "printed");
    }

    #[test]
    fn pytest_errors_outside_tests_are_kept_apart_from_the_tests() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="2" failures="0" skipped="0" tests="3"><testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure">ImportError while importing test module
E   ModuleNotFoundError: No module named 'nope'</error></testcase><testcase classname="test_mod" name="test_a" time="0.000" /><testcase classname="test_mod" name="test_b" time="0.000"><error message="failed on teardown with &quot;RuntimeError: module teardown boom&quot;">E       RuntimeError: module teardown boom</error></testcase></testsuite></testsuites>"#;
        let cases = parse(xml).unwrap();
        assert!(cases[0].ids.is_empty(), "a collection error is no unit's case");
        let collection = cases[0].outside.as_ref().unwrap();
        assert_eq!((collection.group.as_str(), collection.phase.as_str()), ("tests/test_broken.py", "collection"));
        assert_eq!(collection.message, "ModuleNotFoundError: No module named 'nope'");
        assert_eq!(cases[2].status, CaseStatus::Passed, "the test itself passed");
        let teardown = cases[2].outside.as_ref().unwrap();
        assert_eq!((teardown.group.as_str(), teardown.message.as_str()), ("", "RuntimeError: module teardown boom"));
        let units = [leasehold_core::UnitId::new("test_mod.py::test_b").unwrap()];
        let errors = super::super::outside_errors(&units, &cases);
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[1].group, "test_mod.py", "the file of the unit the case belongs to");
    }

    #[test]
    fn pytest_subtests_are_one_failed_case_with_every_message() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="3" skipped="0" tests="5"><testcase classname="test_sub" name="test_sub" time="0.037"><failure message="AssertionError: i is 1&#10;assert 1 == 0">E               AssertionError: i is 1</failure><failure message="AssertionError: i is 2&#10;assert 2 == 0">E               AssertionError: i is 2</failure><failure message="contains 2 failed subtests">contains 2 failed subtests</failure></testcase><testcase classname="test_sub" name="test_ok" time="0.000" /></testsuite></testsuites>"#;
        let cases = parse(xml).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].status, CaseStatus::Failed);
        let message = cases[0].message.as_deref().unwrap();
        assert!(message.contains("i is 1") && message.contains("i is 2"), "{message}");
        assert!(cases[0].output.contains("AssertionError: i is 2"), "{}", cases[0].output);
        assert_eq!(cases[1].status, CaseStatus::Passed);
    }

    #[test]
    fn rejects_what_is_not_junit() {
        assert!(parse("<html><body>nope</body></html>").is_err());
        assert!(parse("<testsuites><testsuite name=\"a\"><testcase name=\"x\">").is_err(), "truncated report");
    }
}
