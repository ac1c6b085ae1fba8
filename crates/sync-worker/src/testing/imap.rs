//! A small blocking IMAP client over a plain TCP stream, for tests that
//! check what a real client sees (and for appending mail fast).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{Appended, HarnessError, Result};

/// How long one read may wait for the server.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Most messages [`ImapSession::append_many`] puts in one MULTIAPPEND
/// (RFC 3502): Dovecot saves one command's messages in one transaction,
/// ten times faster than one APPEND each.
const MULTIAPPEND_MESSAGES: usize = 250;
/// Most bytes of mail in one MULTIAPPEND.
const MULTIAPPEND_BYTES: usize = 16 << 20;

/// The answer to one command: the untagged lines (literals inlined) and the
/// tagged status line without its tag (`OK ...`, `NO ...`, `BAD ...`).
#[derive(Debug, Clone)]
pub struct ImapReply {
    /// Untagged (`* ...`) and continuation lines, in order, without CRLF.
    pub untagged: Vec<String>,
    /// The tagged completion without the tag, e.g. `OK [READ-WRITE] Select completed`.
    pub status: String,
}

impl ImapReply {
    /// Whether the command completed with `OK`.
    pub fn is_ok(&self) -> bool {
        self.status.starts_with("OK")
    }

    /// The untagged lines that start with `* <kind> ` (kind compared case-insensitively).
    pub fn lines_of<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.untagged.iter().map(String::as_str).filter(move |line| {
            line.strip_prefix("* ")
                .and_then(|rest| rest.get(..kind.len()))
                .is_some_and(|word| word.eq_ignore_ascii_case(kind))
        })
    }
}

/// One IMAP connection, command by command.
#[derive(Debug)]
pub struct ImapSession {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    next_tag: u64,
    greeting: String,
    idle_tag: Option<String>,
}

impl ImapSession {
    /// Connects to `127.0.0.1:port` and reads the greeting.
    pub fn connect(port: u16) -> Result<Self> {
        let what = format!("connect to IMAP at 127.0.0.1:{port}");
        let stream = TcpStream::connect(("127.0.0.1", port)).map_err(HarnessError::io(what.clone()))?;
        stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(HarnessError::io(what.clone()))?;
        stream.set_nodelay(true).map_err(HarnessError::io(what.clone()))?;
        let writer = stream.try_clone().map_err(HarnessError::io(what))?;
        let mut session =
            Self { reader: BufReader::new(stream), writer, next_tag: 1, greeting: String::new(), idle_tag: None };
        // Dovecot says "* OK Waiting for authentication process to respond.."
        // first when its auth process is still starting, then greets.
        loop {
            let line = session.read_line()?;
            if !line.starts_with("* OK") {
                return Err(HarnessError::Unexpected { what: format!("IMAP greeting on port {port}"), answer: line });
            }
            if !line.contains("Waiting for authentication") {
                session.greeting = line;
                return Ok(session);
            }
        }
    }

    /// Connects and logs in with LOGIN.
    pub fn login(port: u16, user: &str, password: &str) -> Result<Self> {
        let mut session = Self::connect(port)?;
        session.ok(&format!("LOGIN {} {}", quote(user)?, quote(password)?))?;
        Ok(session)
    }

    /// The server's greeting line.
    pub fn greeting(&self) -> &str {
        &self.greeting
    }

    /// Sends one command (without tag or CRLF) and reads its whole answer.
    pub fn command(&mut self, command: &str) -> Result<ImapReply> {
        let tag = self.send(command.as_bytes(), &[])?;
        self.read_reply(&tag)
    }

    /// Like [`command`](Self::command), but anything other than `OK` is an error.
    pub fn ok(&mut self, command: &str) -> Result<ImapReply> {
        let reply = self.command(command)?;
        if reply.is_ok() {
            Ok(reply)
        } else {
            Err(HarnessError::Unexpected { what: format!("IMAP {}", redact(command)), answer: reply.status })
        }
    }

    /// APPENDs one message to `folder` with the given flags (e.g. `\Seen`).
    pub fn append(&mut self, folder: &str, flags: &[&str], message: &[u8]) -> Result<Appended> {
        let mut done = self.append_many(folder, flags, std::iter::once(message))?;
        done.pop().ok_or_else(|| HarnessError::Unexpected { what: "APPEND".into(), answer: "no answer".into() })
    }

    /// APPENDs one message with an INTERNALDATE of `internal_date` (seconds
    /// since the Unix epoch, UTC) instead of now.
    pub fn append_at(&mut self, folder: &str, flags: &[&str], internal_date: i64, message: &[u8]) -> Result<Appended> {
        let command = format!(
            "APPEND {} ({}) \"{}\" {{{}+}}\r\n",
            quote(folder)?,
            flags.join(" "),
            imap_date_time(internal_date),
            message.len()
        );
        let tag = self.send(command.as_bytes(), message)?;
        let reply = self.read_reply(&tag)?;
        parse_appenduid(&reply)
            .ok_or_else(|| HarnessError::Unexpected { what: format!("APPEND to {folder}"), answer: reply.status })
    }

