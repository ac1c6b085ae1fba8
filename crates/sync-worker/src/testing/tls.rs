//! A private certificate authority for TLS tests, made with the `openssl`
//! command: a CA, server certificates it signs (for chosen names, valid or
//! already expired), and self-signed ones.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{find_binary, output, HarnessError, Result};

const INSTALL: &str = "install Debian's openssl package";

/// A server certificate and its key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCert {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, unencrypted).
    pub key: PathBuf,
}

/// A CA of its own in a temp dir, removed on drop.
#[derive(Debug)]
pub struct PrivateCa {
    dir: tempfile::TempDir,
    openssl: PathBuf,
    /// The CA's common name (`Leasehold Test CA`).
    pub name: String,
}

impl PrivateCa {
    /// Makes a CA (an EC P-256 key, valid for two days).
    pub fn new() -> Result<Self> {
        let openssl = find_binary("openssl", &["/usr/bin/openssl"])
            .ok_or(HarnessError::Missing { program: "openssl".into(), install: INSTALL })?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-ca-")
            .tempdir()
            .map_err(HarnessError::io("make a temp dir for the CA"))?;
        let ca = Self { dir, openssl, name: "Leasehold Test CA".into() };
        let mut cmd = ca.openssl();
        cmd.args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
            .arg("-subj")
            .arg(format!("/CN={}", ca.name))
            .arg("-keyout")
            .arg(ca.path("ca.key"))
            .arg("-out")
            .arg(ca.ca_file());
        output("make the test CA", cmd, None)?;
        Ok(ca)
    }

    fn openssl(&self) -> Command {
        Command::new(&self.openssl)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA's certificate (PEM): what `IMAP_CA_FILE` names.
    pub fn ca_file(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A server certificate signed by this CA for `names` (`IP:127.0.0.1`,
    /// `DNS:localhost`), valid for `days` from now; `days = -1` makes one
    /// that expired yesterday (openssl then sets notAfter a day before
    /// notBefore, which verifiers report as expired).
    pub fn issue(&self, file: &str, names: &[&str], days: i32) -> Result<ServerCert> {
        let key = self.path(&format!("{file}.key"));
        let csr = self.path(&format!("{file}.csr"));
        let ext = self.path(&format!("{file}.ext"));
        let cert = self.path(&format!("{file}.pem"));
        self.key_and_request(&key, &csr, "leasehold test server")?;
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
                names.join(",")
            ),
        )
        .map_err(HarnessError::io(format!("write {}", ext.display())))?;
        let mut cmd = self.openssl();
        cmd.args(["x509", "-req", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(self.ca_file())
            .arg("-CAkey")
            .arg(self.path("ca.key"))
            .arg("-CAcreateserial")
            .arg("-days")
            .arg(days.to_string())
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(&cert);
        output(&format!("sign the test certificate {file}"), cmd, None)?;
        Ok(ServerCert { cert, key })
    }

    /// A certificate for `names` that signs itself (no CA), valid for two days.
    pub fn self_signed(&self, file: &str, names: &[&str]) -> Result<ServerCert> {
        let key = self.path(&format!("{file}.key"));
        let cert = self.path(&format!("{file}.pem"));
        let mut cmd = self.openssl();
        cmd.args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=leasehold self-signed"])
            .arg("-addext")
            .arg(format!("subjectAltName={}", names.join(",")))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert);
        output(&format!("make the self-signed certificate {file}"), cmd, None)?;
        Ok(ServerCert { cert, key })
    }

    fn key_and_request(&self, key: &Path, csr: &Path, cn: &str) -> Result<()> {
        let mut cmd = self.openssl();
        cmd.args(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"])
            .arg("-subj")
            .arg(format!("/CN={cn}"))
            .arg("-keyout")
            .arg(key)
            .arg("-out")
            .arg(csr);
        output("make a test key and request", cmd, None)?;
        Ok(())
    }
}
