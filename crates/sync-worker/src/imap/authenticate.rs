//! Logging in: the mechanism is chosen from what the server offers before
//! login (its CAPABILITY), never guessed.
//!
//! - A password goes as AUTHENTICATE PLAIN when `AUTH=PLAIN` is offered
//!   (in the command itself with `SASL-IR`, saving a round trip), else as
//!   LOGIN, unless the server says `LOGINDISABLED`.
//! - An OAuth2 access token goes as OAUTHBEARER (RFC 7628) or, failing
//!   that, XOAUTH2 (Google's and Microsoft's original).

use async_imap::imap_proto::{Capability, Response, ResponseCode};
use async_imap::Client;
use base64::Engine as _;

use super::framing::Limits;
use super::transport::{imap_error, ConnectError, Io};

/// What the server said it offers, upper-cased (`AUTH=PLAIN`, `SASL-IR`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerCapabilities(Vec<String>);

impl ServerCapabilities {
    /// From a CAPABILITY response or response code.
    pub(crate) fn from_parsed(caps: &[Capability<'_>]) -> Self {
        Self(
            caps.iter()
                .map(|c| match c {
                    Capability::Imap4rev1 => "IMAP4REV1".to_string(),
                    Capability::Auth(m) => format!("AUTH={}", m.to_ascii_uppercase()),
                    Capability::Atom(a) => a.to_ascii_uppercase(),
                })
                .collect(),
        )
    }

    #[cfg(test)]
    fn of(line: &str) -> Self {
        Self(line.split_whitespace().map(str::to_ascii_uppercase).collect())
    }

    fn has(&self, capability: &str) -> bool {
        self.0.iter().any(|c| c == capability)
    }

    fn mechanisms(&self) -> String {
        let auth: Vec<&str> = self.0.iter().filter(|c| c.starts_with("AUTH=")).map(String::as_str).collect();
        if auth.is_empty() {
            "no AUTH= mechanism".to_string()
        } else {
            auth.join(" ")
        }
    }
}

/// The secret a login proves.
#[derive(Clone, Copy)]
pub(crate) enum Secret<'a> {
    /// A password.
    Password(&'a str),
    /// An OAuth2 access token.
    Bearer(&'a str),
}

/// How the login goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    /// AUTHENTICATE PLAIN; `initial_response` with SASL-IR.
    Plain { initial_response: bool },
    /// The LOGIN command.
    Login,
    /// AUTHENTICATE OAUTHBEARER.
    OAuthBearer { initial_response: bool },
    /// AUTHENTICATE XOAUTH2.
    XOAuth2 { initial_response: bool },
}

impl Mechanism {
    /// The name the server logs (`method=PLAIN`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mechanism::Plain { .. } => "PLAIN",
            Mechanism::Login => "LOGIN",
            Mechanism::OAuthBearer { .. } => "OAUTHBEARER",
            Mechanism::XOAuth2 { .. } => "XOAUTH2",
        }
    }
}

/// The mechanism for `secret` on a server offering `caps`.
pub(crate) fn choose(caps: &ServerCapabilities, secret: Secret<'_>) -> Result<Mechanism, ConnectError> {
    let initial_response = caps.has("SASL-IR");
    match secret {
        Secret::Password(_) if caps.has("AUTH=PLAIN") => Ok(Mechanism::Plain { initial_response }),
        Secret::Password(_) if !caps.has("LOGINDISABLED") => Ok(Mechanism::Login),
        Secret::Password(_) => Err(ConnectError::NoMechanism {
            need: "a password login (it says LOGINDISABLED and offers no AUTH=PLAIN)",
            offered: caps.mechanisms(),
        }),
        Secret::Bearer(_) if caps.has("AUTH=OAUTHBEARER") => Ok(Mechanism::OAuthBearer { initial_response }),
        Secret::Bearer(_) if caps.has("AUTH=XOAUTH2") => Ok(Mechanism::XOAuth2 { initial_response }),
        Secret::Bearer(_) => Err(ConnectError::NoMechanism {
            need: "an OAuth2 login (neither AUTH=OAUTHBEARER nor AUTH=XOAUTH2)",
            offered: caps.mechanisms(),
        }),
    }
}

