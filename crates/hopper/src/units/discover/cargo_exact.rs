//! `--discover cargo-test`, run one test at a time: the exact test in its
//! own test binary, and a unit that ran no test is an error.
//!
//! A name given to `cargo test` is a substring filter: `tests::parse` also
//! runs `tests::parse_fails`, and is failed by it. And cargo runs no doctest
//! when a name is given unless `--doc` is, so a doctest's name ran zero tests
//! in every binary and exited 0: a failing doctest "passed". So each unit's
//! `cargo test` command gets the unit's target (`--lib`, `--test NAME`,
//! `--doc`, from the binary discovery listed it under) and libtest's
//! `--exact` (not for doctests: rustdoc splits the name it is given at its
//! spaces and runs every doctest matching a piece, so no doctest can be
//! named exactly). Then libtest's own summary lines (`test result: ok. 1
//! passed; 0 failed; 0 ignored; ...`) must say the command ran exactly one
//! test; none is an error, never a pass. A doctest unit whose command ran
//! its siblings too is judged by its own result in the output.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use leasehold_core::UnitId;

pub use super::cargo_packages::CargoTarget;
use super::cargo_packages::{running_line, Packages};
use super::libtest_output::{counts, doctest_verdicts, ignore_reason, is_doctest, own_doctest_verdict, panic_message};

use crate::exec::process::{ProcessLimits, ProcessResult, Termination};
use crate::exec::template::CommandTemplate;
use crate::verdicts::model::{termination_verdict, BatchResults, UnitResult, UnitVerdict};
use crate::worker::launch::{Invocation, Launcher};
use crate::worker::shared_runs::SharedRuns;

/// cargo's options that choose which targets `cargo test` builds and runs:
/// a command that has one keeps its own choice.
const TARGET_FLAGS: &[&str] = &[
    "--lib",
    "--bin",
    "--bins",
    "--test",
    "--tests",
    "--bench",
    "--benches",
    "--example",
    "--examples",
    "--doc",
    "--all-targets",
];

/// A listed test's target, and its package when the run spans several
/// packages (a workspace: `-p NAME` then picks it out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The package, when the run holds tests of more than one.
    pub package: Option<String>,
    /// The target within it.
    pub target: CargoTarget,
}

impl From<CargoTarget> for Selection {
    fn from(target: CargoTarget) -> Self {
        Self { package: None, target }
    }
}

impl Selection {
    /// `cargo test`'s flags that select it: `-p NAME` (when named), then
    /// the target's own.
    fn flags(&self) -> Vec<String> {
        let mut flags = self.package_flags();
        flags.extend(self.target.flags());
        flags
    }

    fn package_flags(&self) -> Vec<String> {
        self.package.iter().flat_map(|package| ["-p".to_owned(), package.clone()]).collect()
    }

    fn of_line(line: &str, packages: Option<&Packages>) -> Option<Self> {
        let by_path = CargoTarget::of_line(line)?;
        let exact = packages.and_then(|packages| match line.trim().strip_prefix("Doc-tests ") {
            Some(crate_name) => Some((packages.doc_tests(crate_name.trim())?, CargoTarget::Doc)),
            None => {
                let (source, binary) = running_line(line)?;
                packages.running(source, binary)
            }
        });
        Some(match exact {
            Some((package, target)) => Self { package: Some(package), target },
            None => by_path.into(),
        })
    }
}

