//! Units started without a command template. The one launcher here runs
//! Rust tests as nextest does: the test binary that `cargo nextest list`
//! named, once per test (`BINARY --exact NAME --nocapture`), in the
//! package's directory, with the environment nextest gives a test, and never
//! cargo.

use std::path::PathBuf;

use leasehold_core::UnitId;

use crate::units::discover::nextest::NextestTests;

/// One invocation: program and arguments, extra environment, working directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Invocation {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Working directory (the worker's own when `None`).
    pub cwd: Option<PathBuf>,
}

/// Makes the invocation that runs some units.
pub trait Launcher: Send + Sync {
    /// The invocation for `units` (a batch of one is one unit).
    fn invocation(&self, units: &[UnitId]) -> Invocation;
}

/// Runs nextest-listed tests by their binaries.
#[derive(Debug, Clone)]
pub struct NextestLauncher {
    tests: NextestTests,
    run_id: String,
    library_path: String,
}

impl NextestLauncher {
    /// A launcher for the listed `tests`; `run_id` becomes `NEXTEST_RUN_ID`.
    pub fn new(tests: NextestTests, run_id: &str) -> Self {
        let mut paths: Vec<PathBuf> = tests.library_path.clone();
        if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH") {
            paths.extend(std::env::split_paths(&existing));
        }
        let library_path = std::env::join_paths(paths).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        Self { tests, run_id: run_id.to_owned(), library_path }
    }
}

impl Launcher for NextestLauncher {
    fn invocation(&self, units: &[UnitId]) -> Invocation {
        // Each unit is its own process (the launcher is used with batches of one).
        let Some(test) = units.first().and_then(|u| self.tests.tests.get(u)) else {
            let names = units.iter().map(UnitId::as_str).collect::<Vec<_>>().join(", ");
            return Invocation {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo \"$1 is not a test nextest listed\" >&2; exit 1".into(),
                    "sh".into(),
                    names,
                ],
                ..Invocation::default()
            };
        };
        let mut env = vec![
            ("NEXTEST".to_owned(), "1".to_owned()),
            ("NEXTEST_RUN_ID".to_owned(), self.run_id.clone()),
            ("NEXTEST_EXECUTION_MODE".to_owned(), "process-per-test".to_owned()),
            ("NEXTEST_BINARY_ID".to_owned(), test.binary_id.clone()),
            ("NEXTEST_TEST_NAME".to_owned(), test.name.clone()),
            ("NEXTEST_PROFILE".to_owned(), "default".to_owned()),
            ("NEXTEST_RUN_MODE".to_owned(), "test".to_owned()),
            ("NEXTEST_LD_LIBRARY_PATH".to_owned(), self.library_path.clone()),
            ("LD_LIBRARY_PATH".to_owned(), self.library_path.clone()),
            ("CARGO_MANIFEST_DIR".to_owned(), test.cwd.display().to_string()),
            ("CARGO_PKG_NAME".to_owned(), test.package_name.clone()),
        ];
        if let Some(version) = &test.package_version {
            env.push(("CARGO_PKG_VERSION".to_owned(), version.clone()));
        }
        Invocation {
            argv: vec![
                test.binary_path.display().to_string(),
                "--exact".into(),
                test.name.clone(),
                "--nocapture".into(),
            ],
            env,
            cwd: Some(test.cwd.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::discover::nextest::NextestTest;

    #[test]
    fn a_test_runs_from_its_binary_in_its_package() {
        let unit = UnitId::new("binary_id(=c) & test(=t::a)").unwrap();
        let mut tests = NextestTests { library_path: vec!["/t/debug".into()], ..NextestTests::default() };
        tests.tests.insert(
            unit.clone(),
            NextestTest {
                binary_id: "c".into(),
                binary_path: "/t/debug/deps/c-1".into(),
                name: "t::a".into(),
                cwd: "/src/c".into(),
                package_name: "c".into(),
                package_version: Some("1.0.0".into()),
            },
        );
        let launcher = NextestLauncher::new(tests, "run-1");
        let inv = launcher.invocation(std::slice::from_ref(&unit));
        assert_eq!(inv.argv, ["/t/debug/deps/c-1", "--exact", "t::a", "--nocapture"]);
        assert_eq!(inv.cwd, Some(PathBuf::from("/src/c")));
        let env: std::collections::HashMap<_, _> = inv.env.into_iter().collect();
        assert_eq!(env["NEXTEST_EXECUTION_MODE"], "process-per-test");
        assert_eq!(env["CARGO_MANIFEST_DIR"], "/src/c");
        assert!(env["LD_LIBRARY_PATH"].starts_with("/t/debug"));
        let unknown = launcher.invocation(&[UnitId::new("nope").unwrap()]);
        assert_eq!(unknown.argv[0], "sh");
    }
}
