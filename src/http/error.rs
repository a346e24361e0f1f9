//! `ApiError`: the one place where failures become HTTP statuses.
//!
//! Handlers return `Result<_, ApiError>`; the boundary errors (`SignatureError`, `PayloadError`,
//! ...) know nothing of HTTP. The cause chain is logged once, here, and never sent to the
//! caller beyond a short reason.
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::slack::payload::PayloadError;
use crate::slack::signature::SignatureError;
use crate::telemetry::WarnGate;

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
        } else if let Some(quiet) = REFUSALS.warn_now() {
            tracing::warn!(
                error = %self,
                status = status.as_u16(),
                refused_quietly_before = quiet,
                "request refused (further refusals within 10 s are logged at debug)"
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

/// A refused request (a 4xx) is logged at `warn` at most once every 10 s, the others at `debug`.
static REFUSALS: WarnGate = WarnGate::new(Duration::from_secs(10));
