//! The runner: the loops of one owned account, shaped by its tier.
//!
//! * **hot**: a persistent connection waits for new mail on INBOX (IMAP IDLE,
//!   re-issued every `IDLE_REISSUE` whatever keepalives the server sends, with
//!   reconnects and exponential backoff) and polls INBOX after every wake-up
//!   and when it (re)connects; plus a secondary poll of every folder
//!   every `POLL_WARM` on a transient connection.
//! * **warm**: no persistent connection; a transient poll of every folder
//!   every `POLL_WARM`.
//! * **cold**: the same every `POLL_COLD`.
//!
//! **Tier changes reshape the loops in place.** The periodic poll (the
//! secondary poll when hot, the only one otherwise) keeps one schedule across tiers:
//! its next run is always *the start of the previous periodic poll + the
//! current tier's interval* (or at once if that is already past, and then
//! only once). So a change never skips the due poll nor runs an extra one;
//! only the INBOX watch starts or stops.
//!
//! **Fencing.** Every connection is opened with the lease's [`Fence`], so
//! every write carries its token. The runner also holds a *lease deadline*
//! (the coordinator moves it forward after each successful renew): it never
//! starts a poll past it and ends at its first poll after it, even if the
//! coordinator is stuck (the coordinator itself aborts the runner of a lease
//! whose deadline passed at its next tick). Before anything else, a runner
//! records its token as the account's current one
//! ([`MailSource::take_over`]), so from then on every write of an older owner
//! is rejected, whether or not this runner has written mail yet. A take-over
//! or a poll rejected by storage ([`SourceError::Fenced`]: storage holds a
//! token at or above this runner's) ends the runner at once with
//! [`RunnerExit::Fenced`], which carries both tokens so the coordinator can
//! tell a newer owner from a lease store that lost its counters. The
//! coordinator stops it at once when a renew answers that the lease is lost.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use leasehold_core::duration::jitter;
use leasehold_core::{FencingToken, Tier};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use super::task::AbortOnDrop;
use crate::config::Config;
use crate::deadline::LeaseDeadline;
use crate::errors::{error_chain, SourceError};
use crate::source::{Fence, MailSource, Scope};

/// The runner's timing settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunnerSettings {
    /// Periodic poll interval of warm accounts and secondary poll of hot ones.
    pub poll_warm: Duration,
    /// Periodic poll interval of cold accounts.
    pub poll_cold: Duration,
    /// Hard deadline of one INBOX wait before it is re-issued.
    pub idle_reissue: Duration,
    /// First delay after a failed connect or poll; doubles up to the poll interval.
    pub retry_base: Duration,
    /// Most of the interval a periodic poll may come early by, drawn afresh
    /// for each poll (`0.1`: the wait is 0.9 to 1 times the interval), so
    /// accounts started together do not stay in step; `0.0` polls exactly
    /// on the interval.
    pub poll_stagger: f64,
}

impl From<&Config> for RunnerSettings {
    fn from(c: &Config) -> Self {
        Self {
            poll_warm: c.poll_warm,
            poll_cold: c.poll_cold,
            idle_reissue: c.idle_reissue,
            retry_base: Duration::from_secs(1).min(c.poll_warm),
            poll_stagger: POLL_STAGGER,
        }
    }
}

impl RunnerSettings {
    fn interval(&self, tier: Tier) -> Duration {
        match tier {
            Tier::Hot | Tier::Warm => self.poll_warm,
            Tier::Cold => self.poll_cold,
        }
    }
}

/// What a runner last did, for status reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerStatus {
    /// Successful polls so far.
    pub polls: u64,
    /// When the last successful poll ended (tokio time).
    pub last_sync: Option<Instant>,
    /// The last error, cleared by the next successful poll.
    pub last_error: Option<String>,
}

/// How a runner ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerExit {
    /// It was asked to stop.
    Stopped,
    /// Its lease deadline passed without a renew.
    LeaseExpired,
    /// Storage rejected the take-over or a write: it holds a token at or
    /// above this runner's.
    Fenced {
        /// The token this runner held.
        held: FencingToken,
        /// The token storage holds.
        stored: FencingToken,
    },
}

