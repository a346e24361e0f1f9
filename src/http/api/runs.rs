//! Runs for agents: `POST /api/v1/runs` (202 with the queued run), `GET /api/v1/runs/{id}`
//! (`?wait=30s` long-polls until the run ends) and `GET /api/v1/runs/{id}/output?from=N`.
//! While a run waits for a worker, both answers also carry `queue_position` (1: next).
//!
//! The output route answers one chunk at a time as `text/plain`, with `X-Next-Offset` (ask
//! again from there), `X-Run-Finished` (`true` once the run ended and every kept byte was sent)
//! and `X-Output-Truncated`; with `&wait=20s` it holds the answer until there are new bytes or
//! the run ends, so a client follows the output as it streams without busy polling. The work
//! itself is `runs::Runner`'s; this file only checks, parses and words.
//!
//! A token reads only the runs it asked for (the run's `requester` is the token's name), or every
//! run with `read_all`; anybody else's run, a push test's (`github:<owner/name>`) included, is
//! answered exactly like a run that does not exist (404), so a token cannot learn that it does.
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
use crate::runs::{OutputChunk, Run, RunError, RunRequest, Runner};

/// The actions that let a token read runs (which runs: see [`Caller::sees`]).
const READ_RUNS: &[ApiAction] = &[ApiAction::Read, ApiAction::Run, ApiAction::ReadAll];

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
        RunError::NotFound(id) => not_found(&id),
        RunError::StoreUnavailable(_) => ApiFailure::store_unavailable(),
        RunError::Store(detail) => ApiFailure::failed("Reading or recording the run", &detail),
    }
}

/// What a run that does not exist, or is not the caller's to read, is answered with.
fn not_found(id: &RunId) -> ApiFailure {
    ApiFailure::not_found(format!("There is no run {id}"))
}

/// The run, when the caller may read it (its own, or any with `read_all`); a 404 otherwise.
async fn visible_run(runner: &Runner, caller: &Caller, id: &RunId) -> Result<Run, ApiFailure> {
    let run = runner.get(id).await.map_err(run_failure)?;
    if caller.sees(Some(&run.requester)) {
        Ok(run)
    } else {
        tracing::info!(token = %caller.name, run = %id, "a token asked for a run that is not its own");
        Err(not_found(id))
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
    let runner = runner(&state)?;
    let run = runner
        .submit(&caller.name, request)
        .await
        .map_err(run_failure)?;
    // The run is queued either way: a position Redis cannot give now is left out.
    let position = runner.queue_position(&run).await.ok().flatten();
    let mut shown = json!(run);
    if let Some(position) = position {
        shown["queue_position"] = json!(position);
    }
    Ok((StatusCode::ACCEPTED, Json(shown)))
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
    caller.require_any(READ_RUNS)?;
    let id = run_id(&id)?;
    let wait = wait_param(params.wait.as_deref(), state.settings.edge.request_timeout)?;
    let runner = runner(&state)?;
    let run = visible_run(runner, &caller, &id).await?;
    if run.status.is_terminal() || wait.is_zero() {
        return Ok(Json(with_queue_position(runner, run).await?));
    }
    // The requester never changes, so the check above holds for the run as it ends.
    let run = runner.wait(&id, wait).await.map_err(run_failure)?;
    Ok(Json(with_queue_position(runner, run).await?))
}

/// The run as the API shows it: a queued run also says where it waits for a worker
/// (`queue_position`: 1 when it is next), while it waits.
async fn with_queue_position(runner: &Runner, run: Run) -> Result<Value, ApiFailure> {
    let position = runner.queue_position(&run).await.map_err(run_failure)?;
    let mut shown = json!(run);
    if let Some(position) = position {
        shown["queue_position"] = json!(position);
    }
    Ok(shown)
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
    caller.require_any(READ_RUNS)?;
    let id = run_id(id)?;
    let wait = wait_param(params.wait.as_deref(), state.settings.edge.request_timeout)?;
    let runner = runner(state)?;
    visible_run(runner, caller, &id).await?;
    let from = params.from.unwrap_or(0);
    runner
        .output_wait(&id, from, wait)
        .await
        .map_err(run_failure)
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
