//! A batch that crashed: which of its units run again alone.
//!
//! When a test kills its batch (a segfault, `os._exit`, a hang past the
//! time limit), the tool writes no report, or an unfinished one, and every
//! unit without a result would be requeued, spending its retry budget, and
//! run in a batch again, where the same test kills it again: the budget
//! ran out before any test ran alone, and the whole batch failed. So each
//! unit the crash left without a result runs once more on its own, at once
//! and within this budget of its own (once per crashed batch, never counted
//! as a retry): the tests that would have passed pass, and the test that
//! crashes fails alone, by the usual budgets.

use std::collections::{HashMap, HashSet};

use leasehold_core::UnitId;

use crate::verdicts::model::{UnitResult, UnitVerdict};

/// The units of a batch of `units` that run again alone: none for a unit
/// alone (it already ran alone); those the invocation's end left without a
/// result (killed by a signal, over its time limit); and, when the report
/// gave no unit a result at all (the tool died before writing it), every
/// unit without one. A unit missing from a report that names the others
/// is only missing: it is retried within the budgets.
pub fn rerun_alone(units: &[UnitId], verdicts: &HashMap<UnitId, UnitResult>) -> HashSet<UnitId> {
    if units.len() < 2 {
        return HashSet::new();
    }
    let unknown = |unit: &UnitId| match verdicts.get(unit).map(|r| &r.verdict) {
        None | Some(UnitVerdict::Failed { reason: "no_result", .. }) => Some(false),
        Some(UnitVerdict::Failed { reason: "signal" | "timeout", .. }) => Some(true),
        Some(_) => None,
    };
    let nothing_reported = units.iter().all(|u| unknown(u).is_some());
    units.iter().filter(|u| unknown(u).is_some_and(|killed| killed || nothing_reported)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<UnitId> {
        names.iter().map(|n| UnitId::new(*n).unwrap()).collect()
    }

    fn failed(reason: &'static str) -> UnitResult {
        UnitResult::from(UnitVerdict::Failed { reason, detail: String::new() })
    }

    #[test]
    fn only_units_a_crash_left_without_result_rerun_and_only_from_a_batch() {
        let units = ids(&["a", "b", "c"]);
        let of = |pairs: &[(&str, UnitResult)]| -> HashMap<UnitId, UnitResult> {
            pairs.iter().map(|(n, r)| (UnitId::new(*n).unwrap(), r.clone())).collect()
        };
        let crashed = of(&[("a", failed("no_result")), ("b", failed("no_result"))]);
        assert_eq!(rerun_alone(&units, &crashed).len(), 3, "no report: every unit");
        let missing = of(&[("a", UnitResult::from(UnitVerdict::Passed)), ("b", failed("test_failed"))]);
        assert!(rerun_alone(&units, &missing).is_empty(), "c is only missing from a report that names the others");
        let killed =
            of(&[("a", UnitResult::from(UnitVerdict::Passed)), ("b", failed("signal")), ("c", failed("signal"))]);
        assert_eq!(rerun_alone(&units, &killed), ids(&["b", "c"]).into_iter().collect());
        assert!(rerun_alone(&ids(&["a"]), &crashed).is_empty(), "a unit alone already ran alone");
    }
}
