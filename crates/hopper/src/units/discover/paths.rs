//! The command's own path arguments, dropped where hopper passes ids.
//!
//! `hopper run --discover pytest --per-process -- python -m pytest -q tests`
//! collects `tests`, and then each unit ran `python -m pytest -q tests ID`:
//! the whole directory plus the id, every time (110 of 110 units failed in
//! 176 s on one suite). The ids name their tests whole, so in the commands
//! that run units the tool's path arguments go (discovery keeps them), and
//! hopper says so once.

use std::path::Path;

use crate::exec::template::PLACEHOLDER;
use crate::units::DiscoverKind;

/// pytest's options that take a value as the next argument (a path among
/// them must stay).
const PYTEST_VALUE_OPTIONS: &[&str] = &[
    "-k",
    "-m",
    "-p",
    "-c",
    "-o",
    "-W",
    "-r",
    "-n",
    "--rootdir",
    "--basetemp",
    "--confcutdir",
    "--junitxml",
    "--junit-xml",
    "--deselect",
    "--ignore",
    "--ignore-glob",
    "--log-level",
    "--log-file",
    "--log-cli-level",
    "--tb",
    "--maxfail",
    "--durations",
    "--dist",
    "--cov",
    "--cov-report",
    "--override-ini",
    "--import-mode",
    "--capture",
    "--color",
    "--config-file",
    "--inifile",
];

/// RSpec's options that take a value as the next argument.
const RSPEC_VALUE_OPTIONS: &[&str] = &[
    "-r",
    "--require",
    "-I",
    "-f",
    "--format",
    "-o",
    "--out",
    "-e",
    "--example",
    "-t",
    "--tag",
    "--seed",
    "--order",
    "-P",
    "--pattern",
    "--exclude-pattern",
    "--default-path",
    "-E",
    "--example-matches",
];

/// Where the tool's own arguments start in `command`: after `pytest`
/// (`-m pytest`, `.../pytest`, `py.test`) or `rspec`.
fn tool_at(command: &[String], tool: DiscoverKind) -> Option<usize> {
    let names: &[&str] = match tool {
        DiscoverKind::Pytest => &["pytest", "py.test"],
        DiscoverKind::Rspec => &["rspec"],
        DiscoverKind::Nextest | DiscoverKind::CargoTest => return None,
    };
    command.iter().position(|a| Path::new(a).file_name().and_then(|n| n.to_str()).is_some_and(|n| names.contains(&n)))
}

/// `command` without the tool's path arguments (existing directories and
/// test files, `.py` or `.rb`, or node ids in them, relative to `cwd`), and
/// the ones dropped. Options, their values and `{unit}` are kept.
pub fn drop_paths(command: &[String], tool: DiscoverKind, cwd: &Path) -> (Vec<String>, Vec<String>) {
    let Some(at) = tool_at(command, tool) else { return (command.to_vec(), Vec::new()) };
    let (value_options, suffix) =
        if tool == DiscoverKind::Pytest { (PYTEST_VALUE_OPTIONS, ".py") } else { (RSPEC_VALUE_OPTIONS, ".rb") };
    let mut kept: Vec<String> = command[..=at].to_vec();
    let mut dropped = Vec::new();
    let mut takes_value = false;
    for arg in &command[at + 1..] {
        let value = std::mem::take(&mut takes_value);
        if arg.starts_with('-') {
            takes_value = !arg.contains('=') && value_options.contains(&arg.as_str());
            kept.push(arg.clone());
            continue;
        }
        let path = arg.split("::").next().unwrap_or(arg);
        let path = path.split(['[', ':']).next().unwrap_or(path);
        // Only what names tests (a directory, a test file): a file that is the
        // value of an option hopper does not know (`--cov-config .coveragerc`)
        // must stay where it is.
        let full = cwd.join(path);
        let names_tests = full.is_dir() || (full.is_file() && path.ends_with(suffix));
        if !value && !arg.contains(PLACEHOLDER) && !path.is_empty() && names_tests {
            dropped.push(arg.clone());
        } else {
            kept.push(arg.clone());
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_tools_paths_go_and_everything_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("tests")).unwrap();
        std::fs::write(dir.path().join("tests/test_a.py"), "").unwrap();
        let cmd = argv(&["python", "-m", "pytest", "-q", "tests", "--rootdir", "tests", "-k", "x", "{unit}"]);
        let (kept, dropped) = drop_paths(&cmd, DiscoverKind::Pytest, dir.path());
        assert_eq!(kept, argv(&["python", "-m", "pytest", "-q", "--rootdir", "tests", "-k", "x", "{unit}"]));
        assert_eq!(dropped, argv(&["tests"]));
        let (kept, dropped) =
            drop_paths(&argv(&["pytest", "tests/test_a.py::test_x", "nope"]), DiscoverKind::Pytest, dir.path());
        assert_eq!((kept, dropped), (argv(&["pytest", "nope"]), argv(&["tests/test_a.py::test_x"])));
        let (kept, dropped) = drop_paths(&argv(&["rspec", "tests", "-I", "tests"]), DiscoverKind::Rspec, dir.path());
        assert_eq!((kept, dropped), (argv(&["rspec", "-I", "tests"]), argv(&["tests"])));
        std::fs::write(dir.path().join(".coveragerc"), "").unwrap();
        let cov = argv(&["pytest", "--cov-config", ".coveragerc", "{unit}"]);
        assert_eq!(drop_paths(&cov, DiscoverKind::Pytest, dir.path()), (cov, vec![]), "not a test file");
        let cargo = argv(&["cargo", "test", "tests"]);
        assert_eq!(drop_paths(&cargo, DiscoverKind::CargoTest, dir.path()), (cargo, vec![]));
    }
}
