//! Reaching a server: TCP, then TLS from the first byte, STARTTLS, or
//! (only to loopback addresses, unless the operator allows it) nothing;
//! then LOGIN. Everything the server sends passes [`Bounded`]'s limits.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use async_imap::imap_proto::{Response, Status};
use async_imap::{Client, Session};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::framing::{framing_error, Bounded, FramingError, Limits};
use super::settings::ImapSettings;
use super::tls::{certificate_problem, CertificateProblem};
use crate::storage::{Credentials, Security};

/// A byte stream an IMAP session runs on: plain TCP or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug> Io for T {}

/// A logged-in session.
pub type ImapSession = Session<Bounded<Box<dyn Io>>>;

/// Why a connection attempt failed, in words.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP connection failed (refused, no route, unknown host).
    #[error("the TCP connection failed")]
    Tcp(#[source] std::io::Error),
    /// A step did not finish in time.
    #[error("{step} timed out after {after:?}")]
    Timeout {
        /// The TCP connect, the TLS handshake, the greeting, STARTTLS or LOGIN.
        step: &'static str,
        /// The bound.
        after: Duration,
    },
    /// The server's certificate was refused.
    #[error("the server's TLS certificate was refused: {0}")]
    Certificate(CertificateProblem),
    /// The TLS handshake failed for another reason.
    #[error("the TLS handshake failed")]
    Tls(#[source] std::io::Error),
    /// `plain` to an address that is not loopback.
    #[error(
        "plain (unencrypted) IMAP is only allowed to loopback addresses, and {ip} is not one: use tls or starttls \
         (or set IMAP_ALLOW_PLAIN=true)"
    )]
    PlainNotAllowed {
        /// The address connected to.
        ip: IpAddr,
    },
    /// The host is, or resolves to, an address accounts may not point at.
    #[error(
        "{host} is {ip}, a loopback, link-local, private or otherwise non-public address, which accounts may not \
         point at (the operator can allow it with IMAP_ALLOW_PRIVATE=true)"
    )]
    PrivateAddress {
        /// The host as given.
        host: String,
        /// The address it is or resolves to.
        ip: IpAddr,
    },
    /// The server passed a size limit.
    #[error("{0}")]
    Limit(FramingError),
    /// The server's answer is not IMAP.
    #[error("the server does not speak IMAP: during {step} it sent {start}")]
    NotImap {
        /// What we were waiting for.
        step: &'static str,
        /// The start of what it sent, printable ASCII, anything else escaped.
        start: String,
    },
    /// The server closed the connection or refused it in its greeting.
    #[error("the server ended the connection during {step}{}", .said.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    Closed {
        /// What we were waiting for.
        step: &'static str,
        /// Its last words (a BYE), if any.
        said: Option<String>,
    },
    /// A value we would send cannot be sent as an IMAP quoted string.
    #[error("the {what} contains a {character} character, which IMAP cannot send in a quoted string")]
    Unquotable {
        /// `username`, `password`, `folder name`.
        what: &'static str,
        /// `NUL`, `CR` or `LF`.
        character: &'static str,
    },
    /// An I/O error on the connection.
    #[error("the connection failed during {step}")]
    Io {
        /// What we were waiting for.
        step: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ConnectError {
    /// Whether the server was not reached at all (the network, DNS, a
    /// timeout), as opposed to reached and found wanting.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ConnectError::Tcp(_) | ConnectError::Timeout { .. })
    }
}

/// Why a connection attempt failed.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// The server could not be reached, or was found wanting (retry later).
    Failed(ConnectError),
    /// The server refused the login: its answer.
    Refused(String),
}

impl From<ConnectError> for ConnectFailure {
    fn from(e: ConnectError) -> Self {
        ConnectFailure::Failed(e)
    }
}

/// The first character of `value` that no IMAP quoted string may hold
/// (RFC 3501 `QUOTED-CHAR`: no NUL, CR or LF).
pub(crate) fn unquotable(what: &'static str, value: &str) -> Result<(), ConnectError> {
    let character = value.bytes().find_map(|b| match b {
        0 => Some("NUL"),
        b'\r' => Some("CR"),
        b'\n' => Some("LF"),
        _ => None,
    });
    match character {
        Some(character) => Err(ConnectError::Unquotable { what, character }),
        None => Ok(()),
    }
}

