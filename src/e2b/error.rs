//! `E2bError`: every way a call to E2B's control plane can fail, as a sentence a person can act on.
//!
//! This module turns HTTP statuses and E2B's `{code, message, error_code}` bodies into variants.
//! It must not know about Slack or HTTP routes of our own, and it must never carry the API key:
//! every piece of server or transport text passes through [`scrub`] before it is stored here.
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde::Deserialize;

/// Longest piece of server text kept in an error; edge proxies can answer with whole HTML pages.
const MAX_MESSAGE_CHARS: usize = 300;

/// Why an E2B call failed. `Display` is a plain English sentence, fit to show in Slack.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum E2bError {
    #[error("E2B could not find it: {message}")]
    NotFound { message: String },
    #[error("E2B refused because of the sandbox's current state: {message}")]
    Conflict { message: String },
    #[error("{}", rate_limited_sentence(retry_after, message))]
    RateLimited {
        retry_after: Option<Duration>,
        message: String,
    },
    #[error("E2B rejected the API key; check E2B_API_KEY.")]
    Unauthorized,
    #[error("E2B refused access: {message}")]
    Forbidden { message: String },
    #[error("E2B rejected the request as invalid: {message}")]
    BadRequest { message: String },
    #[error("{}", server_sentence(*status, message, error_code.as_deref()))]
    Server {
        status: u16,
        message: String,
        error_code: Option<String>,
    },
    #[error("Could not reach E2B: {0}")]
    Transport(String),
    #[error("E2B sent a response Steward could not read: {0}")]
    Decode(String),
    #[error("E2B is not configured: {0}.")]
    NotConfigured(&'static str),
    /// A listing that stopped before E2B said it was finished: what it holds is not the whole.
    #[error("Steward could not read E2B's whole list: {0}")]
    Incomplete(crate::e2b::PagingStop),
    #[error("E2B sent an answer larger than {} MiB; Steward stopped reading it.", limit / (1024 * 1024))]
    TooLarge { limit: usize },
}

fn rate_limited_sentence(retry_after: &Option<Duration>, message: &str) -> String {
    match retry_after {
        Some(wait) => format!(
            "E2B is rate limiting Steward (try again in {} s): {message}",
            wait.as_secs().max(1)
        ),
        None => format!("E2B is rate limiting Steward: {message}"),
    }
}

fn server_sentence(status: u16, message: &str, error_code: Option<&str>) -> String {
    match error_code {
        Some(code) => format!("E2B had a server error ({status}, {code}): {message}"),
        None => format!("E2B had a server error ({status}): {message}"),
    }
}

impl E2bError {
    /// The HTTP status behind this error, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::NotFound { .. } => Some(404),
            Self::Conflict { .. } => Some(409),
            Self::RateLimited { .. } => Some(429),
            Self::Unauthorized => Some(401),
            Self::Forbidden { .. } => Some(403),
            Self::BadRequest { .. } => Some(400),
            Self::Server { status, .. } => Some(*status),
            Self::Transport(_)
            | Self::Decode(_)
            | Self::NotConfigured(_)
            | Self::Incomplete(_)
            | Self::TooLarge { .. } => None,
        }
    }

    /// True for errors a person can fix by waiting (rate limits, 5xx, network).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. } | Self::Server { .. } | Self::Transport(_)
        )
    }
}

/// E2B's error body. `code` is optional here because edge proxies answer with other shapes.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    error_code: Option<String>,
}

/// Maps a non-success response to an error. `secret` is removed from every message kept.
pub(crate) fn from_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    secret: &str,
) -> E2bError {
    let (message, error_code) = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(parsed) => (
            parsed.message.unwrap_or_default(),
            parsed.error_code.filter(|c| !c.is_empty()),
        ),
        // Not JSON (an edge 429, an HTML 502): keep a readable slice of the text.
        Err(_) => (String::from_utf8_lossy(body).trim().to_owned(), None),
    };
    let mut message = scrub(&message, secret);
    if message.is_empty() {
        message = status
            .canonical_reason()
            .unwrap_or("no explanation given")
            .to_owned();
    }
    match status.as_u16() {
        400 => E2bError::BadRequest { message },
        401 => E2bError::Unauthorized,
        403 => E2bError::Forbidden { message },
        404 => E2bError::NotFound { message },
        409 => E2bError::Conflict { message },
        429 => E2bError::RateLimited {
            retry_after: retry_after(headers, chrono::Utc::now()),
            message,
        },
        s if s >= 500 => E2bError::Server {
            status: s,
            message,
            error_code,
        },
        // Other 4xx (410, 422, ...) are still "your request was not acceptable".
        s => E2bError::BadRequest {
            message: format!("HTTP {s}: {message}"),
        },
    }
}

