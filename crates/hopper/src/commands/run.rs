//! `hopper run`: one worker. In memory mode it is the whole build and
//! prints the report.
//!
//! Every input is checked (queue URL, command, budgets, ids, unit list)
//! before a backend is contacted, so bad input never writes to the queue. A
//! rerun (`--rerun-failed`, see [`super::rerun`]) reads its earlier build
//! first, and runs nothing when that build is gone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Budgets, RunId, RunSpec};
use tokio_util::sync::CancellationToken;

use super::identity::{resolve_build, resolve_worker, EnvLookup};
use super::report::{finish_report, read_quarantine, riding_out, ReportOutputs};
use super::rerun::{rerun_build, Rerun};
use super::tools::{Execution, ExecutionChoice, Prepared, Preparing};
use crate::agent::plugins::Plugins;
use crate::errors::{exit, BackendError, HopperError, UnitsError};
use crate::exec::process::ProcessLimits;
use crate::queue::backend::{connect, parse_queue_url, BackendOptions};
use crate::queue::outage::{connect_within, OutageNotice, OutageNotify};
use crate::report::quarantine::{count_passes, streak_id};
use crate::report::{FlakyResult, RunReport};
use crate::units::discover::DiscoverKind;
use crate::units::timings::order_slowest_first;
use crate::units::UnitSource;
use crate::verdicts::ResultsFormat;
use crate::worker::config::validate_pace;
use crate::worker::observer::{default_observer, QuietObserver, RunObserver};
use crate::worker::{Worker, WorkerConfig};

/// The build id memory mode uses when none is given.
pub const LOCAL_BUILD: &str = "local";

/// Options of `hopper run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The queue URL.
    pub queue: String,
    /// Backend settings.
    pub backend: BackendOptions,
    /// `--build`.
    pub build: Option<String>,
    /// `--worker`.
    pub worker: Option<String>,
    /// Local slots (`-j`).
    pub slots: usize,
    /// Units per invocation.
    pub batch_size: usize,
    /// `--results`: where each unit's result comes from (resolved against
    /// the batch size and the tool when `None`).
    pub results: Option<ResultsFormat>,
    /// Where the units come from.
    pub source: UnitSource,
    /// `--timeout`: a delivery idle this long is reclaimed; heartbeats run at a third of it.
    pub reclaim_timeout: Duration,
    /// `--unit-timeout`.
    pub unit_timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Bytes of output kept per attempt.
    pub output_tail: usize,
    /// The budgets (frozen into the run by whichever worker initialises it).
    pub budgets: Budgets,
    /// `--max-failures-kill`: a stop at the failure limit stops this
    /// worker's running units too.
    pub max_failures_kill: bool,
    /// `--retry-same-worker`: a retry may come back to the worker that failed it.
    pub retry_same_worker: bool,
    /// `--group`: fleet-wide concurrency groups, first match wins.
    pub groups: Vec<crate::units::groups::GroupRule>,
    /// The run's inactivity TTL in the queue.
    pub run_ttl: Duration,
    /// The command template (`{unit}`).
    pub command: Vec<String>,
    /// JUnit XML output (memory mode, where `run` prints the report).
    pub junit: Option<PathBuf>,
    /// The HTML timeline (memory mode, where `run` prints the report).
    pub html: Option<PathBuf>,
    /// How many slowest units the report lists.
    pub slowest: usize,
    /// No progress output.
    pub quiet: bool,
    /// How long queue calls ride out an outage of the queue.
    pub outage_grace: Duration,
    /// How units run: agents, one process each, or the tool's default.
    pub mode: ExecutionChoice,
    /// `--flaky-result`: whether a flaky unit passes the build (memory mode,
    /// where `run` gives the verdict).
    pub flaky_result: FlakyResult,
    /// `--quarantine`: the file of units that never fail the build (memory
    /// mode, where `run` gives the verdict; read and checked in every mode).
    pub quarantine: Option<PathBuf>,
    /// `--rerun-failed BUILD`: run only the units BUILD failed or found flaky
    /// (see [`super::rerun`] for the rerun's own build id).
    pub rerun_failed: Option<String>,
}

