//! What every handler shares: the API's settings (`LISTEN`, `SIGNUP`,
//! `SESSION_TTL`, `BODY_CACHE_MB`, `HTTP_HEADER_TIMEOUT`, `SIGNUPS_PER_HOUR`,
//! `ACCOUNTS_PER_USER`, `WS_PER_USER`, presence and the failed-login bounds) and its state (the
//! storage, the lease store, the bus), and the presence refresh a login or
//! a WebSocket ping makes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::duration::{parse_duration, PlainUnit};
use leasehold_core::{LeaseKey, UserId};

use super::errors::{imap_failure, ApiError};
use super::limiter::{LoginBounds, LoginLimiter, SignupLimiter};
use super::sockets::SocketCounts;
use crate::config::Config;
use crate::coordinator::CoordinatorObserver;
use crate::errors::ConfigError;
use crate::events::EventBus;
use crate::imap::remote::Remote;
use crate::imap::ImapSettings;
use crate::storage::Storage;

/// The default `LISTEN`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The API's settings.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// `LISTEN`: where to serve.
    pub listen: SocketAddr,
    /// `SIGNUP`: whether `POST /v1/users` is open.
    pub signup_open: bool,
    /// `SESSION_TTL`: how long a login's token lasts.
    pub session_ttl: Duration,
    /// `TIER_SESSION_GRACE_MIN`: how long a login or ping keeps the user present.
    pub presence_grace: Duration,
    /// The IMAP timeouts and address rules of the login check.
    pub imap: ImapSettings,
    /// The failed-login slowdown ([`LoginBounds`]).
    pub login: LoginBounds,
    /// `SIGNUPS_PER_HOUR`: sign-ups per client address per hour.
    pub signups_per_hour: u32,
    /// `ACCOUNTS_PER_USER`: accounts one user may add through the API.
    pub accounts_per_user: u32,
    /// `BODY_CACHE_MB`: the bytes of whole messages read from IMAP kept in
    /// SQL per account (0: none).
    pub body_cache_bytes: u64,
    /// Messages of at least this many bytes (their stored RFC822.SIZE)
    /// stream an attachment from the server; smaller ones read the whole
    /// message and take the part from it, as mail-parser reads broken MIME
    /// exactly only on a whole message ([`DEFAULT_STREAM_FROM`]).
    pub stream_from_bytes: u64,
    /// `HTTP_HEADER_TIMEOUT`: how long a connection may take to send a
    /// request head, and may sit idle between requests.
    pub header_timeout: Duration,
    /// `WS_PER_USER`: open WebSockets per user in one API process.
    pub ws_per_user: usize,
}

/// The default [`ApiSettings::stream_from_bytes`]: 1 MiB, a whole message
/// read for a part then costs a few MiB at most.
pub const DEFAULT_STREAM_FROM: u64 = 1 << 20;

/// The default `BODY_CACHE_MB`.
pub const DEFAULT_BODY_CACHE_MB: u64 = 25;

