//! `cargo test` discovery: `cargo test ARGS -- --list` with the user's cargo
//! and arguments; each test binary's "N tests, M benchmarks" line gives the
//! count.

use super::cargo_exact::CargoUnits;
use super::cargo_packages::{running_line, Packages};
use crate::errors::UnitsError;

use super::listing::{failed, run_merged, without_placeholder, ListCommand, Listing};

/// The listing command for the user's `cargo test ... -- ...` (or none).
/// `-q` is dropped: it makes libtest leave out its count lines.
pub fn list_command(command: &[String]) -> Vec<String> {
    let mut base = without_placeholder(command, &[]);
    if let Some(end) = base.iter().position(|a| a == "--") {
        base.truncate(end);
    }
    if !base.iter().any(|a| a == "test") {
        base = vec!["cargo".into(), "test".into()];
    }
    base.retain(|a| a != "-q" && a != "--quiet");
    base.extend(["--".into(), "--list".into()]);
    base
}

/// Lists the tests; returns the command shown in messages, the listing, and
/// each test's target when cargo's output pairs them up (see
/// [`super::cargo_exact::targets`], told apart with `cargo metadata`); a
/// name in several test targets is listed once per target, under an id that
/// names it (see [`CargoUnits`]).
pub async fn list(command: &[String]) -> Result<(String, Listing, Option<CargoUnits>), UnitsError> {
    let argv = list_command(command);
    let (shown, output) = run_merged(&ListCommand { argv: argv.clone(), env: Vec::new() }).await?;
    if !output.status.success() {
        return Err(failed(shown, &output));
    }
    let merged = String::from_utf8_lossy(&output.stdout);
    let Sections { stdout, started, silent } = Sections::read(&merged);
    if !silent.is_empty() {
        return Err(UnitsError::UnlistedTargets {
            command: shown,
            binaries: started,
            listed: started - silent.len(),
            names: silent.join(", "),
        });
    }
    let mut listing = parse(&stdout);
    let packages = Packages::load(&argv).await;
    let targets = super::cargo_exact::targets(&stdout, &merged, packages.as_ref());
    let units = targets.map(|targets| CargoUnits::qualify(&mut listing.ids, targets));
    Ok((shown, listing, units))
}

/// cargo's merged output read section by section (a section is what
/// follows a `Running` or `Doc-tests` line).
#[derive(Debug, PartialEq, Eq)]
struct Sections<'a> {
    /// Each section's `NAME: test` and count lines, and a count line made
    /// up for a section that lists tests without one (libtest-mimic's
    /// harnesses print none).
    stdout: String,
    /// How many binaries and doctest runs cargo started.
    started: usize,
    /// The binaries that printed no listing at all: a `harness = false`
    /// target that is not libtest-like, whose tests hopper cannot run one
    /// by one. (Every libtest binary prints its count line, also for 0
    /// tests; a library's doctests may print two.)
    silent: Vec<&'a str>,
}

impl<'a> Sections<'a> {
    fn read(merged: &'a str) -> Self {
        let mut sections = Self { stdout: String::new(), started: 0, silent: Vec::new() };
        // The section being read: its binary, the names it listed, and
        // whether it printed a count line.
        let mut open: Option<(&str, usize, bool)> = None;
        for line in merged.lines() {
            let doc_tests = line.trim().strip_prefix("Doc-tests ");
            if let Some(binary) = running_line(line).map(|(source, _)| source).or(doc_tests) {
                sections.close(open.take());
                sections.started += 1;
                open = Some((binary, 0, false));
            } else if let Some((_, names, counted)) = open.as_mut() {
                if line.ends_with(": test") {
                    *names += 1;
                } else if count_line(line).is_some() {
                    *counted = true;
                } else {
                    continue;
                }
                sections.stdout.push_str(line);
                sections.stdout.push('\n');
            }
        }
        sections.close(open);
        sections
    }

    fn close(&mut self, section: Option<(&'a str, usize, bool)>) {
        match section {
            Some((binary, 0, false)) => self.silent.push(binary),
            Some((_, names, false)) => self.stdout.push_str(&format!("{names} tests, 0 benchmarks\n")),
            _ => {}
        }
    }
}

/// The N of a binary's `N tests, M benchmarks` line.
fn count_line(line: &str) -> Option<usize> {
    let (n, rest) = line.split_once(' ')?;
    (rest.starts_with("test, ") || rest.starts_with("tests, ")).then(|| n.parse().ok()).flatten()
}

/// Test names (`name: test` lines) and the sum of the `N tests, M benchmarks` lines.
pub fn parse(stdout: &str) -> Listing {
    let mut ids = Vec::new();
    let mut counted = 0;
    for line in stdout.lines() {
        if let Some(name) = line.strip_suffix(": test") {
            ids.push(name.to_owned());
        } else if let Some(n) = count_line(line) {
            counted += n;
        }
    }
    Listing { ids, counted }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_counts() {
        let out =
            "tests::a: test\ntests::b c: test\nbench_x: benchmark\n\n2 tests, 1 benchmark\n0 tests, 0 benchmarks\n";
        let listing = parse(out);
        assert_eq!(listing.ids, vec!["tests::a", "tests::b c"]);
        assert_eq!(listing.counted, 2);
    }

    #[test]
    fn a_binary_that_lists_nothing_is_named_and_a_listing_without_a_count_gets_one() {
        // repro: a `harness = false` test that prints nothing for `--list`,
        // beside libtest-mimic's, which lists its tests with no count line.
        let merged = "   Compiling demo v0.1.0\nwarning: x: test\n     Running unittests src/lib.rs (target/debug/deps/demo-1)\n\
                      tests::a: test\n\n1 test, 0 benchmarks\n     Running tests/mimic.rs (target/debug/deps/mimic-2)\n\
                      check_ok: test\ncheck_fail: test\n     Running tests/custom.rs (target/debug/deps/custom-3)\n\
                      hello from main\n   Doc-tests demo\n\n0 tests, 0 benchmarks\n";
        let sections = Sections::read(merged);
        assert_eq!(
            sections,
            Sections {
                stdout:
                    "tests::a: test\n1 test, 0 benchmarks\ncheck_ok: test\ncheck_fail: test\n2 tests, 0 benchmarks\n\
                         0 tests, 0 benchmarks\n"
                        .into(),
                started: 4,
                silent: vec!["tests/custom.rs"],
            }
        );
        let listing = parse(&sections.stdout);
        assert_eq!(listing.ids, ["tests::a", "check_ok", "check_fail"]);
        assert_eq!(listing.counted, 3);
        // edition 2024: a library's doctests may list in two sections.
        let doc =
            "     Running unittests src/lib.rs (x-1)\n0 tests, 0 benchmarks\n   Doc-tests x\n2 tests, 0 benchmarks\n\
                   1 test, 0 benchmarks\n";
        assert_eq!(Sections::read(doc).silent, Vec::<&str>::new());
    }

    #[test]
    fn the_users_cargo_test_command_lists() {
        let cmd: Vec<String> = ["cargo", "test", "-q", "--lib", "--", "--exact", "{unit}"].map(String::from).to_vec();
        assert_eq!(list_command(&cmd), ["cargo", "test", "--lib", "--", "--list"]);
        assert_eq!(list_command(&[]), ["cargo", "test", "--", "--list"]);
    }
}
