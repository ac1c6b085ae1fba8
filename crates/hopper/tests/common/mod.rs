//! Helpers shared by hopper's end-to-end tests, written once: the built
//! `hopper` binary in a clean environment, a suite of shell units, a
//! throwaway tool project ([`project`]), a build on a shared queue
//! ([`build`]), and waiting on processes and files.
#![allow(dead_code)]

mod build;
mod project;
pub mod timeline;

// Not every test file uses every helper.
#[allow(unused_imports)]
pub use build::Build;
#[allow(unused_imports)]
pub use project::{require_rspec, rust_lib_rs, spawn_worker, status_of, survivor_then_report, Project, RAN_LOG_VAR};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The built binary.
pub fn hopper_bin() -> &'static str {
    env!("CARGO_BIN_EXE_hopper")
}

/// What a child needs to find its programs and toolchains; nothing else of
/// the test's own environment (CI variables, HOPPER_*, the outer test
/// runner's variables) reaches hopper.
const KEPT_VARS: [&str; 5] = ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"];

/// A `hopper` command run in `dir`, in a clean environment (see [`KEPT_VARS`]).
pub fn hopper(dir: &Path) -> Command {
    let mut cmd = Command::new(hopper_bin());
    cmd.current_dir(dir).stdin(Stdio::null()).env_clear();
    for name in KEPT_VARS {
        if let Some(value) = std::env::var_os(name) {
            cmd.env(name, value);
        }
    }
    cmd
}

/// The bin dir of the venv `cargo xtask setup` makes, with pytest; panics
/// (never skips) when it is missing. Tests name its `python` explicitly, so
/// they never depend on which python3 is first on PATH.
pub fn venv_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pytest-venv/bin");
    let ok = Command::new(bin.join("python")).args(["-m", "pytest", "--version"]).output();
    assert!(
        ok.as_ref().is_ok_and(|o| o.status.success()),
        "pytest is required: {}/python -m pytest --version failed; run `cargo xtask setup`",
        bin.display()
    );
    bin
}

/// The venv's python (see [`venv_bin`]), as a command-line argument.
pub fn venv_python() -> String {
    venv_bin().join("python").display().to_string()
}

/// The pytest command hopper runs after `--`: the tests' venv, quiet, no cache.
pub fn pytest_command() -> Vec<String> {
    [venv_python().as_str(), "-m", "pytest", "-q", "-p", "no:cacheprovider"].map(String::from).to_vec()
}

/// `output`'s stdout and stderr, labelled, for an assertion's message.
pub fn shown(output: &Output) -> String {
    let (stdout, stderr) = texts(output);
    format!("stdout:\n{stdout}\nstderr:\n{stderr}")
}

