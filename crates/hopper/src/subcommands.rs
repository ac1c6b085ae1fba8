//! The three commands (`run`, `report`, `status`) as library functions: the
//! binary only parses arguments into these option structs and prints errors.
//!
//! Every input is checked (queue URL, command, budgets, ids, unit list)
//! before a backend is contacted, so bad input never writes to the queue.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Budgets, RunId, RunSpec, UnitQueue};
use tokio_util::sync::CancellationToken;

use crate::agent::child::{agent_env, AgentCommand, SpareAgent};
use crate::agent::plugins::Plugins;
use crate::agent::tools;
use crate::backend::{connect, parse_queue_url, Backend, BackendOptions, QueueKind};
use crate::discover::{cargo_exact, checked_units, discover, paths, pytest, DiscoverKind};
use crate::errors::{exit, BackendError, HopperError, UnitsError};
use crate::html::write_html;
use crate::identity::{resolve_build, resolve_worker, EnvLookup};
use crate::launch::NextestLauncher;
use crate::observer::{default_observer, QuietObserver, RunObserver};
use crate::outage::{connect_within, OutageNotice, OutageNotify, OutageQueue};
use crate::process::ProcessLimits;
use crate::report::{wait_for_end, RunReport, WaitOptions};
use crate::runner::{BatchResults, ExitCodeResults, Worker, WorkerConfig};
use crate::status::{now_ms, StatusSnapshot};
use crate::template::CommandTemplate;
use crate::timeline::Timeline;
use crate::timings::order_slowest_first;
use crate::units::{collect_units, UnitSource};
use crate::verdicts::{ResultsFormat, ResultsPlan};

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
}

/// How `hopper run` runs units (`--agent`, `--per-process`, or neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionChoice {
    /// An agent where hopper has one for the discovered tool, one process per
    /// unit (or batch) otherwise.
    #[default]
    Default,
    /// `--agent`: the command speaks the agent protocol.
    Agent,
    /// `--per-process`: one process per unit (or batch), always.
    PerProcess,
}

/// Options of `hopper report`.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// The queue URL.
    pub queue: String,
    /// Backend settings.
    pub backend: BackendOptions,
    /// `--build`.
    pub build: Option<String>,
    /// JUnit XML output.
    pub junit: Option<PathBuf>,
    /// The HTML timeline.
    pub html: Option<PathBuf>,
    /// Give up after this long.
    pub wait_timeout: Duration,
    /// A worker silent this long is gone.
    pub worker_timeout: Duration,
    /// How long to wait for the build to appear.
    pub appear_timeout: Duration,
    /// How many slowest units to list.
    pub slowest: usize,
    /// How long queue calls ride out an outage of the queue.
    pub outage_grace: Duration,
}

/// Options of `hopper status`.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// The queue URL.
    pub queue: String,
    /// Backend settings.
    pub backend: BackendOptions,
    /// `--build`.
    pub build: Option<String>,
    /// How long queue calls ride out an outage of the queue.
    pub outage_grace: Duration,
}

/// A shared queue whose calls ride out an outage for `grace`, announcing it
/// through `notify`; a memory queue as it is (it has no outages).
fn riding_out(backend: &Backend, grace: Duration, notify: OutageNotify, stop: CancellationToken) -> Arc<dyn UnitQueue> {
    if backend.shared {
        OutageQueue::wrap(Arc::clone(&backend.queue), grace, notify, stop)
    } else {
        Arc::clone(&backend.queue)
    }
}

/// Outage announcements on stderr, for the commands without a progress line.
fn notify_on_stderr() -> OutageNotify {
    Arc::new(|notice: &OutageNotice<'_>| eprintln!("hopper: {notice}"))
}

fn shared_kind(url: &str, command: &'static str) -> Result<QueueKind, HopperError> {
    let kind = parse_queue_url(url)?;
    if !kind.is_shared() {
        return Err(BackendError::MemoryNotShared { command }.into());
    }
    Ok(kind)
}

/// How this run's units run, from `--agent` / `--per-process` and the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Execution {
    /// One process per unit (or batch): the command template.
    PerProcess,
    /// hopper's pytest plugin as an agent.
    Pytest,
    /// hopper's RSpec agent.
    Rspec,
    /// `--agent`: the user's command speaks the protocol.
    Custom,
    /// `--discover nextest` with no command: each test binary run directly.
    Nextest,
}

