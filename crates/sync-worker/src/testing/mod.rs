//! Everything tests and benchmarks stand on (feature `test-support`): the
//! test doubles, a database per test, real servers and realistic mail.
//!
//! * [`ScriptedSource`]: an in-process [`MailSource`](crate::source::MailSource)
//!   that records every poll with its worker and token;
//!   [`MemoryDirectory`]: account -> user, set by the test.
//! * [`TestDb`]: a fresh SQLite file or Postgres database per test, and
//!   [`both_databases!`](crate::both_databases), which runs a case on each.
//! * [`Dovecot`]: a private Dovecot IMAP server on a free loopback port, with
//!   its own config, users, mail and log in a temp dir. [`ImapSession`] is a
//!   small raw IMAP client for checking what a real client sees;
//!   [`ImapProxy`] records every command a client sends through it (and can
//!   cut its connections). [`ImapWorld`] is one account on a private Dovecot
//!   in a fresh database, the engine tests' starting point;
//!   [`CollectedEvents`] keeps what storage publishes.
//! * [`Postgres`]: a fresh, uniquely named database per test on the machine's
//!   server (`TEST_POSTGRES_URL`, else `postgres://postgres@127.0.0.1:5432`),
//!   dropped when the handle is dropped. [`PostgresServer`] is a private
//!   server of a test's own, for tests that kill or restart it.
//! * [`FenceAudit`]: a trigger on `messages` and `accounts` recording which
//!   fencing token wrote each row, for tests that try to break fencing.
//! * [`OAuthServer`]: a token and an introspection endpoint, for OAuth2
//!   logins against a Dovecot that validates tokens with it.
//! * [`mail_gen`]: deterministic, realistic RFC 5322 messages.
//! * [`sync_worker_command`]: the binary under test, in a clean environment.
//! * [`demo`]: the first-run demo (`cargo xtask demo`).
//!
//! The servers' API is blocking (each call is a short command or a few IMAP round
//! trips): async tests call it directly, or through `spawn_blocking` when
//! the engine under test must run on the same thread meanwhile.
//!
//! A missing server binary is an error that says what to install, never a
//! skip. Servers die with the test process: they are spawned from one
//! long-lived thread with `PR_SET_PDEATHSIG`, and dropping a handle stops its
//! server at once.

mod binary;
mod db;
pub mod demo;
mod dovecot;
mod fence_audit;
mod imap;
mod imap_proxy;
mod imap_world;
pub mod mail_gen;
mod memory_directory;
mod oauth_server;
mod postgres;
mod scripted;
mod tls;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};

pub use binary::{sync_worker_command, TEST_SECRET_KEY};
pub use db::TestDb;
pub use dovecot::{Appended, Dovecot, DovecotOAuth2, DovecotOptions, DovecotTls, MailboxStatus, SPECIAL_FOLDERS};
pub use fence_audit::{AuditRow, FenceAudit};
pub use imap::{ImapReply, ImapSession};
pub use imap_proxy::{process_of_connection, ImapCommand, ImapProxy, ProxiedSession};
pub use imap_world::{CollectedEvents, ImapWorld};
pub use memory_directory::MemoryDirectory;
pub use oauth_server::{OAuthServer, OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET};
pub use postgres::{Postgres, PostgresServer};
pub use scripted::{Activity, PollRecord, ScriptedSource};
pub use tls::{PrivateCa, ServerCert};

/// What went wrong while starting or driving a test server.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A program the harness needs is not installed.
    #[error("{program} is not installed; {install}")]
    Missing {
        /// The program looked for.
        program: String,
        /// What to install (or set) to get it.
        install: &'static str,
    },
    /// An I/O operation failed.
    #[error("{what}")]
    Io {
        /// What the harness was doing.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A command ran but failed.
    #[error("{what} failed ({status}): {output}")]
    Command {
        /// The command and its purpose.
        what: String,
        /// How it exited.
        status: ExitStatus,
        /// Its stdout and stderr.
        output: String,
    },
    /// A server answered something the harness did not expect.
    #[error("{what}: {answer}")]
    Unexpected {
        /// What the harness was doing.
        what: String,
        /// What it got.
        answer: String,
    },
    /// Bad input to the harness itself.
    #[error("{0}")]
    Invalid(String),
}

impl HarnessError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}

/// The harness's result type.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// Finds `program` on `PATH` or at the given absolute paths.
fn find_binary(program: &str, also: &[&str]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| also.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// A name no other test (or process) uses: `<tag>_<pid>_<n>_<nanos>`, lower
/// case ASCII letters, digits and `_` only (safe as a database or user name).
pub fn unique_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let tag: String =
        tag.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).take(24).collect();
    format!("{tag}_{}_{}_{nanos}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A free loopback port (free when asked: retry if the server cannot bind it).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(HarnessError::io("find a free loopback port"))?;
    Ok(listener.local_addr().map_err(HarnessError::io("find a free loopback port"))?.port())
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from a thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG = SIGKILL`: the signal fires when the spawning *thread*
/// exits, so the spawner must outlive every test's runtime thread, and a
/// killed test binary then leaves no server behind.
fn spawn(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let started = std::thread::Builder::new().name("test-server-spawner".into()).spawn(move || {
            for (mut cmd, reply) in rx {
                let parent = std::process::id() as libc::pid_t;
                // SAFETY: prctl, getppid and _exit are async-signal-safe; the
                // closure allocates nothing and takes no locks.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        if libc::getppid() != parent {
                            // The test process died between fork and prctl.
                            libc::_exit(1);
                        }
                        Ok(())
                    });
                }
                let _ = reply.send(cmd.spawn());
            }
        });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the test-server spawner thread");
        }
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .map_err(|_| std::io::Error::other("test-server spawner lock poisoned"))?
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("test-server spawner thread is gone"))?;
    rx.recv().map_err(|_| std::io::Error::other("test-server spawner thread is gone"))?
}

/// Runs `cmd` to completion; its stdout, or an error with both outputs.
fn output(what: &str, mut cmd: Command, stdin: Option<&[u8]>) -> Result<String> {
    use std::io::Write;
    use std::process::Stdio;
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(HarnessError::io(format!("{what}: start {cmd:?}")))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).map_err(HarnessError::io(format!("{what}: write stdin")))?;
    }
    let out = child.wait_with_output().map_err(HarnessError::io(format!("{what}: wait")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(HarnessError::Command {
            what: what.to_owned(),
            status: out.status,
            output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        });
    }
    Ok(stdout)
}

/// The last `lines` lines of a log file (empty when it cannot be read).
fn tail(path: &std::path::Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
