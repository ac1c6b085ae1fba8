//! Bounds on guessing and on sign-up, per client address.
//!
//! **Failed logins** slow down the pair of e-mail address and client
//! address that failed: after [`LoginBounds::free`] failures in a row, each
//! next attempt from that pair waits a delay that doubles with every further
//! failure, up to [`LoginBounds::max_delay`]. A pair is never locked out:
//! once the delay has passed it may try again. The right password from
//! another client address is never slowed by someone else's failures (a
//! lockout keyed by e-mail alone would let anyone lock any user out).
//! Besides, one client address may fail at most [`LoginBounds::per_client`]
//! times in each [`LoginBounds::window`], whichever addresses it tries.
//!
//! **Sign-ups** are bounded per client address and window
//! ([`SignupLimiter`]).
//!
//! Both are kept in this process's memory: behind several API processes, a
//! client that is spread over them gets each process's bound.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::errors::ApiError;

/// Entries kept before old ones are swept (bounds the maps' memory).
const SWEEP_ABOVE: usize = 10_000;

/// The failed-login bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginBounds {
    /// Failures of one (e-mail, client) pair in a row before any delay.
    pub free: u32,
    /// The first delay; each further failure doubles it.
    pub base_delay: Duration,
    /// The longest delay.
    pub max_delay: Duration,
    /// Failures allowed from one client address per window, over all e-mail addresses.
    pub per_client: u32,
    /// The window of `per_client`.
    pub window: Duration,
}

impl Default for LoginBounds {
    fn default() -> Self {
        Self {
            free: 3,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            per_client: 100,
            window: Duration::from_secs(300),
        }
    }
}

/// One (e-mail, client) pair's failures in a row.
#[derive(Debug, Clone, Copy)]
struct PairState {
    failures: u32,
    /// No attempt before this.
    not_before: Instant,
}

/// Failed-login counting ([module docs](self)).
#[derive(Debug)]
pub struct LoginLimiter {
    bounds: LoginBounds,
    pairs: Mutex<HashMap<(String, Option<IpAddr>), PairState>>,
    clients: FixedWindows<IpAddr>,
}

/// Events per key in fixed windows: each key's window starts at its first
/// event and lasts `window`; the next event after it starts a new one.
#[derive(Debug)]
struct FixedWindows<K> {
    window: Duration,
    counts: Mutex<HashMap<K, (Instant, u32)>>,
}

impl<K: std::hash::Hash + Eq> FixedWindows<K> {
    fn new(window: Duration) -> Self {
        Self { window, counts: Mutex::new(HashMap::new()) }
    }

    /// When `key`'s current window ends, if it has `limit` events already.
    fn full(&self, key: &K, limit: u32, now: Instant) -> Option<Instant> {
        let counts = self.counts.lock();
        let &(start, n) = counts.get(key)?;
        (n >= limit && now.duration_since(start) < self.window).then_some(start + self.window)
    }

    /// Counts one event of `key`, unless its window is full (then, when it ends).
    fn add(&self, key: K, limit: u32, now: Instant) -> Result<(), Instant> {
        let mut counts = self.counts.lock();
        if counts.len() > SWEEP_ABOVE {
            counts.retain(|_, (start, _)| now.duration_since(*start) < self.window);
        }
        let entry = counts.entry(key).or_insert((now, 0));
        if now.duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        if entry.1 >= limit {
            return Err(entry.0 + self.window);
        }
        entry.1 += 1;
        Ok(())
    }
}

const FAILED_LOGINS: &str = "too many failed logins of this address from this client";
const CLIENT_FAILURES: &str = "too many failed logins from this client";
const SIGNUPS: &str = "too many sign-ups from this client";

/// 429 with the seconds to wait, at least 1.
fn wait(what: &'static str, until: Instant, now: Instant) -> ApiError {
    let secs = until.saturating_duration_since(now).as_secs_f64().ceil() as u64;
    ApiError::RateLimited { what, retry_after_s: secs.max(1) }
}

impl LoginLimiter {
    /// A limiter with these bounds.
    pub fn new(bounds: LoginBounds) -> Self {
        Self { bounds, pairs: Mutex::new(HashMap::new()), clients: FixedWindows::new(bounds.window) }
    }

    /// `Err` (429, with the wait) while the pair must wait, or the client
    /// has used its failures of the window.
    pub fn check(&self, email: &str, client: Option<IpAddr>) -> Result<(), ApiError> {
        let now = Instant::now();
        if let Some(p) = self.pairs.lock().get(&(email.to_string(), client)) {
            if p.not_before > now {
                return Err(wait(FAILED_LOGINS, p.not_before, now));
            }
        }
        if let Some(end) = client.and_then(|ip| self.clients.full(&ip, self.bounds.per_client, now)) {
            return Err(wait(CLIENT_FAILURES, end, now));
        }
        Ok(())
    }

