//! nextest's test groups (`[test-groups]` in `.config/nextest.toml`, and the
//! profile overrides that put tests in them), read with `cargo nextest
//! show-config test-groups`, so that each test keeps its group's limit under
//! hopper, where every test is a unit of its own.
//!
//! A nextest group limits the tests running at once in one nextest process,
//! on one machine. Here it becomes a hopper group (see [`super::super::groups`]),
//! whose limit holds across the whole build: every worker together. That is
//! never looser than nextest's, so tests that share a database or a port
//! keep off each other on any machine.
//!
//! A group of `num-cpus` threads is left out: its limit would depend on the
//! machine that read it, and workers that disagree on a unit's group
//! disagree on the build's unit list (the second is refused). A worker
//! runs at most its `-j` slots at once anyway.

use std::collections::HashMap;
use std::num::NonZeroU32;

use leasehold_core::{UnitGroup, UnitSpec};

use super::listing::{failed, run_first_installed, ListCommand};
use super::nextest::{filterset, list_command};
use crate::errors::{ListingError, UnitsError};

/// A group and the unit ids of its tests.
pub type TestGroup = (UnitGroup, Vec<String>);

/// How a group's name reads in hopper, apart from the `--group` ones.
const NAME_PREFIX: &str = "nextest:";

/// `cargo nextest show-config test-groups` with the listing's options (its
/// packages, features, profile and filters).
pub fn show_config_command(command: &[String]) -> Vec<String> {
    let mut argv = list_command(command);
    // The listing ends with `--message-format json`, which show-config lacks.
    argv.truncate(argv.len().saturating_sub(2));
    let nextest = argv.iter().position(|a| a == "nextest").unwrap_or(0);
    if let Some(list) = argv.iter().skip(nextest).position(|a| a == "list").map(|at| nextest + at) {
        argv.splice(list..=list, ["show-config".to_owned(), "test-groups".to_owned()]);
    }
    argv
}

/// Reads the groups and their tests from the user's nextest command.
pub async fn read(command: &[String]) -> Result<Vec<TestGroup>, UnitsError> {
    let argv = show_config_command(command);
    let (shown, output) = run_first_installed(&[ListCommand { argv, env: Vec::new() }]).await?;
    if !output.status.success() {
        return Err(failed(shown, &output));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let (groups, per_machine) = parse(&text)
        .map_err(|detail| UnitsError::DiscoverParse { command: shown, source: ListingError::Inconsistent(detail) })?;
    if !per_machine.is_empty() {
        tracing::warn!(
            groups = per_machine.join(", "),
            "nextest test groups of num-cpus threads are left out (a limit per machine; each worker runs at most \
             its -j slots at once): give one with --group NAME=LIMIT:GLOB if the whole build must keep to it"
        );
    }
    Ok(groups)
}

/// Parses show-config's text: a `group: NAME (max threads = N)` line per
/// group, then for each override that feeds it a `  * override ...` line,
/// each binary id (six spaces in, ending in `:`) and its tests (ten spaces
/// in). Also gives the names of the groups of `num-cpus` threads, left out.
pub fn parse(text: &str) -> Result<(Vec<TestGroup>, Vec<&str>), String> {
    let mut groups: Vec<TestGroup> = Vec::new();
    let mut per_machine = Vec::new();
    // The group being read (None: one left out), and its binary.
    let mut current: Option<usize> = None;
    let mut binary: Option<&str> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("group: ") {
            let (name, limit) = rest
                .strip_suffix(')')
                .and_then(|r| r.rsplit_once(" (max threads = "))
                .ok_or_else(|| format!("a group line without its limit: {line:?}"))?;
            current = None;
            binary = None;
            if limit == "num-cpus" {
                per_machine.push(name);
                continue;
            }
            let limit: NonZeroU32 = limit
                .parse()
                .map_err(|_| format!("group {name}: max threads {limit:?} is not a whole number from 1"))?;
            groups.push((UnitGroup { name: format!("{NAME_PREFIX}{name}"), limit }, Vec::new()));
            current = Some(groups.len() - 1);
        } else if let Some(test) = line.strip_prefix("          ") {
            let Some(binary) = binary else {
                return Err(format!("a test outside any group's binary: {line:?}"));
            };
            if let Some(at) = current {
                groups[at].1.push(filterset(binary, test));
            }
        } else if let Some(id) = line.strip_prefix("      ").and_then(|l| l.strip_suffix(':')) {
            binary = Some(id);
        } else if line.starts_with("  * ") {
            binary = None;
        }
    }
    Ok((groups, per_machine))
}

/// Puts each unit listed in a group in it.
pub fn assign(units: &mut [UnitSpec], groups: &[TestGroup]) {
    let of: HashMap<&str, &UnitGroup> =
        groups.iter().flat_map(|(group, ids)| ids.iter().map(move |id| (id.as_str(), group))).collect();
    for unit in units {
        if let Some(group) = of.get(unit.id.as_str()) {
            unit.group = Some((*group).clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::UnitId;

    use super::*;

    const SHOWN: &str = "group: pair (max threads = 2)
  * override for default profile with filter 'test(/b.txt/) | test(=ui)':
      datatest-stable::example:
          test_artifact::b.txt
      datatest-stable::integration:
          ui
group: wide (max threads = num-cpus)
  * override for default profile with filter 'test(/dir/)':
      datatest-stable:
          data_source::tests::nested_dirs
";

    #[test]
    fn groups_and_their_tests_are_read_as_unit_ids() {
        let (groups, per_machine) = parse(SHOWN).unwrap();
        let names: Vec<(&str, u32, &[String])> =
            groups.iter().map(|(g, ids)| (g.name.as_str(), g.limit.get(), ids.as_slice())).collect();
        assert_eq!(
            names,
            [(
                "nextest:pair",
                2,
                &[
                    filterset("datatest-stable::example", "test_artifact::b.txt"),
                    filterset("datatest-stable::integration", "ui")
                ][..]
            )]
        );
        // A limit per machine would make workers of other machines disagree.
        assert_eq!(per_machine, ["wide"]);
        let bad = parse("group: x (max threads = lots)\n").unwrap_err();
        assert!(bad.contains("\"lots\" is not a whole number"), "{bad}");
    }

    #[test]
    fn listed_units_join_their_groups() {
        let (groups, _) = parse(SHOWN).unwrap();
        let ui = filterset("datatest-stable::integration", "ui");
        let mut units: Vec<UnitSpec> =
            [ui.as_str(), "other"].iter().map(|id| UnitSpec::new(UnitId::new(*id).unwrap(), "test")).collect();
        assign(&mut units, &groups);
        assert_eq!(units[0].group.as_ref().map(|g| g.name.as_str()), Some("nextest:pair"));
        assert_eq!(units[1].group, None);
    }

    #[test]
    fn show_config_takes_the_listings_options() {
        let command: Vec<String> =
            ["cargo", "nextest", "run", "--profile", "ci", "-p", "a", "--no-fail-fast"].map(String::from).to_vec();
        assert_eq!(
            show_config_command(&command),
            ["cargo", "nextest", "show-config", "test-groups", "--profile", "ci", "-p", "a"]
        );
        assert_eq!(show_config_command(&[]), ["cargo", "nextest", "show-config", "test-groups"]);
    }
}
