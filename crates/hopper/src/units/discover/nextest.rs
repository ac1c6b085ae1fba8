//! nextest discovery: `cargo nextest list --message-format json` with the
//! user's cargo and arguments. Besides the units it keeps what running a
//! test binary directly needs (path, working directory, environment), so
//! hopper can run each test as nextest does, without cargo.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use leasehold_core::UnitId;

use crate::errors::{ListingError, UnitsError};
use crate::exec::template::PLACEHOLDER;

use super::listing::{failed, run_first_installed, without_placeholder, ListCommand, Listing};

/// One listed test, and how to run it on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextestTest {
    /// The binary's nextest id (`crate::bin/name`).
    pub binary_id: String,
    /// The test binary.
    pub binary_path: PathBuf,
    /// The test's name inside its binary.
    pub name: String,
    /// Where nextest runs it (the package's directory).
    pub cwd: PathBuf,
    /// The package name (`CARGO_PKG_NAME`).
    pub package_name: String,
    /// The package version (`CARGO_PKG_VERSION`), when the package id tells it.
    pub package_version: Option<String>,
}

/// Every unit's test, and the library path the binaries need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextestTests {
    /// By unit id (the filterset).
    pub tests: HashMap<UnitId, NextestTest>,
    /// `LD_LIBRARY_PATH` entries nextest gives the tests, in order.
    pub library_path: Vec<PathBuf>,
}

/// The cargo config file, in `dir` or above it or in `CARGO_HOME`, that sets
/// environment variables (`[env]`): cargo gives them to the tests that
/// `cargo nextest run` runs, and a test binary hopper ran directly lacked
/// them (a test reading one failed where nextest passed it).
pub fn cargo_config_env(dir: &Path) -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let in_tree = dir.ancestors().flat_map(|d| [d.join(".cargo/config.toml"), d.join(".cargo/config")]);
    let in_home = home.into_iter().flat_map(|h| [h.join("config.toml"), h.join("config")]);
    in_tree.chain(in_home).find(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines().map(str::trim).any(|l| l == "[env]" || l.starts_with("[env.") || l.starts_with("env."))
        })
    })
}

/// nextest's own config (`.config/nextest.toml` in `dir` or above it) when
/// it defines test groups: each unit runs on its own, so nextest's groups
/// do not hold between them (hopper's `--group` does).
pub fn nextest_test_groups(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .map(|d| d.join(".config/nextest.toml"))
        .find(|file| std::fs::read_to_string(file).is_ok_and(|text| text.contains("test-groups")))
}

/// nextest's options that take a filterset.
const FILTERSET_FLAGS: [&str; 3] = ["-E", "--filterset", "--filter-expr"];

/// The command that runs one unit from the user's `cargo nextest run ...`:
/// its own filtersets dropped (they chose the tests at discovery, and
/// nextest runs the tests matching *any* filterset, so each unit would run
/// all of them), and `-E {unit}` added (before a `--`) when it has no
/// `{unit}` (a unit is a filterset: as a name it matched no test, and every
/// unit failed with nextest's "no tests to run"). Also gives the dropped
/// filtersets, for the user.
pub fn per_unit_command(command: Vec<String>) -> (Vec<String>, Vec<String>) {
    let end = command.iter().position(|a| a == "--").unwrap_or(command.len());
    let (mut kept, mut dropped) = (Vec::with_capacity(command.len() + 2), Vec::new());
    let mut parts = command.into_iter().enumerate().peekable();
    while let Some((i, part)) = parts.next() {
        let own = |value: &str| !value.contains(PLACEHOLDER);
        if i < end && FILTERSET_FLAGS.contains(&part.as_str()) {
            if let Some((_, value)) = parts.next_if(|(_, value)| own(value)) {
                dropped.extend([part, value]);
                continue;
            }
        } else if i < end
            && FILTERSET_FLAGS.iter().any(|flag| part.strip_prefix(flag).is_some_and(|v| v.starts_with('=') && own(v)))
        {
            dropped.push(part);
            continue;
        }
        kept.push(part);
    }
    if !kept.iter().any(|a| a.contains(PLACEHOLDER)) {
        let at = kept.iter().position(|a| a == "--").unwrap_or(kept.len());
        kept.splice(at..at, ["-E".to_owned(), PLACEHOLDER.to_owned()]);
    }
    (kept, dropped)
}