impl ApiSettings {
    /// The defaults, with presence and IMAP timeouts from `config`.
    pub fn new(config: &Config) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            signup_open: true,
            session_ttl: Duration::from_secs(24 * 3600),
            presence_grace: config.tier_session_grace,
            // Anyone who signs up adds accounts here: only public
            // addresses, unless the operator says otherwise.
            imap: ImapSettings { allow_private: config.imap_allow_private, ..ImapSettings::from(config) },
            login: LoginBounds::default(),
            signups_per_hour: 20,
            accounts_per_user: 50,
            body_cache_bytes: DEFAULT_BODY_CACHE_MB << 20,
            stream_from_bytes: DEFAULT_STREAM_FROM,
            header_timeout: Duration::from_secs(10),
            ws_per_user: 16,
        }
    }

    /// [`ApiSettings::new`] with `LISTEN`, `SIGNUP` and `SESSION_TTL` read through `lookup`.
    pub fn from_lookup(config: &Config, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut s = Self::new(config);
        let var = |name| lookup(name).filter(|v: &String| !v.trim().is_empty());
        if let Some(v) = var("LISTEN") {
            s.listen = v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "LISTEN",
                value: v.clone(),
                expected: "an address and port such as 127.0.0.1:8080 or [::]:8080".into(),
            })?;
        }
        if let Some(v) = var("SIGNUP") {
            s.signup_open = match v.trim() {
                "open" => true,
                "closed" => false,
                _ => {
                    return Err(ConfigError::Invalid { var: "SIGNUP", value: v, expected: "`open` or `closed`".into() })
                }
            };
        }
        if let Some(v) = var("BODY_CACHE_MB") {
            let mb: u64 = v.trim().parse().ok().filter(|mb| *mb <= 1 << 20).ok_or(ConfigError::Invalid {
                var: "BODY_CACHE_MB",
                value: v.clone(),
                expected: "whole megabytes per account, 0 to 1048576 (0 caches nothing)".into(),
            })?;
            s.body_cache_bytes = mb << 20;
        }
        if let Some(v) = var("SESSION_TTL") {
            s.session_ttl = parse_duration(&v, PlainUnit::Seconds).ok().filter(|d| d.as_millis() > 0).ok_or(
                ConfigError::Invalid { var: "SESSION_TTL", value: v, expected: "a duration such as 24h".into() },
            )?;
        }
        // A whole number in `range`, or the variable's error naming it.
        let count = |name: &'static str, range: std::ops::RangeInclusive<u64>, what: &str| match var(name) {
            None => Ok(None),
            Some(v) => {
                v.trim().parse::<u64>().ok().filter(|n| range.contains(n)).map(Some).ok_or(ConfigError::Invalid {
                    var: name,
                    value: v.clone(),
                    expected: format!("{what}, {} to {}", range.start(), range.end()),
                })
            }
        };
        let most = u64::from(u32::MAX);
        if let Some(n) = count("SIGNUPS_PER_HOUR", 1..=most, "sign-ups per client address per hour")? {
            s.signups_per_hour = n as u32;
        }
        if let Some(n) = count("ACCOUNTS_PER_USER", 1..=most, "accounts per user")? {
            s.accounts_per_user = n as u32;
        }
        if let Some(n) = count("WS_PER_USER", 1..=10_000, "open WebSockets per user")? {
            s.ws_per_user = n as usize;
        }
        if let Some(v) = var("HTTP_HEADER_TIMEOUT") {
            s.header_timeout = parse_duration(&v, PlainUnit::Seconds).ok().filter(|d| d.as_millis() > 0).ok_or(
                ConfigError::Invalid {
                    var: "HTTP_HEADER_TIMEOUT",
                    value: v,
                    expected: "a duration such as 10s".into(),
                },
            )?;
        }
        Ok(s)
    }

    /// [`ApiSettings::from_lookup`] on the process environment.
    pub fn from_env(config: &Config) -> Result<Self, ConfigError> {
        Self::from_lookup(config, |k| std::env::var(k).ok())
    }
}

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    /// The database.
    pub storage: Storage,
    /// Leases, bucket leases, tiers and presence.
    pub store: Arc<dyn crate::leases::Leases>,
    /// Where the engine's writes are announced.
    pub bus: EventBus,
    /// The settings.
    pub settings: Arc<ApiSettings>,
    /// Failed-login bounds.
    pub limiter: Arc<LoginLimiter>,
    /// Sign-up bounds.
    pub signups: Arc<SignupLimiter>,
    /// Open WebSockets per user.
    pub sockets: Arc<SocketCounts>,
    /// The worker this process runs, whose accounts `/metrics` shows.
    pub worker: Option<CoordinatorObserver>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("storage", &self.storage)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ApiState {
    /// The state of an API on these parts.
    pub fn new(storage: Storage, store: Arc<dyn crate::leases::Leases>, bus: EventBus, settings: ApiSettings) -> Self {
        // Counted from the first request on (a recorder installed at the
        // first scrape would have missed everything before it).
        crate::metrics::handle();
        let limiter = LoginLimiter::new(settings.login);
        let signups = Arc::new(SignupLimiter::new(settings.signups_per_hour, Duration::from_secs(3600)));
        let sockets = Arc::new(SocketCounts::default());
        Self {
            storage,
            store,
            bus,
            settings: Arc::new(settings),
            limiter: Arc::new(limiter),
            signups,
            sockets,
            worker: None,
        }
    }

    /// This state, with the worker that runs in the same process (`serve`).
    pub fn with_worker(mut self, worker: CoordinatorObserver) -> Self {
        self.worker = Some(worker);
        self
    }

    /// A transient IMAP connection of account `id`'s, logged in with its
    /// stored credentials (the API's reads, actions and body searches).
    pub async fn remote(&self, id: &str) -> Result<Remote, ApiError> {
        let account = LeaseKey::new(id).map_err(|e| ApiError::internal(format!("read account id {id}"), e))?;
        let creds = self.storage.credentials(&account).await?;
        Remote::open(&creds, &self.settings.imap).await.map_err(|e| imap_failure(id, &e))
    }

    /// Refreshes `user`'s presence and publishes `user.active`.
    pub async fn present(&self, user: &UserId) -> Result<(), ApiError> {
        // The store takes a TTL that cannot be zero (`Ttl`).
        #[allow(clippy::useless_conversion)]
        let grace = self
            .settings
            .presence_grace
            .try_into()
            .map_err(|e| ApiError::internal("check the presence grace (TIER_SESSION_GRACE_MIN)", e))?;
        self.store
            .mark_user_active(user, grace)
            .await
            .map_err(|e| ApiError::internal(format!("refresh the presence of user {user}"), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<ApiSettings, ConfigError> {
        ApiSettings::from_lookup(&Config::default(), |k| {
            pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_abuse_bounds_are_read_and_checked() {
        let s = settings(&[
            ("SIGNUPS_PER_HOUR", "5"),
            ("ACCOUNTS_PER_USER", "7"),
            ("WS_PER_USER", "3"),
            ("HTTP_HEADER_TIMEOUT", "3s"),
        ])
        .unwrap();
        assert_eq!((s.signups_per_hour, s.accounts_per_user, s.ws_per_user), (5, 7, 3));
        assert_eq!(s.header_timeout, Duration::from_secs(3));
        for (var, bad) in
            [("WS_PER_USER", "0"), ("WS_PER_USER", "20000"), ("ACCOUNTS_PER_USER", "x"), ("HTTP_HEADER_TIMEOUT", "0")]
        {
            match settings(&[(var, bad)]) {
                Err(ConfigError::Invalid { var: named, .. }) => assert_eq!(named, var),
                other => panic!("{var}={bad}: {other:?}"),
            }
        }
    }
}
