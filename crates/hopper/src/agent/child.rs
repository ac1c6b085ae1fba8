//! One agent process: started in its own process group with piped stdin
//! (requests), stdout (replies) and stderr (kept as a bounded tail for crash
//! reports), and ended with TERM-then-KILL of the whole group.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::protocol::Request;
use super::shards::Sharding;
use crate::exec::process::OutputTail;
use crate::verdicts::outside::OutsideError;

/// How long an exited agent's stdout is still read (see
/// [`AgentChild::lines_until_exit`]).
const AFTER_EXIT: Duration = Duration::from_millis(500);

/// Agents already started and ready (the ones whose collection was the
/// discovery), each handed to the slot it was started for.
#[derive(Clone, Default)]
pub struct SpareAgent(Arc<Mutex<Vec<Option<AgentChild>>>>);

impl SpareAgent {
    /// Holds `agents[i]` for slot `i`.
    pub fn new(agents: Vec<AgentChild>) -> Self {
        Self(Arc::new(Mutex::new(agents.into_iter().map(Some).collect())))
    }

    /// Slot `slot`'s agent, once.
    pub fn take(&self, slot: usize) -> Option<AgentChild> {
        self.0.lock().get_mut(slot).and_then(Option::take)
    }
}

impl std::fmt::Debug for SpareAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ready = self.0.lock().iter().filter(|a| a.is_some()).count();
        write!(f, "SpareAgent({ready} ready)")
    }
}

/// How to start an agent.
#[derive(Debug, Clone, Default)]
pub struct AgentCommand {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Working directory (the worker's own when `None`).
    pub cwd: Option<PathBuf>,
    /// How many tests the agent must say it collected (discovery's count).
    pub expected_tests: Option<u64>,
    /// Agents started already, by slot.
    pub spare: SpareAgent,
    /// How the worker's agents split the suite (pytest with `-j N`): each
    /// slot's agents collect their shard only.
    pub sharding: Option<Arc<Sharding>>,
}

impl AgentCommand {
    /// `argv` with `env`, run in the worker's directory, with no agents
    /// started ahead and no sharding.
    pub fn new(argv: Vec<String>, env: Vec<(String, String)>, expected_tests: Option<u64>) -> Self {
        AgentCommand { argv, env, cwd: None, expected_tests, spare: Default::default(), sharding: None }
    }

    /// The environment an agent of `slot` gets on top of [`Self::env`].
    pub fn slot_env(&self, slot: usize) -> Vec<(String, String)> {
        self.sharding.iter().map(|s| s.env(slot)).collect()
    }

    /// How many tests an agent of `slot` must say it collected.
    pub fn expected_for(&self, slot: usize) -> Option<u64> {
        match &self.sharding {
            Some(sharding) => Some(sharding.expected(slot)),
            None => self.expected_tests,
        }
    }
}

/// Prints each of an agent's notes on stderr, once per hopper process:
/// every agent of every slot (and every fresh one after a crash) says the
/// same thing.
fn show_once(notes: &[String]) {
    static SHOWN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let Ok(mut shown) = SHOWN.lock() else { return };
    for note in notes {
        if !shown.contains(note) {
            eprintln!("hopper: {note}");
            shown.push(note.clone());
        }
    }
}

/// How many lines before its last one a dead agent's error says.
pub const DIED_CONTEXT_LINES: usize = 30;

/// Why an agent did not become ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Its stdout closed first (it exited): the last line of its stderr.
    Died {
        /// The last line of its error output (and the errors it reported).
        last_line: String,
        /// The lines before that last one (at most [`DIED_CONTEXT_LINES`]),
        /// when it reported no error of a file: what else says why it
        /// died (an `INTERNALERROR>` traceback, a plugin's complaint).
        context: String,
    },
    /// It speaks another protocol version.
    Protocol(u32),
}

/// A running agent.
pub struct AgentChild {
    child: Child,
    pgid: Option<i32>,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<OutputTail>>,
    /// Ends when its stderr closes (everything it wrote is in the tail).
    stderr_closed: tokio::task::JoinHandle<()>,
    /// The reaper and a second signal know the group, so an agent never
    /// outlives its worker (even a SIGKILLed one).
    _group: Option<crate::exec::groups::GroupGuard>,
    /// Errors outside any test it reported before `ready` (collection
    /// errors), until its slot takes them.
    early_errors: Vec<OutsideError>,
}

