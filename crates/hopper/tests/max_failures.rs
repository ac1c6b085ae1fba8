//! Fail fast across the fleet: a real pytest suite of 500 tests, 10 of
//! them failing, spread through it. With `--max-failures 3` (or
//! `HOPPER_MAX_FAILURES`) the build stops: at most 3 units fail for good
//! plus those already running, the report says "stopped after 3 failures;
//! M units not run" and exits 1, and in the JUnit each unit that did not
//! run is a skipped case whose message says why. On a private Redis the
//! limit is the build's, not a worker's: a worker that joins after the stop
//! runs nothing. A missing pytest or redis-server fails these tests, never
//! skips them.

mod common;

use std::process::{Child, Output, Stdio};

use common::{junit_cases, pytest_command, shown, Build, Project};
use quick_junit::TestCaseStatus;

const TESTS: usize = 500;
/// Slots of one worker (`-j 2`).
const SLOTS: usize = 2;
/// Units an agent slot may already have started when the stop comes: the
/// one it runs and the one waiting in its pipe.
const IN_FLIGHT_PER_SLOT: usize = 2;

/// 500 tests of 10 ms each; every 50th (from the 8th) fails.
fn suite() -> Project {
    let mut py = String::from("import time\n\n");
    for i in 0..TESTS {
        let body = if i % 50 == 7 { "    assert False, 'planned failure'\n" } else { "    pass\n" };
        py.push_str(&format!("def test_{i:03}():\n    time.sleep(0.01)\n{body}\n"));
    }
    Project::new(&[("test_many.py", py)])
}

/// The options of every build here: no retry, so each failure is for good.
const OPTIONS: [&str; 5] = ["--no-timings", "-j", "2", "--max-requeues", "0"];

/// A number that follows `before` and precedes `after` in `text`.
fn number_between(text: &str, before: &str, after: &str) -> usize {
    let start = text.find(before).unwrap_or_else(|| panic!("{before:?} in\n{text}")) + before.len();
    let rest = &text[start..];
    let end = rest.find(after).unwrap_or_else(|| panic!("{after:?} after {before:?} in\n{text}"));
    rest[..end].trim().parse().unwrap_or_else(|e| panic!("{e}: {:?} in\n{text}", &rest[..end]))
}

/// Checks a stopped build's report and JUnit; returns (failed, not run).
fn check_stopped(output: &Output, shown: &str, project: &Project, slots: usize) -> (usize, usize) {
    assert_eq!(output.status.code(), Some(1), "a stopped build is red\n{shown}");
    let not_run = number_between(shown, "stopped after 3 failures (--max-failures); ", " units not run");
    let failed = number_between(shown, "passed (0 flaky), ", " failed");
    assert!(
        (3..=3 + slots * IN_FLIGHT_PER_SLOT).contains(&failed),
        "at most 3 failed for good, plus those already running: {failed}\n{shown}"
    );
    assert!(not_run > 0, "the build stopped before the end\n{shown}");
    assert!(shown.contains(&format!("{failed} failed, {not_run} not run;")), "the verdict line counts them\n{shown}");
    let cases = junit_cases(&project.junit());
    assert_eq!(cases.len(), TESTS, "every unit is a case");
    let skipped: Vec<&TestCaseStatus> =
        cases.values().filter(|s| matches!(s, TestCaseStatus::Skipped { .. })).collect();
    assert_eq!(skipped.len(), not_run, "each unit not run is a skipped case");
    for status in skipped {
        let TestCaseStatus::Skipped { message, .. } = status else { unreachable!() };
        let message = message.as_ref().map(|m| m.to_string()).unwrap_or_default();
        assert!(message.contains("not run: the build stopped after 3 failures"), "{message}");
    }
    let failures = cases.values().filter(|s| matches!(s, TestCaseStatus::NonSuccess { .. })).count();
    assert_eq!(failures, failed, "{shown}");
    (failed, not_run)
}

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

#[test]
fn on_memory_the_build_stops_after_max_failures() {
    let project = suite();
    let (output, shown) = on_memory(&project, &["--max-failures", "3"], &[]);
    check_stopped(&output, &shown, &project, SLOTS);
    let (output, shown) = on_memory(&project, &[], &[("HOPPER_MAX_FAILURES", "3")]);
    check_stopped(&output, &shown, &project, SLOTS);

    let (output, shown) = on_memory(&project, &[], &[]);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(shown.contains("500 units, 490 passed (0 flaky), 10 failed, 0 unfinished"), "no limit: all ran\n{shown}");
    assert!(!shown.contains("stopped after"), "{shown}");
}

