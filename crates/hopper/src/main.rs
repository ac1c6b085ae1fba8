//! The `hopper` binary: parses the command line into the library's option
//! structs, wires up signals and logging, and turns errors into one line on
//! stderr and an exit code.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgGroup, Args, Parser, Subcommand};
use hopper::commands::identity::process_env;
use hopper::commands::{self, ExecutionChoice, ReportOptions, RunOptions, StatusOptions};
use hopper::queue::backend::{BackendOptions, TimingsChoice, DEFAULT_KEY_PREFIX, DEFAULT_QUEUE};
use hopper::report::FlakyResult;
use hopper::units::{DiscoverKind, UnitSource};
use hopper::verdicts::ResultsFormat;
use hopper::{exit, HopperError};
use leasehold_core::Budgets;
use tokio_util::sync::CancellationToken;

/// A distributed test runner: workers pull units from a shared queue, run
/// them, retry failures within budgets and reclaim the units of dead workers.
#[derive(Debug, Parser)]
#[command(name = "hopper", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run units as one worker (with a mem:// queue: the whole build, then the report).
    Run(Box<RunArgs>),
    /// Wait until every unit of a build is finalized, print the verdict, write JUnit XML.
    Report(ReportArgs),
    /// Show a build's progress, its workers and the units in flight.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
struct QueueArgs {
    /// The queue: mem:// (one process), redis://host:port or redis+cluster://host:port,host:port.
    #[arg(long, env = "HOPPER_QUEUE", default_value = DEFAULT_QUEUE)]
    queue: String,
    /// The build id shared by all workers and the report [default: HOPPER_BUILD or the CI's build id].
    #[arg(long)]
    build: Option<String>,
    /// Prefix of every Redis key.
    #[arg(long, env = "HOPPER_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    key_prefix: String,
    /// Seconds every queue call rides out an unreachable queue (a restart, a failover) before giving up.
    #[arg(long, value_name = "SECS", env = "HOPPER_OUTAGE_GRACE", default_value = "120", value_parser = parse_secs)]
    outage_grace: Duration,
}

/// What decides the build's verdict, shared by `run` (memory mode) and `report`.
#[derive(Debug, Args)]
struct VerdictArgs {
    /// Whether a flaky unit (failed, then passed on a retry) passes or fails the build; either way
    /// the JUnit lists each failed attempt as a <flakyFailure>.
    #[arg(long, value_name = "pass|fail", env = "HOPPER_FLAKY_RESULT", default_value = "pass", value_parser = flaky_result_parser())]
    flaky_result: FlakyResult,
    /// A file of unit ids or globs, one a line (`#` comments): those units run and are reported on
    /// their own, but never fail the build; one that passed the last 20 builds in a row is named
    /// ready to leave.
    #[arg(long, value_name = "FILE", env = "HOPPER_QUARANTINE")]
    quarantine: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("units").required(true).args(["units_from", "glob", "discover"])))]
