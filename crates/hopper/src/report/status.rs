//! `hopper status`: a build's progress, its workers and what they run, and
//! the deliveries in flight.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use leasehold_core::{PendingDelivery, Progress, RunId, RunLog, WorkerRecord};

use crate::errors::HopperError;

/// A snapshot of a build.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusSnapshot {
    /// The build.
    pub run: RunId,
    /// Its counters.
    pub progress: Progress,
    /// Its workers.
    pub workers: Vec<WorkerRecord>,
    /// Deliveries pending on workers.
    pub in_flight: Vec<PendingDelivery>,
}

impl StatusSnapshot {
    /// Reads the snapshot; `None` when the build does not exist.
    pub async fn load(queue: &dyn RunLog, run: &RunId) -> Result<Option<Self>, HopperError> {
        let Some(progress) = queue.progress(run).await? else {
            return Ok(None);
        };
        let workers = queue.workers(run).await?;
        let in_flight = queue.pending(run).await?;
        Ok(Some(Self { run: run.clone(), progress, workers, in_flight }))
    }

    /// The snapshot as text; `now_ms` is the local clock (for "seen ... ago").
    pub fn render(&self, now_ms: u64) -> String {
        let p = &self.progress;
        let mut out = String::new();
        let state = if p.is_complete() { "complete" } else { "running" };
        let _ = writeln!(
            out,
            "build {}: {state}: {}/{} finalized, {} in flight, {} queued, {} unit(s) requeued",
            self.run, p.finalized, p.total, p.in_flight, p.queued, p.requeued_units
        );
        let _ = writeln!(out, "workers ({}):", self.workers.len());
        for w in &self.workers {
            let ago = now_ms.saturating_sub(w.last_seen_ms) as f64 / 1000.0;
            let current = w.current_unit.as_ref().map(|u| u.to_string()).unwrap_or_else(|| "-".into());
            let _ = writeln!(out, "  {}  seen {ago:.1}s ago  processed {}  current {current}", w.worker, w.processed);
        }
        let _ = writeln!(out, "in flight ({}):", self.in_flight.len());
        for d in &self.in_flight {
            let _ = writeln!(
                out,
                "  {} on {} (idle {:.1}s, delivery {}, {})",
                d.unit,
                d.worker,
                d.idle_ms as f64 / 1000.0,
                d.delivery_count,
                d.stream
            );
        }
        out
    }
}

/// Milliseconds since the Unix epoch on the local clock.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
