//! End-to-end tests of per-unit verdicts in batches (`--batch-size N`): each
//! unit's result is read from the tool's own report, written to `{report}`
//! (or `$HOPPER_REPORT`), never from the batch's exit code.
//!
//! The pytest tests run the real pytest of the venv `cargo xtask setup` makes;
//! a missing pytest fails them, it never skips them.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{hopper, junit_cases, texts, venv_python};
use quick_junit::TestCaseStatus;

/// Every throwaway test appends its name to the file this variable names.
const RAN_LOG_VAR: &str = "BATCH_RAN_LOG";

/// A pytest file with `passing` passing tests (`test_000`, ...) and the extra test bodies given.
fn pytest_suite(dir: &Path, passing: usize, extra: &str) {
    let mut source = String::from(
        "import os\n\ndef ran(name):\n    with open(os.environ['BATCH_RAN_LOG'], 'a') as log:\n        log.write(name + '\\n')\n\n",
    );
    for i in 0..passing {
        source.push_str(&format!("def test_{i:03}():\n    ran('test_{i:03}')\n\n"));
    }
    source.push_str(extra);
    std::fs::write(dir.join("test_many.py"), source).unwrap();
}

/// How many times each test ran.
fn ran_counts(log: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

fn is_success(status: &TestCaseStatus) -> bool {
    matches!(status, TestCaseStatus::Success { .. })
}

#[test]
fn one_failing_test_in_a_batch_of_50_fails_alone() {
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    pytest_suite(
        dir.path(),
        49,
        "def test_broken():\n    ran('test_broken')\n    assert 1 + 1 == 3, 'deliberately broken'\n",
    );
    let log = dir.path().join("ran.log");
    let junit = dir.path().join("out.xml");
    let output = hopper(dir.path())
        .env(RAN_LOG_VAR, &log)
        .args(["run", "-j", "1", "--batch-size", "50", "--max-requeues", "1", "--no-timings", "--discover", "pytest"])
        .arg("--junit")
        .arg(&junit)
        .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("FAILED: 50 units, 49 passed (0 flaky), 1 failed"), "{stdout}");
    assert!(stdout.contains("FAIL test_many.py::test_broken (AssertionError: deliberately broken"), "{stdout}");

    let cases = junit_cases(&junit);
    assert_eq!(cases.len(), 50, "{cases:?}");
    let failed: Vec<&String> = cases.iter().filter(|(_, s)| !is_success(s)).map(|(n, _)| n).collect();
    assert_eq!(failed, vec!["test_many.py::test_broken"]);
    match &cases["test_many.py::test_broken"] {
        TestCaseStatus::NonSuccess { message, description, .. } => {
            assert!(message.as_ref().is_some_and(|m| m.contains("deliberately broken")), "{message:?}");
            assert!(description.as_ref().is_some_and(|d| d.contains("assert 1 + 1 == 3")), "{description:?}");
        }
        other => panic!("test_broken: {other:?}"),
    }

    // The 49 passed once, in the first batch; only the failing one was retried.
    let ran = ran_counts(&log);
    assert_eq!(ran.len(), 50, "{ran:?}");
    assert_eq!(ran["test_broken"], 2, "the failure is retried once");
    assert!(ran.iter().filter(|(n, _)| *n != "test_broken").all(|(_, c)| *c == 1), "{ran:?}");
}

