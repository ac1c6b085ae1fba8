//! Size limits on what a server sends, enforced in front of the parser.
//!
//! **Why reading a long line was superlinear.** async-imap's `ImapStream`
//! reads into a buffer that grows 4 KiB at a time and, after every read,
//! hands the *whole* buffer to imap-proto again; an incomplete line gives
//! `Incomplete(Needed::Size(1))`, so nothing is skipped, and a line of `L`
//! bytes costs about `L² / 8 KiB` bytes of parsing (2 MiB: 512 MiB parsed,
//! 0.3 s of CPU; an endless greeting: a core until the timeout). Literals do
//! not have the problem: imap-proto announces their size and async-imap
//! waits for all of it.
//!
//! [`Bounded`] sits between the socket and async-imap and follows the
//! framing as the bytes pass:
//! * it holds back a line until its end has arrived (literals pass at
//!   once: imap-proto waits for them by size), so a server that trickles
//!   a line byte by byte does not cause one parse per byte;
//! * the line bytes of one response (outside literals) are capped: 64 KiB
//!   before login (greetings and LOGIN answers are a few hundred bytes), then
//!   [`MAX_LINE`] (a `SEARCH` of a big folder);
//! * a literal announced larger than [`MAX_LITERAL`] is refused before a
//!   byte of it is read;
//! * between two of our commands, a budget caps the bytes (small before
//!   login, where anyone can point an account at a hostile server: this ends
//!   a flood) and the re-parsing that long lines cost (`L²/8 KiB` each, so a
//!   logged-in server cannot send 1 MiB lines forever either).
//!
//! Each limit ends the connection with a [`FramingError`] that says which
//! limit, in words.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest message literal accepted (a header or a body part): larger
/// mail is refused by the providers we sync from anyway (Gmail: 25 MB
/// attached, about 35 MB encoded).
pub const MAX_LITERAL: u64 = 64 << 20;
/// The most line bytes (outside literals) of one response: a `SEARCH` of
/// about 150,000 UIDs, an ENVELOPE with thousands of recipients.
pub const MAX_LINE: usize = 1 << 20;
/// The most line bytes of one response before login.
pub const PRE_LOGIN_MAX_LINE: usize = 64 << 10;
/// What a server may send before the login is answered (greeting,
/// CAPABILITY, STARTTLS, LOGIN): real servers send a few hundred bytes.
pub const PRE_LOGIN_BUDGET: u64 = 1 << 20;
/// What a server may send between two of our commands once logged in: a
/// FETCH batch of [`super::BATCH`] messages' headers and previews fits many
/// times over.
pub const COMMAND_BUDGET: u64 = 256 << 20;
/// The re-parsing long lines may cost between two of our commands, in
/// bytes parsed: two lines of [`MAX_LINE`] (a line of `L` bytes costs about
/// `L²/8 KiB`, see the module docs), tens of milliseconds of CPU.
pub const PARSE_BUDGET: u64 = 2 * ((MAX_LINE as u64 * MAX_LINE as u64) / 8192) + (64 << 20);

/// Which limit a server passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// One response's line bytes passed the line limit ([`PRE_LOGIN_MAX_LINE`], then [`MAX_LINE`]).
    #[error("the server sent a response line longer than {limit} bytes (the limit), so the connection was closed")]
    LineTooLong {
        /// The limit.
        limit: usize,
    },
    /// A literal announced larger than [`MAX_LITERAL`].
    #[error("the server announced a literal of {size} bytes, larger than the {limit} bytes accepted")]
    LiteralTooLarge {
        /// The announced size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A literal whose size is not a number.
    #[error("the server announced a literal whose size is not a number: {{{text}}}")]
    BadLiteral {
        /// What stood between the braces.
        text: String,
    },
    /// More bytes than the budget without a command of ours in between.
    #[error("the server sent more than {limit} bytes without being asked (a flood), so the connection was closed")]
    Flood {
        /// The budget.
        limit: u64,
    },
    /// Long lines whose parsing would cost more than the budget.
    #[error(
        "the server sent long lines that would cost more than {limit} bytes of parsing for one command, so the \
         connection was closed"
    )]
    TooCostly {
        /// The budget.
        limit: u64,
    },
}

