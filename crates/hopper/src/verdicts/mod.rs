//! The verdict on each unit of an invocation: the model ([`model`]: what a
//! unit's result is, and the exit code's reading), and the readers of the
//! test tool's own report ([`junit`], [`libtest`], [`rspec`], matched to the
//! units by [`matching`]).
//!
//! With `--batch-size N` one invocation runs N units, and its exit code says
//! only that *something* failed. So each unit's result is read from the
//! report the tool writes: JUnit XML (pytest `--junitxml`, nextest, most
//! tools), libtest JSON lines, or RSpec's JSON. A unit the report does not
//! mention has no result: it is retried within the budgets, never passed.
//!
//! Besides the units' verdicts, a report can hold errors outside any test
//! (a module fixture's teardown, a file that does not collect, RSpec's
//! `after(:context)`): [`outside`] keeps them apart from the tests and
//! records them, [`junit_merge`] reads cases with several status elements
//! (subtests), [`solo`] reruns alone the units a crashed batch left without
//! a result, and [`names`] gives the JUnit names.
//!
//! The report reaches the tool through the `{report}` placeholder: hopper
//! replaces it, in any argument, with a fresh path per invocation in a private
//! directory (also given as `HOPPER_REPORT`), reads the file when the
//! invocation ends and deletes it. For discovered pytest and rspec suites
//! hopper adds the tool's own option when the command has no `{report}`
//! (`--junitxml={report}`; for rspec, hopper's own formatter, `--format HopperRSpecReport --out {report}`).

pub mod case;
pub mod junit;
pub mod junit_merge;
pub mod libtest;
pub mod matching;
pub mod model;
pub mod names;
pub mod outside;
pub mod reruns;
pub mod rspec;
pub mod skips;
pub mod solo;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold_core::errors::error_chain;
use leasehold_core::UnitId;

pub use crate::errors::VerdictsError;
use crate::exec::process::{ProcessLimits, ProcessResult, Termination};
use crate::units::DiscoverKind;
pub use case::{CaseStatus, ReportedCase};
use matching::CaseIndex;
pub use model::{termination_verdict, BatchResults, ExitCodeResults, UnitResult, UnitVerdict};
use outside::OutsideError;

/// The placeholder replaced by the path the tool writes its report to.
pub const REPORT_PLACEHOLDER: &str = "{report}";
/// The environment variable that carries the same path.
pub const REPORT_ENV: &str = "HOPPER_REPORT";
/// Bytes of one test's own output kept with its failure.
const CASE_OUTPUT_BYTES: usize = 16 * 1024;

/// Where each unit's result comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultsFormat {
    /// The invocation's exit code, for every unit of it.
    ExitCode,
    /// A JUnit XML report.
    Junit,
    /// libtest's JSON lines.
    LibtestJson,
    /// RSpec's JSON formatter.
    RspecJson,
}

impl ResultsFormat {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultsFormat::ExitCode => "exit-code",
            ResultsFormat::Junit => "junit",
            ResultsFormat::LibtestJson => "libtest-json",
            ResultsFormat::RspecJson => "rspec-json",
        }
    }

    /// The report a discovered tool writes.
    pub fn of_tool(tool: DiscoverKind) -> Self {
        match tool {
            DiscoverKind::Pytest | DiscoverKind::Nextest => ResultsFormat::Junit,
            DiscoverKind::CargoTest => ResultsFormat::LibtestJson,
            DiscoverKind::Rspec => ResultsFormat::RspecJson,
        }
    }

    fn extension(self) -> &'static str {
        match self {
            ResultsFormat::Junit => "xml",
            ResultsFormat::ExitCode | ResultsFormat::LibtestJson | ResultsFormat::RspecJson => "json",
        }
    }
}

