//! hopper's errors: each says what failed, on what, and (where there is one)
//! what to do about it. Every message fits on one line, so the binary can
//! print `hopper: <error>` and exit.

use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::errors::BoxError;
use leasehold_core::{IdError, QueueError, RunId, SpecError, UnitId};

/// Exit codes of the `hopper` binary.
pub mod exit {
    /// Every unit passed (flaky units pass, unless `--flaky-result fail`;
    /// quarantined units never fail the build).
    pub const PASSED: i32 = 0;
    /// At least one unit failed.
    pub const FAILED: i32 = 1;
    /// Bad input or a setup error (unreadable unit list, unreachable Redis, ...).
    pub const ERROR: i32 = 2;
    /// The run did not finish: every worker is gone or the wait timed out.
    pub const INCOMPLETE: i32 = 3;
    /// Interrupted by SIGINT (128 + 2, the shell's convention).
    pub const INTERRUPTED: i32 = 130;
    /// Stopped by SIGTERM (128 + 15).
    pub const TERMINATED: i32 = 143;

    /// The exit code for a stop by `signal` (128 + its number).
    pub fn for_signal(signal: i32) -> i32 {
        128 + signal
    }
}

/// Why the unit list could not be made.
#[derive(Debug, thiserror::Error)]
pub enum UnitsError {
    /// The unit file could not be read.
    #[error("cannot read unit list {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A glob pattern is malformed.
    #[error("bad glob pattern {pattern:?}: {source}")]
    BadGlob {
        /// The pattern.
        pattern: String,
        /// The cause.
        #[source]
        source: glob::PatternError,
    },
    /// A path matched by a glob could not be read.
    #[error("glob {pattern:?}: cannot read a matched path: {source}")]
    GlobWalk {
        /// The pattern.
        pattern: String,
        /// The cause.
        #[source]
        source: glob::GlobError,
    },
    /// The discover kind is not one hopper knows.
    #[error("unknown discover kind {kind:?}: use one of nextest, cargo-test, pytest, rspec")]
    UnknownDiscoverKind {
        /// What was given.
        kind: String,
    },
    /// The discovery tool could not be started.
    #[error("discovery with `{command}` could not start: {source}")]
    DiscoverSpawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The discovery tool failed.
    #[error("discovery with `{command}` failed ({status}): {detail}")]
    DiscoverFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// The last line of its error output, then the lines before it.
        detail: String,
    },
    /// The discovery tool's output could not be understood.
    #[error("discovery with `{command}`: cannot parse its output")]
    DiscoverParse {
        /// The command line.
        command: String,
        /// What was wrong.
        #[source]
        source: ListingError,
    },
    /// A unit name is not a valid unit id.
    #[error("unit \"{value}\" from {source_name} is not a valid unit")]
    BadUnit {
        /// Where it came from.
        source_name: String,
        /// The offending name (escaped, cut to its first characters).
        value: String,
        /// Why.
        #[source]
        error: IdError,
    },
    /// The sources gave no units at all.
    #[error("no units to run: {source_name} gave an empty unit list")]
    Empty {
        /// Where the (empty) list came from.
        source_name: String,
    },
    /// The listing does not match the tool's own count: running it would lose tests.
    #[error("discovery with `{command}` would lose tests: the tool counted {counted}, hopper has {units} unit(s); {lost}; nothing was run")]
    CountMismatch {
        /// The listing command.
        command: String,
        /// The tool's own count.
        counted: usize,
        /// The units hopper read.
        units: usize,
        /// What was lost.
        lost: String,
    },
    /// A test binary that cargo ran printed no listing at all: a target
    /// with `harness = false` and a harness of its own, whose tests
    /// hopper cannot run one by one. Leaving it out would pass a build that
    /// `cargo test` fails.
    #[error(
        "discovery with `{command}` would lose tests: cargo ran {binaries} test binaries and doctest runs, and only \
         {listed} listed their tests (`NAME: test` lines, as libtest and libtest-mimic print them); a target with \
         `harness = false` and a harness of its own lists no tests, so hopper cannot run it test by test, and leaving \
         it out would pass a build that `cargo test` fails. The binaries that listed nothing: {names}. Run such a target on its own (`cargo test --test NAME`, \
         e.g. as a unit of a `--units-from` list) and give hopper a command without it (`-- cargo test --lib \
         --test OTHER {{unit}}`); nothing was run"
    )]
    UnlistedTargets {
        /// The listing command.
        command: String,
        /// The test binaries and doctest runs cargo started.
        binaries: usize,
        /// Those that listed their tests.
        listed: usize,
        /// The binaries that listed nothing, as cargo named them.
        names: String,
    },
    /// Tests of one name in several cargo test targets (or packages), asked
    /// to run in batches, whose commands and reports name tests by their
    /// names alone.
    #[error(
        "{count} test name(s) are in more than one test target or package ({names}): a batch's command and its \
         libtest report name tests without their target, so hopper runs them apart only one test at a time \
         (`hopper run --discover cargo-test -- cargo test`, without --batch-size or --results), or use \
         `--discover nextest`; nothing was run"
    )]
    SharedTestNames {
        /// How many units name their targets.
        count: usize,
        /// Some of them.
        names: String,
    },
    /// hopper's private directory for its shipped plugins could not be made.
    #[error("cannot write hopper's test-tool plugins to a temporary directory: {source}")]
    Scratch {
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Why a test tool's listing could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// The output holds no JSON object.
    #[error("no JSON object in the output")]
    NoJson,
    /// The JSON is malformed.
    #[error("malformed JSON")]
    Json(#[from] serde_json::Error),
    /// The JSON is not of the shape the tool documents.
    #[error("{0}")]
    Shape(&'static str),
    /// The listing contradicts itself or the tool (counts, load errors).
    #[error("{0}")]
    Inconsistent(String),
}

/// Why a `--queue` URL could not be turned into a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The URL's scheme is not supported.
    #[error("unsupported queue URL \"{}\": use mem://, redis://host:port, rediss://host:port or redis+cluster://host:port,host:port", cut(url, NAME_SHOWN))]
    UnsupportedScheme {
        /// The URL given.
        url: String,
    },
    /// The Redis settings are invalid (URL, key prefix).
    #[error("invalid Redis settings")]
    BadConfig {
        /// What is wrong.
        #[source]
        source: BoxError,
    },
    /// The Redis server could not be reached.
    #[error("cannot reach Redis at {url}")]
    Unreachable {
        /// The URL (password removed).
        url: String,
        /// Whether it may answer later (refused, reset or timed out, as a
        /// restarting server is), unlike a refused certificate.
        may_come_back: bool,
        /// The cause.
        #[source]
        source: BoxError,
    },
    /// The memory queue lives inside one `hopper run` process only.
    #[error("`hopper {command}` needs a shared queue (redis://...): a mem:// run lives inside its `hopper run` process, which prints its own report")]
    MemoryNotShared {
        /// The subcommand.
        command: &'static str,
    },
}

impl BackendError {
    /// Whether trying again later may succeed.
    pub fn may_come_back(&self) -> bool {
        matches!(self, BackendError::Unreachable { may_come_back: true, .. })
    }
}

/// Why timings could not be read or written (never fatal to a run: logged).
pub use leasehold_core::TimingsError;

/// A bad combination of `--results`, `--batch-size`, the tool and the command.
// `{report}` is spelled out: this file imports nothing of hopper (a test in
// `verdicts` checks it against `REPORT_PLACEHOLDER`).
#[derive(Debug, thiserror::Error)]
pub enum VerdictsError {
    /// `--results` names no known format.
    #[error("unknown --results format {format:?}: use exit-code, junit, libtest-json or rspec-json")]
    UnknownFormat {
        /// What was given.
        format: String,
    },
    /// A batch with no way to tell its units apart.
    #[error(
        "--batch-size {batch_size} runs several units per invocation, and its exit code cannot say which of them \
         failed: pass --results junit|libtest-json|rspec-json with {{report}} where the tool writes its \
         report (e.g. `-- pytest --junitxml={{report}}`), or --results exit-code to give every unit \
         the batch's verdict"
    )]
    BatchNeedsResults {
        /// `--batch-size`.
        batch_size: usize,
    },
    /// A report format with no way to tell the tool where to write it.
    #[error(
        "--results {format} reads the report the tool writes at {{report}}, and the command has no \
         {{report}}: {advice}"
    )]
    NoReportPlaceholder {
        /// The format (as `--results` names it).
        format: &'static str,
        /// How to pass the path for this tool.
        advice: &'static str,
    },
    /// `{report}` with a format that reads no report.
    #[error("the command has {{report}} but --results exit-code reads no report: pass --results junit|libtest-json|rspec-json")]
    PlaceholderWithoutReport,
    /// The private directory for reports could not be made.
    #[error("cannot create a private directory for the tools' reports")]
    TempDir(#[source] std::io::Error),
}

