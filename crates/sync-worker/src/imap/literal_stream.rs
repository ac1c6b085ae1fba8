//! A `UID FETCH` of body sections read straight off the socket, so that a
//! section's literal can be handed on in chunks as it arrives.
//!
//! **Why not async-imap.** async-imap reads a whole FETCH response,
//! literal and all, into its buffer before the caller sees a byte: a 50 MB
//! attachment is 68 MB of base64 held at once (and the framing refuses a
//! literal over `MAX_LITERAL` outright). The API's transient connection
//! logs in and EXAMINEs with async-imap, then, once the tagged OK of
//! EXAMINE has been read, speaks FETCH through [`Conn`] on the socket
//! beneath it.
//!
//! **What is read.** After `Lnn UID FETCH <uid> (UID BODY.PEEK[<s>] ...)`
//! the server sends untagged responses, then the tagged answer. A
//! response is read a segment at a time: a line, and when the line ends in
//! a literal announcement (`{123}`), the literal, after which the same
//! response goes on with another line. Segments are tokenized (atoms,
//! `BODY[...]` with spaces inside its brackets, quoted strings, lists) and
//! the FETCH items at the top level of the response are followed:
//! * a `BODY[<s>]` of a section asked for, in a response whose `UID` (if
//!   it came first) is ours, is reported: `NIL`, a quoted string, or a
//!   literal whose bytes the caller then reads at its own pace;
//! * everything else is skipped as it passes, literals included, without
//!   being kept: unsolicited FETCHes of other messages (flag changes),
//!   EXISTS, EXPUNGE, `* OK [...]`;
//! * the tagged answer ends the command: OK, or NO / BAD (refused).
//!
//! A message the server no longer has gets no FETCH response (or `NIL`).
//!
//! **Bounds.** A hostile server costs little: a line is at most
//! [`MAX_LINE`] bytes (the bytes of an unfinished line are all that is
//! held); what is read besides the literals handed on is at most
//! [`COMMAND_BUDGET`] per command; a section handed on in chunks is at
//! most [`MAX_STREAMED`]; a section collected whole is at most what the
//! caller allows. Every read has the command timeout of its own, so a
//! long transfer that keeps moving is never cut, and a silent server is.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::framing::{literal_size, FramingError, COMMAND_BUDGET, MAX_LINE};
use super::transport::ConnectError;

/// The most bytes one chunk of a streamed section holds.
pub const CHUNK: usize = 64 << 10;
/// The largest section handed on in chunks. It costs no memory, so the
/// bound is loose: it only ends a server that would send forever.
pub const MAX_STREAMED: u64 = 1 << 30;

/// The step named in errors.
const STEP: &str = "UID FETCH";

/// Why a FETCH failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The connection failed, timed out, passed a limit or did not speak IMAP.
    #[error("the IMAP connection failed")]
    Connection(#[source] ConnectError),
    /// The server answered the command with NO or BAD.
    #[error("the server refused the command: {answer}")]
    Refused {
        /// Its answer (`NO ...` or `BAD ...`).
        answer: String,
    },
}

impl From<ConnectError> for WireError {
    fn from(e: ConnectError) -> Self {
        WireError::Connection(e)
    }
}

/// The value of a `BODY[<section>]` item.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    /// `NIL`: the server has no such section.
    Nil,
    /// A quoted string (a short section).
    Quoted(Vec<u8>),
    /// A literal of this many bytes, which come next on the wire.
    Literal(u64),
}

/// What the reading of a command's answer found.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// The section asked for at this index, of our message.
    Body { index: usize, value: Value },
    /// The tagged answer: OK, or the NO / BAD line.
    Done(Result<(), String>),
}

/// One token of a response segment.
#[derive(Debug, PartialEq, Eq)]
enum Token {
    Open,
    Close,
    Atom(Vec<u8>),
    Quoted(Vec<u8>),
    /// The literal the segment ends with: its size.
    Literal(u64),
}

