//! OAuth2 access tokens: fetched with an account's refresh token, kept
//! until shortly before they expire, and shared by every connection of the
//! process (an owner's poll and its INBOX watch refresh once).
//!
//! A token endpoint that refuses the refresh token (`invalid_grant` and
//! the like, RFC 6749 §5.2) is a refused login: the grant was revoked or
//! expired, and only a new authorization helps. An endpoint that cannot be
//! reached, or answers 5xx, is a failure to try again later.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::addresses::is_public;
use super::tls::TlsSettings;
use crate::oauth2::OAuth2Grant;

/// The lifetime assumed when the endpoint does not say (`expires_in`).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// A token is renewed this long before it expires (or at three quarters of
/// its life, for short-lived ones).
const RENEW_MARGIN: Duration = Duration::from_secs(60);
/// The most of an endpoint's error answer quoted back.
const QUOTED_ANSWER: usize = 200;

/// Why no access token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The endpoint refused the grant: only a new authorization helps.
    #[error(
        "the OAuth2 token endpoint {url} refused the refresh token ({error}{}): authorize the account again and \
         update it with the new refresh token",
        .description.as_ref().map(|d| format!(": {d}")).unwrap_or_default()
    )]
    Refused {
        /// The token endpoint.
        url: String,
        /// The OAuth2 error code (`invalid_grant`, `invalid_client`, ...).
        error: String,
        /// The endpoint's `error_description`.
        description: Option<String>,
    },
    /// The endpoint could not be reached, or did not answer in time.
    #[error("could not reach the OAuth2 token endpoint {url}")]
    Unreachable {
        /// The token endpoint.
        url: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The endpoint's host did not resolve.
    #[error("the OAuth2 token endpoint's host {host} does not resolve")]
    Unresolved {
        /// The host.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The endpoint's host is not a public address (and private ones are
    /// not allowed here).
    #[error(
        "the OAuth2 token endpoint's host {host} is {ip}, which is not a public address (the operator can allow \
         it with IMAP_ALLOW_PRIVATE=true)"
    )]
    Private {
        /// The host.
        host: String,
        /// The refused address.
        ip: IpAddr,
    },
    /// The endpoint answered an HTTP error that is no OAuth2 refusal (a
    /// 5xx, a 429): try again later.
    #[error("the OAuth2 token endpoint {url} answered HTTP {status}: {answer}")]
    Status {
        /// The token endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of its body.
        answer: String,
    },
    /// The endpoint answered 200 with something that is not a token.
    #[error("the OAuth2 token endpoint {url} answered without an access token: {answer}")]
    NoToken {
        /// The token endpoint.
        url: String,
        /// The start of its body.
        answer: String,
    },
    /// The endpoint is not a usable URL (stored grants are checked when
    /// they are made, so this is a changed rule or a corrupt row).
    #[error("the OAuth2 token endpoint {url:?} is not a usable URL")]
    BadUrl {
        /// As stored.
        url: String,
    },
    /// The HTTP client could not be set up.
    #[error("could not set up the HTTP client for the OAuth2 token endpoint")]
    Client(#[source] reqwest::Error),
}

impl TokenError {
    /// Whether the grant itself was refused (no retry can help).
    pub fn is_refused(&self) -> bool {
        matches!(self, TokenError::Refused { .. })
    }
}

#[derive(Debug, Clone)]
struct Cached {
    access_token: String,
    /// The refresh token to use next: the stored one, or the one the
    /// endpoint rotated it to.
    refresh_token: String,
    renew_at: Instant,
}

/// The process's access tokens, keyed by the stored grant. Cheap to clone;
/// clones share the tokens.
#[derive(Debug, Clone, Default)]
pub struct AccessTokens {
    cache: Arc<Mutex<HashMap<String, Cached>>>,
}

impl PartialEq for AccessTokens {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.cache, &other.cache)
    }
}

impl Eq for AccessTokens {}

/// How a token request goes out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenRequest<'a> {
    /// The roots the endpoint's certificate must chain to.
    pub tls: &'a TlsSettings,
    /// Whether the endpoint may be at a non-public address.
    pub allow_private: bool,
    /// Bound of the whole request.
    pub timeout: Duration,
}

fn key(grant: &OAuth2Grant) -> String {
    format!("{}\0{}\0{}", grant.token_url, grant.client_id, grant.refresh_token)
}

impl AccessTokens {
    /// An access token for `grant`: the kept one while it has time left,
    /// else a fresh one from the token endpoint.
    pub(crate) async fn access_token(&self, grant: &OAuth2Grant, how: TokenRequest<'_>) -> Result<String, TokenError> {
        let key = key(grant);
        let refresh_token = match self.cache.lock().get(&key) {
            Some(c) if Instant::now() < c.renew_at => return Ok(c.access_token.clone()),
            Some(c) => c.refresh_token.clone(),
            None => grant.refresh_token.clone(),
        };
        let fresh = refresh(grant, &refresh_token, how).await?;
        let lifetime = fresh.lifetime;
        let renew_at = Instant::now() + lifetime.saturating_sub(RENEW_MARGIN.min(lifetime / 4));
        let cached = Cached {
            access_token: fresh.access_token.clone(),
            refresh_token: fresh.refresh_token.unwrap_or(refresh_token),
            renew_at,
        };
        self.cache.lock().insert(key, cached);
        Ok(fresh.access_token)
    }

