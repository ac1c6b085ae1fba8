//! Flaky results as dashboards read them: a real pytest suite through
//! `hopper run` with retries, where one test fails its first attempt and
//! passes the next and one always fails. The JUnit is read back with
//! junitparser's xunit2 reader (the venv `cargo xtask setup` makes), which
//! knows Surefire's `<flakyFailure>` and `<rerunFailure>`; and
//! `--flaky-result fail` (or `HOPPER_FLAKY_RESULT=fail`) turns a build that
//! is green by default red. On the memory queue and on a private Redis,
//! where `hopper report` gives the verdict. A missing pytest, junitparser or
//! redis-server fails these tests, never skips them.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use common::{pytest_command, texts, venv_python, Build, Project};

/// A test that fails its first attempt (it leaves a marker file) and passes
/// the next; a passing one; and, when `always` holds, one that always fails.
fn suite(always: bool) -> Project {
    let mut text = String::from(
        "import os\n\nMARKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'flaky.marker')\n\n\
         def test_ok():\n    pass\n\n\
         def test_flaky():\n    if not os.path.exists(MARKER):\n        open(MARKER, 'w').close()\n        \
         assert False, 'first attempt fails'\n",
    );
    if always {
        text.push_str("\ndef test_always():\n    assert False, 'always fails'\n");
    }
    Project::new(&[("test_retries.py", text)])
}

/// Forgets the flaky test's first attempt, so that the next build sees it fail once again.
fn reset_flaky(project: &Project) {
    let _ = std::fs::remove_file(project.path().join("flaky.marker"));
}

/// Each case of a JUnit file by name, as junitparser's xunit2 reader sees
/// it: its final results' types, the messages of its `<flakyFailure>` and
/// `<rerunFailure>` elements, its properties, and the suite's
/// `failures` count as the file gives it.
const READ_RETRIES: &str = r#"
import json, sys
from junitparser.xunit2 import JUnitXml

xml = JUnitXml.fromfile(sys.argv[1])
cases, failures = {}, 0
for suite in xml:
    failures += int(suite.failures or 0)
    for case in suite:
        cases[case.name] = {
            "result": [type(r).__name__ for r in case.result],
            "message": [r.message for r in case.result],
            "flaky": [r.message for r in case.flaky_failures()],
            "rerun": [r.message for r in case.rerun_failures()],
            "properties": {p.name: p.value for p in case.properties()},
            "system_out": case.system_out or "",
        }
print(json.dumps({"cases": cases, "failures": failures}))
"#;

/// One case as [`READ_RETRIES`] reads it.
#[derive(Debug, serde::Deserialize)]
struct Case {
    result: Vec<String>,
    message: Vec<Option<String>>,
    flaky: Vec<Option<String>>,
    rerun: Vec<Option<String>>,
    properties: BTreeMap<String, String>,
    system_out: String,
}

/// A JUnit file as [`READ_RETRIES`] reads it.
#[derive(Debug, serde::Deserialize)]
struct Read {
    cases: BTreeMap<String, Case>,
    failures: u64,
}