/// Who logs in where: what the SASL messages carry.
pub(crate) struct LoginAs<'a> {
    pub username: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub secret: Secret<'a>,
}

/// The SASL client message of `mechanism` (not base64-encoded).
fn client_message(mechanism: Mechanism, who: &LoginAs<'_>) -> Vec<u8> {
    let secret = match who.secret {
        Secret::Password(s) | Secret::Bearer(s) => s,
    };
    match mechanism {
        Mechanism::Plain { .. } | Mechanism::Login => format!("\0{}\0{secret}", who.username).into_bytes(),
        Mechanism::XOAuth2 { .. } => format!("user={}\x01auth=Bearer {secret}\x01\x01", who.username).into_bytes(),
        Mechanism::OAuthBearer { .. } => {
            // RFC 5801's saslname: ',' and '=' escaped.
            let name = who.username.replace('=', "=3D").replace(',', "=2C");
            format!("n,a={name},\x01host={}\x01port={}\x01auth=Bearer {secret}\x01\x01", who.host, who.port)
                .into_bytes()
        }
    }
}

/// Answers the server's challenges: the client message first (unless it
/// went with the command), then what ends a failed exchange, so that the
/// server's NO arrives (RFC 7628 §3.2.3: a lone `\x01`; XOAUTH2: nothing).
struct Exchange {
    first: Option<Vec<u8>>,
    abort: &'static [u8],
}

impl async_imap::Authenticator for &mut Exchange {
    type Response = Vec<u8>;

    fn process(&mut self, _challenge: &[u8]) -> Vec<u8> {
        self.first.take().unwrap_or_else(|| self.abort.to_vec())
    }
}

/// What the login attempt came to.
pub(crate) enum Outcome<T: Io> {
    /// Logged in.
    LoggedIn(async_imap::Session<T>),
    /// The server refused: its answer.
    Refused(String),
}

/// Logs in on `client` with `mechanism`.
pub(crate) async fn log_in<T: Io>(
    client: Client<T>,
    mechanism: Mechanism,
    who: &LoginAs<'_>,
    limits: &Limits,
) -> Result<Outcome<T>, ConnectError> {
    let step = "the login";
    let result = match mechanism {
        Mechanism::Login => {
            let password = match who.secret {
                Secret::Password(p) | Secret::Bearer(p) => p,
            };
            client.login(who.username, password).await
        }
        Mechanism::Plain { initial_response }
        | Mechanism::OAuthBearer { initial_response }
        | Mechanism::XOAuth2 { initial_response } => {
            let message = client_message(mechanism, who);
            let abort: &'static [u8] = if matches!(mechanism, Mechanism::OAuthBearer { .. }) { b"\x01" } else { b"" };
            let (command, first) = if initial_response {
                // RFC 4959: an empty message is sent as "=".
                let encoded = base64::engine::general_purpose::STANDARD.encode(&message);
                (format!("{} {}", mechanism.name(), if encoded.is_empty() { "=".into() } else { encoded }), None)
            } else {
                (mechanism.name().to_string(), Some(message))
            };
            let mut exchange = Exchange { first, abort };
            client.authenticate(command, &mut exchange).await
        }
    };
    match result {
        Ok(session) => Ok(Outcome::LoggedIn(session)),
        Err((async_imap::error::Error::No(answer) | async_imap::error::Error::Bad(answer), _)) => {
            Ok(Outcome::Refused(server_text(&answer)))
        }
        Err((e, _)) => Err(imap_error(step, e, limits)),
    }
}

/// Asks the server's CAPABILITY before login (after STARTTLS, or when the
/// greeting did not carry it).
pub(crate) async fn capabilities<T: Io>(
    client: &mut Client<T>,
    limits: &Limits,
) -> Result<ServerCapabilities, ConnectError> {
    let (tx, rx) = async_channel::bounded(16);
    client.run_command_and_check_ok("CAPABILITY", Some(tx)).await.map_err(|e| imap_error("CAPABILITY", e, limits))?;
    let mut found = ServerCapabilities::default();
    while let Ok(response) = rx.try_recv() {
        if let async_imap::types::UnsolicitedResponse::Other(data) = response {
            if let Response::Capabilities(caps) = data.parsed() {
                found = ServerCapabilities::from_parsed(caps);
            }
        }
    }
    Ok(found)
}

