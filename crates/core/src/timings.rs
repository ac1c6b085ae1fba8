//! Unit durations of earlier runs, kept so a runner can hand out the slowest
//! units first (a run should not end waiting on one long unit started last),
//! and each unit's run of passes ([`PassStreak`]), so a runner can tell when a
//! quarantined unit has been reliable long enough to leave the quarantine.
//!
//! Timings are advice: a store that cannot be read or written is logged by
//! the caller and the run goes on. Each backend crate has a store: a local
//! file or a map in memory (`leasehold-mem`), a Redis hash (`leasehold-redis`).

use std::collections::HashMap;
use std::path::PathBuf;

use async_trait::async_trait;

use crate::errors::BoxError;

/// How many runs in a row, up to the newest one recorded, a unit passed.
///
/// It keeps the streak as it was before the newest run too, so that
/// recording the newest run again (a report made twice) replaces that run's
/// outcome instead of counting it twice: a streak is a pure function of the
/// sequence of distinct runs recorded, whatever the repeats.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PassStreak {
    /// Runs in a row, ending with `run`, in which the unit passed.
    pub passes: u32,
    /// The streak before `run` was counted.
    pub before: u32,
    /// The newest run counted (empty: none yet).
    pub run: String,
}

impl PassStreak {
    /// The streak once `run`'s outcome is counted: one more pass, or none
    /// after a failure. When `run` is the newest run already counted, its
    /// outcome is replaced.
    pub fn after(&self, run: &str, passed: bool) -> PassStreak {
        let before = if self.run == run && !self.run.is_empty() { self.before } else { self.passes };
        let passes = if passed { before.saturating_add(1) } else { 0 };
        PassStreak { passes, before, run: run.to_owned() }
    }
}

/// Where earlier runs' unit durations and pass streaks are kept.
///
/// # Contract
///
/// * `record` merges: a unit's newest duration replaces its older one, and
///   units not named keep theirs.
/// * `load` returns every known duration, in milliseconds, by unit name.
/// * `record_outcomes` applies [`PassStreak::after`] to each named unit's
///   streak (a unit never recorded starts from [`PassStreak::default`]);
///   units not named keep theirs. Per unit it is atomic: two callers
///   recording different runs of one unit both count.
/// * `load_streaks` returns every known streak, and `load` never includes
///   them (durations and streaks are apart).
#[async_trait]
pub trait TimingsStore: Send + Sync {
    /// The known durations (milliseconds) by unit name.
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError>;

    /// Records the latest durations of these units.
    async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError>;

    /// The known pass streaks by unit name.
    async fn load_streaks(&self) -> Result<HashMap<String, PassStreak>, TimingsError>;

    /// Counts `run`'s outcome (passed or not) of each of these units into
    /// its streak.
    async fn record_outcomes(&self, run: &str, outcomes: &[(String, bool)]) -> Result<(), TimingsError>;
}

/// Keeps nothing (timings disabled).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTimings;

#[async_trait]
impl TimingsStore for NoTimings {
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError> {
        Ok(HashMap::new())
    }

    async fn record(&self, _timings: &[(String, u64)]) -> Result<(), TimingsError> {
        Ok(())
    }

    async fn load_streaks(&self) -> Result<HashMap<String, PassStreak>, TimingsError> {
        Ok(HashMap::new())
    }

    async fn record_outcomes(&self, _run: &str, _outcomes: &[(String, bool)]) -> Result<(), TimingsError> {
        Ok(())
    }
}

/// Why timings could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TimingsError {
    /// A timings file could not be read or written.
    #[error("timings file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A timings file is not valid JSON of the expected shape.
    #[error("timings file {path} is not valid: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The backend's timings store failed (transport or server).
    #[error("timings store: {op} failed: {source}")]
    Backend {
        /// The operation (`load`, `record`).
        op: &'static str,
        /// The cause.
        #[source]
        source: BoxError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_counts_distinct_runs_and_a_repeated_run_replaces_its_outcome() {
        let start = PassStreak::default();
        let one = start.after("b1", true);
        assert_eq!(one.passes, 1);
        let two = one.after("b2", true);
        assert_eq!(two.passes, 2);
        // b2 recorded again: replaced, not counted twice, either way.
        assert_eq!(two.after("b2", true).passes, 2);
        assert_eq!(two.after("b2", false).passes, 0);
        assert_eq!(two.after("b2", false).after("b2", true).passes, 2);
        // A failure ends the streak.
        assert_eq!(two.after("b3", false).after("b4", true).passes, 1);
        // A unit never recorded under an empty run name starts at zero.
        assert_eq!(start.after("", true).passes, 1);
    }
}
