//! Unit durations of earlier runs, kept so a runner can hand out the slowest
//! units first (a run should not end waiting on one long unit started last).
//!
//! Timings are advice: a store that cannot be read or written is logged by
//! the caller and the run goes on. Each backend crate has a store: a local
//! file or a map in memory (`leasehold-mem`), a Redis hash (`leasehold-redis`).

use std::collections::HashMap;
use std::path::PathBuf;

use async_trait::async_trait;

use crate::errors::BoxError;

/// Where earlier runs' unit durations are kept.
///
/// # Contract
///
/// * `record` merges: a unit's newest duration replaces its older one, and
///   units not named keep theirs.
/// * `load` returns every known duration, in milliseconds, by unit name.
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
