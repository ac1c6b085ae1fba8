//! Configuration from the environment, validated once at start.
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `POLL_WARM` | transient poll interval of warm accounts, and the secondary (special folder) poll of hot ones | `60s` |
//! | `POLL_COLD` | transient poll interval of cold accounts | `900s` |
//! | `TIER_EVAL_INTERVAL` | how often owned accounts are re-tiered | `120s` |
//! | `TIER_HOT_ACTIVITY_H` | an account whose newest mail is younger than this is hot (hours) | `2` |
//! | `TIER_COLD_AFTER_H` | an account with no session and no mail younger than this is cold (hours); must exceed `TIER_HOT_ACTIVITY_H` | `168` (7 days) |
//! | `TIER_SESSION_GRACE_MIN` | how long a user's presence lasts after their last ping (minutes) | `15` |
//! | `HOT_BUDGET_PER_WORKER` | most hot accounts one worker keeps; beyond it the least recently active session-less hot accounts are demoted to warm | `500` |
//! | `LEASE_TTL` | lease and worker-registration time-to-live; leases are renewed every third of it | `30s` |
//! | `IDLE_REISSUE` | a hot account's INBOX watch (IMAP IDLE) is re-issued after this, whatever keepalives the server sends; must stay under 29 minutes | `25m` |
//! | `RECONCILE_INTERVAL` | how often the live set is reconciled with the accounts table (`accounts` ownership), or each owned bucket's accounts are read again and a slice of the buckets' weights recounted (`buckets` ownership) | `30s` |
//! | `OWNERSHIP` | `accounts`: a lease per account, balanced by count; `buckets`: accounts hash into lease buckets shared by weight, so a worker's per-tick cost follows what it owns, not the number of accounts (see `coordinator/buckets.rs`) | `accounts` |
//! | `REDIS_URL` | the Redis backend (`redis://...`); absent: the in-memory backend (one process) | absent |
//! | `REDIS_KEY_PREFIX` | prefix of every Redis key | `leasehold` |
//! | `WORKER_ID` | this worker's id | `<hostname>-<pid>-<random>` |
//! | `IMAP_CA_FILE` | a PEM file of CA certificates trusted for IMAP TLS besides the system's roots (which honour `SSL_CERT_FILE` and `SSL_CERT_DIR`); checked at start | absent |
//! | `IMAP_ALLOW_PLAIN` | `true`: accounts with `plain` security may point at any address, not only loopback ones | `false` |
//! | `IMAP_ALLOW_PRIVATE` | `true`: accounts and webhooks added through the API may point at loopback, link-local, private and other non-public addresses (the operator CLI always may) | `false` |
//! | `IMAP_LOGIN_BACKOFF`, `IMAP_LOGIN_BACKOFF_MAX` | the wait after an account's login is refused, doubling after each refusal in a row up to the max (kept in the database: restarts and takeovers wait too) | `5m`, `6h` |
//! | `IMAP_LOGIN_ATTEMPTS` | refused logins in a row after which an account tries no more until its login is updated (`account update`, `PATCH /v1/accounts/{id}`) | `8` |
//! | `CONNECT_RATE` | new IMAP connections a second, per process, each start a little later at random: a takeover of many accounts, or their reconnects after an outage, ramps up | `20` |
//! | `IMAP_CONNECTS_PER_HOST` | connection attempts (connect, TLS, greeting, login) at once to one IMAP server host, per process; more wait their turn | `8` |
//! | `WEBHOOK_RETRIES` | attempts of one webhook delivery after the first; then it fails and its webhook is paused | `10` |
//! | `WEBHOOK_BACKOFF`, `WEBHOOK_BACKOFF_MAX` | the wait before a delivery's first retry, doubling each time up to the max | `5s`, `1h` |
//! | `WEBHOOK_TIMEOUT` | how long one webhook POST may take | `10s` |
//! | `WEBHOOK_RECLAIM_AFTER` | a delivery whose worker stopped heartbeating for this long is taken over by another | `60s` |
//! | `WEBHOOK_CONCURRENCY` | webhook POSTs one worker has open at once | `16` |
//!
//! Durations in seconds accept a plain number (`60`, `1.5`) or a suffix
//! (`500ms`, `60s`, `2m`, `1h 30m`: humantime's syntax, as hopper's options); the `_H` and `_MIN` variables take a plain
//! number of hours or minutes (or a suffixed duration).
//!
//! **The cold window.** `TIER_COLD_AFTER_H` (7 days by default) is the choice
//! made for the "longer window": an account that nobody has looked at
//! and that received nothing for a week is polled at `POLL_COLD`; anything in
//! between the hot window and the cold window stays warm.

