//! The HTTP surface: [`router`] is the one route table; handlers live in one file per surface
//! (`slack.rs`, `health.rs`, `metrics.rs`), and [`error::ApiError`] is the only place errors become statuses.
//!
//! This module must not hold business rules: it verifies, parses, acknowledges and hands work
//! to `execute` (and later to jobs and cases).
use std::sync::Arc;

use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;

use axum::Router;
use axum::http::header::AsHeaderName;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware;
use axum::routing::{get, post};
use tower_http::timeout::{RequestBodyDeadlineLayer, TimeoutLayer};
use tower_http::trace::TraceLayer;

use crate::approvals::Services;
use crate::config::Settings;
use crate::e2b::E2bClient;
use crate::ids::SlackChannelId;
use crate::slack::client::SlackClient;
use crate::slack::render::Templates;
use crate::store::Store;

pub mod api;
pub mod e2b;
pub mod edge;
pub mod error;
pub mod github;
pub mod health;
pub mod metrics;
pub mod slack;
pub mod socket;

pub use error::ApiError;

/// Shared by every handler. Axum clones the state for every extractor and middleware of every
/// request, so it is one `Arc` around [`AppHandles`], whose fields it reads through `Deref`
/// (cloning the handles themselves cost a dozen allocations a request).
#[derive(Clone, Debug)]
pub struct AppState(Arc<AppHandles>);

impl From<AppHandles> for AppState {
    fn from(handles: AppHandles) -> Self {
        Self(Arc::new(handles))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppHandles;

    fn deref(&self) -> &AppHandles {
        &self.0
    }
}

/// Changing a handle (tests do, before serving) changes this state only: clones made before
/// keep the handles they had, as they did when the state was a plain struct.
impl std::ops::DerefMut for AppState {
    fn deref_mut(&mut self) -> &mut AppHandles {
        Arc::make_mut(&mut self.0)
    }
}

/// What every handler may use; every field is a cheap handle.
#[derive(Clone, Debug)]
pub struct AppHandles {
    pub settings: Arc<Settings>,
    pub slack: SlackClient,
    /// `None` when `E2B_API_KEY` is not set: commands then explain that E2B is not configured.
    pub e2b: Option<E2bClient>,
    pub templates: Arc<Templates>,
    /// Cases, the job queue, the audit log. Connects lazily, so the service starts (and
    /// `/readyz` says so) while Redis is down.
    pub store: Store,
    /// `[channels] approvals` from steward.toml, checked at startup.
    pub approvals_channel: Option<SlackChannelId>,
    /// `[approvals]` from steward.toml, shared by every request rather than copied per click.
    pub approval_policy: Arc<crate::cases::ApprovalPolicy>,
    /// Work that continues after Slack was answered (replies, card updates). Shutdown waits for
    /// it, so a replica stopped mid-reply still delivers what it owes.
    pub tasks: TaskTracker,
    /// Per-user rate limit, one sweep at a time, and the cap on follow-up tasks (`[limits]`).
    pub limits: Arc<crate::slack::limits::Limits>,
    /// The fleet sweep `/sandbox sweep` runs; `None` when E2B is not configured.
    pub sweep: Option<crate::hygiene::SweepContext>,
    /// `[hygiene.idle]`'s CPU threshold, for the worker's re-check.
    pub busy_above: crate::approvals::BusyThreshold,
    /// Governed runs (submit, get, wait, output); `None` when E2B is not configured.
    pub runs: Option<crate::runs::Runner>,
    /// The Socket Mode connection's state, for `/readyz`; `None` in HTTP mode (no
    /// `SLACK_APP_TOKEN`).
    pub socket: Option<crate::slack::socket::SocketStatus>,
    /// Cancelled at the first stop signal: `/readyz` says 503, workers take no new jobs and hand
    /// back what they will not finish, while HTTP keeps answering until the replica stops.
    pub draining: tokio_util::sync::CancellationToken,
    /// `[[watch]]`, checked at startup.
    pub watch: Arc<Vec<crate::watch::WatchRule>>,
}

impl AppState {
    /// The handles the approval flow needs.
    pub fn services(&self) -> Services {
        Services {
            store: self.store.clone(),
            slack: self.slack.clone(),
            e2b: self.e2b.clone(),
            templates: self.templates.clone(),
            policy: self.approval_policy.clone(),
            busy_above: self.busy_above.clone(),
            approvals_channel: self.approvals_channel.clone(),
            tasks: self.tasks.clone(),
            limits: self.limits.clone(),
            lists: self
                .sweep
                .as_ref()
                .map(|s| s.config.list_settings())
                .unwrap_or_default(),
            draining: self.draining.clone(),
            watch: self.watch.clone(),
        }
    }
}

/// A header's value when it is there and visible ASCII. Hot handlers pass a [`HeaderName`]
/// constant (`axum::http::HeaderName`): a `&str` name is parsed again on every lookup.
pub(crate) fn header_str(headers: &HeaderMap, name: impl AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A known route asked with a method it does not answer: a sentence, not an empty 405 (under
/// `/api/v1`, [`api::JsonErrorsLayer`] makes it the API's JSON error). axum adds `Allow`.
async fn method_not_allowed(method: axum::http::Method) -> (StatusCode, String) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "This route does not answer {method}; the Allow header says which methods it does.\n"
        ),
    )
}