/// An async-imap error in words: a limit, a parse failure (quoted from the
/// response's start, never as a byte dump), or the I/O error.
pub(crate) fn imap_error(step: &'static str, e: async_imap::error::Error, limits: &Limits) -> ConnectError {
    use async_imap::error::Error;
    match e {
        Error::Io(io) => {
            if let Some(f) = framing_error(&io) {
                return ConnectError::Limit(f.clone());
            }
            // async-imap reports parse failures as io::Error::other with
            // a Debug dump of nom's error and of the whole buffer.
            if io.kind() == std::io::ErrorKind::Other && io.to_string().contains("during parsing of") {
                return ConnectError::NotImap { step, start: limits.current_start() };
            }
            if io.kind() == std::io::ErrorKind::UnexpectedEof {
                return ConnectError::Closed { step, said: None };
            }
            ConnectError::Io { step, source: io }
        }
        Error::Parse(_) => ConnectError::NotImap { step, start: limits.current_start() },
        Error::ConnectionLost => ConnectError::Closed { step, said: None },
        Error::Bad(text) | Error::No(text) => ConnectError::Closed { step, said: Some(text) },
        Error::Validate(v) => {
            ConnectError::Unquotable { what: "command", character: if v.0 == '\r' { "CR" } else { "LF" } }
        }
        other => ConnectError::Io { step, source: std::io::Error::other(other.to_string()) },
    }
}

/// Whether `ip` is an address on the public internet. Loopback,
/// unspecified, private (RFC 1918, unique local), link-local, shared
/// (CGNAT), documentation, benchmarking, multicast, broadcast and reserved
/// ranges are not, nor are IPv6 forms that embed such an IPv4 address
/// (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`,
/// 6to4 `2002::/16`).
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    // ::a.b.c.d (deprecated "compatible" form), and NAT64's well-known prefix.
    if seg[..6] == [0; 6] || seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return !ip.is_unspecified() && !ip.is_loopback() && is_public_v4(embedded_v4(seg[6], seg[7]));
    }
    if seg[0] == 0x2002 {
        return is_public_v4(embedded_v4(seg[1], seg[2]));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (seg[0] & 0xfe00) == 0xfc00
        || (seg[0] & 0xffc0) == 0xfe80
        || (seg[0] & 0xffc0) == 0xfec0
        || (seg[0] == 0x2001 && seg[1] == 0x0db8))
}

fn embedded_v4(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))
}

/// The addresses to connect to: resolved once, and, unless private
/// addresses are allowed, every one of them public. The connection then
/// goes to exactly these addresses, so DNS cannot answer differently
/// between the check and the connect, and no packet goes to a refused one.
async fn addresses(creds: &Credentials, settings: &ImapSettings) -> Result<Vec<SocketAddr>, ConnectError> {
    let found: Vec<SocketAddr> =
        tokio::net::lookup_host((creds.host.as_str(), creds.port)).await.map_err(ConnectError::Tcp)?.collect();
    if !settings.allow_private {
        if let Some(bad) = found.iter().find(|a| !is_public(a.ip())) {
            return Err(ConnectError::PrivateAddress { host: creds.host.clone(), ip: bad.ip() });
        }
    }
    Ok(found)
}

async fn tls(host: &str, tcp: TcpStream, settings: &ImapSettings) -> Result<Box<dyn Io>, ConnectError> {
    // An IP address literal is checked against the certificate's IP names.
    let name = ServerName::try_from(host.to_string()).map_err(|e| ConnectError::Tls(std::io::Error::other(e)))?;
    match TlsConnector::from(settings.tls.client_config()).connect(name, tcp).await {
        Ok(s) => Ok(Box::new(s)),
        Err(e) => Err(match certificate_problem(&e) {
            Some(p) => ConnectError::Certificate(p),
            None => ConnectError::Tls(e),
        }),
    }
}

/// Runs `step` under `timeout`.
async fn within<T>(
    step: &'static str,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    tokio::time::timeout(timeout, f).await.map_err(|_| ConnectError::Timeout { step, after: timeout })?
}

