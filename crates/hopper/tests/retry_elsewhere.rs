//! Retry on a different worker, end to end with real pytest: two workers on
//! one Redis build, one of which breaks a test through its environment
//! (`BROKEN_MACHINE=1` set only on that worker). The retry goes to the other
//! worker, the build is green, and the report and JUnit name the
//! worker-specific failure. With `--retry-same-worker` the retry comes back
//! to the broken worker and the build is red; a lone worker (the memory
//! queue) still retries.
//!
//! The order is made certain by a gate: the first test blocks the good
//! worker (one slot, one process per unit, so it holds nothing else) until
//! the broken worker has failed the test, so the broken worker runs it first
//! while the good worker is live.

mod common;

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use common::{pytest_command, texts, wait_for, Build, Project};

const SUITE: &str = r#"
import os, time

HERE = os.path.dirname(os.path.abspath(__file__))

def test_a_gate():
    # The good worker waits here until the test has failed on the broken one.
    for _ in range(1200):
        if os.path.exists(os.path.join(HERE, "gate")):
            return
        time.sleep(0.05)
    raise AssertionError("the gate never opened")

def test_b_needs_a_sane_machine():
    if os.environ.get("BROKEN_MACHINE") == "1":
        with open(os.path.join(HERE, "broken.log"), "a") as log:
            log.write("failed\n")
        raise AssertionError("this machine is broken")
"#;

fn project() -> Project {
    let mut text = SUITE.to_owned();
    for i in 0..6 {
        text.push_str(&format!("\ndef test_c_{i}():\n    pass\n"));
    }
    Project::new(&[("test_machine.py", text)])
}

/// Times the broken worker failed the test.
fn broken_failures(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("broken.log")).map(|t| t.lines().count()).unwrap_or(0)
}

const OPTIONS: [&str; 8] =
    ["-j", "1", "--per-process", "--max-requeues", "1", "--requeue-tolerance", "1", "--discover"];

fn worker(project: &Project, build: &Build, name: &str, broken: bool, extra: &[&str]) -> Child {
    let mut cmd = project.worker(name);
    cmd.args(["run", "--worker", name, "--no-timings"])
        .args(build.args())
        .args(OPTIONS)
        .arg("pytest")
        .args(extra)
        .arg("--")
        .args(pytest_command())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if broken {
        cmd.env("BROKEN_MACHINE", "1");
    }
    cmd.spawn().expect("start a worker")
}

fn finish(child: Child, what: &str) -> Output {
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert!(output.status.code().is_some(), "{what} was killed:\n{stdout}\n{stderr}");
    output
}

fn report(project: &Project, build: &Build) -> (Option<i32>, String, String) {
    let output = project
        .hopper()
        .arg("report")
        .args(build.args())
        .arg("--junit")
        .arg(project.junit())
        .args(["--wait-timeout", "120"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    (output.status.code(), stdout, stderr)
}

/// Runs the two workers: the good one first (it blocks in the gate), then
/// the broken one; the gate opens once the broken worker has failed the
/// test `failures` times.
fn two_workers(project: &Project, build: &Build, broken_extra: &[&str], failures: usize) {
    two_workers_gated(project, build, &[], broken_extra, failures, Duration::ZERO);
}

/// [`two_workers`], with `extra` given to both workers and the gate kept
/// shut `hold` longer after the failures.
fn two_workers_gated(
    project: &Project,
    build: &Build,
    extra: &[&str],
    broken_extra: &[&str],
    failures: usize,
    hold: Duration,
) {
    let good = worker(project, build, "w-good", false, extra);
    let broken_extra = [extra, broken_extra].concat();
    let broken_extra = broken_extra.as_slice();
    // The good worker is live and inside the gate before the broken one starts.
    assert!(
        wait_for(Duration::from_secs(60), || build.finalized(project.path()).is_some()),
        "the good worker never started the build"
    );
    std::thread::sleep(Duration::from_millis(500));
    let broken = worker(project, build, "w-broken", true, broken_extra);
    let failed = wait_for(Duration::from_secs(60), || broken_failures(project.path()) >= failures);
    std::thread::sleep(hold);
    std::fs::write(project.path().join("gate"), "open").unwrap();
    assert!(failed, "the broken worker never failed the test {failures} time(s)");
    finish(good, "the good worker");
    finish(broken, "the broken worker");
}

#[test]
fn a_failure_on_one_worker_is_retried_on_another_and_named_worker_specific() {
    let project = project();
    let build = Build::on_shared_redis("hopper-elsewhere");
    two_workers(&project, &build, &[], 1);
    let (code, stdout, stderr) = report(&project, &build);
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(code, Some(0), "the retry passed on the good worker: the build is green\n{shown}");
    assert_eq!(broken_failures(project.path()), 1, "the broken worker ran the test once\n{shown}");
    assert!(
        stdout.contains("FLAKY test_machine.py::test_b_needs_a_sane_machine (failed 1x: ")
            && stdout.contains(" on w-broken; passed on w-good)"),
        "the report names the worker of every attempt\n{shown}"
    );
    assert!(
        stdout.contains(
            "WORKER-SPECIFIC test_machine.py::test_b_needs_a_sane_machine (failed on w-broken, passed on w-good)"
        ),
        "{shown}"
    );
    let xml = std::fs::read_to_string(project.junit()).unwrap();
    assert!(
        xml.contains(r#"<property name="hopper.worker-specific" value="failed on w-broken, passed on w-good"/>"#),
        "{xml}"
    );
    assert!(xml.contains("<flakyFailure") && xml.contains(" on w-broken"), "{xml}");
}

/// The good worker stays busy (in the gate) for twice the reclaim timeout
/// after the failure, heartbeating: it is live, so the retry waits for it
/// rather than going back to the broken worker, which has nothing else left
/// to run and asks again and again.
#[test]
fn a_retry_waits_for_a_busy_live_worker_past_the_reclaim_timeout() {
    let project = project();
    let build = Build::on_shared_redis("hopper-busy-elsewhere");
    two_workers_gated(&project, &build, &["--timeout", "3"], &[], 1, Duration::from_secs(6));
    let (code, stdout, stderr) = report(&project, &build);
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(broken_failures(project.path()), 1, "the retry never came back to the broken worker\n{shown}");
    assert_eq!(code, Some(0), "the retry passed on the good worker: the build is green\n{shown}");
    assert!(stdout.contains("(failed on w-broken, passed on w-good)"), "{shown}");
}

#[test]
fn with_retry_same_worker_the_retry_comes_back_to_the_broken_worker() {
    let project = project();
    let build = Build::on_shared_redis("hopper-same-worker");
    two_workers(&project, &build, &["--retry-same-worker"], 2);
    let (code, stdout, stderr) = report(&project, &build);
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(code, Some(1), "both attempts ran on the broken worker: the build is red\n{shown}");
    assert_eq!(broken_failures(project.path()), 2, "{shown}");
    assert!(!stdout.contains("WORKER-SPECIFIC"), "{shown}");
}

#[test]
fn a_lone_worker_still_retries_its_own_failure() {
    let project = project();
    std::fs::write(project.path().join("gate"), "open").unwrap();
    let output = project
        .worker("alone")
        .env("BROKEN_MACHINE", "1")
        .args(["run", "--no-timings"])
        .args(OPTIONS)
        .args(["pytest", "--"])
        .args(pytest_command())
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(broken_failures(project.path()), 2, "the only worker retried: two attempts\n{stdout}\n{stderr}");
}
