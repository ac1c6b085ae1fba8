//! Runs one invocation (a unit, or a batch of units) as its own process group.
//!
//! stdout and stderr are captured into one bounded buffer that keeps the tail.
//! A time limit or a stop request (shutdown, a fenced-off delivery) sends
//! SIGTERM to the whole group, then SIGKILL after a grace period. When the
//! group leader exits, whatever it left running in its group is killed, so a
//! unit never outlives its attempt and never holds the output pipes open.
//! Nor does it outlive its worker: the group is registered with
//! [`crate::exec::groups`] (a second signal and the reaper kill it); when
//! no reaper runs, the leader gets `PR_SET_PDEATHSIG` instead.
//!
//! With a reaper, a unit is spawned without a `pre_exec` hook, so the
//! standard library starts it with `posix_spawn` (a vfork, which shares the
//! worker's memory until the exec) instead of a fork that copies the
//! worker's page tables only for the exec to throw them away: on 1,000
//! no-op units that copy was most of what a spawn cost the worker.

use std::collections::VecDeque;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long output is still drained after the group leader exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);

/// Limits of one invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Kill the invocation after this long.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Bytes of output kept (the tail).
    pub tail_bytes: usize,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        Self { timeout: None, kill_grace: Duration::from_secs(2), tail_bytes: 32 * 1024 }
    }
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Termination {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal (not by hopper).
    Signaled(i32),
    /// hopper killed it: it ran over its time limit.
    TimedOut,
    /// hopper killed it: it was asked to stop (shutdown or lost ownership).
    Stopped,
    /// It could not be started.
    SpawnFailed(String),
}

impl Termination {
    /// Whether the invocation passed (exit code 0).
    pub fn passed(&self) -> bool {
        matches!(self, Termination::Exited(0))
    }

    /// A short description (`exit code 1`, `killed by signal 9`, ...).
    pub fn describe(&self) -> String {
        match self {
            Termination::Exited(code) => format!("exit code {code}"),
            Termination::Signaled(sig) => format!("killed by signal {sig}"),
            Termination::TimedOut => "timed out".to_owned(),
            Termination::Stopped => "stopped".to_owned(),
            Termination::SpawnFailed(e) => format!("could not start: {e}"),
        }
    }
}

/// The last line of a tool's output that is not blank, trimmed; "no output"
/// when there is none: what a one-line report of its failure says.
pub fn last_line(text: &str) -> &str {
    text.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no output")
}

/// The bounded tail of an invocation's output.
#[derive(Debug, Clone, Default)]
pub struct OutputTail {
    buf: VecDeque<u8>,
    limit: usize,
    dropped: u64,
}

impl OutputTail {
    /// An empty tail keeping at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self { buf: VecDeque::new(), limit, dropped: 0 }
    }

    /// Appends output, dropping the oldest bytes beyond the limit.
    pub fn push(&mut self, bytes: &[u8]) {
        let bytes = if bytes.len() > self.limit {
            self.dropped += (bytes.len() - self.limit) as u64;
            &bytes[bytes.len() - self.limit..]
        } else {
            bytes
        };
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.limit);
        if over > 0 {
            self.buf.drain(..over);
            self.dropped += over as u64;
        }
        self.buf.extend(bytes);
    }

    /// Bytes dropped from the front.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether nothing was captured.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.dropped == 0
    }

    /// The tail as text (lossy UTF-8), at most `max_bytes` long, with a note
    /// when earlier output was dropped.
    pub fn text(&self, max_bytes: usize) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        let text = String::from_utf8_lossy(&bytes);
        let mut start = text.len().saturating_sub(max_bytes.saturating_sub(64));
        while !text.is_char_boundary(start) {
            start += 1;
        }
        let dropped = self.dropped + start as u64;
        if dropped > 0 {
            format!("[... {dropped} earlier bytes of output dropped ...]\n{}", &text[start..])
        } else {
            text.into_owned()
        }
    }
}

/// The result of one invocation.
#[derive(Debug, Clone)]
pub struct ProcessResult {
    /// How it ended.
    pub termination: Termination,
    /// How long it ran.
    pub duration: Duration,
    /// The tail of its output (stdout and stderr interleaved).
    pub output: OutputTail,
}

