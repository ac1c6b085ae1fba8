//! The engine's settings: timeouts, and the security rules of connecting.

use std::time::Duration;

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
            ..Self::default()
        }
    }
}
