//! `ApiError`: the one place where failures become HTTP statuses.
//!
//! Handlers return `Result<_, ApiError>`; the boundary errors (`SignatureError`, `PayloadError`,
//! ...) know nothing of HTTP. The cause chain is logged once, here, and never sent to the
//! caller beyond a short reason.
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::slack::payload::PayloadError;
use crate::slack::signature::SignatureError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("request signature refused: {0}")]
    Signature(#[from] SignatureError),
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("request body could not be read: {0}")]
    BodyRead(String),
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("payload not understood: {0}")]
    Payload(#[from] PayloadError),
    #[error("internal error: {0:#}")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Signature(_) => StatusCode::UNAUTHORIZED,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyRead(_) | Self::Payload(_) => StatusCode::BAD_REQUEST,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl ApiError {
    /// A failed body read: a 408 when the edge's body deadline cut it off, a 400 otherwise.
    pub fn body_read(error: axum::Error) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        while let Some(e) = cause {
            if e.is::<tower_http::timeout::TimeoutError>() {
                return Self::BodyTimeout;
            }
            cause = e.source();
        }
        Self::BodyRead(error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else if let Some(quiet) = REFUSALS.warn_now(since_start_ms()) {
            tracing::warn!(
                error = %self,
                status = status.as_u16(),
                refused_quietly_before = quiet,
                "request refused (further refusals within 10 s are logged at debug; all are counted in steward_slack_requests_total)"
            );
        } else {
            tracing::debug!(error = %self, status = status.as_u16(), "request refused");
        }
        // Like Bolt, say little to an unauthenticated caller.
        let reason = match &self {
            Self::Signature(_) => "invalid request".to_owned(),
            Self::Internal(_) => "internal error".to_owned(),
            other => other.to_string(),
        };
        // Tells the request counter this 401 was the signature, not another refusal.
        let refused = matches!(self, Self::Signature(_))
            .then_some(axum::Extension(super::metrics::SignatureRefused));
        (status, refused, Json(json!({ "error": reason }))).into_response()
    }
}

/// How often a refused request (a 4xx) is logged at `warn`; the others are logged at `debug`.
const REFUSAL_WARN_EVERY_MS: u64 = 10_000;

static REFUSALS: RefusalLog = RefusalLog::new();

/// Milliseconds since the first refusal was logged: a monotonic clock for [`RefusalLog`].
fn since_start_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Lets one refusal a [`REFUSAL_WARN_EVERY_MS`] through to `warn`, so a flood of forged or
/// malformed requests costs a log line every ten seconds rather than one each, while a
/// misconfigured signing secret still shows at the default level.
struct RefusalLog {
    /// When the last `warn` was let through, plus one (0: never).
    last_warn_ms: AtomicU64,
    /// Refusals logged at `debug` since then.
    quiet: AtomicU64,
}

impl RefusalLog {
    const fn new() -> Self {
        Self {
            last_warn_ms: AtomicU64::new(0),
            quiet: AtomicU64::new(0),
        }
    }

    /// `Some(refusals kept quiet since the last warn)` when this one is to be logged at `warn`.
    fn warn_now(&self, now_ms: u64) -> Option<u64> {
        let last = self.last_warn_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last - 1) >= REFUSAL_WARN_EVERY_MS;
        if due
            && self
                .last_warn_ms
                .compare_exchange(last, now_ms + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.quiet.swap(0, Ordering::Relaxed));
        }
        self.quiet.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_refusal_in_ten_seconds_is_a_warning_and_the_rest_are_counted_for_it() {
        let log = RefusalLog::new();
        assert_eq!(log.warn_now(0), Some(0), "the first is a warning");
        for ms in [1, 500, 9_999] {
            assert_eq!(log.warn_now(ms), None, "{ms} ms later");
        }
        assert_eq!(
            log.warn_now(10_000),
            Some(3),
            "ten seconds on, with the three kept quiet"
        );
        assert_eq!(log.warn_now(10_001), None);
        assert_eq!(log.warn_now(60_000), Some(1));
    }
}
