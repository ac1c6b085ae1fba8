//! Where units come from: a file list, glob patterns, or a discovery command
//! (the test tool itself lists its tests).
//!
//! Every source is read completely and checked before anything is written to
//! the queue, so bad input never leaves a half-made run behind.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use leasehold_core::{UnitId, UnitSpec};

use crate::errors::{ListingError, UnitsError};

/// A program and its arguments.
pub type ListCommand = (&'static str, &'static [&'static str]);

/// A tool that can list its own tests.
///
/// Every unit name can be handed straight back to the tool to run exactly
/// that unit (see each kind for the command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoverKind {
    /// `cargo nextest list --message-format json`; one unit per test, named
    /// by the nextest filterset that selects exactly it,
    /// `binary_id(=<binary-id>) & test(=<test name>)`: run one with
    /// `cargo nextest run -E {unit}`.
    Nextest,
    /// `cargo test -- --list --format terse`; one unit per test name: run one
    /// with `cargo test -- --exact {unit}`.
    CargoTest,
    /// `pytest --collect-only -q` (or `python3 -m pytest` when no `pytest`
    /// program is installed); one unit per node id: run one with
    /// `pytest {unit}`.
    Pytest,
    /// `rspec --dry-run --format json`; one unit per spec file.
    Rspec,
}

impl DiscoverKind {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoverKind::Nextest => "nextest",
            DiscoverKind::CargoTest => "cargo-test",
            DiscoverKind::Pytest => "pytest",
            DiscoverKind::Rspec => "rspec",
        }
    }

    /// The commands (program, arguments) that list the tests, in order of
    /// preference: a later one is tried only when the program of the one
    /// before is not installed.
    pub fn commands(self) -> &'static [ListCommand] {
        match self {
            DiscoverKind::Nextest => &[("cargo", &["nextest", "list", "--message-format", "json"])],
            DiscoverKind::CargoTest => &[("cargo", &["test", "--quiet", "--", "--list", "--format", "terse"])],
            // pip may put the `pytest` script outside PATH; the module always works.
            DiscoverKind::Pytest => {
                &[("pytest", &["--collect-only", "-q"]), ("python3", &["-m", "pytest", "--collect-only", "-q"])]
            }
            DiscoverKind::Rspec => &[("rspec", &["--dry-run", "--format", "json"])],
        }
    }

    /// The kind label stored with each unit.
    pub fn unit_kind(self) -> &'static str {
        match self {
            DiscoverKind::Rspec => "file",
            _ => "test",
        }
    }

    /// Parses the tool's listing into unit names (in the tool's order).
    pub fn parse(self, stdout: &str) -> Result<Vec<String>, ListingError> {
        match self {
            DiscoverKind::Nextest => parse_nextest(stdout),
            DiscoverKind::CargoTest => Ok(parse_cargo_test(stdout)),
            DiscoverKind::Pytest => Ok(parse_pytest(stdout)),
            DiscoverKind::Rspec => parse_rspec(stdout),
        }
    }
}

impl fmt::Display for DiscoverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DiscoverKind {
    type Err = UnitsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nextest" => Ok(DiscoverKind::Nextest),
            "cargo-test" => Ok(DiscoverKind::CargoTest),
            "pytest" => Ok(DiscoverKind::Pytest),
            "rspec" => Ok(DiscoverKind::Rspec),
            other => Err(UnitsError::UnknownDiscoverKind { kind: other.to_owned() }),
        }
    }
}

/// Where to take the units from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitSource {
    /// One unit per line (blank lines and `#` comments skipped); `-` is stdin.
    File(PathBuf),
    /// Paths matching any of these glob patterns, sorted, each once.
    Globs(Vec<String>),
    /// The test tool's own listing.
    Discover(DiscoverKind),
}

impl UnitSource {
    /// A short description for messages.
    pub fn describe(&self) -> String {
        match self {
            UnitSource::File(path) => format!("unit list {}", path.display()),
            UnitSource::Globs(patterns) => format!("glob {}", patterns.join(" ")),
            UnitSource::Discover(kind) => format!("--discover {kind}"),
        }
    }
}

