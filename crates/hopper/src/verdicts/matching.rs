//! Which reported test cases belong to which unit.
//!
//! A tool names a test in its report differently from how it is selected on
//! the command line: pytest's JUnit splits `tests/test_a.py::TestK::test_m[x]`
//! into `classname="tests.test_a.TestK" name="test_m[x]"`, nextest's JUnit
//! gives the binary id as `classname`, rspec's JSON gives `./spec/a_spec.rb`.
//! Each case therefore answers to several ids (its own forms), each unit is
//! looked up by its own forms, and a unit that is a container (a file, a
//! module, a parametrized test without its parameter) owns every case whose id
//! continues it after a separator (`.`, `::`, `[`, `/`).

use std::collections::HashMap;

use leasehold_core::UnitId;

/// Separators after which a longer id still belongs to a shorter one.
const SEPARATORS: &[&str] = &["::", ".", "[", "/", "$", ":"];

/// Looks up the cases of a report by unit.
#[derive(Debug, Default)]
pub struct CaseIndex {
    /// Every id (and every container prefix of one) to the cases it names.
    by_id: HashMap<String, Vec<usize>>,
}

impl CaseIndex {
    /// Indexes cases by their ids: `ids[i]` are the ids of case `i`.
    pub fn new(ids: impl IntoIterator<Item = Vec<String>>) -> Self {
        let mut by_id: HashMap<String, Vec<usize>> = HashMap::new();
        for (case, case_ids) in ids.into_iter().enumerate() {
            for id in case_ids {
                let id = normalise(&id).to_owned();
                for prefix in container_prefixes(&id) {
                    push_once(by_id.entry(prefix.to_owned()).or_default(), case);
                }
                push_once(by_id.entry(id).or_default(), case);
            }
        }
        Self { by_id }
    }

    /// The cases that belong to `unit`, in report order.
    pub fn cases_of(&self, unit: &UnitId) -> Vec<usize> {
        let mut cases: Vec<usize> =
            unit_forms(unit.as_str()).iter().filter_map(|form| self.by_id.get(form)).flatten().copied().collect();
        cases.sort_unstable();
        cases.dedup();
        cases
    }
}

/// Cases are indexed in increasing order, so a repeat is always the last one.
fn push_once(cases: &mut Vec<usize>, case: usize) {
    if cases.last() != Some(&case) {
        cases.push(case);
    }
}

fn normalise(id: &str) -> &str {
    id.strip_prefix("./").unwrap_or(id)
}

/// Every prefix of `id` that ends just before a separator.
fn container_prefixes(id: &str) -> impl Iterator<Item = &str> {
    id.char_indices()
        .filter(move |(at, _)| SEPARATORS.iter().any(|s| id[*at..].starts_with(s)))
        .map(move |(at, _)| &id[..at])
        .filter(|prefix| !prefix.is_empty())
}

/// The ids a unit may appear under in a report.
fn unit_forms(unit: &str) -> Vec<String> {
    let unit = normalise(unit);
    let mut forms = vec![unit.to_owned()];
    if let Some(mangled) = pytest_junit_id(unit) {
        forms.push(mangled);
    }
    if let Some((binary, test)) = nextest_filterset(unit) {
        forms.push(format!("{binary}::{test}"));
    }
    forms
}

/// pytest's JUnit form of a node id, `classname.name`, as its
/// `mangle_test_address` makes it: the path's `/` become `.`, `.py` is
/// dropped, `::` become `.`, and the parameters are kept as they are.
pub fn pytest_junit_id(node_id: &str) -> Option<String> {
    let (path, params) = match node_id.find('[') {
        Some(at) => node_id.split_at(at),
        None => (node_id, ""),
    };
    let mut names = path.split("::");
    let file = names.next()?;
    if !file.ends_with(".py") {
        return None;
    }
    let module = file.strip_suffix(".py").unwrap_or(file).replace('/', ".");
    let mut out = module;
    for name in names {
        out.push('.');
        out.push_str(name);
    }
    out.push_str(params);
    Some(out)
}

/// The binary id and test name of a nextest unit
/// `binary_id(=<binary>) & test(=<test>)`.
pub fn nextest_filterset(unit: &str) -> Option<(&str, &str)> {
    let rest = unit.strip_prefix("binary_id(=")?;
    let (binary, rest) = rest.split_once(") & test(=")?;
    let test = rest.strip_suffix(')')?;
    Some((binary, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str) -> UnitId {
        UnitId::new(name).unwrap()
    }

    #[test]
    fn pytest_node_ids_take_junit_form() {
        assert_eq!(pytest_junit_id("tests/test_a.py::TestK::test_m[a b]").unwrap(), "tests.test_a.TestK.test_m[a b]");
        assert_eq!(pytest_junit_id("test_a.py::test_p[x::y.py]").unwrap(), "test_a.test_p[x::y.py]");
        assert_eq!(pytest_junit_id("tests/test_a.py").unwrap(), "tests.test_a");
        assert_eq!(pytest_junit_id("spec/a_spec.rb"), None);
    }

    #[test]
    fn units_find_their_cases_exactly_or_as_containers() {
        let index = CaseIndex::new(vec![
            vec!["test_ok".into(), "tests.test_a.test_ok".into()],
            vec!["test_p[a b]".into(), "tests.test_a.test_p[a b]".into()],
            vec!["test_x".into(), "tests.test_ab.test_x".into()],
            vec!["./spec/a_spec.rb".into(), "spec/a_spec.rb[1:1]".into()],
        ]);
        assert_eq!(index.cases_of(&unit("tests/test_a.py::test_ok")), vec![0]);
        assert_eq!(index.cases_of(&unit("tests/test_a.py::test_p[a b]")), vec![1]);
        assert_eq!(index.cases_of(&unit("tests/test_a.py::test_p")), vec![1]);
        assert_eq!(index.cases_of(&unit("tests/test_a.py")), vec![0, 1], "a file owns its cases, not test_ab's");
        assert_eq!(index.cases_of(&unit("spec/a_spec.rb")), vec![3]);
        assert!(index.cases_of(&unit("tests/test_a.py::test_gone")).is_empty());
    }

    #[test]
    fn nextest_units_match_binary_and_test() {
        let index = CaseIndex::new(vec![vec!["it::works".into(), "demo::it::works".into()]]);
        assert_eq!(nextest_filterset("binary_id(=demo) & test(=it::works)"), Some(("demo", "it::works")));
        assert_eq!(index.cases_of(&unit("binary_id(=demo) & test(=it::works)")), vec![0]);
    }
}
