//! The build's report: read from the queue's event log, so any process can
//! make it (the memory-mode runner at its end, or `hopper report` in CI).
//!
//! [`wait_for_end`] waits until every unit is finalized, and fails clearly
//! (never hangs) when every worker is gone or the wait times out.
//! [`RunReport::render`] prints the verdict, failures with their output,
//! flaky units, requeue/reclaim counts and the slowest units;
//! [`RunReport::junit`] (in `junit.rs`) gives JUnit XML with flaky units
//! marked as such. Whether a flaky unit passes the build is the report's
//! [`FlakyResult`] (`--flaky-result`); quarantined units (`--quarantine`,
//! see [`super::quarantine`]) never fail it, and are listed on their own.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use leasehold_core::{Event, FinalizeReason, Outcome, RunId, RunLog, UnitId, WorkerId};
use tokio::time::Instant;

use super::event_log::LogFollower;
use super::flaky::FlakyResult;
use super::quarantine::Quarantine;
use crate::errors::HopperError;
use crate::verdicts::outside::{self, OutsideError};
use crate::verdicts::{reruns, skips};

/// A queue call slower than this was an outage, not a slow answer.
const QUEUE_PAUSE: Duration = Duration::from_secs(1);
/// How long `hopper report` waits for a build that does not exist before it
/// says so (and goes on waiting for it to start).
const MISSING_NOTICE: Duration = Duration::from_secs(2);
/// While the log is busy, the report reads the build's counters at most this
/// often; each read follows a wake-up on the log.
const FOLLOW_GAP: Duration = Duration::from_millis(50);
/// Lines of output shown per failure in the text report.
const TAIL_LINES: usize = 30;
/// Up to this many reclaimed units get a line each; more are grouped.
const RECLAIMED_LINES: usize = 20;
/// The JUnit property of a unit reclaimed from a worker that stopped
/// responding: from whom, and who finished it.
pub const RECLAIMED_PROPERTY: &str = "hopper.reclaimed";

/// One failed attempt of a unit.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedAttempt {
    /// `exit`, `timeout`, `signal`, `spawn`, `no_result` or a queue reason.
    pub reason: String,
    /// A short description (`exit code 1`, `timed out after 5.0s`, ...).
    pub detail: String,
    /// The tail of the attempt's output (empty when unknown).
    pub output: String,
    /// How long it ran.
    pub duration_ms: u64,
    /// The worker that ran it, when known.
    pub worker: Option<WorkerId>,
}

/// Everything the report knows about one unit.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitReport {
    /// The unit.
    pub unit: UnitId,
    /// Its kind label.
    pub kind: String,
    /// Its final outcome; `None` while unfinished.
    pub outcome: Option<Outcome>,
    /// Why it was finalized, when not a plain result.
    pub reason: Option<FinalizeReason>,
    /// Duration of the final attempt.
    pub duration_ms: u64,
    /// The worker that finalized it.
    pub finalized_by: Option<WorkerId>,
    /// Failed attempts, in order (including the final one when it failed).
    pub failed_attempts: Vec<FailedAttempt>,
    /// Times it was reclaimed from a dead worker, and from whom.
    pub reclaimed_from: Vec<Option<WorkerId>>,
    /// Times it was requeued for another attempt.
    pub requeues: u32,
    /// Times a worker abandoned it on shutdown.
    pub abandoned: u32,
    /// Finalized events seen (exactly 1 when the queue keeps its contract).
    pub finalized_events: u32,
    /// Why it was skipped, when it was and the tool said.
    pub skip_reason: Option<String>,
    /// It passed despite an xfail mark (pytest's "xpassed").
    pub xpassed: bool,
}

impl UnitReport {
    pub(super) fn new(unit: UnitId, kind: String) -> Self {
        Self {
            unit,
            kind,
            outcome: None,
            reason: None,
            duration_ms: 0,
            finalized_by: None,
            failed_attempts: Vec::new(),
            reclaimed_from: Vec::new(),
            requeues: 0,
            abandoned: 0,
            finalized_events: 0,
            skip_reason: None,
            xpassed: false,
        }
    }

    /// Failed at least once, then passed.
    pub fn is_flaky(&self) -> bool {
        self.outcome == Some(Outcome::Passed) && !self.failed_attempts.is_empty()
    }

    /// A worker-specific failure: flaky, and every failed attempt ran on a
    /// worker other than the one it passed on. The workers it failed on (each
    /// once, in order) and the one it passed on; a hint about those machines,
    /// not about the test.
    pub fn worker_specific(&self) -> Option<(Vec<&WorkerId>, &WorkerId)> {
        let passed_on = self.finalized_by.as_ref().filter(|_| self.is_flaky())?;
        let mut failed_on: Vec<&WorkerId> = Vec::new();
        for attempt in &self.failed_attempts {
            let worker = attempt.worker.as_ref().filter(|w| *w != passed_on)?;
            if !failed_on.contains(&worker) {
                failed_on.push(worker);
            }
        }
        Some((failed_on, passed_on))
    }

    /// Whom it was reclaimed from and who finished it (`from w1, finished
    /// by w2`), for a reclaimed unit.
    pub fn reclaim_note(&self) -> String {
        let from: Vec<String> =
            self.reclaimed_from.iter().map(|w| w.as_ref().map_or_else(|| "?".into(), |w| w.to_string())).collect();
        let by = self.finalized_by.as_ref().map(|w| format!(", finished by {w}")).unwrap_or_default();
        format!("from {}{by}", from.join(", "))
    }

    /// Finalized as failed.
    pub fn is_failed(&self) -> bool {
        self.outcome == Some(Outcome::Failed)
    }
}