fn make_units(names: Vec<String>, kind: &str, source_name: &str, dedupe: bool) -> Result<Vec<UnitSpec>, UnitsError> {
    let mut seen = HashSet::new();
    let mut units = Vec::with_capacity(names.len());
    for name in names {
        if dedupe && !seen.insert(name.clone()) {
            continue;
        }
        let id = UnitId::new(&name).map_err(|error| UnitsError::BadUnit {
            source_name: source_name.to_owned(),
            value: crate::errors::cut(&name.escape_debug().to_string(), crate::errors::NAME_SHOWN),
            error,
        })?;
        units.push(UnitSpec::new(id, kind));
    }
    if units.is_empty() {
        return Err(UnitsError::Empty { source_name: source_name.to_owned() });
    }
    Ok(units)
}

/// Parses a unit list: one unit per line, trimmed; blank lines and lines
/// starting with `#` are skipped.
pub fn parse_unit_list(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect()
}

/// Expands glob patterns into sorted, de-duplicated paths (files only).
pub fn expand_globs(patterns: &[String]) -> Result<Vec<String>, UnitsError> {
    let mut paths = Vec::new();
    for pattern in patterns {
        let entries = glob::glob(pattern).map_err(|source| UnitsError::BadGlob { pattern: pattern.clone(), source })?;
        for entry in entries {
            let path = entry.map_err(|source| UnitsError::GlobWalk { pattern: pattern.clone(), source })?;
            if path.is_dir() {
                continue;
            }
            paths.push(path.to_string_lossy().into_owned());
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Reads the units of a source. Errors on an empty result.
pub async fn collect_units(source: &UnitSource) -> Result<Vec<UnitSpec>, UnitsError> {
    let source_name = source.describe();
    match source {
        UnitSource::File(path) => {
            let text = read_list(path).await?;
            make_units(parse_unit_list(&text), "file", &source_name, false)
        }
        UnitSource::Globs(patterns) => make_units(expand_globs(patterns)?, "file", &source_name, true),
        UnitSource::Discover(kind) => {
            let names = discover(*kind).await?;
            make_units(names, kind.unit_kind(), &source_name, true)
        }
    }
}

async fn read_list(path: &Path) -> Result<String, UnitsError> {
    if path == Path::new("-") {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        tokio::io::stdin()
            .read_to_string(&mut text)
            .await
            .map_err(|source| UnitsError::ReadFile { path: path.to_owned(), source })?;
        return Ok(text);
    }
    tokio::fs::read_to_string(path).await.map_err(|source| UnitsError::ReadFile { path: path.to_owned(), source })
}

/// Runs the tool's listing command in the current directory and parses it.
pub async fn discover(kind: DiscoverKind) -> Result<Vec<String>, UnitsError> {
    let (command, output) = run_first_installed(kind.commands()).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    // pytest exits 5 when it collected nothing: that is an empty list, not a failure.
    let empty_pytest = kind == DiscoverKind::Pytest && output.status.code() == Some(5);
    if !output.status.success() && !empty_pytest {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let detail = stderr
            .lines()
            .chain(stdout.lines())
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no output")
            .to_owned();
        return Err(UnitsError::DiscoverFailed { command, status: output.status.to_string(), detail });
    }
    kind.parse(&stdout).map_err(|source| UnitsError::DiscoverParse { command, source })
}

/// Exit status of a shell or a version-manager shim (pyenv, asdf) whose
/// program does not exist.
const NOT_FOUND_STATUS: i32 = 127;

/// Runs the first of `candidates` whose program is installed (the last one is
/// run, and its failure reported, whatever happens); returns its command line
/// and output.
async fn run_first_installed(candidates: &[ListCommand]) -> Result<(String, std::process::Output), UnitsError> {
    let Some((last, earlier)) = candidates.split_last() else {
        return Err(UnitsError::DiscoverSpawn {
            command: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no listing command"),
        });
    };
    for candidate in earlier {
        let (command, result) = run_listing(candidate).await;
        match result {
            Ok(output) if output.status.code() == Some(NOT_FOUND_STATUS) => {
                tracing::debug!(%command, "not installed (exit 127); trying the next command");
            }
            Ok(output) => return Ok((command, output)),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(%command, "not installed; trying the next command");
            }
            Err(source) => return Err(UnitsError::DiscoverSpawn { command, source }),
        }
    }
    let (command, result) = run_listing(last).await;
    match result {
        Ok(output) => Ok((command, output)),
        Err(source) => Err(UnitsError::DiscoverSpawn { command, source }),
    }
}

async fn run_listing((program, args): &ListCommand) -> (String, std::io::Result<std::process::Output>) {
    let command = format!("{program} {}", args.join(" "));
    tracing::debug!(%command, "discovering units");
    let result = tokio::process::Command::new(program).args(*args).stdin(std::process::Stdio::null()).output().await;
    (command, result)
}

/// The nextest filterset that selects exactly one test: `binary_id(=ID) &
/// test(=NAME)`, with the characters the matchers treat specially escaped.
pub fn nextest_filterset(binary_id: &str, test_name: &str) -> String {
    fn escape(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            match c {
                '\\' | ')' | ',' => {
                    out.push('\\');
                    out.push(c);
                }
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c => out.push(c),
            }
        }
        out
    }
    format!("binary_id(={}) & test(={})", escape(binary_id), escape(test_name))
}

/// The JSON object a tool printed (after any lines before it).
fn listing_json(stdout: &str) -> Result<serde_json::Value, ListingError> {
    let start = stdout.find('{').ok_or(ListingError::NoJson)?;
    Ok(serde_json::from_str(stdout[start..].trim())?)
}

fn parse_nextest(stdout: &str) -> Result<Vec<String>, ListingError> {
    let value = listing_json(stdout)?;
    let suites = value.get("rust-suites").and_then(|s| s.as_object()).ok_or(ListingError::Shape(
        "no \"rust-suites\" object (is this `cargo nextest list --message-format json` output?)",
    ))?;
    let mut names = Vec::new();
    for (binary_id, suite) in suites {
        let Some(cases) = suite.get("testcases").and_then(|c| c.as_object()) else {
            continue;
        };
        for (name, case) in cases {
            let ignored = case.get("ignored").and_then(|v| v.as_bool()).unwrap_or(false);
            let matches = case
                .get("filter-match")
                .and_then(|m| m.get("status"))
                .and_then(|s| s.as_str())
                .is_none_or(|s| s == "matches");
            if !ignored && matches {
                names.push(nextest_filterset(binary_id, name));
            }
        }
    }
    Ok(names)
}

fn parse_cargo_test(stdout: &str) -> Vec<String> {
    stdout.lines().filter_map(|line| line.trim().strip_suffix(": test")).map(str::to_owned).collect()
}

fn parse_pytest(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.contains("::") && !l.contains(' '))
        .map(str::to_owned)
        .collect()
}