impl Execution {
    fn choose(
        mode: ExecutionChoice,
        source: &UnitSource,
        command: &[String],
        batch_size: usize,
        results: Option<ResultsFormat>,
    ) -> Result<Self, HopperError> {
        // `--batch-size N` or `--results` asks for batches read from the tool's report.
        let batches = batch_size > 1 || results.is_some();
        let discovered = match source {
            UnitSource::Discover(kind) => Some(*kind),
            _ => None,
        };
        Ok(match (mode, discovered) {
            (ExecutionChoice::Agent, _) => {
                CommandTemplate::new(command.to_vec())?;
                Execution::Custom
            }
            (ExecutionChoice::Default, Some(DiscoverKind::Pytest)) if !batches => Execution::Pytest,
            (ExecutionChoice::Default, Some(DiscoverKind::Rspec)) if !batches => Execution::Rspec,
            (_, Some(DiscoverKind::Nextest)) if command.is_empty() && !batches => Execution::Nextest,
            _ => Execution::PerProcess,
        })
    }

    /// The per-process template (for agents, the command as given, or the tool's name).
    fn template(self, command: &[String]) -> Result<CommandTemplate, HopperError> {
        match self {
            Execution::PerProcess | Execution::Custom => CommandTemplate::new(command.to_vec()),
            Execution::Pytest | Execution::Rspec | Execution::Nextest if command.is_empty() => {
                CommandTemplate::new(vec![format!("{self:?}").to_lowercase()])
            }
            Execution::Pytest | Execution::Rspec | Execution::Nextest => CommandTemplate::new(command.to_vec()),
        }
    }
}

