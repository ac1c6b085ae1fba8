//! Every unit process group this process has running (a unit's process, or
//! a persistent agent's), so that none outlives its worker, and the private
//! directories to remove with it:
//!
//! * a second SIGINT / SIGTERM kills them all before hopper exits
//!   ([`kill_all`]);
//! * when the worker dies without a chance to clean up (SIGKILL, OOM kill), a
//!   reaper kills them: a small `awk` process (`reaper.awk`) in a process group
//!   of its own that learns each group on a pipe, and kills whatever is left
//!   when the pipe closes, which the kernel does when the worker dies;
//! * the reaper also removes the worker's private directories
//!   ([`remove_when_gone`]) once it is gone;
//! * when the reaper could not start (or died), each group's leader gets
//!   `PR_SET_PDEATHSIG` instead (see [`crate::exec::process`]). The reaper
//!   learns a group just after its spawn: a worker SIGKILLed in those
//!   microseconds leaves that one unit to run to its end (its result is
//!   fenced off; another worker reruns it), and so does a worker killed
//!   after its reaper was: units started while the reaper ran have no
//!   death signal of their own.
//!
//! A process-wide registry, because process groups are process-wide too: the
//! signal handler must reach every group, whichever worker slot started it.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;

const REAPER_PROGRAM: &str = include_str!("reaper.awk");

struct Registry {
    groups: HashSet<i32>,
    /// The reaper's stdin; `None` when it could not be started (or died).
    reaper: Option<(Child, ChildStdin)>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Registry { groups: HashSet::new(), reaper: start_reaper() }))
}

fn start_reaper() -> Option<(Child, ChildStdin)> {
    // The program's first line names it, so `ps` shows `awk # hopper-reaper …`.
    let started = Command::new("awk")
        .arg(REAPER_PROGRAM)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own group: a Ctrl-C or a CI's kill of the worker's group must not take it too.
        .process_group(0)
        .spawn();
    match started {
        Ok(mut child) => {
            let stdin = child.stdin.take()?;
            Some((child, stdin))
        }
        Err(error) => {
            tracing::warn!(%error, "could not start the reaper; a killed worker may leave unit processes behind");
            None
        }
    }
}

/// Whether the reaper runs and listens (starting it on first use).
pub fn reaper_runs() -> bool {
    registry().lock().reaper.is_some()
}

/// Tells the reaper about a group; a reaper that stopped listening is dropped.
fn tell(registry: &mut Registry, line: &str) {
    if let Some((_, stdin)) = registry.reaper.as_mut() {
        if let Err(error) = stdin.write_all(line.as_bytes()) {
            tracing::warn!(%error, "the reaper stopped listening");
            registry.reaper = None;
        }
    }
}

/// A running unit group; dropping it SIGKILLs whatever is left of the group
/// and forgets it.
#[derive(Debug)]
pub struct GroupGuard {
    pgid: i32,
}

impl GroupGuard {
    /// Registers the group led by `pgid`.
    pub fn register(pgid: i32) -> Self {
        let mut registry = registry().lock();
        registry.groups.insert(pgid);
        tell(&mut registry, &format!("+ {pgid}\n"));
        Self { pgid }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.pgid, Signal::SIGKILL);
        let mut registry = registry().lock();
        registry.groups.remove(&self.pgid);
        tell(&mut registry, &format!("- {}\n", self.pgid));
    }
}

/// Sends `signal` to the group `pgid`; a group that is already gone is fine.
pub fn kill_group(pgid: i32, signal: Signal) {
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(error) => tracing::warn!(pgid, ?signal, %error, "could not signal the unit's process group"),
    }
}

/// Has the reaper remove `dir` (recursively) once this process is gone,
/// however it ends; an orderly end removes it first, which is fine. A path
/// the reaper's line protocol cannot carry (a newline in it) is left to
/// whoever else cleans up after it.
pub fn remove_when_gone(dir: &std::path::Path) {
    let Ok(dir) = std::path::absolute(dir) else { return };
    let Some(text) = dir.to_str().filter(|t| !t.contains('\n')) else { return };
    let mut registry = registry().lock();
    tell(&mut registry, &format!("rm {text}\n"));
}

/// SIGKILLs every unit group still running (the second signal's last act).
pub fn kill_all() {
    let registry = registry().lock();
    for pgid in &registry.groups {
        kill_group(*pgid, Signal::SIGKILL);
    }
}