/// The report of one build.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// The build.
    pub run: RunId,
    /// Every unit, in the run's initial order.
    pub units: Vec<UnitReport>,
    /// Results dropped because the unit had a newer owner.
    pub stale_rejected: u64,
    /// Worker errors recorded.
    pub worker_errors: Vec<String>,
    /// Errors the tool reported outside any test, each once, in the order
    /// first recorded: each fails the build.
    pub outside_errors: Vec<OutsideError>,
    /// Files or groups skipped whole before any test (pytest's module-level
    /// skips), each once, with their reasons.
    pub outside_skips: Vec<OutsideError>,
    /// Workers that said they ended (after their agents' final teardowns).
    pub finished_workers: Vec<WorkerId>,
    /// Whether a flaky unit passes or fails the build (`--flaky-result`).
    pub flaky_result: FlakyResult,
    /// The units that never fail the build (`--quarantine`).
    pub quarantine: Quarantine,
    /// The failure limit the build stopped at (`--max-failures`), when it
    /// did: its unfinished units were never run.
    pub stopped_after: Option<u32>,
}

/// An attempt's detail with the worker that ran it, when known.
pub(super) fn attempt_on_worker(attempt: &FailedAttempt) -> String {
    match &attempt.worker {
        Some(worker) => format!("{} on {worker}", attempt.detail),
        None => attempt.detail.clone(),
    }
}

fn text_field(errors: Option<&serde_json::Value>, field: &str) -> Option<String> {
    errors.and_then(|e| e.get(field)).and_then(|v| v.as_str()).map(str::to_owned)
}

fn attempt_from(
    errors: Option<&serde_json::Value>,
    summary: Option<&str>,
    duration_ms: u64,
    fallback_reason: &str,
    worker: &WorkerId,
) -> FailedAttempt {
    FailedAttempt {
        reason: text_field(errors, "reason").unwrap_or_else(|| fallback_reason.to_owned()),
        detail: text_field(errors, "detail").or_else(|| summary.map(str::to_owned)).unwrap_or_default(),
        output: text_field(errors, "output").unwrap_or_default(),
        duration_ms,
        worker: Some(worker.clone()),
    }
}

impl RunReport {
    /// Reads the run's units and its whole event log. `None` when the run
    /// does not exist.
    pub async fn load(queue: &dyn RunLog, run: &RunId) -> Result<Option<Self>, HopperError> {
        let Some(mut followed) = FollowedReport::open(queue, run).await? else { return Ok(None) };
        followed.catch_up().await?;
        Ok(Some(followed.finish(queue).await?))
    }

    /// The report of `run` before any unit or event.
    pub(super) fn empty(run: RunId) -> Self {
        RunReport {
            run,
            units: Vec::new(),
            stale_rejected: 0,
            worker_errors: Vec::new(),
            outside_errors: Vec::new(),
            outside_skips: Vec::new(),
            finished_workers: Vec::new(),
            flaky_result: FlakyResult::default(),
            quarantine: Quarantine::default(),
            stopped_after: None,
        }
    }

    fn apply(&mut self, index: &HashMap<UnitId, usize>, event: Event) {
        let slot = event.unit_id().and_then(|u| index.get(u)).copied();
        match event {
            Event::Requeued { header, duration_ms, failure_summary, errors, .. } => {
                if let Some(i) = slot {
                    self.units[i].requeues += 1;
                    self.units[i].failed_attempts.push(attempt_from(
                        errors.as_ref(),
                        failure_summary.as_deref(),
                        duration_ms,
                        "failed",
                        &header.worker_id,
                    ));
                }
            }
            Event::Finalized {
                header,
                outcome,
                duration_ms,
                reason,
                errors,
                failure_summary,
                previous_worker_id,
                ..
            } => {
                let Some(i) = slot else { return };
                let unit = &mut self.units[i];
                unit.finalized_events += 1;
                unit.outcome = Some(outcome);
                unit.duration_ms = duration_ms;
                unit.finalized_by = Some(header.worker_id.clone());
                if outcome == Outcome::Skipped {
                    unit.skip_reason = skips::reason_of(errors.as_ref());
                }
                unit.xpassed = outcome == Outcome::Passed && skips::xpassed(errors.as_ref());
                // The tool's own failed tries before this pass: it is flaky.
                for (detail, output) in reruns::of(errors.as_ref()) {
                    let reason = reruns::RERUN_REASON.to_owned();
                    let worker = Some(header.worker_id.clone());
                    unit.failed_attempts.push(FailedAttempt { reason, detail, output, duration_ms: 0, worker });
                }
                if outcome == Outcome::Failed {
                    let fallback = reason.as_ref().map(|r| r.as_str().to_owned()).unwrap_or_else(|| "failed".into());
                    let mut attempt = attempt_from(
                        errors.as_ref(),
                        failure_summary.as_deref(),
                        duration_ms,
                        &fallback,
                        &header.worker_id,
                    );
                    if reason == Some(FinalizeReason::ReclaimBudgetExhausted) {
                        attempt.detail = format!(
                            "reclaimed too often: its worker{} stopped responding",
                            previous_worker_id.map(|w| format!(" {w}")).unwrap_or_default()
                        );
                        attempt.worker = None;
                    }
                    unit.failed_attempts.push(attempt);
                }
                unit.reason = reason;
            }
            Event::Reclaimed { previous_worker_id, .. } => {
                if let Some(i) = slot {
                    self.units[i].reclaimed_from.push(previous_worker_id);
                }
            }
            Event::Abandoned { .. } => {
                if let Some(i) = slot {
                    self.units[i].abandoned += 1;
                }
            }
            Event::StaleRejected { .. } => self.stale_rejected += 1,
            Event::WorkerError { worker_id, message, .. } if message == outside::WORKER_DONE => {
                self.finished_workers.push(worker_id);
            }
            Event::WorkerError { message, .. } if OutsideError::from_event_message(&message).is_some() => {
                if let Some(error) = OutsideError::from_event_message(&message) {
                    let kept = if error.is_skip() { &mut self.outside_skips } else { &mut self.outside_errors };
                    if !kept.iter().any(|e| e.same_as(&error)) {
                        kept.push(error);
                    }
                }
            }
            Event::WorkerError { worker_id, unit_id, message, .. } => {
                let unit = unit_id.map(|u| format!(" ({u})")).unwrap_or_default();
                self.worker_errors.push(format!("{worker_id}{unit}: {message}"));
            }
            Event::Delivered { .. } | Event::Released { .. } => {}
        }
    }

