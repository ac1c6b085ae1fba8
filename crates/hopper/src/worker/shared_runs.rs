//! Units that one invocation runs better together than one by one, run
//! together once per worker and judged each by its own part of the output.
//!
//! cargo's doctests are the case: `cargo test --doc NAME` has rustdoc read
//! the whole library and build its doctests again for every name (either
//! 1.19's 61 doctests took 4 minutes one by one, 5 seconds together). The
//! first such unit a worker runs runs all of its kind ([`SharedRuns::key`]);
//! each later one of that key takes its verdict from that run's output
//! instead of running again. Only a first delivery does: a retry runs alone,
//! so a failure seen in the shared run is checked on its own, and a unit
//! that passes then is flaky as always. A shared run that says nothing
//! usable (it did not exit, or printed no results, or not this unit's) is
//! not kept, and every unit of its key then runs alone, as it would have
//! without sharing. `--unit-timeout` bounds the shared run too: one that
//! runs past it is such a run. Each unit's duration is its share of the
//! run's (the run's time over the tests it ran).

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_core::{Delivery, UnitId};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::exec::process::{run_process_in, ProcessLimits, ProcessResult, Termination};
use crate::worker::launch::Invocation;

/// The most output a shared run keeps (every unit's verdict is read from it).
const SHARED_TAIL_BYTES: usize = 16 * 1024 * 1024;

/// Which units run together, and how.
pub trait SharedRuns: Send + Sync {
    /// The run `unit` belongs to, or `None` for a unit that runs alone.
    fn key(&self, unit: &UnitId) -> Option<String>;
    /// The invocation that runs every unit of `key`.
    fn invocation_of(&self, key: &str) -> Invocation;
    /// How many units `result` (a run of a whole key) ran, when it shows
    /// it ran them as it should; `None` when it is no use to any of them.
    fn ran(&self, result: &ProcessResult) -> Option<u32>;
    /// Whether `result` holds `unit`'s own verdict.
    fn covers(&self, unit: &UnitId, result: &ProcessResult) -> bool;
}

/// What became of a key's shared run on this worker.
#[derive(Clone)]
enum Shared {
    /// Its result, each unit's duration its share of the run's.
    Ran(Arc<ProcessResult>),
    /// It told nothing: its units run alone.
    Alone,
}

/// One worker's shared runs, by key.
pub struct SharedRunMemo {
    runs: Arc<dyn SharedRuns>,
    /// One lock per key, held while its run runs: the worker's other slots
    /// wait for it rather than start it again.
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Shared>>>>>,
}

/// How a unit's invocation is to go.
pub enum Plan {
    /// Its verdict is in the result of a run of its whole key.
    Shared {
        /// That run's result, its duration each unit's share.
        result: Arc<ProcessResult>,
        /// Whether this call ran it (or another slot's did, earlier).
        ran_now: bool,
    },
    /// It runs alone, as any unit.
    Alone,
}

impl SharedRunMemo {
    /// A memo of `runs`' shared runs.
    pub fn new(runs: Arc<dyn SharedRuns>) -> Self {
        Self { runs, keys: Mutex::new(HashMap::new()) }
    }

    /// For `delivery`: a shared run's result (running it first, once per
    /// key, when no slot has), or [`Plan::Alone`].
    pub async fn plan(
        &self,
        delivery: &Delivery,
        env: &[(String, String)],
        limits: ProcessLimits,
        stop: &CancellationToken,
    ) -> Plan {
        // A retry is checked on its own (a reclaimed first try has no verdict yet).
        if delivery.retry_index > 0 {
            return Plan::Alone;
        }
        let Some(key) = self.runs.key(&delivery.unit) else { return Plan::Alone };
        let lock = self.keys.lock().entry(key.clone()).or_default().clone();
        let mut state = lock.lock().await;
        let (shared, ran_now) = match state.clone() {
            Some(shared) => (shared, false),
            None => {
                let result = self.run(&key, env, limits, stop).await;
                if result.termination == Termination::Stopped {
                    return Plan::Alone; // Not kept: the next unit runs it again.
                }
                let shared = match self.runs.ran(&result) {
                    Some(count) if count > 1 => {
                        let duration = result.duration / count;
                        Shared::Ran(Arc::new(ProcessResult { duration, ..result }))
                    }
                    _ => {
                        tracing::debug!(key, "the shared run told nothing: its units run alone");
                        Shared::Alone
                    }
                };
                *state = Some(shared.clone());
                (shared, true)
            }
        };
        match shared {
            Shared::Ran(result) if self.runs.covers(&delivery.unit, &result) => Plan::Shared { result, ran_now },
            _ => Plan::Alone,
        }
    }