    /// APPENDs many messages to `folder`, in order, in MULTIAPPEND commands
    /// (LITERAL+) of up to 250 messages each.
    pub fn append_many<'m>(
        &mut self,
        folder: &str,
        flags: &[&str],
        messages: impl IntoIterator<Item = &'m [u8]>,
    ) -> Result<Vec<Appended>> {
        let flags = format!("({})", flags.join(" "));
        let mut appended = Vec::new();
        let mut messages = messages.into_iter().peekable();
        let mut command = Vec::new();
        while messages.peek().is_some() {
            command.clear();
            command.extend_from_slice(format!("APPEND {}", quote(folder)?).as_bytes());
            let mut count = 0;
            while let Some(message) =
                messages.next_if(|_| count < MULTIAPPEND_MESSAGES && command.len() < MULTIAPPEND_BYTES)
            {
                command.extend_from_slice(format!(" {flags} {{{}+}}\r\n", message.len()).as_bytes());
                command.extend_from_slice(message);
                count += 1;
            }
            let tag = self.send(&command, &[])?;
            let reply = self.read_reply(&tag)?;
            let uids = parse_appenduids(&reply).filter(|(_, uids)| uids.len() == count).ok_or_else(|| {
                HarnessError::Unexpected {
                    what: format!("APPEND of {count} messages to {folder}"),
                    answer: reply.status.clone(),
                }
            })?;
            let (uid_validity, uids) = uids;
            appended.extend(uids.into_iter().map(|uid| Appended { uid_validity, uid }));
        }
        Ok(appended)
    }

    /// Enters IDLE and waits for the server's `+ idling`.
    pub fn idle_start(&mut self) -> Result<()> {
        let tag = self.send(b"IDLE", &[])?;
        let line = self.read_line()?;
        if !line.starts_with('+') {
            return Err(HarnessError::Unexpected { what: "IDLE".into(), answer: line });
        }
        self.idle_tag = Some(tag);
        Ok(())
    }

    /// While idling: the next untagged line, or `None` when nothing came within `wait`.
    pub fn idle_wait(&mut self, wait: Duration) -> Result<Option<String>> {
        let set = |stream: &TcpStream, timeout| {
            stream.set_read_timeout(Some(timeout)).map_err(HarnessError::io("set an IMAP read timeout"))
        };
        set(self.reader.get_ref(), wait.max(Duration::from_millis(1)))?;
        let line = self.read_line();
        set(self.reader.get_ref(), READ_TIMEOUT)?;
        match line {
            Ok(line) => Ok(Some(line)),
            Err(HarnessError::Io { source, .. })
                if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Ends IDLE (`DONE`) and returns what came before its completion.
    pub fn idle_done(&mut self) -> Result<ImapReply> {
        let tag = self.idle_tag.take().ok_or_else(|| HarnessError::Invalid("idle_done without idle_start".into()))?;
        self.writer.write_all(b"DONE\r\n").map_err(HarnessError::io("end IDLE"))?;
        self.read_reply(&tag)
    }

    /// Logs out (best effort: the connection closes either way).
    pub fn logout(mut self) {
        let _ = self.command("LOGOUT");
    }

    /// Writes `tag command [literal]\r\n` and returns the tag.
    fn send(&mut self, command: &[u8], literal: &[u8]) -> Result<String> {
        let tag = format!("t{}", self.next_tag);
        self.next_tag += 1;
        let mut buf = Vec::with_capacity(tag.len() + command.len() + literal.len() + 3);
        buf.extend_from_slice(tag.as_bytes());
        buf.push(b' ');
        buf.extend_from_slice(command);
        buf.extend_from_slice(literal);
        buf.extend_from_slice(b"\r\n");
        self.writer.write_all(&buf).map_err(HarnessError::io("write an IMAP command"))?;
        Ok(tag)
    }

    fn read_reply(&mut self, tag: &str) -> Result<ImapReply> {
        let mut untagged = Vec::new();
        loop {
            let line = self.read_line()?;
            if let Some(status) = line.strip_prefix(tag).and_then(|rest| rest.strip_prefix(' ')) {
                return Ok(ImapReply { untagged, status: status.to_owned() });
            }
            untagged.push(line);
        }
    }

    /// One logical line: literals (`{n}`) are read and inlined.
    fn read_line(&mut self) -> Result<String> {
        let mut line = Vec::new();
        loop {
            let start = line.len();
            let n = self.reader.read_until(b'\n', &mut line).map_err(HarnessError::io("read from IMAP"))?;
            if n == 0 {
                return Err(HarnessError::Unexpected {
                    what: "read from IMAP".into(),
                    answer: format!("connection closed after {:?}", String::from_utf8_lossy(&line)),
                });
            }
            while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                line.pop();
            }
            match literal_len(&line[start..]) {
                Some(len) => {
                    let mut literal = vec![0; len];
                    self.reader.read_exact(&mut literal).map_err(HarnessError::io("read an IMAP literal"))?;
                    line.extend_from_slice(b"\r\n");
                    line.extend_from_slice(&literal);
                }
                None => return Ok(String::from_utf8_lossy(&line).into_owned()),
            }
        }
    }
}