/// Why an agent could not serve a slot.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent program could not be started.
    #[error("could not start the agent `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The agent exited before it said it was ready (a collection error, a bad command).
    #[error("the agent `{command}` exited before it was ready ({status}): {last_line}")]
    DiedBeforeReady {
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// The last line of its error output.
        last_line: String,
    },
    /// The agent speaks another protocol version.
    #[error("the agent speaks protocol version {got}, hopper speaks {want}")]
    Protocol {
        /// The agent's version.
        got: u32,
        /// hopper's version.
        want: u32,
    },
    /// The agent collected another number of tests than discovery did.
    #[error("the agent collected {collected} tests but discovery listed {expected}: the suite changed, or the agent's command differs from the listing's")]
    CollectedOther {
        /// Discovery's count.
        expected: u64,
        /// The agent's count.
        collected: u64,
    },
    /// Fresh agents keep dying without running a test.
    #[error("the agent died {times} times in a row without finishing a test (last: {status}): {last_line}")]
    KeepsDying {
        /// How many times.
        times: u32,
        /// How the last one ended.
        status: String,
        /// The last line of its error output.
        last_line: String,
    },
}

/// Why the `--quarantine` list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    /// The file is missing or unreadable.
    #[error("cannot read the --quarantine file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is a malformed glob.
    #[error("--quarantine file {path}, line {line}: bad glob pattern {pattern:?}: {source}")]
    Pattern {
        /// The file.
        path: PathBuf,
        /// The line's number (from 1).
        line: usize,
        /// The line.
        pattern: String,
        /// The cause.
        #[source]
        source: glob::PatternError,
    },
}