/// The capabilities in a greeting's `[CAPABILITY ...]` code, if any.
pub(crate) fn in_code(code: Option<&ResponseCode<'_>>) -> Option<ServerCapabilities> {
    match code {
        Some(ResponseCode::Capabilities(caps)) => Some(ServerCapabilities::from_parsed(caps)),
        _ => None,
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
    use super::*;

    const DOVECOT: &str = "IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE IDLE LITERAL+ AUTH=PLAIN AUTH=LOGIN";

    #[test]
    fn passwords_go_as_plain_with_sasl_ir_when_offered() {
        let pw = Secret::Password("pw");
        assert_eq!(choose(&ServerCapabilities::of(DOVECOT), pw).unwrap(), Mechanism::Plain { initial_response: true });
        let no_ir = ServerCapabilities::of("IMAP4rev1 AUTH=PLAIN");
        assert_eq!(choose(&no_ir, pw).unwrap(), Mechanism::Plain { initial_response: false });
        assert_eq!(choose(&ServerCapabilities::of("IMAP4rev1 AUTH=LOGIN"), pw).unwrap(), Mechanism::Login);
        assert_eq!(choose(&ServerCapabilities::of("IMAP4rev1"), pw).unwrap(), Mechanism::Login);
        let disabled = ServerCapabilities::of("IMAP4rev1 LOGINDISABLED AUTH=PLAIN");
        assert_eq!(choose(&disabled, pw).unwrap(), Mechanism::Plain { initial_response: false });
        let e = choose(&ServerCapabilities::of("IMAP4rev1 LOGINDISABLED AUTH=GSSAPI"), pw).unwrap_err().to_string();
        assert!(e.contains("LOGINDISABLED") && e.contains("AUTH=GSSAPI"), "{e}");
    }

    #[test]
    fn tokens_go_as_oauthbearer_then_xoauth2() {
        let token = Secret::Bearer("t");
        let both = ServerCapabilities::of("IMAP4rev1 SASL-IR AUTH=XOAUTH2 AUTH=OAUTHBEARER");
        assert_eq!(choose(&both, token).unwrap(), Mechanism::OAuthBearer { initial_response: true });
        let google_style = ServerCapabilities::of("IMAP4rev1 AUTH=XOAUTH2 AUTH=PLAIN");
        assert_eq!(choose(&google_style, token).unwrap(), Mechanism::XOAuth2 { initial_response: false });
        let e = choose(&ServerCapabilities::of(DOVECOT), token).unwrap_err().to_string();
        assert!(e.contains("OAUTHBEARER") && e.contains("AUTH=PLAIN AUTH=LOGIN"), "{e}");
    }

    #[test]
    fn sasl_messages_follow_their_rfcs() {
        let who = |secret| LoginAs { username: "a,b=c@x.example", host: "imap.x.example", port: 993, secret };
        let plain = client_message(Mechanism::Plain { initial_response: true }, &who(Secret::Password("p w")));
        assert_eq!(plain, b"\0a,b=c@x.example\0p w");
        let xoauth2 = client_message(Mechanism::XOAuth2 { initial_response: true }, &who(Secret::Bearer("tok")));
        assert_eq!(xoauth2, b"user=a,b=c@x.example\x01auth=Bearer tok\x01\x01");
        let bearer = client_message(Mechanism::OAuthBearer { initial_response: true }, &who(Secret::Bearer("tok")));
        assert_eq!(bearer, b"n,a=a=2Cb=3Dc@x.example,\x01host=imap.x.example\x01port=993\x01auth=Bearer tok\x01\x01");
    }

    #[test]
    fn server_text_is_unwrapped() {
        let raw = r#"code: None, info: Some("[AUTHENTICATIONFAILED] Authentication failed.")"#;
        assert_eq!(server_text(raw), "[AUTHENTICATIONFAILED] Authentication failed.");
        assert_eq!(server_text("plain"), "plain");
    }
}
