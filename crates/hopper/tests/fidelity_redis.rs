//! Fidelity on a shared queue (a private Redis): errors outside tests that
//! one worker met are read back by `hopper report` from the queue, as on
//! another machine, and a report for a build that does not exist says so
//! at once. A missing `redis-server` fails these tests, never skips them.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{hopper, texts, venv_python};
use leasehold_redis::test_support::{redis_url, unique_prefix};

fn queue_args(prefix: &str, build: &str) -> Vec<String> {
    ["--queue", &redis_url(), "--key-prefix", prefix, "--build", build].map(String::from).to_vec()
}

#[test]
fn hopper_report_elsewhere_sees_the_errors_outside_tests() {
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("test_mod.py"),
        "import pytest\n\n@pytest.fixture(scope='module')\ndef mod():\n    yield 1\n    raise RuntimeError('module teardown boom')\n\n\
         def test_a(mod):\n    pass\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("conftest.py"),
        "import time\nimport pytest\n\n@pytest.fixture(scope='session', autouse=True)\ndef sess():\n    yield 1\n    \
         time.sleep(1.5)\n    raise RuntimeError('session teardown boom')\n",
    )
    .unwrap();
    let prefix = unique_prefix("hopper-fidelity");
    let build = format!("b-{prefix}");
    // The report waits from the start, as on another machine: the session's
    // teardown fails 1.5 s after the last test was finalized.
    let report = hopper(dir.path())
        .arg("report")
        .args(queue_args(&prefix, &build))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let worker = hopper(dir.path())
        .arg("run")
        .args(queue_args(&prefix, &build))
        .args(["--worker", "w1", "-j", "1", "--no-timings", "--discover", "pytest", "--"])
        .args([python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&worker);
    assert_eq!(
        worker.status.code(),
        Some(0),
        "a worker of a shared queue leaves the verdict to the report:\n{stdout}\n{stderr}"
    );
    let report = report.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&report);
    assert_eq!(report.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("ERROR test_mod.py (teardown error: RuntimeError: module teardown boom)"), "{stdout}");
    // The session's teardown runs when the agent exits, after the last test.
    assert!(stdout.contains("ERROR session (teardown error: RuntimeError: session teardown boom)"), "{stdout}");
    assert!(
        stdout.contains("FAILED: 1 units, 1 passed (0 flaky), 0 failed, 0 unfinished, 2 error(s) outside tests"),
        "{stdout}"
    );
}

#[test]
fn a_report_for_a_build_that_does_not_exist_says_so_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique_prefix("hopper-fidelity-typo");
    let mut report = hopper(dir.path())
        .arg("report")
        .args(queue_args(&prefix, "typo"))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut lines = BufReader::new(report.stderr.take().unwrap()).lines();
    let line = lines.next().and_then(Result::ok).unwrap_or_default();
    let waited = started.elapsed();
    report.kill().unwrap();
    report.wait().unwrap();
    assert!(line.contains("build typo does not exist (yet)"), "{line:?}");
    assert!(waited < Duration::from_secs(10), "said after {waited:?}");
}