/// An error of a hopper command.
#[derive(Debug, thiserror::Error)]
pub enum HopperError {
    /// The unit list could not be made.
    #[error(transparent)]
    Units(#[from] UnitsError),
    /// The queue backend could not be made.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// `--results`, `--batch-size` and the command do not fit together.
    #[error(transparent)]
    Verdicts(#[from] VerdictsError),
    /// The `--quarantine` list could not be read.
    #[error(transparent)]
    Quarantine(#[from] QuarantineError),
    /// No command to run each unit was given.
    #[error("no command given: put the command to run each unit after `--`, e.g. `hopper run --glob 'tests/*.sh' -- sh {{unit}}`")]
    MissingCommand,
    /// A batch size of zero was asked for.
    #[error("--batch-size must be at least 1")]
    ZeroBatchSize,
    /// Zero local slots were asked for.
    #[error("-j must be at least 1")]
    ZeroSlots,
    /// A time limit of zero was given.
    #[error("{what} must be more than 0 seconds")]
    ZeroDuration {
        /// Which option.
        what: &'static str,
    },
    /// A time limit is shorter than the queue can count.
    #[error("{what} is too short")]
    BadDuration {
        /// Which option.
        what: &'static str,
        /// Why.
        #[source]
        source: SpecError,
    },
    /// No build id could be found for a shared queue.
    #[error("no build id: pass --build ID or set HOPPER_BUILD (all workers and the report of one build must use the same id)")]
    MissingBuild,
    /// A build or worker id is invalid.
    #[error("invalid {what}: {source}")]
    BadId {
        /// `--build` or `--worker`.
        what: &'static str,
        /// Why.
        #[source]
        source: IdError,
    },
    /// The budgets are invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The build id is already in use with other units.
    #[error("build {run} already exists with a different unit list ({existing} units, this worker has {given}): use a new --build id for a different suite")]
    BuildReused {
        /// The run.
        run: RunId,
        /// Units stored.
        existing: u64,
        /// Units of this worker.
        given: u64,
    },
    /// The build was started by a hopper that stores builds in another
    /// queue format.
    #[error("build {run} was started by another version of hopper, which stores builds in queue format {found} (this hopper writes format {expected}): run every worker of one build with the same hopper, or start this one under a new --build id")]
    BuildFromOtherVersion {
        /// The run.
        run: RunId,
        /// The format the build is stored in.
        found: String,
        /// The format this hopper writes.
        expected: String,
    },
    /// A queue call failed.
    #[error(transparent)]
    Queue(QueueError),
    /// The run's state is missing or inconsistent.
    #[error("build {run}: the queue's state is missing or corrupt (it may have expired): start a new build")]
    Corrupt {
        /// The run.
        run: RunId,
        /// What the queue found.
        #[source]
        source: QueueError,
    },
    /// The build's state vanished from the queue after this process had seen
    /// it: the queue's server restarted without persistence, or the state
    /// was deleted or expired.
    #[error("build {run}: the queue lost this build's state while it ran (a Redis restarted without persistence, a flushed database, or an expired build): its results are gone; run the build again with a new --build id")]
    StateLost {
        /// The run.
        run: RunId,
    },
    /// A worker slot's task panicked (a bug in hopper).
    #[error("worker slot {slot} crashed (a bug in hopper; please report it)")]
    SlotPanicked {
        /// The slot.
        slot: usize,
        /// The panic, as tokio caught it.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The run does not exist (yet) after waiting for it.
    #[error(
        "build {run} not found{}: no worker has started it (check --build and --queue)",
        if waited.is_zero() { String::new() } else { format!(" after waiting {:.1} s", waited.as_secs_f64()) }
    )]
    RunNotFound {
        /// The run.
        run: RunId,
        /// How long the report waited.
        waited: Duration,
    },
    /// Every worker of the run is gone while units remain.
    #[error("build {run} cannot finish: every worker is gone (no sign of life for {silent_for:?}) and {} unit(s) are unfinished: {}", unfinished.len(), name_units(unfinished))]
    WorkersGone {
        /// The run.
        run: RunId,
        /// How long no worker has shown a sign of life.
        silent_for: Duration,
        /// The units not finalized.
        unfinished: Vec<UnitId>,
    },
    /// The report's wait timed out while units remain.
    #[error("build {run}: gave up waiting after {waited:?} with {} unit(s) unfinished: {}", unfinished.len(), name_units(unfinished))]
    WaitTimeout {
        /// The run.
        run: RunId,
        /// How long it waited.
        waited: Duration,
        /// The units not finalized.
        unfinished: Vec<UnitId>,
    },
    /// The JUnit report could not be serialised.
    #[error("cannot write JUnit XML to {path}")]
    JunitSerialize {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: quick_junit::SerializeError,
    },
    /// The JUnit file could not be written.
    #[error("cannot write JUnit XML to {path}")]
    JunitWrite {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An agent could not serve its slot.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The HTML timeline could not be written.
    #[error("cannot write the HTML report to {path}")]
    Html {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `--rerun-failed` with a memory queue, which keeps no earlier build.
    #[error("--rerun-failed reads an earlier build's results from the queue, and a mem:// build lives only inside its own `hopper run` process (hopper keeps no outcomes on disk: .hopper/timings.json holds durations and pass streaks only): run the build and its rerun on a shared queue (--queue redis://...)")]
    RerunNeedsSharedQueue,
    /// The build `--rerun-failed` names is not in the queue.
    #[error("cannot rerun the failures of build {run}: the queue has no such build (it never ran on this --queue and --key-prefix, or it expired: a build is kept for --run-ttl, 1 day by default, after its last activity); nothing was run: check the build id, or run the whole suite without --rerun-failed")]
    RerunBuildMissing {
        /// The earlier build.
        run: RunId,
    },
    /// The build `--rerun-failed` names has units left to run.
    #[error("cannot rerun the failures of build {run} yet: {} of its unit(s) are unfinished ({}); nothing was run: wait for `hopper report --build {run}` to end, then rerun", unfinished.len(), name_units(unfinished))]
    RerunBuildUnfinished {
        /// The earlier build.
        run: RunId,
        /// Its units not finalized.
        unfinished: Vec<UnitId>,
    },
    /// The worker was interrupted by a signal.
    #[error("interrupted: stopped the running units and handed them back (with a shared queue, other workers take them over at once)")]
    Interrupted,
}

impl HopperError {
    /// The exit code the binary uses for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            HopperError::WorkersGone { .. } | HopperError::WaitTimeout { .. } | HopperError::StateLost { .. } => {
                exit::INCOMPLETE
            }
            HopperError::Interrupted => exit::INTERRUPTED,
            _ => exit::ERROR,
        }
    }
}

impl From<QueueError> for HopperError {
    fn from(error: QueueError) -> Self {
        match error {
            QueueError::Spec(spec) => HopperError::Spec(spec),
            QueueError::UnitListMismatch { run, existing, given } => HopperError::BuildReused { run, existing, given },
            QueueError::IncompatibleRun { run, found, expected } => {
                HopperError::BuildFromOtherVersion { run, found, expected }
            }
            QueueError::Corrupt { ref run, .. } => HopperError::Corrupt { run: run.clone(), source: error },
            other => HopperError::Queue(other),
        }
    }
}

/// Characters of one user-given name shown in a message.
pub const NAME_SHOWN: usize = 120;

/// `text` when it is at most `max` characters, else its first `max`
/// characters and how long it was: messages stay one readable line whatever
/// the input.
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}… ({} bytes in all)", &text[..end], text.len()),
    }
}