/// The length of a literal announced at the end of a line (`... {123}`).
fn literal_len(line: &[u8]) -> Option<usize> {
    let open = line.strip_suffix(b"}")?;
    let at = open.iter().rposition(|b| *b == b'{')?;
    std::str::from_utf8(&open[at + 1..]).ok()?.trim_end_matches('+').parse().ok()
}

/// `[APPENDUID <uidvalidity> <uid>]` from an APPEND's completion.
fn parse_appenduid(reply: &ImapReply) -> Option<Appended> {
    match parse_appenduids(reply)? {
        (uid_validity, uids) if uids.len() == 1 => Some(Appended { uid_validity, uid: uids[0] }),
        _ => None,
    }
}

/// `[APPENDUID <uidvalidity> <uid-set>]` (`7`, `1:250`, `3,5:6`) from a
/// (MULTI)APPEND's completion, the set expanded in order.
fn parse_appenduids(reply: &ImapReply) -> Option<(u32, Vec<u32>)> {
    if !reply.is_ok() {
        return None;
    }
    let rest = &reply.status[reply.status.find("[APPENDUID ")? + "[APPENDUID ".len()..];
    let mut words = rest.split([' ', ']']);
    let uid_validity = words.next()?.parse().ok()?;
    let mut uids = Vec::new();
    for range in words.next()?.split(',') {
        match range.split_once(':') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                uids.extend(a.min(b)..=a.max(b));
            }
            None => uids.push(range.parse().ok()?),
        }
    }
    Some((uid_validity, uids))
}

/// An IMAP `date-time` (RFC 3501): `01-Jan-2024 10:00:00 +0000`.
fn imap_date_time(unix_seconds: i64) -> String {
    // mail-builder's RFC 5322 form is `Mon, 1 Jan 2024 10:00:00 +0000`.
    let rfc822 = mail_builder::headers::date::Date::new(unix_seconds).to_rfc822();
    let parts: Vec<&str> = rfc822.split_whitespace().collect();
    match parts.as_slice() {
        [_, day, month, year, time, zone] => format!("{:0>2}-{month}-{year} {time} {zone}", day),
        _ => rfc822,
    }
}

/// An IMAP quoted string; folder and user names here are ASCII.
pub(crate) fn quote(s: &str) -> Result<String> {
    if !s.is_ascii() || s.contains(['\r', '\n']) {
        return Err(HarnessError::Invalid(format!(
            "{s:?} cannot be sent as an IMAP quoted string: use ASCII without line breaks \
             (non-ASCII folder names need modified UTF-7)"
        )));
    }
    Ok(format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
}

/// A command with the password of a LOGIN hidden, for error messages.
fn redact(command: &str) -> String {
    match command.get(..6) {
        Some(verb) if verb.eq_ignore_ascii_case("LOGIN ") => {
            let user = command[6..].split(' ').next().unwrap_or_default();
            format!("LOGIN {user} <password>")
        }
        _ => command.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_lengths_are_read_from_line_ends() {
        assert_eq!(literal_len(b"* 1 FETCH (BODY[] {42}"), Some(42));
        assert_eq!(literal_len(b"a APPEND INBOX {7+}"), Some(7));
        assert_eq!(literal_len(b"* OK done"), None);
        assert_eq!(literal_len(b"* OK {x}"), None);
    }

    #[test]
    fn appenduid_is_parsed_from_the_completion() {
        let reply = ImapReply { untagged: vec![], status: "OK [APPENDUID 1796113302 17] Append completed.".into() };
        assert_eq!(parse_appenduid(&reply), Some(Appended { uid_validity: 1796113302, uid: 17 }));
        let multi = ImapReply { untagged: vec![], status: "OK [APPENDUID 9 3,5:7] Append completed.".into() };
        assert_eq!(parse_appenduids(&multi), Some((9, vec![3, 5, 6, 7])));
        assert_eq!(parse_appenduid(&multi), None, "one message, one UID");
        let no = ImapReply { untagged: vec![], status: "NO [TRYCREATE] Mailbox doesn't exist".into() };
        assert_eq!(parse_appenduid(&no), None);
    }

    #[test]
    fn internal_dates_use_the_imap_form() {
        assert_eq!(imap_date_time(1_704_067_200), "01-Jan-2024 00:00:00 +0000");
        assert_eq!(imap_date_time(1_718_454_645), "15-Jun-2024 12:30:45 +0000");
    }

    #[test]
    fn quoting_escapes_and_refuses_non_ascii() {
        assert_eq!(quote(r#"a"b\c"#).expect("ascii"), r#""a\"b\\c""#);
        assert!(quote("Entwürfe").is_err());
        assert_eq!(redact("LOGIN alice secret"), "LOGIN alice <password>");
    }
}
