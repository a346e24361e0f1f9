//! The MCP tools: names, descriptions, argument schemas. Each tool is one [`Op`] handed to the
//! [`Backend`]; a refusal comes back as a tool error whose text is the API's sentence, so the
//! agent reads why and what to fix.
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;

use super::{Backend, Op};

/// What the server tells the agent when it connects.
const INSTRUCTIONS: &str = "Steward governs an E2B sandbox fleet. You may read the fleet freely. \
Destructive actions (killing a sandbox, deleting a template) are never done by you: the request_* \
tools open a case that a person decides in Slack, and get_decision tells you what they decided.";

/// The tools, over any [`Backend`].
#[derive(Clone)]
pub struct StewardTools {
    backend: Arc<dyn Backend>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for StewardTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StewardTools").finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ListSandboxesArgs {
    /// `running`, `paused` or `all` (default).
    #[serde(default)]
    pub state: Option<String>,
    /// Only sandboxes of this template id or alias.
    #[serde(default)]
    pub template: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxArgs {
    /// The sandbox id, e.g. `i1a2b3c4d5e6f7g8h9`.
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxLogsArgs {
    pub sandbox_id: String,
    /// Most recent lines to return (1 to 1000; default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Minimum level: debug, info, warn or error.
    #[serde(default)]
    pub level: Option<String>,
    /// Only lines containing this text (case-sensitive).
    #[serde(default)]
    pub search: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxMetricsArgs {
    pub sandbox_id: String,
    /// How far back, e.g. `10m` or `2h` (default: the sandbox's whole life).
    #[serde(default)]
    pub since: Option<String>,
}

/// The most a tool's `wait_secs` may ask for (the server caps it below its timeout too).
const MAX_WAIT_SECS: u32 = 30;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct GetDecisionArgs {
    /// The case id a request_* tool returned.
    pub case_id: String,
    /// Wait up to this many seconds (at most 30) for the case to move on.
    #[serde(default)]
    pub wait_secs: Option<u32>,
}

fn wait_of(secs: Option<u32>) -> Option<String> {
    secs.filter(|s| *s > 0)
        .map(|s| format!("{}s", s.min(MAX_WAIT_SECS)))
}

impl StewardTools {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    /// Runs `op` and words the answer as a tool result: the JSON on success, the API's sentence
    /// as a tool error otherwise.
    async fn answer(&self, ctx: &RequestContext<RoleServer>, op: Op) -> CallToolResult {
        match self.backend.call(&ctx.extensions, op).await {
            Ok(value) => CallToolResult::success(vec![ContentBlock::text(
                serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string()),
            )]),
            Err(failure) => CallToolResult::error(vec![ContentBlock::text(failure.to_string())]),
        }
    }
}

#[tool_router]
impl StewardTools {
    #[tool(
        description = "List the sandboxes in the E2B fleet (read-only): id, template, state, start and end time, metadata."
    )]
    async fn list_sandboxes(
        &self,
        Parameters(args): Parameters<ListSandboxesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let op = Op::ListSandboxes {
            state: args.state,
            template: args.template,
        };
        Ok(self.answer(&ctx, op).await)
    }

    #[tool(
        description = "Show one sandbox (read-only): state, template, resources, timeout, metadata."
    )]
    async fn get_sandbox(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let op = Op::GetSandbox {
            sandbox_id: args.sandbox_id,
        };
        Ok(self.answer(&ctx, op).await)
    }

    #[tool(description = "Read a sandbox's most recent log lines (read-only).")]
    async fn sandbox_logs(
        &self,
        Parameters(args): Parameters<SandboxLogsArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let op = Op::SandboxLogs {
            sandbox_id: args.sandbox_id,
            limit: args.limit,
            level: args.level,
            search: args.search,
        };
        Ok(self.answer(&ctx, op).await)
    }

    #[tool(
        description = "Read a sandbox's CPU, memory and disk samples (read-only), optionally only the last `since` (e.g. 10m)."
    )]
    async fn sandbox_metrics(
        &self,
        Parameters(args): Parameters<SandboxMetricsArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let op = Op::SandboxMetrics {
            sandbox_id: args.sandbox_id,
            since: args.since,
        };
        Ok(self.answer(&ctx, op).await)
    }
    #[tool(
        description = "Read a case opened by request_kill or request_delete_template: its state, the person's decision (option, by, at, reason) once made, and the result once carried out. With `wait_secs` (at most 30), waits for the case to move on first."
    )]
    async fn get_decision(
        &self,
        Parameters(args): Parameters<GetDecisionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let op = Op::GetCase {
            case_id: args.case_id,
            wait: wait_of(args.wait_secs),
        };
        Ok(self.answer(&ctx, op).await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for StewardTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("steward", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
