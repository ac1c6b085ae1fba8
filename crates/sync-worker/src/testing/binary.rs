//! Running the `sync-worker` binary as an operator would, for the tests and
//! benchmarks that start it: a clean environment, a working directory of
//! the test's own, one password key.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// A `SECRET_KEY` for the binary under test (base64 of 32 bytes of 7): a
/// fixed key, so that every process of one test reads the same passwords.
pub const TEST_SECRET_KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

/// A command running the binary at `bin` (in a test,
/// `env!("CARGO_BIN_EXE_sync-worker")`) in `dir`, with nothing of the
/// test's environment but `PATH`, logging at `warn`. The caller adds the
/// arguments and the variables under test.
pub fn sync_worker_command(bin: impl AsRef<OsStr>, dir: &Path) -> Command {
    let mut c = Command::new(bin);
    c.current_dir(dir).env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("RUST_LOG", "warn");
    c
}
