//! Quarantine: a real pytest suite with a test that always fails. With that
//! test in the `--quarantine` file (or `HOPPER_QUARANTINE`) the build is
//! green, and the report lists the test on its own with its failure; the
//! JUnit keeps its failure, marked with a `hopper.quarantined` property
//! (read back with junitparser). The same build without the quarantine is
//! red. On the memory queue (`hopper run` gives the verdict) and on a
//! private Redis (`hopper report` does). A missing quarantine file is a
//! clear error that runs nothing. A missing pytest, junitparser or
//! redis-server fails these tests, never skips them.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{pytest_command, shown, texts, venv_python, Build, Project};

/// A passing test and one that always fails; the quarantine file names the
/// failing one (with a comment and a blank line, which are ignored).
fn suite() -> Project {
    Project::new(&[
        (
            "test_quarantine.py",
            "def test_ok():\n    pass\n\ndef test_known_bad():\n    assert False, 'known bad, quarantined'\n",
        ),
        ("quarantine.txt", "# tracked in issue 123\n\ntest_quarantine.py::test_known_bad\n"),
    ])
}

/// The failing test's id, as discovery names it.
const BAD: &str = "test_quarantine.py::test_known_bad";

/// The options of every build here: one slot, no retry.
const OPTIONS: [&str; 5] = ["--no-timings", "-j", "1", "--max-requeues", "0"];

/// The build on the memory queue with `extra` options and `env`.
fn on_memory(project: &Project, extra: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let mut run = project.hopper();
    run.arg("run").args(OPTIONS).args(["--discover", "pytest", "--junit"]).arg(project.junit()).args(extra);
    for (name, value) in env {
        run.env(name, value);
    }
    let output = run.arg("--").args(pytest_command()).output().unwrap();
    let shown = shown(&output);
    (output, shown)
}

/// The quarantined test's JUnit case as junitparser reads it: its results'
/// types and its `hopper.quarantined` property.
const READ_CASE: &str = r#"
import json, sys
from junitparser.xunit2 import JUnitXml

for suite in JUnitXml.fromfile(sys.argv[1]):
    for case in suite:
        if case.name == sys.argv[2]:
            props = {p.name: p.value for p in case.properties()}
            print(json.dumps({"result": [type(r).__name__ for r in case.result],
                              "quarantined": props.get("hopper.quarantined"),
                              "system_out": case.system_out or ""}))
"#;

/// Checks the green, quarantined build: exit 0, the failure listed on its
/// own, the JUnit keeping the failure and marking it.
fn check_quarantined(output: &Output, shown: &str, junit: &Path) {
    assert_eq!(output.status.code(), Some(0), "a quarantined failure leaves the build green\n{shown}");
    assert!(shown.contains("QUARANTINED units (1): run and reported, but never fail the build"), "{shown}");
    assert!(shown.contains(&format!("QUARANTINED {BAD}: FAILED (")), "{shown}");
    assert!(shown.contains("known bad, quarantined"), "the failure's output is shown\n{shown}");
    assert!(!shown.contains("FAILED units"), "{shown}");
    assert!(
        shown.contains(
            "PASSED: 2 units, 1 passed (0 flaky), 0 failed, 0 unfinished, 1 quarantined (1 failed, not counted)"
        ),
        "{shown}"
    );
    let read = Command::new(venv_python()).args(["-c", READ_CASE]).arg(junit).arg("test_known_bad").output().unwrap();
    let (stdout, stderr) = texts(&read);
    assert!(read.status.success(), "junitparser (cargo xtask setup installs it):\n{stderr}");
    let case: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(case["result"], serde_json::json!(["Failure"]), "the JUnit keeps the real status: {case}");
    let property = case["quarantined"].as_str().unwrap_or_default();
    assert!(property.starts_with("FAILED (") && property.ends_with("quarantined: does not fail the build"), "{case}");
    assert!(case["system_out"].as_str().unwrap_or_default().contains("quarantined: does not fail the build"), "{case}");
}

fn check_red(output: &Output, shown: &str) {
    assert_eq!(output.status.code(), Some(1), "without the quarantine the failure fails the build\n{shown}");
    assert!(shown.contains(&format!("FAIL {BAD} (")), "{shown}");
    assert!(!shown.contains("QUARANTINED"), "{shown}");
}