impl fmt::Display for ResultsFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ResultsFormat {
    type Err = VerdictsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exit-code" => Ok(ResultsFormat::ExitCode),
            "junit" => Ok(ResultsFormat::Junit),
            "libtest-json" => Ok(ResultsFormat::LibtestJson),
            "rspec-json" => Ok(ResultsFormat::RspecJson),
            other => Err(VerdictsError::UnknownFormat { format: other.to_owned() }),
        }
    }
}

/// How a run reads its units' results: the format and the command that
/// writes it (with the tool's report option added where hopper knows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsPlan {
    /// The format.
    pub format: ResultsFormat,
    /// The command template, `{report}` included when the format reads a report.
    pub command: Vec<String>,
}

impl ResultsPlan {
    /// Resolves `--results` (`requested`) against the batch size, the
    /// discovered tool and the command.
    ///
    /// Without `--results`, a larger batch reads the tool's report (an error
    /// when the tool is unknown), and so does a discovered pytest or rspec
    /// unit alone (`--per-process`): its exit code says nothing of skips,
    /// xfail or pending tests, nor that it ran any. Another batch of one
    /// reads the exit code. A
    /// report format with no `{report}` in the command gets the tool's own
    /// option (pytest, rspec), inserted before a lone `--` if there is one.
    pub fn resolve(
        requested: Option<ResultsFormat>,
        batch_size: usize,
        tool: Option<DiscoverKind>,
        mut command: Vec<String>,
    ) -> Result<Self, VerdictsError> {
        let has_placeholder = command.iter().any(|p| p.contains(REPORT_PLACEHOLDER));
        let format = match (requested, tool) {
            (Some(format), _) => format,
            (None, Some(tool)) if batch_size > 1 || has_placeholder => ResultsFormat::of_tool(tool),
            (None, Some(tool @ (DiscoverKind::Pytest | DiscoverKind::Rspec))) => ResultsFormat::of_tool(tool),
            (None, None) if batch_size > 1 => return Err(VerdictsError::BatchNeedsResults { batch_size }),
            (None, _) => ResultsFormat::ExitCode,
        };
        if format == ResultsFormat::ExitCode {
            if has_placeholder {
                return Err(VerdictsError::PlaceholderWithoutReport);
            }
            return Ok(Self { format, command });
        }
        if !has_placeholder {
            let added: &[&str] = match (format, tool) {
                (ResultsFormat::Junit, Some(DiscoverKind::Pytest)) => &["--junitxml={report}"],
                (ResultsFormat::RspecJson, Some(DiscoverKind::Rspec)) => &RSPEC_REPORT_OPTIONS,
                _ => {
                    return Err(VerdictsError::NoReportPlaceholder { format: format.as_str(), advice: advice(format) })
                }
            };
            let at = command.iter().position(|p| p == "--").unwrap_or(command.len());
            command.splice(at..at, added.iter().map(|a| (*a).to_owned()));
        }
        Ok(Self { format, command })
    }

    /// The [`BatchResults`] that reads this plan's format.
    pub fn results(&self) -> Result<std::sync::Arc<dyn BatchResults>, VerdictsError> {
        Ok(match self.format {
            ResultsFormat::ExitCode => std::sync::Arc::new(ExitCodeResults),
            format => std::sync::Arc::new(ToolReports::new(format)?),
        })
    }
}

/// What a discovered rspec's batch command gets: progress on the terminal,
/// and the report written by hopper's own formatter (RSpec's `json` one
/// loads `json` into the run).
const RSPEC_REPORT_OPTIONS: [&str; 8] = [
    "--require",
    RSPEC_REPORTER_PLACEHOLDER,
    "--format",
    "progress",
    "--format",
    "HopperRSpecReport",
    "--out",
    "{report}",
];

/// Where hopper's RSpec report formatter lies (its private directory, known
/// once the run starts): replaced in the command before the first unit runs.
pub const RSPEC_REPORTER_PLACEHOLDER: &str = "{hopper-rspec-reporter}";

