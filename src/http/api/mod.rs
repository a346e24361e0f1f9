//! The agent-facing HTTP API under `/api/v1`, and the authentication the MCP endpoint shares.
//!
//! Every route passes [`auth::authenticate`] (bearer token, then the token's rate) before its
//! body is read; handlers then check the token's allow list for their action
//! ([`Caller::require`]), parse, and call the same services Slack uses. Refusals are
//! [`ApiFailure`] JSON. Files: `auth` (tokens, callers, rate), `error` (the JSON errors and the
//! mapping of axum's rejections), `sandboxes` (read-only fleet views), `mcp` (the `/mcp`
//! endpoint's backend). This module must not decide policy itself: approvals, runs and E2B
//! rules live in their modules, and a request it refuses changes nothing.
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts};
use axum::middleware;
use axum::routing::{get, post};

use super::AppState;

pub mod auth;
pub mod cases;
pub mod error;
pub mod mcp;
pub mod runs;
pub mod sandboxes;
pub mod test_failures;

pub use auth::{Caller, Tokens};
pub use error::{ApiFailure, MAX_BODY_BYTES};

/// `axum::Json` whose rejection is an [`ApiFailure`] (422 naming the field, 413, ...).
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiFailure))]
pub struct ApiJson<T>(pub T);

/// `axum::extract::Query` whose rejection is an [`ApiFailure`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiFailure))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path` whose rejection is an [`ApiFailure`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiFailure))]
pub struct ApiPath<T>(pub T);

/// The longest a `?wait=` long-poll is held: under the router's request timeout, so the answer
/// always beats the 408.
pub fn max_wait(request_timeout: Duration) -> Duration {
    request_timeout
        .saturating_sub(Duration::from_secs(5))
        .max(request_timeout / 2)
}

/// Parses `?wait=30s` (absent: no wait), capped at [`max_wait`].
pub fn wait_param(text: Option<&str>, request_timeout: Duration) -> Result<Duration, ApiFailure> {
    match text {
        None => Ok(Duration::ZERO),
        Some(text) => crate::duration::parse("wait", text)
            .map(|d| d.min(max_wait(request_timeout)))
            .map_err(|e| ApiFailure::invalid("wait", e.reason)),
    }
}

/// The `/api/v1` routes, each behind the bearer-token middleware built from `[api.tokens]`.
pub fn routes(tokens: Arc<Tokens>) -> Router<AppState> {
    Router::new()
        .route("/runs", post(runs::submit))
        .route("/runs/{id}", get(runs::get))
        .route("/runs/{id}/output", get(runs::output))
        .route("/cases", post(cases::ask))
        .route("/cases/{id}", get(cases::get))
        .route("/sandboxes", get(sandboxes::list))
        .route("/sandboxes/{id}", get(sandboxes::get))
        .route("/sandboxes/{id}/logs", get(sandboxes::logs))
        .route("/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route("/test-failures", post(test_failures::report))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .route_layer(middleware::from_fn_with_state(tokens, auth::authenticate))
}

async fn not_found() -> ApiFailure {
    ApiFailure::not_found("There is no such API route; see the Runs section of the README")
}