impl AgentChild {
    /// Starts the agent; `tail_bytes` of its stderr are kept.
    pub fn spawn(command: &AgentCommand, extra_env: &[(String, String)], tail_bytes: usize) -> std::io::Result<Self> {
        let (program, args) = command
            .argv
            .split_first()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty agent command"))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(command.env.iter().chain(extra_env).map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &command.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn()?;
        let pgid = child.id().and_then(|p| i32::try_from(p).ok());
        let group = pgid.map(crate::exec::groups::GroupGuard::register);
        let missing = || std::io::Error::other("the agent's pipes were not set up");
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let mut stderr_pipe = child.stderr.take().ok_or_else(missing)?;
        let stderr = Arc::new(Mutex::new(OutputTail::new(tail_bytes)));
        let sink = Arc::clone(&stderr);
        let stderr_closed = tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = stderr_pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock().push(&buf[..n]);
            }
        });
        Ok(Self {
            child,
            pgid,
            stdin,
            lines: BufReader::new(stdout).lines(),
            stderr,
            stderr_closed,
            _group: group,
            early_errors: Vec::new(),
        })
    }

    /// Reads until the agent's `ready`; returns how many tests it says it collected.
    pub async fn wait_ready(&mut self) -> Result<Option<u64>, NotReady> {
        use super::protocol::{Reply, PROTOCOL};
        loop {
            match self.next_line().await {
                Ok(Some(line)) => match Reply::parse(&line) {
                    Ok(Reply::Ready { protocol, tests, notes }) if protocol == PROTOCOL => {
                        show_once(&notes);
                        return Ok(tests);
                    }
                    Ok(Reply::Ready { protocol, .. }) => return Err(NotReady::Protocol(protocol)),
                    Ok(reply @ (Reply::Error { .. } | Reply::Skipped { .. })) => {
                        self.early_errors.extend(reply.outside_error())
                    }
                    Ok(other) => tracing::warn!(?other, "agent replied before it was ready; ignored"),
                    Err(error) => tracing::warn!(%error, line, "agent wrote a line that is not the protocol; ignored"),
                },
                Ok(None) | Err(_) => {
                    let tail = self.stderr_tail(16 * 1024);
                    let lines: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
                    let mut last_line = lines.last().map_or("no output", |l| l.trim()).to_owned();
                    let context = match self.early_errors.iter().all(|e| e.is_skip()) {
                        true => lines
                            [lines.len().saturating_sub(DIED_CONTEXT_LINES + 1)..lines.len().saturating_sub(1)]
                            .join("\n"),
                        false => String::new(),
                    };
                    // The errors it reported say which file failed and why, with the traceback.
                    for error in self.early_errors.iter().filter(|e| !e.is_skip()) {
                        last_line.push_str(&format!(
                            "\n{} error in {}: {}\n{}",
                            error.phase,
                            error.group,
                            error.message,
                            error.output.trim_end()
                        ));
                    }
                    return Err(NotReady::Died { last_line, context });
                }
            }
        }
    }

    /// The errors outside any test the agent reported before `ready`, once.
    pub fn take_early_errors(&mut self) -> Vec<OutsideError> {
        std::mem::take(&mut self.early_errors)
    }

    /// Sends one request.
    pub async fn send(&mut self, request: &Request<'_>) -> std::io::Result<()> {
        self.stdin.write_all(request.line().as_bytes()).await?;
        self.stdin.flush().await
    }

    /// The next line the agent wrote; `None` once its stdout is closed.
    /// Cancel-safe.
    pub async fn next_line(&mut self) -> std::io::Result<Option<String>> {
        self.lines.next_line().await
    }

    /// The lines the agent writes until it exits, or closes its stdout, or
    /// `wait` passes; and whether it ended in time. Once it exited, what is
    /// still in the pipe is read for at most [`AFTER_EXIT`]: a process it
    /// started may hold the pipe open long after it.
    pub async fn lines_until_exit(&mut self, wait: Duration) -> (Vec<String>, bool) {
        let mut lines = Vec::new();
        let mut deadline = tokio::time::Instant::now() + wait;
        let mut exited = false;
        loop {
            tokio::select! {
                line = self.lines.next_line() => match line {
                    Ok(Some(line)) => lines.push(line),
                    Ok(None) | Err(_) => return (lines, true),
                },
                _ = self.child.wait(), if !exited => {
                    exited = true;
                    deadline = deadline.min(tokio::time::Instant::now() + AFTER_EXIT);
                }
                _ = tokio::time::sleep_until(deadline) => return (lines, exited),
            }
        }
    }

    /// The tail of the agent's stderr (the tool's own output) so far.
    pub fn stderr_tail(&self, max: usize) -> String {
        self.stderr.lock().text(max)
    }

    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            match killpg(Pid::from_raw(pgid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(error) => tracing::warn!(pgid, ?signal, %error, "could not signal the agent's process group"),
            }
        }
    }

    /// Ends the agent: waits up to `grace` for it to exit (after an `exit`
    /// request, or on its own after a crash), then TERM, then KILL; the
    /// whole group goes. Returns how it ended.
    pub async fn finish(mut self, grace: Duration, terminate: bool) -> AgentEnd {
        if terminate {
            self.signal(Signal::SIGTERM);
        }
        let (status, signalled) = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => (status.ok(), terminate),
            Err(_) => {
                self.signal(Signal::SIGKILL);
                (self.child.wait().await.ok(), true)
            }
        };
        self.signal(Signal::SIGKILL);
        self.ended(status, signalled).await
    }

    /// Kills the agent's group at once and reaps it.
    pub async fn kill(mut self) -> AgentEnd {
        self.signal(Signal::SIGKILL);
        let status = self.child.wait().await.ok();
        self.ended(status, true).await
    }

    /// How it ended, with what it wrote to stderr up to its exit (read for
    /// at most [`AFTER_EXIT`] more: a process it started may keep the pipe).
    async fn ended(self, status: Option<std::process::ExitStatus>, signalled: bool) -> AgentEnd {
        let mut closed = self.stderr_closed;
        if tokio::time::timeout(AFTER_EXIT, &mut closed).await.is_err() {
            closed.abort();
        }
        AgentEnd { status, signalled, stderr: self.stderr }
    }
}

