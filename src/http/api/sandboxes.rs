//! Read-only views of the fleet for agents (`read`): list, one sandbox, its logs, its metrics.
//!
//! These only read E2B through `E2bClient`; nothing here changes a sandbox (a kill is a case,
//! asked for through `POST /cases`).
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiFailure, ApiPath, ApiQuery, Caller};
use crate::config::ApiAction;
use crate::e2b::{E2bClient, E2bError, ListQuery, LogLevel, LogsQuery, StateFilter};
use crate::http::AppState;
use crate::ids::SandboxId;

/// Pages of 100 an agent's listing reads at most; more is reported as `complete: false`.
const LIST_MAX_PAGES: u32 = 10;
/// Log lines returned when the agent does not say.
const DEFAULT_LOG_LINES: u32 = 100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// `running`, `paused` or `all` (the default).
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub template: Option<String>,
}

/// The E2B client, or a 503 saying E2B is not configured.
pub(super) fn e2b(state: &AppState) -> Result<&E2bClient, ApiFailure> {
    state.e2b.as_ref().ok_or_else(|| {
        ApiFailure::unavailable("E2B is not configured on this Steward (E2B_API_KEY is not set)")
    })
}

/// An E2B failure about `subject`, as the agent should read it.
pub(super) fn e2b_failure(subject: &str, error: E2bError) -> ApiFailure {
    match error {
        E2bError::NotFound { .. } => ApiFailure::not_found(format!("{subject} was not found")),
        E2bError::BadRequest { message } => ApiFailure::invalid("query", message),
        E2bError::NotConfigured(what) => {
            ApiFailure::unavailable(format!("E2B is not configured: {what}"))
        }
        other => ApiFailure::upstream(crate::execute::sentence(subject, &other)),
    }
}

pub(super) fn sandbox_id(text: &str) -> Result<SandboxId, ApiFailure> {
    SandboxId::parse(text).map_err(|e| ApiFailure::invalid("sandbox_id", e.to_string()))
}

/// `GET /api/v1/sandboxes?state=running|paused|all&template=T`.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<Value>, ApiFailure> {
    caller.require(ApiAction::Read)?;
    let filter = match params.state.as_deref().map(str::trim) {
        None | Some("all") | Some("") => StateFilter::Both,
        Some("running") => StateFilter::Running,
        Some("paused") => StateFilter::Paused,
        Some(other) => {
            return Err(ApiFailure::invalid(
                "state",
                format!("{other:?} is not a state; use running, paused or all"),
            ));
        }
    };
    let query = ListQuery {
        state: filter,
        template: params.template.filter(|t| !t.trim().is_empty()),
        max_pages: Some(LIST_MAX_PAGES),
        ..ListQuery::default()
    };
    let listing = e2b(&state)?
        .list_sandboxes(&query)
        .await
        .map_err(|e| e2b_failure("The sandbox list", e))?;
    Ok(Json(json!({
        "sandboxes": listing.items,
        "complete": listing.stopped.is_none(),
    })))
}

/// `GET /api/v1/sandboxes/{id}`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiFailure> {
    caller.require(ApiAction::Read)?;
    let id = sandbox_id(&id)?;
    let detail = e2b(&state)?
        .get_sandbox(&id)
        .await
        .map_err(|e| e2b_failure(&format!("Sandbox {id}"), e))?;
    Ok(Json(json!(detail)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    #[serde(default)]
    pub limit: Option<u32>,
    /// Minimum level: debug, info, warn, error.
    #[serde(default)]
    pub level: Option<String>,
    #[serde(default)]
    pub search: Option<String>,
}

/// `GET /api/v1/sandboxes/{id}/logs?limit=100&level=warn&search=text`: the latest lines.
pub async fn logs(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<LogParams>,
) -> Result<Json<Value>, ApiFailure> {
    caller.require(ApiAction::Read)?;
    let id = sandbox_id(&id)?;
    let level = params
        .level
        .as_deref()
        .map(|l| l.parse::<LogLevel>())
        .transpose()
        .map_err(|e| ApiFailure::invalid("level", e))?;
    let limit = params.limit.unwrap_or(DEFAULT_LOG_LINES);
    if !(1..=crate::e2b::MAX_LOG_LIMIT).contains(&limit) {
        return Err(ApiFailure::invalid(
            "limit",
            format!("must be 1 to {} lines", crate::e2b::MAX_LOG_LIMIT),
        ));
    }
    let query = LogsQuery {
        level,
        search: params.search,
        limit: Some(limit),
        direction: Some(crate::e2b::LogsDirection::Backward),
        ..LogsQuery::default()
    };
    let mut lines = e2b(&state)?
        .sandbox_logs(&id, &query)
        .await
        .map_err(|e| e2b_failure(&format!("Sandbox {id}"), e))?;
    lines.sort_by_key(|l| l.timestamp);
    Ok(Json(json!({ "logs": lines })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricParams {
    /// How far back: `10m`, `1h`, ... (default: the sandbox's whole life).
    #[serde(default)]
    pub since: Option<String>,
}

/// `GET /api/v1/sandboxes/{id}/metrics?since=15m`.
pub async fn metrics(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<MetricParams>,
) -> Result<Json<Value>, ApiFailure> {
    caller.require(ApiAction::Read)?;
    let id = sandbox_id(&id)?;
    let start = match params.since.as_deref() {
        None => None,
        Some(text) => {
            let d: Duration = crate::duration::parse("since", text)
                .map_err(|e| ApiFailure::invalid("since", e.reason))?;
            let d = chrono::Duration::from_std(d)
                .map_err(|_| ApiFailure::invalid("since", "is too long ago"))?;
            Some(Utc::now() - d)
        }
    };
    let samples = e2b(&state)?
        .sandbox_metrics(&id, start, None)
        .await
        .map_err(|e| e2b_failure(&format!("Sandbox {id}"), e))?;
    Ok(Json(json!({ "metrics": samples })))
}
