//! Discovery: the test tool itself lists its tests, and none is lost.
//!
//! * Discovery runs the user's own command (the same program, interpreter and
//!   arguments, less the `{unit}` placeholder), so `--discover pytest --
//!   venv/bin/python -m pytest -q` collects with that python.
//! * Ids are taken whole from a machine-readable listing (pytest: node ids
//!   written by hopper's plugin; nextest and rspec: their JSON), with spaces,
//!   brackets, quotes and unicode.
//! * The number of tests is checked against the tool's own count (pytest's
//!   "N tests collected", nextest's `test-count`, libtest's "N tests" lines,
//!   rspec's `example_count`): a mismatch, or an id listed twice, is an error
//!   that says what was lost, and nothing runs.
//! * Programs are started with argv elements, never through a shell.

pub mod cargo_exact;
pub mod cargo_packages;
pub mod libtest;
pub mod libtest_output;
pub mod listing;
pub mod nextest;
pub mod nextest_groups;
pub mod paths;
pub mod pytest;
pub mod rspec;

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use leasehold_core::{UnitId, UnitSpec};

use crate::agent::plugins::Plugins;
use crate::errors::UnitsError;
pub use listing::{failed, run_first_installed, shown, without_placeholder, ListCommand, Listing};

/// A tool that can list its own tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoverKind {
    /// `cargo nextest list --message-format json`; one unit per test, named
    /// by the nextest filterset that selects exactly it,
    /// `binary_id(=<binary-id>) & test(=<test name>)`.
    Nextest,
    /// `cargo test -- --list`; one unit per test name: run one with
    /// `cargo test -- --exact {unit}`.
    CargoTest,
    /// pytest's collection (`--collect-only` with hopper's plugin); one unit
    /// per node id.
    Pytest,
    /// `rspec --dry-run --format json`; one unit per example id
    /// (`./spec/a_spec.rb[1:2]`).
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

    /// The kind label stored with each unit.
    pub fn unit_kind(self) -> &'static str {
        "test"
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

/// The result of a discovery: checked units, and for nextest how to run each
/// test binary directly.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// One unit per test, in the tool's order.
    pub units: Vec<UnitSpec>,
    /// nextest only: the binary, cwd and environment of every unit.
    pub nextest: Option<nextest::NextestTests>,
    /// Errors outside any test the listing met (pytest's files that did not
    /// collect, with `--continue-on-collection-errors`): each fails the build.
    pub outside_errors: Vec<crate::verdicts::outside::OutsideError>,
    /// cargo-test only: each test's target (see [`cargo_exact`]), when
    /// cargo's output named them.
    pub cargo_targets: Option<cargo_exact::CargoUnits>,
    /// pytest only: its rootdir from the directory it runs in, when not that
    /// one (see [`pytest::FromRootdir`]).
    pub pytest_rootdir: Option<String>,
}

/// Lists the tests of `kind` with the user's `command` (empty: the tool's
/// default program) and checks them against the tool's own count.
pub async fn discover(kind: DiscoverKind, command: &[String], plugins: &Plugins) -> Result<Discovered, UnitsError> {
    let source_name = format!("--discover {kind}");
    let mut outside_errors = Vec::new();
    let mut cargo_targets = None;
    let mut pytest_rootdir = None;
    let mut test_groups = Vec::new();
    let (shown, listing, nextest) = match kind {
        DiscoverKind::Pytest => {
            let (shown, found) = pytest::list(command, plugins).await?;
            outside_errors = found.errors;
            pytest_rootdir = found.rootdir;
            (shown, found.listing, None)
        }
        DiscoverKind::Nextest => {
            let (shown, listing, tests) = nextest::list(command).await?;
            // Each test is a unit: its group's limit must hold between units.
            if std::env::current_dir().ok().and_then(|cwd| nextest::nextest_test_groups(&cwd)).is_some() {
                test_groups = nextest_groups::read(command).await?;
            }
            (shown, listing, Some(tests))
        }
        DiscoverKind::CargoTest => {
            let (shown, listing, targets) = libtest::list(command).await?;
            cargo_targets = targets;
            (shown, listing, None)
        }
        DiscoverKind::Rspec => {
            let (shown, listing) = rspec::list(command, plugins).await?;
            (shown, listing, None)
        }
    };
    let mut units = checked_units(&shown, listing, kind.unit_kind(), &source_name)?;
    nextest_groups::assign(&mut units, &test_groups);
    Ok(Discovered { units, nextest, outside_errors, cargo_targets, pytest_rootdir })
}

/// The units of a listing, or the error that says what would be lost: ids
/// the tool counted but did not list, an id listed twice, or an id that is
/// not a valid unit.
pub fn checked_units(
    command: &str,
    listing: Listing,
    kind: &str,
    source_name: &str,
) -> Result<Vec<UnitSpec>, UnitsError> {
    let mut seen = HashSet::new();
    let mut duplicates = Vec::new();
    let mut units = Vec::with_capacity(listing.ids.len());
    for name in &listing.ids {
        if !seen.insert(name.as_str()) {
            duplicates.push(name.clone());
            continue;
        }
        let id = UnitId::new(name).map_err(|error| UnitsError::BadUnit {
            source_name: source_name.to_owned(),
            value: name.escape_debug().to_string(),
            error,
        })?;
        units.push(UnitSpec::new(id, kind));
    }
    if !duplicates.is_empty() {
        return Err(UnitsError::CountMismatch {
            command: command.to_owned(),
            counted: listing.counted,
            units: units.len(),
            lost: format!("listed more than once: {}", name_some(&duplicates)),
        });
    }
    if units.len() != listing.counted {
        let lost = if units.len() < listing.counted {
            format!("{} test(s) the tool counted have no id in its listing", listing.counted - units.len())
        } else {
            format!("the listing names {} more test(s) than the tool counted", units.len() - listing.counted)
        };
        return Err(UnitsError::CountMismatch {
            command: command.to_owned(),
            counted: listing.counted,
            units: units.len(),
            lost,
        });
    }
    if units.is_empty() {
        return Err(UnitsError::Empty { source_name: source_name.to_owned() });
    }
    Ok(units)
}

/// The first few of `names`, quoted, and how many more there are.
pub(crate) fn name_some<S: AsRef<str>>(names: &[S]) -> String {
    const SHOWN: usize = 5;
    let mut text = names.iter().take(SHOWN).map(|n| format!("{:?}", n.as_ref())).collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(ids: &[&str], counted: usize) -> Listing {
        Listing { ids: ids.iter().map(|s| s.to_string()).collect(), counted }
    }

    #[test]
    fn ids_are_kept_whole_and_counts_must_agree() {
        let ids = ["t.py::test[a b]", "t.py::test[c]d]", "t.py::test['q' é]"];
        let units = checked_units("x", listing(&ids, 3), "test", "s").unwrap();
        assert_eq!(units.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ids);

        let err = checked_units("pytest -q", listing(&ids, 4), "test", "s").unwrap_err();
        assert!(matches!(err, UnitsError::CountMismatch { counted: 4, units: 3, .. }), "{err}");
        assert!(err.to_string().contains("1 test(s) the tool counted have no id"), "{err}");

        let err = checked_units("x", listing(&["a", "b", "a"], 3), "test", "s").unwrap_err();
        assert!(err.to_string().contains("listed more than once: \"a\""), "{err}");

        assert!(matches!(checked_units("x", listing(&[], 0), "test", "s"), Err(UnitsError::Empty { .. })));
        assert!(matches!(checked_units("x", listing(&["a\nb"], 1), "test", "s"), Err(UnitsError::BadUnit { .. })));
    }
}