/// The tokens of one segment (`line` without its CRLF); the literal it
/// announces, if any, comes last.
fn tokens(line: &[u8]) -> Result<Vec<Token>, FramingError> {
    let literal = literal_size(line)?;
    let mut text = line.strip_suffix(b"\n").unwrap_or(line);
    text = text.strip_suffix(b"\r").unwrap_or(text);
    if literal.is_some() {
        let open = text.iter().rposition(|b| *b == b'{').unwrap_or(0);
        text = &text[..open];
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b' ' => i += 1,
            b'(' => {
                out.push(Token::Open);
                i += 1;
            }
            b')' => {
                out.push(Token::Close);
                i += 1;
            }
            b'"' => {
                let mut s = Vec::new();
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    if text[i] == b'\\' && i + 1 < text.len() {
                        i += 1;
                    }
                    s.push(text[i]);
                    i += 1;
                }
                i += 1;
                out.push(Token::Quoted(s));
            }
            _ => {
                // An atom; `BODY[HEADER.FIELDS (A B)]<0>` keeps its brackets whole.
                let start = i;
                let mut bracket = false;
                while i < text.len() {
                    match text[i] {
                        b'[' => bracket = true,
                        b']' => bracket = false,
                        b' ' | b'(' | b')' if !bracket => break,
                        _ => {}
                    }
                    i += 1;
                }
                out.push(Token::Atom(text[start..i].to_vec()));
            }
        }
    }
    if let Some(size) = literal {
        out.push(Token::Literal(size));
    }
    Ok(out)
}

/// What the next token at the top level of a FETCH response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// An item's name.
    Name,
    /// The value of `UID`.
    Uid,
    /// The value of a `BODY[...]`: the index of the section asked for, if it is one.
    Body(Option<usize>),
    /// The value of an item of no interest.
    Skip,
}

/// A response read so far (its last segment ended in a literal).
#[derive(Debug)]
enum Response {
    /// A FETCH: how deep in its lists, what comes next, and its UID once seen.
    Fetch { depth: u32, expect: Expect, uid: Option<u32> },
    /// Anything else untagged.
    Other,
}

/// A raw IMAP connection in the selected state, reading FETCH answers
/// itself. `S` is the socket (or, in tests, an in-memory stream).
#[derive(Debug)]
pub struct Conn<S> {
    io: S,
    /// Bytes read: `buf[pos..]` are not consumed yet.
    buf: Vec<u8>,
    pos: usize,
    timeout: Duration,
    /// The number of the next tag (`L1`, `L2`, ...: never one of async-imap's `A`s).
    next_tag: u32,
    /// Bytes read since our last command, besides the literals handed on.
    spent: u64,
    /// The response in progress, when the next line continues it.
    response: Option<Response>,
    /// Literal bytes still to come.
    literal_left: u64,
    /// Events read but not yet taken.
    events: VecDeque<Event>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Takes over `io` (after a tagged answer); `held` are bytes already
    /// read from it and not yet parsed; `timeout` bounds every read and write.
    pub fn new(io: S, held: Vec<u8>, timeout: Duration) -> Self {
        Self {
            io,
            buf: held,
            pos: 0,
            timeout,
            next_tag: 1,
            spent: 0,
            response: None,
            literal_left: 0,
            events: VecDeque::new(),
        }
    }

    /// Reads more from the socket (at least one byte).
    async fn fill(&mut self) -> Result<(), ConnectError> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos >= CHUNK {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let start = self.buf.len();
        self.buf.resize(start + CHUNK, 0);
        let read = tokio::time::timeout(self.timeout, self.io.read(&mut self.buf[start..])).await;
        let n = match read {
            Err(_) => Err(ConnectError::Timeout { step: STEP, after: self.timeout }),
            Ok(Err(source)) => Err(ConnectError::Io { step: STEP, source }),
            Ok(Ok(0)) => Err(ConnectError::Closed { step: STEP, said: None }),
            Ok(Ok(n)) => Ok(n),
        };
        self.buf.truncate(start + *n.as_ref().unwrap_or(&0));
        n.map(drop)
    }

    /// Counts `n` bytes read against the command's budget.
    fn spend(&mut self, n: usize) -> Result<(), ConnectError> {
        self.spent += n as u64;
        if self.spent > COMMAND_BUDGET {
            return Err(ConnectError::Limit(FramingError::Flood { limit: COMMAND_BUDGET }));
        }
        Ok(())
    }