/// `cargo nextest run`'s options that `cargo nextest list` refuses, with a
/// value (from nextest 0.9's `run --help` less `list --help`).
const RUN_ONLY_WITH_VALUE: &[&str] = &[
    "--debugger",
    "--failure-output",
    "--final-status-level",
    "--flaky-result",
    "--max-fail",
    "--max-progress-running",
    "--message-format",
    "--message-format-version",
    "--no-tests",
    "--retries",
    "--status-level",
    "--stress-count",
    "--stress-duration",
    "--success-output",
    "--tracer",
    "-R",
    "--rerun",
    "-j",
    "--test-threads",
];

/// The same, without a value.
const RUN_ONLY_FLAGS: &[&str] = &[
    "--fail-fast",
    "--hide-progress-bar",
    "--no-capture",
    "--nocapture",
    "--no-fail-fast",
    "--no-input-handler",
    "--no-output-indent",
    "--no-run",
];

/// `argv` (before its `--`) without the options only `run` takes
/// (`--no-fail-fast`, `--retries 2`, `-j=4`): `list` would refuse them.
fn without_run_options(argv: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut parts = argv.into_iter();
    while let Some(part) = parts.next() {
        let name = part.split_once('=').map_or(part.as_str(), |(name, _)| name);
        if RUN_ONLY_FLAGS.contains(&part.as_str()) || (name != part && RUN_ONLY_WITH_VALUE.contains(&name)) {
            continue;
        }
        if RUN_ONLY_WITH_VALUE.contains(&part.as_str()) {
            parts.next();
            continue;
        }
        out.push(part);
    }
    out
}

/// The listing command for the user's `cargo nextest run ...` (or none).
pub fn list_command(command: &[String]) -> Vec<String> {
    let mut base = without_placeholder(command, &FILTERSET_FLAGS);
    if let Some(end) = base.iter().position(|a| a == "--") {
        base.truncate(end);
    }
    let mut base = without_run_options(base);
    let nextest = base.iter().position(|a| a == "nextest");
    let run = nextest.and_then(|n| base.iter().skip(n + 1).position(|a| a == "run").map(|r| n + 1 + r));
    let mut argv = match run {
        Some(run) => {
            base[run] = "list".into();
            base
        }
        None => vec!["cargo".into(), "nextest".into(), "list".into()],
    };
    argv.extend(["--message-format".into(), "json".into()]);
    argv
}

