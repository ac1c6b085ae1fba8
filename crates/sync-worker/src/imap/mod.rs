//! The IMAP engine: [`ImapSource`] implements [`MailSource`] for real
//! servers, on async-imap (tokio) with tokio-rustls, writing into
//! [`Storage`] under the lease's fence.
//!
//! **Which folders**: every selectable folder of LIST (see `folders`),
//! names decoded from modified UTF-7 for storage, sent as the server spells
//! them; folders storage holds that LIST no longer names are deleted (their
//! messages announced as deleted); at most `IMAP_MAX_FOLDERS`.
//!
//! **Per folder, incrementally**: a STATUS first (or the counters of the
//! poll's LIST-STATUS, where offered); when UIDNEXT,
//! UIDVALIDITY and HIGHESTMODSEQ (CONDSTORE servers) are what storage holds,
//! nothing else is sent, no FETCH at all. Otherwise SELECT, then:
//! * a changed UIDVALIDITY deletes the folder's rows and starts it over;
//! * new mail (UIDs above the stored `last_uid`) is fetched in batches of at
//!   most [`BATCH`] UIDs, each batch committed with its `last_uid`, so a
//!   crash resumes after the last committed batch, and a batch fetched twice
//!   only updates flags (the key is account + folder + UIDVALIDITY + UID);
//! * flag changes: `CHANGEDSINCE` the stored HIGHESTMODSEQ on CONDSTORE
//!   servers, otherwise a rescan of the newest [`FLAG_RESCAN`] messages,
//!   and of every message of one folder per poll, in turn (so every change
//!   arrives within as many polls as there are folders);
//! * expunges: QRESYNC servers name them (`CHANGEDSINCE ... VANISHED`, in
//!   the same FETCH as the flag changes); then, on every server, when storage
//!   still holds more messages below the SELECT's UIDNEXT than the server's
//!   EXISTS, a `UID SEARCH ALL` diff deletes the missing ones;
//! * HIGHESTMODSEQ and UIDNEXT are stored last, once everything they cover is
//!   committed.
//!
//! **Watching** ([`MailConnection::wait_new_mail`]): INBOX is selected, a
//! STATUS (UIDNEXT, UIDVALIDITY, HIGHESTMODSEQ) right before each IDLE
//! catches mail, a reset or a change since the last FETCH, then IDLE until the server says anything but a keepalive, with a
//! hard deadline of our own (async-imap's timer is reset by keepalives) and a
//! silence bound after which the connection must prove itself alive (DONE
//! answered in time) or is dropped. A notification's content is never used:
//! every wake-up is followed by a normal incremental INBOX poll. Servers
//! without IDLE are polled with NOOP.
//!
//! **Connecting** (`transport`): TLS trusts the system's roots plus
//! `IMAP_CA_FILE` and says why a certificate was refused (`tls`); `plain`
//! goes only to loopback unless `IMAP_ALLOW_PLAIN`; the API's login check
//! accepts only public addresses unless `IMAP_ALLOW_PRIVATE`. Everything the
//! server sends passes size limits before the parser sees it (`framing`).
//! The API's own transient connections (`remote`) stream raw messages and
//! attachments: after EXAMINE they read FETCH answers off the socket
//! themselves, a literal in chunks as it arrives (`literal_stream`,
//! `remote_stream`).
//!
//! **Failures**: every command has a timeout; a folder the server refuses
//! (NO/BAD) is skipped and reported while the others sync; a refused login
//! is [`SourceError::Auth`], and the next one waits out [`LoginBackoff`]
//! (`login_gate`: counted in storage, so for every owner), then stops until
//! the account's login is updated. Each
//! poll's outcome is written to the account's `last_sync_at` / `last_error`.

pub mod access_tokens;
mod addresses;
mod authenticate;
mod batch_writer;
pub mod connect_gate;
pub mod connect_rate;
mod folders;
pub mod framing;
mod literal_stream;
mod login_gate;
mod message;
mod poll_memory;
pub mod remote;
pub mod remote_stream;
mod session;
pub mod settings;
pub mod tls;
mod transport;
pub(crate) use addresses::is_public;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::LeaseKey;

pub use access_tokens::{AccessTokens, TokenError};
pub use connect_gate::ConnectGate;
pub use connect_rate::ConnectRate;
pub use folders::{
    all_folders, all_folders_of, decode_modified_utf7, encode_modified_utf7, special_folders, special_folders_of,
    Folder, Role,
};
pub use message::NEW_MAIL_QUERY;
pub use poll_memory::PollMemory;
pub use settings::{ImapSettings, LoginBackoff};
pub use tls::{CaFile, CaFileError, CertificateProblem, TlsSettings};
pub use transport::ConnectError;

