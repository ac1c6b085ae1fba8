//! Unit timings of earlier builds, used to hand out the slowest units first
//! (so the build does not end waiting on one long unit started last).
//!
//! The store is a [`leasehold_core::TimingsStore`] chosen by the wiring
//! module (a local file in memory mode, the Redis backend's hash in
//! distributed mode). Timings are advice: a store that cannot be read or
//! written is logged and the run goes on.

use std::collections::HashMap;

use leasehold_core::UnitSpec;

/// Orders units slowest first by earlier timings; a unit without a timing is
/// taken to last the median of the known ones. Ties keep the given order, so
/// with no timings at all the order is unchanged.
pub fn order_slowest_first(units: Vec<UnitSpec>, timings: &HashMap<String, u64>) -> Vec<UnitSpec> {
    let mut known: Vec<u64> = units.iter().filter_map(|u| timings.get(u.id.as_str()).copied()).collect();
    if known.is_empty() {
        return units;
    }
    known.sort_unstable();
    let median = known[known.len() / 2];
    let mut keyed: Vec<(u64, UnitSpec)> =
        units.into_iter().map(|u| (timings.get(u.id.as_str()).copied().unwrap_or(median), u)).collect();
    keyed.sort_by_key(|k| std::cmp::Reverse(k.0));
    keyed.into_iter().map(|(_, u)| u).collect()
}

#[cfg(test)]
mod tests {
    use leasehold_core::UnitId;

    use super::*;

    fn units(names: &[&str]) -> Vec<UnitSpec> {
        names.iter().map(|n| UnitSpec::new(UnitId::new(*n).unwrap(), "file")).collect()
    }

    fn names(units: &[UnitSpec]) -> Vec<&str> {
        units.iter().map(|u| u.id.as_str()).collect()
    }

    #[test]
    fn slowest_first_with_median_for_unknown() {
        let timings: HashMap<String, u64> =
            [("a", 10), ("b", 500), ("c", 100)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        // median of 10, 100, 500 is 100: the unknown `x` ties with `c` and keeps its place after it.
        let ordered = order_slowest_first(units(&["a", "c", "x", "b"]), &timings);
        assert_eq!(names(&ordered), vec!["b", "c", "x", "a"]);
        let untouched = order_slowest_first(units(&["z", "y"]), &timings);
        assert_eq!(names(&untouched), vec!["z", "y"]);
    }
}