    /// The reason a unit that did not run is skipped, when the build stopped
    /// at its failure limit.
    pub fn not_run_reason(&self) -> Option<String> {
        self.stopped_after
            .map(|limit| format!("not run: the build stopped after {limit} failures (--max-failures {limit})"))
    }

    /// Units not finalized yet (never run, when the build stopped).
    pub fn unfinished(&self) -> Vec<UnitId> {
        self.units.iter().filter(|u| u.outcome.is_none()).map(|u| u.unit.clone()).collect()
    }

    /// Units finalized as failed.
    pub fn failed(&self) -> impl Iterator<Item = &UnitReport> {
        self.units.iter().filter(|u| u.is_failed())
    }

    /// Units that failed, then passed on a retry.
    pub fn flaky(&self) -> impl Iterator<Item = &UnitReport> {
        self.units.iter().filter(|u| u.is_flaky())
    }

    /// The same report, with flaky units counted as `flaky_result` says.
    pub fn counting_flaky_as(mut self, flaky_result: FlakyResult) -> Self {
        self.flaky_result = flaky_result;
        self
    }

    /// The same report, with the units `quarantine` names never failing the build.
    pub fn quarantining(mut self, quarantine: Quarantine) -> Self {
        self.quarantine = quarantine;
        self
    }

    /// Whether `unit` is quarantined (it never fails the build).
    pub fn is_quarantined(&self, unit: &UnitReport) -> bool {
        self.quarantine.contains(unit.unit.as_str())
    }

    /// The quarantined units, in the run's order.
    pub fn quarantined(&self) -> impl Iterator<Item = &UnitReport> {
        self.units.iter().filter(|u| self.is_quarantined(u))
    }

    /// Units finalized as failed that fail the build (not quarantined).
    pub fn failing(&self) -> impl Iterator<Item = &UnitReport> {
        self.failed().filter(|u| !self.is_quarantined(u))
    }

    /// The errors outside tests that fail the build: those of groups the
    /// quarantine does not name.
    pub fn failing_outside_errors(&self) -> impl Iterator<Item = &OutsideError> {
        self.outside_errors.iter().filter(|e| !self.quarantine.contains(&e.group))
    }

    /// Whether every unit finished and passed (flaky units pass unless
    /// `--flaky-result fail`; quarantined units always pass), and the tool
    /// reported no error outside a test (but in a quarantined group).
    pub fn passed(&self) -> bool {
        let flaky_fail = self.flaky_result == FlakyResult::Fail;
        self.failing_outside_errors().next().is_none()
            && self.units.iter().filter(|u| !self.is_quarantined(u)).all(|u| match u.outcome {
                Some(Outcome::Passed) => !(flaky_fail && u.is_flaky()),
                Some(Outcome::Skipped) => true,
                Some(Outcome::Failed) | None => false,
            })
    }

    /// The errors outside any test by group, groups in the order first seen.
    pub(super) fn outside_by_group(&self) -> Vec<(&str, Vec<&OutsideError>)> {
        let mut groups: Vec<(&str, Vec<&OutsideError>)> = Vec::new();
        for error in &self.outside_errors {
            match groups.iter_mut().find(|(g, _)| *g == error.group) {
                Some((_, errors)) => errors.push(error),
                None => groups.push((error.group.as_str(), vec![error])),
            }
        }
        groups
    }

    /// The `n` slowest units (final attempt duration).
    pub fn slowest(&self, n: usize) -> Vec<&UnitReport> {
        let mut finished: Vec<&UnitReport> = self.units.iter().filter(|u| u.outcome.is_some()).collect();
        finished.sort_by_key(|u| std::cmp::Reverse(u.duration_ms));
        finished.truncate(n);
        finished
    }

    /// The process exit code: 0 passed, 1 failed or unfinished.
    pub fn exit_code(&self) -> i32 {
        if self.passed() {
            crate::errors::exit::PASSED
        } else {
            crate::errors::exit::FAILED
        }
    }

    /// The human-readable report, ending with the verdict line.
    pub fn render(&self, slowest: usize) -> String {
        let mut out = String::new();
        let total = self.units.len();
        let failed: Vec<&UnitReport> = self.failing().collect();
        let flaky: Vec<&UnitReport> = self.flaky().filter(|u| !self.is_quarantined(u)).collect();
        let unfinished = self.unfinished();
        // Passes despite an xfail mark apart, as pytest counts them.
        let xpassed = self.units.iter().filter(|u| u.xpassed).count();
        let passed = self.units.iter().filter(|u| u.outcome == Some(Outcome::Passed)).count() - xpassed;
        // Said only when there are any, so that every unit is counted
        // somewhere; expected failures apart, as pytest counts them.
        let skips = self.units.iter().filter(|u| u.outcome == Some(Outcome::Skipped));
        let xfailed = skips.clone().filter(|u| u.skip_reason.as_deref().is_some_and(skips::is_xfail)).count();
        let skipped: String = [(skips.count() - xfailed, "skipped"), (xfailed, "xfailed"), (xpassed, "xpassed")]
            .into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!(", {n} {what}"))
            .collect();
        let skipped = match self.outside_skips.len() {
            0 => skipped,
            n => format!("{skipped}, {n} file(s) skipped"),
        };
        let requeued = self.units.iter().filter(|u| u.requeues > 0).count();
        let requeues: u64 = self.units.iter().map(|u| u64::from(u.requeues)).sum();
        let reclaims: usize = self.units.iter().map(|u| u.reclaimed_from.len()).sum();

