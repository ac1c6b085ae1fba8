//! Fidelity: hopper's verdict equals the tool's own, per test id and in the
//! build's exit code, on suites that fail outside any test.
//!
//! Each test runs the plain tool (the venv's pytest, Debian's rspec, cargo
//! test) on a small awkward suite, then hopper on the same suite in every
//! mode of [`MODES`] (agents with one and two slots, batches, one process
//! per test; on memory, and on a private Redis with `hopper report` giving
//! the verdict), and compares: every test's outcome, every error outside a
//! test (its message, and the file or group it is attached to, never a
//! test), skip reasons, and the exit code. A difference fails the test. A
//! missing pytest, rspec or redis-server fails these tests; it never skips
//! them.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{hopper, junit_cases, texts, venv_python, Project};
use quick_junit::TestCaseStatus;

/// What one run said: each test's outcome, the errors outside tests as
/// (group, message), and the exit code.
#[derive(Debug)]
struct Verdict {
    tests: BTreeMap<String, &'static str>,
    outside: BTreeSet<(String, String)>,
    exit: Option<i32>,
}

/// The first word of a mode that runs on a private Redis (see [`hopper_verdict`]).
const REDIS: &str = "redis";

/// The modes every awkward suite runs in: agents with one and two slots,
/// batches, one process per test, on memory and on a private Redis.
const MODES: &[&[&str]] = &[
    &["-j", "1"],
    &["-j", "2"],
    &["-j", "1", "--batch-size", "20"],
    &["--per-process", "-j", "2"],
    &[REDIS, "-j", "2"],
    &[REDIS, "-j", "1", "--batch-size", "20"],
    &[REDIS, "--per-process", "-j", "2"],
];

/// Files of a pytest suite whose errors are outside its tests: teardown of
/// module, class (unittest's `tearDownClass`) and session fixtures, a
/// module fixture whose setup fails (an error of each test that needs it),
/// and a file that does not import.
const PYTEST_SUITE: &[(&str, &str)] = &[
    (
        "conftest.py",
        "import pytest\n\n@pytest.fixture(scope='session')\ndef sess():\n    yield 1\n    raise RuntimeError('session teardown boom')\n",
    ),
    (
        "test_mod.py",
        "import pytest\n\n@pytest.fixture(scope='module')\ndef mod():\n    yield 1\n    raise RuntimeError('module teardown boom')\n\n\
         def test_a(mod):\n    pass\n\ndef test_b(mod):\n    pass\n",
    ),
    (
        "test_cls.py",
        "import unittest\n\nclass TestU(unittest.TestCase):\n    @classmethod\n    def tearDownClass(cls):\n        \
         raise RuntimeError('tearDownClass boom')\n\n    def test_one(self):\n        pass\n\n    def test_two(self):\n        pass\n",
    ),
    ("test_sess.py", "def test_uses_session(sess):\n    pass\n\ndef test_plain():\n    pass\n"),
    (
        "test_setup.py",
        "import pytest\n\n@pytest.fixture(scope='module')\ndef broken():\n    raise RuntimeError('module setup boom')\n\n\
         def test_needs_it(broken):\n    pass\n\ndef test_also(broken):\n    pass\n",
    ),
    ("test_zlater.py", "def test_after_all_the_others():\n    pass\n"),
    ("test_broken.py", "import nope_not_a_module\n\ndef test_never():\n    pass\n"),
];

/// Plain pytest's verdict, from its `-rA` summary: a test listed PASSED or
/// FAILED has that outcome; ERROR for a test with no other line is its own
/// (setup) error; ERROR for a test that also PASSED is a teardown error
/// outside it (its group is checked separately); ERROR for a file is a
/// collection error of that file.
fn plain_pytest(dir: &Path, args: &[&str]) -> (Verdict, BTreeMap<String, String>) {
    let output = Command::new(venv_python())
        .args(["-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider"])
        // The summary lines are cut to the terminal width otherwise.
        .env("COLUMNS", "500")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    let summary = stdout.split("short test summary info").nth(1).unwrap_or_else(|| panic!("{stdout}\n{stderr}"));
    let mut tests = BTreeMap::new();
    // The summary names a skipped test by its file and line; the verbose lines by its id.
    for line in stdout.split("short test summary info").next().unwrap_or_default().lines() {
        if let Some((id, _)) = line.split_once(" SKIPPED").filter(|(id, _)| id.contains("::")) {
            tests.insert(id.to_owned(), "skipped");
        }
    }
    let mut errors = Vec::new();
    for line in summary.lines() {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let (id, message) = rest.split_once(" - ").unwrap_or((rest, ""));
        match word {
            "PASSED" => drop(tests.insert(id.to_owned(), "passed")),
            "FAILED" => drop(tests.insert(id.to_owned(), "failed")),
            // An expected failure is a skip (as JUnit has it); an unexpected pass passes.
            "XFAIL" => drop(tests.insert(id.to_owned(), "skipped")),
            "XPASS" => drop(tests.insert(id.to_owned(), "passed")),
            "ERROR" => errors.push((id.to_owned(), message.to_owned())),
            _ => {}
        }
    }
    let mut outside = BTreeSet::new();
    // Which test pytest hung each teardown error on: hopper's group must be that test's file.
    let mut hung_on = BTreeMap::new();
    for (id, message) in errors {
        if !id.contains("::") {
            outside.insert((id, "collection".to_owned()));
        } else if let std::collections::btree_map::Entry::Vacant(setup_error) = tests.entry(id.clone()) {
            setup_error.insert("failed");
        } else {
            hung_on.insert(message.clone(), id);
            outside.insert((String::new(), message));
        }
    }
    (Verdict { tests, outside, exit: output.status.code() }, hung_on)
}

/// hopper's verdict: the tests' outcomes from its JUnit, the errors
/// outside tests from its report's `ERROR group (phase error: message)`
/// lines (a collection error as (file, "collection")). Every group must be
/// a JUnit case of its own that is no test.
///
/// A mode that starts with [`REDIS`] runs on a private Redis: one worker
/// with the rest of the mode, then `hopper report`, whose output and exit
/// code are the verdict (as CI on another machine has them).
fn hopper_verdict(dir: &Path, mode: &[&str], tool: &str, command: &[&str]) -> (Verdict, String) {
    let junit = dir.join(format!("hopper-{}.xml", mode.join("_")));
    let (redis, run_mode) = match mode.split_first() {
        Some((&REDIS, rest)) => (true, rest),
        _ => (false, mode),
    };
    let prefix = leasehold_redis::test_support::unique_prefix("hopper-fidelity");
    let queue: Vec<String> = if redis {
        let url = leasehold_redis::test_support::redis_url();
        ["--queue", &url, "--key-prefix", &prefix, "--build", "fidelity"].map(String::from).to_vec()
    } else {
        Vec::new()
    };
    let run = hopper(dir)
        .args(["run", "--no-timings", "--max-requeues", "0", "--discover", tool])
        .args(&queue)
        .args(run_mode)
        .arg("--junit")
        .arg(&junit)
        .arg("--")
        .args(command)
        .output()
        .unwrap();
    let output = if redis {
        let (stdout, stderr) = texts(&run);
        assert_eq!(run.status.code(), Some(0), "the worker:\n{stdout}\n{stderr}");
        hopper(dir).arg("report").args(&queue).arg("--junit").arg(&junit).output().unwrap()
    } else {
        run
    };
    let (stdout, stderr) = texts(&output);
    let shown = format!("hopper {mode:?}:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let mut outside = BTreeSet::new();
    let mut groups = BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("  ERROR ") else { continue };
        let (group, what) = rest.split_once(" (").unwrap_or_else(|| panic!("{line}\n{shown}"));
        let what = what.strip_suffix(')').unwrap_or(what);
        let (phase, message) = what.split_once(" error: ").unwrap_or_else(|| panic!("{line}\n{shown}"));
        groups.insert(message.to_owned(), group.to_owned());
        if phase == "collection" {
            outside.insert((group.to_owned(), "collection".to_owned()));
        } else {
            outside.insert((String::new(), message.to_owned()));
        }
    }
    let mut tests = BTreeMap::new();
    for (name, status) in junit_cases(&junit) {
        if groups.values().any(|g| *g == name) {
            assert!(
                matches!(status, TestCaseStatus::NonSuccess { kind: quick_junit::NonSuccessKind::Error, .. }),
                "the group {name} is a JUnit <error>: {status:?}\n{shown}"
            );
            continue;
        }
        let outcome = match status {
            TestCaseStatus::Success { .. } => "passed",
            TestCaseStatus::NonSuccess { .. } => "failed",
            TestCaseStatus::Skipped { .. } => "skipped",
        };
        tests.insert(name, outcome);
    }
    // A test that failed and passed on a retry would hide an error put on the wrong test.
    assert!(!stdout.contains("FLAKY"), "{shown}");
    let verdict = Verdict { tests, outside, exit: output.status.code() };
    for group in groups.values() {
        assert!(!verdict.tests.contains_key(group), "an error outside tests was attached to the test {group}\n{shown}");
    }
    let groups = groups.into_iter().map(|(m, g)| format!("{m}\t{g}")).collect::<Vec<_>>().join("\n");
    (verdict, format!("{groups}\n{shown}"))
}

fn assert_same(plain: &Verdict, ours: &Verdict, shown: &str) {
    assert_eq!(plain.tests, ours.tests, "per-test outcomes differ\n{shown}");
    assert_eq!(plain.outside, ours.outside, "errors outside tests differ\n{shown}");
    assert_eq!(plain.exit, ours.exit, "exit codes differ\n{shown}");
}

/// The group hopper gave the error `message` (from [`hopper_verdict`]'s listing).
fn group_of<'a>(shown: &'a str, message: &str) -> &'a str {
    shown
        .lines()
        .find_map(|l| l.strip_prefix(message).and_then(|r| r.strip_prefix('\t')))
        .unwrap_or_else(|| panic!("no group for {message:?}\n{shown}"))
}

