//! The agent-facing HTTP API under `/api/v1`, and the authentication the MCP endpoint shares.
//!
//! Every route passes [`auth::authenticate`] (bearer token, then the token's rate) before its
//! body is read, and every route that takes a body passes [`auth::authorize`] (the route's action
//! in the token's allow list) before it too; the body is counted against the shared
//! [`budget::BodyBudget`] as it arrives. Handlers then check the token's allow list for their
//! exact action ([`Caller::require`]), parse, and call the same services Slack uses. Refusals are
//! [`ApiFailure`] JSON. Files: `auth` (tokens, callers, rate, the tenancy rule), `budget` (bytes
//! of bodies held at once), `error` (the JSON errors and the mapping of axum's rejections),
//! `sandboxes` (read-only fleet views), `mcp` (the `/mcp` endpoint's backend). This module must
//! not decide policy itself: approvals, runs and E2B rules live in their modules, and a request
//! it refuses changes nothing.
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts};
use axum::middleware;
use axum::routing::{get, post};

use super::AppState;

pub mod auth;
pub mod budget;
pub mod cases;
pub mod error;
pub mod mcp;
pub mod runs;
pub mod sandboxes;
pub mod test_failures;

pub use auth::{Caller, Tokens};
pub use budget::BodyBudget;
pub use error::{ApiFailure, JsonErrorsLayer, MAX_BODY_BYTES};

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

/// The `/api/v1` routes, each behind the bearer-token middleware built from `[api.tokens]`; a
/// route that takes a body also names the actions that may send one (checked before it is read),
/// and every body is counted against `budget`.
pub fn routes(tokens: Arc<Tokens>, budget: Arc<BodyBudget>) -> Router<AppState> {
    use crate::config::ApiAction::{ReportTestFailure, RequestDeleteTemplate, RequestKill, Run};
    let allow = |actions: &'static [crate::config::ApiAction]| {
        middleware::from_fn_with_state(actions, auth::authorize)
    };
    Router::new()
        .route("/runs", post(runs::submit).route_layer(allow(&[Run])))
        .route("/runs/{id}", get(runs::get))
        .route("/runs/{id}/output", get(runs::output))
        .route(
            "/cases",
            post(cases::ask).route_layer(allow(&[RequestKill, RequestDeleteTemplate])),
        )
        .route("/cases/{id}", get(cases::get))
        .route("/sandboxes", get(sandboxes::list))
        .route("/sandboxes/{id}", get(sandboxes::get))
        .route("/sandboxes/{id}/logs", get(sandboxes::logs))
        .route("/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route(
            "/test-failures",
            post(test_failures::report).route_layer(allow(&[ReportTestFailure])),
        )
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .route_layer(middleware::from_fn_with_state(budget, budget::limit_bodies))
        .route_layer(middleware::from_fn_with_state(tokens, auth::authenticate))
}

async fn not_found() -> ApiFailure {
    ApiFailure::not_found("There is no such API route; see docs/agents.md")
}