        if !failed.is_empty() {
            let _ = writeln!(out, "\nFAILED units ({}):", failed.len());
            for unit in &failed {
                let _ = writeln!(out, "  FAIL {} ({})", unit.unit, failure_of(unit));
                write_output_tail(&mut out, unit);
            }
        }
        if !flaky.is_empty() {
            let counted = match self.flaky_result {
                FlakyResult::Pass => "",
                FlakyResult::Fail => " (each fails the build: --flaky-result fail)",
            };
            let _ = writeln!(out, "\nFLAKY units ({}): failed, then passed on a retry{counted}:", flaky.len());
            for unit in &flaky {
                let details: Vec<String> = unit.failed_attempts.iter().map(attempt_on_worker).collect();
                let passed = unit.finalized_by.as_ref().map(|w| format!("; passed on {w}")).unwrap_or_default();
                let _ =
                    writeln!(out, "  FLAKY {} (failed {}x: {}{passed})", unit.unit, details.len(), details.join("; "));
            }
            let specific: Vec<_> = flaky.iter().filter_map(|u| Some((u, u.worker_specific()?))).collect();
            if !specific.is_empty() {
                let _ = writeln!(
                    out,
                    "\nWORKER-SPECIFIC failures ({}): failed only on some workers and passed on another, a hint about those machines, not the test:",
                    specific.len()
                );
                for (unit, (failed_on, passed_on)) in &specific {
                    let failed_on: Vec<String> = failed_on.iter().map(|w| w.to_string()).collect();
                    let _ = writeln!(
                        out,
                        "  WORKER-SPECIFIC {} (failed on {}, passed on {passed_on})",
                        unit.unit,
                        failed_on.join(", ")
                    );
                }
            }
        }
        let reclaimed: Vec<&UnitReport> = self.units.iter().filter(|u| !u.reclaimed_from.is_empty()).collect();
        if !reclaimed.is_empty() {
            let _ = writeln!(
                out,
                "\nRECLAIMED units ({}): taken over from a worker that stopped responding (each was running there or \
                 reserved ahead for its slots; the reclaim timeout, --timeout, passed first):",
                reclaimed.len()
            );
            if reclaimed.len() <= RECLAIMED_LINES {
                for unit in &reclaimed {
                    let _ = writeln!(out, "  RECLAIMED {} ({})", unit.unit, unit.reclaim_note());
                }
            } else {
                // A killed worker's reserve ahead can be hundreds of units:
                // one line for the units of each worker (the JUnit names each).
                let mut by_note: Vec<(String, Vec<UnitId>)> = Vec::new();
                for unit in &reclaimed {
                    let note = unit.reclaim_note();
                    match by_note.iter_mut().find(|(n, _)| *n == note) {
                        Some((_, units)) => units.push(unit.unit.clone()),
                        None => by_note.push((note, vec![unit.unit.clone()])),
                    }
                }
                for (note, units) in &by_note {
                    let _ = writeln!(
                        out,
                        "  RECLAIMED {} unit(s) ({note}): {}",
                        units.len(),
                        crate::errors::name_units(units)
                    );
                }
                let _ = writeln!(out, "  (the JUnit XML names each in its {} property)", RECLAIMED_PROPERTY);
            }
        }
        self.write_quarantined(&mut out);
        if let Some(limit) = self.stopped_after {
            let _ = writeln!(
                out,
                "\nNOT RUN units ({}): {}\nhopper: stopped after {limit} failures (--max-failures); {} units not run",
                unfinished.len(),
                crate::errors::name_units(&unfinished),
                unfinished.len()
            );
        } else if !unfinished.is_empty() {
            let _ =
                writeln!(out, "\nUNFINISHED units ({}): {}", unfinished.len(), crate::errors::name_units(&unfinished));
        }
        if !self.outside_errors.is_empty() {
            let _ = writeln!(out, "\nERRORS outside tests ({}):", self.outside_errors.len());
            for error in &self.outside_errors {
                let quarantined =
                    if self.quarantine.contains(&error.group) { " [quarantined: does not fail the build]" } else { "" };
                let _ =
                    writeln!(out, "  ERROR {} ({} error: {}){quarantined}", error.group, error.phase, error.message);
                for line in tail_lines(&error.output, TAIL_LINES) {
                    let _ = writeln!(out, "    | {line}");
                }
            }
        }
        // Skips by reason, as pytest's `-rs` has them: a reason, and how
        // many; expected failures apart, as pytest's `-rx` has them.
        let mut reasons: Vec<(&str, usize)> = Vec::new();
        let mut xfails: Vec<(&str, usize)> = Vec::new();
        // A skip without a reason (libtest's bare `#[ignore]`, rustdoc's
        // `ignore` blocks) is listed too, as "(no reason given)".
        for reason in self
            .units
            .iter()
            .filter(|u| u.outcome == Some(Outcome::Skipped))
            .map(|u| u.skip_reason.as_deref().unwrap_or(""))
        {
            let (list, reason) = match skips::xfail_own_reason(reason) {
                Some(own) => (&mut xfails, own),
                None => (&mut reasons, reason),
            };
            match list.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += 1,
                None => list.push((reason, 1)),
            }
        }
        if !reasons.is_empty() {
            let _ = writeln!(out, "\nSKIPPED, by reason:");
            for (reason, n) in reasons {
                let reason = if reason.is_empty() { "(no reason given)" } else { reason };
                let _ = writeln!(out, "  SKIPPED [{n}] {reason}");
            }
        }
        if !xfails.is_empty() {
            let _ = writeln!(out, "\nXFAIL (expected failures), by reason:");
            for (reason, n) in xfails {
                let reason = if reason.is_empty() { "(no reason given)" } else { reason };
                let _ = writeln!(out, "  XFAIL [{n}] {reason}");
            }
        }
        if !self.outside_skips.is_empty() {
            let _ = writeln!(out, "\nSKIPPED before their tests ({}):", self.outside_skips.len());
            for skip in &self.outside_skips {
                let _ = writeln!(out, "  SKIPPED {} ({})", skip.group, skip.message);
            }
        }
        let slow = self.slowest(slowest);
        if !slow.is_empty() {
            let _ = writeln!(out, "\nSLOWEST units:");
            for unit in slow {
                let _ = writeln!(out, "  {:>8.2}s {}", unit.duration_ms as f64 / 1000.0, unit.unit);
            }
        }
        for unit in self.units.iter().filter(|u| u.finalized_events > 1) {
            let _ = writeln!(
                out,
                "\nANOMALY: {} was finalized {} times (the queue must finalize each unit once)",
                unit.unit, unit.finalized_events
            );
        }
        if self.stale_rejected > 0 {
            let _ = writeln!(
                out,
                "\n{} result(s) were dropped because another worker owned the unit (STALE).",
                self.stale_rejected
            );
        }
        for error in &self.worker_errors {
            let _ = writeln!(out, "worker error: {error}");
        }
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        let unfinished_label = if self.stopped_after.is_some() { "not run" } else { "unfinished" };
        let outside = match self.failing_outside_errors().count() {
            0 => String::new(),
            n => format!(", {n} error(s) outside tests"),
        };
        let quarantined = self.quarantine_summary();
        let flaky_fail = match self.flaky_result {
            FlakyResult::Fail if !flaky.is_empty() => ", flaky units fail the build (--flaky-result fail)",
            _ => "",
        };
        let _ = writeln!(
            out,
            "\nhopper: build {}: {verdict}: {total} units, {passed} passed ({} flaky), {} failed, {} {unfinished_label}{skipped}{outside}{flaky_fail}{quarantined}; {requeued} unit(s) requeued ({requeues} requeue(s)), {reclaims} reclaim(s)",
            self.run,
            flaky.len(),
            failed.len(),
            unfinished.len(),
        );
        out
    }
}

