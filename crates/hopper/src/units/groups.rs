//! Fleet-wide groups (`--group NAME=LIMIT:GLOB`): units that must not run
//! more than LIMIT at a time anywhere in the build, such as tests that share
//! one external database. The queue enforces the limit across every worker
//! (see "Groups" in the `UnitQueue` contract); here each unit is given the
//! group of the first rule whose glob (or exact id) matches it.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use leasehold_core::{UnitGroup, UnitSpec};

/// One `--group NAME=LIMIT:GLOB` rule.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRule {
    /// The group its units join.
    pub group: UnitGroup,
    /// The glob as written.
    pattern: String,
    /// The compiled glob (`*` crosses `/`, so `tests/db/**` is every test under it).
    glob: glob::Pattern,
}

impl GroupRule {
    /// Whether the unit `id` is in this rule's group.
    pub fn matches(&self, id: &str) -> bool {
        self.pattern == id || self.glob.matches(id)
    }
}

impl fmt::Display for GroupRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}:{}", self.group.name, self.group.limit, self.pattern)
    }
}

impl FromStr for GroupRule {
    type Err = String;

    fn from_str(rule: &str) -> Result<Self, String> {
        let shape = || format!("--group {rule:?}: write NAME=LIMIT:GLOB, for example 'pg=1:tests/db/**'");
        let (name, rest) = rule.split_once('=').ok_or_else(shape)?;
        let (limit, pattern) = rest.split_once(':').ok_or_else(shape)?;
        let name = name.trim();
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(format!("--group {rule:?}: the group needs a name before '='"));
        }
        let limit: NonZeroU32 = limit.trim().parse().map_err(|_| {
            format!("--group {rule:?}: the limit {limit:?} is not a whole number of at least 1 (units of the group at once)")
        })?;
        if pattern.is_empty() {
            return Err(format!("--group {rule:?}: give a glob of unit ids after ':'"));
        }
        let glob = glob::Pattern::new(pattern).map_err(|e| format!("--group {rule:?}: bad glob {pattern:?}: {e}"))?;
        Ok(Self { group: UnitGroup { name: name.to_owned(), limit }, pattern: pattern.to_owned(), glob })
    }
}

/// Puts each unit in the group of the first rule that matches it. Returns
/// the rules that matched no unit (most likely a typo, worth a warning).
pub fn assign<'r>(units: &mut [UnitSpec], rules: &'r [GroupRule]) -> Vec<&'r GroupRule> {
    let mut used = vec![false; rules.len()];
    for unit in units.iter_mut() {
        if let Some(i) = rules.iter().position(|rule| rule.matches(unit.id.as_str())) {
            unit.group = Some(rules[i].group.clone());
            used[i] = true;
        }
    }
    rules.iter().zip(used).filter(|(_, used)| !used).map(|(rule, _)| rule).collect()
}

#[cfg(test)]
mod tests {
    use leasehold_core::UnitId;

    use super::*;

    fn units(ids: &[&str]) -> Vec<UnitSpec> {
        ids.iter().map(|id| UnitSpec::new(UnitId::new(*id).unwrap(), "test")).collect()
    }

    #[test]
    fn rules_parse_and_reject_what_is_not_name_limit_glob() {
        let rule: GroupRule = "pg=1:tests/db/**".parse().unwrap();
        assert_eq!((rule.group.name.as_str(), rule.group.limit.get()), ("pg", 1));
        assert_eq!(rule.to_string(), "pg=1:tests/db/**");
        // The glob may hold ':' and '=' (a pytest id does).
        let rule: GroupRule = "s3=2:tests/a.py::test_x[k=v]".parse().unwrap();
        assert!(rule.matches("tests/a.py::test_x[k=v]"), "an exact id matches even where its brackets are a class");
        for (bad, says) in [
            ("pg", "NAME=LIMIT:GLOB"),
            ("pg=1", "NAME=LIMIT:GLOB"),
            ("=1:x", "needs a name"),
            ("pg=0:x", "at least 1"),
            ("pg=two:x", "not a whole number"),
            ("pg=1:", "give a glob"),
            ("pg=1:[", "bad glob"),
        ] {
            let error = bad.parse::<GroupRule>().unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_first_matching_rule_gives_the_group_and_unused_rules_are_returned() {
        let rules: Vec<GroupRule> = ["pg=1:tests/db/**", "all=3:tests/**", "typo=1:test/nothing/**"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        let mut list = units(&["tests/db/test_a.py::test_x", "tests/test_b.py::test_y", "other.py::test_z"]);
        let unused = assign(&mut list, &rules);
        let groups: Vec<Option<&str>> = list.iter().map(|u| u.group.as_ref().map(|g| g.name.as_str())).collect();
        assert_eq!(groups, [Some("pg"), Some("all"), None]);
        assert_eq!(unused.iter().map(|r| r.to_string()).collect::<Vec<_>>(), ["typo=1:test/nothing/**"]);
    }
}