fn read_retries(junit: &Path) -> Read {
    let output = Command::new(venv_python()).args(["-c", READ_RETRIES]).arg(junit).output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert!(output.status.success(), "junitparser (cargo xtask setup installs it) read {junit:?}:\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// What the options of every build here are: three attempts per test, for every test.
const RETRIES: [&str; 6] = ["--no-timings", "-j", "1", "--max-requeues", "2", "--requeue-tolerance"];

/// The build on the memory queue: `hopper run`, which gives the verdict, with `extra` options.
fn on_memory(project: &Project, extra: &[&str]) -> (Output, String) {
    let output = project
        .hopper()
        .arg("run")
        .args(RETRIES)
        .args(["1", "--discover", "pytest", "--junit"])
        .arg(project.junit())
        .args(extra)
        .arg("--")
        .args(pytest_command())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    (output, format!("stdout:\n{stdout}\nstderr:\n{stderr}"))
}

/// One worker of a build on Redis; its exit code leaves the verdict to the report.
fn redis_worker(project: &Project, build: &Build) {
    let output = project
        .hopper()
        .arg("run")
        .args(build.args())
        .args(RETRIES)
        .args(["1", "--worker", "w1", "--discover", "pytest", "--"])
        .args(pytest_command())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "the worker:\nstdout:\n{stdout}\nstderr:\n{stderr}");
}

/// `hopper report` of `build` into the project's JUnit file, with `env` set.
fn redis_report(project: &Project, build: &Build, extra: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let mut report = project.hopper();
    report.arg("report").args(build.args()).arg("--junit").arg(project.junit()).args(extra);
    for (name, value) in env {
        report.env(name, value);
    }
    let output = report.output().unwrap();
    let (stdout, stderr) = texts(&output);
    (output, format!("stdout:\n{stdout}\nstderr:\n{stderr}"))
}

/// The mixed suite's JUnit: the flaky test passes with one `<flakyFailure>`
/// (its first attempt), the failing one is a `<failure>` (its first
/// attempt) and a `<rerunFailure>` per retry.
fn check_mixed(read: &Read, shown: &str) {
    assert_eq!(read.cases.len(), 3, "{read:?}\n{shown}");
    let ok = &read.cases["test_ok"];
    assert!(ok.result.is_empty() && ok.flaky.is_empty() && ok.rerun.is_empty(), "{ok:?}");
    let flaky = &read.cases["test_flaky"];
    assert!(flaky.result.is_empty(), "a flaky test passes: {flaky:?}\n{shown}");
    assert_eq!(flaky.flaky.len(), 1, "one <flakyFailure> per failed attempt: {flaky:?}\n{shown}");
    assert!(flaky.flaky[0].as_deref().is_some_and(|m| m.contains("first attempt fails")), "{flaky:?}");
    assert!(flaky.rerun.is_empty(), "{flaky:?}");
    let always = &read.cases["test_always"];
    assert_eq!(always.result, ["Failure"], "{always:?}\n{shown}");
    assert!(always.message[0].as_deref().is_some_and(|m| m.contains("always fails")), "{always:?}");
    assert_eq!(always.rerun.len(), 2, "three attempts: a <failure>, then two <rerunFailure>: {always:?}\n{shown}");
    assert!(always.rerun.iter().all(|m| m.as_deref().is_some_and(|m| m.contains("always fails"))), "{always:?}");
    assert!(always.flaky.is_empty(), "{always:?}");
    assert_eq!(read.failures, 1, "{read:?}");
}

/// The green suite with `--flaky-result fail`: the flaky test is a failure
/// that keeps its `<flakyFailure>`, and names the attempt that passed.
fn check_flaky_fails(read: &Read, shown: &str) {
    let flaky = &read.cases["test_flaky"];
    assert_eq!(flaky.result, ["Failure"], "{flaky:?}\n{shown}");
    assert!(flaky.message[0].as_deref().is_some_and(|m| m.contains("--flaky-result fail")), "{flaky:?}");
    assert_eq!(flaky.flaky.len(), 1, "{flaky:?}\n{shown}");
    assert!(flaky.rerun.is_empty(), "{flaky:?}");
    let passed = flaky.properties.get("hopper.flaky").map(String::as_str).unwrap_or_default();
    assert!(passed.starts_with("passed on attempt 2"), "{flaky:?}");
    assert!(flaky.system_out.contains("passed on attempt 2"), "{flaky:?}");
    assert_eq!(read.failures, 1, "{read:?}");
}

#[test]
fn flaky_and_rerun_failures_on_memory_and_flaky_result_fail_turns_a_green_build_red() {
    let project = suite(true);
    let (output, shown) = on_memory(&project, &[]);
    assert_eq!(output.status.code(), Some(1), "the always-failing test fails the build\n{shown}");
    assert!(shown.contains("FLAKY test_retries.py::test_flaky (failed 1x"), "{shown}");
    check_mixed(&read_retries(&project.junit()), &shown);

    let project = suite(false);
    let (output, shown) = on_memory(&project, &[]);
    assert_eq!(output.status.code(), Some(0), "a flaky test passes by default\n{shown}");
    let read = read_retries(&project.junit());
    assert!(read.cases["test_flaky"].result.is_empty(), "{read:?}");
    assert_eq!(read.cases["test_flaky"].flaky.len(), 1, "{read:?}");
    assert_eq!(read.failures, 0, "{read:?}");

    reset_flaky(&project);
    let (output, shown) = on_memory(&project, &["--flaky-result", "pass"]);
    assert_eq!(output.status.code(), Some(0), "--flaky-result pass is the default\n{shown}");

    reset_flaky(&project);
    let (output, shown) = on_memory(&project, &["--flaky-result", "fail"]);
    assert_eq!(output.status.code(), Some(1), "--flaky-result fail: a flaky test fails the build\n{shown}");
    assert!(shown.contains("flaky units fail the build (--flaky-result fail)"), "{shown}");
    check_flaky_fails(&read_retries(&project.junit()), &shown);

    let (output, shown) = on_memory(&project, &["--flaky-result", "maybe"]);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(shown.contains("[possible values: pass, fail]"), "{shown}");
}

#[test]
fn flaky_and_rerun_failures_on_redis_and_the_report_decides_with_flaky_result() {
    let project = suite(true);
    let build = Build::on_shared_redis("hopper-flaky-mixed");
    redis_worker(&project, &build);
    let (output, shown) = redis_report(&project, &build, &[], &[]);
    assert_eq!(output.status.code(), Some(1), "the always-failing test fails the build\n{shown}");
    check_mixed(&read_retries(&project.junit()), &shown);

    // One green build, reported twice: the verdict is the report's to give.
    let project = suite(false);
    let build = Build::on_shared_redis("hopper-flaky-green");
    redis_worker(&project, &build);
    let (output, shown) = redis_report(&project, &build, &[], &[]);
    assert_eq!(output.status.code(), Some(0), "a flaky test passes by default\n{shown}");
    assert_eq!(read_retries(&project.junit()).cases["test_flaky"].flaky.len(), 1, "{shown}");
    let (output, shown) = redis_report(&project, &build, &[], &[("HOPPER_FLAKY_RESULT", "fail")]);
    assert_eq!(output.status.code(), Some(1), "HOPPER_FLAKY_RESULT=fail: a flaky test fails the build\n{shown}");
    check_flaky_fails(&read_retries(&project.junit()), &shown);
    // The option wins over its variable.
    let (output, shown) =
        redis_report(&project, &build, &["--flaky-result", "pass"], &[("HOPPER_FLAKY_RESULT", "fail")]);
    assert_eq!(output.status.code(), Some(0), "{shown}");
}