    async fn run(
        &self,
        key: &str,
        env: &[(String, String)],
        limits: ProcessLimits,
        stop: &CancellationToken,
    ) -> ProcessResult {
        let invocation = self.runs.invocation_of(key);
        let mut env = env.to_vec();
        env.extend(invocation.env);
        let limits = ProcessLimits { tail_bytes: limits.tail_bytes.max(SHARED_TAIL_BYTES), ..limits };
        tracing::debug!(key, argv = ?invocation.argv, "running the units of one key together");
        run_process_in(invocation.cwd.as_deref(), &invocation.argv, &env, limits, stop).await
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use leasehold_core::{DeliveryOrigin, EntryId, StreamName};

    use super::*;

    /// Units `d…` share the key "k"; its run appends a line to `runs` (so
    /// the test counts them) and prints `ok NAME` for each unit it ran.
    struct Fake {
        runs: PathBuf,
        prints: &'static str,
    }

    impl SharedRuns for Fake {
        fn key(&self, unit: &UnitId) -> Option<String> {
            unit.as_str().starts_with('d').then(|| "k".to_owned())
        }

        fn invocation_of(&self, key: &str) -> Invocation {
            let script = format!("echo {key} >> '{}'; sleep 0.2; printf '{}'", self.runs.display(), self.prints);
            Invocation { argv: vec!["sh".into(), "-c".into(), script], ..Invocation::default() }
        }

        fn ran(&self, result: &ProcessResult) -> Option<u32> {
            let n = result.output.text(usize::MAX).lines().filter(|l| l.starts_with("ok ")).count();
            (n > 0).then_some(n as u32)
        }

        fn covers(&self, unit: &UnitId, result: &ProcessResult) -> bool {
            result.output.text(usize::MAX).lines().any(|l| l == format!("ok {unit}"))
        }
    }

    fn delivery(unit: &str, retry_index: u32) -> Delivery {
        Delivery {
            unit: UnitId::new(unit).unwrap(),
            kind: "test".into(),
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            delivery_count: 1,
            retry_index,
            reclaim_count: 0,
            origin: DeliveryOrigin::Fresh,
        }
    }

    fn memo(dir: &tempfile::TempDir, prints: &'static str) -> (Arc<SharedRunMemo>, PathBuf) {
        let runs = dir.path().join("runs");
        (Arc::new(SharedRunMemo::new(Arc::new(Fake { runs: runs.clone(), prints }))), runs)
    }

    async fn plan(memo: &SharedRunMemo, unit: &str, retry_index: u32) -> Option<(Arc<ProcessResult>, bool)> {
        let stop = CancellationToken::new();
        match memo.plan(&delivery(unit, retry_index), &[], ProcessLimits::default(), &stop).await {
            Plan::Shared { result, ran_now } => Some((result, ran_now)),
            Plan::Alone => None,
        }
    }

    fn runs(path: &PathBuf) -> usize {
        std::fs::read_to_string(path).unwrap_or_default().lines().count()
    }

    #[tokio::test]
    async fn slots_of_one_worker_share_one_run_of_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, ran) = memo(&dir, "ok d1\\nok d2\\nok d3\\nok d4\\n");
        // Two slots at once: the second waits for the first one's run.
        let (a, b) = tokio::join!(plan(&memo, "d1", 0), plan(&memo, "d2", 0));
        let ((a, a_ran), (b, b_ran)) = (a.unwrap(), b.unwrap());
        assert!(a_ran != b_ran, "exactly one slot ran it");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(runs(&ran), 1);
        // Each unit's duration is its share of the run's.
        assert!(a.duration >= Duration::from_millis(40) && a.duration < Duration::from_millis(200), "{:?}", a.duration);
        let (_, ran_now) = plan(&memo, "d3", 0).await.unwrap();
        assert!(!ran_now);
        assert_eq!(runs(&ran), 1, "a later unit of the key reads the same run");
    }

    #[tokio::test]
    async fn a_retry_an_other_key_and_a_unit_the_run_missed_run_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, ran) = memo(&dir, "ok d1\\nok d2\\n");
        assert!(plan(&memo, "d2", 1).await.is_none(), "a retry is checked on its own");
        assert!(plan(&memo, "x1", 0).await.is_none(), "no key");
        assert_eq!(runs(&ran), 0, "neither ran the shared run");
        assert!(plan(&memo, "d1", 0).await.is_some());
        assert!(plan(&memo, "d9", 0).await.is_none(), "the run holds no verdict of d9");
        assert_eq!(runs(&ran), 1);
    }

    #[tokio::test]
    async fn a_run_that_tells_nothing_is_not_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, ran) = memo(&dir, "error: could not compile\\n");
        assert!(plan(&memo, "d1", 0).await.is_none());
        assert!(plan(&memo, "d2", 0).await.is_none());
        assert_eq!(runs(&ran), 1, "its units run alone, as without sharing");
    }

    #[tokio::test]
    async fn a_stopped_run_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, _) = memo(&dir, "ok d1\\nok d2\\n");
        let stop = CancellationToken::new();
        stop.cancel();
        let stopped = memo.plan(&delivery("d1", 0), &[], ProcessLimits::default(), &stop).await;
        assert!(matches!(stopped, Plan::Alone));
        let (_, ran_now) = plan(&memo, "d1", 0).await.unwrap();
        assert!(ran_now, "the next unit runs it again");
    }
}
