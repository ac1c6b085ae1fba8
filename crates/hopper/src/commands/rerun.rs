//! `hopper run --rerun-failed BUILD`: run again only the units that failed or
//! were flaky in an earlier build, read from that build's event log in the
//! queue (the same fold `hopper report` makes of it).
//!
//! The rerun is a build of its own: the queue fixes a build's unit list when
//! the build starts, so the earlier build cannot take a shorter one. Its id
//! is the one hopper resolves for any build (`--build`, `HOPPER_BUILD`, the
//! CI's) when that differs from BUILD (a GitHub re-run has a new attempt
//! number), else `BUILD-rerun` (a CI retry that keeps its build id, or the
//! same `--build` given again). Every worker of the rerun reads the same
//! finished build, so all of them make the same unit list and join one run.
//!
//! Only a shared queue keeps a build past its process: a `mem://` build is
//! gone when its `hopper run` ends, and hopper stores no outcomes on disk
//! (the timings file holds durations only).

use std::collections::HashSet;

use leasehold_core::{RunId, RunLog, UnitId, UnitSpec};

use crate::errors::HopperError;
use crate::report::RunReport;

/// What the rerun's build id gets when hopper's own id is the earlier build's.
pub const RERUN_SUFFIX: &str = "-rerun";

/// The units an earlier build left to rerun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rerun {
    /// The earlier build.
    pub from: RunId,
    /// Its failed units, in its order.
    pub failed: Vec<UnitId>,
    /// Its flaky units (failed, then passed on a retry), in its order.
    pub flaky: Vec<UnitId>,
}

impl Rerun {
    /// Reads the finished build `from`: its failed and flaky units. Fails,
    /// naming the build and what to do, when the queue has no such build
    /// (never run, or expired) or when it has units left to run.
    pub(super) async fn read(queue: &dyn RunLog, from: &RunId) -> Result<Self, HopperError> {
        let report =
            RunReport::load(queue, from).await?.ok_or_else(|| HopperError::RerunBuildMissing { run: from.clone() })?;
        let unfinished = report.unfinished();
        if !unfinished.is_empty() {
            return Err(HopperError::RerunBuildUnfinished { run: from.clone(), unfinished });
        }
        Ok(Self {
            from: from.clone(),
            failed: report.failed().map(|u| u.unit.clone()).collect(),
            flaky: report.flaky().map(|u| u.unit.clone()).collect(),
        })
    }

    /// Whether the earlier build left nothing to rerun.
    pub(super) fn is_empty(&self) -> bool {
        self.failed.is_empty() && self.flaky.is_empty()
    }

    /// The units of `listed` (this checkout's listing) that the earlier build
    /// failed or found flaky, in the listing's order, and those of its units
    /// the listing no longer has (renamed or deleted since).
    pub(super) fn select(&self, listed: Vec<UnitSpec>) -> (Vec<UnitSpec>, Vec<UnitId>) {
        let wanted: HashSet<&UnitId> = self.failed.iter().chain(&self.flaky).collect();
        let kept: Vec<UnitSpec> = listed.into_iter().filter(|u| wanted.contains(&u.id)).collect();
        let found: HashSet<&UnitId> = kept.iter().map(|u| &u.id).collect();
        let gone = self.failed.iter().chain(&self.flaky).filter(|u| !found.contains(u)).cloned().collect();
        (kept, gone)
    }
}

/// The rerun's build id: `resolved` (hopper's id for this build, if any)
/// when it is not `from`, else `from` with [`RERUN_SUFFIX`].
pub(super) fn rerun_build(resolved: Option<RunId>, from: &RunId) -> Result<RunId, HopperError> {
    match resolved {
        Some(id) if id != *from => Ok(id),
        _ => RunId::new(format!("{from}{RERUN_SUFFIX}"))
            .map_err(|source| HopperError::BadId { what: "rerun build id", source }),
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::{Budgets, RunSpec, UnitQueue};

    use super::*;

    fn id(name: &str) -> UnitId {
        UnitId::new(name).unwrap()
    }

    fn run(name: &str) -> RunId {
        RunId::new(name).unwrap()
    }

    #[test]
    fn the_rerun_has_its_own_build_id() {
        let from = run("gh-7-1");
        assert_eq!(rerun_build(Some(run("gh-7-2")), &from).unwrap(), run("gh-7-2"));
        assert_eq!(rerun_build(Some(from.clone()), &from).unwrap(), run("gh-7-1-rerun"));
        assert_eq!(rerun_build(None, &from).unwrap(), run("gh-7-1-rerun"));
    }

    #[test]
    fn select_keeps_the_listing_order_and_names_the_units_gone() {
        let rerun = Rerun { from: run("b"), failed: vec![id("c"), id("gone")], flaky: vec![id("a")] };
        let listed = ["a", "b", "c", "d"].map(|n| UnitSpec::new(id(n), "file")).to_vec();
        let (kept, gone) = rerun.select(listed);
        assert_eq!(kept.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(gone, [id("gone")]);
    }

    #[tokio::test]
    async fn a_missing_or_unfinished_build_is_refused_by_name() {
        let queue = leasehold_mem::MemoryStore::new();
        let missing = Rerun::read(&queue, &run("never")).await.unwrap_err();
        assert!(matches!(missing, HopperError::RerunBuildMissing { .. }), "{missing}");
        assert!(missing.to_string().contains("build never"), "{missing}");

        let b = run("b1");
        let units = ["ok", "bad"].map(|n| UnitSpec::new(id(n), "file")).to_vec();
        let spec =
            RunSpec { run: b.clone(), units, budgets: Budgets::default(), ttl: std::time::Duration::from_secs(60) };
        queue.initialize(&spec).await.unwrap();
        let unfinished = Rerun::read(&queue, &b).await.unwrap_err();
        assert!(matches!(unfinished, HopperError::RerunBuildUnfinished { .. }), "{unfinished}");
        assert!(unfinished.to_string().contains("ok, bad"), "{unfinished}");
    }
}
