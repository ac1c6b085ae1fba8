//! A TCP proxy in front of an IMAP server that records every command the
//! client sends, so a test can check what the engine asked for (e.g. that an
//! unchanged account costs no FETCH), and can cut every connection at once.
//! It also records each connection's life (who logged in, from which
//! client process, when it opened and closed), so a test can check that no
//! two workers were connected for one account at the same moment.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// One proxied connection's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxiedSession {
    /// Which proxied connection (1, 2, ... in accept order).
    pub connection: u64,
    /// The user it logged in as (LOGIN's first argument), once it has.
    pub user: Option<String>,
    /// The client, as [`ImapProxy::identify_clients`] named it.
    pub client: Option<String>,
    /// When the proxy accepted it.
    pub opened: Instant,
    /// When the client closed its side (or the proxy cut it).
    pub closed: Option<Instant>,
}

impl ProxiedSession {
    /// Whether the two were open at one moment.
    pub fn overlaps(&self, other: &ProxiedSession) -> bool {
        let now = Instant::now();
        self.opened < other.closed.unwrap_or(now) && other.opened < self.closed.unwrap_or(now)
    }
}

/// Names the client process of a connection from its two ends: the
/// client's address (the peer, as the proxy sees it) and the proxy's.
type Identify = dyn Fn(SocketAddr, SocketAddr) -> Option<String> + Send + Sync;

#[derive(Default)]
struct Shared {
    commands: Mutex<Vec<ImapCommand>>,
    sessions: Mutex<Vec<ProxiedSession>>,
    identify: Mutex<Option<Arc<Identify>>>,
    open: Mutex<Vec<TcpStream>>,
    connections: AtomicU64,
    closed: AtomicBool,
    /// New connections wait for the upstream (no greeting) while this is set.
    hold: AtomicBool,
    /// A command line containing this text cuts its connection instead of
    /// reaching the server.
    cut_on: Mutex<Option<String>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("connections", &self.connections).finish_non_exhaustive()
    }
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

    /// Every connection's life so far, in accept order.
    pub fn sessions(&self) -> Vec<ProxiedSession> {
        self.shared.sessions.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// From now on, each accepted connection's client is named by
    /// `identify`, given the connection's two ends: the client's address and
    /// the proxy's (for example, which worker process owns the socket:
    /// [`process_of_connection`]).
    pub fn identify_clients(
        &self,
        identify: impl Fn(SocketAddr, SocketAddr) -> Option<String> + Send + Sync + 'static,
    ) {
        *self.shared.identify.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(identify));
    }

    /// Where one user's sessions since `since` were not exclusive to one
    /// client at a time, each described: two clients connected at one
    /// moment, or a user that went back to a client it had left (an old
    /// owner still at work after the hand-off). Sessions closed before
    /// `since`, and those whose client was not named, are left out; a
    /// client's own sessions may overlap (a hot account's IDLE beside its
    /// periodic poll).
    pub fn not_exclusive(&self, since: Instant) -> Vec<String> {
        let mut sessions: Vec<ProxiedSession> = self
            .sessions()
            .into_iter()
            .filter(|s| s.user.is_some() && s.client.is_some() && s.closed.is_none_or(|c| c >= since))
            .collect();
        sessions.sort_by_key(|s| s.opened);
        let mut out = Vec::new();
        for (i, a) in sessions.iter().enumerate() {
            for b in &sessions[i + 1..] {
                if a.user == b.user && a.client != b.client && a.overlaps(b) {
                    out.push(format!("{:?} and {:?} at once: {a:?} / {b:?}", a.client, b.client));
                }
            }
        }
        let mut users: Vec<&Option<String>> = sessions.iter().map(|s| &s.user).collect();
        users.sort();
        users.dedup();
        for user in users {
            let mut clients: Vec<&Option<String>> =
                sessions.iter().filter(|s| &s.user == user).map(|s| &s.client).collect();
            clients.dedup();
            let mut seen: Vec<&Option<String>> = Vec::new();
            for c in &clients {
                if seen.contains(c) {
                    out.push(format!("{user:?} went back to {c:?}: clients in turn {clients:?}"));
                    break;
                }
                seen.push(c);
            }
        }
        out
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
        let identify = shared.identify.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let ends = client.peer_addr().ok().zip(client.local_addr().ok());
        let who = identify.zip(ends).and_then(|(identify, (peer, local))| identify(peer, local));
        shared.sessions.lock().unwrap_or_else(|p| p.into_inner()).push(ProxiedSession {
            connection,
            user: None,
            client: who,
            opened: Instant::now(),
            closed: None,
        });
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
    let mut sasl_plain_next = false;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // Recorded before it is sent: once the server's answer reaches the
        // client, the command is in the record.
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        if sasl_plain_next {
            sasl_plain_next = false;
            if let Some(user) = sasl_plain_user(&text) {
                session(shared, connection, |s| s.user = Some(user));
            }
        }
        if let Some(command) = parse_command(connection, &text) {
            let words: Vec<&str> = text.split(' ').collect();
            let user = match command.verb.as_str() {
                "LOGIN" => words.get(2).map(|u| u.trim_matches('"').to_owned()),
                "AUTHENTICATE" if words.get(2).is_some_and(|m| m.eq_ignore_ascii_case("PLAIN")) => {
                    // SASL-IR: the credentials are on this line; else on the next.
                    sasl_plain_next = words.get(3).is_none();
                    words.get(3).and_then(|r| sasl_plain_user(r))
                }
                _ => None,
            };
            if let Some(user) = user {
                session(shared, connection, |s| s.user = Some(user));
            }
            shared.commands.lock().unwrap_or_else(|p| p.into_inner()).push(command);
        }
        let cut = shared.cut_on.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|t| text.contains(t));
        if cut {
            let _ = (reader.get_ref().shutdown(Shutdown::Both), server.shutdown(Shutdown::Both));
            session(shared, connection, |s| s.closed = Some(Instant::now()));
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
    session(shared, connection, |s| s.closed = Some(Instant::now()));
}