/// The limits one connection reads under. Clones share them: the
/// transport raises them with [`Limits::logged_in`] once LOGIN succeeded.
#[derive(Debug, Clone)]
pub struct Limits {
    max_line: Arc<AtomicU64>,
    max_literal: u64,
    budget: Arc<AtomicU64>,
    parse_budget: u64,
    start: Arc<parking_lot::Mutex<Vec<u8>>>,
}

/// How many bytes of the current response's start are kept, to quote a
/// response the parser refuses.
const START_KEPT: usize = 80;

impl Default for Limits {
    /// The limits before login.
    fn default() -> Self {
        Self::new(PRE_LOGIN_MAX_LINE, MAX_LITERAL, PRE_LOGIN_BUDGET)
    }
}

impl Limits {
    /// Limits of these sizes (line bytes per response, one literal, bytes between commands).
    pub fn new(max_line: usize, max_literal: u64, budget: u64) -> Self {
        Self {
            max_line: Arc::new(AtomicU64::new(max_line as u64)),
            max_literal,
            budget: Arc::new(AtomicU64::new(budget)),
            parse_budget: PARSE_BUDGET,
            start: Arc::default(),
        }
    }

    /// The limits of a logged-in session: [`MAX_LINE`], [`COMMAND_BUDGET`].
    pub fn logged_in(&self) {
        self.max_line.store(MAX_LINE as u64, Ordering::Relaxed);
        self.budget.store(COMMAND_BUDGET, Ordering::Relaxed);
    }

    fn max_line(&self) -> usize {
        self.max_line.load(Ordering::Relaxed) as usize
    }

    /// The first bytes of the response being read (or the last one), in
    /// words: printable ASCII kept, anything else escaped, cut at 80 bytes.
    pub fn current_start(&self) -> String {
        let start = self.start.lock();
        let end = start.iter().position(|b| *b == b'\r' || *b == b'\n').unwrap_or(start.len());
        let text: String = start[..end].iter().flat_map(|b| std::ascii::escape_default(*b)).map(char::from).collect();
        if end == START_KEPT {
            format!("\"{text}…\"")
        } else {
            format!("\"{text}\"")
        }
    }
}

/// Where the scan is in the server's byte stream.
#[derive(Debug)]
enum Scan {
    /// In a line: `line` bytes of this response so far, the last bytes kept
    /// to spot a literal announcement (`{123}` or `{123+}`) before CRLF.
    Line { tail: Vec<u8> },
    /// Inside a literal: this many bytes still to come.
    Literal { left: u64 },
}

/// A byte stream whose incoming side is held to [`Limits`]. Writes pass
/// through and reset the budgets.
#[derive(Debug)]
pub struct Bounded<S> {
    inner: S,
    limits: Limits,
    scan: Scan,
    /// Line bytes of the current response.
    line: usize,
    /// Whether the next byte starts a response (to record its start).
    at_start: bool,
    /// Bytes read since our last write.
    since_write: u64,
    /// Re-parsing the lines since our last write cost (estimated).
    parse_work: u64,
    /// Bytes read and scanned but not handed on yet: `held[..ready]` may
    /// go (complete lines, literal bytes); the rest is a line still open.
    held: Vec<u8>,
    ready: usize,
    failed: Option<FramingError>,
    /// Counted in `sync_worker_imap_connections_open` while it lives.
    _open: crate::metrics::OpenConnection,
}

/// The tail kept to spot a literal announcement: `{` 20 digits `+}` CR LF
/// (a u64 size) and room to see that a longer one is not a number.
const TAIL: usize = 32;
/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 << 10;