/// A failed unit's last failure, its attempts and its reason, as the
/// report's FAIL lines say them.
pub(super) fn failure_of(unit: &UnitReport) -> String {
    let attempts = unit.failed_attempts.len();
    let what = unit.failed_attempts.last().map(|a| a.detail.clone()).unwrap_or_default();
    let reason = match &unit.reason {
        Some(r) => format!(", {r}"),
        None => String::new(),
    };
    format!("{what}; {attempts} failed attempt(s){reason}")
}

/// The tail of a failed unit's last output, indented under its line.
pub(super) fn write_output_tail(out: &mut String, unit: &UnitReport) {
    if let Some(attempt) = unit.failed_attempts.last().filter(|a| !a.output.is_empty()) {
        for line in tail_lines(&attempt.output, TAIL_LINES) {
            let _ = writeln!(out, "    | {line}");
        }
    }
}

fn tail_lines(text: &str, n: usize) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// A report kept up to date by following the run's event log: each
/// catch-up folds in only what came after the last one.
struct FollowedReport<'a> {
    report: RunReport,
    index: HashMap<UnitId, usize>,
    log: LogFollower<'a>,
}

impl<'a> FollowedReport<'a> {
    /// The run's units, before any event; `None` when the run does not exist.
    async fn open(queue: &'a dyn RunLog, run: &RunId) -> Result<Option<Self>, HopperError> {
        let units = queue.units(run).await?;
        if units.is_empty() {
            return Ok(None);
        }
        let mut index: HashMap<UnitId, usize> = HashMap::with_capacity(units.len());
        let mut reports = Vec::with_capacity(units.len());
        for (i, spec) in units.into_iter().enumerate() {
            index.insert(spec.id.clone(), i);
            reports.push(UnitReport::new(spec.id, spec.kind));
        }
        let report = RunReport { units: reports, ..RunReport::empty(run.clone()) };
        Ok(Some(FollowedReport { report, index, log: LogFollower::new(queue, run.clone()) }))
    }

    /// Folds in the events appended since the last catch-up.
    async fn catch_up(&mut self) -> Result<(), HopperError> {
        for event in self.log.read_new().await? {
            self.report.apply(&self.index, event);
        }
        Ok(())
    }

    /// The report as it stands, with whether (and after how many failures) the build was stopped.
    async fn finish(self, queue: &dyn RunLog) -> Result<RunReport, HopperError> {
        let mut report = self.report;
        if queue.progress(&report.run).await?.is_some_and(|p| p.stopped) {
            report.stopped_after = queue.budgets(&report.run).await?.and_then(|b| b.max_failures);
        }
        Ok(report)
    }
}

/// After the last unit, how long the report waits at most for the workers
/// to say they ended (their agents' final teardowns may still report errors).
const FINAL_TEARDOWN_WAIT: Duration = Duration::from_secs(15);

