//! `--quarantine FILE`: units that run and are reported, but never fail the
//! build, whatever their outcome.
//!
//! The file names one unit id or glob a line; `#` starts a comment line and
//! blank lines are ignored. A line matches a unit whose id it is, or, when it
//! has a glob's `*`, `?` or `[`, whose id the glob matches (`*` matches any
//! characters, `/` and `::` included: `tests/db/*` quarantines every test
//! under `tests/db/`). An id is tried whole first, so a parametrized test's
//! brackets (`test_x[1]`) need no escaping. A group (a file) that the list
//! names is quarantined too: an error outside its tests does not fail the
//! build either.
//!
//! **Ready to leave.** A quarantined unit that passed on its first attempt in
//! each of the last [`READY_AFTER`] builds in a row is named as ready to
//! leave the quarantine. The count is the timings store's
//! [`PassStreak`](leasehold_core::PassStreak) per unit: whoever gives the
//! verdict (`hopper run` on mem://, `hopper report` on a shared queue) counts
//! the build's outcomes into it ([`count_passes`]), for every unit, so a unit
//! quarantined later already has its history. A flaky pass, a failure or a
//! skip ends the streak; an unfinished unit leaves it as it was. The store
//! counts each build once however often it is reported.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use leasehold_core::{Outcome, TimingsStore};

use super::run_report::{failure_of, write_output_tail};
use super::{RunReport, UnitReport};
use crate::errors::QuarantineError;

/// Builds in a row a quarantined unit must pass to be ready to leave.
pub const READY_AFTER: u32 = 20;

/// The JUnit property of a quarantined unit's case: its outcome, and that it
/// does not fail the build.
pub const QUARANTINE_PROPERTY: &str = "hopper.quarantined";

/// One line of the list.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// The line as written (an id, or a glob).
    text: String,
    /// The glob, when the line is one.
    glob: Option<glob::Pattern>,
}

impl Entry {
    fn matches(&self, name: &str) -> bool {
        self.text == name || self.glob.as_ref().is_some_and(|g| g.matches(name))
    }
}

/// The quarantined units of a build, and what the timings store says of
/// their pass streaks once [`count_passes`] asked it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quarantine {
    file: Option<PathBuf>,
    entries: Vec<Entry>,
    /// Builds in a row each quarantined unit passed, this one included.
    streaks: HashMap<String, u32>,
}

impl Quarantine {
    /// Reads the list at `path` (see the module doc for its lines).
    pub fn read(path: &Path) -> Result<Self, QuarantineError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| QuarantineError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// The list in `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, QuarantineError> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let glob = if line.contains(['*', '?', '[']) {
                match glob::Pattern::new(line) {
                    Ok(glob) => Some(glob),
                    // Brackets alone may be a test's parameters, kept as an id.
                    Err(_) if !line.contains(['*', '?']) => None,
                    Err(source) => {
                        return Err(QuarantineError::Pattern {
                            path: path.to_owned(),
                            line: n + 1,
                            pattern: line.to_owned(),
                            source,
                        })
                    }
                }
            } else {
                None
            };
            entries.push(Entry { text: line.to_owned(), glob });
        }
        Ok(Self { file: Some(path.to_owned()), entries, streaks: HashMap::new() })
    }

    /// Whether the list names nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file the list was read from.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Whether the unit (or group) `name` is quarantined.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.matches(name))
    }

    /// Builds in a row the quarantined unit `name` passed, this one
    /// included, when the timings store was asked.
    pub fn streak(&self, name: &str) -> Option<u32> {
        self.streaks.get(name).copied()
    }

    /// Whether the quarantined unit `name` passed the last [`READY_AFTER`]
    /// builds in a row.
    pub fn is_ready_to_leave(&self, name: &str) -> bool {
        self.streak(name).is_some_and(|n| n >= READY_AFTER)
    }
}

