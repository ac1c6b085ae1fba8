//! Reading one message on demand, for the API: a transient connection that
//! EXAMINEs the folder (read-only, so nothing on the server changes) and
//! fetches the message with `BODY.PEEK[]` (so reading never sets `\Seen`).
//! The sync's connections are not used: they belong to the lease owner,
//! which may be another process.

use futures::TryStreamExt as _;

use super::folders::encode_modified_utf7;
use super::settings::ImapSettings;
use super::transport::{self, imap_error, ConnectError, ConnectFailure, ImapSession};
use crate::storage::{Credentials, MessageKey};

/// Why a message could not be read from its IMAP server.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
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
}

impl ReadError {
    /// Whether the server could not be reached at all (as opposed to reached
    /// and found wanting, or refusing the login).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ReadError::Connect { source, .. } if source.is_unreachable())
    }
}

/// The raw bytes (RFC 5322) of the message `key` of the account `creds`
/// logs in to; `None` when the server no longer has it: the folder is gone,
/// its UIDVALIDITY changed, or the UID was expunged.
pub async fn read_raw(
    creds: &Credentials,
    settings: &ImapSettings,
    key: &MessageKey,
) -> Result<Option<Vec<u8>>, ReadError> {
    let server = format!("{}:{}", creds.host, creds.port);
    let mut session = match transport::open(creds, settings).await {
        Ok(session) => session,
        Err(ConnectFailure::Refused(answer)) => return Err(ReadError::Refused { server, answer }),
        Err(ConnectFailure::Failed(source)) => return Err(ReadError::Connect { server, source }),
    };
    let result = fetch(&mut session, settings, key).await;
    let _ = tokio::time::timeout(settings.command_timeout, session.logout()).await;
    result.map_err(|(op, source)| ReadError::Command { server, op, source })
}

/// A failed or timed-out command as a [`ConnectError`] (a limit, a parse
/// failure or the I/O error in words).
fn command_error(
    session: &ImapSession,
    step: &'static str,
    after: std::time::Duration,
    r: Result<async_imap::error::Error, tokio::time::error::Elapsed>,
) -> ConnectError {
    match r {
        Ok(e) => imap_error(step, e, session.get_ref().limits()),
        Err(_) => ConnectError::Timeout { step, after },
    }
}

async fn fetch(
    session: &mut ImapSession,
    settings: &ImapSettings,
    key: &MessageKey,
) -> Result<Option<Vec<u8>>, (String, ConnectError)> {
    let timeout = settings.command_timeout;
    if transport::unquotable("folder name", &key.folder).is_err() {
        return Ok(None);
    }
    // Storage keeps folder names decoded; the wire wants modified UTF-7. A
    // server that lists raw UTF-8 names is asked by that name too.
    let wire = encode_modified_utf7(&key.folder);
    let names = if wire == key.folder { vec![wire] } else { vec![wire, key.folder.clone()] };
    let mut mailbox = None;
    for name in names {
        let r = match tokio::time::timeout(timeout, session.examine(&name)).await {
            Ok(Ok(m)) => {
                mailbox = Some(m);
                break;
            }
            // No such folder (by this spelling).
            Ok(Err(async_imap::error::Error::No(_))) => continue,
            Ok(Err(e)) => Ok(e),
            Err(elapsed) => Err(elapsed),
        };
        return Err((format!("EXAMINE {name}"), command_error(session, "EXAMINE", timeout, r)));
    }
    let Some(mailbox) = mailbox else { return Ok(None) };
    if mailbox.uid_validity != Some(key.uidvalidity) {
        return Ok(None);
    }
    let fetched = tokio::time::timeout(timeout, async {
        let stream = session.uid_fetch(key.uid.to_string(), "(UID BODY.PEEK[])").await?;
        stream.try_collect::<Vec<_>>().await
    })
    .await;
    let r = match fetched {
        // A server may add unsolicited FETCHes (flag changes) of other messages.
        Ok(Ok(f)) => return Ok(f.iter().find(|f| f.uid == Some(key.uid)).and_then(|f| f.body()).map(<[u8]>::to_vec)),
        Ok(Err(e)) => Ok(e),
        Err(elapsed) => Err(elapsed),
    };
    Err((format!("UID FETCH {} BODY.PEEK[]", key.uid), command_error(session, "UID FETCH", timeout, r)))
}
