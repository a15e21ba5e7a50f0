//! Webhook signatures, as Stripe signs its webhooks.
//!
//! Each delivery carries `Saga-Signature: t=<unix seconds>,v1=<hex>` where `<hex>` is
//! HMAC-SHA256, keyed with the shared secret, over `"<t>.<body>"`. Signing the timestamp with
//! the body lets a receiver refuse an old, captured delivery replayed later: it checks that `t`
//! is recent ([`verify_signature`]'s `tolerance`) and deduplicates the rest by `Saga-Event-Id`.
//! Several `v1=` entries are allowed, so a sender can sign with an old and a new secret while
//! receivers rotate.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The header holding the signature.
pub const SIGNATURE_HEADER: &str = "saga-signature";
/// The header holding the event id (the same on every attempt: deduplicate by it).
pub const EVENT_ID_HEADER: &str = "saga-event-id";
/// A sensible `tolerance` for [`verify_signature`]: five minutes, as Stripe's libraries use.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The header is not `t=…,v1=…`.
    #[error("malformed Saga-Signature header")]
    Malformed,
    /// The header has no `v1=` signature.
    #[error("the Saga-Signature header has no v1 signature")]
    NoSignature,
    /// The timestamp is further from now than the tolerance: a replay, or a wrong clock.
    #[error("the signature timestamp is {age_secs} s away from now, over the tolerance")]
    OutsideTolerance {
        /// How far from now, in seconds.
        age_secs: i64,
    },
    /// No `v1=` signature matches the body and secret.
    #[error("no signature matches the body")]
    Mismatch,
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable_hmac(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cold]
fn unreachable_hmac() -> ! {
    // `Hmac::new_from_slice` only fails for fixed-key-size MACs, which HMAC is not.
    panic!("HMAC accepts keys of any length")
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [_, _] => u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok(),
            _ => None,
        })
        .collect()
}

/// The `Saga-Signature` header value for `body` sent at `timestamp` (Unix seconds).
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = mac(secret.as_bytes(), timestamp, body)
        .finalize()
        .into_bytes();
    format!("t={timestamp},v1={}", hex(&tag))
}

/// Checks a delivery: `header` is its `Saga-Signature`, `body` its raw body (before any JSON
/// parsing), `tolerance` how old (or how far in the future) its timestamp may be.
///
/// # Example
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use orchestrator::webhooks::{sign, verify_signature};
///
/// let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
/// let body = br#"{"id":1,"type":"saga.started"}"#;
/// let header = sign("whsec_test", now, body);
/// assert!(verify_signature("whsec_test", &header, body, Duration::from_secs(300)).is_ok());
/// assert!(verify_signature("other", &header, body, Duration::from_secs(300)).is_err());
/// ```
pub fn verify_signature(
    secret: &str,
    header: &str,
    body: &[u8],
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    verify_signature_at(secret, header, body, tolerance, now)
}

/// [`verify_signature`] with an explicit "now" (Unix seconds), for tests.
pub fn verify_signature_at(
    secret: &str,
    header: &str,
    body: &[u8],
    tolerance: Duration,
    now: i64,
) -> Result<(), SignatureError> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        let (name, value) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match name {
            "t" => {
                timestamp = Some(
                    value
                        .parse::<i64>()
                        .map_err(|_| SignatureError::Malformed)?,
                )
            }
            "v1" => signatures.push(value),
            _ => {} // other schemes: ignored, as Stripe's receivers do
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::NoSignature);
    }
    let age_secs = now.saturating_sub(timestamp);
    let tolerance_secs = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if age_secs.saturating_abs() > tolerance_secs {
        return Err(SignatureError::OutsideTolerance { age_secs });
    }
    let expected = mac(secret.as_bytes(), timestamp, body);
    let matches = signatures.iter().any(|sig| {
        // `verify_slice` compares in constant time.
        unhex(sig).is_some_and(|bytes| expected.clone().verify_slice(&bytes).is_ok())
    });
    if matches {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_signature_verifies_with_its_secret_only() {
        let header = sign("s3cret", 1_700_000_000, b"{}");
        assert!(header.starts_with("t=1700000000,v1="));
        assert_eq!(
            verify_signature_at("s3cret", &header, b"{}", DAY, 1_700_000_100),
            Ok(())
        );
        assert_eq!(
            verify_signature_at("other", &header, b"{}", DAY, 1_700_000_100),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature_at("s3cret", &header, b"{ }", DAY, 1_700_000_100),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn old_timestamps_are_refused() {
        let header = sign("s", 1_000, b"x");
        assert_eq!(
            verify_signature_at("s", &header, b"x", Duration::from_secs(300), 1_000 + 301),
            Err(SignatureError::OutsideTolerance { age_secs: 301 })
        );
        assert!(
            verify_signature_at("s", &header, b"x", Duration::from_secs(300), 1_000 + 300).is_ok()
        );
        // A timestamp from the future is refused too.
        assert!(
            verify_signature_at("s", &header, b"x", Duration::from_secs(300), 1_000 - 301).is_err()
        );
    }

    #[test]
    fn malformed_headers_are_refused() {
        for bad in ["", "v1=ab", "t=x,v1=ab", "garbage"] {
            assert!(
                verify_signature_at("s", bad, b"x", DAY, 0).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            verify_signature_at("s", "t=0", b"x", DAY, 0),
            Err(SignatureError::NoSignature)
        );
        assert_eq!(
            verify_signature_at("s", "t=0,v1=zz", b"x", DAY, 0),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn any_of_several_signatures_may_match() {
        let good = sign("new", 5, b"x");
        let v1 = good.split_once("v1=").map(|(_, v)| v).unwrap_or_default();
        let header = format!("t=5,v1={},v1={v1}", "00".repeat(32));
        assert_eq!(verify_signature_at("new", &header, b"x", DAY, 5), Ok(()));
    }
}