/// Waits, once every unit is finalized, until every worker of the run said
/// it ended ([`outside::WORKER_DONE`]), so the errors of its agents' final
/// teardown (session fixtures, `after(:suite)`) are in the report. A worker
/// whose units were reclaimed is dead and is not waited for; the others at
/// most `worker_timeout` or [`FINAL_TEARDOWN_WAIT`], whichever is shorter.
/// The log is followed, not read again: each wake folds in only new events.
async fn await_final_teardowns(
    queue: &dyn RunLog,
    run: &RunId,
    options: WaitOptions,
) -> Result<RunReport, HopperError> {
    let started = Instant::now();
    let limit = options.worker_timeout.min(FINAL_TEARDOWN_WAIT);
    let mut said = false;
    let mut followed =
        FollowedReport::open(queue, run).await?.ok_or_else(|| HopperError::StateLost { run: run.clone() })?;
    loop {
        let workers = queue.workers(run).await?;
        followed.catch_up().await?;
        let report = &followed.report;
        let dead: Vec<&WorkerId> = report.units.iter().flat_map(|u| u.reclaimed_from.iter().flatten()).collect();
        let waiting: Vec<String> = workers
            .iter()
            .map(|w| &w.worker)
            .filter(|w| !report.finished_workers.contains(w) && !dead.contains(w))
            .map(|w| w.to_string())
            .collect();
        if waiting.is_empty() || started.elapsed() >= limit {
            return followed.finish(queue).await;
        }
        if !said && started.elapsed() >= Duration::from_secs(1) {
            said = true;
            eprintln!(
                "hopper: every unit is finalized; waiting up to {}s for {} to end (final teardowns may report errors)",
                limit.as_secs(),
                waiting.join(", ")
            );
        }
        // A worker's end is an event: wake on it, and look at the records
        // (a worker that joined late) at least every poll.
        followed.log.wait(options.poll).await;
    }
}

/// How [`wait_for_end`] waits.
#[derive(Debug, Clone, Copy)]
pub struct WaitOptions {
    /// Give up after this long.
    pub wait_timeout: Duration,
    /// A worker whose record has not changed for this long is gone.
    pub worker_timeout: Duration,
    /// How long to wait for the run to appear at all.
    pub appear_timeout: Duration,
    /// Time between polls.
    pub poll: Duration,
}