use crate::errors::SourceError;
use crate::oauth2::OAuth2Grant;
use crate::source::{Fence, MailConnection, MailSource};
use crate::storage::{AccountAuth, Credentials, Storage, StorageError};
use login_gate::Refusal;

/// Most UIDs one new-mail FETCH asks for (one commit each).
pub const BATCH: usize = 500;
/// Newest messages whose flags are re-read on servers without CONDSTORE.
pub const FLAG_RESCAN: u32 = 500;
/// Most messages one FETCH of a full flag rescan asks for (servers without
/// CONDSTORE rescan one folder's flags in full per poll).
pub const FULL_RESCAN_CHUNK: u32 = 5_000;

/// How many IMAP commands of each kind the engine sent (LOGIN aside), for
/// benchmarks and tests: `SELECT`, `STATUS`, `UID FETCH`, `IDLE`, ...
#[derive(Debug, Default)]
pub struct CommandCounts(parking_lot::Mutex<BTreeMap<String, u64>>);

impl CommandCounts {
    fn count(&self, op: &str) {
        let mut words = op.split(' ');
        let verb = match words.next() {
            Some("UID") => format!("UID {}", words.next().unwrap_or_default()),
            Some(v) => v.to_string(),
            None => return,
        };
        *self.0.lock().entry(verb).or_default() += 1;
    }

    /// A snapshot: command -> how many were sent.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().clone()
    }
}

/// The IMAP [`MailSource`]. Cheap to clone; clones share the command counts.
#[derive(Debug, Clone)]
pub struct ImapSource {
    storage: Storage,
    settings: ImapSettings,
    commands: Arc<CommandCounts>,
    memory: Arc<PollMemory>,
    /// Whether a password that does not decrypt has been logged: once per
    /// process is enough (it is one wrong SECRET_KEY, however many accounts
    /// it affects, and each account's `last_error` says so).
    secret_logged: Arc<std::sync::atomic::AtomicBool>,
}

impl ImapSource {
    /// An engine writing into `storage`.
    pub fn new(storage: Storage, settings: ImapSettings) -> Self {
        Self { storage, settings, commands: Arc::default(), memory: Arc::default(), secret_logged: Arc::default() }
    }

    /// The commands sent so far by every connection of this source.
    pub fn commands(&self) -> BTreeMap<String, u64> {
        self.commands.snapshot()
    }

    /// Logs in with `creds` and out again: what `account add` checks before
    /// saving. Answers the address of the server that took the login (what
    /// tells two names of one server apart from two servers); the error
    /// carries the server's answer.
    pub async fn verify_login(creds: &Credentials, settings: &ImapSettings) -> Result<std::net::IpAddr, LoginError> {
        match transport::open_at(creds, settings).await {
            Ok((mut session, server_ip)) => {
                let _ = tokio::time::timeout(settings.command_timeout, session.logout()).await;
                Ok(server_ip)
            }
            Err(transport::ConnectFailure::Refused(answer)) => Err(LoginError::Refused { answer }),
            Err(transport::ConnectFailure::GrantRefused(e)) => Err(LoginError::Refused { answer: e.to_string() }),
            Err(transport::ConnectFailure::Failed(source)) => {
                let server = format!("{}:{}", creds.host, creds.port);
                Err(if source.is_unreachable() {
                    LoginError::Unreachable { server, source }
                } else {
                    LoginError::Unusable { server, source }
                })
            }
        }
    }

    /// Stores the refresh token the token endpoint rotated `creds`'s to, so
    /// that a restart or another owner refreshes with the one that works.
    /// A failure is logged: the process keeps the new token meanwhile.
    async fn keep_rotated_token(&self, account: &LeaseKey, creds: &Credentials) {
        let AccountAuth::OAuth2(grant) = &creds.auth else { return };
        let Some(rotated) = self.settings.access_tokens.rotated(grant) else { return };
        let new = OAuth2Grant { refresh_token: rotated.clone(), ..grant.clone() };
        match self.storage.rotate_refresh_token(account, grant, rotated).await {
            Ok(true) => self.settings.access_tokens.moved(grant, &new),
            Ok(false) => {} // The login was updated meanwhile: the new one stands.
            Err(e) => tracing::warn!(
                account = %account,
                error = %crate::errors::error_chain(&e),
                "could not store the rotated OAuth2 refresh token; this process keeps using it"
            ),
        }
    }

