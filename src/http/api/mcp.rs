//! The `/mcp` endpoint: rmcp's streamable HTTP server over the same tools as `steward mcp`,
//! carried out by the API's own handlers in this process for the caller the bearer token named.
//!
//! The endpoint is stateless (no MCP sessions to keep or share between replicas) and answers
//! with JSON. It sits behind the same [`authenticate`](super::auth::authenticate) middleware as
//! `/api/v1`, so a tool call is refused (or admitted) exactly as the API request it stands for;
//! a token that no tool would serve ([`ACTIONS`]) is refused before its body is read.
use std::sync::Arc;

use axum::extract::State;
use futures::future::BoxFuture;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;

use super::cases::{self, WaitParams};
use super::sandboxes::{self, ListParams, LogParams, MetricParams};
use super::{ApiFailure, ApiJson, ApiPath, ApiQuery, Caller, MAX_BODY_BYTES, runs};
use crate::config::ApiAction;
use crate::http::AppState;
use crate::mcp::tools::StewardTools;
use crate::mcp::{Backend, Failure, Op};

/// The actions some MCP tool needs: a token with none of them (one that may only report test
/// failures) is refused at `/mcp` before its body is read.
pub const ACTIONS: &[ApiAction] = &[
    ApiAction::Run,
    ApiAction::Read,
    ApiAction::ReadAll,
    ApiAction::RequestKill,
    ApiAction::RequestDeleteTemplate,
];

/// The tools' backend inside `steward serve`.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    state: AppState,
}

impl LocalBackend {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

impl Backend for LocalBackend {
    fn call(
        &self,
        request: &rmcp::model::Extensions,
        op: Op,
    ) -> BoxFuture<'static, Result<Value, Failure>> {
        let caller = request
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>().cloned());
        let state = self.state.clone();
        Box::pin(async move {
            let caller = caller
                .ok_or_else(|| ApiFailure::unauthorized("This route needs a bearer token"))
                .map_err(failure)?;
            carry_out(state, caller, op).await.map_err(failure)
        })
    }
}

/// `op` through the API's handlers, so the MCP tool and the API route share every check.
async fn carry_out(state: AppState, caller: Caller, op: Op) -> Result<Value, ApiFailure> {
    let json = match op {
        Op::ListSandboxes { state: s, template } => {
            sandboxes::list(
                State(state),
                caller,
                ApiQuery(ListParams { state: s, template }),
            )
            .await?
        }
        Op::GetSandbox { sandbox_id } => {
            sandboxes::get(State(state), caller, ApiPath(sandbox_id)).await?
        }
        Op::SandboxLogs {
            sandbox_id,
            limit,
            level,
            search,
        } => {
            sandboxes::logs(
                State(state),
                caller,
                ApiPath(sandbox_id),
                ApiQuery(LogParams {
                    limit,
                    level,
                    search,
                }),
            )
            .await?
        }
        Op::SandboxMetrics { sandbox_id, since } => {
            sandboxes::metrics(
                State(state),
                caller,
                ApiPath(sandbox_id),
                ApiQuery(MetricParams { since }),
            )
            .await?
        }
        Op::GetCase { case_id, wait } => {
            cases::get(
                State(state),
                caller,
                ApiPath(case_id),
                ApiQuery(WaitParams { wait }),
            )
            .await?
        }
        Op::SubmitRun { request } => {
            let request = serde_json::from_value(request).map_err(|e| {
                ApiFailure::invalid("request", format!("The run request does not fit: {e}"))
            })?;
            runs::submit(State(state), caller, ApiJson(request))
                .await?
                .1
        }
        Op::GetRun { run_id, wait } => {
            runs::get(
                State(state),
                caller,
                ApiPath(run_id),
                ApiQuery(runs::RunParams { wait }),
            )
            .await?
        }
        Op::RunOutput { run_id, from } => {
            let params = runs::OutputParams {
                from: Some(from),
                wait: None,
            };
            let chunk = runs::output_chunk(&state, &caller, &run_id, params).await?;
            return Ok(crate::mcp::output_json(
                &chunk.bytes,
                chunk.next,
                chunk.finished,
                chunk.truncated,
            ));
        }
        Op::RequestCase { body } => {
            let ask = serde_json::from_value(body).map_err(|e| {
                ApiFailure::invalid("request", format!("The case request does not fit: {e}"))
            })?;
            cases::ask(State(state), caller, ApiJson(ask)).await?.1
        }
    };
    Ok(json.0)
}

fn failure(f: ApiFailure) -> Failure {
    Failure {
        status: f.status.as_u16(),
        code: f.code.to_owned(),
        message: f.message,
        field: f.field,
    }
}

/// The `/mcp` service: stateless, JSON answers, bodies capped like the API's.
pub fn service(state: &AppState) -> StreamableHttpService<StewardTools, NeverSessionManager> {
    let backend: Arc<dyn Backend> = Arc::new(LocalBackend::new(state.clone()));
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        // Steward runs behind its own host name; every request must carry a bearer token,
        // which a DNS-rebinding page cannot add, so the Host check adds nothing here.
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(StewardTools::new(backend.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}