fn advice(format: ResultsFormat) -> &'static str {
    match format {
        ResultsFormat::Junit => {
            "pytest: add --junitxml={report}; nextest: set [profile.NAME.junit] path in a file given with \
             --tool-config-file hopper:FILE, or any tool: write the JUnit XML to {report} or $HOPPER_REPORT"
        }
        ResultsFormat::LibtestJson => {
            "libtest prints its JSON on stdout (unstable: nightly, or RUSTC_BOOTSTRAP=1): run e.g. `sh -c 'cargo \
             test -q --no-fail-fast --tests -- -Z unstable-options --format json --report-time --exact \"$@\" > \
             {report}' sh {unit}` (and doctests with --doc, as the README shows)"
        }
        ResultsFormat::RspecJson => "add --format progress --format json --out {report}",
        ResultsFormat::ExitCode => "",
    }
}

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReportReadError {
    /// The tool wrote no report (or an unreadable one).
    #[error("the {format} report {path} could not be read")]
    Read {
        /// The format.
        format: ResultsFormat,
        /// Where it should have been.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The report is not valid JUnit XML.
    #[error("the JUnit report {path} is not valid JUnit XML")]
    Junit {
        /// The report.
        path: PathBuf,
        /// Why.
        #[source]
        source: quick_junit::DeserializeError,
    },
    /// The report is not RSpec's JSON.
    #[error("the RSpec report {path} is not RSpec's JSON")]
    Rspec {
        /// The report.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the report at `path` in `format`.
pub fn read_report(format: ResultsFormat, path: &Path) -> Result<Vec<ReportedCase>, ReportReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportReadError::Read {
        format,
        path: path.to_owned(),
        source,
    })?;
    match format {
        ResultsFormat::Junit => {
            junit::parse(&text).map_err(|source| ReportReadError::Junit { path: path.to_owned(), source })
        }
        ResultsFormat::LibtestJson => Ok(libtest::parse(&text)),
        ResultsFormat::RspecJson => {
            rspec::parse(&text).map_err(|source| ReportReadError::Rspec { path: path.to_owned(), source })
        }
        ResultsFormat::ExitCode => Ok(Vec::new()),
    }
}

/// The verdicts of `units` from the cases of their invocation's report.
///
/// A unit's verdict sums its cases: failed when one failed, skipped when all
/// were skipped, passed otherwise; its duration is the sum of theirs. A unit
/// with no case gets `missing` (it is retried, never passed).
pub fn verdicts_from_cases(
    units: &[UnitId],
    cases: &[ReportedCase],
    missing: &UnitVerdict,
) -> HashMap<UnitId, UnitResult> {
    let index = CaseIndex::new(cases.iter().map(|c| c.ids.clone()));
    units
        .iter()
        .map(|unit| {
            let mine: Vec<&ReportedCase> = index.cases_of(unit).into_iter().map(|i| &cases[i]).collect();
            (unit.clone(), sum_cases(&mine, missing))
        })
        .collect()
}

/// A report's failure message as one line, as an agent's result has it:
/// pytest's JUnit message holds the assertion's explanation too (`assert 2
/// == 3\n +  where 2 = f()`, or `[+5 more lines; full report in element
/// text]`), which the unit's output keeps. Messages merged from subtests
/// (joined by `; `) keep their first lines each; a first line is the first
/// that is not blank (RSpec's starts with a newline).
fn one_line(message: &str) -> String {
    let first = |m: &'_ str| m.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_owned();
    message.split("; ").map(first).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

fn sum_cases(cases: &[&ReportedCase], missing: &UnitVerdict) -> UnitResult {
    if cases.is_empty() {
        return UnitResult { verdict: missing.clone(), duration: None, output: None };
    }
    let duration = cases.iter().map(|c| c.duration).sum::<Option<Duration>>();
    let failed: Vec<&&ReportedCase> = cases.iter().filter(|c| c.status == CaseStatus::Failed).collect();
    if let Some(first) = failed.first() {
        let mut detail = first.message.as_deref().map(one_line).unwrap_or_default();
        if cases.len() > 1 {
            detail = format!("{} of {} tests failed; first: {detail}", failed.len(), cases.len());
        }
        let output: Vec<&str> = failed.iter().map(|c| c.output.as_str()).filter(|o| !o.is_empty()).collect();
        return UnitResult {
            verdict: UnitVerdict::Failed { reason: "test_failed", detail },
            duration,
            output: Some(tail(&output.join("\n"), CASE_OUTPUT_BYTES).to_owned()),
        };
    }
    if cases.iter().all(|c| c.status == CaseStatus::Skipped) {
        // The first reason given, as the skip's reason (see `UnitResult::output`).
        let reason = cases.iter().find_map(|c| c.message.clone());
        return UnitResult { verdict: UnitVerdict::Skipped, duration, output: reason };
    }
    UnitResult { verdict: UnitVerdict::Passed, duration, output: None }
}

/// The last `max` bytes of `text` at most, from a character's start.
pub(crate) fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The errors outside any test among `cases`, each with its group: a case
/// that names none gets the file where its traceback ends (pytest's last
/// line, `conftest.py:6: RuntimeError`: the fixture's own file), or else the
/// file of the first of `units` it belongs to. The test the report hung it
/// on is only the one that ran last before the teardown.
pub fn outside_errors(units: &[UnitId], cases: &[ReportedCase]) -> Vec<OutsideError> {
    let index = CaseIndex::new(cases.iter().map(|c| c.ids.clone()));
    let mut owner: HashMap<usize, &UnitId> = HashMap::new();
    for unit in units {
        for case in index.cases_of(unit) {
            owner.entry(case).or_insert(unit);
        }
    }
    let mut errors: Vec<OutsideError> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let Some(error) = &case.outside else { continue };
        let mut error = error.clone();
        if error.group.is_empty() {
            error.group = match (raised_in(&error.output), owner.get(&i)) {
                (Some(file), _) => file.to_owned(),
                (None, Some(unit)) => crate::agent::shards::file_of(unit.as_str()).to_owned(),
                (None, None) => case.ids.first().cloned().unwrap_or_else(|| "session".into()),
            };
        }
        if !errors.iter().any(|e| e.same_as(&error)) {
            errors.push(error);
        }
    }
    errors
}

/// The file of pytest's `path.py:LINE: ExceptionType`, the last line of a
/// failure's text: where the exception was raised.
fn raised_in(text: &str) -> Option<&str> {
    let last = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let (file, rest) = last.split_once(':')?;
    let (line, exception) = rest.split_once(": ")?;
    let is_location = file.ends_with(".py") && line.parse::<u32>().is_ok() && !exception.contains(' ');
    is_location.then_some(file)
}

/// Reads each invocation's report from a fresh path in a private directory.
#[derive(Debug)]
pub struct ToolReports {
    format: ResultsFormat,
    dir: tempfile::TempDir,
    next: AtomicU64,
    /// Errors outside any test read from reports, until the worker takes them.
    outside: parking_lot::Mutex<Vec<OutsideError>>,
}

impl ToolReports {
    /// Reports in `format`, written under a new private temporary directory
    /// (removed when this is dropped).
    pub fn new(format: ResultsFormat) -> Result<Self, VerdictsError> {
        let dir = tempfile::Builder::new().prefix("hopper-reports-").tempdir().map_err(VerdictsError::TempDir)?;
        Ok(Self { format, dir, next: AtomicU64::new(0), outside: Default::default() })
    }

    /// The verdict of a unit the report does not mention.
    fn missing(&self, termination: &Termination, limits: &ProcessLimits, why: &str) -> UnitVerdict {
        let invocation = match termination_verdict(termination, limits) {
            UnitVerdict::Failed { reason, detail } if reason != "exit" => {
                return UnitVerdict::Failed { reason, detail: format!("{detail}; {why}") }
            }
            UnitVerdict::Failed { detail, .. } => detail,
            UnitVerdict::Passed | UnitVerdict::Skipped => "exit code 0".to_owned(),
        };
        UnitVerdict::Failed { reason: "no_result", detail: format!("{why} (the invocation ended with {invocation})") }
    }
}

impl BatchResults for ToolReports {
    fn take_outside_errors(&self) -> Vec<OutsideError> {
        std::mem::take(&mut *self.outside.lock())
    }

    fn report_path(&self) -> Option<PathBuf> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Some(self.dir.path().join(format!("report-{n}.{}", self.format.extension())))
    }

    fn verdicts(
        &self,
        units: &[UnitId],
        result: &ProcessResult,
        limits: &ProcessLimits,
        report: Option<&Path>,
    ) -> HashMap<UnitId, UnitResult> {
        let Some(path) = report else {
            let missing = self.missing(&result.termination, limits, "no report path was given");
            return units.iter().map(|u| (u.clone(), UnitResult::from(missing.clone()))).collect();
        };
        let read = read_report(self.format, path);
        if let Err(error) = std::fs::remove_file(path) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(path = %path.display(), %error, "could not remove a read report");
            }
        }
        match read {
            Ok(cases) => {
                self.outside.lock().extend(outside_errors(units, &cases));
                let missing = self.missing(&result.termination, limits, &format!("not in the {} report", self.format));
                verdicts_from_cases(units, &cases, &missing)
            }
            Err(error) => {
                let why = error_chain(&error);
                tracing::warn!(units = units.len(), error = %why, "the batch's report is unusable; its units will be retried");
                let missing = self.missing(&result.termination, limits, &why);
                units.iter().map(|u| (u.clone(), UnitResult::from(missing.clone()))).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_message_is_shown_on_one_line() {
        assert_eq!(one_line("assert 2 == 3\n +  where 2 = f()"), "assert 2 == 3");
        assert_eq!(
            one_line("AssertionError: i is 1\nassert 1 == 0; AssertionError: i is 2"),
            "AssertionError: i is 1; AssertionError: i is 2"
        );
        assert_eq!(one_line("boom"), "boom");
        assert_eq!(one_line("\nexpected: 3\n     got: 2\n"), "expected: 3", "RSpec's message");
    }

    fn cmd(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    fn units(names: &[&str]) -> Vec<UnitId> {
        names.iter().map(|n| UnitId::new(*n).unwrap()).collect()
    }

    #[test]
    fn plans_follow_batch_size_tool_and_command() {
        let plan = ResultsPlan::resolve(None, 1, None, cmd(&["sh", "{unit}"])).unwrap();
        assert_eq!(plan.format, ResultsFormat::ExitCode);
        let plan = ResultsPlan::resolve(None, 50, Some(DiscoverKind::Pytest), cmd(&["pytest", "-q"])).unwrap();
        assert_eq!(plan.format, ResultsFormat::Junit);
        assert_eq!(plan.command, cmd(&["pytest", "-q", "--junitxml={report}"]));
        let plan = ResultsPlan::resolve(None, 5, Some(DiscoverKind::Rspec), cmd(&["rspec", "--", "{unit}"])).unwrap();
        let expected: Vec<&str> = [&["rspec"][..], &RSPEC_REPORT_OPTIONS, &["--", "{unit}"]].concat();
        assert_eq!(plan.command, cmd(&expected), "before the lone `--`");
        let mine = cmd(&["pytest", "--junit-xml", "{report}"]);
        let plan = ResultsPlan::resolve(Some(ResultsFormat::Junit), 5, None, mine.clone()).unwrap();
        assert_eq!(plan.command, mine, "the user's own {{report}} is kept");

        let err = ResultsPlan::resolve(None, 5, None, cmd(&["sh"])).unwrap_err().to_string();
        assert!(err.contains("--results exit-code") && err.contains(REPORT_PLACEHOLDER), "{err}");
        let err = ResultsPlan::resolve(Some(ResultsFormat::Junit), 5, None, cmd(&["x"])).unwrap_err().to_string();
        assert!(err.contains("--junitxml={report}"), "{err}");
        assert!(ResultsPlan::resolve(Some(ResultsFormat::ExitCode), 5, None, cmd(&["x", "{report}"])).is_err());
        assert!(ResultsPlan::resolve(Some(ResultsFormat::ExitCode), 5, None, cmd(&["x"])).is_ok());
        assert!("xml".parse::<ResultsFormat>().unwrap_err().to_string().contains("junit, libtest-json"));
    }

    fn case(ids: &[&str], status: CaseStatus, ms: u64) -> ReportedCase {
        ReportedCase {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            status,
            duration: Some(Duration::from_millis(ms)),
            message: (status == CaseStatus::Failed).then(|| "assert 1 == 2".to_owned()),
            output: if status == CaseStatus::Failed { "E  assert 1 == 2".into() } else { String::new() },
            outside: None,
        }
    }

    #[test]
    fn each_unit_gets_its_own_cases_verdict() {
        let cases = vec![
            case(&["t.test_a"], CaseStatus::Passed, 10),
            case(&["t.test_b"], CaseStatus::Failed, 20),
            case(&["t.test_c"], CaseStatus::Skipped, 0),
            case(&["u.test_p[1]"], CaseStatus::Passed, 1),
            case(&["u.test_p[2]"], CaseStatus::Failed, 2),
        ];
        let missing = UnitVerdict::Failed { reason: "no_result", detail: "not in the report".into() };
        let got = verdicts_from_cases(
            &units(&["t.py::test_a", "t.py::test_b", "t.py::test_c", "t.py::test_gone", "u.py"]),
            &cases,
            &missing,
        );
        let of = |n: &str| got[&UnitId::new(n).unwrap()].clone();
        assert_eq!(of("t.py::test_a").verdict, UnitVerdict::Passed);
        assert_eq!(of("t.py::test_a").duration, Some(Duration::from_millis(10)));
        assert!(matches!(of("t.py::test_b").verdict, UnitVerdict::Failed { reason: "test_failed", .. }));
        assert_eq!(of("t.py::test_b").output.as_deref(), Some("E  assert 1 == 2"));
        assert_eq!(of("t.py::test_c").verdict, UnitVerdict::Skipped);
        assert_eq!(of("t.py::test_gone").verdict, missing, "a unit with no case is never passed");
        assert!(matches!(of("u.py").verdict, UnitVerdict::Failed { ref detail, .. } if detail.starts_with("1 of 2")));
        assert_eq!(of("u.py").duration, Some(Duration::from_millis(3)));
    }

    #[test]
    fn a_missing_report_leaves_every_unit_without_result() {
        let reports = ToolReports::new(ResultsFormat::Junit).unwrap();
        let path = reports.report_path().unwrap();
        let result = ProcessResult {
            termination: Termination::Exited(0),
            duration: Duration::from_millis(5),
            output: crate::exec::process::OutputTail::new(64),
        };
        let got = reports.verdicts(&units(&["a", "b"]), &result, &ProcessLimits::default(), Some(&path));
        assert_eq!(got.len(), 2);
        for result in got.values() {
            assert!(
                matches!(&result.verdict, UnitVerdict::Failed { reason: "no_result", detail }
                    if detail.contains("could not be read") && detail.contains("exit code 0")),
                "{result:?}"
            );
        }
        let timed_out = ProcessResult { termination: Termination::TimedOut, ..result };
        let limits = ProcessLimits { timeout: Some(Duration::from_secs(3)), ..ProcessLimits::default() };
        let got = reports.verdicts(&units(&["a"]), &timed_out, &limits, Some(&path));
        assert!(matches!(&got[&UnitId::new("a").unwrap()].verdict, UnitVerdict::Failed { reason: "timeout", .. }));
    }
}