/// Each listed test's target, one per `NAME: test` line in the listing's
/// order (the lines [`super::libtest::parse`] reads its ids from).
///
/// cargo prints one `Running` line per test binary on stderr, then one
/// `Doc-tests` line per library, and each binary's `--list` ends with its
/// `N tests, M benchmarks` line on stdout, in the same order. A library's
/// doctests may list in two such sections (edition 2024 merges the doctests
/// it can into one binary, and lists the rest apart), so sections are paired
/// with the `Running` lines, and every section after those is doctests:
/// each doctest's package is the one its path is in (rustdoc names it from
/// the workspace's root: `beta/src/lib.rs - two (line 1)`).
///
/// `packages` (from `cargo metadata`) names each binary's package and
/// target exactly; without it a target is told from its path. Packages are
/// kept only when the tests span more than one. `None` when the two outputs
/// do not pair up (another cargo's output): the units then run with
/// `--exact` and every target.
pub fn targets(stdout: &str, stderr: &str, packages: Option<&Packages>) -> Option<Vec<Selection>> {
    let binaries: Vec<Selection> = stderr.lines().filter_map(|l| Selection::of_line(l, packages)).collect();
    let running = binaries.iter().take_while(|b| b.target != CargoTarget::Doc).count();
    let doc_packages: Vec<Option<&str>> = binaries[running..].iter().map(|b| b.package.as_deref()).collect();
    if binaries[running..].iter().any(|b| b.target != CargoTarget::Doc) {
        return None;
    }
    let mut sections = 0;
    let mut found: Vec<Selection> = Vec::new();
    let mut listed: Vec<&str> = Vec::new();
    for line in stdout.lines() {
        if let Some(name) = line.strip_suffix(": test") {
            listed.push(name);
        } else if let Some((_, rest)) = line.split_once(' ') {
            if rest.starts_with("test, ") || rest.starts_with("tests, ") {
                if sections < running {
                    found.extend(std::iter::repeat_n(binaries[sections].clone(), listed.len()));
                } else {
                    for name in &listed {
                        if doc_packages.is_empty() || !is_doctest(name) {
                            return None;
                        }
                        let package = match (packages, doc_packages.as_slice()) {
                            (_, [only]) => only.map(str::to_owned),
                            (Some(packages), _) => packages.of_doctest(name),
                            (None, _) => None,
                        };
                        found.push(Selection { package, target: CargoTarget::Doc });
                    }
                }
                listed.clear();
                sections += 1;
            }
        }
    }
    if sections < running || !listed.is_empty() {
        return None;
    }
    let spanned: HashSet<&str> = found.iter().filter_map(|s| s.package.as_deref()).collect();
    if spanned.len() < 2 {
        found.iter_mut().for_each(|s| s.package = None);
    }
    Some(found)
}

/// The cargo-test units of a listing: each unit's target, and the libtest
/// name of a unit whose id names its target too.
///
/// Test targets are separate binaries, so two of them may each have a test
/// of one name (`test_eq` in `tests/version.rs` and in `tests/req.rs`; a
/// library's and its binary's `tests::it_works`; two packages' of one
/// workspace). Such a test's unit id names its target, as the target's
/// `cargo test` flags in brackets: `test_eq [--test version]`,
/// `tests::it_works [-p beta --bin beta]`. Every other unit is its libtest
/// name alone.
#[derive(Debug, Clone, Default)]
pub struct CargoUnits {
    targets: HashMap<String, Selection>,
    names: HashMap<String, String>,
}

impl CargoUnits {
    /// Gives each of `ids` (a listing's test names, in its order) its target
    /// from `targets` (from [`targets`], one per name, in the same order),
    /// and renames in `ids` each name listed in several targets that cargo
    /// can select apart. A name repeated within one target, or in a target
    /// with no flag of its own ([`CargoTarget::Other`]), stays as it is, and
    /// discovery reports it as listed twice.
    pub fn qualify(ids: &mut [String], targets: Vec<Selection>) -> Self {
        let mut units = Self::default();
        if targets.len() != ids.len() {
            return units;
        }
        let mut in_targets: HashMap<&str, Vec<&Selection>> = HashMap::new();
        for (id, target) in ids.iter().zip(&targets) {
            in_targets.entry(id.as_str()).or_default().push(target);
        }
        let renamed: Vec<bool> = ids
            .iter()
            .map(|id| {
                let targets = &in_targets[id.as_str()];
                targets.len() > 1
                    && targets.iter().all(|t| t.target != CargoTarget::Other)
                    && (1..targets.len()).all(|i| !targets[..i].contains(&targets[i]))
            })
            .collect();
        for ((id, target), renamed) in ids.iter_mut().zip(targets).zip(renamed) {
            if renamed {
                let name = std::mem::take(id);
                *id = format!("{name} [{}]", target.flags().join(" "));
                units.names.insert(id.clone(), name);
            }
            units.targets.insert(id.clone(), target);
        }
        units
    }

