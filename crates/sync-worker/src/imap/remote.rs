//! The API's own IMAP connections: transient, one per request, never the
//! sync's (those belong to the lease owner, which may be another process).
//!
//! Reading EXAMINEs the folder (read-only) and fetches with `BODY.PEEK[]`,
//! so it never sets `\Seen`; raw messages and attachments are then fetched
//! in chunks as they arrive (`remote_stream`). Actions SELECT the folder and change mail on
//! the server only (UID STORE, MOVE or COPY + UID EXPUNGE); the change comes
//! back into SQL through the sync, under its fencing.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt as _;

use super::folders::encode_modified_utf7;
use super::message::{flags_of, uid_set};
use super::settings::ImapSettings;
use super::transport::{self, imap_error, ConnectError, ConnectFailure, ImapSession};
use crate::storage::Credentials;

/// Why the server could not do what the API asked.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The server refused the stored login.
    #[error("the IMAP server {server} refused the login: {answer}")]
    Refused {
        /// `host:port`.
        server: String,
        /// The server's answer.
        answer: String,
    },
    /// The server could not be reached or used.
    #[error("could not use the IMAP server {server}")]
    Connect {
        /// `host:port`.
        server: String,
        /// Why.
        #[source]
        source: ConnectError,
    },
    /// A command failed or timed out after the login.
    #[error("the IMAP server {server} did not answer {op}")]
    Command {
        /// `host:port`.
        server: String,
        /// The command, in words.
        op: String,
        /// Why.
        #[source]
        source: ConnectError,
    },
    /// The server answered a command with NO or BAD.
    #[error("the IMAP server {server} refused {op}: {answer}")]
    No {
        /// `host:port`.
        server: String,
        /// The command, in words.
        op: String,
        /// Its answer.
        answer: String,
    },
    /// The server lacks what the action needs.
    #[error("the IMAP server {server} cannot {what}")]
    Unsupported {
        /// `host:port`.
        server: String,
        /// What it cannot do, in words.
        what: &'static str,
    },
}

/// Runs one command on `$remote`'s session (bound to `$s` in `$body`)
/// within the command timeout.
macro_rules! run {
    ($remote:ident, $op:expr, $step:expr, |$s:ident| $body:expr) => {{
        let op: String = $op.into();
        let r = tokio::time::timeout($remote.timeout, async {
            let $s = &mut $remote.session;
            $body
        })
        .await;
        $remote.answer(op, $step, r)
    }};
}

/// A logged-in connection of the API's.
pub struct Remote {
    session: ImapSession,
    server: String,
    timeout: Duration,
    capabilities: Option<async_imap::types::Capabilities>,
}

impl Remote {
    /// Logs in with `creds`.
    pub async fn open(creds: &Credentials, settings: &ImapSettings) -> Result<Self, RemoteError> {
        let server = format!("{}:{}", creds.host, creds.port);
        let session = match transport::open(creds, settings).await {
            Ok(session) => session,
            Err(ConnectFailure::Refused(answer)) => return Err(RemoteError::Refused { server, answer }),
            Err(ConnectFailure::GrantRefused(e)) => return Err(RemoteError::Refused { server, answer: e.to_string() }),
            Err(ConnectFailure::Failed(source)) => return Err(RemoteError::Connect { server, source }),
        };
        Ok(Self { session, server, timeout: settings.command_timeout, capabilities: None })
    }

