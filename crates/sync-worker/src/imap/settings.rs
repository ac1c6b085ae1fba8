//! The engine's settings: timeouts, and the security rules of connecting.

use std::time::Duration;

use super::access_tokens::AccessTokens;
use super::connect_gate::ConnectGate;
use super::connect_rate::ConnectRate;
use super::tls::TlsSettings;
use crate::config::Config;

/// The engine's timing and security settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImapSettings {
    /// Bound of the TCP connect, the TLS handshake, the greeting and LOGIN each.
    pub connect_timeout: Duration,
    /// Bound of one command (a FETCH batch included).
    pub command_timeout: Duration,
    /// Hard deadline of one IDLE, whatever keepalives the server sends.
    pub idle_deadline: Duration,
    /// Silence inside IDLE after which the connection must prove it is alive.
    pub idle_silence: Duration,
    /// NOOP poll interval on servers without IDLE.
    pub noop_interval: Duration,
    /// The trusted roots: the system's, plus `IMAP_CA_FILE`'s.
    pub tls: TlsSettings,
    /// `IMAP_ALLOW_PLAIN`: whether `plain` may go to addresses that are not loopback.
    pub allow_plain: bool,
    /// Whether the server may be at a loopback, link-local, private or
    /// other non-public address (after DNS). The engine and the operator
    /// CLI are trusted (`true`); the API's login check takes
    /// `IMAP_ALLOW_PRIVATE` (default `false`).
    pub allow_private: bool,
    /// `IMAP_MAX_FOLDERS`: most folders synced per account (INBOX and the
    /// special folders first); past it the account's `last_error` says so.
    pub max_folders: usize,
    /// How long a refused login waits before the next attempt, and when
    /// attempts stop.
    pub login_backoff: LoginBackoff,
    /// The OAuth2 access tokens of the process's connections (clones of
    /// the settings share them).
    pub access_tokens: AccessTokens,
    /// `IMAP_CONNECTS_PER_HOST`: connection attempts at once to one server
    /// host (clones of the settings share the places).
    pub connect_gate: ConnectGate,
    /// `CONNECT_RATE`: new connections a second, process-wide (clones of
    /// the settings share the limit).
    pub connect_rate: ConnectRate,
}

/// The waits after refused logins in a row: `first` after the first, twice
/// as long after each next one up to `max`, and no more attempts after
/// `attempts` refusals, until the account's login is updated. A provider
/// that locks an account after a few failures sees a handful a day, not
/// one a minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginBackoff {
    /// `IMAP_LOGIN_BACKOFF`: the wait after the first refusal.
    pub first: Duration,
    /// `IMAP_LOGIN_BACKOFF_MAX`: the longest wait.
    pub max: Duration,
    /// `IMAP_LOGIN_ATTEMPTS`: refusals in a row after which no login is
    /// tried until the login is updated (at least 1).
    pub attempts: std::num::NonZeroU32,
}

impl Default for LoginBackoff {
    fn default() -> Self {
        Self {
            first: Duration::from_secs(5 * 60),
            max: Duration::from_secs(6 * 3600),
            attempts: std::num::NonZeroU32::new(8).unwrap_or(std::num::NonZeroU32::MIN),
        }
    }
}

impl LoginBackoff {
    /// The wait after the `refusals`-th refusal in a row; `None` once no
    /// attempt is left.
    pub fn wait_after(&self, refusals: u32) -> Option<Duration> {
        if refusals >= self.attempts.get() {
            return None;
        }
        let doublings = refusals.saturating_sub(1).min(30);
        Some(self.first.saturating_mul(1 << doublings).min(self.max))
    }
}

impl Default for ImapSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(20),
            command_timeout: Duration::from_secs(120),
            idle_deadline: Duration::from_secs(24 * 60),
            idle_silence: Duration::from_secs(5 * 60),
            noop_interval: Duration::from_secs(15),
            tls: TlsSettings::default(),
            allow_plain: false,
            allow_private: true,
            max_folders: 1_000,
            login_backoff: LoginBackoff::default(),
            access_tokens: AccessTokens::default(),
            connect_gate: ConnectGate::default(),
            connect_rate: ConnectRate::default(),
        }
    }
}

impl From<&Config> for ImapSettings {
    /// The IDLE deadline a little under `IDLE_REISSUE`, so the engine ends
    /// its IDLE cleanly before the runner's own bound would cut it.
    fn from(c: &Config) -> Self {
        let margin = (c.idle_reissue / 10).min(Duration::from_secs(60));
        Self {
            idle_deadline: c.idle_reissue - margin,
            tls: TlsSettings::with_ca_file(c.imap_ca_file.as_ref()),
            allow_plain: c.imap_allow_plain,
            max_folders: c.imap_max_folders,
            login_backoff: c.imap_login_backoff,
            connect_gate: ConnectGate::new(c.imap_connects_per_host),
            connect_rate: ConnectRate::new(c.connect_rate),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_logins_wait_longer_each_time_then_stop() {
        let backoff = LoginBackoff {
            first: Duration::from_secs(300),
            max: Duration::from_secs(3600),
            attempts: std::num::NonZeroU32::new(5).unwrap(),
        };
        let waits: Vec<Option<u64>> = (1..=6).map(|n| backoff.wait_after(n).map(|d| d.as_secs())).collect();
        assert_eq!(waits, [Some(300), Some(600), Some(1200), Some(2400), None, None]);
        let capped = LoginBackoff { attempts: std::num::NonZeroU32::new(40).unwrap(), ..backoff };
        assert_eq!(capped.wait_after(39), Some(Duration::from_secs(3600)), "capped, and no overflow");
    }
}
