//! # sync-worker
//!
//! Keeps many users' IMAP accounts synced into SQL: who syncs which account
//! and how hard, the IMAP engine, the storage, and the operator CLI.
//!
//! * [`coordinator`]: workers own accounts through leases
//!   ([`leasehold_core::LeaseStore`]): a fair share each, renewed every third
//!   of the TTL, released on shutdown, taken over after a crash; it tiers each
//!   owned account hot / warm / cold ([`tiers`]).
//! * [`runner`]: the loops of one owned account, shaped by its tier; every
//!   write carries the lease's fencing token.
//! * [`source`]: the mail engine behind a trait ([`source::MailSource`]);
//!   [`imap::ImapSource`] is the real one. With the `test-support` feature,
//!   `scripted::ScriptedSource` is an in-process stand-in that records every
//!   poll with its worker and token.
//! * [`storage`]: the SQL storage (SQLite or Postgres): users, accounts,
//!   folders and messages, every write of an owned account fenced by the
//!   lease's token; [`secret`] encrypts the IMAP passwords in it.
//! * [`directory`]: account -> user.
//! * [`reconcile`]: the live set follows the accounts table.
//! * [`cli`]: the `sync-worker` command line (worker and operator commands).
//! * [`config`]: settings from the environment.
//! * [`wiring`]: the one place that turns `REDIS_URL` into a backend.
//! * `testing` (feature `test-support`): private Dovecot and Postgres
//!   servers and realistic mail for tests and benchmarks.
//! * [`api`]: the HTTP + WebSocket API and the console; [`events`]: how
//!   the engine's writes reach its WebSockets.
//!
//! The coordinator and runner depend only on the core traits
//! (`Arc<dyn LeaseStore>`), so they run unchanged on the in-memory backend
//! and on Redis.
#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod deadline;
pub mod directory;
pub mod errors;
pub mod events;
pub mod imap;
pub mod reconcile;
pub mod runner;
#[cfg(feature = "test-support")]
pub mod scripted;
pub mod secret;
pub mod source;
pub mod storage;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tiers;
pub mod wiring;

pub use config::Config;
pub use coordinator::{
    AccountView, Coordinator, CoordinatorHandle, CoordinatorObserver, CoordinatorStats, Deps, PreparedCoordinator,
};
pub use directory::AccountDirectory;
#[cfg(feature = "test-support")]
pub use directory::MemoryDirectory;
pub use errors::{BoxError, ConfigError, DirectoryError, SourceError, SyncError};
pub use runner::{RunnerExit, RunnerHandle, RunnerSettings, RunnerStatus};
#[cfg(feature = "test-support")]
pub use scripted::{Activity, PollRecord, ScriptedSource};
pub use source::{Fence, MailConnection, MailSource, PollReport, Scope};
pub use tiers::{TierInputs, TierPolicy};
