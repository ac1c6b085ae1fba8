//! End-to-end tests of `hopper run --discover` in memory mode against the real
//! tools: cargo's test harness, cargo-nextest and pytest list a throwaway
//! suite, hopper runs every listed unit by handing its name straight back to
//! the tool, and the verdict, exit code and JUnit XML match the suite.
//!
//! Every test in a throwaway suite appends its name to the file named by
//! `RAN_LOG` when it runs, so the tests can check that each unit ran
//! exactly its own test, once.
//!
//! A missing tool fails these tests (with what to install); it never skips them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{junit_cases, rust_lib_rs, texts, venv_python, Project};
use quick_junit::TestCaseStatus;

/// A throwaway cargo package: a lib with two passing tests and one failing test.
const CARGO_TOML: &str = r#"[package]
name = "discover-demo"
version = "0.1.0"
edition = "2021"

# Not part of any workspace above the temporary directory.
[workspace]
"#;

/// The items of its `mod tests`.
const TESTS: &str = r#"
    #[test]
    fn passes() {
        ran("passes");
    }

    #[test]
    fn passes_too() {
        ran("passes_too");
        assert_eq!(1 + 1, 2);
    }

    #[test]
    fn fails() {
        ran("fails");
        assert_eq!(1 + 1, 3, "deliberate failure");
    }
"#;

/// A throwaway pytest file: two passing tests and one failing test.
const TEST_SAMPLE_PY: &str = r#"import os


def ran(name):
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(name + "\n")


def test_adds():
    ran("test_adds")
    assert 1 + 1 == 2


def test_adds_too():
    ran("test_adds_too")
    assert 2 + 2 == 4


def test_fails():
    ran("test_fails")
    assert 1 + 1 == 3, "deliberate failure"
"#;

/// The throwaway cargo project.
fn cargo_project() -> Project {
    Project::new(&[
        ("Cargo.toml", CARGO_TOML.to_owned()),
        ("src/lib.rs", rust_lib_rs("A throwaway suite for hopper's discovery tests.", TESTS)),
    ])
}

/// Runs `hopper run --discover KIND -- COMMAND` on two slots, no retries.
fn run_discover(project: &Project, kind: &str, command: &[&str]) -> Output {
    run_discover_with(project, project.hopper(), kind, command)
}

fn run_discover_with(project: &Project, mut cmd: Command, kind: &str, command: &[&str]) -> Output {
    // Options before the command (those starting with `--` up to the program).
    let options = command.iter().take_while(|a| a.starts_with("--")).count();
    cmd.args(["run", "-j", "2", "--max-requeues", "0", "--discover", kind, "--junit"])
        .arg(project.junit())
        .args(&command[..options])
        .arg("--")
        .args(&command[options..])
        .output()
        .expect("run hopper")
}

/// The names the throwaway tests logged, sorted.
fn ran(project: &Project) -> Vec<String> {
    let mut names = project.ran_lines();
    names.sort();
    names
}

/// Every path under the project (for "nothing was written" checks).
fn tree(project: &Project) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            }
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk(project.path(), &mut out);
    out.sort();
    out
}

/// Checks a run of a suite with passing units `passed` and the one failing
/// unit `failed` (which exits with `failed_exit`): every listed test became a
/// unit, each ran exactly its own test once, and the exit code, the printed
/// verdict and the JUnit XML agree.
/// `failure` starts the failed unit's message: the exit code where the
/// command's exit code is the verdict, the tool's own message where hopper
/// reads the tool's report (pytest per process) or output (a Rust test's
/// panic message).
fn assert_verdict(project: &Project, output: &Output, passed: &[&str], failed: &str, failure: &str) {
    let (stdout, stderr) = texts(output);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(1), "a failing unit fails the build\n{context}");
    let total = passed.len() + 1;
    let verdict = format!("FAILED: {total} units, {} passed (0 flaky), 1 failed, 0 unfinished", passed.len());
    assert!(stdout.contains(&verdict), "{verdict:?} in the report\n{context}");
    assert!(stdout.contains(&format!("FAIL {failed} ({failure}")), "{failed} failed\n{context}");
    assert!(stdout.contains("deliberate failure"), "the failing test's output is shown\n{context}");

    let cases = junit_cases(&project.junit());
    let mut expected: Vec<&str> = passed.iter().copied().chain([failed]).collect();
    expected.sort();
    assert_eq!(cases.keys().map(String::as_str).collect::<Vec<_>>(), expected, "one unit per test\n{context}");
    for name in passed {
        assert!(
            matches!(&cases[*name], TestCaseStatus::Success { flaky_runs } if flaky_runs.is_empty()),
            "{name} passed: {:?}\n{context}",
            cases[*name]
        );
    }
    match &cases[failed] {
        TestCaseStatus::NonSuccess { message, description, .. } => {
            assert!(message.as_ref().is_some_and(|m| m.starts_with(failure.trim_end_matches(';'))), "{message:?}");
            assert!(
                description.as_ref().is_some_and(|d| d.as_str().contains("deliberate failure")),
                "the failure's output is kept: {description:?}"
            );
        }
        other => panic!("{failed} should be a failure: {other:?}\n{context}"),
    }
}

