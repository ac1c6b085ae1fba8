//! Which servers' certificates are trusted, and why one was not, in words.
//!
//! The roots are the system's (rustls-native-certs: the platform store, or
//! `SSL_CERT_FILE` / `SSL_CERT_DIR` when set, as for OpenSSL programs), plus
//! the certificates of `IMAP_CA_FILE`. A rejected certificate is reported as
//! what is wrong with it (the name, the dates, the issuer, self-signed), not
//! as rustls's enum names and not as an unreachable server.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, Error as RustlsError, OtherError, RootCertStore,
    SignatureScheme,
};

/// Extra trusted roots read from a PEM file (`IMAP_CA_FILE`).
#[derive(Clone)]
pub struct CaFile {
    /// Where they were read from.
    pub path: PathBuf,
    /// The certificates, in file order.
    pub certs: Arc<Vec<CertificateDer<'static>>>,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaFile({}, {} certificates)", self.path.display(), self.certs.len())
    }
}

impl PartialEq for CaFile {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.certs == other.certs
    }
}

/// Why a CA file cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CaFileError {
    /// The file could not be read, or a PEM section in it is broken.
    #[error("cannot read the CA certificates in {path}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<tokio_rustls::rustls::pki_types::pem::Error>,
    },
    /// The file holds no `BEGIN CERTIFICATE` section.
    #[error("{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A certificate in it is not one rustls can use as a root.
    #[error("certificate {index} of {path} cannot be a trusted root")]
    NotARoot {
        /// The file.
        path: PathBuf,
        /// Its position in the file, from 1.
        index: usize,
        /// Why.
        #[source]
        source: RustlsError,
    },
}

/// Equal when they say the same (the PEM error is neither `Clone` nor `PartialEq`).
impl PartialEq for CaFileError {
    fn eq(&self, other: &Self) -> bool {
        crate::errors::error_chain(self) == crate::errors::error_chain(other)
    }
}

impl CaFile {
    /// Reads every certificate of a PEM file; it must hold at least one, and
    /// each must be usable as a root.
    pub fn load(path: &Path) -> Result<Self, CaFileError> {
        let unreadable = |source| CaFileError::Unreadable { path: path.to_path_buf(), source: Arc::new(source) };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(unreadable)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(unreadable)?;
        if certs.is_empty() {
            return Err(CaFileError::Empty { path: path.to_path_buf() });
        }
        let mut store = RootCertStore::empty();
        for (i, cert) in certs.iter().enumerate() {
            store.add(cert.clone()).map_err(|source| CaFileError::NotARoot {
                path: path.to_path_buf(),
                index: i + 1,
                source,
            })?;
        }
        Ok(Self { path: path.to_path_buf(), certs: Arc::new(certs) })
    }
}

/// The client side of TLS: the roots and the verifier that explains its
/// refusals. Cheap to clone; equal when it is the same configuration.
#[derive(Clone)]
pub struct TlsSettings {
    config: Arc<ClientConfig>,
    extra: Option<PathBuf>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.extra {
            Some(p) => write!(f, "TlsSettings(system roots + {})", p.display()),
            None => write!(f, "TlsSettings(system roots)"),
        }
    }
}

impl PartialEq for TlsSettings {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl Eq for TlsSettings {}

impl Default for TlsSettings {
    /// The system's roots only (built once per process).
    fn default() -> Self {
        static SYSTEM: OnceLock<TlsSettings> = OnceLock::new();
        SYSTEM.get_or_init(|| Self::build(None)).clone()
    }
}

/// The system's roots, read once: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set,
/// otherwise the platform's store.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "some system root certificates could not be read");
        }
        if found.certs.is_empty() {
            tracing::warn!("no system root certificates found: TLS servers are trusted only through IMAP_CA_FILE");
        }
        found.certs
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

impl TlsSettings {
    /// The system's roots plus the certificates of `ca` (`IMAP_CA_FILE`).
    pub fn with_ca_file(ca: Option<&CaFile>) -> Self {
        match ca {
            None => Self::default(),
            Some(ca) => Self::build(Some(ca)),
        }
    }

