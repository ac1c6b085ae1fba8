//! A throwaway project for the tool tests (pytest, rspec, nextest, cargo
//! test): its files in a temporary directory, the log its tests append to,
//! and `hopper` started in it as a user would start it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use quick_junit::TestCaseStatus;

use super::{hopper, venv_bin};

/// The variable naming the file every throwaway test appends a line to when
/// it runs (so a test can check what ran, and how often).
pub const RAN_LOG_VAR: &str = "RAN_LOG";

/// A throwaway Rust crate's `src/lib.rs`: `tests` (the items of its
/// `#[cfg(test)] mod tests`) after `//! doc` and a `ran(name)` helper
/// that appends `name` to the file [`RAN_LOG_VAR`] names.
pub fn rust_lib_rs(doc: &str, tests: &str) -> String {
    format!(
        r#"//! {doc}

#[cfg(test)]
mod tests {{
    use std::io::Write;

    fn ran(name: &str) {{
        let log = std::env::var("{RAN_LOG_VAR}").expect("{RAN_LOG_VAR} is set");
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open the log");
        // One write per line: `writeln!` on a File is two writes, which
        // two test processes appending at once can interleave.
        file.write_all(format!("{{name}}\n").as_bytes()).expect("append to the log");
    }}
{tests}}}
"#
    )
}

/// A temporary directory holding a throwaway suite.
pub struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    /// A project with `files` (`(path, text)`, parents created).
    pub fn new(files: &[(impl AsRef<Path>, impl AsRef<str>)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("create dirs");
            std::fs::write(&path, text.as_ref()).expect("write a project file");
        }
        Self { dir }
    }

    /// The project's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the runs write their JUnit XML.
    pub fn junit(&self) -> PathBuf {
        self.path().join("out.xml")
    }

    /// The log the throwaway tests append to (see [`RAN_LOG_VAR`]).
    pub fn ran_log(&self) -> PathBuf {
        self.path().join("ran.log")
    }

    /// The `TMPDIR` of the worker `name`.
    pub fn tmp(&self, name: &str) -> PathBuf {
        let tmp = self.path().join(format!("tmp-{name}"));
        std::fs::create_dir_all(&tmp).expect("a worker's TMPDIR");
        tmp
    }

    /// `hopper` in the project, in a clean environment, with the ran log, the
    /// project's own cargo target directory, offline (the inner tools behave
    /// as they would for a user, and do not see the outer test runner).
    pub fn hopper(&self) -> Command {
        let mut cmd = hopper(self.path());
        cmd.env(RAN_LOG_VAR, self.ran_log())
            .env("CARGO_TARGET_DIR", self.path().join("target"))
            .env("CARGO_NET_OFFLINE", "true");
        cmd
    }

    /// [`Self::hopper`] with the venv first on PATH (so `python` is the
    /// venv's, as a user with an activated venv has it).
    pub fn hopper_in_venv(&self) -> Command {
        let mut cmd = self.hopper();
        let path = format!("{}:{}", venv_bin().display(), std::env::var("PATH").unwrap_or_default());
        cmd.env("PATH", path);
        cmd
    }

    /// [`Self::hopper_in_venv`] for the worker `name`, with its own `TMPDIR`.
    pub fn worker(&self, name: &str) -> Command {
        let mut cmd = self.hopper_in_venv();
        cmd.env("TMPDIR", self.tmp(name));
        cmd
    }

    /// The lines of the ran log, in the order they were written.
    pub fn ran_lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.ran_log()).unwrap_or_default();
        text.lines().map(str::to_owned).collect()
    }

    /// How often each line of the ran log was written (each test's name: how
    /// often it ran).
    pub fn ran(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for line in self.ran_lines() {
            *counts.entry(line).or_insert(0) += 1;
        }
        counts
    }
}

/// One worker of a shared build: `hopper run --worker NAME --no-timings`
/// with the queue options `shared` and the rest of the command line `args`,
/// its output piped.
pub fn spawn_worker(project: &Project, shared: &[&str], name: &str, args: &[&str]) -> Child {
    project
        .worker(name)
        .args(["run", "--worker", name, "--no-timings"])
        .args(shared)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a worker")
}

/// Waits for the `survivor` of a kill test to finish the build (it must
/// exit 0), then runs `hopper report` on the build `shared` names with the
/// JUnit at [`Project::junit`] (it must exit 0); the report's stdout.
pub fn survivor_then_report(project: &Project, survivor: Child, shared: &[&str]) -> String {
    let output = survivor.wait_with_output().expect("the survivor ends");
    let (stdout, stderr) = super::texts(&output);
    assert_eq!(output.status.code(), Some(0), "survivor\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let report = project
        .worker("report")
        .arg("report")
        .args(shared)
        .args(["--junit", "out.xml", "--worker-timeout", "10"])
        .output()
        .expect("report");
    let (stdout, stderr) = super::texts(&report);
    assert_eq!(report.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

/// The JUnit status of the test case `name` (fails the test, naming the
/// cases there are, when it is missing).
pub fn status_of<'a>(cases: &'a BTreeMap<String, TestCaseStatus>, name: &str) -> &'a TestCaseStatus {
    cases.get(name).unwrap_or_else(|| panic!("{name} in the JUnit: {:?}", cases.keys().collect::<Vec<_>>()))
}

/// Fails the test (never skips it) when `rspec` is not installed.
pub fn require_rspec() {
    let ok = Command::new("rspec").arg("--version").output();
    assert!(
        ok.as_ref().is_ok_and(|o| o.status.success()),
        "rspec is required by this test: install Debian's ruby-rspec (cargo xtask setup does)"
    );
}
