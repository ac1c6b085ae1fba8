//! An in-process, scripted [`MailSource`] for tests and benchmarks.
//!
//! It keeps, per account, a newest internal date and a counter of delivered
//! mail (which wakes INBOX watches), can be told to fail connects, and records
//! **every poll and every watch** with the worker and fencing token that made
//! it, in order, with the (tokio) time since the source was made. Like real
//! storage it keeps the highest token it has seen per account and rejects
//! polls that carry a lower one ([`SourceError::Fenced`]); rejected polls are
//! recorded too, with `accepted: false`.
//!
//! [`ScriptedSource::check_exclusive`] reads the log and proves that no
//! account was ever run by two workers at once.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{FencingToken, LeaseKey, WorkerId};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::errors::SourceError;
use crate::source::{Fence, MailConnection, MailSource, PollReport, Scope};

/// What a log entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activity {
    /// A poll of `Scope`'s folders (a write).
    Poll(Scope),
    /// A wait for new mail on INBOX began (an IDLE was issued).
    Watch,
    /// A connection was opened.
    Connect,
}

/// One entry of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollRecord {
    /// Time since the source was made (tokio time: paused in tests).
    pub at: Duration,
    /// The account.
    pub account: LeaseKey,
    /// The worker that did it.
    pub worker: WorkerId,
    /// The fencing token it carried.
    pub token: FencingToken,
    /// What it was.
    pub activity: Activity,
    /// `false` when storage rejected it because a newer token had written.
    pub accepted: bool,
}

#[derive(Debug)]
struct Account {
    latest_ms: Option<u64>,
    unread: u64,
    mail_seq: watch::Sender<u64>,
    fail_connects: u32,
}

impl Account {
    fn new() -> Self {
        Self { latest_ms: None, unread: 0, mail_seq: watch::channel(0).0, fail_connects: 0 }
    }
}

#[derive(Debug, Default)]
struct State {
    accounts: HashMap<LeaseKey, Account>,
    highest: HashMap<LeaseKey, FencingToken>,
    log: Vec<PollRecord>,
    poll_delay: Duration,
}

#[derive(Debug)]
struct Inner {
    start: Instant,
    state: Mutex<State>,
}

/// The scripted source. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct ScriptedSource {
    inner: Arc<Inner>,
}

impl Default for ScriptedSource {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedSource {
    /// An empty source (accounts spring into being when first touched).
    pub fn new() -> Self {
        Self { inner: Arc::new(Inner { start: Instant::now(), state: Mutex::new(State::default()) }) }
    }

    /// The log clock's reading now (the `at` of a record made at this instant).
    pub fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.inner.start)
    }

    fn with_account<R>(&self, account: &LeaseKey, f: impl FnOnce(&mut Account) -> R) -> R {
        let mut state = self.inner.state.lock();
        f(state.accounts.entry(account.clone()).or_insert_with(Account::new))
    }

    /// Sets the newest internal date of `account`'s mail (ms since the epoch).
    pub fn set_latest(&self, account: &LeaseKey, latest_ms: Option<u64>) {
        self.with_account(account, |a| a.latest_ms = latest_ms);
    }

    /// Delivers one message to `account`'s INBOX with `internal_date_ms`,
    /// waking any INBOX watch.
    pub fn deliver(&self, account: &LeaseKey, internal_date_ms: u64) {
        self.with_account(account, |a| {
            a.latest_ms = Some(a.latest_ms.map_or(internal_date_ms, |l| l.max(internal_date_ms)));
            a.unread += 1;
            a.mail_seq.send_modify(|s| *s += 1);
        });
    }

    /// Makes the next `n` connects to `account` fail.
    pub fn fail_connects(&self, account: &LeaseKey, n: u32) {
        self.with_account(account, |a| a.fail_connects = n);
    }

    /// Makes every poll take `delay` (tokio time) before it writes.
    pub fn set_poll_delay(&self, delay: Duration) {
        self.inner.state.lock().poll_delay = delay;
    }

    /// The whole log, in order.
    pub fn log(&self) -> Vec<PollRecord> {
        self.inner.state.lock().log.clone()
    }

    /// The log entries of one account, in order.
    pub fn log_of(&self, account: &LeaseKey) -> Vec<PollRecord> {
        self.inner.state.lock().log.iter().filter(|r| &r.account == account).cloned().collect()
    }

    /// Polls of one account (watches and connects left out), in order.
    pub fn polls_of(&self, account: &LeaseKey) -> Vec<PollRecord> {
        self.inner
            .state
            .lock()
            .log
            .iter()
            .filter(|r| &r.account == account && matches!(r.activity, Activity::Poll(_)))
            .cloned()
            .collect()
    }

    /// How many entries the log holds.
    pub fn log_len(&self) -> usize {
        self.inner.state.lock().log.len()
    }

    /// Empties the log (the fencing memory is kept).
    pub fn clear_log(&self) {
        self.inner.state.lock().log.clear();
    }

    /// Checks that no account was ever run by two workers at once: per
    /// account, in log order, a token never appears after a higher one, and
    /// each token belongs to one worker. Rejected polls count (a stale owner
    /// that still polls is still running, even if storage protected itself).
    /// The error lists every violation.
    pub fn check_exclusive(&self) -> Result<(), String> {
        self.check(true)
    }

    /// Like [`ScriptedSource::check_exclusive`] but only over accepted polls
    /// (the writes): what storage let through was always written by one
    /// owner at a time.
    pub fn check_accepted_exclusive(&self) -> Result<(), String> {
        self.check(false)
    }

    fn check(&self, include_rejected: bool) -> Result<(), String> {
        let state = self.inner.state.lock();
        let mut highest: HashMap<&LeaseKey, (FencingToken, &WorkerId, Duration)> = HashMap::new();
        let mut owners: HashMap<(&LeaseKey, FencingToken), &WorkerId> = HashMap::new();
        let mut report = String::new();
        let counts = |r: &PollRecord| include_rejected || (r.accepted && matches!(r.activity, Activity::Poll(_)));
        for r in state.log.iter().filter(|r| counts(r)) {
            if let Some(w) = owners.insert((&r.account, r.token), &r.worker) {
                if w != &r.worker {
                    let _ = writeln!(report, "{}: token {} used by both {} and {}", r.account, r.token, w, r.worker);
                }
            }
            match highest.get(&r.account) {
                Some((t, w, at)) if *t > r.token => {
                    let _ = writeln!(
                        report,
                        "{}: {} ran {:?} with token {} at {:?}, after {} had run it with token {} at {:?}",
                        r.account, r.worker, r.activity, r.token, r.at, w, t, at
                    );
                }
                _ => {
                    highest.insert(&r.account, (r.token, &r.worker, r.at));
                }
            }
        }
        if report.is_empty() {
            Ok(())
        } else {
            Err(report)
        }
    }

    fn record(&self, state: &mut State, fence: &Fence, activity: Activity, accepted: bool) {
        let at = self.now();
        state.log.push(PollRecord {
            at,
            account: fence.account.clone(),
            worker: fence.worker.clone(),
            token: fence.token,
            activity,
            accepted,
        });
    }
}