#[test]
fn pytest_errors_outside_tests_fail_the_build_and_belong_to_their_file() {
    let python = venv_python();
    let dir = Project::new(PYTEST_SUITE);
    let keep_going = ["--continue-on-collection-errors"];
    let (plain, hung_on) = plain_pytest(dir.path(), &keep_going);
    assert_eq!(plain.exit, Some(1), "{plain:?}");
    assert_eq!(plain.outside.len(), 4, "three teardown errors and a collection error: {plain:?}");
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider", keep_going[0]];
    for mode in MODES {
        let (ours, shown) = hopper_verdict(dir.path(), mode, "pytest", &command);
        assert_same(&plain, &ours, &shown);
        // Each teardown error is its node's: the module's file, the class
        // (a batch knows only its file), or the session.
        assert_eq!(group_of(&shown, "RuntimeError: module teardown boom"), "test_mod.py", "{shown}");
        let class = group_of(&shown, "RuntimeError: tearDownClass boom");
        assert!(class == "test_cls.py::TestU" || class == "test_cls.py", "{class}\n{shown}");
        // The session's own (agents), or the file of the fixture (batches
        // read where the traceback ends), never the test pytest hung it on.
        let session = group_of(&shown, "RuntimeError: session teardown boom");
        assert!(session == "session" || session == "conftest.py", "{session}\n{shown}");
        assert!(hung_on["RuntimeError: session teardown boom"].starts_with("test_zlater.py::"), "{hung_on:?}");
    }
}

#[test]
fn a_collection_error_without_keep_going_names_the_file_and_its_traceback() {
    let python = venv_python();
    let dir = Project::new(&[("test_ok.py", "def test_ok():\n    pass\n"), PYTEST_SUITE[6]]);
    let plain = Command::new(&python).args(["-m", "pytest", "-q"]).current_dir(dir.path()).output().unwrap();
    assert_eq!(plain.status.code(), Some(2), "pytest stops on a collection error");
    for mode in [&["-j", "1"][..], &["-j", "2"], &["--batch-size", "5"]] {
        let output = hopper(dir.path())
            .args(["run", "--no-timings", "--discover", "pytest"])
            .args(mode)
            .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        assert_ne!(output.status.code(), Some(0), "{stdout}\n{stderr}");
        assert!(stderr.contains("collection error in test_broken.py"), "{mode:?}: {stderr}");
        assert!(stderr.contains("No module named 'nope_not_a_module'"), "{mode:?}: {stderr}");
        assert!(stderr.contains("test_broken.py:1: in <module>"), "the traceback: {mode:?}: {stderr}");
    }
}

/// A pytest that dies of an INTERNALERROR while collecting (a conftest
/// hook that raises): pytest names no file, so hopper's error shows the
/// traceback pytest printed, not only its last line.
#[test]
fn an_internal_error_at_collection_shows_pytests_traceback() {
    let python = venv_python();
    let conftest = "def pytest_collection_modifyitems(items):\n    raise RuntimeError('hook boom')\n";
    let dir = Project::new(&[("test_ok.py", "def test_ok():\n    pass\n"), ("conftest.py", conftest)]);
    let plain = Command::new(&python).args(["-m", "pytest", "-q"]).current_dir(dir.path()).output().unwrap();
    assert_eq!(plain.status.code(), Some(3), "pytest's exit code for an internal error");
    let output = hopper(dir.path())
        .args(["run", "--no-timings", "-j", "1", "--discover", "pytest"])
        .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_ne!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("INTERNALERROR>"), "pytest's traceback: {stderr}");
    assert!(stderr.contains("RuntimeError: hook boom"), "{stderr}");
}

const RSPEC_SUITE: &[(&str, &str)] = &[
    (
        "spec/ctx_spec.rb",
        "RSpec.describe 'after context' do\n  after(:context) { raise 'after context boom' }\n  \
         it('passes one') { expect(1).to eq(1) }\n  it('passes two') { expect(2).to eq(2) }\nend\n\n\
         RSpec.describe 'before context' do\n  before(:context) { raise 'before context boom' }\n  \
         it('never runs') { expect(1).to eq(1) }\nend\n",
    ),
    ("spec/plain_spec.rb", "RSpec.describe 'plain' do\n  it('works') { expect(true).to be(true) }\nend\n"),
];

/// Plain rspec's verdict from its JSON: each example's status; the errors
/// outside examples only as a count (as `("", n)`), since RSpec names no group.
fn plain_rspec(dir: &Path) -> Verdict {
    let out = dir.join("plain.json");
    let output = Command::new("rspec")
        .args(["--format", "progress", "--format", "json", "--out"])
        .arg(&out)
        .current_dir(dir)
        .output()
        .expect("rspec is required by this test: install Debian's ruby-rspec (cargo xtask setup does)");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let tests = doc["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let outcome = match e["status"].as_str() {
                Some("passed") => "passed",
                Some("pending") => "skipped",
                _ => "failed",
            };
            (e["id"].as_str().unwrap().to_owned(), outcome)
        })
        .collect();
    let count = doc["summary"]["errors_outside_of_examples_count"].as_u64().unwrap();
    Verdict { tests, outside: BTreeSet::from([(String::new(), count.to_string())]), exit: output.status.code() }
}

#[test]
fn rspec_errors_outside_examples_fail_the_build_and_belong_to_their_group() {
    let dir = Project::new(RSPEC_SUITE);
    let plain = plain_rspec(dir.path());
    assert_eq!(plain.exit, Some(1), "{plain:?}");
    for mode in MODES {
        let (mut ours, shown) = hopper_verdict(dir.path(), mode, "rspec", &["rspec"]);
        let groups: Vec<&str> = shown.lines().filter_map(|l| l.split_once('\t').map(|(_, g)| g)).collect();
        // The group (agents) or its file (batches): never an example.
        assert!(
            groups.iter().all(|g| *g == "./spec/ctx_spec.rb[1]" || *g == "./spec/ctx_spec.rb"),
            "{groups:?}\n{shown}"
        );
        ours.outside = BTreeSet::from([(String::new(), ours.outside.len().to_string())]);
        assert_same(&plain, &ours, &shown);
    }
}

/// An example sees only what plain rspec loads: the RSpec agent requires
/// nothing of its own (it used to require `json` and `tempfile`, and so
/// hashie 5.0.0's two examples that use `Tempfile` and `SimpleDelegator`
/// without requiring them passed under hopper and failed under rspec).
#[test]
fn an_rspec_example_sees_no_library_the_agent_uses() {
    common::require_rspec();
    let spec = "describe 'libraries it did not require' do\n  it('uses Tempfile') { Tempfile.new('x') }\n  \
                it('uses SimpleDelegator') { Class.new(SimpleDelegator) }\n  it('uses JSON') { JSON.generate([1]) }\n  \
                it('needs nothing') { expect(1).to eq(1) }\nend\n";
    let dir = Project::new(&[("spec/libs_spec.rb", spec)]);
    // Plain rspec's own formatter: the JSON one would load `json` itself.
    let plain = Command::new("rspec").current_dir(dir.path()).output().unwrap();
    let (stdout, _) = texts(&plain);
    assert!(stdout.contains("4 examples, 3 failures"), "{stdout}");
    let id = |n: u32| format!("./spec/libs_spec.rb[1:{n}]");
    let tests = BTreeMap::from([(id(1), "failed"), (id(2), "failed"), (id(3), "failed"), (id(4), "passed")]);
    // Batches and --per-process write their report with hopper's formatter,
    // which loads nothing either (RSpec's `--format json` loads `json`).
    let modes =
        [&["-j", "1"][..], &["-j", "2"], &[REDIS, "-j", "2"], &["-j", "2", "--batch-size", "3"], &["--per-process"]];
    for mode in modes {
        let (ours, shown) = hopper_verdict(dir.path(), mode, "rspec", &["rspec"]);
        assert_eq!(ours.tests, tests, "{mode:?}: {shown}");
        assert_eq!(ours.exit, Some(1), "{mode:?}: {shown}");
    }
}

/// A crate whose `tests::parse` passes while `tests::parse_fails` (a name
/// that `tests::parse` is a prefix of) fails, with a failing, a passing
/// and an ignored doctest of one item (rustdoc runs all three for any of
/// their names), an ignored test and an integration test.
const CARGO_SUITE: &[(&str, &str)] = &[
    ("Cargo.toml", "[package]\nname = \"exact-demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n# Not part of any workspace above.\n[workspace]\n"),
    (
        "src/lib.rs",
        "//! A crate whose doctest fails.\n\n/// Adds one.\n///\n/// ```\n/// assert_eq!(exact_demo::add_one(1), 3, \"a failing doctest\");\n/// ```\n\
         ///\n/// ```\n/// assert_eq!(exact_demo::add_one(1), 2);\n/// ```\n\
         ///\n/// ```ignore\n/// this is not Rust\n/// ```\n\
         pub fn add_one(x: u32) -> u32 {\n    x + 1\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn parse() {\n        assert_eq!(super::add_one(1), 2);\n    }\n\n\
         \x20   #[test]\n    fn parse_fails() {\n        assert_eq!(super::add_one(1), 5, \"parse_fails fails\");\n    }\n\n\
         \x20   #[test]\n    #[ignore = \"too slow\"]\n    fn slow() {}\n}\n",
    ),
    ("tests/it.rs", "#[test]\nfn integration() {\n    assert_eq!(exact_demo::add_one(2), 3);\n}\n"),
];

/// Plain `cargo test --no-fail-fast`'s outcome of every test (see
/// [`common::plain_cargo_test`]).
fn plain_cargo_test(dir: &Path) -> Verdict {
    let (tests, exit) = common::plain_cargo_test(dir);
    Verdict { tests, outside: BTreeSet::new(), exit }
}

