//! `X-Hub-Signature-256` verification: `sha256=<hex>` HMAC-SHA256 of the raw body, checked in
//! constant time against each configured secret (several while one is rotated).
use hmac::{KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Why a webhook was refused. Each displays as a sentence for the sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "GitHub webhooks are not configured on this Steward (GITHUB_WEBHOOK_SECRET is not set)."
    )]
    NoSecret,
    #[error("The request has no X-Hub-Signature-256 header; set a secret on the GitHub webhook.")]
    Missing,
    #[error("X-Hub-Signature-256 must be sha256= followed by 64 hex digits.")]
    Malformed,
    #[error("X-Hub-Signature-256 does not match: the webhook's secret is not one Steward knows.")]
    Mismatch,
}

/// Checks `header` (the `X-Hub-Signature-256` value) over `body` against every secret.
pub fn verify(
    secrets: &[SecretString],
    header: Option<&str>,
    body: &[u8],
) -> Result<(), SignatureError> {
    if secrets.is_empty() {
        return Err(SignatureError::NoSecret);
    }
    let header = header.ok_or(SignatureError::Missing)?.trim();
    let hex_sig = header
        .strip_prefix("sha256=")
        .ok_or(SignatureError::Malformed)?;
    let expected = hex::decode(hex_sig).map_err(|_| SignatureError::Malformed)?;
    if expected.len() != 32 {
        return Err(SignatureError::Malformed);
    }
    // Every secret is tried (no early exit), so timing does not say which one matched.
    let mut matched = false;
    for secret in secrets {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret.expose_secret().as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(body);
        matched |= mac.verify_slice(&expected).is_ok();
    }
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The header value GitHub would send for `body` signed with `secret` (tests and tools).
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(list: &[&str]) -> Vec<SecretString> {
        list.iter()
            .map(|s| SecretString::from(s.to_string()))
            .collect()
    }

    #[test]
    fn githubs_published_example_verifies() {
        // From GitHub's "Validating webhook deliveries" documentation.
        let header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(
            verify(
                &secrets(&["It's a Secret to Everybody"]),
                Some(header),
                b"Hello, World!"
            ),
            Ok(())
        );
    }

    #[test]
    fn any_configured_secret_is_accepted_so_one_can_be_rotated() {
        let body = b"{}";
        let header = sign("new", body);
        assert_eq!(
            verify(&secrets(&["old", "new"]), Some(&header), body),
            Ok(())
        );
        assert_eq!(
            verify(&secrets(&["old"]), Some(&header), body),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn missing_malformed_and_forged_signatures_are_refused() {
        let s = secrets(&["k"]);
        assert_eq!(verify(&s, None, b"x"), Err(SignatureError::Missing));
        assert_eq!(
            verify(&s, Some("sha1=00"), b"x"),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify(&s, Some("sha256=zz"), b"x"),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify(&s, Some("sha256=00"), b"x"),
            Err(SignatureError::Malformed)
        );
        let forged = sign("k", b"other body");
        assert_eq!(
            verify(&s, Some(&forged), b"x"),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&[], Some(&forged), b"x"),
            Err(SignatureError::NoSecret)
        );
    }
}