/// What the coordinator asks of a runner (its tier, whether to stop), and
/// whether the lease's token is recorded in storage: one small cell, since
/// an owned account between polls costs little more than its runner.
#[derive(Debug)]
struct Control {
    /// Bits 0-1: the tier; bit 2: stop; bit 3: taken over.
    state: AtomicU8,
    /// Woken after every change of the tier or stop (one waiter, the runner:
    /// a change made while it is busy leaves a permit, so none is missed).
    changed: Notify,
}

const STOP: u8 = 1 << 2;
/// A runner restarted under the same lease must not record its token again
/// (the strict claim-time check would take its own token for a duplicate).
const TAKEN_OVER: u8 = 1 << 3;
const TIER_BITS: u8 = 0b11;

fn tier_bits(tier: Tier) -> u8 {
    match tier {
        Tier::Hot => 0,
        Tier::Warm => 1,
        Tier::Cold => 2,
    }
}

impl Control {
    fn new(tier: Tier) -> Self {
        Self { state: AtomicU8::new(tier_bits(tier)), changed: Notify::new() }
    }

    fn tier(&self) -> Tier {
        match self.state.load(Ordering::Acquire) & TIER_BITS {
            0 => Tier::Hot,
            1 => Tier::Warm,
            _ => Tier::Cold,
        }
    }

    fn is(&self, flag: u8) -> bool {
        self.state.load(Ordering::Acquire) & flag != 0
    }

    fn set(&self, flag: u8) {
        self.state.fetch_or(flag, Ordering::AcqRel);
    }

    /// Sets the tier; `true` if it changed.
    fn set_tier(&self, tier: Tier) -> bool {
        let bits = tier_bits(tier);
        let old = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| Some((s & !TIER_BITS) | bits))
            .unwrap_or_else(|s| s);
        old & TIER_BITS != bits
    }
}

struct Ctx {
    source: Arc<dyn MailSource>,
    fence: Fence,
    settings: Arc<RunnerSettings>,
    control: Arc<Control>,
    deadline: LeaseDeadline,
    status: Arc<Mutex<RunnerStatus>>,
}

/// The INBOX watch of a hot account. It ends when fenced, with the tokens
/// (held, stored), or with `None` when the lease deadline passed.
type Watch = AbortOnDrop<Option<(FencingToken, FencingToken)>>;

/// A running account: change its tier, move its lease deadline, stop it.
/// Dropping the handle aborts the runner and all its loops.
#[derive(Debug)]
pub struct RunnerHandle {
    fence: Fence,
    control: Arc<Control>,
    deadline: LeaseDeadline,
    status: Arc<Mutex<RunnerStatus>>,
    settings: Arc<RunnerSettings>,
    task: AbortOnDrop<RunnerExit>,
}

impl RunnerHandle {
    /// Starts the loops of `fence.account` in `tier`, valid until `deadline`.
    /// (A coordinator shares one `Arc` of settings among all its runners.)
    pub fn spawn(
        source: Arc<dyn MailSource>,
        fence: Fence,
        tier: Tier,
        deadline: Instant,
        settings: impl Into<Arc<RunnerSettings>>,
    ) -> Self {
        Self::spawn_until(source, fence, tier, LeaseDeadline::until(deadline), settings)
    }

    /// [`RunnerHandle::spawn`] with a deadline cell shared with others (the
    /// accounts of one bucket lease): moving it moves all of theirs.
    pub fn spawn_until(
        source: Arc<dyn MailSource>,
        fence: Fence,
        tier: Tier,
        deadline: LeaseDeadline,
        settings: impl Into<Arc<RunnerSettings>>,
    ) -> Self {
        let mut fence = fence;
        fence.deadline = deadline.clone();
        let status = Arc::new(Mutex::new(RunnerStatus::default()));
        Self::start(source, fence, Arc::new(Control::new(tier)), deadline, status, settings.into())
    }