fn parse_rspec(stdout: &str) -> Result<Vec<String>, ListingError> {
    let value = listing_json(stdout)?;
    let examples =
        value.get("examples").and_then(|e| e.as_array()).ok_or(ListingError::Shape("no \"examples\" array"))?;
    Ok(examples
        .iter()
        .filter_map(|e| e.get("file_path").and_then(|p| p.as_str()))
        .map(|p| p.strip_prefix("./").unwrap_or(p).to_owned())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_lists_skip_blanks_and_comments() {
        assert_eq!(parse_unit_list("a\n\n  # no\n b \r\nc d\n"), vec!["a", "b", "c d"]);
    }

    #[test]
    fn unknown_discover_kind_is_a_clear_error() {
        let err = "jest".parse::<DiscoverKind>().unwrap_err().to_string();
        assert!(err.contains("jest") && err.contains("nextest, cargo-test, pytest"), "{err}");
        assert_eq!("cargo-test".parse::<DiscoverKind>().unwrap(), DiscoverKind::CargoTest);
    }

    #[test]
    fn parses_nextest_listing() {
        let json = r#"{"rust-build-meta":{},"test-count":3,"rust-suites":{
            "core::lib":{"testcases":{
                "a::works":{"ignored":false,"filter-match":{"status":"matches"}},
                "a::slow":{"ignored":true,"filter-match":{"status":"matches"}},
                "a::other":{"ignored":false,"filter-match":{"status":"mismatch","reason":"expression"}}}},
            "core::it":{"testcases":{"b":{"ignored":false,"filter-match":{"status":"matches"}}}}}}"#;
        let mut names = DiscoverKind::Nextest.parse(json).unwrap();
        names.sort();
        assert_eq!(names, vec!["binary_id(=core::it) & test(=b)", "binary_id(=core::lib) & test(=a::works)"]);
        assert!(DiscoverKind::Nextest.parse("{}").is_err());
    }

    #[test]
    fn nextest_filtersets_escape_the_matcher_syntax() {
        assert_eq!(nextest_filterset("my-crate::bin/tool", "t::x"), "binary_id(=my-crate::bin/tool) & test(=t::x)");
        assert_eq!(nextest_filterset("c", "case(a, b)\\z\tq"), "binary_id(=c) & test(=case(a\\, b\\)\\\\z\\tq)");
    }

    #[tokio::test]
    async fn discovery_falls_back_when_a_program_is_not_installed() {
        const MISSING: ListCommand = ("hopper-test-no-such-program", &["--collect-only"]);
        const SHIM_MISSING: ListCommand = ("sh", &["-c", "echo 'shim: command not found' >&2; exit 127"]);
        const WORKS: ListCommand = ("sh", &["-c", "echo listed"]);
        let (command, output) = run_first_installed(&[MISSING, SHIM_MISSING, WORKS]).await.unwrap();
        assert_eq!(command, "sh -c echo listed");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "listed\n");

        // A program that runs and fails is the answer: no fallback.
        const FAILS: ListCommand = ("sh", &["-c", "exit 3"]);
        let (_, output) = run_first_installed(&[FAILS, WORKS]).await.unwrap();
        assert_eq!(output.status.code(), Some(3));

        // The last candidate's failure to start is reported.
        let err = run_first_installed(&[SHIM_MISSING, MISSING]).await.unwrap_err();
        assert!(matches!(err, UnitsError::DiscoverSpawn { .. }), "{err}");
        assert!(err.to_string().contains("hopper-test-no-such-program --collect-only"), "{err}");
    }

    #[test]
    fn pytest_discovery_falls_back_to_the_python_module() {
        let programs: Vec<_> = DiscoverKind::Pytest.commands().iter().map(|(p, a)| (*p, a.first().copied())).collect();
        assert_eq!(programs, vec![("pytest", Some("--collect-only")), ("python3", Some("-m"))]);
    }

    #[test]
    fn parses_cargo_test_listing() {
        let out = "tests::a: test\ntests::b: test\nbench_x: benchmark\n\n2 tests, 1 benchmark\n";
        assert_eq!(DiscoverKind::CargoTest.parse(out).unwrap(), vec!["tests::a", "tests::b"]);
    }

    #[test]
    fn parses_pytest_listing() {
        let out = "tests/test_a.py::test_one\ntests/test_a.py::test_two[1-2]\n\n2 tests collected in 0.01s\n";
        assert_eq!(
            DiscoverKind::Pytest.parse(out).unwrap(),
            vec!["tests/test_a.py::test_one", "tests/test_a.py::test_two[1-2]"]
        );
    }

    #[test]
    fn parses_rspec_listing_into_files() {
        let out = r#"Run options: ...
{"version":"3.12","examples":[{"id":"./spec/a_spec.rb[1:1]","file_path":"./spec/a_spec.rb"},
{"id":"./spec/a_spec.rb[1:2]","file_path":"./spec/a_spec.rb"},{"id":"x","file_path":"./spec/b_spec.rb"}]}"#;
        assert_eq!(DiscoverKind::Rspec.parse(out).unwrap(), vec!["spec/a_spec.rb", "spec/a_spec.rb", "spec/b_spec.rb"]);
    }

    #[tokio::test]
    async fn globs_sort_and_dedupe_and_empty_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b_test.sh", "a_test.sh", "c.txt"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let pattern = format!("{}/*_test.sh", dir.path().display());
        let units = collect_units(&UnitSource::Globs(vec![pattern.clone(), pattern])).await.unwrap();
        let names: Vec<_> = units.iter().map(|u| u.id.as_str().rsplit('/').next().unwrap().to_owned()).collect();
        assert_eq!(names, vec!["a_test.sh", "b_test.sh"]);

        let none = format!("{}/*.rb", dir.path().display());
        let err = collect_units(&UnitSource::Globs(vec![none])).await.unwrap_err();
        assert!(matches!(err, UnitsError::Empty { .. }), "{err}");
        let err = collect_units(&UnitSource::Globs(vec!["[".into()])).await.unwrap_err();
        assert!(matches!(err, UnitsError::BadGlob { .. }), "{err}");
    }

    #[tokio::test]
    async fn unit_files_are_read_and_missing_ones_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("units.txt");
        std::fs::write(&path, "one\ntwo\n").unwrap();
        let units = collect_units(&UnitSource::File(path)).await.unwrap();
        assert_eq!(units.len(), 2);
        let err = collect_units(&UnitSource::File(dir.path().join("nope"))).await.unwrap_err();
        assert!(err.to_string().contains("cannot read unit list"), "{err}");
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "# nothing\n").unwrap();
        assert!(matches!(collect_units(&UnitSource::File(empty)).await, Err(UnitsError::Empty { .. })));
    }
}
