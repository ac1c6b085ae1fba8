//! End-to-end tests of the `hopper` binary in memory mode (no server at all).

mod common;

use std::io::Read;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{hopper, junit_cases, texts, Suite};
use quick_junit::TestCaseStatus;

#[test]
fn mixed_suite_reports_failures_flaky_units_and_junit() {
    let mut suite = Suite::new();
    suite.passing("a_pass.sh").passing("b_pass.sh").failing("c_fail.sh").flaky("d_flaky.sh").slow("e_slow.sh", 0.5);
    let list = suite.unit_list();
    let junit = suite.path().join("out/junit.xml");
    let output = hopper(suite.path())
        .args(["run", "-j", "3", "--requeue-tolerance", "1", "--no-timings", "--units-from"])
        .arg(&list)
        .arg("--junit")
        .arg(&junit)
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "a failing unit fails the build\nstdout:\n{stdout}\nstderr:\n{stderr}");

    let fail = suite.unit_name("c_fail.sh");
    let flaky = suite.unit_name("d_flaky.sh");
    assert!(
        stdout.contains(&format!("FAIL {fail} (exit code 1; 2 failed attempt(s), retry_budget_exhausted)")),
        "{stdout}"
    );
    assert!(stdout.contains("| assertion failed: expected 1, got 2"), "failure output tail shown:\n{stdout}");
    assert!(stdout.contains(&format!("FLAKY {flaky}")), "{stdout}");
    assert!(stdout.contains("FAILED: 5 units, 4 passed (1 flaky), 1 failed, 0 unfinished"), "{stdout}");
    let slowest = stdout.split("SLOWEST units:").nth(1).expect("slowest section");
    assert!(slowest.lines().nth(1).unwrap_or("").contains("e_slow.sh"), "slowest first:\n{stdout}");

    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 5, "one test case per unit: {cases:?}");
    match &cases[&flaky] {
        TestCaseStatus::Success { flaky_runs } => assert_eq!(flaky_runs.len(), 1, "flaky unit marked as flaky"),
        other => panic!("flaky unit should pass with a flaky run: {other:?}"),
    }
    match &cases[&fail] {
        TestCaseStatus::NonSuccess { message, description, .. } => {
            assert_eq!(message.as_ref().map(|m| m.as_str()), Some("exit code 1"));
            assert!(description.as_ref().is_some_and(|d| d.as_str().contains("assertion failed")));
        }
        other => panic!("failing unit should be a failure: {other:?}"),
    }
    for name in ["a_pass.sh", "b_pass.sh", "e_slow.sh"] {
        assert!(
            matches!(&cases[&suite.unit_name(name)], TestCaseStatus::Success { flaky_runs } if flaky_runs.is_empty()),
            "{name} passed"
        );
    }
}

#[test]
fn passing_suite_exits_zero_even_with_a_flaky_unit() {
    let mut suite = Suite::new();
    suite.passing("a.sh").passing("b.sh").flaky("c.sh");
    let list = suite.unit_list();
    let output = hopper(suite.path())
        .args(["run", "-j", "2", "--requeue-tolerance", "0.5", "--no-timings", "--units-from"])
        .arg(&list)
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("PASSED: 3 units, 3 passed (1 flaky), 0 failed"), "{stdout}");
    // Plain progress lines (stderr is not a terminal here).
    assert!(stderr.contains("RETRY") && stderr.contains("PASS "), "{stderr}");
}