    fn start(
        source: Arc<dyn MailSource>,
        fence: Fence,
        control: Arc<Control>,
        deadline: LeaseDeadline,
        status: Arc<Mutex<RunnerStatus>>,
        settings: Arc<RunnerSettings>,
    ) -> Self {
        let ctx = Ctx {
            source,
            fence: fence.clone(),
            settings: settings.clone(),
            control: control.clone(),
            deadline: deadline.clone(),
            status: status.clone(),
        };
        let task = AbortOnDrop(tokio::spawn(run(ctx)));
        Self { fence, control, deadline, status, settings, task }
    }

    /// A new runner for the same lease, tier, deadline and status, after this
    /// one ended by itself (a panic). It does not record the lease's token
    /// again if this one already had.
    pub fn restart(&self, source: Arc<dyn MailSource>) -> Self {
        Self::start(
            source,
            self.fence.clone(),
            self.control.clone(),
            self.deadline.clone(),
            self.status.clone(),
            self.settings.clone(),
        )
    }

    /// How the runner ended, once it has: `None` while it runs or when it
    /// panicked or was aborted.
    pub fn exit(&mut self) -> Option<RunnerExit> {
        if !self.task.0.is_finished() {
            return None;
        }
        (&mut self.task.0).now_or_never().and_then(Result::ok)
    }

    /// The fence (account, worker, token) this runner writes under.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The current tier.
    pub fn tier(&self) -> Tier {
        self.control.tier()
    }

    /// Reshapes the loops for `tier` (no-op when unchanged).
    pub fn set_tier(&self, tier: Tier) {
        if self.control.set_tier(tier) {
            self.control.changed.notify_one();
        }
    }

    /// Moves the lease deadline (after a successful renew).
    pub fn extend(&self, deadline: Instant) {
        self.deadline.extend(deadline);
    }

    /// A snapshot of what the runner last did.
    pub fn status(&self) -> RunnerStatus {
        self.status.lock().clone()
    }

    /// A shared view of the status that outlives the handle.
    pub fn status_handle(&self) -> Arc<Mutex<RunnerStatus>> {
        self.status.clone()
    }

    /// Whether the runner has ended (stopped, lease expired, or panicked).
    pub fn is_finished(&self) -> bool {
        self.task.0.is_finished()
    }

    /// Asks the runner to stop after the poll in progress (if any), waits up
    /// to `grace` for it, then aborts whatever is left. When this returns, no
    /// loop of the account runs any more.
    pub async fn stop(mut self, grace: Duration) {
        // A finished task may have been read already (`exit`): awaiting it again would panic.
        if self.task.0.is_finished() {
            return;
        }
        self.control.set(STOP);
        self.control.changed.notify_one();
        if tokio::time::timeout(grace, &mut self.task.0).await.is_err() {
            tracing::warn!(account = %self.fence.account, ?grace, "runner did not stop within its grace; aborted");
            self.task.0.abort();
            let _ = (&mut self.task.0).await;
        }
    }

    /// Stops the runner at once (aborting a poll in progress). When the
    /// returned future completes no loop of the account runs any more.
    pub async fn abort(mut self) {
        if self.task.0.is_finished() {
            return;
        }
        self.task.0.abort();
        let _ = (&mut self.task.0).await;
    }
}

/// Most of a tier's interval a periodic poll may come early by, in service:
/// warm accounts that started in the same second spread over a tenth of
/// `POLL_WARM` after one poll, and never wait longer than the interval.
pub const POLL_STAGGER: f64 = 0.1;

