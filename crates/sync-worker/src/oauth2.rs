//! What an OAuth2 account stores: where to refresh its access token, as
//! whom, and the refresh token itself; checked once, when it is made.

use std::fmt;

/// A provider whose token endpoint, scope and IMAP server are known.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OAuth2Provider {
    /// Gmail and Google Workspace: `imap.gmail.com:993`, scope
    /// `https://mail.google.com/`.
    Google,
    /// Microsoft 365 and Outlook.com: `outlook.office365.com:993`, scope
    /// `https://outlook.office.com/IMAP.AccessAsUser.All offline_access`.
    Microsoft,
}

impl OAuth2Provider {
    /// The provider's token endpoint.
    pub fn token_url(self) -> &'static str {
        match self {
            OAuth2Provider::Google => "https://oauth2.googleapis.com/token",
            OAuth2Provider::Microsoft => "https://login.microsoftonline.com/common/oauth2/v2.0/token",
        }
    }

    /// The scope a refresh asks for (Microsoft needs it on every refresh).
    pub fn scope(self) -> &'static str {
        match self {
            OAuth2Provider::Google => "https://mail.google.com/",
            OAuth2Provider::Microsoft => "https://outlook.office.com/IMAP.AccessAsUser.All offline_access",
        }
    }

    /// The provider's IMAP server (TLS from the first byte).
    pub fn imap_server(self) -> (&'static str, u16) {
        match self {
            OAuth2Provider::Google => ("imap.gmail.com", 993),
            OAuth2Provider::Microsoft => ("outlook.office365.com", 993),
        }
    }
}

/// An account's OAuth2 grant: enough to get a fresh access token at any
/// time. Stored encrypted, like passwords.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OAuth2Grant {
    /// The token endpoint (`https`, or `http` to a loopback address).
    pub token_url: String,
    /// The OAuth2 client id.
    pub client_id: String,
    /// The client secret; `None` for a public client.
    pub client_secret: Option<String>,
    /// The refresh token; replaced when the endpoint rotates it.
    pub refresh_token: String,
    /// The scope asked for on refresh, if the provider needs one.
    pub scope: Option<String>,
}

/// What is wrong with an OAuth2 grant, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// A required field is empty.
    #[error("the OAuth2 {0} is empty: it is required")]
    Empty(&'static str),
    /// The token endpoint is not a URL.
    #[error("the OAuth2 token endpoint {url:?} is not a URL: {reason}")]
    BadUrl {
        /// As given.
        url: String,
        /// The parser's words.
        reason: String,
    },
    /// The token endpoint is `http` to a host that is not loopback.
    #[error("the OAuth2 token endpoint {0:?} is not https: tokens may travel unencrypted only to a loopback address")]
    NotHttps(String),
}

impl OAuth2Grant {
    /// A grant, checked: every field present, and the endpoint `https` (or
    /// `http` to loopback, as a test's or a local identity server's).
    pub fn new(
        token_url: String,
        client_id: String,
        client_secret: Option<String>,
        refresh_token: String,
        scope: Option<String>,
    ) -> Result<Self, GrantError> {
        let token_url = token_url.trim().to_string();
        if token_url.is_empty() {
            return Err(GrantError::Empty("token endpoint"));
        }
        let parsed = url::Url::parse(&token_url)
            .map_err(|e| GrantError::BadUrl { url: token_url.clone(), reason: e.to_string() })?;
        match parsed.scheme() {
            "https" => {}
            "http" if is_loopback_host(&parsed) => {}
            "http" => return Err(GrantError::NotHttps(token_url)),
            other => {
                return Err(GrantError::BadUrl {
                    url: token_url.clone(),
                    reason: format!("the scheme {other:?} is not https"),
                })
            }
        }
        if client_id.trim().is_empty() {
            return Err(GrantError::Empty("client id"));
        }
        if refresh_token.trim().is_empty() {
            return Err(GrantError::Empty("refresh token"));
        }
        let client_secret = client_secret.filter(|s| !s.is_empty());
        let scope = scope.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        Ok(Self { token_url, client_id: client_id.trim().to_string(), client_secret, refresh_token, scope })
    }
}

/// A grant from its parts: `provider` gives the token endpoint and scope,
/// which `token_url` and `scope` override.
pub fn grant_from(
    provider: Option<OAuth2Provider>,
    token_url: Option<String>,
    client_id: String,
    client_secret: Option<String>,
    refresh_token: String,
    scope: Option<String>,
) -> Result<OAuth2Grant, GrantError> {
    let token_url = token_url
        .or_else(|| provider.map(|p| p.token_url().to_string()))
        .ok_or(GrantError::Empty("token endpoint (give it, or a provider)"))?;
    let scope = scope.or_else(|| provider.map(|p| p.scope().to_string()));
    OAuth2Grant::new(token_url, client_id, client_secret, refresh_token, scope)
}

fn is_loopback_host(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

impl fmt::Debug for OAuth2Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuth2Grant")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("refresh_token", &"<redacted>")
            .field("scope", &self.scope)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(url: &str) -> Result<OAuth2Grant, GrantError> {
        OAuth2Grant::new(url.into(), "client".into(), Some(String::new()), "refresh".into(), None)
    }

    #[test]
    fn endpoints_are_https_or_loopback() {
        assert!(grant("https://oauth2.googleapis.com/token").is_ok());
        assert!(grant("http://127.0.0.1:8080/token").is_ok());
        assert!(grant("http://localhost/token").is_ok());
        assert!(grant("http://[::1]:9/token").is_ok());
        assert_eq!(grant("http://example.com/token"), Err(GrantError::NotHttps("http://example.com/token".into())));
        assert!(matches!(grant("ftp://example.com/"), Err(GrantError::BadUrl { .. })));
        assert!(matches!(grant("not a url"), Err(GrantError::BadUrl { .. })));
        assert_eq!(grant(""), Err(GrantError::Empty("token endpoint")));
    }

    #[test]
    fn fields_are_required_and_an_empty_secret_is_none() {
        let g = grant("https://x.example/token").unwrap();
        assert_eq!(g.client_secret, None);
        let e = OAuth2Grant::new("https://x.example/t".into(), " ".into(), None, "r".into(), None).unwrap_err();
        assert_eq!(e, GrantError::Empty("client id"));
        let e = OAuth2Grant::new("https://x.example/t".into(), "c".into(), None, "".into(), None).unwrap_err();
        assert_eq!(e, GrantError::Empty("refresh token"));
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let g =
            OAuth2Grant::new("https://x.example/t".into(), "c".into(), Some("s3cret".into()), "r3fresh".into(), None)
                .unwrap();
        let shown = format!("{g:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("r3fresh"), "{shown}");
    }

    #[test]
    fn presets_name_their_endpoint_and_scope() {
        let g = grant_from(Some(OAuth2Provider::Microsoft), None, "c".into(), None, "r".into(), None).unwrap();
        assert_eq!(g.token_url, "https://login.microsoftonline.com/common/oauth2/v2.0/token");
        assert!(g.scope.as_deref().unwrap().contains("IMAP.AccessAsUser.All"));
        assert_eq!(OAuth2Provider::Google.imap_server(), ("imap.gmail.com", 993));
        let own = grant_from(
            Some(OAuth2Provider::Google),
            Some("https://t.example/".into()),
            "c".into(),
            None,
            "r".into(),
            None,
        );
        assert_eq!(own.unwrap().token_url, "https://t.example/");
        let none = grant_from(None, None, "c".into(), None, "r".into(), None);
        assert!(matches!(none, Err(GrantError::Empty(_))));
    }
}