/// A quarantined unit's outcome in words, as the report and the JUnit name it.
pub(super) fn outcome_of(unit: &UnitReport) -> String {
    match unit.outcome {
        Some(Outcome::Passed) if unit.is_flaky() => {
            format!("flaky (failed {}x, then passed)", unit.failed_attempts.len())
        }
        Some(Outcome::Passed) => "passed".into(),
        Some(Outcome::Skipped) => match &unit.skip_reason {
            Some(reason) => format!("skipped ({reason})"),
            None => "skipped".into(),
        },
        Some(Outcome::Failed) => format!("FAILED ({})", failure_of(unit)),
        None => "unfinished".into(),
    }
}

impl RunReport {
    /// What the JUnit case of a quarantined unit says of it: its outcome,
    /// that it does not fail the build, and whether it is ready to leave.
    pub(super) fn quarantine_note(&self, unit: &UnitReport) -> Option<String> {
        if !self.is_quarantined(unit) {
            return None;
        }
        let mut note = format!("{}; quarantined: does not fail the build", outcome_of(unit));
        if let Some(ready) = self.ready_note(unit) {
            note.push_str("; ");
            note.push_str(&ready);
        }
        Some(note)
    }

    fn ready_note(&self, unit: &UnitReport) -> Option<String> {
        let streak = self.quarantine.streak(unit.unit.as_str())?;
        self.quarantine
            .is_ready_to_leave(unit.unit.as_str())
            .then(|| format!("ready to leave the quarantine: passed in each of the last {streak} builds in a row"))
    }

    /// The report's QUARANTINED section: each quarantined unit with its
    /// outcome (a failure with its output's tail), then those ready to leave.
    pub(super) fn write_quarantined(&self, out: &mut String) {
        let quarantined: Vec<&UnitReport> = self.quarantined().collect();
        if quarantined.is_empty() {
            return;
        }
        let file = self.quarantine.file().map(|f| format!(" {}", f.display())).unwrap_or_default();
        let _ = writeln!(
            out,
            "\nQUARANTINED units ({}): run and reported, but never fail the build (--quarantine{file}):",
            quarantined.len()
        );
        for unit in &quarantined {
            let ready = self.ready_note(unit).map(|r| format!("; {r}")).unwrap_or_default();
            let _ = writeln!(out, "  QUARANTINED {}: {}{ready}", unit.unit, outcome_of(unit));
            if unit.is_failed() {
                write_output_tail(out, unit);
            }
        }
        let ready: Vec<&UnitReport> =
            quarantined.into_iter().filter(|u| self.quarantine.is_ready_to_leave(u.unit.as_str())).collect();
        if !ready.is_empty() {
            let _ = writeln!(
                out,
                "\nREADY to leave the quarantine ({}): passed in each of the last {READY_AFTER} builds in a row:",
                ready.len()
            );
            for unit in ready {
                let _ = writeln!(out, "  READY {}", unit.unit);
            }
        }
    }

    /// The verdict line's part on the quarantine (empty without one).
    pub(super) fn quarantine_summary(&self) -> String {
        let quarantined: Vec<&UnitReport> = self.quarantined().collect();
        if quarantined.is_empty() {
            return String::new();
        }
        let failed = quarantined.iter().filter(|u| u.is_failed()).count();
        let ready = quarantined.iter().filter(|u| self.quarantine.is_ready_to_leave(u.unit.as_str())).count();
        let ready = if ready > 0 { format!(", {ready} ready to leave") } else { String::new() };
        format!(", {} quarantined ({failed} failed, not counted{ready})", quarantined.len())
    }
}

