//! `hopper report` and `hopper status`, and what `run` shares with them:
//! the queue whose calls ride out an outage, and the finished report with
//! the files it writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{RunId, RunLog, UnitQueue};
use tokio_util::sync::CancellationToken;

use super::identity::{resolve_build, EnvLookup};
use crate::errors::{exit, BackendError, HopperError};
use crate::queue::backend::{connect, parse_queue_url, Backend, BackendOptions, QueueKind};
use crate::queue::outage::{connect_within, OutageNotice, OutageNotify, OutageQueue};
use crate::report::html::write_html;
use crate::report::quarantine::count_passes;
use crate::report::status::{now_ms, StatusSnapshot};
use crate::report::timeline::Timeline;
use crate::report::{wait_for_end, FlakyResult, Quarantine, RunReport, WaitOptions};

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
    /// `--flaky-result`: whether a flaky unit passes the build.
    pub flaky_result: FlakyResult,
    /// `--quarantine`: the file of units that never fail the build.
    pub quarantine: Option<PathBuf>,
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
pub(super) fn riding_out(
    backend: &Backend,
    grace: Duration,
    notify: OutageNotify,
    stop: CancellationToken,
) -> Arc<dyn UnitQueue> {
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

/// The files a finished report writes.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReportOutputs<'a> {
    pub(super) junit: Option<&'a Path>,
    pub(super) html: Option<&'a Path>,
}

pub(super) async fn finish_report(
    queue: &dyn RunLog,
    report: &RunReport,
    outputs: ReportOutputs<'_>,
    slowest: usize,
) -> Result<i32, HopperError> {
    out(&report.render(slowest));
    write_files(queue, report, outputs, slowest).await?;
    Ok(report.exit_code())
}

/// Writes `text` to stdout. A reader that has gone (`hopper run … | head`)
/// ends the printing, not the command: its exit code is still the verdict's,
/// where `print!` would panic with code 101.
pub(super) fn out(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            tracing::warn!(%error, "cannot write the report to stdout");
        }
    }
}

async fn write_files(
    queue: &dyn RunLog,
    report: &RunReport,
    outputs: ReportOutputs<'_>,
    slowest: usize,
) -> Result<(), HopperError> {
    if let Some(path) = outputs.junit {
        report.write_junit(path)?;
        out(&format!("hopper: JUnit XML written to {}\n", path.display()));
    }
    if let Some(path) = outputs.html {
        let timeline = Timeline::load(queue, &report.run).await?;
        write_html(path, report, &timeline, slowest)?;
        out(&format!("hopper: HTML timeline written to {}\n", path.display()));
    }
    Ok(())
}

/// `hopper report`: waits for the build's end, prints the verdict, writes
/// JUnit; returns the exit code (0 only when every unit passed).
pub async fn report(options: ReportOptions, env: EnvLookup<'_>) -> Result<i32, HopperError> {
    let kind = shared_kind(&options.queue, "report")?;
    let run_id = resolve_build(options.build.as_deref(), env, None)?;
    let quarantine = read_quarantine(options.quarantine.as_deref())?;
    let notify = notify_on_stderr();
    let backend =
        connect_within(options.outage_grace, &notify, BackendError::may_come_back, || connect(&kind, &options.backend))
            .await?;
    // It only reads the build.
    let queue: Arc<dyn RunLog> = riding_out(&backend, options.outage_grace, notify, CancellationToken::new());
    let wait = WaitOptions {
        wait_timeout: options.wait_timeout,
        worker_timeout: options.worker_timeout,
        appear_timeout: options.appear_timeout,
        poll: Duration::from_millis(250).min(options.worker_timeout / 4).max(Duration::from_millis(10)),
    };
    let outputs = ReportOutputs { junit: options.junit.as_deref(), html: options.html.as_deref() };
    let waited = wait_for_end(&*queue, &run_id, wait).await;
    if let Err(error @ (HopperError::WorkersGone { .. } | HopperError::WaitTimeout { .. })) = waited {
        // Still show what is known, and leave a JUnit file that names the unfinished units.
        if let Some(report) = RunReport::load(&*queue, &run_id).await? {
            let report = report.counting_flaky_as(options.flaky_result).quarantining(quarantine);
            out(&report.render(options.slowest));
            write_files(&*queue, &report, outputs, options.slowest).await?;
        }
        return Err(error);
    }
    let report = waited?.counting_flaky_as(options.flaky_result).quarantining(quarantine);
    let counted_as = report.run.to_string();
    let report = count_passes(report, &*backend.timings, &counted_as).await;
    finish_report(&*queue, &report, outputs, options.slowest).await
}

/// The `--quarantine` list (empty without one), read before the queue is
/// contacted: a missing or unreadable file is an error that names it.
pub(super) fn read_quarantine(path: Option<&Path>) -> Result<Quarantine, HopperError> {
    Ok(path.map(Quarantine::read).transpose()?.unwrap_or_default())
}

/// `hopper status`: prints a snapshot of the build.
pub async fn status(options: StatusOptions, env: EnvLookup<'_>) -> Result<i32, HopperError> {
    let kind = shared_kind(&options.queue, "status")?;
    let run_id = resolve_build(options.build.as_deref(), env, None)?;
    let notify = notify_on_stderr();
    let backend =
        connect_within(options.outage_grace, &notify, BackendError::may_come_back, || connect(&kind, &options.backend))
            .await?;
    // It only reads the build.
    let queue: Arc<dyn RunLog> = riding_out(&backend, options.outage_grace, notify, CancellationToken::new());
    out(&status_text(&*queue, &run_id).await?);
    Ok(exit::PASSED)
}

/// The status text of a build (or an error when it does not exist).
pub async fn status_text(queue: &dyn RunLog, run: &RunId) -> Result<String, HopperError> {
    let snapshot = StatusSnapshot::load(queue, run)
        .await?
        .ok_or_else(|| HopperError::RunNotFound { run: run.clone(), waited: Duration::ZERO })?;
    Ok(snapshot.render(now_ms()))
}