async fn read_some<R: tokio::io::AsyncRead + Unpin>(reader: &mut Option<R>, buf: &mut [u8]) -> std::io::Result<usize> {
    match reader {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

fn signal_group(pgid: Option<u32>, signal: Signal) {
    if let Some(pid) = pgid.and_then(|p| i32::try_from(p).ok()) {
        crate::exec::groups::kill_group(pid, signal);
    }
}

/// Makes the child die with SIGKILL when the thread that spawned it (a
/// runtime worker thread, which lives as long as the worker) dies.
fn die_with_parent(command: &mut tokio::process::Command) {
    let parent = nix::unistd::Pid::this();
    // SAFETY: the closure runs between fork and exec, so it may only make
    // async-signal-safe calls: prctl and getppid are plain system calls, and
    // nothing here allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(|errno| std::io::Error::from_raw_os_error(errno as i32))?;
            if nix::unistd::getppid() != parent {
                // The worker died between fork and prctl: do not start the unit at all.
                return Err(std::io::Error::from_raw_os_error(nix::errno::Errno::ESRCH as i32));
            }
            Ok(())
        });
    }
}

/// Runs `argv` (program first) with `env` added, in a new process group,
/// until it exits, runs over `limits.timeout`, or `stop` is cancelled.
pub async fn run_process(
    argv: &[String],
    env: &[(String, String)],
    limits: ProcessLimits,
    stop: &CancellationToken,
) -> ProcessResult {
    run_process_in(None, argv, env, limits, stop).await
}

