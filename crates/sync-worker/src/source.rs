//! The mail source: what the runner drives. [`crate::imap::ImapSource`] is the
//! real one; `testing::ScriptedSource` (feature `test-support`) the in-process stand-in
//! for tests and benchmarks.

use std::fmt;

use async_trait::async_trait;
use leasehold_core::{FencingToken, Lease, LeaseKey, WorkerId};

use crate::deadline::LeaseDeadline;
use crate::errors::SourceError;

/// Who may write for an account, and until when: the lease a runner holds.
/// Every connection is opened with one, and every write it makes carries the
/// token, so storage can reject a stale owner's late writes; and no write
/// transaction begins or commits once the deadline has passed.
#[derive(Debug, Clone)]
pub struct Fence {
    /// The account.
    pub account: LeaseKey,
    /// The worker holding the lease.
    pub worker: WorkerId,
    /// The lease's fencing token.
    pub token: FencingToken,
    /// The lease's local deadline (the runner's, moved on each renew).
    pub deadline: LeaseDeadline,
}

impl From<&Lease> for Fence {
    /// The lease's fence, without a deadline yet (a runner sets its own).
    fn from(lease: &Lease) -> Self {
        Self {
            account: lease.key.clone(),
            worker: lease.owner.clone(),
            token: lease.token,
            deadline: LeaseDeadline::unbounded(),
        }
    }
}

/// Which folders a poll covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every folder the server lists (a transient warm or cold poll).
    All,
    /// INBOX only (after the persistent watch reports new mail, or when it starts).
    Inbox,
    /// The hot tier's secondary poll: every folder, as [`Scope::All`] (INBOX
    /// too, so a change the watch could not see, such as a flag change on a
    /// server without CONDSTORE, still arrives).
    Special,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::All => "all",
            Scope::Inbox => "inbox",
            Scope::Special => "special",
        })
    }
}

/// What one poll found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollReport {
    /// Messages new since the previous poll.
    pub new_messages: u64,
    /// The newest internal date seen in the polled folders (ms since the epoch).
    pub latest_internal_date_ms: Option<u64>,
}

/// A source of mail for accounts: the IMAP engine behind a trait.
#[async_trait]
pub trait MailSource: Send + Sync + 'static {
    /// Records `fence` as the account's owner in storage, before the owner
    /// syncs anything: from then on every write under an older token is
    /// rejected. Storage holding a token at or above `fence.token` is
    /// [`SourceError::Fenced`] (with both tokens). A runner calls this once
    /// per claim, before its first [`MailSource::connect`].
    async fn take_over(&self, fence: &Fence) -> Result<(), SourceError>;

    /// Opens a connection to the account's server; every write made through
    /// it carries `fence`.
    async fn connect(&self, fence: &Fence) -> Result<Box<dyn MailConnection>, SourceError>;

    /// The newest internal date of the account's mail (ms since the epoch),
    /// `None` when it has none (or none is known yet).
    async fn latest_internal_date(&self, account: &LeaseKey) -> Result<Option<u64>, SourceError>;
}

/// An open connection to one account's server.
#[async_trait]
pub trait MailConnection: Send {
    /// Syncs the folders of `scope` (incrementally) and writes what changed.
    async fn poll(&mut self, scope: Scope) -> Result<PollReport, SourceError>;

    /// Waits on INBOX until the server reports new mail (IMAP IDLE). May return
    /// early without new mail; the caller polls INBOX after every return.
    /// Dropping the future ends the wait.
    async fn wait_new_mail(&mut self) -> Result<(), SourceError>;
}