    /// One command's outcome: NO and BAD are [`RemoteError::No`].
    fn answer<T>(
        &self,
        op: String,
        step: &'static str,
        r: Result<async_imap::error::Result<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, RemoteError> {
        let server = self.server.clone();
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(async_imap::error::Error::No(answer) | async_imap::error::Error::Bad(answer))) => {
                Err(RemoteError::No { server, op, answer })
            }
            Ok(Err(e)) => {
                Err(RemoteError::Command { server, op, source: imap_error(step, e, self.session.get_ref().limits()) })
            }
            Err(_) => {
                Err(RemoteError::Command { server, op, source: ConnectError::Timeout { step, after: self.timeout } })
            }
        }
    }

    /// Whether the server offers `capability` (asked once per connection).
    async fn offers(&mut self, capability: &str) -> Result<bool, RemoteError> {
        if self.capabilities.is_none() {
            let caps = run!(self, "CAPABILITY", "CAPABILITY", |s| s.capabilities().await)?;
            self.capabilities = Some(caps);
        }
        Ok(self.capabilities.as_ref().is_some_and(|c| c.has_str(capability)))
    }

    /// Opens `folder` (EXAMINE to read, SELECT to change); `false` when the
    /// server has no such folder or its UIDVALIDITY is no longer `uidvalidity`.
    pub async fn enter(&mut self, folder: &str, uidvalidity: u32, write: bool) -> Result<bool, RemoteError> {
        if transport::unquotable("folder name", folder).is_err() {
            return Ok(false);
        }
        // Storage keeps folder names decoded; the wire wants modified UTF-7.
        // A server that lists raw UTF-8 names is asked by that name too.
        let wire = encode_modified_utf7(folder);
        let names = if wire == folder { vec![wire] } else { vec![wire, folder.to_string()] };
        for name in names {
            let verb = if write { "SELECT" } else { "EXAMINE" };
            let entered = run!(self, format!("{verb} {name}"), verb, |s| {
                if write {
                    s.select(&name).await
                } else {
                    s.examine(&name).await
                }
            });
            match entered {
                Ok(mailbox) => return Ok(mailbox.uid_validity == Some(uidvalidity)),
                // No such folder (by this spelling).
                Err(RemoteError::No { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// The flags of those of `uids` the folder entered still has.
    pub async fn flags(&mut self, uids: &[u32]) -> Result<BTreeMap<u32, Vec<String>>, RemoteError> {
        if uids.is_empty() {
            return Ok(BTreeMap::new());
        }
        let set = uid_set(uids);
        let fetched = run!(self, format!("UID FETCH {set} (FLAGS)"), "UID FETCH", |s| {
            s.uid_fetch(&set, "(UID FLAGS)").await?.try_collect::<Vec<_>>().await
        })?;
        Ok(fetched
            .iter()
            .filter_map(|f| Some((f.uid?, flags_of(f))))
            .filter(|(uid, _)| uids.contains(uid))
            .map(|(uid, flags)| (uid, flags.split(' ').filter(|f| !f.is_empty()).map(str::to_string).collect()))
            .collect())
    }

    /// The UIDs of the folder entered whose text (header and body) holds
    /// every one of `terms` (`UID SEARCH CHARSET UTF-8 TEXT ...`; the terms
    /// are letters and digits only, so they quote safely).
    pub async fn search_text(&mut self, terms: &[String]) -> Result<Vec<u32>, RemoteError> {
        let criteria: Vec<String> =
            terms.iter().filter(|t| t.chars().all(char::is_alphanumeric)).map(|t| format!("TEXT \"{t}\"")).collect();
        if criteria.is_empty() {
            return Ok(Vec::new());
        }
        let query = format!("CHARSET UTF-8 {}", criteria.join(" "));
        let mut uids: Vec<u32> =
            run!(self, format!("UID SEARCH {query}"), "UID SEARCH", |s| s.uid_search(&query).await)?
                .into_iter()
                .collect();
        uids.sort_unstable();
        Ok(uids)
    }

    /// Adds then removes flags of `uids` in the folder entered (UID STORE).
    pub async fn store(&mut self, uids: &[u32], add: &[String], remove: &[String]) -> Result<(), RemoteError> {
        let set = uid_set(uids);
        for (sign, flags) in [('+', add), ('-', remove)] {
            if flags.is_empty() {
                continue;
            }
            let query = format!("{sign}FLAGS.SILENT ({})", flags.join(" "));
            let op = format!("UID STORE {set} {query}");
            run!(self, op, "UID STORE", |s| s.uid_store(&set, &query).await?.try_collect::<Vec<_>>().await)?;
        }
        Ok(())
    }

    /// Moves `uids` of the folder entered to `target` (a decoded name): MOVE
    /// where offered, otherwise COPY, `\Deleted` and UID EXPUNGE.
    pub async fn move_to(&mut self, uids: &[u32], target: &str) -> Result<(), RemoteError> {
        let set = uid_set(uids);
        let wire = encode_modified_utf7(target);
        if self.offers("MOVE").await? {
            return run!(self, format!("UID MOVE {set} {target}"), "UID MOVE", |s| s.uid_mv(&set, &wire).await);
        }
        if !self.offers("UIDPLUS").await? {
            let server = self.server.clone();
            return Err(RemoteError::Unsupported { server, what: "move mail: it offers neither MOVE nor UIDPLUS" });
        }
        run!(self, format!("UID COPY {set} {target}"), "UID COPY", |s| s.uid_copy(&set, &wire).await)?;
        self.expunge(uids).await
    }

    /// Removes `uids` of the folder entered for good: `\Deleted`, then UID
    /// EXPUNGE of exactly those (UIDPLUS; a plain EXPUNGE would also take
    /// mail another client marked deleted).
    pub async fn expunge(&mut self, uids: &[u32]) -> Result<(), RemoteError> {
        if !self.offers("UIDPLUS").await? {
            let server = self.server.clone();
            return Err(RemoteError::Unsupported { server, what: "expunge single messages: it lacks UIDPLUS" });
        }
        self.store(uids, &["\\Deleted".to_string()], &[]).await?;
        let set = uid_set(uids);
        run!(self, format!("UID EXPUNGE {set}"), "UID EXPUNGE", |s| {
            s.uid_expunge(&set).await?.try_collect::<Vec<_>>().await
        })
        .map(drop)
    }

    /// The session, the server's `host:port` and the command timeout (see `remote_stream`).
    pub(super) fn into_parts(self) -> (ImapSession, String, Duration) {
        (self.session, self.server, self.timeout)
    }

    /// Logs out (best effort).
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(self.timeout, self.session.logout()).await;
    }
}