    fn build(ca: Option<&CaFile>) -> Self {
        let mut roots = RootCertStore::empty();
        // Unusable system roots are skipped (a distribution bundle can hold
        // one rustls rejects); IMAP_CA_FILE's were checked at start.
        let (_added, _skipped) = roots.add_parsable_certificates(system_roots().iter().cloned());
        for cert in ca.iter().flat_map(|c| c.certs.iter()) {
            let _ = roots.add(cert.clone());
        }
        let provider = provider();
        // webpki refuses to build on an empty store (a bare container):
        // then every certificate is "not trusted", which Explaining says.
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().ok();
        if webpki.is_none() {
            tracing::warn!("no trusted TLS roots: every TLS server will be refused until IMAP_CA_FILE names one");
        }
        let verifier = Arc::new(Explaining { webpki, provider: provider.clone() });
        let config = match ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions() {
            Ok(b) => b.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth(),
            // ring supports the default protocol versions: this cannot happen.
            Err(e) => unreachable!("rustls rejected its own default protocol versions: {e}"),
        };
        Self { config: Arc::new(config), extra: ca.map(|c| c.path.clone()) }
    }

    /// The rustls configuration.
    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

/// What was wrong with a server's certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateProblem {
    /// The certificate names other hosts.
    #[error("the certificate is for {presented}, not for {expected} (the name does not match)")]
    WrongName {
        /// The host we connected to.
        expected: String,
        /// The names in the certificate.
        presented: String,
    },
    /// Past its notAfter date.
    #[error("the certificate has expired{}", .not_after.as_ref().map(|d| format!(" (on {d} UTC)")).unwrap_or_default())]
    Expired {
        /// Its notAfter, as `YYYY-MM-DD HH:MM:SS`, when rustls says.
        not_after: Option<String>,
    },
    /// Before its notBefore date.
    #[error("the certificate is not valid yet{}", .not_before.as_ref().map(|d| format!(" (valid from {d} UTC)")).unwrap_or_default())]
    NotValidYet {
        /// Its notBefore, when rustls says.
        not_before: Option<String>,
    },
    /// Signed by itself, and not among the trusted roots.
    #[error("the certificate is self-signed ({subject}) and not trusted; add it with IMAP_CA_FILE to trust it")]
    SelfSigned {
        /// Its subject.
        subject: String,
    },
    /// Its issuer is not among the trusted roots.
    #[error("the certificate is not trusted: its issuer {issuer} is not among the trusted roots (the system's, SSL_CERT_FILE, SSL_CERT_DIR, IMAP_CA_FILE)")]
    UntrustedIssuer {
        /// The issuer's name.
        issuer: String,
    },
    /// Anything else rustls refused.
    #[error("the certificate was refused: {0}")]
    Other(String),
}

/// The certificate problem behind a failed handshake, if that was the cause.
pub(crate) fn certificate_problem(e: &std::io::Error) -> Option<CertificateProblem> {
    let rustls = e.get_ref()?.downcast_ref::<RustlsError>()?;
    let RustlsError::InvalidCertificate(cert) = rustls else { return None };
    Some(match cert {
        CertificateError::NotValidForNameContext { expected, presented } => CertificateProblem::WrongName {
            expected: server_name(expected),
            presented: if presented.is_empty() { "no name at all".into() } else { presented.join(", ") },
        },
        CertificateError::NotValidForName => {
            CertificateProblem::WrongName { expected: "this host".into(), presented: "other names".into() }
        }
        CertificateError::ExpiredContext { not_after, .. } => {
            CertificateProblem::Expired { not_after: Some(date(*not_after)) }
        }
        CertificateError::Expired => CertificateProblem::Expired { not_after: None },
        CertificateError::NotValidYetContext { not_before, .. } => {
            CertificateProblem::NotValidYet { not_before: Some(date(*not_before)) }
        }
        CertificateError::NotValidYet => CertificateProblem::NotValidYet { not_before: None },
        CertificateError::Other(OtherError(inner)) => match inner.downcast_ref::<CertificateProblem>() {
            Some(p) => p.clone(),
            None => CertificateProblem::Other(inner.to_string()),
        },
        other => CertificateProblem::Other(format!("{other:?}")),
    })
}