/// Every route Steward serves. Every request is bounded: its body must arrive within
/// `STEWARD_BODY_TIMEOUT` and its answer within `STEWARD_REQUEST_TIMEOUT` (both 408 otherwise).
pub fn router(state: AppState) -> Router {
    let limits = state.settings.edge;
    let slack_routes = Router::new()
        .route("/slack/commands", post(slack::command))
        .route("/slack/interactions", post(slack::interaction))
        .route("/slack/events", post(slack::event));
    let tokens = api::Tokens::from_config(&state.settings.policy.api);
    // One budget for every body Steward may hold a lot of: the agent API's, `/mcp`'s and GitHub's.
    let budget = api::BodyBudget::new(limits.body_budget);
    let mcp = Router::new()
        .nest_service("/mcp", api::mcp::service(&state))
        .route_layer(middleware::from_fn_with_state(
            budget.clone(),
            api::budget::limit_bodies,
        ))
        .route_layer(middleware::from_fn_with_state(
            api::mcp::ACTIONS,
            api::auth::authorize,
        ))
        .route_layer(middleware::from_fn_with_state(
            tokens.clone(),
            api::auth::authenticate,
        ));
    let e2b_events = Router::new().route("/e2b/webhook", post(e2b::webhook));
    let github = Router::new()
        .route("/github/webhook", post(github::webhook))
        .route_layer(middleware::from_fn_with_state(
            budget.clone(),
            github::limit_body,
        ));
    // With STEWARD_METRICS_LISTEN, /metrics is served by its own listener instead.
    let scrape = match state.settings.metrics_listen {
        None => Router::new().route("/metrics", get(metrics::scrape)),
        Some(_) => Router::new(),
    };
    Router::new()
        .merge(slack_routes)
        .nest("/api/v1", api::routes(tokens, budget))
        .merge(mcp)
        .merge(github)
        .merge(e2b_events)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .merge(scrape)
        .method_not_allowed_fallback(method_not_allowed)
        // One `layer` call for the whole stack (outermost first): each `Router::layer` boxes
        // every route once more, and a boxed route is cloned on every request.
        .layer(
            ServiceBuilder::new()
                .layer(metrics::TrackSlackLayer)
                .layer(TraceLayer::new_for_http())
                // Outside the timeout, so the 408 it answers under /api/v1 is the API's JSON.
                .layer(api::JsonErrorsLayer)
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    limits.request_timeout,
                ))
                .layer(RequestBodyDeadlineLayer::new(limits.body_timeout)),
        )
        .with_state(state)
}