/// `command` for running units: a discovered tool's own path arguments
/// dropped (the units name their tests; see [`paths`]), said once.
fn without_tool_paths(command: Vec<String>, tool: Option<DiscoverKind>) -> Vec<String> {
    let (Some(tool), Ok(cwd)) = (tool, std::env::current_dir()) else { return command };
    let (kept, dropped) = paths::drop_paths(&command, tool, &cwd);
    if dropped.is_empty() {
        return command;
    }
    eprintln!(
        "hopper: {} is only for discovery: each unit's command names its tests, so it runs without {}",
        dropped.join(" "),
        if dropped.len() == 1 { "it" } else { "them" }
    );
    kept
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
    let tool = match &options.source {
        UnitSource::Discover(kind) => Some(*kind),
        _ => None,
    };
    // Agents report per test themselves; batches read the tool's report.
    let (command, results) = if execution == Execution::PerProcess {
        let plan = ResultsPlan::resolve(options.results, options.batch_size, tool, options.command.clone())?;
        (CommandTemplate::new(without_tool_paths(plan.command.clone(), tool))?, plan.results()?)
    } else {
        let exit_code: Arc<dyn BatchResults> = Arc::new(ExitCodeResults);
        (execution.template(&options.command)?, exit_code)
    };
    options.budgets.validate()?;
    let fallback = (!kind.is_shared()).then_some(LOCAL_BUILD);
    let run_id = resolve_build(options.build.as_deref(), env, fallback)?;
    let worker_id = resolve_worker(options.worker.as_deref(), env)?;
    let heartbeat_every = (options.reclaim_timeout / 3).max(Duration::from_millis(10));
    let config = WorkerConfig {
        run: run_id.clone(),
        worker: worker_id.clone(),
        command,
        slots: options.slots,
        batch_size: options.batch_size,
        reclaim_after: options.reclaim_timeout,
        heartbeat_every,
        limits: ProcessLimits {
            timeout: options.unit_timeout,
            kill_grace: options.kill_grace,
            tail_bytes: options.output_tail.clamp(1024, 256 * 1024),
        },
        idle_poll: if kind.is_shared() { Duration::from_millis(500) } else { Duration::from_millis(50) },
        env: Vec::new(),
        results,
        agent: None,
        launcher: None,
    };
    config.validate()?;
    // Kept until the worker ends: the agents load their plugins from it.
    let plugins = Plugins::new().map_err(|source| UnitsError::Scratch { source })?;
    let tail = config.limits.tail_bytes;
    let mut spare = None;
    let mut sharding = None;
    let mut outside_errors = Vec::new();
    let mut cargo_targets = None;
    let (units, nextest) = match &options.source {
        UnitSource::Discover(DiscoverKind::Pytest) if execution == Execution::Pytest => {
            // The agents' collections are the discovery, each of a share of
            // the files: nothing collects twice.
            let agent = tools::pytest_agent(&options.command, &plugins, 0, tail);
            let env = agent_env(&config.run, &config.worker);
            let found = pytest::list_with_agents(&agent, &plugins, &env, tail, config.slots).await?;
            let units =
                checked_units(&found.shown, found.listing, DiscoverKind::Pytest.unit_kind(), "--discover pytest")?;
            spare = Some(SpareAgent::new(found.agents));
            sharding = found.sharding.map(Arc::new);
            (units, None)
        }
        UnitSource::Discover(kind) => {
            let discovered = discover(*kind, &options.command, &plugins).await?;
            outside_errors = discovered.outside_errors;
            cargo_targets = discovered.cargo_targets;
            (discovered.units, discovered.nextest)
        }
        other => (collect_units(other).await?, None),
    };
    let mut config = config;
    config.agent = match execution {
        Execution::PerProcess => None,
        Execution::Pytest => Some(AgentCommand {
            spare: spare.take().unwrap_or_default(),
            sharding: sharding.take(),
            ..tools::pytest_agent(&options.command, &plugins, units.len(), tail)
        }),
        Execution::Rspec => Some(tools::rspec_agent(&options.command, &plugins, units.len(), tail)),
        Execution::Custom => Some(tools::custom_agent(&options.command)),
        Execution::Nextest => None,
    }
    .map(Arc::new);
    // cargo-test units one at a time: the exact test in its binary, and
    // libtest's own count must say it ran.
    let one_by_exit_code = config.batch_size == 1 && options.results.is_none_or(|r| r == ResultsFormat::ExitCode);
    if options.source == UnitSource::Discover(DiscoverKind::CargoTest)
        && execution == Execution::PerProcess
        && one_by_exit_code
        && cargo_exact::is_cargo_test(config.command.parts())
    {
        let targets = cargo_targets.take().unwrap_or_default();
        config.launcher = Some(Arc::new(cargo_exact::CargoExact::new(config.command.clone(), targets)));
        config.results = Arc::new(cargo_exact::CountedResults);
    }
    if execution == Execution::Nextest {
        let tests = nextest.unwrap_or_default();
        config.launcher = Some(Arc::new(NextestLauncher::new(tests, run_id.as_str())));
        // The binary's own libtest count and panic message, as for cargo-test units.
        config.results = Arc::new(cargo_exact::CountedResults);
        // One process per test, as nextest runs them.
        config.batch_size = 1;
    }
    // Check the whole spec before anything touches the queue.
    RunSpec { run: run_id.clone(), units: units.clone(), budgets: options.budgets, ttl: options.run_ttl }.validate()?;

    let observer: Arc<dyn RunObserver> =
        if options.quiet { Arc::new(QuietObserver) } else { Arc::from(default_observer()) };
    let announce = Arc::clone(&observer);
    let notify: OutageNotify = Arc::new(move |notice: &OutageNotice<'_>| announce.warn(&notice.to_string()));
    let backend = tokio::select! {
        backend = connect_within(options.outage_grace, &notify, BackendError::may_come_back, || connect(&kind, &options.backend)) => backend?,
        _ = shutdown.cancelled() => return Err(HopperError::Interrupted),
    };
    let queue = riding_out(&backend, options.outage_grace, notify, shutdown.clone());
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
    }
    let summary = outcome?;
    if backend.shared {
        eprintln!(
            "hopper: worker done: {} passed, {} failed, {} retried, {} stale here; run `hopper report` for the build's verdict",
            summary.passed, summary.failed, summary.retried, summary.stale
        );
        return Ok(exit::PASSED);
    }
    let report = RunReport::load(&queue, &run_id).await?.ok_or(HopperError::StateLost { run: run_id })?;
    let outputs = ReportOutputs { junit: options.junit.as_deref(), html: options.html.as_deref() };
    finish_report(&queue, &report, outputs, options.slowest).await
}

