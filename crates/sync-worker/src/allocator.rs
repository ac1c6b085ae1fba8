//! The allocator settings of the processes that run a worker: the
//! `sync-worker` binary and the benchmarks' worker processes, both on
//! mimalloc.
//!
//! mimalloc reads its options from the environment once, at its first
//! allocation, before `main`; by default on Linux it commits each arena it
//! reserves at once. Measured in `sync-scale` (8 worker processes, cold
//! accounts), a worker's RSS then grew by 16 KiB per owned account at
//! 10,000 accounts and 3.9 KiB at 100,000; with arenas committed on demand,
//! 3.8 KiB and 1.9 KiB. Set from `main` it is too late, so the process
//! starts itself once more with the option in its environment.

use std::ffi::OsString;

/// The option, as mimalloc reads it from the environment.
pub const ARENA_EAGER_COMMIT: &str = "MIMALLOC_ARENA_EAGER_COMMIT";

/// Unless the environment already sets [`ARENA_EAGER_COMMIT`] (an operator's
/// choice is kept), replaces this process with the same program and
/// arguments, the option set to commit on demand. Returns only when it did
/// nothing, or when the program could not be started again (the error; the
/// caller may go on as it is).
pub fn restart_with_commit_on_demand() -> std::io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    if std::env::var_os(ARENA_EAGER_COMMIT).is_some() {
        return Ok(());
    }
    let program = std::env::current_exe()?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    Err(std::process::Command::new(program).args(args).env(ARENA_EAGER_COMMIT, "0").exec())
}
