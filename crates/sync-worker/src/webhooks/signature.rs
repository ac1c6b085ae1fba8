//! How a delivery is signed: `X-Webhook-Signature: sha256=<hex>`, the
//! HMAC-SHA256 of the exact body bytes under the webhook's secret (the
//! scheme GitHub's webhooks use). A receiver recomputes it over the raw
//! body it read, before parsing, and compares in constant time:
//!
//! ```sh
//! printf '%s' "$BODY" | openssl dgst -sha256 -hmac "$SECRET" -hex   # = the hex after sha256=
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "x-webhook-signature";

/// A fresh signing secret: `whsec_` and 32 random bytes in hex.
pub fn new_secret() -> String {
    use chacha20poly1305::aead::rand_core::RngCore as _;
    let mut bytes = [0u8; 32];
    chacha20poly1305::aead::OsRng.fill_bytes(&mut bytes);
    format!("whsec_{}", hex(&bytes))
}

/// The header value for `body` under `secret`: `sha256=<hex>`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    format!("sha256={}", hex(&mac(secret, body).finalize().into_bytes()))
}

/// Whether `header` is `body`'s signature under `secret` (constant time).
pub fn verify(secret: &str, body: &[u8], header: &str) -> bool {
    let Some(given) = header.strip_prefix("sha256=").and_then(unhex) else { return false };
    mac(secret, body).verify_slice(&given).is_ok()
}

fn mac(secret: &str, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length: new_from_slice cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(body);
    mac
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_rfc_4231_test_case_2() {
        // Key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn verifies_only_the_same_body_and_secret() {
        let header = sign("s3cret", b"{\"id\":1}");
        assert!(verify("s3cret", b"{\"id\":1}", &header));
        assert!(!verify("s3cret", b"{\"id\":2}", &header));
        assert!(!verify("other", b"{\"id\":1}", &header));
        assert!(!verify("s3cret", b"{\"id\":1}", "sha256=zz"));
        assert!(!verify("s3cret", b"{\"id\":1}", header.trim_start_matches("sha256=")));
    }

    #[test]
    fn secrets_are_fresh_and_long() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert_eq!(a.len(), "whsec_".len() + 64);
    }
}