pub use leasehold_core::errors::error_chain as chain_message;
pub use leasehold_core::errors::error_report;

/// Names up to ten units, then how many more.
pub fn name_units(units: &[UnitId]) -> String {
    const SHOWN: usize = 10;
    let mut text = units.iter().take(SHOWN).map(|u| cut(u.as_str(), NAME_SHOWN)).collect::<Vec<_>>().join(", ");
    if units.len() > SHOWN {
        text.push_str(&format!(" and {} more", units.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_units_are_named_and_capped() {
        let units: Vec<UnitId> = (0..12).map(|i| UnitId::new(format!("u{i}")).unwrap()).collect();
        let err = HopperError::WorkersGone {
            run: RunId::new("b1").unwrap(),
            silent_for: Duration::from_secs(3),
            unfinished: units,
        };
        let text = err.to_string();
        assert!(text.contains("12 unit(s)"), "{text}");
        assert!(text.contains("u0, u1"), "{text}");
        assert!(text.contains("and 2 more"), "{text}");
        assert!(!text.contains('\n'));
        assert_eq!(err.exit_code(), exit::INCOMPLETE);
    }

    #[test]
    fn each_cause_is_printed_once_and_long_names_are_cut() {
        let bad = HopperError::BadId { what: "build id", source: RunId::new("").unwrap_err() };
        assert_eq!(chain_message(&bad), "invalid build id: run id is empty: give a non-empty run id");
        let units = UnitsError::BadUnit {
            source_name: "units.txt".into(),
            value: cut(&"x".repeat(100_000), NAME_SHOWN),
            error: UnitId::new("x".repeat(100_000)).unwrap_err(),
        };
        let text = chain_message(&units);
        assert!(text.len() < 400, "{text}");
        assert!(text.contains("(100000 bytes in all)") && text.contains("over the limit of 4096"), "{text}");
        assert_eq!(cut("short", 10), "short");
    }

    #[test]
    fn unit_list_mismatch_becomes_build_reused() {
        let err: HopperError =
            QueueError::UnitListMismatch { run: RunId::new("b").unwrap(), existing: 3, given: 4 }.into();
        assert!(matches!(err, HopperError::BuildReused { existing: 3, given: 4, .. }));
        assert!(err.to_string().contains("new --build"));
    }

    #[test]
    fn a_build_of_another_queue_format_says_what_to_do() {
        let err: HopperError =
            QueueError::IncompatibleRun { run: RunId::new("b").unwrap(), found: "1".into(), expected: "2".into() }
                .into();
        assert!(matches!(err, HopperError::BuildFromOtherVersion { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("queue format 1") && text.contains("same hopper") && text.contains("new --build"),
            "{text}"
        );
    }
}
