//! `cargo test` discovery: `cargo test ARGS -- --list` with the user's cargo
//! and arguments; each test binary's "N tests, M benchmarks" line gives the
//! count.

use super::cargo_exact::CargoUnits;
use super::cargo_packages::{running_line, Packages};
use crate::errors::UnitsError;

use super::listing::{failed, run_first_installed, without_placeholder, ListCommand, Listing};

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
    let (shown, output) = run_first_installed(&[ListCommand { argv: argv.clone(), env: Vec::new() }]).await?;
    if !output.status.success() {
        return Err(failed(shown, &output));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    unlisted_targets(&stdout, &stderr).map_or(Ok(()), |(binaries, listed, names)| {
        Err(UnitsError::UnlistedTargets { command: shown.clone(), binaries, listed, names })
    })?;
    let mut listing = parse(&stdout);
    let packages = Packages::load(&argv).await;
    let targets = super::cargo_exact::targets(&stdout, &stderr, packages.as_ref());
    let units = targets.map(|targets| CargoUnits::qualify(&mut listing.ids, targets));
    Ok((shown, listing, units))
}

/// When some test binary cargo ran printed no libtest listing (a target
/// with `harness = false`): how many binaries and doctest runs cargo started
/// (its `Running` and `Doc-tests` lines), how many `N tests, M benchmarks`
/// lines they printed, and the binaries' names. Each libtest binary prints
/// its count line, also for 0 tests; a library's doctests may print two.
fn unlisted_targets(stdout: &str, stderr: &str) -> Option<(usize, usize, String)> {
    let binaries: Vec<&str> = stderr.lines().filter_map(|l| running_line(l).map(|(source, _)| source)).collect();
    let doc_runs = stderr.lines().filter(|l| l.trim().starts_with("Doc-tests ")).count();
    let listed = stdout.lines().filter_map(count_line).count();
    let started = binaries.len() + doc_runs;
    (listed < started).then(|| (started, listed, binaries.join(", ")))
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
    fn a_binary_that_lists_nothing_is_found() {
        // repro: a `harness = false` test that prints nothing for `--list`.
        let stderr = "     Running unittests src/lib.rs (target/debug/deps/noharness-9)\n     Running tests/custom.rs \
                      (target/debug/deps/custom-d)\n   Doc-tests noharness\n";
        let stdout = "tests::unit_ok: test\n\n1 test, 0 benchmarks\n0 tests, 0 benchmarks\n";
        assert_eq!(unlisted_targets(stdout, stderr), Some((3, 2, "src/lib.rs, tests/custom.rs".into())));
        let every = "tests::unit_ok: test\n\n1 test, 0 benchmarks\n0 tests, 0 benchmarks\n0 tests, 0 benchmarks\n";
        assert_eq!(unlisted_targets(every, stderr), None);
        // edition 2024: a library's doctests may list in two sections.
        let merged = "1 test, 0 benchmarks\n0 tests, 0 benchmarks\n2 tests, 0 benchmarks\n1 test, 0 benchmarks\n";
        assert_eq!(unlisted_targets(merged, stderr), None);
    }

    #[test]
    fn the_users_cargo_test_command_lists() {
        let cmd: Vec<String> = ["cargo", "test", "-q", "--lib", "--", "--exact", "{unit}"].map(String::from).to_vec();
        assert_eq!(list_command(&cmd), ["cargo", "test", "--lib", "--", "--list"]);
        assert_eq!(list_command(&[]), ["cargo", "test", "--", "--list"]);
    }
}
