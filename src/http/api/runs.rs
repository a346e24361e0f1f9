//! Runs for agents: `POST /api/v1/runs` (202 with the queued run), `GET /api/v1/runs/{id}`
//! (`?wait=30s` long-polls until the run ends) and `GET /api/v1/runs/{id}/output?from=N`.
//!
//! The output route answers one chunk at a time as `text/plain`, with `X-Next-Offset` (ask
//! again from there), `X-Run-Finished` (`true` once the run ended and every kept byte was sent)
//! and `X-Output-Truncated`; with `&wait=20s` it holds the answer until there are new bytes or
//! the run ends, so a client follows the output as it streams without busy polling. The work
//! itself is `runs::Runner`'s; this file only checks, parses and words.
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiFailure, ApiJson, ApiPath, ApiQuery, Caller, wait_param};
use crate::config::ApiAction;
use crate::http::AppState;
use crate::ids::RunId;
use crate::runs::{OutputChunk, RunError, RunRequest, Runner};

/// How often a waiting output read looks for new bytes.
const OUTPUT_POLL: Duration = Duration::from_millis(50);

/// The run engine, or a 503 saying why this Steward cannot run code.
fn runner(state: &AppState) -> Result<&Runner, ApiFailure> {
    state.runs.as_ref().ok_or_else(|| {
        ApiFailure::unavailable(
            "This Steward cannot run code (E2B is not configured), so nothing was started",
        )
    })
}

/// A run failure as the agent reads it: the field to fix for bad input (413 when over a limit).
pub(super) fn run_failure(error: RunError) -> ApiFailure {
    match error {
        RunError::Input(e) if e.too_large => ApiFailure::too_large(
            Some(e.field.clone()),
            format!("`{}` {}", e.field, e.message),
        ),
        RunError::Input(e) => {
            ApiFailure::invalid(e.field.clone(), format!("`{}` {}", e.field, e.message))
        }
        RunError::NotFound(id) => ApiFailure::not_found(format!("There is no run {id}")),
        RunError::StoreUnavailable(_) => ApiFailure::store_unavailable(),
        e @ RunError::Store(_) => ApiFailure::internal(e.to_string()),
    }
}

fn run_id(text: &str) -> Result<RunId, ApiFailure> {
    RunId::parse(text).map_err(|e| ApiFailure::invalid("run_id", e.to_string()))
}

/// `POST /api/v1/runs`: validates, records and queues the run; 202 with the run.
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<RunRequest>,
) -> Result<(StatusCode, Json<Value>), ApiFailure> {
    caller.require(ApiAction::Run)?;
    let run = runner(&state)?
        .submit(&caller.name, request)
        .await
        .map_err(run_failure)?;
    Ok((StatusCode::ACCEPTED, Json(json!(run))))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// `30s`: hold the answer until the run ends, at most this long.
    #[serde(default)]
    pub wait: Option<String>,
}

/// `GET /api/v1/runs/{id}?wait=30s`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<RunParams>,
) -> Result<Json<Value>, ApiFailure> {
    caller.require_any(&[ApiAction::Read, ApiAction::Run])?;
    let id = run_id(&id)?;
    let wait = wait_param(params.wait.as_deref(), state.settings.edge.request_timeout)?;
    let run = runner(&state)?.wait(&id, wait).await.map_err(run_failure)?;
    Ok(Json(json!(run)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputParams {
    /// The byte offset to read from (the previous answer's `X-Next-Offset`).
    #[serde(default)]
    pub from: Option<u64>,
    /// `20s`: when there is nothing new yet, wait this long for more.
    #[serde(default)]
    pub wait: Option<String>,
}

/// The next chunk of a run's output from `from`, waiting up to `wait` for new bytes.
pub(super) async fn output_chunk(
    state: &AppState,
    caller: &Caller,
    id: &str,
    params: OutputParams,
) -> Result<OutputChunk, ApiFailure> {
    caller.require_any(&[ApiAction::Read, ApiAction::Run])?;
    let id = run_id(id)?;
    let wait = wait_param(params.wait.as_deref(), state.settings.edge.request_timeout)?;
    let runner = runner(state)?;
    let from = params.from.unwrap_or(0);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let chunk = runner.output(&id, from).await.map_err(run_failure)?;
        let now = tokio::time::Instant::now();
        if !chunk.bytes.is_empty() || chunk.finished || now >= deadline {
            return Ok(chunk);
        }
        tokio::time::sleep(OUTPUT_POLL.min(deadline - now)).await;
    }
}

/// `GET /api/v1/runs/{id}/output?from=N&wait=20s`: one chunk as `text/plain`.
pub async fn output(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<OutputParams>,
) -> Result<Response, ApiFailure> {
    let chunk = output_chunk(&state, &caller, &id, params).await?;
    let mut response = (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        chunk.bytes,
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert("x-next-offset", HeaderValue::from(chunk.next));
    headers.insert(
        "x-run-finished",
        HeaderValue::from_static(if chunk.finished { "true" } else { "false" }),
    );
    headers.insert(
        "x-output-truncated",
        HeaderValue::from_static(if chunk.truncated { "true" } else { "false" }),
    );
    Ok(response)
}