#[test]
fn on_redis_the_limit_is_the_builds_and_a_late_worker_runs_nothing() {
    let project = suite();
    let build = Build::on_shared_redis("hopper-max-failures");
    let worker = |name: &str| {
        project
            .hopper()
            .arg("run")
            .args(build.args())
            .args(OPTIONS)
            .args(["--max-failures", "3", "--worker", name, "--discover", "pytest", "--"])
            .args(pytest_command())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let finished = |child: Child| {
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0), "the worker leaves the verdict to the report\n{}", shown(&output));
    };
    let report = || {
        let output = project.hopper().arg("report").args(build.args()).arg("--junit").arg(project.junit()).output();
        let output = output.unwrap();
        let shown = shown(&output);
        (output, shown)
    };
    // Two workers at once: the limit is the build's, not each worker's.
    let (w1, w2) = (worker("w1"), worker("w2"));
    finished(w1);
    finished(w2);
    let (output, shown) = report();
    let before = check_stopped(&output, &shown, &project, 2 * SLOTS);
    let events = build.finalized(project.path());

    finished(worker("late"));
    let (output, shown) = report();
    assert_eq!(check_stopped(&output, &shown, &project, 2 * SLOTS), before, "the late worker ran nothing\n{shown}");
    assert_eq!(build.finalized(project.path()), events, "nothing was finalized by the late worker");
}

/// Six tests on six slots: three that mark that they started, then sleep
/// far longer than the test may take, and three that fail once every
/// sleeper has started. With `--max-failures-kill` the sleepers are stopped
/// when the build stops, and reported as not run; without it they would
/// hold the build for two minutes.
#[test]
fn with_max_failures_kill_running_units_are_stopped_and_not_run() {
    let mut py = String::from("import os, pathlib, time\n\nHERE = pathlib.Path(__file__).parent\n\n");
    for i in 0..3 {
        py.push_str(&format!(
            "def test_sleeps_{i}():\n    (HERE / os.environ['HOPPER_BUILD']).mkdir(exist_ok=True)\n    \
             (HERE / os.environ['HOPPER_BUILD'] / 'started-{i}').touch()\n    time.sleep(120)\n\n"
        ));
    }
    for i in 0..3 {
        py.push_str(&format!(
            "def test_fails_{i}():\n    for _ in range(300):\n        \
             if len(list((HERE / os.environ['HOPPER_BUILD']).glob('started-*'))) == 3:\n            break\n        \
             time.sleep(0.1)\n    assert False, 'planned failure'\n\n"
        ));
    }
    let project = Project::new(&[("test_slow.py", py)]);
    for (mode, build) in [(None, "agents"), (Some("--per-process"), "per-process")] {
        let started = std::time::Instant::now();
        let output = project
            .hopper()
            .arg("run")
            .args(["--build", build])
            .args(["--no-timings", "-j", "6", "--max-requeues", "0", "--max-failures", "3", "--max-failures-kill"])
            .args(mode)
            .args(["--discover", "pytest", "--junit"])
            .arg(project.junit())
            .arg("--")
            .args(pytest_command())
            .output()
            .unwrap();
        let shown = shown(&output);
        let took = started.elapsed();
        assert_eq!(output.status.code(), Some(1), "{mode:?}: a stopped build is red\n{shown}");
        assert!(took < std::time::Duration::from_secs(60), "{mode:?}: the sleepers were stopped ({took:?})\n{shown}");
        assert!(shown.contains("stopped after 3 failures (--max-failures); 3 units not run"), "{mode:?}\n{shown}");
        let cases = junit_cases(&project.junit());
        let not_run: Vec<&String> =
            cases.iter().filter(|(_, s)| matches!(s, TestCaseStatus::Skipped { .. })).map(|(name, _)| name).collect();
        assert_eq!(not_run.len(), 3, "{mode:?}: the three sleepers are skipped cases: {not_run:?}\n{shown}");
        assert!(not_run.iter().all(|name| name.contains("sleeps")), "{mode:?}: {not_run:?}");
        let marks = std::fs::read_dir(project.path().join(build)).map(|d| d.count()).unwrap_or(0);
        assert_eq!(marks, 3, "{mode:?}: every sleeper was running when the build stopped\n{shown}");
    }
}
