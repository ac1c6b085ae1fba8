//! What a worker shows while it runs: an indicatif progress bar on a
//! terminal, one plain line per finished unit otherwise (CI logs).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use leasehold_core::{Progress, RunId, UnitId};

/// How one attempt of a unit ended, as far as this worker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Passed and finalized.
    Passed,
    /// Skipped (ignored, or an expected failure) and finalized.
    Skipped,
    /// Failed and finalized as failed (no retry left).
    Failed,
    /// Failed and requeued for another attempt.
    Retrying,
    /// The queue fenced the result off: another worker owns the unit now.
    Stale,
    /// Stopped on shutdown and handed back; another worker takes it at once.
    Released,
    /// Finalized as failed by the queue: reclaimed too often.
    ReclaimExhausted,
}

impl AttemptEnd {
    /// Whether the unit reached its final outcome through this end.
    pub fn is_final(self) -> bool {
        matches!(self, AttemptEnd::Passed | AttemptEnd::Skipped | AttemptEnd::Failed | AttemptEnd::ReclaimExhausted)
    }

    /// The line's first word; an expected failure (a skip whose reason says
    /// `xfail`) is an XFAIL, and a pass despite an xfail mark an XPASS, as
    /// the summary counts them apart.
    fn label(self, detail: Option<&str>) -> &'static str {
        match self {
            AttemptEnd::Skipped if detail.is_some_and(crate::verdicts::skips::is_xfail) => "XFAIL",
            AttemptEnd::Passed if detail.is_some_and(crate::verdicts::skips::is_xpass) => "XPASS",
            AttemptEnd::Passed => "PASS ",
            AttemptEnd::Skipped => "SKIP ",
            AttemptEnd::Failed => "FAIL ",
            AttemptEnd::Retrying => "RETRY",
            AttemptEnd::Stale => "STALE",
            AttemptEnd::Released => "RELEASE",
            AttemptEnd::ReclaimExhausted => "LOST ",
        }
    }
}

/// Receives a worker's progress. Implementations must be cheap: they are
/// called on the worker's hot path.
pub trait RunObserver: Send + Sync {
    /// The worker joined the run (`leader`: it initialised it).
    fn run_started(&self, run: &RunId, total: u64, leader: bool);
    /// An attempt of a unit ended.
    fn attempt_ended(&self, unit: &UnitId, end: AttemptEnd, duration: Duration, detail: Option<&str>);
    /// The run's counters (polled while the worker runs).
    fn progress(&self, progress: &Progress);
    /// A warning worth showing to the user.
    fn warn(&self, message: &str);
    /// The worker is done.
    fn finished(&self);
}

/// Shows nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuietObserver;

impl RunObserver for QuietObserver {
    fn run_started(&self, _: &RunId, _: u64, _: bool) {}
    fn attempt_ended(&self, _: &UnitId, _: AttemptEnd, _: Duration, _: Option<&str>) {}
    fn progress(&self, _: &Progress) {}
    fn warn(&self, _: &str) {}
    fn finished(&self) {}
}

/// One line per ended attempt on stderr.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlainObserver;

impl RunObserver for PlainObserver {
    fn run_started(&self, run: &RunId, total: u64, leader: bool) {
        let role = if leader { "initialised" } else { "joined" };
        to_stderr(&format!("hopper: {role} build {run} ({total} units)\n"));
    }

    fn attempt_ended(&self, unit: &UnitId, end: AttemptEnd, duration: Duration, detail: Option<&str>) {
        // One write a line: stderr is unbuffered, and `writeln!` on it makes
        // a write call per formatted piece (five a line, on the hot path).
        let line = match detail {
            Some(d) => format!("{} {:>7.2}s {unit} ({d})\n", end.label(detail), duration.as_secs_f64()),
            None => format!("{} {:>7.2}s {unit}\n", end.label(detail), duration.as_secs_f64()),
        };
        to_stderr(&line);
    }

    fn progress(&self, _: &Progress) {}

    fn warn(&self, message: &str) {
        to_stderr(&format!("hopper: warning: {message}\n"));
    }

    fn finished(&self) {}
}

/// Writes `text` to stderr in one write; a reader that has gone (`2>&1 |
/// head`) is no reason to stop the build, where `eprintln!` would panic.
fn to_stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// An indicatif progress bar (on stderr) with failures printed above it.
#[derive(Debug)]
pub struct BarObserver {
    bar: ProgressBar,
}

impl BarObserver {
    /// A bar drawn on stderr.
    pub fn new() -> Self {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        Self { bar }
    }
}

impl Default for BarObserver {
    fn default() -> Self {
        Self::new()
    }
}

impl RunObserver for BarObserver {
    fn run_started(&self, run: &RunId, total: u64, _leader: bool) {
        self.bar.set_length(total);
        self.bar.set_message(format!("build {run}"));
    }

    fn attempt_ended(&self, unit: &UnitId, end: AttemptEnd, duration: Duration, detail: Option<&str>) {
        if !matches!(end, AttemptEnd::Passed | AttemptEnd::Skipped) {
            let label = end.label(detail);
            let detail = detail.map(|d| format!(" ({d})")).unwrap_or_default();
            self.bar.println(format!("{label} {:>7.2}s {unit}{detail}", duration.as_secs_f64()));
        }
        if end.is_final() {
            self.bar.inc(1);
        }
    }

    fn progress(&self, progress: &Progress) {
        self.bar.set_position(progress.finalized);
    }

    fn warn(&self, message: &str) {
        self.bar.println(format!("hopper: warning: {message}"));
    }

    fn finished(&self) {
        self.bar.finish_and_clear();
    }
}

/// A bar when stderr is a terminal, plain lines otherwise.
pub fn default_observer() -> Box<dyn RunObserver> {
    if std::io::stderr().is_terminal() {
        Box::new(BarObserver::new())
    } else {
        Box::new(PlainObserver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expected_failure_is_labelled_xfail() {
        assert_eq!(AttemptEnd::Skipped.label(Some("xfail: known bug")), "XFAIL");
        assert_eq!(AttemptEnd::Skipped.label(Some("xfail")), "XFAIL");
        assert_eq!(AttemptEnd::Skipped.label(Some("not on windows")), "SKIP ");
        assert_eq!(AttemptEnd::Skipped.label(None), "SKIP ");
        assert_eq!(AttemptEnd::Failed.label(Some("xfail")), "FAIL ", "only a skip is an expected failure");
        assert_eq!(AttemptEnd::Passed.label(Some("xpass: known bug")), "XPASS");
    }
}