use std::time::Duration;

use leasehold_core::backend_url::redact_url;
use leasehold_core::backend_url::{is_redis_url, REDIS_SCHEMES_HELP};
use leasehold_core::duration::{parse_duration, DurationError, PlainUnit};
use leasehold_core::ids::is_key_safe_char;
use leasehold_core::{Ttl, WorkerId};

use crate::errors::ConfigError;
use crate::imap::tls::CaFile;

/// Reads a `true` / `false` setting (also `1` / `0`, `yes` / `no`).
fn read_bool(var: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(ConfigError::Invalid { var, value: value.to_string(), expected: "true or false".into() }),
    }
}

/// The sync-worker's settings. Build with [`Config::from_env`] (or
/// [`Config::from_lookup`]) or start from [`Config::default`] and change fields;
/// [`Config::validate`] checks them.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `POLL_WARM`.
    pub poll_warm: Duration,
    /// `POLL_COLD`.
    pub poll_cold: Duration,
    /// `TIER_EVAL_INTERVAL`.
    pub tier_eval_interval: Duration,
    /// `TIER_HOT_ACTIVITY_H`.
    pub tier_hot_activity: Duration,
    /// `TIER_COLD_AFTER_H`.
    pub tier_cold_after: Duration,
    /// `TIER_SESSION_GRACE_MIN`.
    pub tier_session_grace: Duration,
    /// `HOT_BUDGET_PER_WORKER`.
    pub hot_budget_per_worker: usize,
    /// `LEASE_TTL`.
    pub lease_ttl: Duration,
    /// `IDLE_REISSUE`.
    pub idle_reissue: Duration,
    /// `RECONCILE_INTERVAL`.
    pub reconcile_interval: Duration,
    /// `OWNERSHIP`.
    pub ownership: Ownership,
    /// `REDIS_URL`; `None` selects the in-memory backend.
    pub redis_url: Option<String>,
    /// `REDIS_KEY_PREFIX`; empty means the backend's default (`leasehold`).
    pub redis_key_prefix: String,
    /// `WORKER_ID`; `None` generates one.
    pub worker_id: Option<WorkerId>,
    /// `IMAP_CA_FILE`, read at start.
    pub imap_ca_file: Option<CaFile>,
    /// `IMAP_ALLOW_PLAIN`.
    pub imap_allow_plain: bool,
    /// `IMAP_ALLOW_PRIVATE`.
    pub imap_allow_private: bool,
    /// `IMAP_MAX_FOLDERS`: most folders synced per account (default 1000).
    pub imap_max_folders: usize,
    /// `IMAP_LOGIN_BACKOFF`, `IMAP_LOGIN_BACKOFF_MAX`, `IMAP_LOGIN_ATTEMPTS`.
    pub imap_login_backoff: crate::imap::settings::LoginBackoff,
    /// `IMAP_CONNECTS_PER_HOST`.
    pub imap_connects_per_host: std::num::NonZeroUsize,
    /// `CONNECT_RATE`.
    pub connect_rate: std::num::NonZeroU32,
    /// `WEBHOOK_*`: how webhook deliveries are retried and bounded.
    pub webhooks: crate::webhooks::WebhookSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            poll_warm: Duration::from_secs(60),
            poll_cold: Duration::from_secs(900),
            tier_eval_interval: Duration::from_secs(120),
            tier_hot_activity: Duration::from_secs(2 * 3600),
            tier_cold_after: Duration::from_secs(168 * 3600),
            tier_session_grace: Duration::from_secs(15 * 60),
            hot_budget_per_worker: 500,
            lease_ttl: Duration::from_secs(30),
            idle_reissue: Duration::from_secs(25 * 60),
            reconcile_interval: Duration::from_secs(30),
            ownership: Ownership::Accounts,
            redis_url: None,
            redis_key_prefix: String::new(),
            worker_id: None,
            imap_ca_file: None,
            imap_allow_plain: false,
            imap_allow_private: false,
            imap_max_folders: 1_000,
            imap_login_backoff: crate::imap::settings::LoginBackoff::default(),
            imap_connects_per_host: std::num::NonZeroUsize::new(crate::imap::connect_gate::DEFAULT_CONNECTS_PER_HOST)
                .unwrap_or(std::num::NonZeroUsize::MIN),
            connect_rate: std::num::NonZeroU32::new(crate::imap::connect_rate::DEFAULT_CONNECT_RATE)
                .unwrap_or(std::num::NonZeroU32::MIN),
            webhooks: crate::webhooks::WebhookSettings::default(),
        }
    }
}