struct RunArgs {
    #[command(flatten)]
    queue: QueueArgs,
    #[command(flatten)]
    verdict: VerdictArgs,
    /// This worker's id [default: HOPPER_WORKER, the CI's node index, or <host>-<pid>].
    #[arg(long)]
    worker: Option<String>,
    /// Local slots: units run at once by this worker [default: the number of CPUs].
    #[arg(short = 'j', long = "jobs")]
    jobs: Option<usize>,
    /// Read units from FILE, one per line (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    units_from: Option<PathBuf>,
    /// Units are the files matching these patterns (e.g. 'spec/**/*_spec.rb').
    #[arg(long, value_name = "PATTERN", num_args = 1..)]
    glob: Vec<String>,
    /// List units with the test tool: nextest, cargo-test, pytest or rspec.
    #[arg(long, value_name = "KIND")]
    discover: Option<String>,
    /// Seconds a unit may go without a heartbeat before another worker reclaims it;
    /// heartbeats run at a third of it.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    timeout: Duration,
    /// Kill a unit (SIGTERM, then SIGKILL) that runs longer than this; the attempt fails with reason timeout.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    unit_timeout: Option<Duration>,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    kill_grace: Duration,
    /// Retries one unit may get.
    #[arg(long, value_name = "N", default_value_t = Budgets::default().max_requeues)]
    max_requeues: u32,
    /// Fraction of the build's units that may be retried at all.
    #[arg(long, value_name = "F", default_value_t = Budgets::default().requeue_tolerance)]
    requeue_tolerance: f64,
    /// Times one unit may be reclaimed from a dead worker before it fails.
    #[arg(long, value_name = "N", default_value_t = Budgets::default().max_reclaims)]
    max_reclaims: u32,
    /// Stop the whole build (every worker) once N units have failed for good:
    /// running units finish, the others are reported as not run.
    #[arg(long, value_name = "N", env = "HOPPER_MAX_FAILURES", value_parser = clap::value_parser!(u32).range(1..))]
    max_failures: Option<u32>,
    /// With --max-failures: when the build stops, stop this worker's running
    /// units too (reported as not run) instead of letting them finish.
    #[arg(long, env = "HOPPER_MAX_FAILURES_KILL", requires = "max_failures")]
    max_failures_kill: bool,
    /// Let a failed unit's retry run on the worker that failed it, even while
    /// another worker could take it (by default a retry goes elsewhere, so a
    /// failure that only one machine sees is called out as worker-specific).
    #[arg(long, env = "HOPPER_RETRY_SAME_WORKER")]
    retry_same_worker: bool,
    /// Units (ids or a glob of ids) of which at most LIMIT run at once across
    /// every worker of the build, e.g. 'pg=1:tests/db/**' for tests sharing one
    /// database. Repeatable; a unit joins the first group that matches it.
    #[arg(long = "group", value_name = "NAME=LIMIT:GLOB")]
    groups: Vec<hopper::units::groups::GroupRule>,
    /// Units per invocation (`{unit}` expands to all of them). With N > 1 each unit's
    /// result is read from the tool's report (see --results).
    #[arg(long, value_name = "N", default_value_t = 1)]
    batch_size: usize,
    /// Where each unit's result comes from: exit-code, junit, libtest-json or rspec-json.
    ///
    /// The tool writes its report to `{report}` (a fresh path per invocation, also in
    /// $HOPPER_REPORT); hopper reads it when the invocation ends. A unit missing from the
    /// report is retried, never passed. Default: exit-code for --batch-size 1; for larger
    /// batches the discovered tool's report (pytest and nextest: junit, cargo-test:
    /// libtest-json, rspec: rspec-json). For pytest and rspec hopper adds the option that
    /// writes it when the command has no `{report}` (`--junitxml={report}`,
    /// `--format progress --format json --out {report}`); for nextest and cargo test the
    /// command names `{report}` itself (the README has both recipes).
    #[arg(long, value_name = "FORMAT", value_parser = parse_results)]
    results: Option<ResultsFormat>,
    /// Write JUnit XML here (mem:// only; use `hopper report --junit` with a shared queue).
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Write the build's timeline here as one self-contained HTML page: each worker's slots
    /// over time, a bar per unit coloured by outcome, idle time at the end, the slowest,
    /// flaky and failed units (mem:// only; use `hopper report --html` with a shared queue).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Keep timings in this file [default: .hopper/timings.json with mem://, Redis otherwise].
    #[arg(long, value_name = "FILE", env = "HOPPER_TIMINGS")]
    timings: Option<PathBuf>,
    /// Do not read or write timings.
    #[arg(long, conflicts_with = "timings")]
    no_timings: bool,
    /// Bytes of each attempt's output kept (the tail).
    #[arg(long, value_name = "BYTES", default_value_t = 32 * 1024)]
    output_tail: usize,
    /// Seconds the build's state stays in the queue after its last activity.
    #[arg(long, value_name = "SECS", default_value = "86400", value_parser = parse_secs)]
    run_ttl: Duration,
    /// Slowest units listed in the report.
    #[arg(long, value_name = "N", default_value_t = 10)]
    slowest: usize,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
    /// Run every unit in a process of its own, even where hopper has an agent for the tool.
    #[arg(long)]
    per_process: bool,
    /// The command speaks hopper's agent protocol (docs/agent-protocol.md): start it once per slot and feed it units.
    #[arg(long, conflicts_with = "per_process")]
    agent: bool,
    /// Run only the units that failed or were flaky in the finished build BUILD (read from its
    /// event log in the shared queue), among those the units option lists now. The rerun is a build
    /// of its own: --build / HOPPER_BUILD / the CI's id when that is not BUILD, else BUILD-rerun.
    #[arg(long, value_name = "BUILD")]
    rerun_failed: Option<String>,
    /// The command to run for each unit; `{unit}` is replaced by the unit (appended when absent),
    /// `{report}` by the path the tool writes its report to (see --results).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct ReportArgs {
    #[command(flatten)]
    queue: QueueArgs,
    #[command(flatten)]
    verdict: VerdictArgs,
    /// Write JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Write the build's timeline here as one self-contained HTML page: each worker's slots
    /// over time, a bar per unit coloured by outcome, idle time at the end, the slowest,
    /// flaky and failed units.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Give up (naming the unfinished units) after this many seconds.
    #[arg(long, value_name = "SECS", default_value = "3600", value_parser = parse_secs)]
    wait_timeout: Duration,
    /// A worker silent this many seconds is gone; when all are gone with units left, fail.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    worker_timeout: Duration,
    /// Seconds to wait for the build to be started by a worker.
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_secs)]
    start_timeout: Duration,
    /// Slowest units listed.
    #[arg(long, value_name = "N", default_value_t = 10)]
    slowest: usize,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    queue: QueueArgs,
}