/// `hopper run … | head -1`: the reader is gone before the report is
/// printed. The exit code is still the verdict's (1: a unit failed), not a
/// panic's 101.
#[test]
fn a_reader_that_went_away_leaves_the_verdicts_exit_code() {
    let mut suite = Suite::new();
    suite.passing("a.sh").failing("b.sh");
    let list = suite.unit_list();
    let mut child = hopper(suite.path())
        .args(["run", "--max-requeues", "0", "--no-timings", "--units-from"])
        .arg(&list)
        .args(["--", "sh", "{unit}"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closes the pipe's only reading end.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unit_timeout_kills_the_unit_and_fails_it_with_reason_timeout() {
    let mut suite = Suite::new();
    suite.unit("hang.sh", "echo 'about to hang'\nexec sleep 60\n").passing("ok.sh");
    let list = suite.unit_list();
    let junit = suite.path().join("junit.xml");
    let started = std::time::Instant::now();
    let output = hopper(suite.path())
        .args(["run", "-j", "2", "--max-requeues", "0", "--unit-timeout", "0.5", "--kill-grace", "0.5", "--no-timings"])
        .arg("--units-from")
        .arg(&list)
        .arg("--junit")
        .arg(&junit)
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "the hanging unit was killed");
    let hang = suite.unit_name("hang.sh");
    assert!(stdout.contains(&format!("FAIL {hang} (timed out after 0.5s")), "{stdout}");
    assert!(stdout.contains("| about to hang"), "{stdout}");
    match &junit_cases(&junit)[&hang] {
        TestCaseStatus::NonSuccess { ty, .. } => assert_eq!(ty.as_ref().map(|t| t.as_str()), Some("timeout")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn globs_units_and_appends_the_unit_without_placeholder() {
    let mut suite = Suite::new();
    suite.passing("one_test.sh").passing("two_test.sh").passing("not_a_unit.txt");
    let pattern = format!("{}/*_test.sh", suite.path().display());
    let output =
        hopper(suite.path()).args(["run", "-j", "2", "--no-timings", "--glob", &pattern, "--", "sh"]).output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("PASSED: 2 units"), "{stdout}");
}

#[test]
fn batches_run_several_units_per_invocation() {
    let mut suite = Suite::new();
    for i in 0..6 {
        suite.passing(&format!("u{i}.sh"));
    }
    let list = suite.unit_list();
    let log = suite.path().join("invocations.log");
    // Each invocation appends one line with its arguments.
    let script = format!("echo \"$*\" >> '{}'", log.display());
    let output = hopper(suite.path())
        .args(["run", "-j", "1", "--batch-size", "3", "--results", "exit-code", "--no-timings", "--units-from"])
        .arg(&list)
        .args(["--", "sh", "-c", &script, "batch", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let lines: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2, "6 units in batches of 3: {lines:?}");
    assert!(lines.iter().all(|l| l.split(' ').count() == 3), "{lines:?}");
}

#[test]
fn timings_of_an_earlier_run_order_the_next_slowest_first() {
    let mut suite = Suite::new();
    suite.passing("a_fast.sh").passing("b_fast.sh").slow("c_slow.sh", 0.3);
    let list = suite.unit_list();
    let timings = suite.path().join("timings.json");
    let run = || {
        hopper(suite.path())
            .args(["run", "-j", "1", "--units-from"])
            .arg(&list)
            .arg("--timings")
            .arg(&timings)
            .args(["--", "sh", "{unit}"])
            .output()
            .unwrap()
    };
    let first = run();
    assert_eq!(first.status.code(), Some(0), "{:?}", texts(&first));
    let first_order: Vec<String> =
        texts(&first).1.lines().filter(|l| l.starts_with("PASS")).map(str::to_owned).collect();
    assert!(first_order[0].contains("a_fast.sh"), "listed order without timings: {first_order:?}");
    assert!(timings.exists(), "timings were saved");

    let second = run();
    assert_eq!(second.status.code(), Some(0), "{:?}", texts(&second));
    let second_order: Vec<String> =
        texts(&second).1.lines().filter(|l| l.starts_with("PASS")).map(str::to_owned).collect();
    assert!(second_order[0].contains("c_slow.sh"), "slowest first with timings: {second_order:?}");
}

/// The default timings file appears in the project: the run that writes it
/// first says what it is, and later runs say nothing.
#[test]
fn the_run_that_makes_the_timings_file_says_so_once() {
    let mut suite = Suite::new();
    suite.passing("a.sh");
    let list = suite.unit_list();
    let run = || {
        let output = hopper(suite.path())
            .args(["run", "--units-from"])
            .arg(&list)
            .args(["--", "sh", "{unit}"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{:?}", texts(&output));
        texts(&output).1
    };
    let note = "wrote each unit's duration to .hopper/timings.json";
    let first = run();
    assert!(first.contains(note), "{first}");
    assert!(suite.path().join(".hopper/timings.json").exists());
    let second = run();
    assert!(!second.contains(note), "once: {second}");
}

fn assert_one_line_error(output: &std::process::Output, needle: &str) {
    let (stdout, stderr) = texts(output);
    assert_eq!(output.status.code(), Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let line = stderr.trim_end();
    assert!(!line.contains('\n'), "one line: {stderr:?}");
    assert!(line.starts_with("hopper: error:") && line.contains(needle), "{needle:?} in {stderr:?}");
}

#[test]
fn bad_input_gives_one_line_errors_and_nothing_runs() {
    let mut suite = Suite::new();
    let ran = suite.path().join("ran");
    suite.unit("touch.sh", &format!("touch '{}'\n", ran.display()));
    let list = suite.unit_list();
    let empty = suite.path().join("empty.txt");
    std::fs::write(&empty, "# no units\n\n").unwrap();

    let out = hopper(suite.path()).args(["run", "--units-from"]).arg(&empty).args(["--", "sh"]).output().unwrap();
    assert_one_line_error(&out, "no units to run");

    let out = hopper(suite.path()).args(["run", "--units-from"]).arg(&list).output().unwrap();
    assert_one_line_error(&out, "no command given");

    let out = hopper(suite.path()).args(["run", "--discover", "jest", "--", "sh"]).output().unwrap();
    assert_one_line_error(&out, "unknown discover kind \"jest\"");

    let out = hopper(suite.path()).args(["run", "--units-from", "missing.txt", "--", "sh"]).output().unwrap();
    assert_one_line_error(&out, "cannot read unit list missing.txt");

    // An unreachable Redis is waited for (--outage-grace), said once, then the error.
    let out = hopper(suite.path())
        .args(["run", "--queue", "redis://127.0.0.1:1", "--build", "b1", "--outage-grace", "2", "--units-from"])
        .arg(&list)
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (_, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].contains("the queue is unreachable (connect: Connection refused"), "{stderr}");
    assert!(lines[1].starts_with("hopper: error: cannot reach Redis at redis://127.0.0.1:1"), "{stderr}");

    let out = hopper(suite.path())
        .args(["run", "--queue", "redis://127.0.0.1:1", "--units-from"])
        .arg(&list)
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "no build id");

    let out = hopper(suite.path()).args(["report"]).output().unwrap();
    assert_one_line_error(&out, "needs a shared queue");

    assert!(!ran.exists(), "no unit ran for bad input");
}

/// SIGTERM while a unit runs: the worker kills the unit's process group,
/// hands it back and exits promptly with 143 (128 + SIGTERM).
#[test]
fn sigterm_releases_the_running_unit_and_exits_promptly() {
    let mut suite = Suite::new();
    let fifo = suite.path().join("started.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let pidfile = suite.path().join("unit.pid");
    suite.unit(
        "long.sh",
        &format!("echo $$ > '{}'\necho started > '{}'\nexec sleep 60\n", pidfile.display(), fifo.display()),
    );
    let list = suite.unit_list();
    let child = hopper(suite.path())
        .args(["run", "-j", "1", "--no-timings", "--units-from"])
        .arg(&list)
        .args(["--", "sh", "{unit}"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // The unit signals that it runs by writing to the FIFO.
    let (tx, rx) = mpsc::channel();
    let reader_fifo = fifo.clone();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::fs::File::open(&reader_fifo).and_then(|mut f| f.read_to_string(&mut text));
        let _ = tx.send(text);
    });
    let got = rx.recv_timeout(Duration::from_secs(60)).expect("the unit started");
    assert_eq!(got.trim(), "started");

    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let started = std::time::Instant::now();
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(143), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "exited promptly");
    assert!(stderr.contains("RELEASE") && stderr.contains("interrupted"), "{stderr}");

    let unit_pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let alive = std::fs::read_to_string(format!("/proc/{unit_pid}/stat")).map(|s| !s.contains(") Z ")).unwrap_or(false);
    assert!(!alive, "the unit's process was killed");
}

/// What goes to a log file (stderr not a terminal): no colour codes, each
/// cause of an error once, and a long bad input cut.
#[test]
fn messages_in_a_log_file_are_plain_and_say_each_cause_once() {
    let mut suite = Suite::new();
    suite.passing("a.sh");
    let output = hopper(suite.path())
        .env("HOPPER_LOG", "debug")
        .args(["run", "-j", "1", "--no-timings", "--units-from"])
        .arg(suite.unit_list())
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (_, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("DEBUG"), "debug logs on: {stderr}");
    assert!(!stderr.contains('\u{1b}'), "no ANSI escape codes in a log file: {stderr:?}");

    let output = hopper(suite.path())
        .args(["run", "--queue", "redis://127.0.0.1:1", "--build", "", "--units-from"])
        .arg(suite.unit_list())
        .args(["--", "sh", "{unit}"])
        .output()
        .unwrap();
    let (_, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("run id is empty").count(), 1, "{stderr}");

    let long = suite.path().join("long.txt");
    std::fs::write(&long, format!("{}\n", "x".repeat(100_000))).unwrap();
    let output = hopper(suite.path())
        .args(["run", "--no-timings", "--units-from"])
        .arg(&long)
        .args(["--", "true"])
        .output()
        .unwrap();
    let (_, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.len() < 1000 && stderr.contains("100000 bytes in all"), "the name is cut: {stderr}");
}

/// A malformed `--queue` is an error, never a quiet private queue.
#[test]
fn a_malformed_queue_url_is_refused() {
    let mut suite = Suite::new();
    suite.passing("a.sh");
    for queue in ["", "mem://foo", "redis:/x"] {
        let output = hopper(suite.path())
            .args(["run", "--no-timings", "--queue", queue, "--units-from"])
            .arg(suite.unit_list())
            .args(["--", "sh", "{unit}"])
            .output()
            .unwrap();
        let (_, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(2), "{queue:?}: {stderr}");
        assert!(stderr.contains("unsupported queue URL"), "{queue:?}: {stderr}");
    }
}