/// Waits until every unit of `run` is finalized, and returns its report.
///
/// It blocks on the run's event log rather than polling: it reads the
/// counters when an event came (at most every [`FOLLOW_GAP`], however busy
/// the log) or every `poll`, so the report ends within a few milliseconds of
/// the last finalize. Worker liveness is judged by change, not by comparing
/// clocks: a worker is alive while its record's `last_seen` keeps moving, so
/// clock skew between machines cannot make the report wrong. The records
/// are read at most every `poll`. Fails with [`HopperError::WorkersGone`]
/// when units remain but no worker record has moved for `worker_timeout`,
/// [`HopperError::WaitTimeout`] after `wait_timeout`,
/// [`HopperError::RunNotFound`] when the run never appears, and
/// [`HopperError::StateLost`] when it disappears after it was seen.
pub async fn wait_for_end(queue: &dyn RunLog, run: &RunId, options: WaitOptions) -> Result<RunReport, HopperError> {
    let started = Instant::now();
    let mut seen: HashMap<WorkerId, u64> = HashMap::new();
    let mut last_sign_of_life = Instant::now();
    let mut records_read: Option<Instant> = None;
    let unfinished = || async {
        Ok::<_, HopperError>(RunReport::load(queue, run).await?.map(|r| r.unfinished()).unwrap_or_default())
    };
    let mut log = LogFollower::new(queue, run.clone());
    let mut seen_run = false;
    let mut said_missing = false;
    loop {
        let asked = Instant::now();
        let progress = queue.progress(run).await?;
        // Time spent waiting for the queue (an outage ridden out) is not the
        // workers' silence: they could not be heard either.
        let waited_for_queue = asked.elapsed();
        if waited_for_queue > QUEUE_PAUSE {
            last_sign_of_life = (last_sign_of_life + waited_for_queue).min(Instant::now());
        }
        match progress {
            // It was there: a queue that restarted without persistence, or a
            // flush, took it. Waiting longer cannot bring it back.
            None if seen_run => return Err(HopperError::StateLost { run: run.clone() }),
            None => {
                let limit = options.appear_timeout.min(options.wait_timeout);
                if started.elapsed() >= limit {
                    return Err(HopperError::RunNotFound { run: run.clone(), waited: started.elapsed() });
                }
                // A typo in --build would otherwise wait in silence: say it at once.
                if !said_missing && started.elapsed() >= MISSING_NOTICE {
                    said_missing = true;
                    eprintln!(
                        "hopper: build {run} does not exist (yet): no worker has started it; waiting up to {}s \
                         (--start-timeout) for one to",
                        limit.as_secs()
                    );
                }
                last_sign_of_life = Instant::now();
            }
            Some(progress) if progress.is_complete() => return await_final_teardowns(queue, run, options).await,
            Some(_) => {
                seen_run = true;
                if records_read.is_none_or(|at| at.elapsed() >= options.poll) {
                    records_read = Some(Instant::now());
                    for record in queue.workers(run).await? {
                        if seen.insert(record.worker.clone(), record.last_seen_ms) != Some(record.last_seen_ms) {
                            last_sign_of_life = Instant::now();
                        }
                    }
                }
                if last_sign_of_life.elapsed() >= options.worker_timeout {
                    return Err(HopperError::WorkersGone {
                        run: run.clone(),
                        silent_for: last_sign_of_life.elapsed(),
                        unfinished: unfinished().await?,
                    });
                }
            }
        }
        if started.elapsed() >= options.wait_timeout {
            return Err(HopperError::WaitTimeout {
                run: run.clone(),
                waited: started.elapsed(),
                unfinished: unfinished().await?,
            });
        }
        log.wait(options.poll).await;
        // However busy the log, the counters are read at most this often.
        tokio::time::sleep_until(asked + FOLLOW_GAP.min(options.poll)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use leasehold_core::{EntryId, StreamName, UnitEventHeader, UnitQueue};

    use super::*;

    fn header(unit: &str, retry: u32) -> UnitEventHeader {
        UnitEventHeader {
            unit_id: UnitId::new(unit).unwrap(),
            worker_id: WorkerId::new("w1").unwrap(),
            retry_index: retry,
            reclaim_count: 0,
            ownership_generation: 1 + retry,
            at_ms: 1,
        }
    }

    fn finalized(unit: &str, outcome: Outcome, ms: u64, reason: Option<FinalizeReason>) -> Event {
        Event::Finalized {
            header: header(unit, 0),
            outcome,
            duration_ms: ms,
            reason,
            errors: Some(serde_json::json!({"reason": "exit", "detail": "exit code 1", "output": "boom\n"})),
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            previous_worker_id: None,
            delivery_count: None,
            failure_summary: Some("exit code 1".into()),
            slot: None,
        }
    }

    fn requeued(unit: &str) -> Event {
        Event::Requeued {
            header: header(unit, 1),
            previous_retry_index: 0,
            duration_ms: 5,
            failure_summary: Some("exit code 1".into()),
            errors: Some(serde_json::json!({"reason": "exit", "detail": "exit code 1", "output": "first try\n"})),
            stream: StreamName::Main,
            entry_id: EntryId::new(1, 0),
            new_entry_id: EntryId::new(2, 0),
            slot: None,
        }
    }

    fn sample() -> RunReport {
        let names = ["ok", "flaky", "bad", "todo"];
        let index: HashMap<UnitId, usize> =
            names.iter().enumerate().map(|(i, n)| (UnitId::new(*n).unwrap(), i)).collect();
        let mut report = RunReport {
            run: RunId::new("b1").unwrap(),
            units: names.iter().map(|n| UnitReport::new(UnitId::new(*n).unwrap(), "file".into())).collect(),
            stale_rejected: 0,
            worker_errors: vec![],
            outside_errors: vec![],
            outside_skips: vec![],
            finished_workers: vec![],
            flaky_result: FlakyResult::default(),
            quarantine: Quarantine::default(),
            stopped_after: None,
        };
        report.apply(&index, finalized("ok", Outcome::Passed, 30, None));
        report.apply(&index, requeued("flaky"));
        report.apply(&index, finalized("flaky", Outcome::Passed, 10, None));
        report.apply(&index, requeued("bad"));
        report.apply(&index, finalized("bad", Outcome::Failed, 20, Some(FinalizeReason::RetryBudgetExhausted)));
        report
    }

    #[test]
    fn classifies_units() {
        let report = sample();
        assert_eq!(report.flaky().map(|u| u.unit.as_str()).collect::<Vec<_>>(), vec!["flaky"]);
        assert_eq!(report.failed().map(|u| u.unit.as_str()).collect::<Vec<_>>(), vec!["bad"]);
        assert_eq!(report.unfinished(), vec![UnitId::new("todo").unwrap()]);
        assert!(!report.passed());
        assert_eq!(report.slowest(1)[0].unit.as_str(), "ok");
        let text = report.render(5);
        assert!(text.contains("FAIL bad (exit code 1; 2 failed attempt(s), retry_budget_exhausted)"), "{text}");
        assert!(text.contains("| boom"), "{text}");
        assert!(text.contains("FLAKY flaky"), "{text}");
        assert!(text.contains("FAILED: 4 units, 2 passed (1 flaky), 1 failed, 1 unfinished; "), "{text}");
    }

    #[test]
    fn a_few_reclaims_get_a_line_each_and_many_one_line_per_worker() {
        let mut report = sample();
        let (dead, other) = (WorkerId::new("w1").unwrap(), WorkerId::new("w2").unwrap());
        report.units[0].reclaimed_from.push(Some(dead.clone()));
        report.units[0].finalized_by = Some(other.clone());
        let text = report.render(5);
        assert!(text.contains("\n  RECLAIMED ok (from w1, finished by w2)\n"), "{text}");
        let junit = report.junit().to_string().unwrap();
        assert!(junit.contains(r#"<property name="hopper.reclaimed" value="from w1, finished by w2"/>"#), "{junit}");
        // A killed worker's reserve ahead: hundreds of units, one line.
        for i in 0..30 {
            let mut unit = UnitReport::new(UnitId::new(format!("ahead{i}")).unwrap(), "file".into());
            unit.reclaimed_from.push(Some(dead.clone()));
            unit.finalized_by = Some(other.clone());
            report.units.push(unit);
        }
        let text = report.render(5);
        assert!(text.contains("RECLAIMED units (31)"), "{text}");
        assert!(text.contains("\n  RECLAIMED 31 unit(s) (from w1, finished by w2): ok, ahead0, ahead1, "), "{text}");
        assert!(text.contains("and 21 more\n  (the JUnit XML names each in its hopper.reclaimed property)"), "{text}");
        assert!(!text.contains("RECLAIMED ahead0"), "{text}");
    }

    #[test]
    fn skipped_units_are_counted_in_the_verdict_line() {
        let mut report = sample();
        let index: HashMap<UnitId, usize> = [(UnitId::new("todo").unwrap(), 3)].into_iter().collect();
        report.apply(&index, finalized("todo", Outcome::Skipped, 1, None));
        let text = report.render(5);
        assert!(text.contains("FAILED: 4 units, 2 passed (1 flaky), 1 failed, 0 unfinished, 1 skipped; "), "{text}");
        // An expected failure is counted apart, as pytest counts it.
        report.units[3].skip_reason = Some("xfail: known bug".into());
        let text = report.render(5);
        assert!(text.contains("FAILED: 4 units, 2 passed (1 flaky), 1 failed, 0 unfinished, 1 xfailed; "), "{text}");
        // Listed apart from the skips, by its own reason.
        assert!(text.contains("XFAIL (expected failures), by reason:\n  XFAIL [1] known bug\n"), "{text}");
        assert!(!text.contains("SKIPPED"), "an expected failure is no skip: {text}");
        report.units[3].skip_reason = Some("xfail".into());
        assert!(report.render(5).contains("  XFAIL [1] (no reason given)\n"), "{}", report.render(5));
    }

    /// Twice 90 s of waiting for the queue (an outage) is not the workers'
    /// silence: the report fails for gone workers only 60 s after the queue
    /// answers promptly again and they still say nothing.
    #[tokio::test(start_paused = true)]
    async fn time_waiting_for_the_queue_is_not_the_workers_silence() {
        let inner = crate::queue::test_queue::flaky(0);
        let run = RunId::new("b").unwrap();
        let worker = WorkerId::new("w1").unwrap();
        let spec = leasehold_core::RunSpec {
            run: run.clone(),
            units: vec![leasehold_core::UnitSpec::new(UnitId::new("u").unwrap(), "file")],
            budgets: leasehold_core::Budgets::default(),
            ttl: Duration::from_secs(86_400),
        };
        inner.initialize(&spec).await.unwrap();
        inner.liveness(&run, &worker, None).await.unwrap();
        *inner.progress_delay.lock() = Duration::from_secs(90);
        let slow = Arc::clone(&inner);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(200)).await;
            *slow.progress_delay.lock() = Duration::ZERO;
        });
        // A worker's queue, read as the report reads it.
        let queue: Arc<dyn UnitQueue> = inner;
        let options = WaitOptions {
            wait_timeout: Duration::from_secs(3600),
            worker_timeout: Duration::from_secs(60),
            appear_timeout: Duration::from_secs(60),
            poll: Duration::from_millis(250),
        };
        let started = Instant::now();
        let error = wait_for_end(&*queue, &run, options).await.unwrap_err();
        assert!(matches!(error, HopperError::WorkersGone { .. }), "{error}");
        // Calls end at 90, 180 and 270 s; then 60 s of real silence. Counting the
        // waits as silence would have given up at 180 s.
        assert!(started.elapsed() >= Duration::from_secs(320), "gave up after {:?}", started.elapsed());
    }

    #[test]
    fn an_error_outside_tests_fails_the_build_once_and_is_its_groups_junit_error() {
        let names = ["ok"];
        let index: HashMap<UnitId, usize> = [(UnitId::new("ok").unwrap(), 0)].into_iter().collect();
        let mut report = RunReport {
            run: RunId::new("b1").unwrap(),
            units: names.iter().map(|n| UnitReport::new(UnitId::new(*n).unwrap(), "test".into())).collect(),
            stale_rejected: 0,
            worker_errors: vec![],
            outside_errors: vec![],
            outside_skips: vec![],
            finished_workers: vec![],
            flaky_result: FlakyResult::default(),
            quarantine: Quarantine::default(),
            stopped_after: None,
        };
        report.apply(&index, finalized("ok", Outcome::Passed, 3, None));
        assert!(report.passed());
        let error = OutsideError {
            group: "tests/test_a.py".into(),
            phase: "teardown".into(),
            message: "RuntimeError: boom".into(),
            output: "Traceback\n".into(),
        };
        let event = |message: String| Event::WorkerError {
            worker_id: WorkerId::new("w1").unwrap(),
            unit_id: None,
            message,
            at_ms: 1,
        };
        // Recorded twice (a replaced agent reports it again): counted once.
        report.apply(&index, event(error.to_event_message()));
        report.apply(&index, event(error.to_event_message()));
        report.apply(&index, event("disk full".into()));
        assert!(!report.passed());
        assert_eq!(report.exit_code(), crate::errors::exit::FAILED);
        assert_eq!(report.outside_errors, vec![error]);
        assert_eq!(report.worker_errors, vec!["w1: disk full"]);
        let text = report.render(5);
        assert!(text.contains("ERROR tests/test_a.py (teardown error: RuntimeError: boom)"), "{text}");
        assert!(
            text.contains("FAILED: 1 units, 1 passed (0 flaky), 0 failed, 0 unfinished, 1 error(s) outside tests"),
            "{text}"
        );
        let xml = report.junit().to_string().unwrap();
        assert!(xml.contains("<testcase name=\"tests/test_a.py\" classname=\"tests/test_a.py\">"), "{xml}");
        assert!(xml.contains("<error message=\"teardown error: RuntimeError: boom\" type=\"teardown\">"), "{xml}");
    }

    #[test]
    fn with_flaky_result_fail_a_flaky_unit_fails_the_build() {
        let mut report = sample();
        report.units.retain(|u| matches!(u.unit.as_str(), "ok" | "flaky"));
        assert!(report.passed());
        assert_eq!(report.exit_code(), crate::errors::exit::PASSED);
        let report = report.counting_flaky_as(FlakyResult::Fail);
        assert!(!report.passed());
        assert_eq!(report.exit_code(), crate::errors::exit::FAILED);
        let text = report.render(5);
        assert!(text.contains("FLAKY units (1): failed, then passed on a retry (each fails the build"), "{text}");
        assert!(
            text.contains("FAILED: 2 units, 2 passed (1 flaky), 0 failed, 0 unfinished, flaky units fail"),
            "{text}"
        );
    }

    #[test]
    fn junit_marks_flaky_and_failed_units() {
        let xml = sample().junit().to_string().unwrap();
        assert!(xml.contains("tests=\"4\""), "{xml}");
        assert!(xml.contains("<flakyFailure"), "{xml}");
        assert!(xml.contains("<rerunFailure"), "{xml}");
        assert!(xml.contains("<failure message=\"exit code 1\""), "{xml}");
        assert!(xml.contains("type=\"unfinished\""), "{xml}");
    }
}