/// Counts the build's outcomes into `store`'s pass streaks, as the build
/// `counted_as` (its id; each memory-mode run without an id of its own is
/// a build apart, see [`streak_id`]), and gives the report its quarantined
/// units' streaks (this build included). The store is advice, as for
/// timings: one that cannot be read or written is logged, and the report
/// goes on without streaks where it could not read them.
pub async fn count_passes(mut report: RunReport, store: &dyn TimingsStore, counted_as: &str) -> RunReport {
    let outcomes: Vec<(String, bool)> = report
        .units
        .iter()
        .filter_map(|u| u.outcome.map(|o| (u.unit.to_string(), o == Outcome::Passed && !u.is_flaky())))
        .collect();
    // Only the quarantined units' streaks are used: with none, the whole
    // hash (a field per unit of every build) is not fetched.
    let earlier = if report.quarantine.is_empty() {
        None
    } else {
        match store.load_streaks().await {
            Ok(streaks) => Some(streaks),
            Err(error) => {
                tracing::warn!(%error, "could not read the units' pass streaks; no unit is named ready to leave the quarantine");
                None
            }
        }
    };
    if let Err(error) = store.record_outcomes(counted_as, &outcomes).await {
        tracing::warn!(%error, "could not record this build's outcomes into the units' pass streaks");
    }
    let Some(earlier) = earlier else { return report };
    let run = counted_as;
    let quarantine = &mut report.quarantine;
    quarantine.streaks = outcomes
        .iter()
        .filter(|(unit, _)| quarantine.contains(unit))
        .map(|(unit, passed)| (unit.clone(), earlier.get(unit).cloned().unwrap_or_default().after(run, *passed).passes))
        .collect();
    report
}

