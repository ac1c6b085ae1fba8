//! One POST of a delivery, and the address rule receivers live under.
//!
//! A receiver's URL is `http` or `https`, with a host and without
//! credentials. Unless private addresses are allowed (`IMAP_ALLOW_PRIVATE`,
//! the rule IMAP hosts follow), every address its host resolves to must be
//! public: checked when the webhook is made, and again on every POST by the
//! client's own resolver, so a name that later resolves to `127.0.0.1` is
//! refused before a packet is sent. Redirects are not followed (a redirect
//! could point anywhere); a 3xx is a failed attempt.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

use super::signature::{sign, SIGNATURE_HEADER};
use crate::imap::is_public;
use crate::imap::tls::TlsSettings;
use crate::storage::{AttemptOutcome, DeliveryJob};

/// The longest receiver URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Why a receiver URL is refused.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// Not a URL.
    #[error("is not a URL ({0}): expected e.g. https://example.com/hooks/mail")]
    Parse(#[source] url::ParseError),
    /// Too long.
    #[error("is longer than {MAX_URL_LEN} bytes")]
    TooLong,
    /// Not http or https.
    #[error("must be an http:// or https:// URL, not {0}://")]
    Scheme(String),
    /// A user name or password in the URL.
    #[error("must not carry a user name or password: authenticate the request by its signature")]
    Credentials,
    /// No host.
    #[error("must name a host")]
    NoHost,
    /// The host did not resolve.
    #[error("names the host {host}, which does not resolve")]
    Unresolved {
        /// The host.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The host is (or resolves to) an address that is not public.
    #[error(
        "points at {ip} ({host}), which is not a public address: receivers must be public \
         unless the operator sets IMAP_ALLOW_PRIVATE=true"
    )]
    Private {
        /// The host.
        host: String,
        /// The refused address.
        ip: IpAddr,
    },
}

/// Parses `url` and checks the form rules (scheme, host, no credentials,
/// length) and, for an IP-literal host, the address rule.
pub fn parse_url(url: &str, allow_private: bool) -> Result<Url, UrlError> {
    if url.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let parsed = Url::parse(url.trim()).map_err(UrlError::Parse)?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(UrlError::Scheme(parsed.scheme().to_string()));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(UrlError::Credentials);
    }
    let literal = match parsed.host() {
        None => return Err(UrlError::NoHost),
        Some(url::Host::Domain(_)) => None,
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
    };
    if let Some(ip) = literal.filter(|ip| !allow_private && !is_public(*ip)) {
        return Err(UrlError::Private { host: parsed.host_str().unwrap_or_default().to_string(), ip });
    }
    Ok(parsed)
}

/// [`parse_url`], then the address rule for every address the host resolves to.
pub async fn check_url(url: &str, allow_private: bool) -> Result<Url, UrlError> {
    let parsed = parse_url(url, allow_private)?;
    if let Some(url::Host::Domain(host)) = parsed.host() {
        public_addresses(host, allow_private).await?;
    }
    Ok(parsed)
}

async fn public_addresses(host: &str, allow_private: bool) -> Result<Vec<SocketAddr>, UrlError> {
    let found: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|source| UrlError::Unresolved { host: host.to_string(), source })?
        .collect();
    if !allow_private {
        if let Some(bad) = found.iter().find(|a| !is_public(a.ip())) {
            return Err(UrlError::Private { host: host.to_string(), ip: bad.ip() });
        }
    }
    Ok(found)
}

/// The HTTP client's resolver: the address rule, on every connection.
#[derive(Debug)]
struct PublicOnly {
    allow_private: bool,
}

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let addrs = public_addresses(name.as_str(), allow_private).await?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Why the HTTP client could not be made.
#[derive(Debug, thiserror::Error)]
#[error("could not set up the webhook HTTP client")]
pub struct ClientError(#[source] reqwest::Error);

/// POSTs deliveries. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    allow_private: bool,
}

impl Sender {
    /// A sender whose POSTs time out after `timeout`, trusting the roots of
    /// `tls` (the system's and `IMAP_CA_FILE`'s).
    pub fn new(timeout: Duration, allow_private: bool, tls: &TlsSettings) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            .use_preconfigured_tls((*tls.client_config()).clone())
            .dns_resolver(Arc::new(PublicOnly { allow_private }))
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout)
            .timeout(timeout)
            .user_agent(concat!("sync-worker-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ClientError)?;
        Ok(Self { client, allow_private })
    }

    /// POSTs `job`'s body, signed; a 2xx answer delivers it.
    pub async fn send(&self, job: &DeliveryJob) -> AttemptOutcome {
        let outcome = self.attempt(job).await;
        let name = if matches!(outcome, AttemptOutcome::Delivered { .. }) { "delivered" } else { "failed" };
        metrics::counter!("sync_worker_webhook_deliveries_total", "outcome" => name).increment(1);
        outcome
    }

    async fn attempt(&self, job: &DeliveryJob) -> AttemptOutcome {
        let url = match parse_url(&job.url, self.allow_private) {
            Ok(url) => url,
            Err(e) => return AttemptOutcome::Failed { status: None, error: format!("the URL {}", e) },
        };
        let sent = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, sign(&job.secret, job.body.as_bytes()))
            .header("x-webhook-id", &job.webhook_id)
            .header("x-webhook-event", &job.event)
            .header("x-webhook-event-id", &job.event_id)
            .header("x-webhook-delivery", &job.id)
            .body(job.body.clone())
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status().is_success() => {
                AttemptOutcome::Delivered { status: answer.status().as_u16() }
            }
            Ok(answer) => {
                let status = answer.status();
                let error = match answer.headers().get(reqwest::header::LOCATION) {
                    Some(_) if status.is_redirection() => {
                        format!("the receiver answered {status} (a redirect, which is not followed)")
                    }
                    _ => format!("the receiver answered {status}"),
                };
                AttemptOutcome::Failed { status: Some(status.as_u16()), error }
            }
            Err(e) => AttemptOutcome::Failed { status: None, error: crate::errors::error_chain(&e) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_http_with_a_host_and_no_credentials() {
        assert!(parse_url("https://hooks.example.com/mail?x=1", false).is_ok());
        for (url, says) in [
            ("ftp://example.com/", "http:// or https://"),
            ("https://user:pw@example.com/", "user name or password"),
            ("not a url", "not a URL"),
            ("http://127.0.0.1:8080/", "not a public address"),
            ("http://[::1]/", "not a public address"),
            ("http://10.1.2.3/", "not a public address"),
            ("http://0x7f000001/", "not a public address"),
            ("http://[::ffff:192.168.0.1]/", "not a public address"),
        ] {
            let e = parse_url(url, false).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        assert!(parse_url("http://127.0.0.1:8080/", true).is_ok());
        assert!(parse_url(&format!("https://example.com/{}", "a".repeat(MAX_URL_LEN)), false).is_err());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused() {
        let e = check_url("http://localhost:9/", false).await.unwrap_err();
        assert!(matches!(e, UrlError::Private { .. }), "{e}");
        assert!(check_url("http://localhost:9/", true).await.is_ok());
    }
}