/// How an agent ended.
#[derive(Debug, Clone)]
pub struct AgentEnd {
    /// Its exit status, when it could be reaped.
    pub status: Option<std::process::ExitStatus>,
    /// Whether hopper signalled it (TERM or KILL) before it ended.
    pub signalled: bool,
    stderr: Arc<Mutex<OutputTail>>,
}

impl AgentEnd {
    /// The exit code it chose, if it exited on its own.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// The tail of everything it wrote to stderr, its last words included.
    pub fn stderr_tail(&self, max: usize) -> String {
        self.stderr.lock().text(max)
    }
}

impl std::fmt::Display for AgentEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::os::unix::process::ExitStatusExt;
        match self.status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(code), _) => write!(f, "exit code {code}"),
                (None, Some(sig)) => match Signal::try_from(sig) {
                    Ok(signal) => write!(f, "killed by {}", signal.as_str()),
                    Err(_) => write!(f, "killed by signal {sig}"),
                },
                _ => f.write_str("unknown status"),
            },
            None => f.write_str("status unknown"),
        }
    }
}

/// The environment variable that gives a unit (or an agent) the index of
/// the worker's slot that runs it, from 0: one slot runs one thing at a
/// time, so a suite can give each slot its own scratch database or port.
/// The queue's events keep the same index, for `hopper report --html`.
pub const SLOT_ENV: &str = "HOPPER_SLOT";

/// The environment every agent gets: the build and the worker.
pub fn agent_env(run: &leasehold_core::RunId, worker: &leasehold_core::WorkerId) -> Vec<(String, String)> {
    vec![("HOPPER_BUILD".to_owned(), run.to_string()), ("HOPPER_WORKER".to_owned(), worker.to_string())]
}