/// How workers share the accounts (`OWNERSHIP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// A lease per account; each tick reads the live set and the live workers.
    Accounts,
    /// Lease buckets shared by weight ([`leasehold_core::BucketLeases`]).
    Buckets,
}

/// The longest an IMAP IDLE may run before servers drop it (RFC 2177: 29 minutes).
pub const IDLE_LIMIT: Duration = Duration::from_secs(29 * 60);

/// Reads one duration setting (see [`parse_duration`] for the syntax).
fn read_duration(var: &'static str, value: &str, unit: PlainUnit) -> Result<Duration, ConfigError> {
    parse_duration(value, unit).map_err(|e| match e {
        DurationError::Zero { value, .. } => ConfigError::Zero { var, value },
        other => ConfigError::Invalid { var, value: value.to_string(), expected: other.to_string() },
    })
}

impl Config {
    /// Reads the process environment (see the module docs) and validates it.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    /// Reads settings through `lookup` (a variable name to its value, `None`
    /// when unset; empty values count as unset, except an empty `REDIS_URL`,
    /// which is an error) and validates them.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());
        let mut c = Config::default();
        let dur = |var: &'static str, unit: PlainUnit, slot: &mut Duration| -> Result<(), ConfigError> {
            if let Some(v) = get(var) {
                *slot = read_duration(var, &v, unit)?;
            }
            Ok(())
        };
        dur("POLL_WARM", PlainUnit::Seconds, &mut c.poll_warm)?;
        dur("POLL_COLD", PlainUnit::Seconds, &mut c.poll_cold)?;
        dur("TIER_EVAL_INTERVAL", PlainUnit::Seconds, &mut c.tier_eval_interval)?;
        dur("TIER_HOT_ACTIVITY_H", PlainUnit::Hours, &mut c.tier_hot_activity)?;
        dur("TIER_COLD_AFTER_H", PlainUnit::Hours, &mut c.tier_cold_after)?;
        dur("TIER_SESSION_GRACE_MIN", PlainUnit::Minutes, &mut c.tier_session_grace)?;
        dur("LEASE_TTL", PlainUnit::Seconds, &mut c.lease_ttl)?;
        dur("IDLE_REISSUE", PlainUnit::Seconds, &mut c.idle_reissue)?;
        dur("RECONCILE_INTERVAL", PlainUnit::Seconds, &mut c.reconcile_interval)?;
        if let Some(v) = get("HOT_BUDGET_PER_WORKER") {
            c.hot_budget_per_worker = v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "HOT_BUDGET_PER_WORKER",
                value: v.clone(),
                expected: "a whole number of accounts, 0 or more (e.g. 500)".into(),
            })?;
        }
        // Set but empty is a mistake (a CI secret that did not expand), not
        // a request for one process's private memory backend.
        if lookup("REDIS_URL").is_some_and(|v| v.trim().is_empty()) {
            return Err(ConfigError::Invalid {
                var: "REDIS_URL",
                value: String::new(),
                expected: "a redis:// URL: it is set but empty (unset it to use the in-memory backend)".into(),
            });
        }
        if let Some(v) = get("REDIS_URL") {
            let v = v.trim().to_string();
            if !is_redis_url(&v) {
                return Err(ConfigError::Invalid {
                    var: "REDIS_URL",
                    value: redact_url(&v),
                    expected: format!("{REDIS_SCHEMES_HELP} (unset it to use the in-memory backend)"),
                });
            }
            c.redis_url = Some(v);
        }
        if let Some(v) = get("REDIS_KEY_PREFIX") {
            if !v.chars().all(is_key_safe_char) {
                return Err(ConfigError::Invalid {
                    var: "REDIS_KEY_PREFIX",
                    value: v,
                    expected: "a prefix without whitespace, control characters or braces (e.g. leasehold)".into(),
                });
            }
            c.redis_key_prefix = v;
        }
        if let Some(v) = get("WORKER_ID") {
            c.worker_id = Some(WorkerId::new(v.trim()).map_err(|e| ConfigError::Invalid {
                var: "WORKER_ID",
                value: v.clone(),
                expected: e.to_string(),
            })?);
        }
        if let Some(v) = get("IMAP_CA_FILE") {
            c.imap_ca_file = Some(CaFile::load(std::path::Path::new(v.trim())).map_err(ConfigError::CaFile)?);
        }
        if let Some(v) = get("IMAP_ALLOW_PLAIN") {
            c.imap_allow_plain = read_bool("IMAP_ALLOW_PLAIN", &v)?;
        }
        if let Some(v) = get("IMAP_ALLOW_PRIVATE") {
            c.imap_allow_private = read_bool("IMAP_ALLOW_PRIVATE", &v)?;
        }
        if let Some(v) = get("IMAP_MAX_FOLDERS") {
            c.imap_max_folders = match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(ConfigError::Invalid {
                        var: "IMAP_MAX_FOLDERS",
                        value: v.clone(),
                        expected: "a whole number of folders, at least 1".into(),
                    })
                }
            };
        }
        dur("IMAP_LOGIN_BACKOFF", PlainUnit::Seconds, &mut c.imap_login_backoff.first)?;
        dur("IMAP_LOGIN_BACKOFF_MAX", PlainUnit::Seconds, &mut c.imap_login_backoff.max)?;
        if let Some(v) = get("IMAP_LOGIN_ATTEMPTS") {
            c.imap_login_backoff.attempts = v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "IMAP_LOGIN_ATTEMPTS",
                value: v.clone(),
                expected: "a whole number of refused logins, at least 1 (e.g. 8)".into(),
            })?;
        }
        if let Some(v) = get("OWNERSHIP") {
            c.ownership = match v.trim() {
                "accounts" => Ownership::Accounts,
                "buckets" => Ownership::Buckets,
                _ => {
                    return Err(ConfigError::Invalid {
                        var: "OWNERSHIP",
                        value: v.clone(),
                        expected: "accounts or buckets".into(),
                    })
                }
            };
        }
        if let Some(v) = get("CONNECT_RATE") {
            c.connect_rate = v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "CONNECT_RATE",
                value: v.clone(),
                expected: "a whole number of new connections a second, at least 1 (e.g. 20)".into(),
            })?;
        }
        if let Some(v) = get("IMAP_CONNECTS_PER_HOST") {
            c.imap_connects_per_host = v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: "IMAP_CONNECTS_PER_HOST",
                value: v.clone(),
                expected: "a whole number of connection attempts, at least 1 (e.g. 8)".into(),
            })?;
        }
        c.webhooks.read(get)?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (var, d) in [
            ("POLL_WARM", self.poll_warm),
            ("POLL_COLD", self.poll_cold),
            ("TIER_EVAL_INTERVAL", self.tier_eval_interval),
            ("TIER_HOT_ACTIVITY_H", self.tier_hot_activity),
            ("TIER_COLD_AFTER_H", self.tier_cold_after),
            ("TIER_SESSION_GRACE_MIN", self.tier_session_grace),
            ("IDLE_REISSUE", self.idle_reissue),
            ("RECONCILE_INTERVAL", self.reconcile_interval),
            ("IMAP_LOGIN_BACKOFF", self.imap_login_backoff.first),
            ("IMAP_LOGIN_BACKOFF_MAX", self.imap_login_backoff.max),
        ] {
            if d.as_millis() == 0 {
                return Err(ConfigError::Zero { var, value: d });
            }
        }
        if self.lease_ttl < Duration::from_millis(30) {
            return Err(ConfigError::Invalid {
                var: "LEASE_TTL",
                value: format!("{:?}", self.lease_ttl),
                expected: "at least 30ms (leases are renewed every third of it; 30s is usual)".into(),
            });
        }
        if self.poll_cold < self.poll_warm {
            return Err(ConfigError::Inconsistent {
                detail: format!(
                    "POLL_COLD ({:?}) is shorter than POLL_WARM ({:?}): cold accounts must not be polled more often than warm ones",
                    self.poll_cold, self.poll_warm
                ),
            });
        }
        if self.tier_cold_after <= self.tier_hot_activity {
            return Err(ConfigError::Inconsistent {
                detail: format!(
                    "TIER_COLD_AFTER_H ({:?}) must be longer than TIER_HOT_ACTIVITY_H ({:?}): an account goes cold only after a longer quiet time than the one that keeps it hot",
                    self.tier_cold_after, self.tier_hot_activity
                ),
            });
        }
        if self.idle_reissue >= IDLE_LIMIT {
            return Err(ConfigError::Inconsistent {
                detail: format!(
                    "IDLE_REISSUE ({:?}) must stay under 29 minutes: servers may drop an IDLE that runs longer",
                    self.idle_reissue
                ),
            });
        }
        Ok(())
    }

    /// The lease TTL as the stores take it (never zero).
    pub fn checked_lease_ttl(&self) -> Result<Ttl, ConfigError> {
        Ttl::new("LEASE_TTL", self.lease_ttl).map_err(|_| ConfigError::Zero { var: "LEASE_TTL", value: self.lease_ttl })
    }

    /// How often leases are renewed (and the worker re-registered): a third of the TTL.
    pub fn renew_interval(&self) -> Duration {
        self.lease_ttl / 3
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_valid_and_absent_redis_means_memory() {
        let c = from(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert!(c.redis_url.is_none());
        assert_eq!(c.renew_interval(), Duration::from_secs(10));
    }

    #[test]
    fn parses_units() {
        let c = from(&[
            ("POLL_WARM", "1.5"),
            ("POLL_COLD", "10m"),
            ("TIER_HOT_ACTIVITY_H", "0.5"),
            ("TIER_SESSION_GRACE_MIN", "5"),
            ("LEASE_TTL", "1500ms"),
            ("HOT_BUDGET_PER_WORKER", "7"),
            ("REDIS_URL", "redis://127.0.0.1:6379/0"),
            ("WORKER_ID", "w-1"),
        ])
        .unwrap();
        assert_eq!(c.poll_warm, Duration::from_millis(1500));
        assert_eq!(c.poll_cold, Duration::from_secs(600));
        assert_eq!(c.tier_hot_activity, Duration::from_secs(1800));
        assert_eq!(c.tier_session_grace, Duration::from_secs(300));
        assert_eq!(c.lease_ttl, Duration::from_millis(1500));
        assert_eq!(c.hot_budget_per_worker, 7);
        assert_eq!(c.redis_url.as_deref(), Some("redis://127.0.0.1:6379/0"));
        assert_eq!(c.worker_id.unwrap().as_str(), "w-1");
    }

    #[test]
    fn errors_name_the_variable_and_the_fix() {
        let e = from(&[("POLL_WARM", "soon")]).unwrap_err().to_string();
        assert!(e.contains("POLL_WARM") && e.contains("soon") && e.contains("number"), "{e}");
        let e = from(&[("LEASE_TTL", "0")]).unwrap_err().to_string();
        assert!(e.contains("LEASE_TTL") && e.contains("greater than zero"), "{e}");
        let e = from(&[("POLL_WARM", "600"), ("POLL_COLD", "60")]).unwrap_err().to_string();
        assert!(e.contains("POLL_COLD") && e.contains("POLL_WARM"), "{e}");
        let e = from(&[("TIER_COLD_AFTER_H", "1"), ("TIER_HOT_ACTIVITY_H", "2")]).unwrap_err().to_string();
        assert!(e.contains("TIER_COLD_AFTER_H"), "{e}");
        let e = from(&[("HOT_BUDGET_PER_WORKER", "-1")]).unwrap_err().to_string();
        assert!(e.contains("HOT_BUDGET_PER_WORKER"), "{e}");
        let e = from(&[("REDIS_URL", "http://user:secret@x")]).unwrap_err().to_string();
        assert!(e.contains("REDIS_URL") && !e.contains("secret"), "{e}");
        let e = from(&[("REDIS_URL", " ")]).unwrap_err().to_string();
        assert!(e.contains("REDIS_URL") && e.contains("set but empty"), "{e}");
        let e = from(&[("IDLE_REISSUE", "30m")]).unwrap_err().to_string();
        assert!(e.contains("29 minutes"), "{e}");
        let e = from(&[("WORKER_ID", "a b")]).unwrap_err().to_string();
        assert!(e.contains("WORKER_ID"), "{e}");
        let e = from(&[("IMAP_LOGIN_ATTEMPTS", "0")]).unwrap_err().to_string();
        assert!(e.contains("IMAP_LOGIN_ATTEMPTS") && e.contains("at least 1"), "{e}");
        let e = from(&[("IMAP_LOGIN_BACKOFF", "0s")]).unwrap_err().to_string();
        assert!(e.contains("IMAP_LOGIN_BACKOFF"), "{e}");
        let e = from(&[("IMAP_CONNECTS_PER_HOST", "0")]).unwrap_err().to_string();
        assert!(e.contains("IMAP_CONNECTS_PER_HOST") && e.contains("at least 1"), "{e}");
    }

    #[test]
    fn connects_per_host_reach_the_engine() {
        let c = from(&[("IMAP_CONNECTS_PER_HOST", "3")]).unwrap();
        assert_eq!(crate::imap::settings::ImapSettings::from(&c).connect_gate.per_host().get(), 3);
        assert_eq!(from(&[]).unwrap().imap_connects_per_host.get(), 8);
    }

    #[test]
    fn refused_logins_back_off_as_configured() {
        let c = from(&[("IMAP_LOGIN_BACKOFF", "30s"), ("IMAP_LOGIN_BACKOFF_MAX", "2m"), ("IMAP_LOGIN_ATTEMPTS", "3")])
            .unwrap();
        let b = c.imap_login_backoff;
        assert_eq!((b.first, b.max, b.attempts.get()), (Duration::from_secs(30), Duration::from_secs(120), 3));
        assert_eq!(crate::imap::settings::ImapSettings::from(&c).login_backoff, b, "the engine gets them");
    }

    #[test]
    fn imap_security_settings() {
        let c = from(&[("IMAP_ALLOW_PLAIN", "true"), ("IMAP_ALLOW_PRIVATE", "1")]).unwrap();
        assert!(c.imap_allow_plain && c.imap_allow_private && c.imap_ca_file.is_none());
        assert!(!Config::default().imap_allow_private);
        let e = from(&[("IMAP_ALLOW_PLAIN", "maybe")]).unwrap_err().to_string();
        assert!(e.contains("IMAP_ALLOW_PLAIN") && e.contains("true or false"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = crate::errors::error_chain(&from(&[("IMAP_CA_FILE", empty.to_str().unwrap())]).unwrap_err());
        assert!(e.contains("IMAP_CA_FILE") && e.contains("no PEM certificate") && e.contains("empty.pem"), "{e}");
        let missing = dir.path().join("missing.pem");
        let e = crate::errors::error_chain(&from(&[("IMAP_CA_FILE", missing.to_str().unwrap())]).unwrap_err());
        assert!(e.contains("IMAP_CA_FILE") && e.contains("cannot read") && e.contains("missing.pem"), "{e}");
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    }
}
