//! The binary runs on mimalloc with arenas committed on demand (see
//! `sync_worker::allocator`): it starts itself once more with the option
//! set, unless the operator set it. mimalloc's own report of its options
//! (`MIMALLOC_VERBOSE=1`, printed at its start) is the witness.

use sync_worker::allocator::ARENA_EAGER_COMMIT;
use sync_worker::testing::sync_worker_command;

/// Every value of the option mimalloc reported at its starts, in order.
fn reported(extra: Option<&str>) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir.path());
    cmd.arg("--help").env("MIMALLOC_VERBOSE", "1");
    if let Some(value) = extra {
        cmd.env(ARENA_EAGER_COMMIT, value);
    }
    let out = cmd.output().expect("run sync-worker --help");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    stderr
        .lines()
        .filter_map(|l| l.split("option 'arena_eager_commit': ").nth(1))
        .map(|v| v.trim().to_owned())
        .collect()
}

#[test]
fn the_binary_restarts_once_with_arenas_committed_on_demand() {
    assert_eq!(reported(None), ["2", "0"], "mimalloc's default at the first start, then 0 after the one restart");
}

#[test]
fn an_operators_setting_is_kept() {
    assert_eq!(reported(Some("1")), ["1"], "no restart when the environment sets the option");
}