#[test]
fn cargo_test_units_run_the_exact_test_and_a_doctest_is_run() {
    let dir = Project::new(CARGO_SUITE);
    let mut plain = plain_cargo_test(dir.path());
    assert_eq!(plain.tests.len(), 7, "{plain:?}");
    assert_eq!(plain.tests["src/lib.rs - add_one (line 9)"], "passed", "{plain:?}");
    assert_eq!(plain.tests["src/lib.rs - add_one (line 13)"], "skipped", "{plain:?}");
    assert_eq!(plain.tests["src/lib.rs - add_one (line 5)"], "failed", "{plain:?}");
    assert_eq!(plain.exit, Some(101));
    // hopper's red is 1, cargo's 101: the verdict is what must agree.
    plain.exit = Some(1);
    for mode in [&["-j", "1"][..], &["-j", "2"]] {
        let junit = dir.path().join("cargo.xml");
        let output = hopper(dir.path())
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .args(["run", "--no-timings", "--max-requeues", "0", "--discover", "cargo-test", "--junit"])
            .arg(&junit)
            .args(mode)
            .args(["--", "cargo", "test", "-q", "{unit}"])
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        let shown = format!("{mode:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        let tests = junit_cases(&junit)
            .into_iter()
            .map(|(name, status)| {
                let outcome = match status {
                    TestCaseStatus::Success { .. } => "passed",
                    TestCaseStatus::NonSuccess { .. } => "failed",
                    TestCaseStatus::Skipped { .. } => "skipped",
                };
                (name, outcome)
            })
            .collect();
        let ours = Verdict { tests, outside: BTreeSet::new(), exit: output.status.code() };
        assert_same(&plain, &ours, &shown);
        // A Rust failure says its panic message, and its JUnit case names the module.
        assert!(
            stdout.contains("FAIL tests::parse_fails (assertion `left == right` failed: parse_fails fails"),
            "{shown}"
        );
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(xml.contains(r#"<testcase name="parse_fails" classname="tests""#), "{xml}");
        assert!(xml.contains(r#"<testcase name="add_one (line 5)" classname="src/lib.rs""#), "{xml}");
        assert!(xml.contains(r#"<property name="hopper.unit" value="tests::parse_fails"/>"#), "{xml}");
        // `#[ignore = "too slow"]`: skipped, with libtest's reason.
        assert!(xml.contains(r#"<skipped message="too slow"/>"#), "{xml}");
    }
}

/// `cargo test --doc NAME` has rustdoc read the library and build its
/// doctests again for each name (either 1.19's 61 doctests took 4 minutes
/// one by one): a worker runs a package's doctests once, and each doctest
/// unit takes its own verdict from that run. A failure seen there is run
/// again on its own, as any retry is.
#[test]
fn a_package_s_doctests_run_once_per_worker_and_a_failed_one_alone_again() {
    let dir = Project::new(CARGO_SUITE);
    // Every rustdoc cargo starts, logged (cargo runs `RUSTDOC` in its place).
    let log = dir.path().join("rustdoc.log");
    let wrapper = dir.path().join("rustdoc-logged.sh");
    std::fs::write(&wrapper, format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexec rustdoc \"$@\"\n", log.display()))
        .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .env("RUSTDOC", &wrapper)
        .args(["run", "-j", "2", "--no-timings", "--max-requeues", "1", "--requeue-tolerance", "1"])
        .args(["--discover", "cargo-test", "--", "cargo", "test", "-q", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{shown}");
    // Each doctest's own verdict: the failing one failed twice, the others held.
    assert!(
        stdout.contains("FAIL src/lib.rs - add_one (line 5) (assertion `left == right` failed: a failing doctest"),
        "{shown}"
    );
    assert!(stderr.contains("RETRY") && stderr.contains("src/lib.rs - add_one (line 5)"), "{shown}");
    assert!(shown.lines().any(|l| l.starts_with("PASS") && l.ends_with("src/lib.rs - add_one (line 9)")), "{shown}");
    assert!(shown.lines().any(|l| l.starts_with("SKIP") && l.contains("src/lib.rs - add_one (line 13)")), "{shown}");
    // rustdoc ran the doctests twice: all of them once, then the failed one alone.
    let runs: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("--test ") && !l.contains("--test-args --list"))
        .map(str::to_owned)
        .collect();
    assert_eq!(runs.len(), 2, "{runs:#?}\n{shown}");
    assert!(!runs[0].contains("--test-args src/lib.rs"), "the first run names no doctest: {runs:#?}");
    assert!(runs[1].contains("--test-args src/lib.rs"), "the retry names its doctest: {runs:#?}");
}

/// Two test targets that each have a test named `same` (as semver 1.0.23
/// has `test_eq` in two of its test files): one passes, one fails.
const CARGO_SHARED_NAMES: &[(&str, &str)] = &[
    ("Cargo.toml", "[package]\nname = \"shared-names\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n# Not part of any workspace above.\n[workspace]\n"),
    ("src/lib.rs", "pub fn one() -> u32 {\n    1\n}\n"),
    ("tests/a.rs", "#[test]\nfn same() {\n    assert_eq!(shared_names::one(), 1);\n}\n"),
    ("tests/b.rs", "#[test]\nfn same() {\n    assert_eq!(shared_names::one(), 2, \"b fails\");\n}\n\n#[test]\nfn other() {}\n"),
];

#[test]
fn a_test_name_in_two_targets_is_a_unit_in_each() {
    let dir = Project::new(CARGO_SHARED_NAMES);
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .args(["run", "-j", "2", "--no-timings", "--max-requeues", "0", "--discover", "cargo-test"])
        .args(["--", "cargo", "test", "-q", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{shown}");
    // Each runs in its own target, under its own name: one passes, one fails.
    assert!(shown.lines().any(|l| l.starts_with("PASS") && l.ends_with(" same [--test a]")), "{shown}");
    assert!(stdout.contains("FAIL same [--test b] (assertion `left == right` failed: b fails"), "{shown}");
    assert!(stdout.contains("FAILED: 3 units, 2 passed (0 flaky), 1 failed, 0 unfinished"), "{shown}");
    // Batches name tests without their targets: said, and nothing runs.
    let batches = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .args(["run", "--no-timings", "--batch-size", "10", "--results", "libtest-json", "--discover", "cargo-test"])
        .args(["--", "sh", "-c", "cargo test -q -- \"$@\" > {report}", "sh", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&batches);
    assert_eq!(batches.status.code(), Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains(
            "2 test name(s) are in more than one test target or package (\"same [--test a]\", \"same [--test b]\")"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was run") && !stderr.contains("PASS"), "stdout:\n{stdout}\nstderr:\n{stderr}");
}

/// A workspace whose packages, library, binaries and a `[[test]]` at a
/// path of its own each have a test named `tests::it_works` (as `cargo new`
/// writes them): only the tool binary's fails.
const CARGO_WORKSPACE: &[(&str, &str)] = &[
    ("Cargo.toml", "[workspace]\nmembers = [\"alpha\", \"beta\"]\nresolver = \"2\"\n"),
    // Edition 2024 merges the doctests it can into one binary and lists the
    // others (an `ignore` block) in a section of their own.
    ("alpha/Cargo.toml", "[package]\nname = \"alpha\"\nversion = \"0.1.0\"\nedition = \"2024\"\n"),
    (
        "alpha/src/lib.rs",
        "/// ```ignore\n/// not rust\n/// ```\npub fn a() {}\n\n/// ```\n/// assert_eq!(alpha::b(), 1);\n/// ```\n\
         pub fn b() -> u32 {\n    1\n}\n\n/// ```compile_fail\n/// let _compiles = alpha::b();\n/// ```\npub fn c() {}\n\n\
         #[cfg(test)]\nmod tests {\n    #[test]\n    fn it_works() {}\n}\n",
    ),
    (
        "beta/Cargo.toml",
        "[package]\nname = \"beta\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[[bin]]\nname = \"beta-tool\"\n\
         path = \"src/bin/tool.rs\"\n\n[[test]]\nname = \"custom\"\npath = \"checks/custom_check.rs\"\n",
    ),
    ("beta/src/lib.rs", "#[cfg(test)]\nmod tests {\n    #[test]\n    fn it_works() {}\n}\n"),
    ("beta/src/main.rs", "fn main() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn it_works() {}\n}\n"),
    (
        "beta/src/bin/tool.rs",
        "fn main() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn it_works() {\n        panic!(\"the tool breaks\");\n    }\n}\n",
    ),
    ("beta/checks/custom_check.rs", "#[test]\nfn it_works() {}\n"),
];

#[test]
fn a_test_name_in_several_packages_and_binaries_is_a_unit_in_each() {
    let dir = Project::new(CARGO_WORKSPACE);
    // `--workspace` would run every package's `tests::it_works` for each
    // unit: a unit's own `-p` takes its place.
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .args(["run", "-j", "2", "--no-timings", "--max-requeues", "0", "--discover", "cargo-test"])
        .args(["--", "cargo", "test", "--workspace", "-q", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    let shown = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "{shown}");
    for passed in [
        "tests::it_works [-p alpha --lib]",
        "tests::it_works [-p beta --lib]",
        "tests::it_works [-p beta --bin beta]",
        "it_works",
        "alpha/src/lib.rs - b (line 6)",
    ] {
        assert!(
            shown.lines().any(|l| l.starts_with("PASS") && l.ends_with(&format!(" {passed}"))),
            "{passed}: {shown}"
        );
    }
    assert!(stdout.contains("FAIL tests::it_works [-p beta --bin beta-tool] (the tool breaks"), "{shown}");
    assert!(shown.lines().any(|l| l.starts_with("SKIP") && l.ends_with(" alpha/src/lib.rs - a (line 1)")), "{shown}");
    assert!(stdout.contains("SKIPPED [1] (no reason given)"), "{shown}");
    // rustdoc runs it as `alpha/src/lib.rs - c (line 13) - compile fail`.
    assert!(
        stdout.contains("FAIL alpha/src/lib.rs - c (line 13) (Test compiled successfully, but it's marked"),
        "{shown}"
    );
    assert!(stdout.contains("FAILED: 8 units, 5 passed (0 flaky), 2 failed, 0 unfinished, 1 skipped"), "{shown}");
}

#[test]
fn a_cargo_test_unit_that_ran_no_test_is_an_error() {
    let dir = Project::new(CARGO_SUITE);
    // `{unit}-gone` names no libtest test: each such command runs zero tests
    // and exits 0. rustdoc splits a name at its spaces and runs every doctest
    // matching a piece (`-`, `(line`), so the three doctests still run: the
    // passing one passes, the failing one fails and the ignored one is
    // skipped, each on its own result.
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .args(["run", "-j", "2", "--no-timings", "--max-requeues", "0", "--discover", "cargo-test"])
        .args(["--", "cargo", "test", "-q", "{unit}-gone"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("7 units, 1 passed (0 flaky), 5 failed, 0 unfinished, 1 skipped"), "{stdout}");
    assert!(stdout.contains("FAIL tests::parse (ran no test"), "{stdout}");
}

/// pytest's node ids are relative to its rootdir, and the ids a command
/// line names to the directory pytest runs in: run from a subdirectory of
/// the rootdir, every test of `--per-process` and `--batch-size` failed with
/// "file or directory not found" (markupsafe 3.0.4 from its `tests/`).
#[test]
fn pytest_per_process_and_batches_run_from_below_the_rootdir() {
    let python = venv_python();
    let dir = Project::new(&[
        ("pytest.ini", "[pytest]\n"),
        ("tests/test_sub.py", "def test_one():\n    pass\n\ndef test_two():\n    assert 0, 'two fails'\n"),
    ]);
    let below = dir.path().join("tests");
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    let plain = Command::new(&python).args(&command[1..]).current_dir(&below).output().unwrap();
    assert!(texts(&plain).0.contains("1 failed, 1 passed"), "{:?}", texts(&plain));
    for mode in [&["--per-process", "-j", "2"][..], &["-j", "1", "--batch-size", "10"], &["-j", "2"]] {
        let output = hopper(&below)
            .args(["run", "--no-timings", "--max-requeues", "0", "--discover", "pytest"])
            .args(mode)
            .arg("--")
            .args(command)
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(1), "{mode:?}\n{stdout}\n{stderr}");
        assert!(stdout.contains("2 units, 1 passed (0 flaky), 1 failed"), "{mode:?}\n{stdout}\n{stderr}");
        assert!(stdout.contains("FAIL tests/test_sub.py::test_two (AssertionError: two fails"), "{mode:?}\n{stdout}");
    }
}

/// A `harness = false` test target lists nothing for `--list`, so it had no
/// unit and never ran: hopper passed a crate whose `cargo test` fails. Now
/// discovery says so and runs nothing; without that target it runs.
#[test]
fn a_target_without_a_libtest_listing_is_an_error_not_a_pass() {
    let custom = "fn main() {\n    if std::env::args().any(|a| a == \"--list\") {\n        return;\n    }\n    \
                  eprintln!(\"custom harness: a check FAILED\");\n    std::process::exit(1);\n}\n";
    let dir = Project::new(&[
        (
            "Cargo.toml",
            "[package]\nname = \"noharness\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[[test]]\nname = \"custom\"\n\
             path = \"tests/custom.rs\"\nharness = false\n\n[[test]]\nname = \"mimic\"\npath = \"tests/mimic.rs\"\n\
             harness = false\n\n[workspace]\n",
        ),
        ("src/lib.rs", "#[cfg(test)]\nmod tests {\n    #[test]\n    fn unit_ok() {}\n}\n"),
        ("tests/custom.rs", custom),
        ("tests/mimic.rs", MIMIC_HARNESS),
    ]);
    let plain = Command::new("cargo")
        .arg("test")
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!plain.status.success(), "cargo test fails: {:?}", texts(&plain));
    let run = |command: &[&str]| {
        let output = hopper(dir.path())
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .args(["run", "-j", "2", "--no-timings", "--discover", "cargo-test", "--"])
            .args(command)
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        (output.status.code(), format!("{stdout}\n{stderr}"))
    };
    let (code, shown) = run(&["cargo", "test", "-q", "{unit}"]);
    assert_eq!(code, Some(2), "{shown}");
    assert!(shown.contains("only 3 listed their tests"), "{shown}");
    assert!(shown.contains("The binaries that listed nothing: tests/custom.rs."), "{shown}");
    assert!(!shown.contains("PASSED"), "{shown}");
    let (code, shown) = run(&["cargo", "test", "-q", "--lib", "{unit}"]);
    assert_eq!(code, Some(0), "the advised command runs the rest: {shown}");
    // The libtest-mimic target lists its tests, and they run one by one.
    let (code, shown) = run(&["cargo", "test", "-q", "--lib", "--test", "mimic", "{unit}"]);
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("3 units, 2 passed (0 flaky), 1 failed"), "{shown}");
    assert!(shown.contains("FAIL mimic_fails") && shown.contains("mimic says no"), "{shown}");
}

/// A `harness = false` target as libtest-mimic 0.8 builds one (it was tried
/// with the real crate): `--list` prints `NAME: test` lines and no count
/// line; a run takes one filter and prints libtest's summary.
const MIMIC_HARNESS: &str = r#"fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tests = ["mimic_ok", "mimic_fails"];
    if args.iter().any(|a| a == "--list") {
        for name in tests {
            println!("{name}: test");
        }
        return;
    }
    let filter = args.iter().find(|a| !a.starts_with('-'));
    let chosen: Vec<&str> = tests.into_iter().filter(|t| filter.is_none_or(|f| f == t)).collect();
    println!("
running {} tests", chosen.len());
    let failed: Vec<&str> = chosen.iter().copied().filter(|t| *t == "mimic_fails").collect();
    for name in &chosen {
        println!("test {name} ... {}", if failed.contains(name) { "FAILED" } else { "ok" });
    }
    for name in &failed {
        println!("
---- {name} ----
mimic says no
");
    }
    let outcome = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "
test result: {outcome}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in 0.00s
",
        chosen.len() - failed.len(),
        failed.len(),
        tests.len() - chosen.len()
    );
    std::process::exit(if failed.is_empty() { 0 } else { 101 });
}
"#;

#[test]
fn pytest_subtests_in_a_batch_are_one_failed_test_with_all_messages() {
    let python = venv_python();
    let dir = Project::new(&[(
        "test_sub.py",
        "def test_sub(subtests):\n    for i in range(3):\n        with subtests.test(msg='case', i=i):\n            \
             assert i == 0, f'i is {i}'\n\ndef test_ok():\n    pass\n",
    )]);
    let (plain, _) = plain_pytest(dir.path(), &[]);
    assert_eq!(plain.tests.get("test_sub.py::test_sub"), Some(&"failed"), "{plain:?}");
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    let (ours, shown) = hopper_verdict(dir.path(), &["-j", "1", "--batch-size", "10"], "pytest", &command);
    assert_same(&plain, &ours, &shown);
    assert!(shown.contains("i is 1") && shown.contains("i is 2"), "every subtest's message: {shown}");
}

#[test]
fn a_test_that_crashes_its_batch_fails_alone() {
    let python = venv_python();
    let mut source = String::from("import os\n\n");
    for i in 0..6 {
        source.push_str(&format!("def test_{i}():\n    pass\n\n"));
    }
    source.push_str("def test_crash():\n    os._exit(3)\n\ndef test_z_after():\n    pass\n");
    let dir = Project::new(&[("test_many.py", source.as_str())]);
    let junit = dir.path().join("crash.xml");
    let output = hopper(dir.path())
        .args(["run", "-j", "1", "--batch-size", "10", "--max-requeues", "1", "--no-timings", "--discover", "pytest"])
        .arg("--junit")
        .arg(&junit)
        .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let cases = junit_cases(&junit);
    let failed: Vec<&String> =
        cases.iter().filter(|(_, s)| !matches!(s, TestCaseStatus::Success { .. })).map(|(n, _)| n).collect();
    assert_eq!(failed, vec!["test_many.py::test_crash"], "{stdout}");
    assert!(stdout.contains("8 units, 7 passed (0 flaky), 1 failed"), "no test that passes is flaky: {stdout}");
}

/// A suite under `tests/` with a pass, a failure, a skip, an xfail (and
/// one without a reason) and an xpass, each test logging that it ran (to `ran.log` beside `tests/`).
const PYTEST_OUTCOMES: &[(&str, &str)] = &[(
    "tests/test_outcomes.py",
    "import os\nimport pytest\n\ndef ran(name):\n    with open(os.path.join(os.path.dirname(__file__), '..', 'ran.log'), 'a') as log:\n        log.write(name + '\\n')\n\n\
     def test_pass():\n    ran('pass')\n\ndef test_fail():\n    ran('fail')\n    assert False, 'deliberate'\n\n\
     def test_skip():\n    ran('skip')\n    pytest.skip('not today')\n\n\
     @pytest.mark.xfail(reason='known bug')\ndef test_xfail():\n    ran('xfail')\n    assert False\n\n\
     @pytest.mark.xfail\ndef test_xfail_bare():\n    ran('xfail bare')\n    assert False\n\n\
     @pytest.mark.xfail(reason='fixed already')\ndef test_xpass():\n    ran('xpass')\n\n\
     @pytest.mark.parametrize('v', ['a b', 'q\\'\"', '\u{e9}\u{2713}'])\ndef test_ids(v):\n    ran('ids ' + v)\n    assert v != 'a b'\n",
)];

#[test]
fn every_mode_keeps_skips_xfail_and_odd_ids_and_runs_each_test_once() {
    let python = venv_python();
    let dir = Project::new(PYTEST_OUTCOMES);
    let log = dir.path().join("ran.log");
    let (plain, _) = plain_pytest(dir.path(), &["tests"]);
    assert_eq!(plain.tests.len(), 9, "{plain:?}");
    assert_eq!(plain.tests["tests/test_outcomes.py::test_xfail"], "skipped");
    let plain_out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-rsx", "-p", "no:cacheprovider", "tests"])
        .current_dir(dir.path())
        .env("COLUMNS", "500")
        .output()
        .unwrap();
    let (plain_text, _) = texts(&plain_out);
    assert!(plain_text.contains(": not today"), "{plain_text}");
    assert!(plain_text.contains("XFAIL tests/test_outcomes.py::test_xfail - known bug"), "{plain_text}");
    // The command's own `tests` would make every unit run the whole directory.
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"];
    for mode in MODES {
        let _ = std::fs::remove_file(&log);
        let (ours, shown) = hopper_verdict(dir.path(), mode, "pytest", &command);
        assert_same(&plain, &ours, &shown);
        // Agents collect the command's paths themselves; batches and processes drop them, once.
        let agents = !mode.iter().any(|m| *m == "--per-process" || *m == "--batch-size");
        let said = if mode.first() == Some(&REDIS) { 0 } else { usize::from(!agents) };
        assert_eq!(shown.matches("tests is only for discovery").count(), said, "{shown}");
        let ran = std::fs::read_to_string(&log).unwrap();
        let mut ran: Vec<&str> = ran.lines().collect();
        ran.sort_unstable();
        let want =
            ["fail", "ids a b", "ids q'\"", "ids \u{e9}\u{2713}", "pass", "skip", "xfail", "xfail bare", "xpass"];
        assert_eq!(ran, want, "each test ran once\n{shown}");
        // The reasons pytest gives (`SKIPPED [1] ...: not today`, `XFAIL ... - known bug`).
        let junit = dir.path().join(format!("hopper-{}.xml", mode.join("_")));
        let cases = junit_cases(&junit);
        let reason = |id: &str| match &cases[id] {
            TestCaseStatus::Skipped { message, .. } => message.as_ref().map(|m| m.to_string()),
            other => panic!("{id}: {other:?}"),
        };
        assert_eq!(reason("tests/test_outcomes.py::test_skip").as_deref(), Some("not today"), "{shown}");
        assert_eq!(reason("tests/test_outcomes.py::test_xfail").as_deref(), Some("xfail: known bug"), "{shown}");
        assert_eq!(reason("tests/test_outcomes.py::test_xfail_bare").as_deref(), Some("xfail"), "{shown}");
        assert!(shown.contains("SKIPPED [1] not today"), "{shown}");
        // Expected failures apart from the skips, each by its own reason.
        assert!(shown.contains("  XFAIL [1] known bug\n  XFAIL [1] (no reason given)\n"), "{shown}");
        assert!(!shown.contains("SKIPPED [1] xfail"), "{shown}");
        // Counted as pytest counts them: `1 skipped, 2 xfailed, 1 xpassed`. pytest's
        // JUnit, which batches and processes read, gives an xpass as a plain pass.
        let counts = if agents { ", 1 skipped, 2 xfailed, 1 xpassed;" } else { ", 1 skipped, 2 xfailed;" };
        assert!(shown.contains(counts), "{shown}");
    }
}

#[test]
fn junit_names_the_file_and_setup_errors_are_errors() {
    let python = venv_python();
    let dir = Project::new(PYTEST_SUITE);
    let junit = dir.path().join("names.xml");
    let output = hopper(dir.path())
        .args(["run", "-j", "1", "--no-timings", "--max-requeues", "0", "--discover", "pytest", "--junit"])
        .arg(&junit)
        .args([
            "--",
            python.as_str(),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let xml = std::fs::read_to_string(&junit).unwrap();
    let report = quick_junit::Report::deserialize_from_str(&xml).unwrap();
    let cases: BTreeMap<String, &quick_junit::TestCase> =
        report.test_suites.iter().flat_map(|s| s.test_cases.iter()).map(|c| (unit_of(c), c)).collect();
    let classname = |name: &str| cases[name].classname.as_ref().map(|c| c.to_string());
    assert_eq!(cases["test_mod.py::test_a"].name.as_str(), "test_a", "the test's own name: {xml}");
    assert_eq!(classname("test_mod.py::test_a").as_deref(), Some("test_mod.py"), "{xml}");
    assert_eq!(classname("test_cls.py::TestU::test_one").as_deref(), Some("test_cls.py::TestU"), "{xml}");
    // A module fixture's setup error is an error of each test that needs it, as pytest has it.
    assert!(
        matches!(
            cases["test_setup.py::test_needs_it"].status,
            TestCaseStatus::NonSuccess { kind: quick_junit::NonSuccessKind::Error, .. }
        ),
        "{xml}"
    );
}

/// A JUnit case's unit id: hopper's `hopper.unit` property, else its name.
fn unit_of(case: &quick_junit::TestCase) -> String {
    let id = case.properties.iter().find(|p| p.name.as_str() == "hopper.unit").map(|p| p.value.to_string());
    id.unwrap_or_else(|| case.name.to_string())
}

#[test]
fn an_empty_selection_exits_as_the_tool_would() {
    let python = venv_python();
    let dir = Project::new(&[("test_one.py", "def test_one():\n    pass\n")]);
    let selection = ["-k", "nothing_matches"];
    let plain =
        Command::new(&python).args(["-m", "pytest", "-q"]).args(selection).current_dir(dir.path()).output().unwrap();
    assert_eq!(plain.status.code(), Some(5));
    for mode in [&["-j", "1"][..], &["--per-process"]] {
        let output = hopper(dir.path())
            .args(["run", "--no-timings", "--discover", "pytest"])
            .args(mode)
            .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .args(selection)
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), plain.status.code(), "{mode:?}\n{stdout}\n{stderr}");
        assert!(stderr.contains("selected no test"), "{stderr}");
    }
    let specs = Project::new(&[("spec/none_spec.rb", "RSpec.describe 'nothing' do\nend\n")]);
    let plain = Command::new("rspec").current_dir(specs.path()).output().unwrap();
    let output =
        hopper(specs.path()).args(["run", "--no-timings", "--discover", "rspec", "--", "rspec"]).output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), plain.status.code(), "{stdout}\n{stderr}");
    assert_eq!(output.status.code(), Some(0));
}

#[test]
fn a_module_skipped_whole_is_kept_with_its_reason() {
    let python = venv_python();
    let dir = Project::new(&[
        ("test_imp.py", "import pytest\n\npytest.importorskip('nope_not_installed')\n\ndef test_never():\n    pass\n"),
        ("test_ok.py", "def test_ok():\n    pass\n"),
    ]);
    let plain = Command::new(&python)
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .env("COLUMNS", "500")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (stdout, _) = texts(&plain);
    assert!(stdout.contains("1 passed, 1 skipped"), "{stdout}");
    // `SKIPPED [1] test_imp.py:3: could not import 'nope_not_installed': ...`
    let reason = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SKIPPED [1] test_imp.py:3: "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .to_owned();
    for mode in [&["-j", "2"][..], &["--per-process"], &["--batch-size", "5"]] {
        let junit = dir.path().join("skip.xml");
        let output = hopper(dir.path())
            .args(["run", "--no-timings", "--discover", "pytest", "--junit"])
            .arg(&junit)
            .args(mode)
            .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), plain.status.code(), "{mode:?}\n{stdout}\n{stderr}");
        assert!(stdout.contains(&format!("SKIPPED test_imp.py ({reason})")), "{mode:?}\n{stdout}");
        assert!(stdout.contains("1 file(s) skipped"), "{stdout}");
        let cases = junit_cases(&junit);
        assert!(
            matches!(&cases["test_imp.py"], TestCaseStatus::Skipped { message, .. } if message.as_deref() == Some(reason.as_str())),
            "{:?}",
            cases.get("test_imp.py")
        );
    }
}

/// A conftest hook that raises after the last test (`pytest_unconfigure`,
/// `pytest_sessionfinish`): every test passed, yet plain pytest exits 1.
/// hopper's build fails too, in every mode, naming the exception: an agent
/// that does not exit 0 is an error of the session; a batch or per-process
/// run meets the hook at discovery already and stops there.
#[test]
fn a_hook_that_raises_after_the_last_test_fails_the_build_in_every_mode() {
    let python = venv_python();
    for (hook, boom) in [
        ("def pytest_unconfigure(config)", "RuntimeError: unconfigure boom"),
        ("def pytest_sessionfinish(session, exitstatus)", "RuntimeError: sessionfinish boom"),
    ] {
        let (exception, text) = boom.split_once(": ").unwrap();
        let conftest = format!("{hook}:\n    raise {exception}('{text}')\n");
        let dir = Project::new(&[
            ("conftest.py", conftest.as_str()),
            ("test_ok.py", "def test_a():\n    pass\n\ndef test_b():\n    pass\n"),
        ]);
        let plain = Command::new(&python).args(["-m", "pytest", "-q"]).current_dir(dir.path()).output().unwrap();
        assert_eq!(plain.status.code(), Some(1), "{hook}: {}", String::from_utf8_lossy(&plain.stderr));
        let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
        for mode in MODES {
            let agents = !mode.contains(&"--batch-size") && !mode.contains(&"--per-process");
            let (redis, run_mode) = match mode.split_first() {
                Some((&REDIS, rest)) => (true, rest),
                _ => (false, &mode[..]),
            };
            let prefix = leasehold_redis::test_support::unique_prefix("hopper-hook");
            let url = leasehold_redis::test_support::redis_url();
            let queue = ["--queue", url.as_str(), "--key-prefix", prefix.as_str(), "--build", "hook"];
            let queue = if redis { &queue[..] } else { &[] };
            let run = hopper(dir.path())
                .args(["run", "--no-timings", "--discover", "pytest"])
                .args(queue)
                .args(run_mode)
                .arg("--")
                .args(command)
                .output()
                .unwrap();
            let (stdout, stderr) = texts(&run);
            let shown = format!("{hook}, {mode:?}:\nstdout:\n{stdout}\nstderr:\n{stderr}");
            if !agents {
                assert_eq!(run.status.code(), Some(2), "discovery refuses: {shown}");
                assert!(stderr.contains(boom) && stderr.contains("conftest.py"), "{shown}");
                continue;
            }
            let (code, stdout) = match redis {
                true => {
                    assert_eq!(run.status.code(), Some(0), "the worker leaves the verdict to report: {shown}");
                    let report = hopper(dir.path()).arg("report").args(queue).output().unwrap();
                    (report.status.code(), texts(&report).0)
                }
                false => (run.status.code(), stdout.clone()),
            };
            assert_eq!(code, Some(1), "{shown}\nverdict:\n{stdout}");
            assert!(stdout.contains("2 passed (0 flaky), 0 failed"), "the tests passed: {shown}\nverdict:\n{stdout}");
            let line = format!("ERROR session (exit error: the tool failed after its last test (exit code 1, where an agent exits 0): {boom})");
            assert_eq!(stdout.matches(&line).count(), 1, "once, however many agents: {shown}\nverdict:\n{stdout}");
        }
    }
}

/// An agent whose child keeps its stdout open after it exited: the build
/// ends when the agent does, and the errors it sent on the way out count.
#[test]
fn an_agents_final_errors_are_read_until_it_exits_even_if_a_child_holds_its_pipe() {
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    let agent = "import json, subprocess, sys\n\
                 subprocess.Popen(['sleep', '30'])  # inherits stdout, and outlives us\n\
                 print(json.dumps({'event': 'ready', 'protocol': 1}), flush=True)\n\
                 for line in sys.stdin:\n    \
                     req = json.loads(line)\n    \
                     if req['op'] == 'exit':\n        \
                         print(json.dumps({'event': 'error', 'group': 'suite', 'phase': 'teardown', 'message': 'final boom'}), flush=True)\n        \
                         sys.exit(0)\n    \
                     print(json.dumps({'event': 'started', 'seq': req['seq']}), flush=True)\n    \
                     print(json.dumps({'event': 'result', 'seq': req['seq'], 'outcome': 'passed'}), flush=True)\n";
    std::fs::write(dir.path().join("agent.py"), agent).unwrap();
    std::fs::write(dir.path().join("units.txt"), "one\ntwo\n").unwrap();
    let started = Instant::now();
    let output = hopper(dir.path())
        .args([
            "run",
            "-j",
            "1",
            "--no-timings",
            "--units-from",
            "units.txt",
            "--agent",
            "--",
            python.as_str(),
            "agent.py",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert!(started.elapsed() < Duration::from_secs(20), "waited for the child: {:?}", started.elapsed());
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("ERROR suite (teardown error: final boom)"), "{stdout}");
}

#[test]
fn nextest_discovery_runs_each_binary_test_and_keeps_ignored_ones_as_skips() {
    let dir = Project::new(CARGO_SUITE);
    let mut plain = plain_cargo_test(dir.path());
    // nextest runs no doctests.
    plain.tests.retain(|name, _| !name.contains(" - "));
    plain.exit = Some(1);
    for mode in [&["-j", "1"][..], &["-j", "2"]] {
        let junit = dir.path().join("nextest.xml");
        let output = hopper(dir.path())
            .env("CARGO_TARGET_DIR", dir.path().join("target"))
            .args(["run", "--no-timings", "--max-requeues", "0", "--discover", "nextest", "--junit"])
            .arg(&junit)
            .args(mode)
            .output()
            .unwrap();
        let (stdout, stderr) = texts(&output);
        let shown = format!("{mode:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        let xml = std::fs::read_to_string(&junit).unwrap_or_else(|_| panic!("{shown}"));
        let report = quick_junit::Report::deserialize_from_str(&xml).unwrap();
        let tests = report
            .test_suites
            .iter()
            .flat_map(|s| s.test_cases.iter())
            .map(|case| {
                let outcome = match case.status {
                    TestCaseStatus::Success { .. } => "passed",
                    TestCaseStatus::NonSuccess { .. } => "failed",
                    TestCaseStatus::Skipped { .. } => "skipped",
                };
                (case.name.to_string(), outcome)
            })
            .collect();
        let ours = Verdict { tests, outside: BTreeSet::new(), exit: output.status.code() };
        assert_same(&plain, &ours, &shown);
        assert!(xml.contains(r#"<skipped message="too slow"/>"#), "{xml}");
        assert!(
            stdout
                .contains("FAIL binary_id(=exact-demo) & test(=tests::parse_fails) (assertion `left == right` failed"),
            "{shown}"
        );
    }
}

/// A nextest command without `{unit}` got the unit as a name filter, which
/// matches no test: every unit failed with nextest's exit code 4. A command
/// with its own filterset ran all of it for each unit. Each unit's command
/// now filters by the unit alone, and the command's own filterset chooses
/// the tests at discovery only.
#[test]
fn a_nextest_command_runs_each_unit_by_its_filter_alone() {
    let dir = Project::new(CARGO_SUITE);
    let run = |command: &[&str]| nextest_run(dir.path(), command);
    let (code, shown) = run(&["cargo", "nextest", "run", "--no-fail-fast"]);
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("3 units, 2 passed (0 flaky), 1 failed"), "{shown}");
    let (code, shown) = run(&["cargo", "nextest", "run", "-E", "test(=tests::parse) | test(=integration)"]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("2 units, 2 passed (0 flaky), 0 failed"), "{shown}");
    assert!(shown.contains("chose the tests at discovery"), "{shown}");
}

/// `.cargo/config.toml`'s `[env]` reaches the tests only through cargo: a
/// test binary hopper ran directly lacked it, and a test reading it failed
/// where `cargo nextest run` passed it. Such a project's tests run through
/// `cargo nextest run -E {unit}`, with a note; so does the note on nextest's
/// test groups, which hopper's units do not keep.
#[test]
fn nextest_tests_get_cargo_configs_env() {
    let dir = Project::new(&[
        ("Cargo.toml", "[package]\nname = \"cfgenv\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n"),
        (".cargo/config.toml", "[env]\nMY_SETTING = \"from-cargo-config\"\n"),
        (".config/nextest.toml", "[test-groups.serial]\nmax-threads = 1\n"),
        (
            "src/lib.rs",
            "#[cfg(test)]\nmod tests {\n    #[test]\n    fn reads_cargo_env() {\n        \
             assert_eq!(std::env::var(\"MY_SETTING\").as_deref(), Ok(\"from-cargo-config\"));\n    }\n}\n",
        ),
    ]);
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .args(["run", "--no-timings", "--max-requeues", "0", "-j", "2", "--discover", "nextest"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    let shown = format!("{stdout}\n{stderr}");
    assert_eq!(output.status.code(), Some(0), "{shown}");
    assert!(shown.contains("1 units, 1 passed"), "{shown}");
    assert!(shown.contains("sets environment variables for the tests ([env])"), "{shown}");
    assert!(shown.contains("defines nextest test groups"), "{shown}");
}

/// Two tests that share a resource, which nextest's test group of one
/// thread keeps apart; each fails if the other holds the resource. hopper
/// runs each as a unit on its own, so the group must become a hopper group
/// (every worker together), or the two slots run them at once.
#[test]
fn nextests_test_groups_hold_between_units() {
    let test = |name: &str| {
        format!(
            "    #[test]\n    fn {name}() {{\n        let lock = std::path::Path::new(env!(\"CARGO_MANIFEST_DIR\")).join(\"held\");\n        \
             std::fs::OpenOptions::new().write(true).create_new(true).open(&lock).expect(\"the other test holds it\");\n        \
             std::thread::sleep(std::time::Duration::from_millis(1500));\n        std::fs::remove_file(&lock).unwrap();\n    }}\n"
        )
    };
    let lib = format!("#[cfg(test)]\nmod tests {{\n{}{}}}\n", test("first"), test("second"));
    let dir = Project::new(&[
        ("Cargo.toml", "[package]\nname = \"grouped\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n"),
        (
            ".config/nextest.toml",
            "[test-groups]\nshared = { max-threads = 1 }\n\n[[profile.default.overrides]]\nfilter = \"test(/first|second/)\"\n\
             test-group = \"shared\"\n",
        ),
        ("src/lib.rs", lib.as_str()),
    ]);
    for command in [&[][..], &["cargo", "nextest", "run"]] {
        let (code, shown) = nextest_run(dir.path(), command);
        assert_eq!(code, Some(0), "{command:?}: {shown}");
        assert!(shown.contains("2 units, 2 passed"), "{command:?}: {shown}");
    }
}

/// `hopper run -j 2 --discover nextest -- COMMAND` in `dir`, with no retries
/// and the crate's own target directory: the exit code, stdout and stderr.
fn nextest_run(dir: &Path, command: &[&str]) -> (Option<i32>, String) {
    let output = hopper(dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .args(["run", "--no-timings", "--max-requeues", "0", "-j", "2", "--discover", "nextest", "--"])
        .args(command)
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    (output.status.code(), format!("{stdout}\n{stderr}"))
}

#[test]
fn a_spec_file_that_does_not_load_is_named_with_its_backtrace() {
    let dir = Project::new(&[
        ("spec/ok_spec.rb", "RSpec.describe('ok') { it('works') { expect(1).to eq(1) } }\n"),
        ("spec/broken_spec.rb", "require 'nope_not_a_gem'\n"),
    ]);
    let plain = Command::new("rspec").current_dir(dir.path()).output().unwrap();
    assert_eq!(plain.status.code(), Some(1), "rspec stops on a file that does not load");
    let output =
        hopper(dir.path()).args(["run", "--no-timings", "--discover", "rspec", "--", "rspec"]).output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert_ne!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("while loading ./spec/broken_spec.rb"), "{stderr}");
    assert!(stderr.contains("nope_not_a_gem"), "{stderr}");
}

/// A suite whose config runs it on xdist's workers (`-n 2` in an addopts),
/// as `config` (a file name and its text) writes it.
fn xdist_suite(config: (&'static str, &'static str)) -> Project {
    Project::new(&[
        config,
        (
            "test_x.py",
            "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    assert 0, 'b fails'\n\n\
                       @pytest.mark.xfail(reason='known')\ndef test_c():\n    assert 0\n",
        ),
        ("test_y.py", "def test_d():\n    pass\n"),
    ])
}

#[test]
fn xdist_in_addopts_is_turned_off_for_the_agents_with_a_note() {
    let python = venv_python();
    let xdist = Command::new(&python).args(["-c", "import xdist"]).output().unwrap();
    assert!(xdist.status.success(), "pytest-xdist is required by this test: run `cargo xtask setup`");
    let configs = [
        ("pytest.ini", "[pytest]\naddopts = -n 2\n"),
        ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-n 2\"\n"),
        ("setup.cfg", "[tool:pytest]\naddopts = -n 2\n"),
    ];
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    for (k, config) in configs.into_iter().enumerate() {
        let dir = xdist_suite(config);
        let (plain, _) = plain_pytest(dir.path(), &[]);
        assert_eq!(plain.tests.len(), 4, "{config:?}: plain pytest ran on xdist: {plain:?}");
        // Every mode for one config; the agents' two for the others.
        let modes: &[&[&str]] = if k == 0 { MODES } else { &[&["-j", "2"], &[REDIS, "-j", "1"]] };
        for mode in modes {
            let (ours, shown) = hopper_verdict(dir.path(), mode, "pytest", &command);
            assert_same(&plain, &ours, &shown);
            let agents = !mode.iter().any(|m| *m == "--per-process" || *m == "--batch-size");
            let said = usize::from(agents && mode.first() != Some(&REDIS));
            let note = "pytest-xdist's -n/--dist (from the command or addopts) is turned off in hopper's agents";
            assert_eq!(shown.matches(note).count(), said, "{config:?}: the note, once\n{shown}");
        }
    }
}

/// pytest-rerunfailures runs a failed test again inside the same pytest,
/// and pytest says "1 rerun" of one that then passed: hopper's report names
/// it flaky, with the failed try as a `<flakyFailure>`, where it used to be
/// a plain pass. `--flaky-result fail` then fails the build, as for a unit
/// hopper retried itself.
#[test]
fn a_test_that_passed_on_pytests_own_rerun_is_flaky() {
    let python = venv_python();
    let rerunfailures = Command::new(&python).args(["-c", "import pytest_rerunfailures"]).output().unwrap();
    assert!(rerunfailures.status.success(), "pytest-rerunfailures is required by this test: run `cargo xtask setup`");
    // Each test fails on its first try of a build (a marker file per build).
    let once = "import os, pytest\n\ndef first_try(name):\n    path = os.path.join('state', os.environ.get('HOPPER_BUILD', \
                'plain') + name)\n    os.makedirs('state', exist_ok=True)\n    if os.path.exists(path):\n        return False\n    \
                open(path, 'w').close()\n    return True\n\n";
    let tests = format!(
        "{once}def test_once():\n    assert not first_try('once'), 'first try fails'\n\n@pytest.mark.flaky(reruns=2)\n\
         def test_marked():\n    assert not first_try('marked'), 'marked: first try fails'\n\ndef test_sound():\n    pass\n"
    );
    let dir = Project::new(&[("test_r.py", tests.as_str())]);
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--reruns", "1"];
    let plain = Command::new(&python).args(&command[1..]).current_dir(dir.path()).output().unwrap();
    let (stdout, _) = texts(&plain);
    assert!(stdout.contains("3 passed, 2 rerun"), "pytest's own count: {stdout}");
    let flaky = [
        "FLAKY test_r.py::test_once (failed 1x: AssertionError: first try fails",
        "FLAKY test_r.py::test_marked (failed 1x: AssertionError: marked: first try",
    ];
    passes_after_own_reruns_are_flaky(dir.path(), ("pytest", &command), 3, &flaky, "first_try(");
}

/// rspec-retry (`run_with_retry` in an `around` hook) likewise: an example
/// that passed on its second try is flaky.
#[test]
fn an_example_that_passed_on_rspec_retrys_own_try_is_flaky() {
    common::require_rspec();
    let spec_helper = "require 'rspec/retry'\nRSpec.configure do |config|\n  config.around(:each, :flaky) { |ex| \
                       ex.run_with_retry(retry: 3) }\nend\n";
    let spec =
        "require 'fileutils'\ndef first_try(name)\n  path = File.join('state', (ENV['HOPPER_BUILD'] || 'plain') \
                + name)\n  FileUtils.mkdir_p('state')\n  return false if File.exist?(path)\n  FileUtils.touch(path)\n  \
                true\nend\n\ndescribe 'retried' do\n  it 'passes on its second try', :flaky do\n    \
                expect(first_try('once')).to be(false)\n  end\n  it('is sound') { expect(1).to eq(1) }\nend\n";
    let dir = Project::new(&[
        (".rspec", "--require spec_helper\n"),
        ("spec/spec_helper.rb", spec_helper),
        ("spec/r_spec.rb", spec),
    ]);
    let plain = Command::new("rspec").current_dir(dir.path()).output().unwrap();
    let (stdout, stderr) = texts(&plain);
    assert!(
        stdout.contains("2 examples, 0 failures"),
        "plain rspec (rspec-retry is required by this test: install Debian's ruby-rspec-retry, as cargo xtask setup does): \
         {stdout}\n{stderr}"
    );
    let flaky = ["FLAKY ./spec/r_spec.rb[1:1] (failed 1x: RSpec::Expectations::ExpectationNotMetError: expected false"];
    passes_after_own_reruns_are_flaky(dir.path(), ("rspec", &["rspec"]), 2, &flaky, "r_spec.rb:12");
}

/// Runs `command` with hopper on memory, on Redis (with `hopper report`) and
/// under `--flaky-result fail`, and checks that the units `flaky` names (the
/// start of each one's report line) are flaky, `passed` passed in all, and
/// each failed try is a `<flakyFailure type="rerun">` with its own trace
/// (which shows `trace`).
fn passes_after_own_reruns_are_flaky(
    dir: &Path,
    (tool, command): (&str, &[&str]),
    passed: usize,
    flaky: &[&str],
    trace: &str,
) {
    let modes: &[&[&str]] = &[&["-j", "2"], &[REDIS, "-j", "1"], &["-j", "1", "--flaky-result", "fail"]];
    for (k, mode) in modes.iter().enumerate() {
        let junit = dir.join(format!("reruns-{k}.xml"));
        let (redis, mode) = match mode.split_first() {
            Some((&REDIS, rest)) => (true, rest),
            _ => (false, *mode),
        };
        let prefix = leasehold_redis::test_support::unique_prefix("hopper-reruns");
        let url = leasehold_redis::test_support::redis_url();
        let build = format!("reruns-{k}");
        let queue: Vec<&str> =
            if redis { vec!["--queue", &url, "--key-prefix", &prefix, "--build", &build] } else { Vec::new() };
        let mut run = hopper(dir);
        run.args(["run", "--no-timings", "--discover", tool]).args(&queue).args(mode).arg("--junit").arg(&junit);
        if !redis {
            run.env("HOPPER_BUILD", &build);
        }
        let mut output = run.arg("--").args(command).output().unwrap();
        if redis {
            assert_eq!(output.status.code(), Some(0), "the worker: {:?}", texts(&output));
            output = hopper(dir).arg("report").args(&queue).arg("--junit").arg(&junit).output().unwrap();
        }
        let (stdout, stderr) = texts(&output);
        let shown = format!("{mode:?}:\n{stdout}\n{stderr}");
        let fail = mode.contains(&"fail");
        assert_eq!(output.status.code(), Some(i32::from(fail)), "{shown}");
        assert!(stdout.contains(&format!("{passed} passed ({} flaky)", flaky.len())), "{shown}");
        for line in flaky {
            assert!(stdout.contains(line), "{line}\n{shown}");
        }
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert_eq!(xml.matches(r#"<flakyFailure time="0.000" message=""#).count(), flaky.len(), "{shown}\n{xml}");
        assert_eq!(xml.matches(r#"type="rerun""#).count(), flaky.len(), "{xml}");
        let failed = r#"<failure message="flaky: failed 1 time(s)"#;
        assert_eq!(xml.matches(failed).count(), usize::from(fail) * flaky.len(), "{xml}");
        assert!(xml.contains(trace), "the failed try's own traceback: {xml}");
    }
}

/// A test that passed despite its non-strict xfail mark is "xpassed" to
/// pytest, counted apart from the passes: so it is in hopper's verdict line
/// (it was one of the passes), on memory and on Redis.
#[test]
fn an_xpass_is_counted_apart_as_pytest_counts_it() {
    let python = venv_python();
    let dir = Project::new(&[(
        "test_x.py",
        "import pytest\n\n@pytest.mark.xfail(reason='known bug')\ndef test_xpass():\n    pass\n\n\
         @pytest.mark.xfail(reason='real')\ndef test_xfail():\n    assert 0\n\ndef test_ok():\n    pass\n",
    )]);
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    let plain = Command::new(&python).args(&command[1..]).current_dir(dir.path()).output().unwrap();
    assert!(texts(&plain).0.contains("1 passed, 1 xfailed, 1 xpassed"), "{:?}", texts(&plain));
    for mode in [&["-j", "2"][..], &[REDIS, "-j", "1"]] {
        let (ours, shown) = hopper_verdict(dir.path(), mode, "pytest", &command);
        assert_eq!(ours.tests.get("test_x.py::test_xpass"), Some(&"passed"), "a JUnit success, as pytest's: {shown}");
        assert!(shown.contains("3 units, 1 passed (0 flaky), 0 failed, 0 unfinished, 1 xfailed, 1 xpassed"), "{shown}");
    }
}

/// pytest's `-x` (or `--maxfail`, here in an addopts) means nothing to an
/// agent that runs a share of the tests: it was ignored without a word.
/// Now the agents say they turned it off, and every test runs.
#[test]
fn maxfail_is_turned_off_for_the_agents_with_a_note() {
    let python = venv_python();
    let dir = Project::new(&[
        ("pytest.ini", "[pytest]\naddopts = --maxfail=1\n"),
        ("test_x.py", "def test_1():\n    assert 0\n\ndef test_2():\n    pass\n\ndef test_3():\n    pass\n"),
    ]);
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    let output = hopper(dir.path())
        .args(["run", "--no-timings", "--max-requeues", "0", "-j", "2", "--discover", "pytest", "--"])
        .args(command)
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    let shown = format!("{stdout}\n{stderr}");
    assert!(stdout.contains("3 units, 2 passed (0 flaky), 1 failed"), "{shown}");
    let note = "pytest's -x/--maxfail (from the command or addopts) is turned off in hopper's agents";
    assert_eq!(shown.matches(note).count(), 1, "the note, once: {shown}");
}

/// Reads a JUnit file with two consumers, junitparser and Python's own
/// ElementTree (checking the shape JUnit's schema gives: `testsuites` or
/// `testsuite` at the root, every `testcase` with a `name` and a
/// `classname`, at most one result element); prints the counts each found
/// as JSON: `{"junitparser": [tests, failures, errors, skipped], "etree": [...]}`.
const JUNIT_CONSUMERS: &str = r#"
import json, sys
import xml.etree.ElementTree as ET
from junitparser import JUnitXml, Failure, Error, Skipped

path = sys.argv[1]
xml = JUnitXml.fromfile(path)
suites = [xml] if xml._tag == "testsuite" else list(xml)
counts = [0, 0, 0, 0]
for suite in suites:
    for case in suite:
        counts[0] += 1
        kinds = {type(r) for r in case.result}
        counts[1] += Failure in kinds
        counts[2] += Error in kinds and Failure not in kinds
        counts[3] += Skipped in kinds

root = ET.parse(path).getroot()
assert root.tag in ("testsuites", "testsuite"), root.tag
tree = [0, 0, 0, 0]
for case in root.iter("testcase"):
    assert case.get("name") and case.get("classname") is not None, ET.tostring(case)
    results = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
    assert len(set(results)) <= 1, ET.tostring(case)
    tree[0] += 1
    tree[1] += "failure" in results
    tree[2] += "error" in results
    tree[3] += "skipped" in results
print(json.dumps({"junitparser": counts, "etree": tree}))
"#;

/// The counts (tests, failures, errors, skipped) both consumers of
/// [`JUNIT_CONSUMERS`] read in `junit`; they must agree.
fn junit_counts(junit: &Path) -> Vec<u64> {
    let output = Command::new(venv_python()).args(["-c", JUNIT_CONSUMERS]).arg(junit).output().unwrap();
    let (stdout, stderr) = texts(&output);
    assert!(output.status.success(), "junitparser (cargo xtask setup installs it) read {junit:?}:\n{stderr}");
    let counts: BTreeMap<String, Vec<u64>> = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(counts["junitparser"], counts["etree"], "the two consumers differ on {junit:?}");
    counts["junitparser"].clone()
}

#[test]
fn junitparser_and_elementtree_read_hoppers_junit_with_pytests_own_counts() {
    let python = venv_python();
    let mut files = PYTEST_OUTCOMES.to_vec();
    files.push((
        "tests/test_setup.py",
        "import pytest\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('setup boom')\n\ndef test_needs_it(broken):\n    pass\n",
    ));
    let dir = Project::new(&files);
    let plain_xml = dir.path().join("plain.xml");
    let plain = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", "--junitxml"])
        .arg(&plain_xml)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(1), "{:?}", texts(&plain));
    let want = junit_counts(&plain_xml);
    assert_eq!(want, [10, 2, 1, 3], "pytest's own: 10 tests, 2 failed, a setup error, a skip and two xfails skipped");
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"];
    for mode in [&["-j", "2"][..], &["-j", "1", "--batch-size", "20"], &["--per-process", "-j", "2"]] {
        let (_, shown) = hopper_verdict(dir.path(), mode, "pytest", &command);
        let junit = dir.path().join(format!("hopper-{}.xml", mode.join("_")));
        assert_eq!(junit_counts(&junit), want, "{mode:?}\n{shown}");
    }
}

/// A suite with a test that hangs and one that kills its interpreter,
/// beside tests that pass and fail.
const PYTEST_HANG_CRASH: &[(&str, &str)] = &[
    (
        "test_edge.py",
        "import os, time\n\ndef test_before():\n    pass\n\ndef test_hang():\n    time.sleep(120)\n\n\
         def test_crash():\n    os._exit(3)\n\ndef test_fails():\n    assert 0, 'fails'\n\ndef test_after():\n    pass\n",
    ),
    ("test_other.py", "def test_one():\n    pass\n\ndef test_two():\n    pass\n"),
];

#[test]
fn a_hang_and_a_crash_fail_alone_in_every_mode() {
    let python = venv_python();
    let dir = Project::new(PYTEST_HANG_CRASH);
    // Plain pytest never ends with the hang and dies with the crash: it
    // judges the rest, and those two are failures of their own.
    let deselect = ["--deselect", "test_edge.py::test_hang", "--deselect", "test_edge.py::test_crash"];
    let (mut plain, _) = plain_pytest(dir.path(), &deselect);
    assert_eq!(plain.tests.len(), 5, "{plain:?}");
    plain.tests.insert("test_edge.py::test_hang".into(), "failed");
    plain.tests.insert("test_edge.py::test_crash".into(), "failed");
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    for mode in MODES {
        let mode: Vec<&str> = mode.iter().copied().chain(["--unit-timeout", "5"]).collect();
        let started = Instant::now();
        let (ours, shown) = hopper_verdict(dir.path(), &mode, "pytest", &command);
        assert_same(&plain, &ours, &shown);
        assert!(started.elapsed() < Duration::from_secs(90), "{mode:?} took {:?}\n{shown}", started.elapsed());
        assert!(shown.contains("FAIL test_edge.py::test_hang ("), "{shown}");
        assert!(shown.contains("timeout") || shown.contains("timed out"), "the hang's reason\n{shown}");
        assert!(shown.contains("crash"), "the crash's reason\n{shown}");
    }
}

/// Spec files whose names hold a space and a quote (so do their example
/// ids), and descriptions in unicode, with passing, failing and pending
/// examples. (A non-ASCII file name is left out: under a C locale, which
/// these tests give hopper, rspec cannot match an id naming it, and hopper's
/// batches pass ids; the plain run globs the files itself.)
const RSPEC_ODD_IDS: &[(&str, &str)] = &[
    (
        "spec/odd name_spec.rb",
        "RSpec.describe('with a space') do\n  it('passes') { expect(1).to eq(1) }\n  it('fails \"quoted\"') { expect(1).to eq(2) }\nend\n",
    ),
    (
        "spec/it's_spec.rb",
        "RSpec.describe(\"it's quoted\") do\n  it('passes') { expect(1).to eq(1) }\n  it('is pending') { pending('later'); raise 'x' }\nend\n",
    ),
    (
        "spec/unicode_spec.rb",
        "RSpec.describe('caf\u{e9} \u{2713}') do\n  it('passes \u{e9}') { expect('\u{e9}').to eq('\u{e9}') }\n  it('fails \u{2713}') { expect(1).to eq(3) }\nend\n",
    ),
];

#[test]
fn rspec_ids_with_spaces_quotes_and_unicode_keep_their_verdicts_in_every_mode() {
    common::require_rspec();
    let dir = Project::new(RSPEC_ODD_IDS);
    let plain = plain_rspec(dir.path());
    assert_eq!(plain.tests.len(), 6, "{plain:?}");
    assert_eq!(plain.exit, Some(1), "{plain:?}");
    for mode in MODES {
        let (mut ours, shown) = hopper_verdict(dir.path(), mode, "rspec", &["rspec"]);
        ours.outside = BTreeSet::from([(String::new(), ours.outside.len().to_string())]);
        assert_same(&plain, &ours, &shown);
    }
}

#[test]
fn doctests_and_ignored_tests_keep_their_verdicts_on_redis() {
    let dir = Project::new(CARGO_SUITE);
    let mut plain = plain_cargo_test(dir.path());
    assert_eq!(plain.tests["src/lib.rs - add_one (line 5)"], "failed", "{plain:?}");
    assert_eq!(plain.tests["tests::slow"], "skipped", "{plain:?}");
    // hopper's red is 1, cargo's 101: the verdict is what must agree.
    plain.exit = Some(1);
    for mode in [&[REDIS, "-j", "2"][..], &[REDIS, "--per-process", "-j", "1"]] {
        let (ours, shown) = hopper_verdict(dir.path(), mode, "cargo-test", &["cargo", "test", "-q", "{unit}"]);
        assert_same(&plain, &ours, &shown);
    }
    // nextest runs no doctests; its ignored test is a skip on Redis too.
    plain.tests.retain(|name, _| !name.contains(" - "));
    let (ours, shown) = hopper_verdict(dir.path(), &[REDIS, "-j", "2"], "nextest", &[]);
    let ours = Verdict {
        tests: ours
            .tests
            .into_iter()
            .map(|(id, outcome)| {
                let test = id.split_once(") & test(=").map_or(id.as_str(), |(_, t)| t.trim_end_matches(')'));
                (test.to_owned(), outcome)
            })
            .collect(),
        ..ours
    };
    assert_same(&plain, &ours, &shown);
}

/// A test file's import changes what another file's tests see (here it
/// patches a library global; jsonschema 4.23.0's `test_import_cli` needs
/// `test_cli.py` to have imported `jsonschema.cli`). Plain pytest imports
/// every file before it runs a test; hopper's agents collect a share of the
/// files each, and the agent without the patching file passed the tests
/// that fail under pytest. Every agent now imports every file.
#[test]
fn a_test_files_import_reaches_every_agent_as_in_one_pytest() {
    let python = venv_python();
    let dir = Project::new(&[
        ("settings.py", "MODE = 'strict'\n"),
        ("test_a_patches.py", "import settings\n\nsettings.MODE = 'lenient'\n\ndef test_a():\n    pass\n"),
        // Ten tests of 50 ms: each slot runs some of them.
        (
            "test_b_reads.py",
            "import time\n\nimport pytest\n\nimport settings\n\n@pytest.mark.parametrize('n', range(10))\n\
             def test_b(n):\n    time.sleep(0.05)\n    assert settings.MODE == 'strict'\n",
        ),
    ]);
    let (plain, _) = plain_pytest(dir.path(), &[]);
    assert_eq!(plain.tests.get("test_b_reads.py::test_b[9]"), Some(&"failed"), "{plain:?}");
    let command = [python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"];
    // No retries (hopper_verdict gives none): a first attempt must fail as pytest does.
    for mode in [&["-j", "2"][..], &[REDIS, "-j", "2"]] {
        let (ours, shown) = hopper_verdict(dir.path(), mode, "pytest", &command);
        assert_same(&plain, &ours, &shown);
    }
}