    /// The target of `unit`, when cargo's output named it.
    pub fn target(&self, unit: &str) -> Option<&Selection> {
        self.targets.get(unit)
    }

    /// The libtest name of `unit` (its id, unless the id names its target).
    pub fn name<'a>(&'a self, unit: &'a str) -> &'a str {
        self.names.get(unit).map_or(unit, String::as_str)
    }

    /// The units whose ids name their targets.
    pub fn renamed(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }

    /// How many doctests each package has (`None`: the only package).
    fn doctests_by_package(&self) -> HashMap<Option<String>, usize> {
        let mut counts = HashMap::new();
        for selection in self.targets.values().filter(|s| s.target == CargoTarget::Doc) {
            *counts.entry(selection.package.clone()).or_default() += 1;
        }
        counts
    }
}

/// Whether `argv` is a `cargo ... test` command (the ones rewritten and
/// counted here; any other command runs as given).
pub fn is_cargo_test(argv: &[String]) -> bool {
    let Some(at) = argv.iter().position(|a| Path::new(a).file_name().is_some_and(|n| n == "cargo")) else {
        return false;
    };
    let end = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    argv.get(at + 1..end).is_some_and(|rest| rest.iter().any(|a| a == "test"))
}

/// `argv` (one unit's rendered `cargo test` command) made exact: the
/// target's flags before the `--` unless the command chose targets itself,
/// its package (`-p NAME`, in place of the packages the command chose) when
/// it has one, and `--exact` after the `--` unless it is there or the unit
/// is a doctest.
pub fn exact(argv: Vec<String>, selection: Option<&Selection>) -> Vec<String> {
    let mut argv = match selection.and_then(|s| s.package.as_ref()) {
        Some(_) => without_packages(argv),
        None => argv,
    };
    let end = match argv.iter().position(|a| a == "--") {
        Some(end) => end,
        None => {
            argv.push("--".into());
            argv.len() - 1
        }
    };
    let chose_targets = argv[..end].iter().any(|a| TARGET_FLAGS.contains(&a.split('=').next().unwrap_or(a)));
    let doc = selection.is_some_and(|s| s.target == CargoTarget::Doc);
    if doc {
        // rustdoc's names do not match `--exact`: the full name filters.
        argv.retain(|a| a != "--exact");
        // Every test's own line (`test NAME ... ignored`), even under `-q`,
        // whose terse dots cannot tell which of the item's doctests was
        // ignored: a unit is judged by its own line.
        if !argv[end + 1..].iter().any(|a| a == "--format" || a.starts_with("--format=")) {
            argv.push("--format=pretty".into());
        }
    } else if !argv[end + 1..].iter().any(|a| a == "--exact") {
        argv.insert(end + 1, "--exact".into());
    }
    if let Some(selection) = selection {
        let mut flags = selection.package_flags();
        if !chose_targets {
            flags.extend(selection.target.flags());
        }
        argv.splice(end..end, flags);
    }
    argv
}

/// `argv` without the packages it chose before its `--` (`--workspace`,
/// `--all`, `-p NAME`, `--package NAME`, `--exclude NAME`): a unit's own
/// `-p` picks its package, and with `--workspace` cargo would run every
/// package's tests of that name.
fn without_packages(argv: Vec<String>) -> Vec<String> {
    let end = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    let mut out = Vec::with_capacity(argv.len());
    let mut value_follows = false;
    for (i, arg) in argv.into_iter().enumerate() {
        if i >= end {
            out.push(arg);
        } else if std::mem::take(&mut value_follows) {
            continue;
        } else if matches!(arg.as_str(), "-p" | "--package" | "--exclude") {
            value_follows = true;
        } else if !(matches!(arg.as_str(), "--workspace" | "--all")
            || arg.starts_with("--package=")
            || arg.starts_with("--exclude=")
            || (arg.starts_with("-p") && !arg.starts_with("--")))
        {
            out.push(arg);
        }
    }
    out
}

/// Runs each cargo-test unit with [`exact`].
#[derive(Debug, Clone)]
pub struct CargoExact {
    template: CommandTemplate,
    units: CargoUnits,
    cwd: Option<PathBuf>,
    /// Packages with more than one doctest: their doctests run together.
    shared_doctests: HashSet<Option<String>>,
}