    /// Counts one failure of the pair (and of the client).
    pub fn failed(&self, email: &str, client: Option<IpAddr>) {
        let now = Instant::now();
        let b = self.bounds;
        {
            let mut pairs = self.pairs.lock();
            if pairs.len() > SWEEP_ABOVE {
                // A pair whose delay ended long ago starts afresh anyway.
                pairs.retain(|_, p| now.saturating_duration_since(p.not_before) < b.max_delay.max(b.window));
            }
            let p = pairs.entry((email.to_string(), client)).or_insert(PairState { failures: 0, not_before: now });
            p.failures = p.failures.saturating_add(1);
            if p.failures > b.free {
                let doublings = (p.failures - b.free - 1).min(20);
                p.not_before = now + b.base_delay.saturating_mul(1 << doublings).min(b.max_delay);
            }
        }
        if let Some(ip) = client {
            // A failure past the bound is one `check` refuses already.
            let _ = self.clients.add(ip, u32::MAX, now);
        }
    }

    /// Forgets the pair's failures after a good login.
    pub fn succeeded(&self, email: &str, client: Option<IpAddr>) {
        self.pairs.lock().remove(&(email.to_string(), client));
    }
}

/// Sign-ups per client address in fixed windows.
#[derive(Debug)]
pub struct SignupLimiter {
    per_client: u32,
    clients: FixedWindows<Option<IpAddr>>,
}

impl SignupLimiter {
    /// At most `per_client` sign-ups per client address per `window`.
    pub fn new(per_client: u32, window: Duration) -> Self {
        Self { per_client, clients: FixedWindows::new(window) }
    }

    /// Counts one sign-up attempt of `client`; `Err` (429) over the bound.
    pub fn attempt(&self, client: Option<IpAddr>) -> Result<(), ApiError> {
        let now = Instant::now();
        self.clients.add(client, self.per_client, now).map_err(|end| wait(SIGNUPS, end, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> LoginBounds {
        LoginBounds {
            free: 2,
            base_delay: Duration::from_secs(10),
            max_delay: Duration::from_secs(40),
            per_client: 5,
            window: Duration::from_secs(60),
        }
    }

    fn retry_after(r: Result<(), ApiError>) -> Option<u64> {
        match r {
            Ok(()) => None,
            Err(ApiError::RateLimited { retry_after_s, .. }) => Some(retry_after_s),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_pair_waits_longer_after_each_failure_past_the_free_ones() {
        let l = LoginLimiter::new(LoginBounds { per_client: 100, ..bounds() });
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        l.failed("a@b", Some(ip));
        l.failed("a@b", Some(ip));
        assert_eq!(retry_after(l.check("a@b", Some(ip))), None, "two free failures");
        l.failed("a@b", Some(ip));
        assert_eq!(retry_after(l.check("a@b", Some(ip))), Some(10));
        l.failed("a@b", Some(ip));
        assert_eq!(retry_after(l.check("a@b", Some(ip))), Some(20));
        l.failed("a@b", Some(ip));
        assert_eq!(retry_after(l.check("a@b", Some(ip))), Some(40), "capped");
        l.succeeded("a@b", Some(ip));
        assert_eq!(retry_after(l.check("a@b", Some(ip))), None);
    }

    #[test]
    fn another_client_is_never_slowed_by_a_pairs_failures() {
        let l = LoginLimiter::new(bounds());
        let attacker: IpAddr = "192.0.2.1".parse().unwrap();
        let owner: IpAddr = "198.51.100.7".parse().unwrap();
        for _ in 0..5 {
            l.failed("a@b", Some(attacker));
        }
        assert!(retry_after(l.check("a@b", Some(attacker))).is_some());
        assert_eq!(retry_after(l.check("a@b", Some(owner))), None, "the owner's address");
        assert_eq!(retry_after(l.check("a@b", None)), None);
    }

    #[test]
    fn a_client_is_bounded_over_all_addresses() {
        let l = LoginLimiter::new(bounds());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for i in 0..5 {
            l.failed(&format!("user{i}@b"), Some(ip));
        }
        assert_eq!(retry_after(l.check("fresh@b", Some(ip))), Some(60));
        assert_eq!(retry_after(l.check("fresh@b", Some("192.0.2.2".parse().unwrap()))), None);
    }

    #[test]
    fn sign_ups_are_bounded_per_client() {
        let l = SignupLimiter::new(2, Duration::from_secs(60));
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(l.attempt(Some(ip)).is_ok());
        assert!(l.attempt(Some(ip)).is_ok());
        assert_eq!(retry_after(l.attempt(Some(ip))), Some(60));
        assert!(l.attempt(Some("192.0.2.2".parse().unwrap())).is_ok());
    }
}