    /// The next line, CRLF included, at most [`MAX_LINE`] bytes.
    async fn line(&mut self) -> Result<Vec<u8>, ConnectError> {
        let mut scanned = 0;
        loop {
            let open = &self.buf[self.pos..];
            if let Some(i) = open[scanned..].iter().position(|b| *b == b'\n') {
                let end = scanned + i + 1;
                if end > MAX_LINE {
                    return Err(ConnectError::Limit(FramingError::LineTooLong { limit: MAX_LINE }));
                }
                let line = open[..end].to_vec();
                self.pos += end;
                self.spend(end)?;
                return Ok(line);
            }
            scanned = open.len();
            if scanned > MAX_LINE {
                return Err(ConnectError::Limit(FramingError::LineTooLong { limit: MAX_LINE }));
            }
            self.fill().await?;
        }
    }

    /// Up to `max` bytes of the literal being read (at least one).
    async fn literal_bytes(&mut self, max: usize) -> Result<Vec<u8>, ConnectError> {
        if self.pos == self.buf.len() {
            self.fill().await?;
        }
        let n = (self.buf.len() - self.pos).min(max).min(usize::try_from(self.literal_left).unwrap_or(usize::MAX));
        let bytes = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        self.literal_left -= n as u64;
        Ok(bytes)
    }

    /// Skips what is left of the current literal, counting it as spent.
    async fn skip_literal(&mut self) -> Result<(), ConnectError> {
        while self.literal_left > 0 {
            if self.pos == self.buf.len() {
                self.fill().await?;
            }
            let n = (self.buf.len() - self.pos).min(usize::try_from(self.literal_left).unwrap_or(usize::MAX));
            self.pos += n;
            self.literal_left -= n as u64;
            self.spend(n)?;
        }
        Ok(())
    }

    /// Sends `UID FETCH <uid> (UID BODY.PEEK[<s>] ...)`; returns its tag.
    async fn send_fetch(&mut self, uid: u32, sections: &[&str]) -> Result<String, ConnectError> {
        let tag = format!("L{}", self.next_tag);
        self.next_tag += 1;
        let items: String = sections.iter().map(|s| format!(" BODY.PEEK[{s}]")).collect();
        let command = format!("{tag} UID FETCH {uid} (UID{items})\r\n");
        let write = async {
            self.io.write_all(command.as_bytes()).await?;
            self.io.flush().await
        };
        match tokio::time::timeout(self.timeout, write).await {
            Err(_) => return Err(ConnectError::Timeout { step: STEP, after: self.timeout }),
            Ok(Err(source)) => return Err(ConnectError::Io { step: STEP, source }),
            Ok(Ok(())) => {}
        }
        self.spent = 0;
        Ok(tag)
    }

