//! # sync-worker
//!
//! Keeps many users' IMAP accounts synced into SQL: who syncs which account
//! and how hard, the IMAP engine, the storage, and the operator CLI.
//!
//! The modules, in reading order (the process, its parts, the ports they
//! plug into, the leaves):
//!
//! * [`cli`]: the `sync-worker` command line; parses it, runs the operator commands.
//! * [`app`]: the processes, assembled once (storage, worker, API); `wiring` names the backend.
//! * [`api`]: the HTTP + WebSocket API and the console.
//! * [`coordinator`]: which accounts a worker owns and how hot each is; their runners.
//! * [`imap`]: the IMAP engine, the real [`MailSource`].
//! * [`storage`]: SQLite or Postgres: accounts, mail, sessions, views; fenced writes.
//! * [`deadline`]: the lease deadline the runner and the storage both check before a commit.
//! * [`directory`]: the port for account -> user ([`AccountDirectory`]).
//! * [`events`]: the port through which the engine's writes reach the WebSockets.
//! * [`source`]: the port the runner drives ([`MailSource`], [`Fence`]).
//! * [`config`]: the engine's settings, from the environment.
//! * [`errors`]: every error of the crate, and its one error-chain formatter.
//! * [`secret`]: the key that encrypts the stored IMAP passwords.
//! * `testing` (feature `test-support`): the test doubles, a database per
//!   test, private Dovecot and Postgres servers, realistic mail.
//!
//! The arrows point down this list, never up: `cli` uses `app`; `app` uses
//! everything below it; `api` uses `storage`, `imap` (the login check) and
//! `events`; `coordinator` uses the ports (and `storage`, to reconcile);
//! `imap` uses `storage` and `source`; `storage` uses `events`, `source`
//! and `directory`. The coordinator and runner depend only on the core
//! traits (`Arc<dyn LeaseStore>`) and the ports, so they run unchanged on
//! the in-memory backend and on Redis.
#![warn(missing_docs)]

// The process.
pub mod allocator;
pub mod cli;

pub mod app;

// Its parts.
pub mod api;
pub mod coordinator;
pub mod imap;
pub mod storage;
pub mod webhooks;

// The ports they plug into.
pub mod deadline;
pub mod directory;
pub mod events;
pub mod leases;
pub mod logging;
pub mod metrics;
pub mod source;

// The leaves.
pub mod config;
pub mod errors;
pub mod oauth2;
pub mod secret;

#[cfg(feature = "test-support")]
pub mod testing;

pub use config::Config;
pub use coordinator::runner::{RunnerExit, RunnerHandle, RunnerSettings, RunnerStatus, POLL_STAGGER};
pub use coordinator::tiers::{TierInputs, TierPolicy};
pub use coordinator::{
    AccountView, Coordinator, CoordinatorHandle, CoordinatorObserver, CoordinatorStats, Deps, PreparedCoordinator,
};
pub use directory::AccountDirectory;
pub use errors::{BoxError, ConfigError, DirectoryError, SourceError, SyncError};
pub use leases::Leases;
pub use source::{Fence, MailConnection, MailSource, PollReport, Scope};
#[cfg(feature = "test-support")]
pub use testing::{Activity, MemoryDirectory, PollRecord, ScriptedSource};