/// A plain number of seconds (`30`, `0.5`) or a duration with units (`90s`, `2m`, `1h 30m`).
fn parse_secs(raw: &str) -> Result<Duration, String> {
    leasehold_core::duration::parse_duration(raw, leasehold_core::duration::PlainUnit::Seconds)
        .map_err(|e| e.to_string())
}

fn parse_results(raw: &str) -> Result<ResultsFormat, String> {
    raw.parse().map_err(|e: hopper::verdicts::VerdictsError| e.to_string())
}

fn flaky_result_parser() -> impl clap::builder::TypedValueParser<Value = FlakyResult> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(FlakyResult::NAMES)
        .map(|name| FlakyResult::from_name(&name).unwrap_or_default())
}

fn backend_options(queue: &QueueArgs, timings: TimingsChoice) -> BackendOptions {
    BackendOptions { prefix: queue.key_prefix.clone(), timings }
}

fn run_options(args: RunArgs) -> Result<RunOptions, HopperError> {
    let source = if let Some(path) = args.units_from {
        UnitSource::File(path)
    } else if let Some(kind) = args.discover {
        UnitSource::Discover(kind.parse::<DiscoverKind>()?)
    } else {
        UnitSource::Globs(args.glob)
    };
    let timings = match (args.no_timings, args.timings) {
        (true, _) => TimingsChoice::Off,
        (false, Some(path)) => TimingsChoice::File(path),
        (false, None) => TimingsChoice::Default,
    };
    let slots = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    Ok(RunOptions {
        backend: backend_options(&args.queue, timings),
        queue: args.queue.queue,
        build: args.queue.build,
        worker: args.worker,
        slots,
        batch_size: args.batch_size,
        results: args.results,
        source,
        reclaim_timeout: args.timeout,
        unit_timeout: args.unit_timeout,
        kill_grace: args.kill_grace,
        output_tail: args.output_tail,
        budgets: Budgets {
            max_requeues: args.max_requeues,
            requeue_tolerance: args.requeue_tolerance,
            max_reclaims: args.max_reclaims,
            max_failures: args.max_failures,
        },
        max_failures_kill: args.max_failures_kill,
        retry_same_worker: args.retry_same_worker,
        groups: args.groups,
        run_ttl: args.run_ttl,
        command: args.command,
        junit: args.junit,
        html: args.html,
        slowest: args.slowest,
        quiet: args.quiet,
        mode: match (args.agent, args.per_process) {
            (true, _) => ExecutionChoice::Agent,
            (false, true) => ExecutionChoice::PerProcess,
            (false, false) => ExecutionChoice::Default,
        },
        outage_grace: args.queue.outage_grace,
        flaky_result: args.verdict.flaky_result,
        quarantine: args.verdict.quarantine,
        rerun_failed: args.rerun_failed,
    })
}