fn require_nextest() {
    let version = Command::new("cargo").args(["nextest", "--version"]).output();
    match version {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "cargo-nextest is required by this test and `cargo nextest --version` failed ({}): {}\n\
             install it: cargo install cargo-nextest --locked",
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("no output")
        ),
        Err(error) => panic!("cannot run `cargo nextest --version` ({error}): is cargo on PATH?"),
    }
}

#[test]
fn cargo_test_discovery_runs_each_test_by_its_name() {
    let project = cargo_project();
    let output = run_discover(&project, "cargo-test", &["cargo", "test", "-q", "--lib", "--", "--exact", "{unit}"]);
    assert_verdict(
        &project,
        &output,
        &["tests::passes", "tests::passes_too"],
        "tests::fails",
        "assertion `left == right` failed: deliberate failure",
    );
    // `--list` runs nothing; each unit ran its one test (`tests::passes` did
    // not also run `tests::passes_too`).
    assert_eq!(ran(&project), vec!["fails", "passes", "passes_too"]);
}

#[test]
fn nextest_discovery_runs_each_test_by_its_filterset() {
    require_nextest();
    let project = cargo_project();
    let output = run_discover(&project, "nextest", &["cargo", "nextest", "run", "-E", "{unit}"]);
    assert_verdict(
        &project,
        &output,
        &["binary_id(=discover-demo) & test(=tests::passes)", "binary_id(=discover-demo) & test(=tests::passes_too)"],
        "binary_id(=discover-demo) & test(=tests::fails)",
        // The test's panic, then the exit code.
        "assertion `left == right` failed: deliberate failure (exit code 100);",
    );
    assert_eq!(ran(&project), vec!["fails", "passes", "passes_too"]);
}

#[test]
fn pytest_discovery_runs_each_node_id() {
    let python = venv_python();
    let project = Project::new(&[("test_sample.py", TEST_SAMPLE_PY)]);
    let output = run_discover(&project, "pytest", &["--per-process", &python, "-m", "pytest", "-q", "{unit}"]);
    assert_verdict(
        &project,
        &output,
        &["test_sample.py::test_adds", "test_sample.py::test_adds_too"],
        "test_sample.py::test_fails",
        "AssertionError: deliberate failure",
    );
    assert_eq!(ran(&project), vec!["test_adds", "test_adds_too", "test_fails"]);
}

/// pip may install the `pytest` script outside PATH: discovery then lists the
/// tests with `python3 -m pytest`.
#[test]
fn pytest_discovery_falls_back_to_the_module_without_a_pytest_program() {
    let python = venv_python();
    let project = Project::new(&[("test_sample.py", TEST_SAMPLE_PY)]);
    // A PATH holding only a python3 that is the venv's interpreter.
    let bin = project.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    write_script(&bin.join("python3"), &format!("#!/bin/sh\nexec '{python}' \"$@\"\n"));
    let mut cmd = project.hopper();
    cmd.env("PATH", &bin);
    let output =
        run_discover_with(&project, cmd, "pytest", &["--per-process", "python3", "-m", "pytest", "-q", "{unit}"]);
    assert_verdict(
        &project,
        &output,
        &["test_sample.py::test_adds", "test_sample.py::test_adds_too"],
        "test_sample.py::test_fails",
        "AssertionError: deliberate failure",
    );
}

/// A discovery error is one line on stderr with exit code 2, and nothing is
/// written: no units run, no JUnit file, no timings.
fn assert_discover_error(project: &Project, output: &Output, before: &[PathBuf], needles: &[&str]) {
    let (stdout, stderr) = texts(output);
    assert_eq!(output.status.code(), Some(2), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let line = stderr.trim_end();
    assert!(!line.is_empty() && !line.contains('\n'), "one line: {stderr:?}");
    assert!(line.starts_with("hopper: error:"), "{stderr:?}");
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} in {stderr:?}");
    }
    assert_eq!(tree(project), before, "nothing written");
    assert!(ran(project).is_empty(), "no unit ran");
}

