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
use serde_json::{Value, json};

use super::{Backend, Failure, Op};

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

/// How long `run_code` waits for the run to end before returning it still running. Under the
/// API's request timeout, so one tool call over `/mcp` is one bounded request.
const RUN_CODE_WAIT: &str = "30s";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunFileArg {
    /// Where the file goes in the sandbox; relative paths are under the working directory.
    pub path: String,
    /// The file's text (or base64 when `base64` is true).
    pub content: String,
    #[serde(default)]
    pub base64: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunCodeArgs {
    /// The E2B template id or alias to start the sandbox from, e.g. `base`.
    pub template: String,
    /// A shell command line, run with bash, e.g. `python main.py`.
    pub command: String,
    /// Files to place in the sandbox before the command runs.
    #[serde(default)]
    pub files: Vec<RunFileArg>,
    /// The command's environment variables.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The working directory (absolute).
    #[serde(default)]
    pub cwd: Option<String>,
    /// How long the command may run, e.g. `90s` or `10m` (Steward's policy caps it).
    #[serde(default)]
    pub timeout: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct GetRunArgs {
    /// The run id `run_code` returned.
    pub run_id: String,
    /// Wait up to this many seconds (at most 30) for the run to end.
    #[serde(default)]
    pub wait_secs: Option<u32>,
    /// Return the output from this byte offset (the previous `next_offset`; default 0).
    #[serde(default)]
    pub output_from: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RequestKillArgs {
    /// The sandbox you want ended.
    pub sandbox_id: String,
    /// Why, in a sentence, for the person deciding.
    pub reason: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RequestDeleteTemplateArgs {
    /// The template you want deleted.
    pub template_id: String,
    /// Why, in a sentence, for the person deciding.
    pub reason: String,
}

/// The run request the API takes, from the tool's arguments (file contents go as base64).
fn run_request(args: RunCodeArgs) -> Value {
    use base64::Engine;
    let files: Vec<Value> = args
        .files
        .into_iter()
        .map(|f| {
            let content = if f.base64 {
                f.content
            } else {
                base64::engine::general_purpose::STANDARD.encode(f.content.as_bytes())
            };
            json!({ "path": f.path, "content": content })
        })
        .collect();
    let mut request = json!({
        "template": args.template,
        "command": args.command,
        "files": files,
        "env": args.env,
    });
    if let Some(cwd) = args.cwd {
        request["cwd"] = json!(cwd);
    }
    if let Some(timeout) = args.timeout {
        request["timeout"] = json!(timeout);
    }
    request
}

impl StewardTools {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    /// The run (after waiting up to `wait` for it to end) and its output from `from`.
    async fn follow_run(
        &self,
        ctx: &RequestContext<RoleServer>,
        run_id: String,
        wait: Option<String>,
        from: u64,
    ) -> Result<Value, Failure> {
        let run = self
            .backend
            .call(
                &ctx.extensions,
                Op::GetRun {
                    run_id: run_id.clone(),
                    wait,
                },
            )
            .await?;
        let output = self
            .backend
            .call(&ctx.extensions, Op::RunOutput { run_id, from })
            .await?;
        let ended = matches!(
            run["status"].as_str(),
            Some("finished" | "timed_out" | "failed")
        );
        let note = if ended {
            "The run has ended. Its sandbox is kept; a person (or Steward's policy) decides whether to snapshot or kill it."
        } else {
            "The run is still going: call get_run with this run_id, wait_secs and output_from = output_next_offset to follow it."
        };
        Ok(json!({
            "run": run,
            "output": output["output"],
            "output_next_offset": output["next_offset"],
            "output_truncated": output["truncated"],
            "note": note,
        }))
    }

    /// Runs `op` and words the answer as a tool result: the JSON on success, the API's sentence
    /// as a tool error otherwise.
    async fn answer(&self, ctx: &RequestContext<RoleServer>, op: Op) -> CallToolResult {
        reply(self.backend.call(&ctx.extensions, op).await)
    }
}

#[tool_router]
impl StewardTools {
    #[tool(
        description = "Run a shell command in a fresh E2B sandbox of `template`, with optional files, environment variables, working directory and timeout, within Steward's limits. Waits up to 30 s and returns the run (status, exit code, duration, resource profile) and its output; a longer run comes back still running, to follow with get_run. The sandbox is kept afterwards: a person (or Steward's policy) decides whether to snapshot or kill it, not you."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let submitted = self
            .backend
            .call(
                &ctx.extensions,
                Op::SubmitRun {
                    request: run_request(args),
                },
            )
            .await;
        let result = match submitted {
            Ok(run) => {
                let id = run["id"].as_str().unwrap_or_default().to_owned();
                self.follow_run(&ctx, id, Some(RUN_CODE_WAIT.into()), 0)
                    .await
            }
            Err(failure) => Err(failure),
        };
        Ok(reply(result))
    }

    #[tool(
        description = "Read a run started by run_code: its status and results, and its output from `output_from` (default 0). With `wait_secs` (at most 30), waits for the run to end first."
    )]
    async fn get_run(
        &self,
        Parameters(args): Parameters<GetRunArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let result = self
            .follow_run(
                &ctx,
                args.run_id,
                wait_of(args.wait_secs),
                args.output_from.unwrap_or(0),
            )
            .await;
        Ok(reply(result))
    }

    #[tool(
        description = "Ask for a sandbox to be killed. This does NOT kill it: it opens a case that a person decides in Slack (they may snapshot and kill, kill, pause or leave it). Returns the case; call get_decision with its id to learn what they decided."
    )]
    async fn request_kill(
        &self,
        Parameters(args): Parameters<RequestKillArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let body = json!({
            "action": "kill_sandbox",
            "sandbox_id": args.sandbox_id,
            "reason": args.reason,
        });
        Ok(self.answer(&ctx, Op::RequestCase { body }).await)
    }

    #[tool(
        description = "Ask for a template to be deleted. This does NOT delete it: it opens a case that a person decides in Slack. Returns the case; call get_decision with its id to learn what they decided."
    )]
    async fn request_delete_template(
        &self,
        Parameters(args): Parameters<RequestDeleteTemplateArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let body = json!({
            "action": "delete_template",
            "template_id": args.template_id,
            "reason": args.reason,
        });
        Ok(self.answer(&ctx, Op::RequestCase { body }).await)
    }

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

/// The JSON on success, the API's sentence as a tool error otherwise.
fn reply(result: Result<Value, Failure>) -> CallToolResult {
    match result {
        Ok(value) => CallToolResult::success(vec![ContentBlock::text(
            serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string()),
        )]),
        Err(failure) => CallToolResult::error(vec![ContentBlock::text(failure.to_string())]),
    }
}