async fn run(mut ctx: Ctx) -> RunnerExit {
    let account = ctx.fence.account.clone();
    tracing::debug!(%account, token = %ctx.fence.token, tier = %ctx.control.tier(), "runner started");
    if !ctx.control.is(TAKEN_OVER) {
        // Boxed: the runner's own state, which every owned account keeps
        // while it waits, need not hold room for this one-off.
        if let Err(exit) = Box::pin(take_over(&mut ctx)).await {
            tracing::debug!(%account, ?exit, "runner ended before its take-over");
            return exit;
        }
        ctx.control.set(TAKEN_OVER);
    }
    // Start of the last successful periodic poll: the one schedule kept across
    // tiers; and the share of the tier's interval to wait after it, drawn per
    // poll (0.9..=1.0), so accounts that started together do not stay in step.
    let mut last_periodic: Option<Instant> = None;
    let mut stagger = 1.0;
    // After a failed periodic poll: when to retry, and the next backoff.
    let mut retry: Option<(Instant, Duration)> = None;
    let mut watch: Option<Watch> = None;
    let exit = loop {
        // Read before waiting: a change after this leaves a permit on `changed`.
        let tier = ctx.control.tier();
        if ctx.control.is(STOP) {
            break RunnerExit::Stopped;
        }
        if ctx.deadline.passed() {
            break RunnerExit::LeaseExpired;
        }
        match (tier, watch.is_some()) {
            (Tier::Hot, false) => watch = Some(spawn_watch(&ctx)),
            (Tier::Warm | Tier::Cold, true) => watch = None,
            _ => {}
        }
        let due = match (retry, last_periodic) {
            (Some((at, _)), _) => at,
            (None, Some(last)) => last + ctx.settings.interval(tier).mul_f64(stagger),
            (None, None) => Instant::now(),
        };
        tokio::select! {
            biased;
            () = ctx.control.changed.notified() => {}
            ended = watch_ended(&mut watch) => match ended {
                Ok(Some((held, stored))) => break RunnerExit::Fenced { held, stored },
                Ok(None) => break RunnerExit::LeaseExpired,
                Err(e) => {
                    tracing::error!(%account, error = %e, "the INBOX watch panicked; starting it again");
                    watch = None;
                }
            },
            _ = sleep_until(due) => {
                if ctx.deadline.passed() {
                    break RunnerExit::LeaseExpired;
                }
                let started = Instant::now();
                let scope = if tier == Tier::Hot { Scope::Special } else { Scope::All };
                let polled = transient_poll(&ctx, scope).await;
                crate::metrics::poll_done(tier, started.elapsed(), polled.is_ok());
                match polled {
                    Ok(()) => {
                        last_periodic = Some(started);
                        stagger = 1.0 - ctx.settings.poll_stagger.clamp(0.0, 1.0) * fastrand::f64();
                        retry = None;
                    }
                    Err(SourceError::LeaseExpired { .. }) => break RunnerExit::LeaseExpired,
                    Err(e @ SourceError::Fenced { token, current, .. }) => {
                        // Logged once, by the coordinator, which knows whether it still holds the lease.
                        tracing::debug!(%account, error = %e, "fenced; stopping");
                        ctx.status.lock().last_error = Some(e.to_string());
                        break RunnerExit::Fenced { held: token, stored: current };
                    }
                    Err(e) => {
                        // A refused login will not heal in a second: wait a whole interval.
                        let backoff = if e.is_permanent() {
                            ctx.settings.interval(tier)
                        } else {
                            retry.map_or(ctx.settings.retry_base, |(_, b)| b)
                        };
                        let backoff = jitter(backoff, 0.2);
                        let text = error_chain(&e);
                        // Logged when it changes: the same failure again is no news.
                        let repeated = ctx.status.lock().last_error.as_deref() == Some(text.as_str());
                        if repeated {
                            tracing::debug!(%account, %scope, error = %text, retry_in = ?backoff, "periodic poll failed again");
                        } else {
                            tracing::warn!(%account, %scope, error = %text, retry_in = ?backoff, "periodic poll failed");
                        }
                        ctx.status.lock().last_error = Some(text);
                        let next = (backoff * 2).min(ctx.settings.interval(tier));
                        retry = Some((Instant::now() + backoff, next));
                    }
                }
            }
        }
    };
    drop(watch);
    tracing::debug!(%account, ?exit, "runner ended");
    exit
}

