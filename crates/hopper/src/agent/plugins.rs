//! The agents hopper ships inside its binary, written at start to a private
//! temporary directory: nothing to install.
//!
//! The directory never outlives its worker, however the worker ends:
//!
//! * an orderly end removes it (dropping [`Plugins`]);
//! * a worker killed without a chance to clean up (SIGKILL, OOM kill) has it
//!   removed by the reaper that outlives it ([`crate::exec::groups`]);
//! * if the reaper died too, the next hopper to start sweeps it: each
//!   directory holds an exclusive `flock` on its [`OWNER_LOCK`] file for as
//!   long as its worker lives (the kernel drops it when the process dies, in
//!   any pid namespace), so a directory whose lock can be taken has no owner.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The private directory holding the shipped plugins and scratch files.
#[derive(Debug)]
pub struct Plugins {
    dir: tempfile::TempDir,
    /// Held while the directory is in use; dropped (unlocked) after the
    /// directory is removed, as fields drop in order.
    _owner: Flock<File>,
}

const PYTEST_PLUGIN: &str = include_str!("hopper_pytest.py");
const RSPEC_AGENT: &str = include_str!("hopper_rspec.rb");

/// How every plugin directory's name starts.
pub const DIR_PREFIX: &str = "hopper-agents-";

/// The file in a plugin directory whose `flock` its worker holds.
pub const OWNER_LOCK: &str = ".owner.lock";

fn lock_error((_, errno): (File, nix::errno::Errno)) -> std::io::Error {
    std::io::Error::from(errno)
}

impl Plugins {
    /// The pytest plugin's module name (`-p hopper_pytest`).
    pub const PYTEST_MODULE: &'static str = "hopper_pytest";

    /// Sweeps the directories of dead workers, then writes the plugins to a
    /// new private directory under the system's temporary directory.
    pub fn new() -> std::io::Result<Self> {
        Self::new_in(&std::env::temp_dir())
    }

    /// [`Plugins::new`] under `parent`.
    pub fn new_in(parent: &Path) -> std::io::Result<Self> {
        sweep_stale(parent);
        let dir = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir_in(parent)?;
        // Locked before it gets its name: a sweeper only looks at directories
        // whose OWNER_LOCK exists, so it never sees one not yet locked.
        let unnamed = dir.path().join(".owner.lock.new");
        let owner = Flock::lock(File::create(&unnamed)?, FlockArg::LockExclusiveNonblock).map_err(lock_error)?;
        std::fs::rename(&unnamed, dir.path().join(OWNER_LOCK))?;
        crate::exec::groups::remove_when_gone(dir.path());
        std::fs::write(dir.path().join(format!("{}.py", Self::PYTEST_MODULE)), PYTEST_PLUGIN)?;
        std::fs::write(dir.path().join("hopper_rspec.rb"), RSPEC_AGENT)?;
        Ok(Self { dir, _owner: owner })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A path for a scratch file in the directory.
    pub fn scratch_file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The RSpec agent (`rspec --require FILE`).
    pub fn rspec_agent(&self) -> PathBuf {
        self.dir.path().join("hopper_rspec.rb")
    }

    /// The environment that makes `-p hopper_pytest` importable and selects
    /// the plugin's mode (`collect` or `agent`).
    pub fn pytest_env(&self, mode: &str) -> Vec<(String, String)> {
        let mut path = self.dir.path().display().to_string();
        if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            path.push(':');
            path.push_str(&existing.to_string_lossy());
        }
        vec![("PYTHONPATH".into(), path), ("HOPPER_PYTEST_MODE".into(), mode.into())]
    }
}

/// Removes the plugin directories under `parent` that this user owns and no
/// living worker holds (see the module docs). Best effort: what cannot be
/// read or removed is left for the next sweep.
pub fn sweep_stale(parent: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    let me = nix::unistd::getuid().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let path = entry.path();
        // Not followed: a symlink or another user's directory is never touched.
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
        // No lock file yet: a worker is still making it, or it is not ours to judge.
        let Some(lock) = ours.then(|| File::open(path.join(OWNER_LOCK)).ok()).flatten() else { continue };
        // A lock still held means its worker lives.
        if let Ok(_unowned) = Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            tracing::debug!(dir = %path.display(), "removing the plugin directory of a worker that is gone");
            if let Err(error) = std::fs::remove_dir_all(&path) {
                tracing::debug!(dir = %path.display(), %error, "could not remove a stale plugin directory");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_are_written_and_removed() {
        let plugins = Plugins::new().unwrap();
        let dir = plugins.dir().to_path_buf();
        let text = std::fs::read_to_string(dir.join("hopper_pytest.py")).unwrap();
        assert!(text.contains("def pytest_runtestloop"));
        assert!(plugins.rspec_agent().exists());
        assert!(dir.join(OWNER_LOCK).exists());
        let env = plugins.pytest_env("collect");
        assert!(env[0].1.starts_with(&dir.display().to_string()));
        drop(plugins);
        assert!(!dir.exists());
    }

    #[test]
    fn a_sweep_removes_only_directories_no_worker_holds() {
        let parent = tempfile::tempdir().unwrap();
        let live = Plugins::new_in(parent.path()).unwrap();
        // A dead worker's directory: its lock file exists but nobody holds it.
        let dead = parent.path().join(format!("{DIR_PREFIX}dead"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(OWNER_LOCK), "").unwrap();
        std::fs::write(dead.join("hopper_pytest.py"), "").unwrap();
        // One still being made (no lock file yet), and one of another tool.
        let unnamed = parent.path().join(format!("{DIR_PREFIX}making"));
        std::fs::create_dir(&unnamed).unwrap();
        let other = parent.path().join("not-hopper");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(OWNER_LOCK), "").unwrap();

        sweep_stale(parent.path());
        assert!(!dead.exists(), "a directory no worker holds is swept");
        assert!(live.dir().join("hopper_pytest.py").exists(), "a living worker's directory stays");
        assert!(unnamed.exists() && other.exists());

        // A new worker sweeps as it starts.
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(OWNER_LOCK), "").unwrap();
        let second = Plugins::new_in(parent.path()).unwrap();
        assert!(!dead.exists());
        assert!(live.dir().exists() && second.dir().exists());
    }
}