#[test]
fn a_bad_discover_kind_or_a_failing_discovery_is_a_one_line_error_and_writes_nothing() {
    let project = Project::new(&[("test_sample.py", TEST_SAMPLE_PY)]);
    let before = tree(&project);

    let output = run_discover(&project, "jest", &["sh", "-c", "echo {unit} >> ran.log"]);
    assert_discover_error(
        &project,
        &output,
        &before,
        &["unknown discover kind \"jest\"", "nextest, cargo-test, pytest, rspec"],
    );

    // No Cargo.toml here (nor above the temporary directory): `cargo test --list` fails.
    let output = run_discover(&project, "cargo-test", &["sh", "-c", "echo {unit} >> ran.log"]);
    assert_discover_error(
        &project,
        &output,
        &before,
        &["discovery with `cargo test -- --list` failed", "could not find `Cargo.toml`"],
    );
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Parametrized ids with spaces, brackets, quotes and unicode.
const TEST_PARAMS_PY: &str = r#"import os
import pytest


def ran(name):
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(name + "\n")


@pytest.mark.parametrize("value", ["extra === '1.0'", "a]b", "x [y]", "caf\u00e9 \"q\"", "plain"])
def test_param(value):
    ran(value)
"#;

#[test]
fn parametrized_ids_with_spaces_and_brackets_are_each_one_unit() {
    let python = venv_python();
    let project = Project::new(&[("test_params.py", TEST_PARAMS_PY)]);
    for mode in [&["--per-process"][..], &[][..]] {
        let _ = std::fs::remove_file(project.ran_log());
        let mut command: Vec<&str> = mode.to_vec();
        command.extend([python.as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"]);
        let output = run_discover(&project, "pytest", &command);
        let (stdout, stderr) = texts(&output);
        assert_eq!(output.status.code(), Some(0), "{mode:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stdout.contains("PASSED: 5 units, 5 passed"), "{stdout}");
        let cases = junit_cases(&project.junit());
        let names: Vec<&str> = cases.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "test_params.py::test_param[a]b]",
                "test_params.py::test_param[caf\\xe9 \"q\"]",
                "test_params.py::test_param[extra === '1.0']",
                "test_params.py::test_param[plain]",
                "test_params.py::test_param[x [y]]",
            ],
            "{mode:?}"
        );
        let mut expected = vec!["a]b", "café \"q\"", "extra === '1.0'", "plain", "x [y]"];
        expected.sort();
        assert_eq!(ran(&project), expected, "{mode:?}: each test ran once");
    }
}

#[test]
fn a_count_mismatch_is_refused_and_nothing_runs() {
    let python = venv_python();
    let project = Project::new(&[("test_sample.py", TEST_SAMPLE_PY)]);
    let before = tree(&project);
    // pytest counts the file's tests twice; the ids repeat, so units would be lost.
    // (Python's own bytecode cache is not hopper writing.)
    let mut cmd = project.hopper();
    cmd.env("PYTHONDONTWRITEBYTECODE", "1");
    let output = run_discover_with(
        &project,
        cmd,
        "pytest",
        &[
            &python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--keep-duplicates",
            "test_sample.py",
            "test_sample.py",
        ],
    );
    assert_discover_error(
        &project,
        &output,
        &before,
        &["would lose tests", "the tool counted 6, hopper has 3", "listed more than once", "test_sample.py::test_adds"],
    );
}

#[test]
fn pytest_discovery_collects_with_the_users_own_interpreter() {
    let python = venv_python();
    let project = Project::new(&[("test_sample.py", TEST_SAMPLE_PY)]);
    // Every other python and pytest on PATH is a trap.
    let bin = project.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for trap in ["python", "python3", "pytest"] {
        write_script(&bin.join(trap), "#!/bin/sh\necho 'the wrong interpreter ran' >&2\nexit 3\n");
    }
    let mut cmd = project.hopper();
    cmd.env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()));
    let output =
        run_discover_with(&project, cmd, "pytest", &["--per-process", &python, "-m", "pytest", "-q", "{unit}"]);
    let (stdout, stderr) = texts(&output);
    assert!(!stderr.contains("wrong interpreter"), "{stderr}");
    assert!(stdout.contains("FAILED: 3 units, 2 passed (0 flaky), 1 failed"), "stdout:\n{stdout}\nstderr:\n{stderr}");
}