impl<S> Bounded<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, limits: Limits) -> Self {
        Self {
            inner,
            limits,
            scan: Scan::Line { tail: Vec::with_capacity(TAIL) },
            line: 0,
            at_start: true,
            since_write: 0,
            parse_work: 0,
            held: Vec::new(),
            ready: 0,
            failed: None,
            _open: crate::metrics::OpenConnection::new(),
        }
    }

    /// The limits it reads under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The stream underneath. Bytes read but not handed on are dropped:
    /// only STARTTLS uses this, where the server must not have sent more.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The stream underneath, for a reader that follows the framing
    /// itself from here (the API's streamed FETCH, see `literal_stream`).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The bytes read from the stream underneath but not handed on (an
    /// unfinished line), taken: whoever reads the stream directly from now
    /// on reads these first.
    pub fn take_held(&mut self) -> Vec<u8> {
        self.ready = 0;
        std::mem::take(&mut self.held)
    }

    /// Follows the framing over `bytes`; the first limit passed is the
    /// error. Returns how many of them end a complete piece (a line, or
    /// literal bytes), so that everything up to there may be handed on.
    fn scan(&mut self, mut bytes: &[u8]) -> Result<usize, FramingError> {
        let total = bytes.len();
        let mut complete = 0;
        self.since_write += total as u64;
        let budget = self.limits.budget.load(Ordering::Relaxed);
        if self.since_write > budget {
            return Err(FramingError::Flood { limit: budget });
        }
        let max_line = self.limits.max_line();
        while !bytes.is_empty() {
            match &mut self.scan {
                Scan::Literal { left } => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    complete = total - bytes.len();
                    if *left == 0 {
                        self.scan = Scan::Line { tail: Vec::with_capacity(TAIL) };
                    }
                }
                Scan::Line { tail } => {
                    if self.at_start {
                        self.at_start = false;
                        self.limits.start.lock().clear();
                    }
                    let end = bytes.iter().position(|b| *b == b'\n');
                    let chunk = &bytes[..end.map_or(bytes.len(), |e| e + 1)];
                    bytes = &bytes[chunk.len()..];
                    self.line += chunk.len();
                    if self.line > max_line {
                        return Err(FramingError::LineTooLong { limit: max_line });
                    }
                    {
                        let mut start = self.limits.start.lock();
                        let room = START_KEPT.saturating_sub(start.len()).min(chunk.len());
                        start.extend_from_slice(&chunk[..room]);
                    }
                    let keep = chunk.len().min(TAIL);
                    tail.extend_from_slice(&chunk[chunk.len() - keep..]);
                    if tail.len() > TAIL {
                        tail.drain(..tail.len() - TAIL);
                    }
                    if end.is_none() {
                        continue;
                    }
                    complete = total - bytes.len();
                    // async-imap parses the response from its start after
                    // every 4 KiB it reads (see the module docs).
                    let line = self.line as u64;
                    self.parse_work += line.max(line * line / 8192);
                    if self.parse_work > self.limits.parse_budget {
                        return Err(FramingError::TooCostly { limit: self.limits.parse_budget });
                    }
                    match literal_size(tail)? {
                        Some(size) if size > self.limits.max_literal => {
                            return Err(FramingError::LiteralTooLarge { size, limit: self.limits.max_literal });
                        }
                        Some(0) => tail.clear(),
                        Some(size) => self.scan = Scan::Literal { left: size },
                        None => {
                            // The response is complete.
                            tail.clear();
                            self.line = 0;
                            self.at_start = true;
                        }
                    }
                }
            }
        }
        Ok(complete)
    }
}