    /// The next event of the answer to command `tag` (for `uid`, asking
    /// for `sections`). The caller reads or skips a literal it is handed
    /// before asking again; what it leaves is skipped.
    async fn next_event(&mut self, tag: &str, uid: u32, sections: &[&str]) -> Result<Event, ConnectError> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(e);
            }
            self.skip_literal().await?;
            let line = self.line().await?;
            let not_imap = || ConnectError::NotImap { step: STEP, start: quote_start(&line) };
            let mut toks = tokens(&line).map_err(ConnectError::Limit)?.into_iter().peekable();
            let mut response = match self.response.take() {
                Some(r) => r,
                None => match toks.next() {
                    Some(Token::Atom(t)) if t == tag.as_bytes() => {
                        let status = match toks.next() {
                            Some(Token::Atom(s)) => s.to_ascii_uppercase(),
                            _ => return Err(not_imap()),
                        };
                        if status == b"OK" {
                            return Ok(Event::Done(Ok(())));
                        }
                        let line = String::from_utf8_lossy(&line);
                        let answer = line.trim_end().strip_prefix(tag).unwrap_or(&line).trim().to_string();
                        return Ok(Event::Done(Err(answer)));
                    }
                    Some(Token::Atom(star)) if star == b"*" => {
                        let number = matches!(toks.peek(), Some(Token::Atom(n)) if n.iter().all(u8::is_ascii_digit));
                        if number {
                            toks.next();
                        }
                        match toks.peek() {
                            Some(Token::Atom(f)) if number && f.eq_ignore_ascii_case(b"FETCH") => {
                                toks.next();
                                Response::Fetch { depth: 0, expect: Expect::Name, uid: None }
                            }
                            _ => Response::Other,
                        }
                    }
                    _ => return Err(not_imap()),
                },
            };
            let mut literal = None;
            for t in toks {
                if let Token::Literal(size) = t {
                    literal = Some(size);
                    break;
                }
                if let Response::Fetch { depth, expect, uid: seen } = &mut response {
                    self.events.extend(item(depth, expect, seen, t, uid, sections));
                }
            }
            let Some(size) = literal else { continue };
            self.literal_left = size;
            if let Response::Fetch { depth: 1, expect: Expect::Body(Some(index)), uid: seen } = &response {
                if seen.is_none_or(|u| u == uid) {
                    self.events.push_back(Event::Body { index: *index, value: Value::Literal(size) });
                }
            }
            if let Response::Fetch { depth: 1, expect, .. } = &mut response {
                *expect = Expect::Name;
            }
            self.response = Some(response);
        }
    }

    /// The answer to a FETCH of `sections`, each collected whole (at most
    /// `max` bytes): `None` when the message is gone, `None` for a section
    /// the server has no value for.
    pub async fn fetch_whole(
        &mut self,
        uid: u32,
        sections: &[&str],
        max: u64,
    ) -> Result<Option<Vec<Option<Vec<u8>>>>, WireError> {
        let tag = self.send_fetch(uid, sections).await?;
        let mut found = vec![None; sections.len()];
        let mut any = false;
        loop {
            match self.next_event(&tag, uid, sections).await? {
                Event::Done(Ok(())) => return Ok(any.then_some(found)),
                Event::Done(Err(answer)) => return Err(WireError::Refused { answer }),
                Event::Body { index, value } => {
                    any = true;
                    found[index] = match value {
                        Value::Nil => None,
                        Value::Quoted(bytes) => Some(bytes),
                        Value::Literal(size) if size > max => {
                            return Err(ConnectError::Limit(FramingError::LiteralTooLarge { size, limit: max }).into());
                        }
                        Value::Literal(size) => {
                            let mut bytes = Vec::with_capacity(size as usize);
                            while self.literal_left > 0 {
                                bytes.extend(self.literal_bytes(CHUNK).await?);
                            }
                            Some(bytes)
                        }
                    };
                }
            }
        }
    }

    /// A FETCH of `section`, whose bytes are then read in chunks from the
    /// [`Section`]; [`Fetched::Gone`] when the message or the section is not there.
    pub async fn fetch_streamed(mut self, uid: u32, section: &str) -> Result<Fetched<S>, WireError> {
        let tag = self.send_fetch(uid, &[section]).await?;
        let sections = [section];
        loop {
            match self.next_event(&tag, uid, &sections).await? {
                // No FETCH of ours, or `NIL`.
                Event::Done(Ok(())) => return Ok(Fetched::Gone(self)),
                Event::Done(Err(answer)) => return Err(WireError::Refused { answer }),
                Event::Body { value: Value::Nil, .. } => {}
                Event::Body { value: Value::Quoted(bytes), .. } => {
                    let size = bytes.len() as u64;
                    return Ok(Fetched::Found(Section {
                        conn: self,
                        tag,
                        uid,
                        size,
                        quoted: Some(bytes),
                        done: false,
                    }));
                }
                Event::Body { value: Value::Literal(size), .. } => {
                    if size > MAX_STREAMED {
                        let e = FramingError::LiteralTooLarge { size, limit: MAX_STREAMED };
                        return Err(ConnectError::Limit(e).into());
                    }
                    return Ok(Fetched::Found(Section { conn: self, tag, uid, size, quoted: None, done: false }));
                }
            }
        }
    }

    /// LOGOUT, best effort: the answer is awaited within the timeout, and
    /// the connection dropped either way.
    pub async fn logout(mut self) {
        let tag = format!("L{}", self.next_tag);
        let timeout = self.timeout;
        let bye = async {
            self.io.write_all(format!("{tag} LOGOUT\r\n").as_bytes()).await?;
            self.io.flush().await?;
            self.spent = 0;
            while !matches!(self.next_event(&tag, 0, &[]).await, Ok(Event::Done(_)) | Err(_)) {}
            Ok::<_, std::io::Error>(())
        };
        let _ = tokio::time::timeout(timeout, bye).await;
    }
}

