//! Units that one invocation runs better together than one by one, run
//! together once per worker and judged each by its own part of the output.
//!
//! cargo's doctests are the case: `cargo test --doc NAME` has rustdoc read
//! the whole library and build its doctests again for every name (either
//! 1.19's 61 doctests took 4 minutes one by one, 5 seconds together). The
//! first such unit a worker runs runs all of its kind (the invocation
//! [`SharedRuns::together`] gives); the run's output is read once into each
//! unit's result, and each later unit of that invocation takes its own
//! instead of running again. Only a first delivery does: a retry runs alone,
//! so a failure seen in the shared run is checked on its own, and a unit
//! that passes then is flaky as always. A shared run that says nothing
//! usable (it did not exit, or printed no results) is not kept, and every
//! unit of its invocation then runs alone, as it would have without
//! sharing; so does a unit the run holds no result of. `--unit-timeout`
//! bounds the shared run too: one that runs past it is such a run. Each
//! unit's duration is its share of the run's (the run's time over the tests
//! it judged).

use std::collections::HashMap;
use std::sync::Arc;

use leasehold_core::{Delivery, UnitId};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::exec::process::{run_process_in, ProcessLimits, ProcessResult, Termination};
use crate::verdicts::model::UnitResult;
use crate::worker::launch::Invocation;

/// The most output a shared run keeps (every unit's verdict is read from it).
const SHARED_TAIL_BYTES: usize = 16 * 1024 * 1024;

/// Which units run together, and how each is judged from their run.
pub trait SharedRuns: Send + Sync {
    /// The invocation that runs `unit` together with the others of its
    /// kind, or `None` for a unit that runs alone. Units given equal
    /// invocations share one run.
    fn together(&self, unit: &UnitId) -> Option<Invocation>;
    /// Each unit's result in `result`, a run of a [`SharedRuns::together`]
    /// invocation, by unit id, all read at once; `None` when the run is of
    /// no use to any of them (it did not exit, or printed no results). A
    /// unit the run holds no result of runs alone.
    fn verdicts(&self, result: &ProcessResult) -> Option<HashMap<String, UnitResult>>;
}

/// A run that judged its units: its result (its duration each unit's share
/// of the run's) and each unit's own.
struct Ran {
    result: Arc<ProcessResult>,
    verdicts: HashMap<String, UnitResult>,
}

/// What became of a shared run on this worker.
#[derive(Clone)]
enum Shared {
    Ran(Arc<Ran>),
    /// It told nothing: its units run alone.
    Alone,
}

/// One worker's shared runs, by invocation.
pub struct SharedRunMemo {
    runs: Arc<dyn SharedRuns>,
    /// One lock per invocation, held while it runs: the worker's other
    /// slots wait for it rather than start it again.
    keys: Mutex<HashMap<Invocation, Arc<tokio::sync::Mutex<Option<Shared>>>>>,
}

/// How a unit's invocation is to go.
pub enum Plan {
    /// Its verdict is in a run of its whole kind.
    Shared {
        /// That run's result, its duration each unit's share.
        result: Arc<ProcessResult>,
        /// The unit's own result in it.
        own: UnitResult,
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

    /// For `delivery`: its result in a shared run (running it first, once
    /// per invocation, when no slot has), or [`Plan::Alone`].
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
        let Some(invocation) = self.runs.together(&delivery.unit) else { return Plan::Alone };
        let lock = self.keys.lock().entry(invocation.clone()).or_default().clone();
        let mut state = lock.lock().await;
        let (shared, ran_now) = match state.clone() {
            Some(shared) => (shared, false),
            None => {
                let result = run(invocation, env, limits, stop).await;
                if result.termination == Termination::Stopped {
                    return Plan::Alone; // Not kept: the next unit runs it again.
                }
                let shared = match self.runs.verdicts(&result) {
                    Some(mut verdicts) if !verdicts.is_empty() => {
                        let share = result.duration / u32::try_from(verdicts.len()).unwrap_or(u32::MAX);
                        for own in verdicts.values_mut() {
                            own.duration = Some(share);
                        }
                        let result = Arc::new(ProcessResult { duration: share, ..result });
                        Shared::Ran(Arc::new(Ran { result, verdicts }))
                    }
                    _ => {
                        tracing::debug!(unit = %delivery.unit, "the shared run told nothing: its units run alone");
                        Shared::Alone
                    }
                };
                *state = Some(shared.clone());
                (shared, true)
            }
        };
        match shared {
            Shared::Ran(ran) => match ran.verdicts.get(delivery.unit.as_str()) {
                Some(own) => Plan::Shared { result: ran.result.clone(), own: own.clone(), ran_now },
                None => Plan::Alone,
            },
            Shared::Alone => Plan::Alone,
        }
    }
}

