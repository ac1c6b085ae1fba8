//! The API's transient connection turned to streamed FETCHes: once a
//! [`Remote`] has entered its folder (EXAMINE answered), [`Remote::streaming`]
//! leaves async-imap and the framing layer and reads the socket beneath
//! them with `literal_stream`, so that a raw message or an attachment goes
//! to the client in chunks as it arrives instead of whole.
//!
//! Errors say which server and command, as the rest of `remote` does: a
//! NO or BAD is [`RemoteError::No`], anything else [`RemoteError::Command`].
//! The connection is logged out at the end of a section, or dropped when
//! the reader stops early.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::framing::Bounded;
use super::literal_stream::{Conn, Fetched, Section, WireError};
use super::remote::{Remote, RemoteError};
use super::transport::{ImapSession, Io};

/// The socket beneath a session's async-imap and framing layers. The
/// session is kept (and never used again) so that nothing it owns closes.
struct Underneath(ImapSession);

impl Underneath {
    fn socket(&mut self) -> &mut Box<dyn Io> {
        AsMut::<Bounded<Box<dyn Io>>>::as_mut(&mut self.0).get_mut()
    }
}

impl std::fmt::Debug for Underneath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Underneath")
    }
}

impl AsyncRead for Underneath {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().socket()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Underneath {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().socket()).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().socket()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().socket()).poll_shutdown(cx)
    }
}

/// A logged-in connection with its folder entered, fetching by itself.
#[derive(Debug)]
pub struct Streaming {
    conn: Conn<Underneath>,
    server: String,
}

impl Remote {
    /// This connection as a [`Streaming`] one. Call it right after
    /// [`Remote::enter`] answered (async-imap has read the tagged OK and
    /// holds nothing more); async-imap is not used on it again.
    pub fn streaming(self) -> Streaming {
        let (mut session, server, timeout) = self.into_parts();
        let held = AsMut::<Bounded<Box<dyn Io>>>::as_mut(&mut session).take_held();
        Streaming { conn: Conn::new(Underneath(session), held, timeout), server }
    }
}

/// `e` as a [`RemoteError`] of `server`'s command `op`.
fn remote_error(server: &str, op: String, e: WireError) -> RemoteError {
    let server = server.to_string();
    match e {
        WireError::Refused { answer } => RemoteError::No { server, op, answer },
        WireError::Connection(source) => RemoteError::Command { server, op, source },
    }
}

fn op(uid: u32, sections: &[&str]) -> String {
    let items: String = sections.iter().map(|s| format!(" BODY.PEEK[{s}]")).collect();
    format!("UID FETCH {uid} (UID{items})")
}

impl Streaming {
    /// `sections` of message `uid`, each read whole (at most `max` bytes):
    /// `None` when the message is gone, `None` for a section the server has
    /// no value for (`NIL`).
    pub async fn sections(
        &mut self,
        uid: u32,
        sections: &[&str],
        max: u64,
    ) -> Result<Option<Vec<Option<Vec<u8>>>>, RemoteError> {
        self.conn.fetch_whole(uid, sections, max).await.map_err(|e| remote_error(&self.server, op(uid, sections), e))
    }

    /// `section` of message `uid`, to be read as it arrives; `None` (and
    /// the connection logged out) when the message or section is gone.
    pub async fn body(self, uid: u32, section: &str) -> Result<Option<RemoteBody>, RemoteError> {
        let op = op(uid, &[section]);
        match self.conn.fetch_streamed(uid, section).await {
            Ok(Fetched::Found(section)) => Ok(Some(RemoteBody { section, server: self.server, op })),
            Ok(Fetched::Gone(conn)) => {
                conn.logout().await;
                Ok(None)
            }
            Err(e) => Err(remote_error(&self.server, op, e)),
        }
    }

    /// Logs out (best effort).
    pub async fn close(self) {
        self.conn.logout().await;
    }
}

/// A section arriving from the server.
#[derive(Debug)]
pub struct RemoteBody {
    section: Section<Underneath>,
    server: String,
    op: String,
}

impl RemoteBody {
    /// Its size in bytes, as the server announced it.
    pub fn size(&self) -> u64 {
        self.section.size()
    }

    /// Its bytes in chunks (at most 64 KiB each), read only as fast as they
    /// are taken; at the end the connection is logged out. An error ends
    /// the stream.
    pub fn into_stream(self) -> impl Stream<Item = Result<Vec<u8>, RemoteError>> + Send + 'static {
        futures::stream::try_unfold(Some(self), |body| async move {
            let Some(mut body) = body else { return Ok(None) };
            match body.section.chunk().await {
                Ok(Some(chunk)) => Ok(Some((chunk, Some(body)))),
                Ok(None) => {
                    body.section.finish().await;
                    Ok(None)
                }
                Err(e) => Err(remote_error(&body.server, body.op, e)),
            }
        })
    }
}
