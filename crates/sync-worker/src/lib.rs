//! # sync-worker
//!
//! Keeps many users' IMAP accounts synced. This crate holds the part that
//! decides **who syncs which account and how hard**:
//!
//! * [`coordinator`]: workers own accounts through leases
//!   ([`leasehold_core::LeaseStore`]): a fair share each, renewed every third
//!   of the TTL, released on shutdown, taken over after a crash; it tiers each
//!   owned account hot / warm / cold ([`tiers`]).
//! * [`runner`]: the loops of one owned account, shaped by its tier; every
//!   write carries the lease's fencing token.
//! * [`source`]: the mail engine behind a trait ([`source::MailSource`]);
//!   [`scripted::ScriptedSource`] is an in-process stand-in that records every
//!   poll with its worker and token.
//! * [`directory`]: account -> user.
//! * [`config`]: settings from the environment.
//! * [`wiring`]: the one place that turns `REDIS_URL` into a backend.
//!
//! The coordinator and runner depend only on the core traits
//! (`Arc<dyn LeaseStore>`), so they run unchanged on the in-memory backend
//! and on Redis.
#![warn(missing_docs)]

pub mod config;
pub mod coordinator;
pub mod directory;
pub mod errors;
pub mod runner;
pub mod scripted;
pub mod source;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tiers;
pub mod wiring;

pub use config::Config;
pub use coordinator::{
    AccountView, Coordinator, CoordinatorHandle, CoordinatorObserver, CoordinatorStats, Deps, PreparedCoordinator,
};
pub use directory::{AccountDirectory, MemoryDirectory};
pub use errors::{ConfigError, DirectoryError, SourceError, SyncError};
pub use runner::{RunnerExit, RunnerHandle, RunnerSettings, RunnerStatus};
pub use scripted::{Activity, PollRecord, ScriptedSource};
pub use source::{Fence, MailConnection, MailSource, PollReport, Scope};
pub use tiers::{TierInputs, TierPolicy};

/// A worker id for this process: `<hostname>-<pid>-<random>`.
pub fn default_worker_id() -> leasehold_core::WorkerId {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let host: String =
        host.trim().chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).take(64).collect();
    let host = if host.is_empty() { "worker".to_string() } else { host };
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    let id = format!("{host}-{}-{:06x}", std::process::id(), h.finish() & 0xff_ffff);
    leasehold_core::WorkerId::new(&id).unwrap_or_else(|_| {
        leasehold_core::WorkerId::new(format!("worker-{}", std::process::id())).expect("a plain worker id is valid")
    })
}
