//! A TCP proxy in front of an IMAP server that records every command the
//! client sends, so a test can check what the engine asked for (e.g. that an
//! unchanged account costs no FETCH), and can cut every connection at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{HarnessError, Result};

/// One command as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImapCommand {
    /// Which proxied connection sent it (1, 2, ... in accept order).
    pub connection: u64,
    /// The command's name, upper case; `UID FETCH`, `UID SEARCH`, ... for
    /// UID commands, `DONE` for the end of an IDLE.
    pub verb: String,
    /// The whole line (literals left out, LOGIN passwords hidden).
    pub line: String,
}

#[derive(Debug, Default)]
struct Shared {
    commands: Mutex<Vec<ImapCommand>>,
    open: Mutex<Vec<TcpStream>>,
    connections: AtomicU64,
    closed: AtomicBool,
    /// New connections wait for the upstream (no greeting) while this is set.
    hold: AtomicBool,
    /// A command line containing this text cuts its connection instead of
    /// reaching the server.
    cut_on: Mutex<Option<String>>,
}

/// A recording proxy on a free loopback port in front of `127.0.0.1:<upstream>`.
/// Stops accepting on drop (open connections are cut).
#[derive(Debug)]
pub struct ImapProxy {
    port: u16,
    shared: Arc<Shared>,
}