/// The first stop signal received (0: none), which decides the exit code.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// SIGINT / SIGTERM cancel `token` (the worker stops its units, hands them
/// back and exits 130 / 143); a second signal kills the units' process groups
/// and exits at once.
fn watch_signals(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    tokio::spawn(async move {
        loop {
            let signal = tokio::select! {
                _ = interrupt.recv() => nix::sys::signal::Signal::SIGINT,
                _ = terminate.recv() => nix::sys::signal::Signal::SIGTERM,
            };
            let first = STOP_SIGNAL.compare_exchange(0, signal as i32, Ordering::SeqCst, Ordering::SeqCst);
            match first {
                Ok(_) => {
                    eprintln!("hopper: {signal}: stopping the running units and handing them back (signal again to kill them and exit at once)");
                    token.cancel();
                }
                Err(first) => {
                    eprintln!("hopper: {signal} again: killing the running units and exiting");
                    hopper::exec::groups::kill_all();
                    std::process::exit(exit::for_signal(first));
                }
            }
        }
    });
    Ok(())
}

/// The exit code for `error`: a stop by a signal is 128 + its number.
fn exit_code(error: &anyhow::Error) -> i32 {
    match error.downcast_ref::<HopperError>() {
        Some(HopperError::Interrupted) => match STOP_SIGNAL.load(Ordering::SeqCst) {
            0 => exit::INTERRUPTED,
            signal => exit::for_signal(signal),
        },
        Some(error) => error.exit_code(),
        None => exit::ERROR,
    }
}

async fn real_main(cli: Cli) -> anyhow::Result<i32> {
    let env = process_env;
    let code = match cli.command {
        Command::Run(args) => {
            let shutdown = CancellationToken::new();
            watch_signals(shutdown.clone())?;
            commands::run(run_options(*args)?, &env, shutdown).await?
        }
        Command::Report(args) => {
            let options = ReportOptions {
                // The report counts the build's outcomes into the units' pass
                // streaks, kept with the workers' timings (`--quarantine`).
                backend: backend_options(&args.queue, TimingsChoice::Default),
                queue: args.queue.queue,
                build: args.queue.build,
                junit: args.junit,
                html: args.html,
                wait_timeout: args.wait_timeout,
                worker_timeout: args.worker_timeout,
                appear_timeout: args.start_timeout,
                slowest: args.slowest,
                outage_grace: args.queue.outage_grace,
                flaky_result: args.verdict.flaky_result,
                quarantine: args.verdict.quarantine,
            };
            commands::report(options, &env).await?
        }
        Command::Status(args) => {
            let options = StatusOptions {
                backend: backend_options(&args.queue, TimingsChoice::Off),
                queue: args.queue.queue,
                build: args.queue.build,
                outage_grace: args.queue.outage_grace,
            };
            commands::status(options, &env).await?
        }
    };
    Ok(code)
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HOPPER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only where a person reads them, never into a CI log file.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("hopper: error: cannot start the async runtime: {error}");
            std::process::exit(exit::ERROR);
        }
    };
    let code = match runtime.block_on(real_main(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("hopper: error: {}", hopper::errors::error_report(error.as_ref()));
            exit_code(&error)
        }
    };
    // Do not wait for stray blocking tasks (a stdin read, a slow log write).
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}