/// Opens a session for `creds`, every step bounded by the connect timeout.
pub(crate) async fn open(creds: &Credentials, settings: &ImapSettings) -> Result<ImapSession, ConnectFailure> {
    let timeout = settings.connect_timeout;
    unquotable("username", &creds.username)?;
    unquotable("password", &creds.password)?;
    let tcp = within("the TCP connect", timeout, async {
        let addrs = addresses(creds, settings).await?;
        TcpStream::connect(&addrs[..]).await.map_err(ConnectError::Tcp)
    })
    .await?;
    let _ = tcp.set_nodelay(true);
    if creds.security == Security::Plain && !settings.allow_plain {
        let ip = tcp.peer_addr().map_err(ConnectError::Tcp)?.ip();
        // `::ffff:127.0.0.1` is loopback too.
        if !ip.to_canonical().is_loopback() {
            return Err(ConnectError::PlainNotAllowed { ip }.into());
        }
    }
    let limits = Limits::default();
    let stream: Box<dyn Io> = match creds.security {
        Security::Plain => Box::new(tcp),
        Security::Tls => within("the TLS handshake", timeout, tls(&creds.host, tcp, settings)).await?,
        Security::Starttls => {
            let mut client = Client::new(Bounded::new(tcp, limits.clone()));
            within("the greeting", timeout, greeting(&mut client, &limits)).await?;
            within("STARTTLS", timeout, async {
                client.run_command_and_check_ok("STARTTLS", None).await.map_err(|e| imap_error("STARTTLS", e, &limits))
            })
            .await?;
            let tcp = client.into_inner().into_inner();
            within("the TLS handshake", timeout, tls(&creds.host, tcp, settings)).await?
        }
    };
    let mut client = Client::new(Bounded::new(stream, limits.clone()));
    if creds.security != Security::Starttls {
        within("the greeting", timeout, greeting(&mut client, &limits)).await?;
    }
    match tokio::time::timeout(timeout, client.login(&creds.username, &creds.password)).await {
        Err(_) => Err(ConnectError::Timeout { step: "LOGIN", after: timeout }.into()),
        Ok(Ok(session)) => {
            limits.logged_in();
            Ok(session)
        }
        Ok(Err((async_imap::error::Error::No(answer) | async_imap::error::Error::Bad(answer), _))) => {
            Err(ConnectFailure::Refused(server_text(&answer)))
        }
        Ok(Err((e, _))) => Err(imap_error("LOGIN", e, &limits).into()),
    }
}

/// Reads the greeting: `* OK` or `* PREAUTH`; a `* BYE` is the server's
/// refusal, in its words.
async fn greeting<T: Io>(client: &mut Client<T>, limits: &Limits) -> Result<(), ConnectError> {
    const STEP: &str = "the greeting";
    let Some(response) = client.read_response().await.map_err(|e| imap_error(STEP, e.into(), limits))? else {
        return Err(ConnectError::Closed { step: STEP, said: None });
    };
    match response.parsed() {
        Response::Data { status: Status::Ok | Status::PreAuth, .. } => Ok(()),
        Response::Data { status: Status::Bye, outcome } => {
            Err(ConnectError::Closed { step: STEP, said: outcome.information.as_ref().map(|i| i.to_string()) })
        }
        _ => Err(ConnectError::NotImap { step: STEP, start: limits.current_start() }),
    }
}

/// The server's text out of async-imap's rendering of a NO / BAD answer
/// (`code: None, info: Some("[AUTHENTICATIONFAILED] ...")`).
fn server_text(answer: &str) -> String {
    match answer.split_once("info: Some(\"") {
        Some((_, rest)) => rest.trim_end_matches(')').trim_end_matches('"').replace("\\\"", "\""),
        None => answer.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_text_is_unwrapped() {
        let raw = r#"code: None, info: Some("[AUTHENTICATIONFAILED] Authentication failed.")"#;
        assert_eq!(super::server_text(raw), "[AUTHENTICATIONFAILED] Authentication failed.");
        assert_eq!(super::server_text("plain"), "plain");
    }

    #[test]
    fn private_addresses_in_every_form_are_not_public() {
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "192.0.2.2",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
        ] {
            assert!(!super::is_public(ip.parse().unwrap()), "{ip} counted as public");
        }
        for ip in ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:0808:0808::"] {
            assert!(super::is_public(ip.parse().unwrap()), "{ip} counted as private");
        }
    }

    #[test]
    fn nul_cr_and_lf_are_never_quoted() {
        for (value, character) in [("a\0b", "NUL"), ("a\rb", "CR"), ("a\nb", "LF")] {
            let e = super::unquotable("password", value).unwrap_err().to_string();
            assert!(e.contains("password") && e.contains(character), "{e}");
        }
        super::unquotable("password", "p\"a\\ss wörd").unwrap();
    }
}