/// A test the tool never reports (here a conftest hook drops it at run time,
/// as a plugin or a crash mid-run would) is retried and then failed, even
/// though pytest itself exits 0.
#[test]
fn units_missing_from_the_report_are_retried_never_passed() {
    let python = venv_python();
    let dir = tempfile::tempdir().unwrap();
    pytest_suite(dir.path(), 9, "def test_vanishes():\n    ran('test_vanishes')\n");
    std::fs::write(
        dir.path().join("conftest.py"),
        "def pytest_collection_modifyitems(config, items):\n    items[:] = [i for i in items if 'vanish' not in i.name]\n",
    )
    .unwrap();
    let units: Vec<String> =
        (0..9).map(|i| format!("test_many.py::test_{i:03}")).chain(["test_many.py::test_vanishes".into()]).collect();
    let list = dir.path().join("units.txt");
    std::fs::write(&list, units.join("\n")).unwrap();
    let log = dir.path().join("ran.log");
    let junit = dir.path().join("out.xml");
    let output = hopper(dir.path())
        .env(RAN_LOG_VAR, &log)
        .args(["run", "-j", "2", "--batch-size", "5", "--max-requeues", "2", "--no-timings", "--results", "junit"])
        .arg("--units-from")
        .arg(&list)
        .arg("--junit")
        .arg(&junit)
        .args(["--", python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml={report}", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("10 units, 9 passed (0 flaky), 1 failed"), "{stdout}");
    assert!(stdout.contains("FAIL test_many.py::test_vanishes (not in the junit report"), "{stdout}");
    assert!(stdout.contains("3 failed attempt(s)"), "retried within --max-requeues 2: {stdout}");
    // Its first batch passed as a whole, and still it did not pass.
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("not in the junit report (the invocation ended with exit code 0)"), "{xml}");
    let cases = junit_cases(&junit);
    let failed: Vec<&String> = cases.iter().filter(|(_, s)| !is_success(s)).map(|(n, _)| n).collect();
    assert_eq!(failed, vec!["test_many.py::test_vanishes"]);
    assert!(!ran_counts(&log).contains_key("test_vanishes"), "the hook dropped it before it ran");
}

/// Any tool can write a JUnit report to `$HOPPER_REPORT`.
#[test]
fn a_report_written_to_hopper_report_gives_each_unit_its_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("units.txt");
    std::fs::write(&list, "good\nbad\nskipped\nsilent\n").unwrap();
    // One case per argument: `bad` fails, `skipped` is skipped, `silent` is left out.
    let script = r#"{
  echo '<?xml version="1.0"?><testsuites><testsuite name="sh">'
  for u in "$@"; do
    case "$u" in
      bad) echo "<testcase name=\"$u\" time=\"0.5\"><failure message=\"bad is bad\">detail of bad</failure></testcase>" ;;
      skipped) echo "<testcase name=\"$u\"><skipped/></testcase>" ;;
      silent) ;;
      *) echo "<testcase name=\"$u\" time=\"1.25\"/>" ;;
    esac
  done
  echo '</testsuite></testsuites>'
} > "$HOPPER_REPORT""#;
    let junit = dir.path().join("out.xml");
    let output = hopper(dir.path())
        .args(["run", "-j", "1", "--batch-size", "4", "--max-requeues", "1", "--no-timings", "--results", "junit"])
        .arg("--units-from")
        .arg(&list)
        .arg("--junit")
        .arg(&junit)
        .args(["--", "sh", "-c", script, "sh", "{unit}", "{report}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let cases = junit_cases(&junit);
    assert!(is_success(&cases["good"]), "{cases:?}");
    assert!(matches!(cases["skipped"], TestCaseStatus::Skipped { .. }), "{cases:?}");
    assert!(
        matches!(&cases["bad"], TestCaseStatus::NonSuccess { message: Some(m), .. } if m.as_str() == "bad is bad"),
        "{cases:?}"
    );
    assert!(
        matches!(&cases["silent"], TestCaseStatus::NonSuccess { message: Some(m), .. } if m.contains("not in the junit report")),
        "{cases:?}"
    );
    assert!(stdout.contains("1.25s good"), "the unit's own time from the report: {stdout}");
}

#[test]
fn a_batch_without_a_way_to_tell_units_apart_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("units.txt");
    std::fs::write(&list, "a\nb\n").unwrap();
    let ran = dir.path().join("ran");
    let output = hopper(dir.path())
        .args(["run", "--batch-size", "2", "--no-timings", "--units-from"])
        .arg(&list)
        .args(["--", "touch"])
        .arg(&ran)
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("--results exit-code") && stderr.contains("{report}"), "{stderr}");
    assert!(!ran.exists(), "nothing ran");
}