/// Reads `Retry-After` as seconds or as an HTTP date relative to `now`.
pub(crate) fn retry_after(
    headers: &HeaderMap,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = when.with_timezone(&chrono::Utc) - now;
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

/// Removes `secret` from `text` and shortens it. Used on every string that enters an error.
pub(crate) fn scrub(text: &str, secret: &str) -> String {
    let cleaned = if secret.len() >= 4 {
        text.replace(secret, "[redacted]")
    } else {
        text.to_owned()
    };
    if cleaned.chars().count() > MAX_MESSAGE_CHARS {
        let short: String = cleaned.chars().take(MAX_MESSAGE_CHARS).collect();
        format!("{short}…")
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderValue, RETRY_AFTER};

    fn parse(status: u16, body: &str) -> E2bError {
        from_response(
            StatusCode::from_u16(status).unwrap(),
            &HeaderMap::new(),
            body.as_bytes(),
            "e2b_secret",
        )
    }

    #[test]
    fn e2b_error_bodies_map_to_their_variants() {
        let body = r#"{"code":404,"message":"Sandbox \"x\" doesn't exist or you don't have access to it"}"#;
        assert_eq!(
            parse(404, body),
            E2bError::NotFound {
                message: "Sandbox \"x\" doesn't exist or you don't have access to it".into()
            }
        );
        assert!(
            matches!(parse(409, r#"{"code":409,"message":"already paused"}"#), E2bError::Conflict { message } if message == "already paused")
        );
        assert!(matches!(
            parse(400, r#"{"code":400,"message":"bad"}"#),
            E2bError::BadRequest { .. }
        ));
        assert_eq!(
            parse(401, r#"{"code":401,"message":"x"}"#),
            E2bError::Unauthorized
        );
        assert!(matches!(
            parse(403, r#"{"code":403,"message":"other team"}"#),
            E2bError::Forbidden { .. }
        ));
    }

    #[test]
    fn server_errors_keep_the_semantic_error_code() {
        let err = parse(
            503,
            r#"{"code":503,"message":"no capacity","error_code":"sandbox_capacity_unavailable"}"#,
        );
        assert_eq!(
            err,
            E2bError::Server {
                status: 503,
                message: "no capacity".into(),
                error_code: Some("sandbox_capacity_unavailable".into())
            }
        );
        assert_eq!(
            err.to_string(),
            "E2B had a server error (503, sandbox_capacity_unavailable): no capacity"
        );
    }

    #[test]
    fn a_non_json_rate_limit_body_is_kept_as_text_with_its_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        let err = from_response(
            StatusCode::TOO_MANY_REQUESTS,
            &headers,
            b"<html>Too many requests</html>",
            "e2b_secret",
        );
        assert_eq!(
            err,
            E2bError::RateLimited {
                retry_after: Some(Duration::from_secs(7)),
                message: "<html>Too many requests</html>".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "E2B is rate limiting Steward (try again in 7 s): <html>Too many requests</html>"
        );
    }

    #[test]
    fn an_empty_body_falls_back_to_the_status_reason() {
        assert_eq!(
            parse(502, ""),
            E2bError::Server {
                status: 502,
                message: "Bad Gateway".into(),
                error_code: None
            }
        );
    }

    #[test]
    fn other_client_errors_become_bad_requests_that_name_the_status() {
        assert_eq!(
            parse(422, r#"{"message":"nope"}"#).to_string(),
            "E2B rejected the request as invalid: HTTP 422: nope"
        );
    }

    #[test]
    fn retry_after_accepts_an_http_date() {
        let now = chrono::DateTime::parse_from_rfc3339("2015-10-21T07:27:50Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let mut headers = HeaderMap::new();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(10)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&headers, now), None);
    }

    #[test]
    fn the_secret_never_survives_into_an_error_message() {
        let err = parse(400, r#"{"message":"key e2b_secret is malformed"}"#);
        assert!(!err.to_string().contains("e2b_secret"), "{err}");
        assert!(!format!("{err:?}").contains("e2b_secret"));
    }

    #[test]
    fn long_server_text_is_shortened() {
        let long = "x".repeat(5000);
        let E2bError::Server { message, .. } = parse(500, &long) else {
            panic!("expected a server error");
        };
        assert!(message.chars().count() <= MAX_MESSAGE_CHARS + 1);
    }
}