    /// The refresh token the endpoint rotated `grant`'s to, if it did: the
    /// one to store.
    pub(crate) fn rotated(&self, grant: &OAuth2Grant) -> Option<String> {
        let cache = self.cache.lock();
        cache.get(&key(grant)).map(|c| c.refresh_token.clone()).filter(|r| *r != grant.refresh_token)
    }

    /// Drops `grant`'s access token (the server refused it), so the next
    /// login fetches a new one; a rotated refresh token is kept.
    pub(crate) fn forget(&self, grant: &OAuth2Grant) {
        if let Some(c) = self.cache.lock().get_mut(&key(grant)) {
            c.renew_at = Instant::now();
        }
    }

    /// Moves what is kept for `old` to `new` (the same grant, stored with
    /// its rotated refresh token).
    pub(crate) fn moved(&self, old: &OAuth2Grant, new: &OAuth2Grant) {
        let mut cache = self.cache.lock();
        if let Some(c) = cache.remove(&key(old)) {
            cache.insert(key(new), c);
        }
    }
}

struct Fresh {
    access_token: String,
    lifetime: Duration,
    refresh_token: Option<String>,
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: Option<String>,
    expires_in: Option<serde_json::Value>,
    refresh_token: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

fn quoted(body: &str) -> String {
    let mut s: String = body.chars().filter(|c| !c.is_control()).take(QUOTED_ANSWER).collect();
    if body.chars().count() > QUOTED_ANSWER {
        s.push('…');
    }
    s
}

/// The addresses the endpoint's host may be reached at: checked against
/// the address rule, and pinned, so DNS cannot answer differently between
/// the check and the request.
async fn endpoint_addresses(url: &url::Url, allow_private: bool) -> Result<Option<Vec<SocketAddr>>, TokenError> {
    let port = url.port_or_known_default().unwrap_or(443);
    let (host, found) = match url.host() {
        None => return Err(TokenError::BadUrl { url: url.to_string() }),
        Some(url::Host::Ipv4(ip)) => (ip.to_string(), vec![SocketAddr::new(IpAddr::V4(ip), port)]),
        Some(url::Host::Ipv6(ip)) => (ip.to_string(), vec![SocketAddr::new(IpAddr::V6(ip), port)]),
        Some(url::Host::Domain(d)) => {
            let found = tokio::net::lookup_host((d, port))
                .await
                .map_err(|source| TokenError::Unresolved { host: d.to_string(), source })?
                .collect();
            (d.to_string(), found)
        }
    };
    if !allow_private {
        if let Some(bad) = found.iter().find(|a| !is_public(a.ip())) {
            return Err(TokenError::Private { host, ip: bad.ip() });
        }
    }
    Ok(matches!(url.host(), Some(url::Host::Domain(_))).then_some(found))
}

async fn refresh(grant: &OAuth2Grant, refresh_token: &str, how: TokenRequest<'_>) -> Result<Fresh, TokenError> {
    let url_text = grant.token_url.clone();
    let url = url::Url::parse(&grant.token_url).map_err(|_| TokenError::BadUrl { url: url_text.clone() })?;
    let mut builder = reqwest::Client::builder()
        .use_preconfigured_tls((*how.tls.client_config()).clone())
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(how.timeout)
        .timeout(how.timeout)
        .user_agent(concat!("sync-worker/", env!("CARGO_PKG_VERSION")));
    if let (Some(addrs), Some(domain)) = (endpoint_addresses(&url, how.allow_private).await?, url.host_str()) {
        builder = builder.resolve_to_addrs(domain, &addrs);
    }
    let client = builder.build().map_err(TokenError::Client)?;
    let mut form = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh_token),
        ("client_id", grant.client_id.as_str()),
    ];
    if let Some(secret) = &grant.client_secret {
        form.push(("client_secret", secret));
    }
    if let Some(scope) = &grant.scope {
        form.push(("scope", scope));
    }
    let unreachable = |source| TokenError::Unreachable { url: url_text.clone(), source };
    let response = client.post(url).form(&form).send().await.map_err(unreachable)?;
    let status = response.status();
    let body = response.text().await.map_err(unreachable)?;
    let answer: Option<TokenAnswer> = serde_json::from_str(&body).ok();
    if status.is_success() {
        let Some(TokenAnswer { access_token: Some(access_token), expires_in, refresh_token, .. }) = answer else {
            return Err(TokenError::NoToken { url: url_text, answer: quoted(&body) });
        };
        // Some endpoints send expires_in as a string.
        let seconds = expires_in.and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())));
        let lifetime = seconds.map_or(DEFAULT_LIFETIME, Duration::from_secs).max(Duration::from_secs(1));
        return Ok(Fresh { access_token, lifetime, refresh_token: refresh_token.filter(|r| !r.is_empty()) });
    }
    match answer {
        // RFC 6749 §5.2: a refusal is a 400 (or 401) with an error code.
        Some(TokenAnswer { error: Some(error), error_description, .. })
            if matches!(status.as_u16(), 400 | 401 | 403) =>
        {
            Err(TokenError::Refused { url: url_text, error, description: error_description.map(|d| quoted(&d)) })
        }
        _ => Err(TokenError::Status { url: url_text, status: status.as_u16(), answer: quoted(&body) }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn answers_are_quoted_short_and_printable() {
        let long = "x".repeat(500);
        let q = super::quoted(&long);
        assert_eq!(q.chars().count(), super::QUOTED_ANSWER + 1);
        assert_eq!(super::quoted("a\r\nb\0c"), "abc");
    }
}