/// Records the lease's token in storage before anything is synced
/// ([`MailSource::take_over`]). A storage failure (the database down) is
/// retried with backoff until the runner is stopped or its lease runs out;
/// a rejection ends the runner as [`RunnerExit::Fenced`].
async fn take_over(ctx: &mut Ctx) -> Result<(), RunnerExit> {
    let mut backoff = ctx.settings.retry_base;
    loop {
        if ctx.control.is(STOP) {
            return Err(RunnerExit::Stopped);
        }
        if ctx.deadline.passed() {
            return Err(RunnerExit::LeaseExpired);
        }
        let e = match ctx.source.take_over(&ctx.fence).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if let SourceError::Fenced { token, current, .. } = e {
            // Logged once, by the coordinator, which knows whether it still holds the lease.
            tracing::debug!(account = %ctx.fence.account, error = %e, "take-over fenced");
            ctx.status.lock().last_error = Some(e.to_string());
            return Err(RunnerExit::Fenced { held: token, stored: current });
        }
        let wait = jitter(backoff, 0.2);
        tracing::warn!(account = %ctx.fence.account, error = %error_chain(&e), retry_in = ?wait, "could not record the claim in storage; nothing is synced until it is");
        ctx.status.lock().last_error = Some(error_chain(&e));
        tokio::select! {
            biased;
            () = ctx.control.changed.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        backoff = (backoff * 2).min(ctx.settings.poll_warm.max(ctx.settings.retry_base));
    }
}

/// One transient poll: connect, poll `scope`, disconnect.
async fn transient_poll(ctx: &Ctx, scope: Scope) -> Result<(), SourceError> {
    let mut conn = ctx.source.connect(&ctx.fence).await?;
    if ctx.deadline.passed() {
        return Err(SourceError::Io {
            account: ctx.fence.account.clone(),
            op: "poll".into(),
            source: "lease deadline passed before the poll".into(),
        });
    }
    let report = conn.poll(scope).await?;
    let mut status = ctx.status.lock();
    status.polls += 1;
    status.last_sync = Some(Instant::now());
    status.last_error = None;
    tracing::trace!(account = %ctx.fence.account, %scope, new = report.new_messages, "polled");
    Ok(())
}

/// Waits for the hot account's watch to end; never, when there is none.
async fn watch_ended(
    watch: &mut Option<Watch>,
) -> Result<Option<(FencingToken, FencingToken)>, tokio::task::JoinError> {
    match watch {
        Some(w) => (&mut w.0).await,
        None => std::future::pending().await,
    }
}

fn spawn_watch(ctx: &Ctx) -> Watch {
    let source = ctx.source.clone();
    let fence = ctx.fence.clone();
    let deadline = ctx.deadline.clone();
    let status = ctx.status.clone();
    let settings = ctx.settings.clone();
    AbortOnDrop(tokio::spawn(async move {
        let mut backoff = settings.retry_base;
        loop {
            let lease_ok = || !deadline.passed();
            if !lease_ok() {
                return None;
            }
            let err = match source.connect(&fence).await {
                Ok(mut conn) => 'conn: {
                    // Catch up with whatever arrived before the watch began.
                    let mut poll_inbox = true;
                    loop {
                        if poll_inbox {
                            if !lease_ok() {
                                return None;
                            }
                            match conn.poll(Scope::Inbox).await {
                                Ok(_) => {
                                    backoff = settings.retry_base;
                                    let mut s = status.lock();
                                    s.polls += 1;
                                    s.last_sync = Some(Instant::now());
                                    s.last_error = None;
                                }
                                Err(e) => break 'conn e,
                            }
                        }
                        // The hard deadline: keepalives inside the wait do not extend it.
                        match tokio::time::timeout(settings.idle_reissue, conn.wait_new_mail()).await {
                            Ok(Ok(())) => poll_inbox = true,
                            Ok(Err(e)) => break 'conn e,
                            Err(_) => poll_inbox = false, // re-issue the IDLE
                        }
                    }
                }
                Err(e) => e,
            };
            if let SourceError::Fenced { token, current, .. } = err {
                tracing::debug!(account = %fence.account, error = %err, "fenced; watch stopped");
                status.lock().last_error = Some(err.to_string());
                // The runner ends with it, so the coordinator learns the tokens.
                return Some((token, current));
            }
            let wait = jitter(if err.is_permanent() { settings.poll_warm } else { backoff }, 0.2);
            tracing::warn!(account = %fence.account, error = %error_chain(&err), retry_in = ?wait, "INBOX watch failed; reconnecting");
            status.lock().last_error = Some(error_chain(&err));
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(settings.poll_warm.max(settings.retry_base));
        }
    }))
}