/// Follows one token at the top level of a FETCH response: the event it
/// completes, if any.
fn item(
    depth: &mut u32,
    expect: &mut Expect,
    seen: &mut Option<u32>,
    t: Token,
    uid: u32,
    sections: &[&str],
) -> Option<Event> {
    match t {
        Token::Open => {
            *depth += 1;
            None
        }
        Token::Close => {
            *depth = depth.saturating_sub(1);
            if *depth == 1 {
                // A list value ended.
                *expect = Expect::Name;
            }
            None
        }
        Token::Literal(_) => None,
        Token::Atom(_) | Token::Quoted(_) if *depth != 1 => None,
        Token::Atom(a) if *expect == Expect::Name => {
            *expect = if a.eq_ignore_ascii_case(b"UID") {
                Expect::Uid
            } else if a.len() > 5 && a[..5].eq_ignore_ascii_case(b"BODY[") {
                let inside = &a[5..a.iter().rposition(|b| *b == b']').unwrap_or(a.len())];
                Expect::Body(sections.iter().position(|s| s.as_bytes().eq_ignore_ascii_case(inside)))
            } else {
                Expect::Skip
            };
            None
        }
        Token::Atom(a) if *expect == Expect::Uid => {
            *expect = Expect::Name;
            *seen = std::str::from_utf8(&a).ok().and_then(|s| s.parse().ok());
            None
        }
        t => {
            let was = std::mem::replace(expect, Expect::Name);
            let Expect::Body(Some(index)) = was else { return None };
            if seen.is_some_and(|u| u != uid) {
                return None;
            }
            match t {
                Token::Atom(a) if a.eq_ignore_ascii_case(b"NIL") => Some(Event::Body { index, value: Value::Nil }),
                Token::Quoted(s) => Some(Event::Body { index, value: Value::Quoted(s) }),
                _ => None,
            }
        }
    }
}

/// The start of `line` in words, as the framing quotes a response.
fn quote_start(line: &[u8]) -> String {
    let end = line.iter().position(|b| *b == b'\r' || *b == b'\n').unwrap_or(line.len()).min(80);
    let text: String = line[..end].iter().flat_map(|b| std::ascii::escape_default(*b)).map(char::from).collect();
    format!("\"{text}\"")
}

/// The answer to a streamed FETCH.
#[derive(Debug)]
pub enum Fetched<S> {
    /// The message (or the section) is not on the server; the command is over.
    Gone(Conn<S>),
    /// The section, to be read.
    Found(Section<S>),
}