/// [`run_process`] in the working directory `cwd` (the worker's own when `None`).
pub async fn run_process_in(
    cwd: Option<&std::path::Path>,
    argv: &[String],
    env: &[(String, String)],
    limits: ProcessLimits,
    stop: &CancellationToken,
) -> ProcessResult {
    let started = Instant::now();
    let mut output = OutputTail::new(limits.tail_bytes);
    let Some((program, args)) = argv.split_first() else {
        return ProcessResult {
            termination: Termination::SpawnFailed("empty command".into()),
            duration: Duration::ZERO,
            output,
        };
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    if !crate::exec::groups::reaper_runs() {
        die_with_parent(&mut command);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            let message = format!("{program}: {error}");
            output.push(message.as_bytes());
            return ProcessResult {
                termination: Termination::SpawnFailed(message),
                duration: started.elapsed(),
                output,
            };
        }
    };
    let pgid = child.id();
    // Also ends the group when this future is dropped mid-run.
    let _group = pgid.and_then(|p| i32::try_from(p).ok()).map(crate::exec::groups::GroupGuard::register);
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut out_buf = vec![0u8; 8192];
    let mut err_buf = vec![0u8; 8192];

    let far = started + Duration::from_secs(100 * 365 * 24 * 3600);
    let timeout_at = limits.timeout.map(|t| started + t).unwrap_or(far);
    let mut kill_at = far;
    let mut drain_until = far;
    let mut killed_for: Option<Termination> = None;
    let mut status: Option<std::process::ExitStatus> = None;

    loop {
        let reading = stdout.is_some() || stderr.is_some();
        if status.is_some() && !reading {
            break;
        }
        tokio::select! {
            read = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => {
                match read {
                    Ok(0) | Err(_) => stdout = None,
                    Ok(n) => output.push(&out_buf[..n]),
                }
            }
            read = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => {
                match read {
                    Ok(0) | Err(_) => stderr = None,
                    Ok(n) => output.push(&err_buf[..n]),
                }
            }
            waited = child.wait(), if status.is_none() => {
                match waited {
                    Ok(s) => status = Some(s),
                    Err(error) => {
                        tracing::warn!(%error, "waiting for the unit failed");
                        status = Some(std::os::unix::process::ExitStatusExt::from_raw(0x7f00));
                    }
                }
                // The leader is gone: end the rest of its group so nothing
                // outlives the attempt or keeps the pipes open.
                signal_group(pgid, Signal::SIGKILL);
                drain_until = Instant::now() + DRAIN_AFTER_EXIT;
            }
            _ = tokio::time::sleep_until(timeout_at), if killed_for.is_none() && status.is_none() => {
                tracing::debug!(?pgid, "unit over its time limit: SIGTERM to its group");
                killed_for = Some(Termination::TimedOut);
                signal_group(pgid, Signal::SIGTERM);
                kill_at = Instant::now() + limits.kill_grace;
            }
            _ = stop.cancelled(), if killed_for.is_none() && status.is_none() => {
                tracing::debug!(?pgid, "unit stopped: SIGTERM to its group");
                killed_for = Some(Termination::Stopped);
                signal_group(pgid, Signal::SIGTERM);
                kill_at = Instant::now() + limits.kill_grace;
            }
            _ = tokio::time::sleep_until(kill_at), if status.is_none() => {
                tracing::debug!(?pgid, "unit still running after SIGTERM: SIGKILL to its group");
                signal_group(pgid, Signal::SIGKILL);
                kill_at = far;
            }
            _ = tokio::time::sleep_until(drain_until), if status.is_some() => {
                // A grandchild in another group still holds a pipe: stop reading.
                stdout = None;
                stderr = None;
            }
        }
    }

    let duration = started.elapsed();
    let termination = match (killed_for, status) {
        (Some(reason), _) => reason,
        (None, Some(status)) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => Termination::Exited(code),
                (None, Some(sig)) => Termination::Signaled(sig),
                (None, None) => Termination::Exited(-1),
            }
        }
        (None, None) => Termination::Exited(-1),
    };
    ProcessResult { termination, duration, output }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut tail = OutputTail::new(5);
        tail.push(b"abc");
        tail.push(b"defg");
        assert_eq!(tail.dropped(), 2);
        assert!(tail.text(1000).ends_with("cdefg"));
        tail.push(b"0123456789");
        assert!(tail.text(1000).ends_with("56789"));
        assert!(tail.text(1000).contains("12 earlier bytes"));
    }

    #[tokio::test]
    async fn exit_codes_and_output_are_captured() {
        let stop = CancellationToken::new();
        let ok = run_process(&sh("echo out; echo err >&2"), &[], ProcessLimits::default(), &stop).await;
        assert!(ok.termination.passed());
        let text = ok.output.text(1000);
        assert!(text.contains("out") && text.contains("err"), "{text}");
        let bad = run_process(&sh("exit 3"), &[], ProcessLimits::default(), &stop).await;
        assert_eq!(bad.termination, Termination::Exited(3));
        let env = [("HOPPER_X".to_owned(), "42".to_owned())];
        let with_env = run_process(&sh("test \"$HOPPER_X\" = 42"), &env, ProcessLimits::default(), &stop).await;
        assert!(with_env.termination.passed());
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_failure() {
        let stop = CancellationToken::new();
        let r = run_process(&["/nonexistent/prog".into()], &[], ProcessLimits::default(), &stop).await;
        assert!(matches!(r.termination, Termination::SpawnFailed(_)));
        assert!(!r.termination.passed());
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group_even_when_term_is_ignored() {
        let stop = CancellationToken::new();
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        // A child in the same group that ignores TERM; the leader ignores it too.
        let script = format!("trap '' TERM; (trap '' TERM; sleep 30) & echo $! > {}; wait", pidfile.display());
        let limits = ProcessLimits {
            timeout: Some(Duration::from_millis(200)),
            kill_grace: Duration::from_millis(200),
            tail_bytes: 1024,
        };
        let r = run_process(&sh(&script), &[], limits, &stop).await;
        assert_eq!(r.termination, Termination::TimedOut);
        let child: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // The grandchild was in the group: it must be gone (or a zombie being reaped by init).
        // SIGKILL is delivered asynchronously, so give the kernel a moment to finish it.
        let alive = || {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None).is_ok()
                && std::fs::read_to_string(format!("/proc/{child}/stat")).map(|s| !s.contains(") Z ")).unwrap_or(false)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!alive(), "grandchild {child} survived the group kill");
    }

    #[tokio::test]
    async fn stop_request_ends_the_unit() {
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        let task = tokio::spawn(async move {
            run_process(&sh("echo started; exec sleep 30"), &[], ProcessLimits::default(), &stopper).await
        });
        // Stopping works whether or not the unit has started yet.
        stop.cancel();
        let r = task.await.unwrap();
        assert_eq!(r.termination, Termination::Stopped);
        assert!(r.duration < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn background_children_do_not_hold_the_attempt_open() {
        let stop = CancellationToken::new();
        let r = run_process(&sh("sleep 30 & echo done"), &[], ProcessLimits::default(), &stop).await;
        assert!(r.termination.passed());
        assert!(r.duration < Duration::from_secs(10), "{:?}", r.duration);
    }
}