/// The size of the literal a line's end announces (`... {123}\r\n`), if any.
pub(crate) fn literal_size(tail: &[u8]) -> Result<Option<u64>, FramingError> {
    let line = tail.strip_suffix(b"\n").unwrap_or(tail);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(inside) = line.strip_suffix(b"}") else { return Ok(None) };
    let Some(open) = inside.iter().rposition(|b| *b == b'{') else {
        // Longer than any size we accept, or a `}` that ends a text.
        return Ok(None);
    };
    let digits = &inside[open + 1..];
    let digits = digits.strip_suffix(b"+").unwrap_or(digits);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        // A text that happens to end in `{...}` (a greeting, a NO reason).
        return Ok(None);
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| FramingError::BadLiteral { text: String::from_utf8_lossy(digits).into_owned() })
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some(e) = &this.failed {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e.clone())));
            }
            if this.ready > 0 {
                let n = this.ready.min(buf.remaining());
                buf.put_slice(&this.held[..n]);
                this.held.drain(..n);
                this.ready -= n;
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => {
                    // The server has nothing more for now, and a connection
                    // may now sit in IDLE for days: it keeps no buffer sized
                    // by the largest response it ever read.
                    if this.held.is_empty() && this.held.capacity() > 0 {
                        this.held = Vec::new();
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let got = read.filled();
            if got.is_empty() {
                // End of stream: hand on what is left (async-imap then
                // reports the cut response), then the end itself.
                this.ready = this.held.len();
                if this.ready == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            match this.scan(got) {
                Ok(complete) => {
                    let before = this.held.len();
                    this.held.extend_from_slice(got);
                    if complete > 0 {
                        this.ready = before + complete;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "server cut off");
                    // Nothing more is handed on: the parser never sees
                    // more than the limit.
                    this.failed = Some(e);
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.since_write = 0;
            this.parse_work = 0;
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The framing error behind an I/O error, if a limit ended the connection.
pub(crate) fn framing_error(e: &io::Error) -> Option<&FramingError> {
    e.get_ref()?.downcast_ref::<FramingError>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::new(100, 1000, 10_000)
    }

    #[test]
    fn literals_are_skipped_and_lines_counted() {
        let mut b = Bounded::new((), limits());
        // A literal of 500 bytes does not count against the 100-byte line.
        b.scan(b"* 1 FETCH (BODY[] {500}\r\n").unwrap();
        b.scan(&[b'x'; 500]).unwrap();
        b.scan(b")\r\n").unwrap();
        assert!(matches!(b.scan, Scan::Line { .. }) && b.line == 0);
        // Split announcements are found too.
        b.scan(b"* 2 FETCH (BODY[] {1").unwrap();
        b.scan(b"0+}\r").unwrap();
        b.scan(b"\n0123456789)\r\n").unwrap();
        assert_eq!(b.line, 0);
        assert_eq!(limits().current_start(), "\"\"");
    }

    #[test]
    fn limits_are_enforced() {
        let mut b = Bounded::new((), limits());
        let e = b.scan(&[b'a'; 101]).unwrap_err();
        assert_eq!(e, FramingError::LineTooLong { limit: 100 });
        let mut b = Bounded::new((), limits());
        let e = b.scan(b"* 1 FETCH (BODY[] {1001}\r\n").unwrap_err();
        assert!(e.to_string().contains("1001 bytes"), "{e}");
        let mut b = Bounded::new((), limits());
        let e = b.scan(b"* 1 FETCH (BODY[] {99999999999999999999999}\r\n").unwrap_err();
        assert!(matches!(e, FramingError::BadLiteral { .. }), "{e}");
        let mut b = Bounded::new((), limits());
        for _ in 0..1250 {
            b.scan(b"* OK x\r\n").unwrap();
        }
        let e = b.scan(b"* OK flood\r\n").unwrap_err();
        assert!(e.to_string().contains("flood"), "{e}");
        // A text ending in braces is no literal.
        let mut b = Bounded::new((), limits());
        b.scan(b"* OK hello {world}\r\n").unwrap();
        assert_eq!(b.line, 0);
    }

    /// A connection that read a big response and then waits (a hot
    /// account's IDLE) keeps no buffer the size of that response.
    #[tokio::test]
    async fn a_waiting_connection_keeps_no_read_buffer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut server, client) = tokio::io::duplex(1 << 20);
        let mut b = Bounded::new(client, Limits::new(1000, 100_000, 1_000_000));
        let mut response = b"* 1 FETCH (BODY[] {60000}\r\n".to_vec();
        response.extend(std::iter::repeat_n(b'x', 60_000));
        response.extend_from_slice(b")\r\n");
        server.write_all(&response).await.unwrap();
        let mut got = vec![0u8; response.len()];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(got, response);
        assert!(b.held.capacity() > 0, "the response passed through the held buffer");
        // Nothing more comes: the next read waits, and the buffer goes.
        let mut one = [0u8; 1];
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), b.read(&mut one)).await;
        assert!(waited.is_err(), "nothing was sent, so the read should wait");
        assert_eq!(b.held.capacity(), 0);
        // The next response still reads whole.
        server.write_all(b"* 2 EXISTS\r\n").await.unwrap();
        let mut line = [0u8; 12];
        b.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"* 2 EXISTS\r\n");
    }

    #[test]
    fn starts_are_quoted_in_words() {
        let l = limits();
        let mut b = Bounded::new((), l.clone());
        b.scan(b"SSH-2.0-OpenSSH\x00\xff\r\n").unwrap();
        assert_eq!(l.current_start(), "\"SSH-2.0-OpenSSH\\x00\\xff\"");
    }
}