/// Runs `invocation` with the slot's environment, keeping output enough
/// for every unit's verdict.
async fn run(
    invocation: Invocation,
    env: &[(String, String)],
    limits: ProcessLimits,
    stop: &CancellationToken,
) -> ProcessResult {
    let mut env = env.to_vec();
    env.extend(invocation.env);
    let limits = ProcessLimits { tail_bytes: limits.tail_bytes.max(SHARED_TAIL_BYTES), ..limits };
    tracing::debug!(argv = ?invocation.argv, "running units together");
    run_process_in(invocation.cwd.as_deref(), &invocation.argv, &env, limits, stop).await
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use leasehold_core::{DeliveryOrigin, EntryId, StreamName};

    use super::*;
    use crate::verdicts::model::UnitVerdict;

    /// Units `d…` run together, units `e…` together apart from them; a run
    /// appends its kind to `runs` (so the test counts them) and prints
    /// `ok NAME` or `FAILED NAME` for each unit it ran.
    struct Fake {
        runs: PathBuf,
        prints: &'static str,
    }

    impl SharedRuns for Fake {
        fn together(&self, unit: &UnitId) -> Option<Invocation> {
            let kind = unit.as_str().chars().next().filter(|c| matches!(c, 'd' | 'e'))?;
            let script = format!("echo {kind} >> '{}'; sleep 0.2; printf '{}'", self.runs.display(), self.prints);
            Some(Invocation { argv: vec!["sh".into(), "-c".into(), script], ..Invocation::default() })
        }

        fn verdicts(&self, result: &ProcessResult) -> Option<HashMap<String, UnitResult>> {
            let Termination::Exited(_) = result.termination else { return None };
            let text = result.output.text(usize::MAX);
            let verdict = |line: &str| match line.split_once(' ')? {
                ("ok", unit) => Some((unit.to_owned(), UnitVerdict::Passed.into())),
                ("FAILED", unit) => Some((unit.to_owned(), failed().into())),
                _ => None,
            };
            Some(text.lines().filter_map(verdict).collect())
        }
    }

    fn failed() -> UnitVerdict {
        UnitVerdict::Failed { reason: "exit", detail: "it failed".into() }
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
        plan_within(memo, unit, retry_index, ProcessLimits::default())
            .await
            .map(|(result, _, ran_now)| (result, ran_now))
    }

    async fn plan_within(
        memo: &SharedRunMemo,
        unit: &str,
        retry_index: u32,
        limits: ProcessLimits,
    ) -> Option<(Arc<ProcessResult>, UnitResult, bool)> {
        let stop = CancellationToken::new();
        match memo.plan(&delivery(unit, retry_index), &[], limits, &stop).await {
            Plan::Shared { result, own, ran_now } => Some((result, own, ran_now)),
            Plan::Alone => None,
        }
    }

    fn runs(path: &PathBuf) -> usize {
        std::fs::read_to_string(path).unwrap_or_default().lines().count()
    }

    #[tokio::test]
    async fn slots_of_one_worker_share_one_run_of_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, ran) = memo(&dir, "ok d1\\nFAILED d2\\nok d3\\nok d4\\n");
        // Two slots at once: the second waits for the first one's run.
        let (a, b) = tokio::join!(plan(&memo, "d1", 0), plan(&memo, "d2", 0));
        let ((a, a_ran), (b, b_ran)) = (a.unwrap(), b.unwrap());
        assert!(a_ran != b_ran, "exactly one slot ran it");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(runs(&ran), 1);
        // Each unit's duration is its share of the run's.
        assert!(a.duration >= Duration::from_millis(40) && a.duration < Duration::from_millis(200), "{:?}", a.duration);
        let (_, own, ran_now) = plan_within(&memo, "d3", 0, ProcessLimits::default()).await.unwrap();
        assert!(!ran_now);
        assert_eq!(runs(&ran), 1, "a later unit of the key reads the same run");
        assert_eq!(own.verdict, UnitVerdict::Passed);
        assert_eq!(own.duration, Some(a.duration), "its share of the run");
        let (_, own, _) = plan_within(&memo, "d2", 0, ProcessLimits::default()).await.unwrap();
        assert_eq!(own.verdict, failed(), "each unit gets its own result");
    }

    #[tokio::test]
    async fn a_retry_an_other_key_and_a_unit_the_run_missed_run_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, ran) = memo(&dir, "ok d1\\nok d2\\n");
        assert!(plan(&memo, "d2", 1).await.is_none(), "a retry is checked on its own");
        assert!(plan(&memo, "x1", 0).await.is_none(), "it does not run with others");
        assert_eq!(runs(&ran), 0, "neither ran the shared run");
        assert!(plan(&memo, "d1", 0).await.is_some());
        assert!(plan(&memo, "d9", 0).await.is_none(), "the run holds no verdict of d9");
        assert_eq!(runs(&ran), 1);
        assert!(plan(&memo, "e1", 0).await.is_none(), "the e run holds no verdict of e1");
        assert_eq!(std::fs::read_to_string(&ran).unwrap(), "d\ne\n", "units of another invocation run their own");
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
    async fn a_run_past_the_unit_timeout_tells_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (memo, ran) = memo(&dir, "ok d1\\nok d2\\n");
        let limits = ProcessLimits {
            timeout: Some(Duration::from_millis(50)),
            kill_grace: Duration::from_millis(50),
            ..ProcessLimits::default()
        };
        assert!(plan_within(&memo, "d1", 0, limits).await.is_none(), "killed before it printed: d1 runs alone");
        assert!(plan(&memo, "d2", 0).await.is_none(), "and so does every unit of it, with no second try");
        assert_eq!(runs(&ran), 1);
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