/// The user of a SASL PLAIN response (`base64(authzid NUL user NUL password)`).
fn sasl_plain_user(response: &str) -> Option<String> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD.decode(response.trim()).ok()?;
    let user = raw.split(|b| *b == 0).nth(1)?;
    Some(String::from_utf8_lossy(user).into_owned())
}

fn session(shared: &Shared, connection: u64, change: impl FnOnce(&mut ProxiedSession)) {
    let mut sessions = shared.sessions.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = sessions.iter_mut().rev().find(|s| s.connection == connection) {
        change(s);
    }
}

/// Which of `pids` holds the TCP socket from `client` to `server` (Linux:
/// the socket's inode from `/proc/net/tcp`, then each process's open files).
/// Both ends are matched: one local port can carry several live connections
/// at once, each to another server.
pub fn process_of_connection(client: SocketAddr, server: SocketAddr, pids: &[u32]) -> Option<u32> {
    let (local, remote) = (proc_net_address(client), proc_net_address(server));
    let table = if client.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
    let text = std::fs::read_to_string(table).ok()?;
    // A closed socket of an earlier connection may linger on the same
    // ends (TIME_WAIT, inode 0): only a live one has an owner.
    let inode = text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let inode = *fields.get(9)?;
        (*fields.get(1)? == local && *fields.get(2)? == remote && inode != "0").then(|| inode.to_owned())
    })?;
    let wanted = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == wanted))
        })
    })
}

/// `addr` as `/proc/net/tcp{,6}` writes it: the address's 32-bit words in
/// host byte order, in hex, then `:` and the port in hex.
fn proc_net_address(addr: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr.ip() {
        std::net::IpAddr::V4(ip) => vec![ip.octets()],
        std::net::IpAddr::V6(ip) => ip.octets().chunks_exact(4).map(|w| [w[0], w[1], w[2], w[3]]).collect(),
    };
    let ip: String = words.iter().map(|w| format!("{:08X}", u32::from_ne_bytes(*w))).collect();
    format!("{ip}:{:04X}", addr.port())
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
    fn a_connection_is_found_by_both_its_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (_accepted, _) = listener.accept().expect("accept");
        let (local, remote) = (client.local_addr().expect("local"), client.peer_addr().expect("peer"));
        let me = std::process::id();
        assert_eq!(process_of_connection(local, remote, &[me]), Some(me));
        // The same local port towards another server is another connection.
        let elsewhere = SocketAddr::new(remote.ip(), remote.port().wrapping_add(1));
        assert_eq!(process_of_connection(local, elsewhere, &[me]), None);
        assert_eq!(
            proc_net_address("127.0.0.1:258".parse().expect("addr")),
            format!("{:08X}:0102", u32::from_ne_bytes([127, 0, 0, 1]))
        );
    }

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
        assert_eq!(sasl_plain_user("AGFsaWNlAHNlY3JldA==").as_deref(), Some("alice"));
        assert_eq!(sasl_plain_user("not base64!"), None);
    }
}