/// The id a build's outcomes are counted under: its own, but for a
/// memory-mode run under the shared fallback id `local`, which would count
/// every local run as one build (a report made again): such a run is a
/// build of its own, named by the time and process.
pub fn streak_id(run: &str, fallback: Option<&str>) -> String {
    match fallback {
        Some(fallback) if run == fallback => {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default();
            format!("{run}-{ms}-{}", std::process::id())
        }
        _ => run.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::{RunId, UnitId, WorkerId};
    use leasehold_mem::MemoryStore;

    use super::*;
    use crate::report::FailedAttempt;

    fn list(text: &str) -> Quarantine {
        Quarantine::parse(text, Path::new("q.txt")).unwrap()
    }

    #[test]
    fn ids_and_globs_match_and_comments_are_ignored() {
        let q = list("# known flaky\n\ntests/test_a.py::test_x[1]\n  tests/db/*  \n");
        assert!(q.contains("tests/test_a.py::test_x[1]"), "an id with brackets matches itself");
        assert!(!q.contains("tests/test_a.py::test_x"));
        assert!(q.contains("tests/db/test_pg.py::test_one"), "* matches / and ::");
        assert!(!q.contains("tests/other.py::test_one"));
        assert!(!q.contains("# known flaky"));
        assert!(list("# nothing\n").is_empty());
        let error = Quarantine::parse("ok\n[*\n", Path::new("q.txt")).unwrap_err().to_string();
        assert!(error.contains("q.txt") && error.contains("line 2"), "{error}");
        let missing = Quarantine::read(Path::new("/no/such/quarantine.txt")).unwrap_err().to_string();
        assert!(missing.contains("/no/such/quarantine.txt"), "{missing}");
    }

    fn unit(name: &str, outcome: Outcome, flaky: bool) -> UnitReport {
        let mut unit = UnitReport::new(UnitId::new(name).unwrap(), "test".into());
        unit.outcome = Some(outcome);
        if flaky || outcome == Outcome::Failed {
            unit.failed_attempts.push(FailedAttempt {
                reason: "exit".into(),
                detail: "exit code 1".into(),
                output: String::new(),
                duration_ms: 1,
                worker: Some(WorkerId::new("w1").unwrap()),
            });
        }
        unit
    }

    fn build(n: u32, steady: Outcome, flaky: bool) -> RunReport {
        let mut report = RunReport::empty(RunId::new(format!("b{n}")).unwrap());
        report.units = vec![unit("steady", steady, flaky), unit("other", Outcome::Passed, false)];
        report.quarantining(list("steady\n"))
    }

    /// A quarantined failure leaves the build green, is listed on its own
    /// with its failure and output, and keeps its real status in the JUnit,
    /// marked; an error outside the tests of a quarantined file is ignored
    /// too, one of another file is not.
    #[test]
    fn a_quarantined_failure_is_reported_apart_and_does_not_fail_the_build() {
        let mut report = RunReport::empty(RunId::new("b1").unwrap());
        let mut bad = unit("tests/q.py::test_bad", Outcome::Failed, false);
        bad.failed_attempts[0].output = "AssertionError: known\n".into();
        report.units = vec![bad, unit("tests/ok.py::test_ok", Outcome::Passed, false)];
        assert!(!report.passed());
        let report = report.quarantining(list("tests/q.py*\n"));
        assert!(report.passed());
        assert_eq!(report.exit_code(), crate::errors::exit::PASSED);
        let text = report.render(0);
        assert!(!text.contains("FAILED units"), "{text}");
        assert!(text.contains("QUARANTINED tests/q.py::test_bad: FAILED (exit code 1; 1 failed attempt(s))"), "{text}");
        assert!(text.contains("| AssertionError: known"), "{text}");
        assert!(
            text.contains(
                "PASSED: 2 units, 1 passed (0 flaky), 0 failed, 0 unfinished, 1 quarantined (1 failed, not counted)"
            ),
            "{text}"
        );
        let xml = report.junit().to_string().unwrap();
        assert!(xml.contains("<failure"), "{xml}");
        assert!(xml.contains("name=\"hopper.quarantined\" value=\"FAILED (exit code 1; 1 failed attempt(s)); quarantined: does not fail the build\""), "{xml}");
        let outside = |group: &str| crate::verdicts::outside::OutsideError {
            group: group.into(),
            phase: "setup".into(),
            message: "boom".into(),
            output: String::new(),
        };
        let mut report = report;
        report.outside_errors.push(outside("tests/q.py"));
        assert!(report.passed(), "an error outside the tests of a quarantined file");
        report.outside_errors.push(outside("tests/ok.py"));
        assert!(!report.passed());
    }

    async fn count(report: RunReport, store: &MemoryStore) -> RunReport {
        let id = report.run.to_string();
        count_passes(report, store, &id).await
    }

    #[test]
    fn local_runs_are_builds_apart_and_others_keep_their_id() {
        assert_eq!(streak_id("b7", Some("local")), "b7");
        assert_eq!(streak_id("local", None), "local");
        assert!(streak_id("local", Some("local")).starts_with("local-"));
    }

    /// 20 clean passes in a row make a quarantined unit ready to leave; a
    /// report made twice counts its build once; a failure or a flaky pass
    /// starts the count again; units outside the quarantine are counted but
    /// not named.
    #[tokio::test]
    async fn ready_to_leave_after_twenty_passing_builds_in_a_row() {
        let store = MemoryStore::new();
        let report = count(build(0, Outcome::Failed, false), &store).await;
        assert_eq!(report.quarantine.streak("steady"), Some(0));
        assert_eq!(report.quarantine.streak("other"), None, "not quarantined: not named");
        for n in 1..READY_AFTER {
            let report = count(build(n, Outcome::Passed, false), &store).await;
            assert_eq!(report.quarantine.streak("steady"), Some(n));
            assert!(!report.quarantine.is_ready_to_leave("steady"), "after {n} builds");
        }
        // The 19th build reported again: still 19.
        let again = count(build(READY_AFTER - 1, Outcome::Passed, false), &store).await;
        assert_eq!(again.quarantine.streak("steady"), Some(READY_AFTER - 1));
        let ready = count(build(READY_AFTER, Outcome::Passed, false), &store).await;
        assert!(ready.quarantine.is_ready_to_leave("steady"));
        assert!(ready.render(0).contains("ready to leave the quarantine"), "{}", ready.render(0));
        assert_eq!(store.load_streaks().await.unwrap()["other"].passes, READY_AFTER + 1, "every unit is counted");
        // A flaky pass ends the streak.
        let flaky = count(build(READY_AFTER + 1, Outcome::Passed, true), &store).await;
        assert_eq!(flaky.quarantine.streak("steady"), Some(0));
        assert!(!flaky.quarantine.is_ready_to_leave("steady"));
    }
}