#[async_trait]
impl MailSource for ScriptedSource {
    async fn take_over(&self, fence: &Fence) -> Result<(), SourceError> {
        // As storage does: strictly above the highest token seen, or fenced.
        let mut state = self.inner.state.lock();
        match state.highest.get(&fence.account).copied() {
            Some(current) if current >= fence.token => {
                Err(SourceError::Fenced { account: fence.account.clone(), token: fence.token, current })
            }
            _ => {
                state.highest.insert(fence.account.clone(), fence.token);
                Ok(())
            }
        }
    }

    async fn connect(&self, fence: &Fence) -> Result<Box<dyn MailConnection>, SourceError> {
        let mut state = self.inner.state.lock();
        let account = state.accounts.entry(fence.account.clone()).or_insert_with(Account::new);
        if account.fail_connects > 0 {
            account.fail_connects -= 1;
            return Err(SourceError::Connect {
                account: fence.account.clone(),
                server: "scripted".into(),
                source: "scripted failure".into(),
            });
        }
        let mail = account.mail_seq.subscribe();
        self.record(&mut state, fence, Activity::Connect, true);
        Ok(Box::new(ScriptedConnection { source: self.clone(), fence: fence.clone(), mail }))
    }

    async fn latest_internal_date(&self, account: &LeaseKey) -> Result<Option<u64>, SourceError> {
        Ok(self.inner.state.lock().accounts.get(account).and_then(|a| a.latest_ms))
    }
}

struct ScriptedConnection {
    source: ScriptedSource,
    fence: Fence,
    mail: watch::Receiver<u64>,
}

#[async_trait]
impl MailConnection for ScriptedConnection {
    async fn poll(&mut self, scope: Scope) -> Result<PollReport, SourceError> {
        let delay = self.source.inner.state.lock().poll_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        // Everything delivered so far is seen by this poll.
        self.mail.borrow_and_update();
        let mut state = self.source.inner.state.lock();
        let highest = state.highest.get(&self.fence.account).copied();
        if let Some(current) = highest.filter(|h| *h > self.fence.token) {
            self.source.record(&mut state, &self.fence, Activity::Poll(scope), false);
            return Err(SourceError::Fenced { account: self.fence.account.clone(), token: self.fence.token, current });
        }
        state.highest.insert(self.fence.account.clone(), self.fence.token);
        self.source.record(&mut state, &self.fence, Activity::Poll(scope), true);
        let account = state.accounts.entry(self.fence.account.clone()).or_insert_with(Account::new);
        let new_messages = if scope == Scope::Special { 0 } else { std::mem::take(&mut account.unread) };
        Ok(PollReport { new_messages, latest_internal_date_ms: account.latest_ms })
    }

    async fn wait_new_mail(&mut self) -> Result<(), SourceError> {
        {
            let mut state = self.source.inner.state.lock();
            self.source.record(&mut state, &self.fence, Activity::Watch, true);
        }
        self.mail.changed().await.map_err(|_| SourceError::Io {
            account: self.fence.account.clone(),
            op: "watch".into(),
            source: "scripted source dropped".into(),
        })
    }
}
