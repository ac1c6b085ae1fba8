//! JUnit names for a unit: `classname` is the file, module or Rust binary
//! it belongs to (CI pages group cases by it; `classname="test"` on every
//! case grouped nothing), and a failure that is an error of the test's
//! setup or teardown is an `<error>`, as the tools write it.

/// The file, module or binary of test `unit` (a unit id as discovery
/// listed it); `None` when the id says nothing of one (a file unit).
pub fn classname_of(unit: &str) -> Option<&str> {
    // nextest: `binary_id(=crate::it) & test(=tests::parse)`.
    if let Some(rest) = unit.strip_prefix("binary_id(=") {
        return rest.split_once(") & test(=").map(|(binary, _)| binary);
    }
    // A doctest: `src/lib.rs - add_one (line 5)`.
    if let Some((file, _)) = unit.split_once(" - ").filter(|(f, _)| f.ends_with(".rs")) {
        return Some(file);
    }
    // RSpec: `./spec/a_spec.rb[1:2]` or `spec/a_spec.rb:12`.
    if let Some(at) = unit.find(".rb") {
        return Some(&unit[..at + 3]);
    }
    // pytest (`tests/test_a.py::TestK::test_m[x]`: the file and class) and
    // Rust (`tests::parse`: the module). A parameter may hold `::`.
    let head = unit.split('[').next().unwrap_or(unit);
    head.rfind("::").map(|at| &unit[..at])
}

/// The property of every JUnit case that holds the unit's whole id (the
/// case's `name` is the test's own name, its `classname` the rest).
pub const UNIT_PROPERTY: &str = "hopper.unit";

/// The test's own name in `unit`: what follows its [`classname_of`]
/// (`test_m[x]`, `parse`, `add_one (line 5)`); the whole id when there is
/// no classname, or when the rest names nothing by itself (RSpec's `[1:2]`).
pub fn own_name(unit: &str) -> &str {
    if let Some(rest) = unit.strip_prefix("binary_id(=") {
        if let Some((_, test)) = rest.split_once(") & test(=") {
            return test.strip_suffix(')').unwrap_or(test);
        }
    }
    let Some(class) = classname_of(unit) else { return unit };
    let rest = &unit[class.len()..];
    rest.strip_prefix("::").or_else(|| rest.strip_prefix(" - ")).filter(|r| !r.is_empty()).unwrap_or(unit)
}

/// Whether a failure with `detail` is an error of the test's setup or
/// teardown (JUnit `<error>`), not a failed assertion (`<failure>`).
pub fn is_error(detail: &str) -> bool {
    ["error in setup", "error in teardown", "failed on setup with", "failed on teardown with"]
        .iter()
        .any(|p| detail.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tools_ids_give_their_file_module_or_binary() {
        assert_eq!(classname_of("tests/test_a.py::TestK::test_m[a::b]"), Some("tests/test_a.py::TestK"));
        assert_eq!(classname_of("tests/test_a.py::test_x"), Some("tests/test_a.py"));
        assert_eq!(classname_of("tests::parse"), Some("tests"));
        assert_eq!(classname_of("src/lib.rs - add_one (line 5)"), Some("src/lib.rs"));
        assert_eq!(classname_of("binary_id(=demo::it) & test(=tests::x)"), Some("demo::it"));
        assert_eq!(classname_of("./spec/a_spec.rb[1:2]"), Some("./spec/a_spec.rb"));
        assert_eq!(classname_of("run.sh"), None);
        assert_eq!(own_name("tests/test_a.py::TestK::test_m[a::b]"), "test_m[a::b]");
        assert_eq!(own_name("tests::parse"), "parse");
        assert_eq!(own_name("src/lib.rs - add_one (line 5)"), "add_one (line 5)");
        assert_eq!(own_name("binary_id(=demo::it) & test(=tests::x)"), "tests::x");
        assert_eq!(own_name("./spec/a_spec.rb[1:2]"), "./spec/a_spec.rb[1:2]");
        assert_eq!(own_name("run.sh"), "run.sh");
        assert!(is_error("error in setup: RuntimeError: boom"));
        assert!(!is_error("AssertionError: error in setup"));
    }
}