/// stdout and stderr of a finished command, for assertions and messages.
pub fn texts(output: &Output) -> (String, String) {
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A suite of units (shell scripts) in a temporary directory.
pub struct Suite {
    pub dir: tempfile::TempDir,
    pub units: Vec<PathBuf>,
}

impl Suite {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("temp dir"), units: Vec::new() }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Adds a unit `name` whose body is `script` (run with `sh`).
    pub fn unit(&mut self, name: &str, script: &str) -> &mut Self {
        let path = self.dir.path().join(name);
        std::fs::write(&path, script).expect("write unit");
        self.units.push(path);
        self
    }

    /// A passing unit.
    pub fn passing(&mut self, name: &str) -> &mut Self {
        self.unit(name, &format!("echo 'ok from {name}'\nexit 0\n"))
    }

    /// A unit that always fails with a recognisable message.
    pub fn failing(&mut self, name: &str) -> &mut Self {
        self.unit(name, "echo 'assertion failed: expected 1, got 2' >&2\nexit 1\n")
    }

    /// A unit that fails on its first attempt and passes on the next (a
    /// marker file in the suite directory remembers the first attempt).
    pub fn flaky(&mut self, name: &str) -> &mut Self {
        let marker = self.dir.path().join(format!("{name}.marker"));
        self.unit(
            name,
            &format!(
                "if [ -e '{m}' ]; then echo 'passed on retry'; exit 0; fi\ntouch '{m}'\necho 'flake: first attempt fails' >&2\nexit 1\n",
                m = marker.display()
            ),
        )
    }

    /// A unit that sleeps `secs` then passes.
    pub fn slow(&mut self, name: &str, secs: f64) -> &mut Self {
        self.unit(name, &format!("sleep {secs}\necho 'slow done'\n"))
    }

    /// Writes the unit list and returns its path.
    pub fn unit_list(&self) -> PathBuf {
        let path = self.dir.path().join("units.txt");
        let text: String = self.units.iter().map(|u| format!("{}\n", u.display())).collect();
        std::fs::write(&path, text).expect("write unit list");
        path
    }

    /// The name the report uses for a unit.
    pub fn unit_name(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// The JUnit test cases of a report file by unit id (hopper's `hopper.unit`
/// property; the name for a case without one); fails the test when an id is
/// listed twice.
pub fn junit_cases(path: &Path) -> std::collections::BTreeMap<String, quick_junit::TestCaseStatus> {
    let xml = std::fs::read_to_string(path).expect("JUnit file written");
    let report = quick_junit::Report::deserialize_from_str(&xml).expect("valid JUnit XML");
    let mut cases = std::collections::BTreeMap::new();
    for case in report.test_suites.iter().flat_map(|s| s.test_cases.iter()) {
        let id = case.properties.iter().find(|p| p.name.as_str() == "hopper.unit").map(|p| p.value.to_string());
        let id = id.unwrap_or_else(|| case.name.to_string());
        assert!(cases.insert(id.clone(), case.status.clone()).is_none(), "{id:?} listed twice");
    }
    cases
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| !s.contains(") Z ")).unwrap_or(false)
}

/// Waits up to `within` for every process of `pids` to be gone; returns those still running.
pub fn still_running(pids: &[i32], within: std::time::Duration) -> Vec<i32> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if running.is_empty() || std::time::Instant::now() >= deadline {
            return running;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The pids written, one per line, into the files of `dir`.
pub fn pids_in(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(dir).expect("pid dir") {
        let text = std::fs::read_to_string(entry.expect("pid file").path()).unwrap_or_default();
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    pids
}

/// Waits up to `within` until `path` holds at least `n` lines.
pub fn wait_lines(path: &Path, n: usize, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if std::fs::read_to_string(path).map(|t| t.lines().count() >= n).unwrap_or(false) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Waits up to `within` for `done` to hold; returns whether it did.
pub fn wait_for(within: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// SIGKILLs process `pid` (gone already is fine).
pub fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// SIGKILLs the process group `pgid` (gone already is fine).
pub fn sigkill_group(pgid: i32) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
}

/// The `hopper-agents-*` plugin directories hopper left in `tmp` (a
/// worker's `TMPDIR`).
pub fn plugin_dirs(tmp: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(tmp)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("hopper-agents-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// The children of process `parent` whose command line contains `needle`.
pub fn children_named(parent: i32, needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The fields after the command name (which may hold spaces) start with state, then ppid.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

/// A JUnit case's outcome in one word: `passed`, `failed` (a failure or an
/// error) or `skipped`.
pub fn outcome(status: &quick_junit::TestCaseStatus) -> &'static str {
    match status {
        quick_junit::TestCaseStatus::Success { .. } => "passed",
        quick_junit::TestCaseStatus::NonSuccess { .. } => "failed",
        quick_junit::TestCaseStatus::Skipped { .. } => "skipped",
    }
}

/// Plain `cargo test --no-fail-fast` in `dir` (its own target directory):
/// every test's outcome (`passed`, `failed`, `skipped`) by libtest's name,
/// from its `test NAME ... ok|FAILED|ignored` lines, and the exit code.
pub fn plain_cargo_test(dir: &Path) -> (std::collections::BTreeMap<String, &'static str>, Option<i32>) {
    let output = Command::new("cargo")
        .args(["test", "--no-fail-fast"])
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .current_dir(dir)
        .output()
        .expect("cargo is required by this test");
    let (stdout, _) = texts(&output);
    let mut tests = std::collections::BTreeMap::new();
    for line in stdout.lines() {
        let Some((name, result)) = line.strip_prefix("test ").and_then(|l| l.rsplit_once(" ... ")) else { continue };
        let outcome = match result {
            "ok" => "passed",
            "FAILED" => "failed",
            r if r.starts_with("ignored") => "skipped",
            other => panic!("{other}: {stdout}"),
        };
        tests.insert(name.to_owned(), outcome);
    }
    (tests, output.status.code())
}