fn server_name(name: &ServerName<'_>) -> String {
    match name {
        ServerName::DnsName(d) => d.as_ref().to_string(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

/// `YYYY-MM-DD HH:MM:SS` of a Unix time (UTC), without a date crate:
/// the civil-from-days algorithm (Howard Hinnant's).
fn date(t: UnixTime) -> String {
    let secs = t.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

/// A name (DER, without its outer SEQUENCE) in words: its CN and O, which
/// is what people recognise a CA by.
fn name_in_words(der: &[u8]) -> String {
    let mut parts = Vec::new();
    for (oid, label) in [([0x55, 0x04, 0x03], "CN"), ([0x55, 0x04, 0x0a], "O")] {
        let needle = [0x06, 0x03, oid[0], oid[1], oid[2]];
        let Some(at) = der.windows(needle.len()).position(|w| w == needle) else { continue };
        let rest = &der[at + needle.len()..];
        // A string type (UTF8, Printable, T61, IA5, BMP) with a short length.
        if let [tag, len, value @ ..] = rest {
            let len = usize::from(*len);
            if matches!(tag, 0x0c | 0x13 | 0x14 | 0x16 | 0x1e) && len < 0x80 && value.len() >= len {
                parts.push(format!("{label}={}", String::from_utf8_lossy(&value[..len])));
            }
        }
    }
    if parts.is_empty() {
        "(a name without CN or O)".into()
    } else {
        format!("\"{}\"", parts.join(", "))
    }
}

/// webpki's verifier, with its refusals of the issuer turned into words:
/// self-signed (issuer = subject) or the issuer's name.
#[derive(Debug)]
struct Explaining {
    /// `None` when there is no trusted root at all.
    webpki: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl Explaining {
    fn explain(end_entity: &CertificateDer<'_>, e: RustlsError) -> RustlsError {
        // rustls passes webpki's CaUsedAsEndEntity (a self-signed CA
        // certificate presented by the server) on as an Other.
        let untrusted = match &e {
            RustlsError::InvalidCertificate(CertificateError::UnknownIssuer) => true,
            RustlsError::InvalidCertificate(CertificateError::Other(OtherError(inner))) => {
                matches!(inner.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
            }
            _ => false,
        };
        if !untrusted {
            return e;
        }
        let Ok(cert) = webpki::EndEntityCert::try_from(end_entity) else { return e };
        let problem = if cert.issuer() == cert.subject() {
            CertificateProblem::SelfSigned { subject: name_in_words(cert.subject()) }
        } else {
            CertificateProblem::UntrustedIssuer { issuer: name_in_words(cert.issuer()) }
        };
        RustlsError::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(problem))))
    }
}

impl ServerCertVerifier for Explaining {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, RustlsError> {
        match &self.webpki {
            Some(w) => w
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
                .map_err(|e| Self::explain(end_entity, e)),
            None => Err(Self::explain(end_entity, RustlsError::InvalidCertificate(CertificateError::UnknownIssuer))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RustlsError> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(date(UnixTime::since_unix_epoch(std::time::Duration::from_secs(0))), "1970-01-01 00:00:00");
        assert_eq!(
            date(UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_709_210_096))),
            "2024-02-29 12:34:56"
        );
    }

    #[test]
    fn names_show_cn_and_o() {
        // SET { SEQ { OID 2.5.4.3, UTF8 "Test CA" } }, SET { SEQ { OID 2.5.4.10, Printable "ACME" } }
        let der = [
            0x31, 0x10, 0x30, 0x0e, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x07, b'T', b'e', b's', b't', b' ', b'C', b'A',
            0x31, 0x0d, 0x30, 0x0b, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x13, 0x04, b'A', b'C', b'M', b'E',
        ];
        assert_eq!(name_in_words(&der), "\"CN=Test CA, O=ACME\"");
        assert_eq!(name_in_words(&[]), "(a name without CN or O)");
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let e = CaFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate") && e.contains("ca.pem"), "{e}");
        let e = CaFile::load(&dir.path().join("missing.pem")).unwrap_err().to_string();
        assert!(e.contains("cannot read") && e.contains("missing.pem"), "{e}");
    }
}
