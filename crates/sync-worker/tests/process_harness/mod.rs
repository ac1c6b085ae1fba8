//! `sync-worker` processes for tests: spawned from the built binary in a
//! directory of their own, killed on drop, and the settings a scale-out
//! (`api` + `worker`s on one Redis and one Postgres) shares.
#![allow(dead_code)]

use std::process::{Child, Stdio};

use sync_worker::testing::{sync_worker_command, TEST_SECRET_KEY};

/// A child process (and what it is, for messages), killed on drop.
pub struct Proc(pub Child, pub &'static str);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sync-worker ARGS` in `dir` with `env` added.
pub fn sync_worker(dir: &std::path::Path, args: &[&str], env: &[(&str, String)], name: &'static str) -> Proc {
    let mut c = sync_worker_command(env!("CARGO_BIN_EXE_sync-worker"), dir);
    c.args(args).stdout(Stdio::null()).stderr(Stdio::inherit());
    for (k, v) in env {
        c.env(k, v);
    }
    Proc(c.spawn().unwrap_or_else(|e| panic!("spawn sync-worker {args:?}: {e}")), name)
}

/// What every process of a scale-out on `redis` (keys under `prefix`) and
/// the database `database_url` is given: quick polls and a short lease.
pub fn scale_out_env(redis: &str, prefix: &str, database_url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_URL", redis.to_string()),
        ("REDIS_KEY_PREFIX", prefix.to_string()),
        ("DATABASE_URL", database_url.to_string()),
        ("SECRET_KEY", TEST_SECRET_KEY.to_string()),
        ("POLL_WARM", "2s".to_string()),
        ("TIER_EVAL_INTERVAL", "1s".to_string()),
        ("LEASE_TTL", "3s".to_string()),
        ("RECONCILE_INTERVAL", "1s".to_string()),
        // The tests' Dovecot and receivers are on loopback, which the API refuses by default.
        ("IMAP_ALLOW_PRIVATE", "true".to_string()),
    ]
}
