//! JUnit XML (pytest's `--junitxml`, nextest's `[profile.*.junit]`, and most
//! other tools'), read with quick-junit's deserializer (quick-xml underneath).

use quick_junit::{NonSuccessKind, Report, TestCaseStatus};

use super::case::{CaseStatus, ReportedCase};

/// Parses a JUnit XML report into its test cases, in report order.
///
/// A report whose root is a single `<testsuite>` (rspec_junit_formatter,
/// Maven's surefire) is read as if it were wrapped in `<testsuites>`.
pub fn parse(xml: &str) -> Result<Vec<ReportedCase>, quick_junit::DeserializeError> {
    let report = match Report::deserialize_from_str(xml) {
        Ok(report) => report,
        Err(error) => match wrap_bare_suite(xml) {
            Some(wrapped) => Report::deserialize_from_str(&wrapped).map_err(|_| error)?,
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
                TestCaseStatus::Skipped { .. } => (CaseStatus::Skipped, None),
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
            cases.push(ReportedCase { ids, status, duration: case.time, message, output });
        }
    }
    Ok(cases)
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
    fn rejects_what_is_not_junit() {
        assert!(parse("<html><body>nope</body></html>").is_err());
        assert!(parse("<testsuites><testsuite name=\"a\"><testcase name=\"x\">").is_err(), "truncated report");
    }
}