impl CargoExact {
    /// Units run by `template` under their libtest names, each made exact
    /// with its target from `units`.
    pub fn new(template: CommandTemplate, units: CargoUnits) -> Self {
        let shared_doctests =
            units.doctests_by_package().into_iter().filter(|(_, n)| *n > 1).map(|(package, _)| package).collect();
        Self { template, units, cwd: None, shared_doctests }
    }
}

/// A package's doctests run together: `cargo test --doc` with no name has
/// rustdoc read the library and build its doctests once, where a run per
/// doctest does it for each (see [`crate::worker::shared_runs`]).
impl SharedRuns for CargoExact {
    fn together(&self, unit: &UnitId) -> Option<Invocation> {
        let selection = self.units.target(unit.as_str()).filter(|s| s.target == CargoTarget::Doc)?;
        if !self.shared_doctests.contains(&selection.package) {
            return None;
        }
        let argv = exact(self.template.render(&[]), Some(selection));
        Some(Invocation { argv, env: Vec::new(), cwd: self.cwd.clone() })
    }

    fn verdicts(&self, result: &ProcessResult) -> Option<HashMap<String, UnitResult>> {
        let Termination::Exited(_) = result.termination else { return None };
        let text = result.output.text(usize::MAX);
        counts(&text)?;
        Some(doctest_verdicts(&text))
    }
}

impl Launcher for CargoExact {
    fn invocation(&self, units: &[UnitId]) -> Invocation {
        // A unit whose id names its target runs under its libtest name.
        let names: Vec<UnitId> =
            units.iter().map(|u| UnitId::new(self.units.name(u.as_str())).unwrap_or_else(|_| u.clone())).collect();
        let argv = self.template.render(&names);
        let target = units.first().and_then(|u| self.units.target(u.as_str()));
        Invocation { argv: exact(argv, target), env: Vec::new(), cwd: self.cwd.clone() }
    }
}

/// A Rust unit's verdict: the exit code's, checked against libtest's own
/// count. A command that ran no test, or more than one, is an error; a test
/// that libtest only ignored is skipped; a failure's message is its panic
/// message.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountedResults;