    async fn record_failure(&self, fence: &Fence, error: &SourceError) -> Result<(), SourceError> {
        let text = crate::errors::error_chain(error);
        let write = async {
            let mut tx = self.storage.write(fence).await?;
            tx.record_poll(Some(&text)).await?;
            tx.commit().await
        };
        write.await.map_err(|e| storage_error(&fence.account, e))
    }
}

/// Why a login check failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The server refused the login.
    #[error("the server refused the login: {answer}")]
    Refused {
        /// The server's answer.
        answer: String,
    },
    /// The server could not be reached (TCP, DNS, a timeout).
    #[error("could not reach {server}")]
    Unreachable {
        /// `host:port`.
        server: String,
        /// Why.
        #[source]
        source: ConnectError,
    },
    /// The server was reached but cannot be used: its certificate was
    /// refused, it does not speak IMAP, it passed a limit, or `plain` was
    /// asked for to an address that is not loopback.
    #[error("cannot use the IMAP server {server}")]
    Unusable {
        /// `host:port`.
        server: String,
        /// Why, in words.
        #[source]
        source: ConnectError,
    },
}

/// A storage error as the source reports it: fencing rejections stay
/// [`SourceError::Fenced`], so the runner stops.
pub(crate) fn storage_error(account: &LeaseKey, e: StorageError) -> SourceError {
    SourceError::from_storage(account, e)
}

#[async_trait]
impl MailSource for ImapSource {
    async fn take_over(&self, fence: &Fence) -> Result<(), SourceError> {
        self.storage.record_claim(fence).await.map_err(|e| storage_error(&fence.account, e))
    }

    async fn connect(&self, fence: &Fence) -> Result<Box<dyn MailConnection>, SourceError> {
        let account = &fence.account;
        let creds = match self.storage.credentials(account).await {
            Ok(creds) => creds,
            Err(StorageError::Secret(source)) => {
                let failure = SourceError::Secret { account: account.clone(), source };
                if !self.secret_logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::error!(
                        error = %crate::errors::error_chain(&failure),
                        "SECRET_KEY does not decrypt stored IMAP passwords: the accounts they belong to do not \
                         sync until SECRET_KEY is the key that encrypted them (each one's last_error says so; \
                         logged once)"
                    );
                }
                self.record_failure(fence, &failure).await?;
                return Err(failure);
            }
            Err(e) => return Err(storage_error(account, e)),
        };
        // Bounds the attempt the claim holds: the connect, the handshake, the greeting and the login.
        let attempt_ms = i64::try_from((self.settings.connect_timeout * 4).as_millis()).unwrap_or(i64::MAX);
        let seen = login_gate::admit(&self.storage, account, &self.settings.login_backoff, attempt_ms).await?;
        let failure = match transport::open(&creds, &self.settings).await {
            Ok(session) => {
                login_gate::worked(&self.storage, fence, seen).await?;
                self.keep_rotated_token(account, &creds).await;
                return session::Connection::start(
                    session,
                    self.storage.clone(),
                    fence.clone(),
                    self.settings.clone(),
                    self.commands.clone(),
                    self.memory.clone(),
                )
                .await
                .map(|c| Box::new(c) as Box<dyn MailConnection>);
            }
            Err(transport::ConnectFailure::Refused(answer)) => {
                let backoff = &self.settings.login_backoff;
                return Err(login_gate::refused(&self.storage, fence, seen, backoff, answer, Refusal::Retry).await?);
            }
            Err(transport::ConnectFailure::GrantRefused(e)) => {
                let (backoff, answer) = (&self.settings.login_backoff, e.to_string());
                return Err(login_gate::refused(&self.storage, fence, seen, backoff, answer, Refusal::Final).await?);
            }
            Err(transport::ConnectFailure::Failed(source)) => SourceError::Connect {
                account: account.clone(),
                server: format!("{}:{}", creds.host, creds.port),
                source: Box::new(source),
            },
        };
        self.record_failure(fence, &failure).await?;
        Err(failure)
    }

    async fn latest_internal_date(&self, account: &LeaseKey) -> Result<Option<u64>, SourceError> {
        let ms = self.storage.latest_internal_date(account).await.map_err(|e| storage_error(account, e))?;
        Ok(ms.map(|m| m.max(0) as u64))
    }
}