/// `hopper run`: one worker. In memory mode it is the whole build and prints
/// the report; returns the exit code.
///
/// A discovered suite with no test selected exits as its tool would
/// (pytest 5, nextest 4, rspec and cargo test 0), and says so.
pub async fn run(options: RunOptions, env: EnvLookup<'_>, shutdown: CancellationToken) -> Result<i32, HopperError> {
    let tool = match &options.source {
        UnitSource::Discover(kind) => Some(*kind),
        _ => None,
    };
    match (run_worker(options, env, shutdown).await, tool) {
        (Err(HopperError::Units(UnitsError::Empty { source_name })), Some(tool)) => {
            let code = empty_selection_exit(tool);
            eprintln!("hopper: {source_name} selected no test: nothing to run (exit {code}, as {tool} exits)");
            Ok(code)
        }
        (result, _) => result,
    }
}

/// The exit code each tool gives a run that selected no test.
fn empty_selection_exit(tool: DiscoverKind) -> i32 {
    match tool {
        // pytest's ExitCode.NO_TESTS_COLLECTED.
        DiscoverKind::Pytest => 5,
        // nextest's NO_TESTS_RUN.
        DiscoverKind::Nextest => 4,
        DiscoverKind::Rspec | DiscoverKind::CargoTest => 0,
    }
}