impl ImapProxy {
    /// Starts the proxy in front of `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(HarnessError::io("bind the IMAP proxy"))?;
        let port = listener.local_addr().map_err(HarnessError::io("bind the IMAP proxy"))?.port();
        let shared = Arc::new(Shared::default());
        let accept_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("imap-proxy-{port}"))
            .spawn(move || accept_loop(listener, upstream_port, accept_shared))
            .map_err(HarnessError::io("start the IMAP proxy thread"))?;
        Ok(Self { port, shared })
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every command recorded so far, in the order they were sent.
    pub fn commands(&self) -> Vec<ImapCommand> {
        self.shared.commands.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many logins were tried (LOGIN and AUTHENTICATE commands).
    pub fn logins(&self) -> usize {
        self.count("LOGIN") + self.count("AUTHENTICATE")
    }

    /// How many recorded commands have this verb (e.g. `"UID FETCH"`, `"STATUS"`).
    pub fn count(&self, verb: &str) -> usize {
        self.shared.commands.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|c| c.verb == verb).count()
    }

    /// Forgets the commands recorded so far.
    pub fn clear(&self) {
        self.shared.commands.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// How many connections the proxy has accepted.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// While `on`, new connections get no greeting: they are accepted but
    /// wait before the proxy connects upstream (a client's first login, and
    /// so its first write, is held back). Open connections are not touched.
    pub fn hold_new(&self, on: bool) {
        self.shared.hold.store(on, Ordering::Relaxed);
    }

    /// While `Some(text)`, a command whose line contains `text` cuts its
    /// connection instead of reaching the server: a server that breaks the
    /// connection whenever, say, one folder is selected.
    pub fn cut_on(&self, text: Option<&str>) {
        *self.shared.cut_on.lock().unwrap_or_else(|p| p.into_inner()) = text.map(str::to_owned);
    }

    /// Cuts every open connection (both directions), as a network failure would.
    pub fn cut_all(&self) {
        for stream in self.shared.open.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for ImapProxy {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.cut_all();
        // Wake the accept loop so it sees `closed`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept_loop(listener: TcpListener, upstream_port: u16, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = client else { continue };
        while shared.hold.load(Ordering::Relaxed) && !shared.closed.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let connection = shared.connections.fetch_add(1, Ordering::Relaxed) + 1;
        let clones = (client.try_clone(), server.try_clone(), client.try_clone(), server.try_clone());
        let (Ok(client_read), Ok(server_write), Ok(client_keep), Ok(server_keep)) = clones else {
            continue;
        };
        shared.open.lock().unwrap_or_else(|p| p.into_inner()).extend([client_keep, server_keep]);
        let downstream = (server, client);
        let _ = std::thread::Builder::new().name("imap-proxy-down".into()).spawn(move || {
            let (mut from, mut to) = downstream;
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
        let record = Arc::clone(&shared);
        let _ = std::thread::Builder::new()
            .name("imap-proxy-up".into())
            .spawn(move || relay_commands(client_read, server_write, connection, &record));
    }
}

/// Copies client -> server line by line, recording each command; literals
/// (`{n}` / `{n+}` at a line's end) are copied through unread.
fn relay_commands(client: TcpStream, mut server: TcpStream, connection: u64, shared: &Shared) {
    let mut reader = BufReader::new(client);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // Recorded before it is sent: once the server's answer reaches the
        // client, the command is in the record.
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        if let Some(command) = parse_command(connection, &text) {
            shared.commands.lock().unwrap_or_else(|p| p.into_inner()).push(command);
        }
        let cut = shared.cut_on.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|t| text.contains(t));
        if cut {
            let _ = (reader.get_ref().shutdown(Shutdown::Both), server.shutdown(Shutdown::Both));
            return;
        }
        if server.write_all(&line).is_err() {
            break;
        }
        if let Some(len) = trailing_literal(&text) {
            if std::io::copy(&mut (&mut reader).take(len), &mut server).map_or(true, |n| n < len) {
                break;
            }
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// A literal announced at a line's end.
fn trailing_literal(line: &str) -> Option<u64> {
    let inner = line.strip_suffix('}')?;
    inner[inner.rfind('{')? + 1..].trim_end_matches('+').parse().ok()
}

/// `tag VERB ...` -> the command; `DONE` ends an IDLE; continuation data
/// (e.g. AUTHENTICATE responses, literal tails) are not commands.
fn parse_command(connection: u64, line: &str) -> Option<ImapCommand> {
    if line.eq_ignore_ascii_case("DONE") {
        return Some(ImapCommand { connection, verb: "DONE".into(), line: line.into() });
    }
    let mut words = line.split(' ');
    let _tag = words.next().filter(|t| !t.is_empty())?;
    let verb = words.next()?.to_ascii_uppercase();
    if !verb.chars().all(|c| c.is_ascii_alphabetic()) || verb.is_empty() {
        return None;
    }
    let verb = if verb == "UID" { format!("UID {}", words.next()?.to_ascii_uppercase()) } else { verb };
    let tag = line.split(' ').next().unwrap_or_default();
    let line = match verb.as_str() {
        "LOGIN" => format!("{tag} LOGIN {} <password>", line.split(' ').nth(2).unwrap_or_default()),
        // SASL-IR: the mechanism stays, the credentials go.
        "AUTHENTICATE" => match line.split(' ').nth(3) {
            Some(_) => format!("{tag} AUTHENTICATE {} <initial response>", line.split(' ').nth(2).unwrap_or_default()),
            None => line.to_owned(),
        },
        _ => line.to_owned(),
    };
    Some(ImapCommand { connection, verb, line })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_named_with_their_uid_prefix_and_passwords_hidden() {
        let c = parse_command(1, "a3 uid fetch 1:* (FLAGS)").expect("a command");
        assert_eq!(c.verb, "UID FETCH");
        let login = parse_command(1, "a1 LOGIN alice s3cret").expect("a command");
        assert_eq!((login.verb.as_str(), login.line.as_str()), ("LOGIN", "a1 LOGIN alice <password>"));
        let plain = parse_command(1, "a1 AUTHENTICATE PLAIN AGFsaWNlAHNlY3JldA==").expect("a command");
        assert_eq!(plain.line, "a1 AUTHENTICATE PLAIN <initial response>");
        assert_eq!(parse_command(1, "a1 AUTHENTICATE PLAIN").expect("a command").line, "a1 AUTHENTICATE PLAIN");
        assert_eq!(parse_command(1, "DONE").expect("done").verb, "DONE");
        assert_eq!(parse_command(1, "AGFsaWNlAHNlY3JldA=="), None, "an AUTHENTICATE response is no command");
        assert_eq!(trailing_literal("a APPEND INBOX {310+}"), Some(310));
    }
}