#[test]
fn on_memory_a_quarantined_failure_leaves_the_build_green_and_is_listed_apart() {
    let project = suite();
    let (output, shown) = on_memory(&project, &[], &[]);
    check_red(&output, &shown);

    let (output, shown) = on_memory(&project, &["--quarantine", "quarantine.txt"], &[]);
    check_quarantined(&output, &shown, &project.junit());
    let (output, shown) = on_memory(&project, &[], &[("HOPPER_QUARANTINE", "quarantine.txt")]);
    check_quarantined(&output, &shown, &project.junit());

    let (output, shown) = on_memory(&project, &["--quarantine", "no-such-list.txt"], &[]);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(shown.contains("cannot read the --quarantine file no-such-list.txt"), "{shown}");
    assert!(!shown.contains("QUARANTINED") && !shown.contains("passed"), "nothing ran\n{shown}");
}

#[test]
fn on_redis_the_report_applies_the_quarantine() {
    let project = suite();
    let build = Build::on_shared_redis("hopper-quarantine");
    let worker = project
        .hopper()
        .arg("run")
        .args(build.args())
        .args(OPTIONS)
        .args(["--worker", "w1", "--discover", "pytest", "--"])
        .args(pytest_command())
        .output()
        .unwrap();
    assert_eq!(worker.status.code(), Some(0), "the worker leaves the verdict to the report\n{}", shown(&worker));
    let report = |extra: &[&str], env: &[(&str, &str)]| {
        let mut report = project.hopper();
        report.arg("report").args(build.args()).arg("--junit").arg(project.junit()).args(extra);
        for (name, value) in env {
            report.env(name, value);
        }
        let output = report.output().unwrap();
        let shown = shown(&output);
        (output, shown)
    };
    let (output, shown) = report(&[], &[]);
    check_red(&output, &shown);
    let (output, shown) = report(&["--quarantine", "quarantine.txt"], &[]);
    check_quarantined(&output, &shown, &project.junit());
    let (output, shown) = report(&[], &[("HOPPER_QUARANTINE", "quarantine.txt")]);
    check_quarantined(&output, &shown, &project.junit());
    let (output, shown) = report(&["--quarantine", "no-such-list.txt"], &[]);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(shown.contains("no-such-list.txt"), "{shown}");
}

/// Local runs (mem://, no build id of their own) are each a build apart:
/// a quarantined unit that passes 20 of them in a row, counted in the
/// timings file, is named ready to leave on the 20th, not before.
#[test]
fn on_memory_a_unit_that_passed_twenty_local_builds_in_a_row_is_ready_to_leave() {
    let project = Project::new(&[("ok.sh", "exit 0\n"), ("units.txt", "ok.sh\n"), ("q.txt", "ok.sh\n")]);
    let run = || {
        let output = project
            .hopper()
            .args(["run", "-j", "1", "--units-from", "units.txt", "--timings", "t.json", "--quarantine", "q.txt"])
            .args(["--", "sh", "{unit}"])
            .output()
            .unwrap();
        let shown = shown(&output);
        assert_eq!(output.status.code(), Some(0), "{shown}");
        shown
    };
    for n in 1..20 {
        let shown = run();
        assert!(shown.contains("QUARANTINED ok.sh: passed"), "{shown}");
        assert!(!shown.contains("ready to leave"), "after {n} builds\n{shown}");
    }
    let shown = run();
    assert!(
        shown.contains(
            "QUARANTINED ok.sh: passed; ready to leave the quarantine: passed in each of the last 20 builds in a row"
        ),
        "{shown}"
    );
    assert!(shown.contains("READY ok.sh"), "{shown}");
}

#[test]
fn a_quarantined_failure_does_not_count_toward_max_failures() {
    let mut text = String::from("def test_a_known_bad():\n    assert False, 'known bad'\n");
    for i in 0..5 {
        text.push_str(&format!("\ndef test_b_{i}():\n    pass\n"));
    }
    let project =
        Project::new(&[("test_limit.py", text), ("quarantine.txt", "test_limit.py::test_a_known_bad\n".into())]);
    let (output, shown) = on_memory(&project, &["--max-failures", "1"], &[]);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(shown.contains("stopped after 1 failures (--max-failures); "), "{shown}");

    let (output, shown) = on_memory(&project, &["--max-failures", "1", "--quarantine", "quarantine.txt"], &[]);
    assert_eq!(output.status.code(), Some(0), "a quarantined failure never stops the build\n{shown}");
    assert!(!shown.contains("stopped after"), "{shown}");
    assert!(shown.contains("6 units, 5 passed"), "every test ran\n{shown}");
}
