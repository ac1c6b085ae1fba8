//! Reaching a server: TCP, then TLS from the first byte, STARTTLS, or
//! (only to loopback addresses, unless the operator allows it) nothing;
//! then the login ([`super::authenticate`]). Everything the server sends passes [`Bounded`]'s limits.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use async_imap::imap_proto::{Response, Status};
use async_imap::{Client, Session};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::access_tokens::{TokenError, TokenRequest};
use super::addresses::is_public;
use super::authenticate::{self, LoginAs, Outcome, Secret, ServerCapabilities};
use super::framing::{framing_error, Bounded, FramingError, Limits};
use super::settings::ImapSettings;
use super::tls::{certificate_problem, CertificateProblem};
use crate::storage::{AccountAuth, Credentials, Security};

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
    /// The server offers no login mechanism for the account's secret.
    #[error("the server offers no way to log in with {need}; it offers {offered}")]
    NoMechanism {
        /// What was needed, in words.
        need: &'static str,
        /// The `AUTH=` mechanisms it offers.
        offered: String,
    },
    /// No OAuth2 access token could be had (for now: an unreachable or
    /// failing token endpoint).
    #[error(transparent)]
    Token(TokenError),
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
    /// The OAuth2 token endpoint refused the account's refresh token: no
    /// login can work until the account is authorized again.
    GrantRefused(TokenError),
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

/// The most plaintext rustls buffers for sending once the handshake is
/// done (its default is 64 KiB). Only commands go out then, the longest a
/// UID set; a write past the limit is taken in part and waits for the
/// socket, so the buffer never grows past it.
const TLS_SEND_BUFFER_LIMIT: usize = 16 * 1024;

async fn tls(host: &str, tcp: TcpStream, settings: &ImapSettings) -> Result<Box<dyn Io>, ConnectError> {
    // An IP address literal is checked against the certificate's IP names.
    let name = ServerName::try_from(host.to_string()).map_err(|e| ConnectError::Tls(std::io::Error::other(e)))?;
    match TlsConnector::from(settings.tls.client_config()).connect(name, tcp).await {
        Ok(mut s) => {
            // After the handshake only IMAP commands go out: a hot account's
            // connection lives for days, so it keeps no room for more.
            s.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER_LIMIT));
            Ok(Box::new(s))
        }
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

/// The secret `creds` log in with: the password, or an OAuth2 access
/// token (fetched, or kept from an earlier login).
async fn secret_of(creds: &Credentials, settings: &ImapSettings) -> Result<SecretValue, ConnectFailure> {
    match &creds.auth {
        AccountAuth::Password(p) => {
            unquotable("password", p)?;
            Ok(SecretValue::Password(p.clone()))
        }
        AccountAuth::OAuth2(grant) => {
            let how = TokenRequest {
                tls: &settings.tls,
                allow_private: settings.allow_private,
                timeout: settings.connect_timeout,
            };
            match settings.access_tokens.access_token(grant, how).await {
                Ok(token) => Ok(SecretValue::Bearer(token)),
                Err(e) if e.is_refused() => Err(ConnectFailure::GrantRefused(e)),
                Err(e) => Err(ConnectError::Token(e).into()),
            }
        }
    }
}

enum SecretValue {
    Password(String),
    Bearer(String),
}

/// Opens a session for `creds`, every step bounded by the connect timeout.
pub(crate) async fn open(creds: &Credentials, settings: &ImapSettings) -> Result<ImapSession, ConnectFailure> {
    open_at(creds, settings).await.map(|(session, _)| session)
}

/// [`open`], with the address of the server it reached.
pub(crate) async fn open_at(
    creds: &Credentials,
    settings: &ImapSettings,
) -> Result<(ImapSession, IpAddr), ConnectFailure> {
    let timeout = settings.connect_timeout;
    unquotable("username", &creds.username)?;
    // Before the connection: a token refresh does not hold a server slot.
    let secret = secret_of(creds, settings).await?;
    settings.connect_rate.wait_turn().await;
    let _place = settings.connect_gate.enter(&creds.host).await;
    let tcp = within("the TCP connect", timeout, async {
        let addrs = addresses(creds, settings).await?;
        TcpStream::connect(&addrs[..]).await.map_err(ConnectError::Tcp)
    })
    .await?;
    let _ = tcp.set_nodelay(true);
    let server_ip = tcp.peer_addr().map_err(ConnectError::Tcp)?.ip().to_canonical();
    // `::ffff:127.0.0.1` is loopback too.
    if creds.security == Security::Plain && !settings.allow_plain && !server_ip.is_loopback() {
        return Err(ConnectError::PlainNotAllowed { ip: server_ip }.into());
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
    // After STARTTLS, what the server offered before TLS no longer counts (RFC 3501 6.2.1).
    let from_greeting = match creds.security {
        Security::Starttls => None,
        _ => within("the greeting", timeout, greeting(&mut client, &limits)).await?,
    };
    let offered = match from_greeting {
        Some(offered) => offered,
        None => within("CAPABILITY", timeout, authenticate::capabilities(&mut client, &limits)).await?,
    };
    let login_secret = match &secret {
        SecretValue::Password(p) => Secret::Password(p),
        SecretValue::Bearer(t) => Secret::Bearer(t),
    };
    let mechanism = authenticate::choose(&offered, login_secret)?;
    let who = LoginAs { username: &creds.username, host: &creds.host, port: creds.port, secret: login_secret };
    let outcome = tokio::time::timeout(timeout, authenticate::log_in(client, mechanism, &who, &limits))
        .await
        .map_err(|_| ConnectError::Timeout { step: "the login", after: timeout })??;
    match outcome {
        Outcome::LoggedIn(session) => {
            limits.logged_in();
            Ok((session, server_ip))
        }
        Outcome::Refused(answer) => {
            if let AccountAuth::OAuth2(grant) = &creds.auth {
                // The token may have been revoked early: the next login fetches another.
                settings.access_tokens.forget(grant);
            }
            Err(ConnectFailure::Refused(answer))
        }
    }
}

/// Reads the greeting: `* OK` or `* PREAUTH`, with the capabilities its
/// code carries, if any; a `* BYE` is the server's refusal, in its words.
async fn greeting<T: Io>(client: &mut Client<T>, limits: &Limits) -> Result<Option<ServerCapabilities>, ConnectError> {
    const STEP: &str = "the greeting";
    let Some(response) = client.read_response().await.map_err(|e| imap_error(STEP, e.into(), limits))? else {
        return Err(ConnectError::Closed { step: STEP, said: None });
    };
    match response.parsed() {
        Response::Data { status: Status::Ok | Status::PreAuth, outcome } => {
            Ok(authenticate::in_code(outcome.code.as_ref()))
        }
        Response::Data { status: Status::Bye, outcome } => {
            Err(ConnectError::Closed { step: STEP, said: outcome.information.as_ref().map(|i| i.to_string()) })
        }
        _ => Err(ConnectError::NotImap { step: STEP, start: limits.current_start() }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nul_cr_and_lf_are_never_quoted() {
        for (value, character) in [("a\0b", "NUL"), ("a\rb", "CR"), ("a\nb", "LF")] {
            let e = super::unquotable("password", value).unwrap_err().to_string();
            assert!(e.contains("password") && e.contains(character), "{e}");
        }
        super::unquotable("password", "p\"a\\ss wörd").unwrap();
    }
}