async fn run_worker(options: RunOptions, env: EnvLookup<'_>, shutdown: CancellationToken) -> Result<i32, HopperError> {
    let kind = parse_queue_url(&options.queue)?;
    let execution =
        Execution::choose(options.mode, &options.source, &options.command, options.batch_size, options.results)?;
    options.budgets.validate()?;
    let quarantine = read_quarantine(options.quarantine.as_deref())?;
    let rerun_from = match options.rerun_failed.as_deref() {
        Some(_) if !kind.is_shared() => return Err(HopperError::RerunNeedsSharedQueue),
        Some(from) => {
            Some(RunId::new(from).map_err(|source| HopperError::BadId { what: "--rerun-failed build id", source })?)
        }
        None => None,
    };
    let fallback = (!kind.is_shared()).then_some(LOCAL_BUILD);
    let run_id = match &rerun_from {
        Some(from) => match resolve_build(options.build.as_deref(), env, None) {
            Ok(id) => rerun_build(Some(id), from)?,
            Err(HopperError::MissingBuild) => rerun_build(None, from)?,
            Err(error) => return Err(error),
        },
        None => resolve_build(options.build.as_deref(), env, fallback)?,
    };
    let worker_id = resolve_worker(options.worker.as_deref(), env)?;
    let heartbeat_every = (options.reclaim_timeout / 3).max(Duration::from_millis(10));
    let limits = ProcessLimits {
        timeout: options.unit_timeout,
        kill_grace: options.kill_grace,
        tail_bytes: options.output_tail.clamp(1024, 256 * 1024),
    };
    // Checked before discovery, which may take a while.
    validate_pace(options.slots, options.batch_size, options.reclaim_timeout, &limits)?;
    let observer: Arc<dyn RunObserver> =
        if options.quiet { Arc::new(QuietObserver) } else { Arc::from(default_observer()) };
    let announce = Arc::clone(&observer);
    let notify: OutageNotify = Arc::new(move |notice: &OutageNotice<'_>| announce.warn(&notice.to_string()));
    let connecting = || async {
        let backend = tokio::select! {
            backend = connect_within(options.outage_grace, &notify, BackendError::may_come_back, || connect(&kind, &options.backend)) => backend?,
            _ = shutdown.cancelled() => return Err(HopperError::Interrupted),
        };
        let queue = riding_out(&backend, options.outage_grace, Arc::clone(&notify), shutdown.clone());
        Ok::<_, HopperError>((backend, queue))
    };
    // A rerun reads the earlier build before discovery, which may take a
    // while: a rerun of a build that is gone runs nothing at all. Any other
    // run checks its unit list before it contacts the queue.
    let (rerun, mut connected) = match &rerun_from {
        Some(from) => {
            let (backend, queue) = connecting().await?;
            (Some(Rerun::read(&*queue, from).await?), Some((backend, queue)))
        }
        None => (None, None),
    };
    if let Some(rerun) = rerun.as_ref().filter(|r| r.is_empty()) {
        eprintln!("hopper: build {} had no failed or flaky unit: nothing to rerun", rerun.from);
        return Ok(exit::PASSED);
    }
    // Kept until the worker ends: the agents load their plugins from it.
    let plugins = Plugins::new().map_err(|source| UnitsError::Scratch { source })?;
    let preparing = Preparing {
        source: &options.source,
        command: &options.command,
        batch_size: options.batch_size,
        slots: options.slots,
        tail: limits.tail_bytes,
        run: &run_id,
        worker: &worker_id,
    };
    let Prepared { units, invocations, outside_errors } = execution.prepare(preparing, &plugins).await?;
    let mut units = match &rerun {
        Some(rerun) => {
            let (units, gone) = rerun.select(units);
            if !gone.is_empty() {
                eprintln!(
                    "hopper: {} unit(s) that build {} failed are no longer listed, so not run: {}",
                    gone.len(),
                    rerun.from,
                    crate::errors::name_units(&gone)
                );
            }
            if units.is_empty() {
                eprintln!(
                    "hopper: none of the failed or flaky units of build {} is listed now: nothing to rerun",
                    rerun.from
                );
                return Ok(exit::PASSED);
            }
            eprintln!(
                "hopper: rerunning {} unit(s) of build {} ({} failed, {} flaky there) as build {run_id} \
                 (`hopper report --build {run_id}` gives its verdict)",
                units.len(),
                rerun.from,
                rerun.failed.len(),
                rerun.flaky.len()
            );
            units
        }
        None => units,
    };
    for rule in crate::units::groups::assign(&mut units, &options.groups) {
        observer.warn(&format!("--group {rule} matched no unit: check the glob against the unit ids"));
    }
    // A quarantined unit's failures never stop the build (--max-failures).
    for unit in &mut units {
        unit.quarantined = quarantine.contains(unit.id.as_str());
    }
    let config = WorkerConfig {
        run: run_id.clone(),
        worker: worker_id.clone(),
        slots: options.slots,
        reclaim_after: options.reclaim_timeout,
        heartbeat_every,
        limits,
        idle_poll: if kind.is_shared() { Duration::from_millis(500) } else { Duration::from_millis(50) },
        env: Vec::new(),
        invocations,
        stop_running_on_halt: options.max_failures_kill,
        // One worker is the whole build in memory mode: nobody else could take a retry.
        retry_same_worker: options.retry_same_worker || !kind.is_shared(),
    };
    // Check the whole spec before anything is written to the queue.
    RunSpec { run: run_id.clone(), units: units.clone(), budgets: options.budgets, ttl: options.run_ttl }.validate()?;

    let (backend, queue) = match connected.take() {
        Some(connected) => connected,
        None => connecting().await?,
    };
    if backend.shared && options.junit.is_some() {
        observer.warn("--junit is ignored with a shared queue: `hopper report --junit FILE` writes it");
    }
    if backend.shared && options.html.is_some() {
        observer.warn("--html is ignored with a shared queue: `hopper report --html FILE` writes it");
    }
    let units = match backend.timings.load().await {
        Ok(timings) => order_slowest_first(units, &timings),
        Err(error) => {
            tracing::warn!(%error, "could not read earlier timings; keeping the listed order");
            units
        }
    };
    let worker = Worker::new(Arc::clone(&queue), config, observer, shutdown)?;
    worker.join(units, options.budgets, options.run_ttl).await?;
    crate::verdicts::outside::record(&*queue, &run_id, &worker_id, &outside_errors).await?;
    let outcome = worker.run().await;
    if backend.shared {
        // After the agents' final teardowns: `hopper report` waits for this.
        if let Err(error) = crate::verdicts::outside::record_done(&*queue, &run_id, &worker_id).await {
            tracing::warn!(%error, "could not record that this worker ended");
        }
    }
    let timings = worker.summary().timings;
    if let Err(error) = backend.timings.record(&timings).await {
        tracing::warn!(%error, "could not save timings");
    } else if let Some(path) = backend.new_timings_file.filter(|p| std::path::Path::new(p).exists()) {
        // The file appeared in the project: say what it is, once.
        eprintln!(
            "hopper: wrote each unit's duration to {path}, to run the slowest first next time (--no-timings: none \
             kept; --timings FILE: elsewhere); add it to .gitignore"
        );
    }
    let summary = outcome?;
    if backend.shared {
        eprintln!(
            "hopper: worker done: {} passed, {} skipped, {} failed, {} retried, {} stale here; run `hopper report` for \
             the build's verdict",
            summary.passed, summary.skipped, summary.failed, summary.retried, summary.stale
        );
        return Ok(exit::PASSED);
    }
    let report = RunReport::load(&*queue, &run_id)
        .await?
        .ok_or(HopperError::StateLost { run: run_id })?
        .counting_flaky_as(options.flaky_result)
        .quarantining(quarantine);
    let counted_as = streak_id(report.run.as_str(), fallback);
    let report = count_passes(report, &*backend.timings, &counted_as).await;
    let outputs = ReportOutputs { junit: options.junit.as_deref(), html: options.html.as_deref() };
    finish_report(&*queue, &report, outputs, options.slowest).await
}