/// Lists the tests; returns the command shown in messages, the listing and
/// the tests by unit.
pub async fn list(command: &[String]) -> Result<(String, Listing, NextestTests), UnitsError> {
    let argv = list_command(command);
    let (shown, output) = run_first_installed(&[ListCommand { argv, env: Vec::new() }]).await?;
    if !output.status.success() {
        return Err(failed(shown, &output));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // hopper runs the binaries itself when no command is given: an ignored
    // test is then a unit, which libtest reports as ignored (a skip, with its
    // reason); `cargo nextest run` would refuse to run it alone.
    let (listing, tests) = parse(&stdout, command.is_empty()).map_err(|detail| UnitsError::DiscoverParse {
        command: shown.clone(),
        source: ListingError::Inconsistent(detail),
    })?;
    Ok((shown, listing, tests))
}

/// The nextest filterset that selects exactly one test: `binary_id(=ID) &
/// test(=NAME)`, with the characters the matchers treat specially escaped.
pub fn filterset(binary_id: &str, test_name: &str) -> String {
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

fn text<'a>(value: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(|v| v.as_str())
}

/// Parses nextest's JSON listing. The count checked is `test-count` against
/// every test case listed (ignored and filtered-out ones included); the units
/// are the cases that match, and are not ignored unless `keep_ignored`.
pub fn parse(stdout: &str, keep_ignored: bool) -> Result<(Listing, NextestTests), String> {
    let start = stdout.find('{').ok_or("no JSON object in the output")?;
    let value: serde_json::Value = serde_json::from_str(stdout[start..].trim()).map_err(|e| e.to_string())?;
    let counted = value.get("test-count").and_then(|c| c.as_u64()).ok_or("no \"test-count\"")? as usize;
    let suites = value
        .get("rust-suites")
        .and_then(|s| s.as_object())
        .ok_or("no \"rust-suites\" object (is this `cargo nextest list --message-format json` output?)")?;
    let mut listed = 0;
    let mut ids = Vec::new();
    let mut tests = NextestTests { library_path: library_path(&value), ..NextestTests::default() };
    for (binary_id, suite) in suites {
        let Some(cases) = suite.get("testcases").and_then(|c| c.as_object()) else {
            continue;
        };
        let binary_path = PathBuf::from(text(suite, "binary-path").ok_or("a suite without \"binary-path\"")?);
        let cwd = PathBuf::from(text(suite, "cwd").ok_or("a suite without \"cwd\"")?);
        let package_name = text(suite, "package-name")
            .map(str::to_owned)
            .unwrap_or_else(|| binary_id.split("::").next().unwrap_or(binary_id).to_owned());
        let package_version = text(suite, "package-id").and_then(|id| id.rsplit_once('@')).map(|(_, v)| v.to_owned());
        for (name, case) in cases {
            listed += 1;
            let ignored = case.get("ignored").and_then(|v| v.as_bool()).unwrap_or(false);
            let filter = case.get("filter-match");
            let field = |key: &str| filter.and_then(|m| m.get(key)).and_then(|s| s.as_str());
            // An ignored test is a mismatch "because ignored": kept when ignored tests are.
            let matches = field("status").is_none_or(|s| s == "matches")
                || (keep_ignored && ignored && field("reason") == Some("ignored"));
            if (ignored && !keep_ignored) || !matches {
                continue;
            }
            let id = filterset(binary_id, name);
            if let Ok(unit) = UnitId::new(&id) {
                tests.tests.insert(
                    unit,
                    NextestTest {
                        binary_id: binary_id.clone(),
                        binary_path: binary_path.clone(),
                        name: name.clone(),
                        cwd: cwd.clone(),
                        package_name: package_name.clone(),
                        package_version: package_version.clone(),
                    },
                );
            }
            ids.push(id);
        }
    }
    if listed != counted {
        return Err(format!("nextest counted {counted} tests (\"test-count\") but listed {listed}"));
    }
    // The checked count is that of the selected tests.
    let counted = ids.len();
    Ok((Listing { ids, counted }, tests))
}

/// What nextest puts on `LD_LIBRARY_PATH`: the build's output directories
/// (and their `deps`), the linked paths build scripts asked for, and the
/// host toolchain's libraries.
fn library_path(value: &serde_json::Value) -> Vec<PathBuf> {
    let meta = value.get("rust-build-meta");
    let mut out = Vec::new();
    let target = meta.and_then(|m| text(m, "target-directory")).map(PathBuf::from);
    if let Some(target) = &target {
        let bases = meta.and_then(|m| m.get("base-output-directories")).and_then(|b| b.as_array());
        for base in bases.into_iter().flatten().filter_map(|b| b.as_str()) {
            out.push(target.join(base));
            out.push(target.join(base).join("deps"));
        }
        let linked = meta.and_then(|m| m.get("linked-paths")).and_then(|b| b.as_array());
        for path in linked.into_iter().flatten().filter_map(|b| b.as_str()) {
            out.push(target.join(path));
        }
    }
    let libdir = meta
        .and_then(|m| m.get("platforms"))
        .and_then(|p| p.get("host"))
        .and_then(|h| h.get("libdir"))
        .and_then(|l| text(l, "path"))
        .map(PathBuf::from);
    if let Some(libdir) = libdir {
        // <sysroot>/lib/rustlib/<triple>/lib, then <sysroot>/lib.
        let sysroot_lib = libdir.ancestors().nth(3).map(|p| p.to_path_buf());
        out.push(libdir);
        out.extend(sysroot_lib);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = r#"{"rust-build-meta":{"target-directory":"/t","base-output-directories":["debug"],
        "linked-paths":[],"platforms":{"host":{"libdir":{"status":"available","path":"/r/lib/rustlib/x86/lib"}}}},
        "test-count":4,"rust-suites":{
        "core::lib":{"package-name":"core","binary-path":"/t/debug/deps/core-1","cwd":"/src/core",
            "package-id":"path+file:///src/core#core@0.2.0","testcases":{
            "a::works":{"ignored":false,"filter-match":{"status":"matches"}},
            "a::slow":{"ignored":true,"filter-match":{"status":"mismatch","reason":"ignored"}},
            "a::other":{"ignored":false,"filter-match":{"status":"mismatch","reason":"expression"}}}},
        "core::it":{"binary-path":"/t/debug/deps/it-2","cwd":"/src/core","testcases":{
            "b":{"ignored":false,"filter-match":{"status":"matches"}}}}}}"#;

    #[test]
    fn run_only_options_are_left_out_of_the_listing() {
        let argv = |parts: &[&str]| parts.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let run = argv(&[
            "cargo",
            "nextest",
            "run",
            "--no-fail-fast",
            "--retries",
            "2",
            "-j=4",
            "--features",
            "serde",
            "-P",
            "ci",
            "--",
            "--nocapture",
        ]);
        assert_eq!(
            list_command(&run),
            argv(&["cargo", "nextest", "list", "--features", "serde", "-P", "ci", "--message-format", "json"])
        );
    }

    #[test]
    fn a_units_command_filters_by_the_unit_alone() {
        let argv = |parts: &[&str]| parts.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let (kept, dropped) = per_unit_command(argv(&["cargo", "nextest", "run", "--features", "serde"]));
        assert_eq!(kept, argv(&["cargo", "nextest", "run", "--features", "serde", "-E", "{unit}"]));
        assert!(dropped.is_empty());
        let mine =
            argv(&["cargo", "nextest", "run", "-E", "test(passes)", "--filterset=kind(lib)", "--", "--nocapture"]);
        let (kept, dropped) = per_unit_command(mine);
        assert_eq!(kept, argv(&["cargo", "nextest", "run", "-E", "{unit}", "--", "--nocapture"]));
        assert_eq!(dropped, argv(&["-E", "test(passes)", "--filterset=kind(lib)"]));
        let placed = argv(&["cargo", "nextest", "run", "-E", "test(a)", "--filterset", "{unit}"]);
        let (kept, _) = per_unit_command(placed);
        assert_eq!(kept, argv(&["cargo", "nextest", "run", "--filterset", "{unit}"]), "the unit's own filter stays");
    }

    #[test]
    fn parses_tests_and_how_to_run_them() {
        let (listing, tests) = parse(LISTING, false).unwrap();
        let mut ids = listing.ids.clone();
        ids.sort();
        assert_eq!(ids, vec!["binary_id(=core::it) & test(=b)", "binary_id(=core::lib) & test(=a::works)"]);
        assert_eq!(listing.counted, 2);
        let works = &tests.tests[&UnitId::new("binary_id(=core::lib) & test(=a::works)").unwrap()];
        assert_eq!(works.binary_path, PathBuf::from("/t/debug/deps/core-1"));
        assert_eq!(works.cwd, PathBuf::from("/src/core"));
        assert_eq!(works.name, "a::works");
        assert_eq!(works.package_version.as_deref(), Some("0.2.0"));
        let b = &tests.tests[&UnitId::new("binary_id(=core::it) & test(=b)").unwrap()];
        assert_eq!(b.package_name, "core");
        let paths: Vec<_> = tests.library_path.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(paths, ["/t/debug", "/t/debug/deps", "/r/lib/rustlib/x86/lib", "/r/lib"]);
        assert!(parse("{}", false).is_err());
        let (kept, _) = parse(LISTING, true).unwrap();
        assert!(kept.ids.contains(&"binary_id(=core::lib) & test(=a::slow)".to_owned()), "{:?}", kept.ids);
        let short = LISTING.replace("\"test-count\":4", "\"test-count\":5");
        assert!(parse(&short, false).unwrap_err().contains("counted 5 tests"));
    }

    #[test]
    fn filtersets_escape_the_matcher_syntax() {
        assert_eq!(filterset("my-crate::bin/tool", "t::x"), "binary_id(=my-crate::bin/tool) & test(=t::x)");
        assert_eq!(filterset("c", "case(a, b)\\z\tq"), "binary_id(=c) & test(=case(a\\, b\\)\\\\z\\tq)");
    }

    #[test]
    fn the_users_nextest_command_lists() {
        let cmd: Vec<String> =
            ["cargo", "nextest", "run", "-p", "x", "-E", "{unit}", "--", "--nocapture"].map(String::from).to_vec();
        assert_eq!(list_command(&cmd), ["cargo", "nextest", "list", "-p", "x", "--message-format", "json"]);
        assert_eq!(list_command(&[]), ["cargo", "nextest", "list", "--message-format", "json"]);
    }
}
