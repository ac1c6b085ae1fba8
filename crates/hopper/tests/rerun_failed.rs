//! `hopper run --rerun-failed BUILD` on a private Redis: a first build of a
//! real pytest suite with passing, failing and flaky tests, then a rerun
//! that runs exactly the failed and flaky tests the first build's report
//! names, as a build of its own; and a rerun of a build that never existed,
//! or on the memory queue, which says so and runs nothing. Every throwaway
//! test appends its name to `RAN_LOG`, so the tests check what ran. A
//! missing pytest or redis-server fails these tests, never skips them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;

use common::{junit_cases, texts, venv_python, Build, Project};
use quick_junit::TestCaseStatus;

/// Two passing tests, a failing one and one that fails its first attempt
/// (it leaves a marker file) and passes after; and a file of passing tests.
fn suite() -> Project {
    let ran = "import os\n\ndef ran(name):\n    with open(os.environ['RAN_LOG'], 'a') as log:\n        log.write(name + '\\n')\n";
    let main = format!(
        "{ran}\nMARKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'flaky.marker')\n\n\
         def test_ok():\n    ran('test_ok')\n\n\
         def test_flaky():\n    ran('test_flaky')\n    if not os.path.exists(MARKER):\n        \
         open(MARKER, 'w').close()\n        assert False, 'first attempt fails'\n\n\
         def test_always():\n    ran('test_always')\n    assert False, 'always fails'\n\n\
         def test_ok_too():\n    ran('test_ok_too')\n"
    );
    let other = format!("{ran}\ndef test_other():\n    ran('test_other')\n");
    Project::new(&[("test_rerun.py", main), ("test_other.py", other)])
}

/// `hopper run` in the project with the queue options `queue` and `extra`,
/// two attempts per test, pytest's agents on one slot.
fn worker(project: &Project, queue: &[String], extra: &[&str]) -> (Output, String) {
    let output = project
        .hopper()
        .arg("run")
        .args(queue)
        .args(["--worker", "w1", "--no-timings", "-j", "1", "--max-requeues", "1", "--requeue-tolerance", "1"])
        .args(extra)
        .args(["--discover", "pytest", "--", venv_python().as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    (output, format!("stdout:\n{stdout}\nstderr:\n{stderr}"))
}

/// `hopper report` with the queue options `queue`, its JUnit to `file` in the project.
fn report(project: &Project, queue: &[String], file: &str) -> (Output, String) {
    let output = project.hopper().arg("report").args(queue).arg("--junit").arg(project.path().join(file)).output();
    let output = output.unwrap();
    let (stdout, stderr) = texts(&output);
    (output, format!("stdout:\n{stdout}\nstderr:\n{stderr}"))
}

/// The units a JUnit file names failed, and those it names flaky (passed
/// with `<flakyFailure>` elements).
fn failed_and_flaky(cases: &BTreeMap<String, TestCaseStatus>) -> (BTreeSet<String>, BTreeSet<String>) {
    let failed = cases.iter().filter(|(_, s)| matches!(s, TestCaseStatus::NonSuccess { .. }));
    let flaky =
        cases.iter().filter(|(_, s)| matches!(s, TestCaseStatus::Success { flaky_runs } if !flaky_runs.is_empty()));
    (failed.map(|(id, _)| id.clone()).collect(), flaky.map(|(id, _)| id.clone()).collect())
}

#[test]
fn a_rerun_runs_exactly_the_failed_and_flaky_tests_of_the_earlier_build_as_a_build_of_its_own() {
    let project = suite();
    let build = Build::on_shared_redis("hopper-rerun");
    let (output, shown) = worker(&project, &build.args(), &[]);
    assert_eq!(output.status.code(), Some(0), "the first build's worker\n{shown}");
    let (output, shown) = report(&project, &build.args(), "first.xml");
    assert_eq!(output.status.code(), Some(1), "the first build fails\n{shown}");
    let first = junit_cases(&project.path().join("first.xml"));
    assert_eq!(first.len(), 5, "{first:?}");
    let (failed, flaky) = failed_and_flaky(&first);
    assert_eq!(failed, BTreeSet::from(["test_rerun.py::test_always".to_owned()]), "{shown}");
    assert_eq!(flaky, BTreeSet::from(["test_rerun.py::test_flaky".to_owned()]), "{shown}");
    std::fs::remove_file(project.ran_log()).unwrap();

    // The same --build again: the rerun is BUILD-rerun.
    let rerun_id = format!("{}-rerun", build.id());
    let (output, shown) = worker(&project, &build.args(), &["--rerun-failed", build.id()]);
    assert_eq!(output.status.code(), Some(0), "the rerun's worker\n{shown}");
    let said = format!("rerunning 2 unit(s) of build {} (1 failed, 1 flaky there) as build {rerun_id}", build.id());
    assert!(shown.contains(&said), "{shown}");
    let (output, shown) = report(&project, &build.args_as(&rerun_id), "rerun.xml");
    assert_eq!(output.status.code(), Some(1), "the always-failing test fails the rerun too\n{shown}");
    assert!(shown.contains(&format!("build {rerun_id}: FAILED: 2 units, 1 passed (0 flaky), 1 failed")), "{shown}");
    let rerun = junit_cases(&project.path().join("rerun.xml"));
    let ran_units: BTreeSet<String> = rerun.keys().cloned().collect();
    assert_eq!(ran_units, &failed | &flaky, "the rerun's units are the first build's failed and flaky ones");
    // What ran: the failing test twice (two attempts), the flaky one once (it passes now), nothing else.
    let ran = project.ran();
    assert_eq!(ran, BTreeMap::from([("test_always".to_owned(), 2), ("test_flaky".to_owned(), 1)]), "{shown}");

    // The first build is as it was: its report still has all five units.
    let (output, shown) = report(&project, &build.args(), "again.xml");
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert_eq!(junit_cases(&project.path().join("again.xml")).len(), 5, "{shown}");
}

#[test]
fn a_rerun_of_a_build_that_never_existed_says_so_and_runs_nothing() {
    let project = suite();
    let build = Build::on_shared_redis("hopper-rerun-missing");
    let never = format!("never-{}", build.id());
    let (output, shown) = worker(&project, &build.args(), &["--rerun-failed", &never]);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    let said = format!("cannot rerun the failures of build {never}: the queue has no such build");
    assert!(shown.contains(&said), "{shown}");
    assert!(shown.contains("nothing was run"), "{shown}");
    assert!(project.ran().is_empty(), "no test ran: {:?}", project.ran());
    // Nor was a rerun build started.
    let status = project.hopper().arg("status").args(build.args()).output().unwrap();
    assert_ne!(status.status.code(), Some(0), "{:?}", texts(&status));

    // The memory queue keeps no earlier build at all.
    let (output, shown) = worker(&project, &[], &["--rerun-failed", &never]);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(shown.contains("a mem:// build lives only inside its own `hopper run` process"), "{shown}");
    assert!(shown.contains("--queue redis://"), "{shown}");
    assert!(project.ran().is_empty(), "no test ran: {:?}", project.ran());
}
