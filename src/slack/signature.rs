//! Slack request signatures (v0): `v0=` + hex(HMAC-SHA256(secret, "v0:{ts}:{body}")).
//!
//! `verify` is pure: it takes the raw body bytes and `now` as parameters so tests fix the clock.
//! It must not parse the body, log the secret, or echo a signature back in an error.
use axum::http::HeaderName;
use hmac::{KeyInit, Mac};
use secrecy::{ExposeSecret, SecretString};

use super::form::HEX;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Header carrying the signature. (A [`HeaderName`], not a `&str`: a lookup by `&str` parses
/// and lower-cases the name again on every request.)
pub const SIGNATURE_HEADER: HeaderName = HeaderName::from_static("x-slack-signature");
/// Header carrying the unix timestamp the signature covers.
pub const TIMESTAMP_HEADER: HeaderName = HeaderName::from_static("x-slack-request-timestamp");
/// Requests older (or further in the future) than this are replays or clock trouble.
pub const SIGNATURE_MAX_AGE_SECS: i64 = 300;

const VERSION_PREFIX: &str = "v0=";
/// A v0 signature is "v0=" followed by 64 lowercase hex digits.
const SIGNATURE_HEX_LEN: usize = 64;

/// Why a request was refused. Deliberately carries no signature or secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the request has no X-Slack-Request-Timestamp header")]
    MissingTimestamp,
    #[error("the request has no X-Slack-Signature header")]
    MissingSignature,
    #[error("the X-Slack-Request-Timestamp header is not a unix timestamp")]
    MalformedTimestamp,
    #[error("the X-Slack-Signature header is not a v0 signature")]
    MalformedSignature,
    #[error(
        "the request timestamp is {skew_secs} s away from now (limit {SIGNATURE_MAX_AGE_SECS} s)"
    )]
    Stale { skew_secs: i64 },
    #[error("the signature does not match the body")]
    Mismatch,
    #[error("no signing secret is configured")]
    NoSecret,
}

/// Checks a Slack request. `timestamp` and `signature` are the raw header values (if present).
pub fn verify(
    secret: &SecretString,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let secret = secret.expose_secret();
    if secret.is_empty() {
        return Err(SignatureError::NoSecret);
    }
    let timestamp = timestamp.ok_or(SignatureError::MissingTimestamp)?.trim();
    let signature = signature.ok_or(SignatureError::MissingSignature)?.trim();
    // Digits only: `i64::from_str` would also accept a leading '+' or '-', which Slack never sends.
    if timestamp.is_empty()
        || timestamp.len() > 12
        || !timestamp.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(SignatureError::MalformedTimestamp);
    }
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| SignatureError::MalformedTimestamp)?;
    let expected = signature
        .strip_prefix(VERSION_PREFIX)
        .and_then(digest_from_hex)
        .ok_or(SignatureError::MalformedSignature)?;
    // The signature is checked before the clock so that a forged request learns nothing about
    // our clock; both checks must pass anyway.
    let mac = mac_for(secret, timestamp, body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)?;
    let skew_secs = (now - ts).abs();
    if skew_secs > SIGNATURE_MAX_AGE_SECS {
        return Err(SignatureError::Stale { skew_secs });
    }
    Ok(())
}

/// The 32 bytes that 64 hex digits (either case) spell; `None` for anything else. (By hand:
/// `hex::decode_to_slice` took a percent of a click's time for these 64 characters; a table and
/// one check at the end, not a branch per digit.)
fn digest_from_hex(hex: &str) -> Option<[u8; SIGNATURE_HEX_LEN / 2]> {
    let hex = hex.as_bytes();
    if hex.len() != SIGNATURE_HEX_LEN {
        return None;
    }
    let mut bytes = [0u8; SIGNATURE_HEX_LEN / 2];
    let mut invalid = 0u8;
    for (byte, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
        let (high, low) = (HEX[usize::from(pair[0])], HEX[usize::from(pair[1])]);
        invalid |= high | low;
        *byte = high << 4 | low;
    }
    // A digit is at most 0x0f; 0xff (not a digit) sets the high bits.
    (invalid & 0xf0 == 0).then_some(bytes)
}

/// Computes the `X-Slack-Signature` value for `body` at `timestamp`. Tests, the benchmark and
/// the Slack simulator sign with this; production code only verifies.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = mac_for(secret, &timestamp.to_string(), body);
    format!(
        "{VERSION_PREFIX}{}",
        hex::encode(mac.finalize().into_bytes())
    )
}