impl BatchResults for CountedResults {
    fn verdicts(
        &self,
        units: &[UnitId],
        result: &ProcessResult,
        limits: &ProcessLimits,
        _report: Option<&Path>,
    ) -> HashMap<UnitId, UnitResult> {
        let verdict = termination_verdict(&result.termination, limits);
        let text = result.output.text(usize::MAX);
        if let ([unit], UnitVerdict::Passed | UnitVerdict::Failed { reason: "exit", .. }) = (units, &verdict) {
            if let Some(own) = own_doctest_verdict(unit.as_str(), &text) {
                return [(unit.clone(), own)].into_iter().collect();
            }
        }
        let verdict = match (verdict, counts(&text)) {
            (UnitVerdict::Passed, None) => UnitVerdict::Failed {
                reason: "no_tests",
                detail: "the command printed no libtest summary (`test result: ...`): it ran no test".into(),
            },
            (UnitVerdict::Passed, Some((passed, failed, ignored))) => {
                let ran = passed + failed + ignored;
                let want = units.len() as u64;
                if ran == 0 {
                    UnitVerdict::Failed {
                        reason: "no_tests",
                        detail: "ran no test: libtest says 0 passed, 0 failed, 0 ignored (the name matched no test of \
                                 the binaries it ran)"
                            .into(),
                    }
                } else if ran != want {
                    UnitVerdict::Failed {
                        reason: "test_count",
                        detail: format!("ran {ran} tests for {want} unit(s): the name matches other tests too"),
                    }
                } else if passed == 0 && failed == 0 {
                    let reason = ignore_reason(&result.output.text(usize::MAX));
                    return units
                        .iter()
                        .map(|u| {
                            (
                                u.clone(),
                                UnitResult { verdict: UnitVerdict::Skipped, duration: None, output: reason.clone() },
                            )
                        })
                        .collect();
                } else {
                    UnitVerdict::Passed
                }
            }
            (UnitVerdict::Failed { reason: "exit", detail }, _) => {
                let output = result.output.text(usize::MAX);
                let detail = panic_message(&output).map_or(detail.clone(), |m| format!("{m} ({detail})"));
                UnitVerdict::Failed { reason: "exit", detail }
            }
            (verdict, _) => verdict,
        };
        units.iter().map(|u| (u.clone(), UnitResult::from(verdict.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_test_gets_its_binary() {
        let stderr = "   Compiling x v0.1.0\n     Running unittests src/lib.rs (target/debug/deps/x-1)\n     \
                      Running unittests src/main.rs (target/debug/deps/x-2)\n     Running tests/it.rs (target/debug/deps/it-3)\n   \
                      Doc-tests x\n";
        let stdout = "tests::parse: test\n\n1 test, 0 benchmarks\nmain_test: test\n\n1 test, 0 benchmarks\n\
                      integration: test\n\n1 test, 0 benchmarks\nsrc/lib.rs - f (line 5): test\n\n1 test, 0 benchmarks\n";
        let ids = crate::units::discover::libtest::parse(stdout).ids;
        let found: HashMap<String, Selection> = ids.into_iter().zip(targets(stdout, stderr, None).unwrap()).collect();
        assert_eq!(found["tests::parse"], CargoTarget::Lib.into());
        assert_eq!(found["main_test"], CargoTarget::Other.into(), "without cargo metadata, a binary has no name");
        assert_eq!(found["integration"], CargoTarget::Test("it".into()).into());
        assert_eq!(found["src/lib.rs - f (line 5)"], CargoTarget::Doc.into());
        assert_eq!(targets(stdout, "   Doc-tests x\n", None), None, "four lists, one binary: they do not pair up");
    }

    #[test]
    fn merged_doctests_list_in_two_sections_and_each_doctest_is_its_packages() {
        let stderr =
            "     Running unittests src/lib.rs (target/debug/deps/alpha-1)\n   Doc-tests alpha\n   Doc-tests beta\n";
        let stdout = "tests::it_works: test\n\n1 test, 0 benchmarks\nalpha/src/lib.rs - b (line 6): test\n\n1 test, 0 benchmarks\n\
                      alpha/src/lib.rs - a (line 1): test\n\n1 test, 0 benchmarks\nbeta/src/lib.rs - two (line 1): test\n\n\
                      1 test, 0 benchmarks\n";
        let packages = Packages::parse(crate::units::discover::cargo_packages::WORKSPACE_FIXTURE.as_bytes()).unwrap();
        let found = targets(stdout, stderr, Some(&packages)).unwrap();
        let doc = |p: &str| Selection { package: Some(p.into()), target: CargoTarget::Doc };
        assert_eq!(
            found,
            [
                Selection { package: Some("alpha".into()), target: CargoTarget::Lib },
                doc("alpha"),
                doc("alpha"),
                doc("beta")
            ]
        );
        // One package: no `-p`.
        let alone = "     Running unittests src/lib.rs (target/debug/deps/alpha-1)\n   Doc-tests alpha\n";
        let stdout = "tests::it_works: test\n\n1 test, 0 benchmarks\nalpha/src/lib.rs - b (line 6): test\n\n1 test, 0 benchmarks\n\
                      alpha/src/lib.rs - a (line 1): test\n\n1 test, 0 benchmarks\n";
        let found = targets(stdout, alone, Some(&packages)).unwrap();
        assert_eq!(found, [CargoTarget::Lib.into(), CargoTarget::Doc.into(), CargoTarget::Doc.into()]);
        assert_eq!(targets(stdout, alone, None).unwrap(), found, "without cargo metadata too");
        // A test that is no doctest after the binaries' sections: not cargo's.
        assert_eq!(targets("x: test\n\n1 test, 0 benchmarks\ny: test\n\n1 test, 0 benchmarks\n", alone, None), None);
    }

    /// As semver 1.0.23 has them: `test_eq` in two test targets.
    #[test]
    fn a_name_in_two_test_targets_gets_ids_naming_them() {
        let stderr = "     Running unittests src/lib.rs (target/debug/deps/semver-1)\n     \
                      Running tests/test_version.rs (target/debug/deps/test_version-2)\n     \
                      Running tests/test_version_req.rs (target/debug/deps/test_version_req-3)\n   \
                      Doc-tests semver\n";
        let stdout = "0 tests, 0 benchmarks\ntest_eq: test\ntest_new: test\n\n2 tests, 0 benchmarks\n\
                      test_eq: test\n\n1 test, 0 benchmarks\nsrc/lib.rs - Version (line 3): test\n\n1 test, 0 benchmarks\n";
        let mut ids: Vec<String> = crate::units::discover::libtest::parse(stdout).ids;
        let units = CargoUnits::qualify(&mut ids, targets(stdout, stderr, None).unwrap());
        assert_eq!(
            ids,
            [
                "test_eq [--test test_version]",
                "test_new",
                "test_eq [--test test_version_req]",
                "src/lib.rs - Version (line 3)"
            ]
        );
        assert_eq!(units.name("test_eq [--test test_version_req]"), "test_eq");
        assert_eq!(units.name("test_new"), "test_new");
        assert_eq!(
            units.target("test_eq [--test test_version_req]"),
            Some(&CargoTarget::Test("test_version_req".into()).into())
        );
        assert_eq!(units.target("test_new"), Some(&CargoTarget::Test("test_version".into()).into()));
        // Each runs alone, in its own target, under its libtest name.
        let template = CommandTemplate::new(argv(&["cargo", "test", "{unit}"])).unwrap();
        let launcher = CargoExact::new(template, units);
        let unit = UnitId::new("test_eq [--test test_version_req]").unwrap();
        assert_eq!(
            launcher.invocation(&[unit]).argv,
            argv(&["cargo", "test", "test_eq", "--test", "test_version_req", "--", "--exact"])
        );
    }

    #[test]
    fn a_name_twice_in_one_target_or_in_targets_without_flags_stays_as_it_is() {
        let mut ids = vec!["t".to_owned(), "t".to_owned()];
        let units = CargoUnits::qualify(&mut ids, vec![CargoTarget::Lib.into(), CargoTarget::Lib.into()]);
        assert_eq!(ids, ["t", "t"]);
        assert_eq!(units.renamed().count(), 0);
        let mut ids = vec!["t".to_owned(), "t".to_owned()];
        CargoUnits::qualify(&mut ids, vec![CargoTarget::Other.into(), CargoTarget::Lib.into()]);
        assert_eq!(ids, ["t", "t"], "a target not told from cargo's output cannot be selected apart");
    }

    #[test]
    fn a_units_command_is_made_exact() {
        assert_eq!(
            exact(argv(&["cargo", "test", "-q", "tests::parse"]), Some(&CargoTarget::Lib.into())),
            argv(&["cargo", "test", "-q", "tests::parse", "--lib", "--", "--exact"])
        );
        assert_eq!(
            exact(argv(&["cargo", "test", "-q", "src/lib.rs - f (line 5)"]), Some(&CargoTarget::Doc.into())),
            argv(&["cargo", "test", "-q", "src/lib.rs - f (line 5)", "--doc", "--", "--format=pretty"])
        );
        let json = argv(&["cargo", "test", "x - f (line 5)", "--doc", "--", "-Zunstable-options", "--format", "json"]);
        assert_eq!(exact(json.clone(), Some(&CargoTarget::Doc.into())), json, "a format of the command's own is kept");
        let mine = argv(&["cargo", "test", "-q", "--lib", "--", "--exact", "tests::parse"]);
        assert_eq!(exact(mine.clone(), Some(&CargoTarget::Lib.into())), mine, "the command's own choices are kept");
        assert_eq!(
            exact(argv(&["cargo", "test", "it", "--", "--nocapture"]), Some(&CargoTarget::Test("it".into()).into())),
            argv(&["cargo", "test", "it", "--test", "it", "--", "--exact", "--nocapture"])
        );
        assert!(is_cargo_test(&argv(&["cargo", "+nightly", "test", "-q", "{unit}"])));
        assert!(is_cargo_test(&argv(&["/usr/bin/cargo", "test"])));
        assert!(!is_cargo_test(&argv(&["sh", "-c", "echo {unit}"])));
        assert!(!is_cargo_test(&argv(&["cargo", "nextest", "run", "--", "test"])));
    }
}
