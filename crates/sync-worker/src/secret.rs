//! The key that encrypts IMAP passwords at rest (ChaCha20-Poly1305).
//!
//! It comes from `SECRET_KEY` (base64 of 32 bytes) or, when that is unset,
//! from a key file (default `sync-worker.key`, `SECRET_KEY_FILE` to move
//! it): generated on first use with mode 0600, and said so in the log. A
//! ciphertext is bound to its account (the account id is the associated
//! data), so a row copied onto another account does not decrypt.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

/// The nonce length of ChaCha20-Poly1305.
const NONCE_LEN: usize = 12;

/// What is wrong with a key or a ciphertext.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// `SECRET_KEY` or the key file does not hold base64 of exactly 32 bytes.
    #[error("{origin} is not a key: expected base64 of exactly 32 bytes (make one with `openssl rand -base64 32`)")]
    Malformed {
        /// `SECRET_KEY` or the key file's path.
        origin: String,
    },
    /// The key file could not be read or created.
    #[error("key file {path}: could not {op} it")]
    File {
        /// The path.
        path: PathBuf,
        /// `read` or `create`.
        op: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key file can be read by others.
    #[error("key file {path} has mode {mode:o}: it must be readable by its owner only (chmod 600 {path})")]
    Exposed {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A stored password does not decrypt with this key (another key, or a
    /// damaged row).
    #[error("the stored password of account {account} does not decrypt with this SECRET_KEY (was it changed?)")]
    Undecryptable {
        /// The account.
        account: String,
    },
}

/// The password key. Its `Debug` shows nothing of the key.
#[derive(Clone)]
pub struct SecretKey {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl SecretKey {
    /// A key from base64 text (`SECRET_KEY`); `origin` names it in errors.
    pub fn from_base64(text: &str, origin: &str) -> Result<Self, SecretError> {
        let bytes = B64.decode(text.trim()).map_err(|_| SecretError::Malformed { origin: origin.to_string() })?;
        if bytes.len() != 32 {
            return Err(SecretError::Malformed { origin: origin.to_string() });
        }
        Ok(Self { cipher: ChaCha20Poly1305::new(Key::from_slice(&bytes)) })
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        Self { cipher: ChaCha20Poly1305::new(&ChaCha20Poly1305::generate_key(&mut OsRng)) }
    }

    /// The key from `SECRET_KEY` when set (and not empty), else from the key
    /// file `path`, generated (mode 0600) when missing.
    pub fn load(env_value: Option<&str>, path: &Path) -> Result<Self, SecretError> {
        match env_value.filter(|v| !v.trim().is_empty()) {
            Some(v) => Self::from_base64(v, "SECRET_KEY"),
            None => Self::from_file(path),
        }
    }

    /// The key in the file `path`, generated when the file is missing.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mode = std::fs::metadata(path)
                    .map_err(|source| SecretError::File { path: path.into(), op: "read", source })?
                    .permissions()
                    .mode()
                    & 0o777;
                if mode & 0o077 != 0 {
                    return Err(SecretError::Exposed { path: path.into(), mode });
                }
                Self::from_base64(&text, &path.display().to_string())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let raw = ChaCha20Poly1305::generate_key(&mut OsRng);
                let create = |source| SecretError::File { path: path.into(), op: "create", source };
                let mut file =
                    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(create)?;
                file.write_all(format!("{}\n", B64.encode(raw)).as_bytes()).map_err(create)?;
                file.sync_all().map_err(create)?;
                tracing::warn!(path = %path.display(), "SECRET_KEY is unset: generated a new password key file (mode 0600); keep it, or stored IMAP passwords cannot be read");
                Ok(Self { cipher: ChaCha20Poly1305::new(&raw) })
            }
            Err(source) => Err(SecretError::File { path: path.into(), op: "read", source }),
        }
    }

    /// Encrypts `password` for `account`: base64(nonce || ciphertext).
    pub fn seal(&self, account: &str, password: &str) -> String {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        // Encryption into a Vec cannot fail for inputs this small.
        let ct = self
            .cipher
            .encrypt(&nonce, Payload { msg: password.as_bytes(), aad: account.as_bytes() })
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        B64.encode(out)
    }

    /// Decrypts what [`SecretKey::seal`] made for `account`.
    pub fn open(&self, account: &str, sealed: &str) -> Result<String, SecretError> {
        let bad = || SecretError::Undecryptable { account: account.to_string() };
        let raw = B64.decode(sealed).map_err(|_| bad())?;
        if raw.len() < NONCE_LEN {
            return Err(bad());
        }
        let (nonce, ct) = raw.split_at(NONCE_LEN);
        let pt = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: account.as_bytes() })
            .map_err(|_| bad())?;
        String::from_utf8(pt).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens_bound_to_the_account() {
        let key = SecretKey::generate();
        let sealed = key.seal("a1", "hunter2");
        assert!(!sealed.contains("hunter2"));
        assert_eq!(key.open("a1", &sealed).unwrap(), "hunter2");
        assert!(matches!(key.open("a2", &sealed), Err(SecretError::Undecryptable { .. })));
        assert!(SecretKey::generate().open("a1", &sealed).is_err());
        assert_ne!(key.seal("a1", "hunter2"), sealed, "a fresh nonce each time");
    }

    #[test]
    fn bad_keys_are_rejected_with_the_fix() {
        let e = SecretKey::from_base64("c2hvcnQ=", "SECRET_KEY").unwrap_err().to_string();
        assert!(e.contains("SECRET_KEY") && e.contains("32 bytes"), "{e}");
        assert!(SecretKey::from_base64("not base64!", "SECRET_KEY").is_err());
        assert!(SecretKey::from_base64(&B64.encode([7u8; 32]), "SECRET_KEY").is_ok());
    }

    #[test]
    fn key_file_is_generated_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let a = SecretKey::from_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = SecretKey::from_file(&path).unwrap();
        assert_eq!(b.open("x", &a.seal("x", "pw")).unwrap(), "pw");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(SecretKey::from_file(&path), Err(SecretError::Exposed { .. })));
    }
}