/// rspec's JSON report: of a batch of discovered examples, the failing one
/// fails alone and the others pass. Needs Debian's `ruby-rspec`.
#[test]
fn rspec_batches_read_rspec_json() {
    let version = Command::new("rspec").arg("--version").output();
    if !version.as_ref().is_ok_and(|o| o.status.success()) {
        panic!("rspec is required by this test: install Debian's ruby-rspec (apt-get install -y ruby-rspec)");
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec");
    std::fs::create_dir(&spec).unwrap();
    std::fs::write(spec.join("a_spec.rb"), "RSpec.describe 'A' do\n  it('works') { expect(1).to eq(1) }\nend\n")
        .unwrap();
    std::fs::write(
        spec.join("b_spec.rb"),
        "RSpec.describe 'B' do\n  it('works') { expect(1).to eq(1) }\n  it('breaks') { expect(1 + 1).to eq(3) }\nend\n",
    )
    .unwrap();
    let junit = dir.path().join("out.xml");
    let output = hopper(dir.path())
        .args(["run", "-j", "1", "--batch-size", "2", "--max-requeues", "0", "--no-timings", "--discover", "rspec"])
        .arg("--junit")
        .arg(&junit)
        .args(["--", "rspec"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let cases = junit_cases(&junit);
    // Discovery makes each example a unit; the failing one fails alone.
    assert_eq!(cases.len(), 3, "{cases:?}");
    assert!(is_success(&cases["./spec/a_spec.rb[1:1]"]), "{cases:?}");
    assert!(is_success(&cases["./spec/b_spec.rb[1:1]"]), "{cases:?}");
    match &cases["./spec/b_spec.rb[1:2]"] {
        TestCaseStatus::NonSuccess { message: Some(m), .. } => assert!(m.contains("expected: 3"), "{m:?}"),
        other => panic!("./spec/b_spec.rb[1:2]: {other:?}"),
    }
    assert!(stdout.contains("expected: 3"), "the example's own failure is shown: {stdout}");
}

/// The README's nextest recipe: a tool config points nextest's JUnit at
/// `{report}`, the batch's filtersets are joined into one `-E`; the failing
/// test fails alone with nextest's own time for each test.
/// A throwaway crate with tests `tests::a`, `tests::b` (fails) and `tests::c`.
fn rust_crate() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        "[package]\nname = \"batch-demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("src/lib.rs"),
        "#[cfg(test)]\nmod tests {\n    #[test]\n    fn a() {}\n    #[test]\n    fn b() {\n        assert_eq!(1 + 1, 3, \"deliberate\");\n    }\n    #[test]\n    fn c() {}\n}\n",
    )
    .unwrap();
    dir
}

#[test]
fn nextest_batches_read_nextests_junit() {
    let dir = rust_crate();
    let junit = dir.path().join("out.xml");
    let script = r#"printf '[profile.default.junit]\npath = "%s"\n' {report} > {report}.toml
cargo nextest run --tool-config-file hopper:{report}.toml --no-fail-fast -E "$(printf '(%s) | ' "$@")none()""#;
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .args(["run", "-j", "1", "--batch-size", "3", "--max-requeues", "0", "--no-timings", "--results", "junit"])
        .args(["--discover", "nextest", "--junit"])
        .arg(&junit)
        .args(["--", "sh", "-c", script, "sh", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("3 units, 2 passed (0 flaky), 1 failed"), "{stdout}");
    let cases = junit_cases(&junit);
    let failed: Vec<&String> = cases.iter().filter(|(_, s)| !is_success(s)).map(|(n, _)| n).collect();
    assert_eq!(failed, vec!["binary_id(=batch-demo) & test(=tests::b)"], "{cases:?}");
    assert!(stdout.contains("deliberate"), "nextest's failure output: {stdout}");
}

/// The README's libtest recipe: libtest's JSON lines, sent to `{report}`.
#[test]
fn cargo_test_batches_read_libtest_json() {
    let dir = rust_crate();
    let junit = dir.path().join("out.xml");
    let script = r#"cargo test -q --lib -- -Z unstable-options --format json --report-time --exact "$@" > {report}"#;
    let output = hopper(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["run", "-j", "1", "--batch-size", "3", "--max-requeues", "0", "--no-timings"])
        .args(["--results", "libtest-json", "--discover", "cargo-test", "--junit"])
        .arg(&junit)
        .args(["--", "sh", "-c", script, "sh", "{unit}"])
        .output()
        .unwrap();
    let (stdout, stderr) = texts(&output);
    assert_eq!(output.status.code(), Some(1), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("3 units, 2 passed (0 flaky), 1 failed"), "{stdout}");
    let cases = junit_cases(&junit);
    let failed: Vec<&String> = cases.iter().filter(|(_, s)| !is_success(s)).map(|(n, _)| n).collect();
    assert_eq!(failed, vec!["tests::b"], "{cases:?}");
    assert!(stdout.contains("deliberate"), "libtest's captured panic: {stdout}");
}
