//! Reaching a server: TCP, then TLS from the first byte, STARTTLS, or
//! (only when the account says so) nothing; then LOGIN.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_imap::{Client, Session};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::errors::BoxError;
use crate::storage::{Credentials, Security};

/// A byte stream an IMAP session runs on: plain TCP or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + std::fmt::Debug> Io for T {}

/// A logged-in session.
pub type ImapSession = Session<Box<dyn Io>>;

/// Why a connection attempt failed.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// The server could not be reached or spoke no IMAP (retry later).
    Unreachable(BoxError),
    /// The server refused the login: its answer.
    Refused(String),
}

fn tls_connector() -> TlsConnector {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth());
        match config {
            Ok(c) => Arc::new(c),
            // ring supports the default protocol versions: this cannot happen.
            Err(e) => unreachable!("rustls rejected its own default protocol versions: {e}"),
        }
    });
    TlsConnector::from(config.clone())
}

async fn tls(host: &str, tcp: TcpStream) -> Result<Box<dyn Io>, BoxError> {
    let name = ServerName::try_from(host.to_string())?;
    Ok(Box::new(tls_connector().connect(name, tcp).await?))
}

/// Opens a session for `creds`, every step bounded by `timeout`.
pub(crate) async fn open(creds: &Credentials, timeout: Duration) -> Result<ImapSession, ConnectFailure> {
    let within = |what: &'static str| move |_| -> BoxError { format!("{what} timed out after {timeout:?}").into() };
    let unreachable = ConnectFailure::Unreachable;
    let tcp = tokio::time::timeout(timeout, TcpStream::connect((creds.host.as_str(), creds.port)))
        .await
        .map_err(within("TCP connect"))
        .map_err(unreachable)?
        .map_err(|e| unreachable(Box::new(e)))?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = match creds.security {
        Security::Plain => Box::new(tcp),
        Security::Tls => tokio::time::timeout(timeout, tls(&creds.host, tcp))
            .await
            .map_err(within("TLS handshake"))
            .map_err(unreachable)?
            .map_err(unreachable)?,
        Security::Starttls => {
            let mut client = Client::new(tcp);
            let upgrade = async {
                greeting(&mut client).await?;
                client.run_command_and_check_ok("STARTTLS", None).await?;
                Ok::<_, BoxError>(())
            };
            tokio::time::timeout(timeout, upgrade)
                .await
                .map_err(within("STARTTLS"))
                .map_err(unreachable)?
                .map_err(unreachable)?;
            tokio::time::timeout(timeout, tls(&creds.host, client.into_inner()))
                .await
                .map_err(within("TLS handshake"))
                .map_err(unreachable)?
                .map_err(unreachable)?
        }
    };
    let mut client = Client::new(stream);
    if creds.security != Security::Starttls {
        tokio::time::timeout(timeout, greeting(&mut client))
            .await
            .map_err(within("the greeting"))
            .map_err(unreachable)?
            .map_err(unreachable)?;
    }
    match tokio::time::timeout(timeout, client.login(&creds.username, &creds.password)).await {
        Err(e) => Err(unreachable(within("LOGIN")(e))),
        Ok(Ok(session)) => Ok(session),
        Ok(Err((async_imap::error::Error::No(answer) | async_imap::error::Error::Bad(answer), _))) => {
            Err(ConnectFailure::Refused(server_text(&answer)))
        }
        Ok(Err((e, _))) => Err(unreachable(Box::new(e))),
    }
}

async fn greeting<T: Io>(client: &mut Client<T>) -> Result<(), BoxError> {
    match client.read_response().await? {
        Some(_) => Ok(()),
        None => Err("the server closed the connection before its greeting".into()),
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
}
