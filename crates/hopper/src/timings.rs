//! Unit timings of earlier builds, used to hand out the slowest units first
//! (so the build does not end waiting on one long unit started last).
//!
//! Timings live in a local JSON file in memory mode and in Redis (long TTL)
//! in distributed mode; both sit behind [`TimingsStore`]. Timings are advice:
//! a store that cannot be read or written is logged and the run goes on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use leasehold_core::UnitSpec;
use serde::{Deserialize, Serialize};

use crate::errors::TimingsError;

/// Where earlier builds' unit durations are kept.
#[async_trait]
pub trait TimingsStore: Send + Sync {
    /// The known durations (milliseconds) by unit name.
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError>;

    /// Records the latest durations of these units.
    async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError>;
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
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TimingsFile {
    version: u32,
    units: HashMap<String, u64>,
}

/// Timings in a local JSON file (`{"version":1,"units":{"name":ms}}`),
/// written atomically (temporary file, then rename).
#[derive(Debug, Clone)]
pub struct FileTimings {
    path: PathBuf,
}

impl FileTimings {
    /// Timings kept at `path` (created on the first record).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn read(&self) -> Result<TimingsFile, TimingsError> {
        match tokio::fs::read(&self.path).await {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| TimingsError::Parse { path: self.path.clone(), source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TimingsFile::default()),
            Err(source) => Err(TimingsError::Io { path: self.path.clone(), source }),
        }
    }
}

#[async_trait]
impl TimingsStore for FileTimings {
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError> {
        Ok(self.read().await?.units)
    }

    async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError> {
        if timings.is_empty() {
            return Ok(());
        }
        // An unreadable old file is replaced rather than blocking new timings.
        let mut file = self.read().await.unwrap_or_default();
        file.version = 1;
        for (unit, ms) in timings {
            file.units.insert(unit.clone(), *ms);
        }
        let io = |source| TimingsError::Io { path: self.path.clone(), source };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(dir).await.map_err(io)?;
        }
        let bytes =
            serde_json::to_vec(&file).map_err(|source| TimingsError::Parse { path: self.path.clone(), source })?;
        let tmp = self.path.with_extension(format!("tmp.{}", std::process::id()));
        tokio::fs::write(&tmp, bytes).await.map_err(io)?;
        tokio::fs::rename(&tmp, &self.path).await.map_err(io)
    }
}

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

    #[tokio::test]
    async fn file_timings_round_trip_and_merge() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileTimings::new(dir.path().join("sub/timings.json"));
        assert!(store.load().await.unwrap().is_empty());
        store.record(&[("a".into(), 5), ("b".into(), 7)]).await.unwrap();
        store.record(&[("a".into(), 9)]).await.unwrap();
        let loaded = store.load().await.unwrap();
        assert_eq!(loaded.get("a"), Some(&9));
        assert_eq!(loaded.get("b"), Some(&7));
        std::fs::write(store.path(), "not json").unwrap();
        assert!(matches!(store.load().await, Err(TimingsError::Parse { .. })));
    }
}