/// The files a finished report writes.
#[derive(Debug, Clone, Copy)]
struct ReportOutputs<'a> {
    junit: Option<&'a Path>,
    html: Option<&'a Path>,
}

async fn finish_report(
    queue: &Arc<dyn UnitQueue>,
    report: &RunReport,
    outputs: ReportOutputs<'_>,
    slowest: usize,
) -> Result<i32, HopperError> {
    print!("{}", report.render(slowest));
    write_files(queue, report, outputs, slowest).await?;
    Ok(report.exit_code())
}

async fn write_files(
    queue: &Arc<dyn UnitQueue>,
    report: &RunReport,
    outputs: ReportOutputs<'_>,
    slowest: usize,
) -> Result<(), HopperError> {
    if let Some(path) = outputs.junit {
        report.write_junit(path)?;
        println!("hopper: JUnit XML written to {}", path.display());
    }
    if let Some(path) = outputs.html {
        let timeline = Timeline::load(queue, &report.run).await?;
        write_html(path, report, &timeline, slowest)?;
        println!("hopper: HTML timeline written to {}", path.display());
    }
    Ok(())
}

/// `hopper report`: waits for the build's end, prints the verdict, writes
/// JUnit; returns the exit code (0 only when every unit passed).
pub async fn report(options: ReportOptions, env: EnvLookup<'_>) -> Result<i32, HopperError> {
    let kind = shared_kind(&options.queue, "report")?;
    let run_id = resolve_build(options.build.as_deref(), env, None)?;
    let notify = notify_on_stderr();
    let backend =
        connect_within(options.outage_grace, &notify, BackendError::may_come_back, || connect(&kind, &options.backend))
            .await?;
    let queue = riding_out(&backend, options.outage_grace, notify, CancellationToken::new());
    let wait = WaitOptions {
        wait_timeout: options.wait_timeout,
        worker_timeout: options.worker_timeout,
        appear_timeout: options.appear_timeout,
        poll: Duration::from_millis(250).min(options.worker_timeout / 4).max(Duration::from_millis(10)),
    };
    let outputs = ReportOutputs { junit: options.junit.as_deref(), html: options.html.as_deref() };
    let waited = wait_for_end(&queue, &run_id, wait).await;
    if let Err(error @ (HopperError::WorkersGone { .. } | HopperError::WaitTimeout { .. })) = waited {
        // Still show what is known, and leave a JUnit file that names the unfinished units.
        if let Some(report) = RunReport::load(&queue, &run_id).await? {
            print!("{}", report.render(options.slowest));
            write_files(&queue, &report, outputs, options.slowest).await?;
        }
        return Err(error);
    }
    waited?;
    let report = RunReport::load(&queue, &run_id).await?.ok_or(HopperError::StateLost { run: run_id })?;
    finish_report(&queue, &report, outputs, options.slowest).await
}

/// `hopper status`: prints a snapshot of the build.
pub async fn status(options: StatusOptions, env: EnvLookup<'_>) -> Result<i32, HopperError> {
    let kind = shared_kind(&options.queue, "status")?;
    let run_id = resolve_build(options.build.as_deref(), env, None)?;
    let notify = notify_on_stderr();
    let backend =
        connect_within(options.outage_grace, &notify, BackendError::may_come_back, || connect(&kind, &options.backend))
            .await?;
    let queue = riding_out(&backend, options.outage_grace, notify, CancellationToken::new());
    print!("{}", status_text(&queue, &run_id).await?);
    Ok(exit::PASSED)
}

/// The status text of a build (or an error when it does not exist).
pub async fn status_text(queue: &Arc<dyn UnitQueue>, run: &RunId) -> Result<String, HopperError> {
    let snapshot = StatusSnapshot::load(queue, run)
        .await?
        .ok_or_else(|| HopperError::RunNotFound { run: run.clone(), waited: Duration::ZERO })?;
    Ok(snapshot.render(now_ms()))
}
