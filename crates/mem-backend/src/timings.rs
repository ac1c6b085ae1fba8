//! Timings stores of a single machine: [`FileTimings`], a local JSON file
//! that outlives the process (the memory mode's default), and the
//! [`MemoryStore`]'s own maps, which live as long as the store. Both keep
//! durations and pass streaks apart.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use leasehold_core::{PassStreak, TimingsError, TimingsStore};
use serde::{Deserialize, Serialize};

use crate::MemoryStore;

#[async_trait]
impl TimingsStore for MemoryStore {
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError> {
        Ok(self.inner.timings.lock().clone())
    }

    async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError> {
        self.inner.timings.lock().extend(timings.iter().cloned());
        Ok(())
    }

    async fn load_streaks(&self) -> Result<HashMap<String, PassStreak>, TimingsError> {
        Ok(self.inner.streaks.lock().clone())
    }

    async fn record_outcomes(&self, run: &str, outcomes: &[(String, bool)]) -> Result<(), TimingsError> {
        count_outcomes(&mut self.inner.streaks.lock(), run, outcomes);
        Ok(())
    }
}

/// Applies [`PassStreak::after`] to each unit's streak in `streaks`.
fn count_outcomes(streaks: &mut HashMap<String, PassStreak>, run: &str, outcomes: &[(String, bool)]) {
    for (unit, passed) in outcomes {
        let streak = streaks.entry(unit.clone()).or_default();
        *streak = streak.after(run, *passed);
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct TimingsFile {
    version: u32,
    units: HashMap<String, u64>,
    /// Absent from files written before streaks were kept; older readers
    /// ignore it (the version stays 1: the change only adds).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    streaks: HashMap<String, PassStreak>,
}

/// Timings in a local JSON file
/// (`{"version":1,"units":{"name":ms},"streaks":{"name":{"passes":n,...}}}`),
/// replaced atomically on each record (a temporary file in the same
/// directory, persisted over the old one), so a reader never sees half a file.
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

    fn read(&self) -> Result<TimingsFile, TimingsError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| TimingsError::Parse { path: self.path.clone(), source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TimingsFile::default()),
            Err(source) => Err(TimingsError::Io { path: self.path.clone(), source }),
        }
    }

    /// Reads the file, changes it with `change` and writes it back.
    fn update(&self, change: impl FnOnce(&mut TimingsFile)) -> Result<(), TimingsError> {
        // An unreadable old file is replaced rather than blocking new timings.
        let mut file = self.read().unwrap_or_default();
        file.version = 1;
        change(&mut file);
        let io = |source| TimingsError::Io { path: self.path.clone(), source };
        let dir = match self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(io)?;
                dir
            }
            None => Path::new("."),
        };
        let bytes =
            serde_json::to_vec(&file).map_err(|source| TimingsError::Parse { path: self.path.clone(), source })?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
        tmp.write_all(&bytes).map_err(io)?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        Ok(())
    }
}

#[async_trait]
impl TimingsStore for FileTimings {
    async fn load(&self) -> Result<HashMap<String, u64>, TimingsError> {
        let this = self.clone();
        blocking(move || this.read().map(|f| f.units)).await
    }

    async fn record(&self, timings: &[(String, u64)]) -> Result<(), TimingsError> {
        if timings.is_empty() {
            return Ok(());
        }
        let (this, timings) = (self.clone(), timings.to_vec());
        blocking(move || this.update(|file| file.units.extend(timings))).await
    }

    async fn load_streaks(&self) -> Result<HashMap<String, PassStreak>, TimingsError> {
        let this = self.clone();
        blocking(move || this.read().map(|f| f.streaks)).await
    }

    async fn record_outcomes(&self, run: &str, outcomes: &[(String, bool)]) -> Result<(), TimingsError> {
        if outcomes.is_empty() {
            return Ok(());
        }
        let (this, run, outcomes) = (self.clone(), run.to_owned(), outcomes.to_vec());
        blocking(move || this.update(|file| count_outcomes(&mut file.streaks, &run, &outcomes))).await
    }
}

/// Runs file I/O off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TimingsError> + Send + 'static,
) -> Result<T, TimingsError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| TimingsError::Backend { op: "file I/O", source: Box::new(e) })?
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("sub")).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind: {leftovers:?}");
        std::fs::write(store.path(), "not json").unwrap();
        assert!(matches!(store.load().await, Err(TimingsError::Parse { .. })));
        // A broken file is replaced by the next record.
        store.record(&[("c".into(), 1)]).await.unwrap();
        assert_eq!(store.load().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn both_stores_keep_the_contract() {
        use leasehold_core::conformance::timings::{timings_merge_and_round_trip, timings_pass_streaks};
        timings_merge_and_round_trip(&MemoryStore::new()).await;
        timings_pass_streaks(&MemoryStore::new()).await;
        let dir = tempfile::tempdir().unwrap();
        timings_merge_and_round_trip(&FileTimings::new(dir.path().join("t.json"))).await;
        timings_pass_streaks(&FileTimings::new(dir.path().join("s.json"))).await;
    }

    /// A file written before streaks were kept is read as it was, and one
    /// with streaks keeps the shape older readers read (`version` 1, `units`).
    #[tokio::test]
    async fn files_without_streaks_are_read_and_files_with_them_keep_the_old_shape() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileTimings::new(dir.path().join("t.json"));
        std::fs::write(store.path(), r#"{"version":1,"units":{"a":5}}"#).unwrap();
        assert_eq!(store.load().await.unwrap().get("a"), Some(&5));
        assert!(store.load_streaks().await.unwrap().is_empty());
        store.record_outcomes("b1", &[("a".into(), true)]).await.unwrap();
        let written: serde_json::Value = serde_json::from_slice(&std::fs::read(store.path()).unwrap()).unwrap();
        assert_eq!(written["version"], 1);
        assert_eq!(written["units"]["a"], 5);
        assert_eq!(written["streaks"]["a"]["passes"], 1);
    }
}