fn mac_for(secret: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Vectors {
        vectors: Vec<Vector>,
    }
    #[derive(serde::Deserialize)]
    struct Vector {
        id: String,
        signing_secret: String,
        timestamp: String,
        body: String,
        expected_signature: String,
    }

    const VECTORS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/slack-signature-vectors.json"
    ));

    fn vectors() -> Vec<Vector> {
        serde_json::from_str::<Vectors>(VECTORS).unwrap().vectors
    }

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    #[test]
    fn published_vectors_verify_at_their_own_time() {
        for v in vectors() {
            let now: i64 = v.timestamp.parse().unwrap();
            let got = verify(
                &secret(&v.signing_secret),
                Some(&v.timestamp),
                Some(&v.expected_signature),
                v.body.as_bytes(),
                now + 2,
            );
            assert_eq!(got, Ok(()), "vector {}", v.id);
            assert_eq!(
                sign(&v.signing_secret, now, v.body.as_bytes()),
                v.expected_signature
            );
        }
    }

    #[test]
    fn a_tampered_body_is_refused() {
        for v in vectors() {
            let body = format!("{}------", v.body);
            let got = verify(
                &secret(&v.signing_secret),
                Some(&v.timestamp),
                Some(&v.expected_signature),
                body.as_bytes(),
                v.timestamp.parse().unwrap(),
            );
            assert_eq!(got, Err(SignatureError::Mismatch), "vector {}", v.id);
        }
    }

    #[test]
    fn the_wrong_secret_is_refused() {
        let v = &vectors()[0];
        let got = verify(
            &secret("not-the-secret"),
            Some(&v.timestamp),
            Some(&v.expected_signature),
            v.body.as_bytes(),
            v.timestamp.parse().unwrap(),
        );
        assert_eq!(got, Err(SignatureError::Mismatch));
    }

    #[test]
    fn timestamps_more_than_five_minutes_away_are_refused_in_both_directions() {
        let v = &vectors()[0];
        let ts: i64 = v.timestamp.parse().unwrap();
        let check = |now| {
            verify(
                &secret(&v.signing_secret),
                Some(&v.timestamp),
                Some(&v.expected_signature),
                v.body.as_bytes(),
                now,
            )
        };
        assert_eq!(check(ts + 300), Ok(()));
        assert_eq!(check(ts - 300), Ok(()));
        assert_eq!(
            check(ts + 301),
            Err(SignatureError::Stale { skew_secs: 301 })
        );
        assert_eq!(
            check(ts - 301),
            Err(SignatureError::Stale { skew_secs: 301 })
        );
    }

    #[test]
    fn missing_and_malformed_headers_are_refused() {
        let v = &vectors()[0];
        let s = secret(&v.signing_secret);
        let now: i64 = v.timestamp.parse().unwrap();
        let body = v.body.as_bytes();
        let sig = v.expected_signature.as_str();
        let ts = v.timestamp.as_str();
        assert_eq!(
            verify(&s, None, Some(sig), body, now),
            Err(SignatureError::MissingTimestamp)
        );
        assert_eq!(
            verify(&s, Some(ts), None, body, now),
            Err(SignatureError::MissingSignature)
        );
        for bad_ts in [
            "",
            "abc",
            "-1531420618",
            "+1531420618",
            "1531420618.5",
            "99999999999999",
        ] {
            assert_eq!(
                verify(&s, Some(bad_ts), Some(sig), body, now),
                Err(SignatureError::MalformedTimestamp),
                "{bad_ts:?}"
            );
        }
        let upper = sig.to_uppercase();
        let v1 = sig.replacen("v0=", "v1=", 1);
        let short = &sig[..sig.len() - 2];
        let not_hex = format!("v0={}", "z".repeat(64));
        for bad_sig in [
            "",
            "v0=",
            v1.as_str(),
            short,
            not_hex.as_str(),
            upper.as_str(),
        ] {
            let got = verify(&s, Some(ts), Some(bad_sig), body, now);
            assert!(
                matches!(
                    got,
                    Err(SignatureError::MalformedSignature | SignatureError::Mismatch)
                ),
                "{bad_sig:?} gave {got:?}"
            );
        }
    }

    #[test]
    fn hex_digests_read_as_the_hex_crate_reads_them() {
        let mut state: u64 = 0x5157;
        for _ in 0..500 {
            let digest: [u8; 32] = std::array::from_fn(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            });
            let lower = hex::encode(digest);
            assert_eq!(digest_from_hex(&lower), Some(digest), "{lower}");
            assert_eq!(digest_from_hex(&lower.to_uppercase()), Some(digest));
        }
        let good = "0123456789abcdefABCDEF".repeat(3);
        let good = &good[..64];
        assert!(digest_from_hex(good).is_some());
        for bad in [
            "",
            &good[..62],
            &format!("{good}00"),
            &format!("{}g", &good[..63]),
        ] {
            assert_eq!(digest_from_hex(bad), None, "{bad:?}");
        }
        // Each position refuses a byte that is no hex digit; so does a multi-byte character.
        for at in 0..64 {
            for intruder in [b'g', b' ', b'/', b':', b'@', b'G', b'`'] {
                let mut bytes = good.as_bytes().to_vec();
                bytes[at] = intruder;
                let text = String::from_utf8(bytes).unwrap();
                assert_eq!(digest_from_hex(&text), None, "{text:?}");
            }
        }
        assert_eq!(digest_from_hex(&format!("é{}", &good[..62])), None);
    }

    #[test]
    fn an_empty_secret_refuses_everything() {
        let body = b"text=help";
        let sig = sign("", 100, body);
        assert_eq!(
            verify(&secret(""), Some("100"), Some(&sig), body, 100),
            Err(SignatureError::NoSecret)
        );
    }

    #[test]
    fn errors_do_not_carry_the_signature() {
        let v = &vectors()[0];
        let err = verify(
            &secret("wrong"),
            Some(&v.timestamp),
            Some(&v.expected_signature),
            v.body.as_bytes(),
            0,
        )
        .unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(&v.expected_signature[3..13]), "{shown}");
    }
}