/// A section being read in chunks off the connection.
#[derive(Debug)]
pub struct Section<S> {
    conn: Conn<S>,
    tag: String,
    uid: u32,
    size: u64,
    /// A section the server sent as a quoted string.
    quoted: Option<Vec<u8>>,
    done: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Section<S> {
    /// The section's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The next chunk (at most [`CHUNK`] bytes); `None` once the section is
    /// over and the command's tagged OK has been read.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        if let Some(bytes) = self.quoted.take() {
            return Ok(Some(bytes));
        }
        if self.conn.literal_left > 0 {
            return Ok(Some(self.conn.literal_bytes(CHUNK).await?));
        }
        if self.done {
            return Ok(None);
        }
        loop {
            // The rest of the response, and any after it, until the tagged answer.
            match self.conn.next_event(&self.tag, self.uid, &[]).await? {
                Event::Done(Ok(())) => break,
                Event::Done(Err(answer)) => return Err(WireError::Refused { answer }),
                Event::Body { .. } => {}
            }
        }
        self.done = true;
        Ok(None)
    }

    /// The connection, once [`Section::chunk`] has returned `None` (before
    /// that, the connection is in the middle of an answer: it is closed).
    pub async fn finish(self) {
        if self.done {
            self.conn.logout().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, AsyncBufReadExt as _, BufReader, DuplexStream};

    /// A server that checks the command it gets and answers with `script`'s
    /// pieces, each written on its own (so a test can split a response
    /// anywhere); then it reads until the client hangs up.
    fn scripted(expect: &'static str, script: Vec<Vec<u8>>) -> DuplexStream {
        let (client, server) = duplex(1 << 20);
        tokio::spawn(async move {
            let (read, mut write) = tokio::io::split(server);
            let mut read = BufReader::new(read);
            let mut command = String::new();
            read.read_line(&mut command).await.unwrap();
            assert_eq!(command, expect);
            for piece in script {
                write.write_all(&piece).await.unwrap();
                write.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            let mut rest = Vec::new();
            let _ = read.read_to_end(&mut rest).await;
        });
        client
    }

    fn conn(io: DuplexStream) -> Conn<DuplexStream> {
        Conn::new(io, Vec::new(), Duration::from_secs(5))
    }

    async fn streamed(fetched: Fetched<DuplexStream>) -> Result<Option<Vec<u8>>, WireError> {
        let Fetched::Found(mut s) = fetched else { return Ok(None) };
        let size = s.size();
        let mut all = Vec::new();
        while let Some(chunk) = s.chunk().await? {
            assert!(chunk.len() <= CHUNK);
            all.extend(chunk);
        }
        assert_eq!(all.len() as u64, size);
        Ok(Some(all))
    }

    const FETCH_2: &str = "L1 UID FETCH 7 (UID BODY.PEEK[2])\r\n";

    #[tokio::test]
    async fn a_literal_split_anywhere_comes_back_whole() {
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut wire = b"* 3 FETCH (UID 7 BODY[2] {200000}\r\n".to_vec();
        wire.extend(&body);
        wire.extend(b" FLAGS (\\Seen))\r\nL1 OK done\r\n");
        for split in [1, 7, 20, 31, 32, 33, 1000, 70_000] {
            let pieces: Vec<Vec<u8>> = wire.chunks(split).map(<[u8]>::to_vec).collect();
            let pieces =
                if split == 1 { pieces.into_iter().take(64).chain([wire[64..].to_vec()]).collect() } else { pieces };
            let got = streamed(conn(scripted(FETCH_2, pieces)).fetch_streamed(7, "2").await.unwrap()).await.unwrap();
            assert!(got.as_deref() == Some(&body[..]), "split every {split}");
        }
    }

    #[tokio::test]
    async fn unsolicited_responses_before_ours_are_skipped_literals_and_all() {
        let script = vec![
            b"* 5 EXISTS\r\n* 1 FETCH (FLAGS (\\Seen) UID 3 BODY[2] {5}\r\nother)\r\n".to_vec(),
            b"* 2 FETCH (UID 4 BODY[HEADER] {3}\r\nabc BODY[2] {4}\r\nnope)\r\n* OK [ALERT] hi {x}\r\n".to_vec(),
            b"* 3 FETCH (FLAGS (\\Flagged $x) BODY[2] {4}\r\nmine UID 7)\r\n* 4 EXPUNGE\r\nL1 OK done\r\n".to_vec(),
        ];
        let got = streamed(conn(scripted(FETCH_2, script)).fetch_streamed(7, "2").await.unwrap()).await.unwrap();
        assert_eq!(got.as_deref(), Some(&b"mine"[..]));
    }

    #[tokio::test]
    async fn nil_and_a_missing_message_are_gone() {
        let nil = vec![b"* 3 FETCH (UID 7 BODY[2] NIL)\r\nL1 OK done\r\n".to_vec()];
        let fetched = conn(scripted(FETCH_2, nil)).fetch_streamed(7, "2").await.unwrap();
        assert!(matches!(fetched, Fetched::Gone(_)));
        let missing = vec![b"* 9 FETCH (FLAGS ())\r\nL1 OK Fetch completed\r\n".to_vec()];
        let fetched = conn(scripted(FETCH_2, missing)).fetch_streamed(7, "2").await.unwrap();
        assert!(matches!(fetched, Fetched::Gone(_)));
        let quoted = vec![b"* 3 FETCH (UID 7 BODY[2] \"a \\\"q\\\"\")\r\nL1 OK done\r\n".to_vec()];
        let got = streamed(conn(scripted(FETCH_2, quoted)).fetch_streamed(7, "2").await.unwrap()).await.unwrap();
        assert_eq!(got.as_deref(), Some(&b"a \"q\""[..]));
    }

    #[tokio::test]
    async fn no_and_bad_are_refusals() {
        for answer in ["NO [EXPUNGEISSUED] Some messages were expunged", "BAD Error in IMAP command"] {
            let script = vec![format!("L1 {answer}\r\n").into_bytes()];
            let e = conn(scripted(FETCH_2, script)).fetch_streamed(7, "2").await.unwrap_err();
            assert!(matches!(&e, WireError::Refused { answer: a } if a == answer), "{e:?}");
        }
        // A refusal after the literal ends the section with an error.
        let script = vec![b"* 3 FETCH (UID 7 BODY[2] {2}\r\nab)\r\nL1 NO went away\r\n".to_vec()];
        let e = streamed(conn(scripted(FETCH_2, script)).fetch_streamed(7, "2").await.unwrap()).await.unwrap_err();
        assert!(matches!(e, WireError::Refused { .. }), "{e:?}");
    }

    #[tokio::test]
    async fn an_endless_line_is_cut_at_the_limit() {
        let (client, mut server) = duplex(1 << 16);
        tokio::spawn(async move {
            let mut command = [0u8; 64];
            let _ = server.read(&mut command).await;
            let junk = vec![b'x'; 1 << 16];
            while server.write_all(&junk).await.is_ok() {}
        });
        let e = conn(client).fetch_streamed(7, "2").await.unwrap_err();
        assert!(
            matches!(e, WireError::Connection(ConnectError::Limit(FramingError::LineTooLong { limit: MAX_LINE }))),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_silent_server_times_out_per_read() {
        let (client, _server) = duplex(1 << 16);
        let mut c = conn(client);
        c.timeout = Duration::from_millis(50);
        let e = c.fetch_streamed(7, "2").await.unwrap_err();
        assert!(matches!(e, WireError::Connection(ConnectError::Timeout { .. })), "{e:?}");
    }

    #[tokio::test]
    async fn sections_are_collected_whole_and_bounded() {
        let expect = "L1 UID FETCH 7 (UID BODY.PEEK[HEADER] BODY.PEEK[1.MIME] BODY.PEEK[1.2.MIME])\r\n";
        let script =
            vec![b"* 3 FETCH (UID 7 BODY[HEADER] {4}\r\nhead BODY[1.MIME] NIL BODY[1.2.MIME] {3}\r\nmim)\r\nL1 OK\r\n"
                .to_vec()];
        let mut c = conn(scripted(expect, script));
        let got = c.fetch_whole(7, &["HEADER", "1.MIME", "1.2.MIME"], 100).await.unwrap();
        assert_eq!(got, Some(vec![Some(b"head".to_vec()), None, Some(b"mim".to_vec())]));
        let script = vec![b"* 3 FETCH (UID 7 BODY[HEADER] {400}\r\n".to_vec()];
        let mut c = conn(scripted("L1 UID FETCH 7 (UID BODY.PEEK[HEADER])\r\n", script));
        let e = c.fetch_whole(7, &["HEADER"], 100).await.unwrap_err();
        assert!(matches!(e, WireError::Connection(ConnectError::Limit(FramingError::LiteralTooLarge { .. }))));
        let script = vec![b"L1 OK nothing\r\n".to_vec()];
        let mut c = conn(scripted("L1 UID FETCH 7 (UID BODY.PEEK[HEADER])\r\n", script));
        assert_eq!(c.fetch_whole(7, &["HEADER"], 100).await.unwrap(), None);
    }

    #[test]
    fn segments_are_tokenized() {
        let t = tokens(b"* 1 FETCH (BODY[HEADER.FIELDS (A B)]<0> \"x\\\"y\" FLAGS (\\Seen) BODY[] {12}\r\n").unwrap();
        assert_eq!(
            t,
            [
                Token::Atom(b"*".to_vec()),
                Token::Atom(b"1".to_vec()),
                Token::Atom(b"FETCH".to_vec()),
                Token::Open,
                Token::Atom(b"BODY[HEADER.FIELDS (A B)]<0>".to_vec()),
                Token::Quoted(b"x\"y".to_vec()),
                Token::Atom(b"FLAGS".to_vec()),
                Token::Open,
                Token::Atom(b"\\Seen".to_vec()),
                Token::Close,
                Token::Atom(b"BODY[]".to_vec()),
                Token::Literal(12),
            ]
        );
    }
}
