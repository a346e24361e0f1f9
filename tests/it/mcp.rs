//! The MCP server through rmcp's own client: over streamable HTTP at `/mcp` (same tokens, same
//! allow lists as the API) and over stdio (`steward mcp`, a client of the HTTP API).
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::api::{AGENT_TOKEN, AUDITOR_TOKEN, RUNNER_TOKEN, spawn_api_app};
use crate::common::TestApp;

/// Every tool an agent should see.
const SANDBOX_TOOLS: &[&str] = &[
    "run_code",
    "get_run",
    "list_sandboxes",
    "get_sandbox",
    "sandbox_logs",
    "sandbox_metrics",
    "request_kill",
    "request_delete_template",
    "get_decision",
];

pub async fn http_client(app: &TestApp, token: &str) -> RunningService<RoleClient, ClientConfig> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(app.url("/mcp")).auth_header(token),
    );
    ClientConfig::default()
        .serve(transport)
        .await
        .expect("the MCP client connects")
}

pub async fn call(
    client: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .expect("the tool call is answered")
}

pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn tool_names(client: &RunningService<RoleClient, ClientConfig>) -> Vec<String> {
    client
        .list_all_tools()
        .await
        .expect("tools are listed")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

#[tokio::test]
async fn the_http_endpoint_lists_the_tools_and_lists_sandboxes_for_a_token() {
    let app = spawn_api_app().await;
    let client = http_client(&app, AGENT_TOKEN).await;
    let names = tool_names(&client).await;
    for tool in SANDBOX_TOOLS {
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} missing from {names:?}"
        );
    }
    let result = call(&client, "list_sandboxes", json!({"state": "all"})).await;
    assert_ne!(result.is_error, Some(true), "{}", text_of(&result));
    let listing: Value = serde_json::from_str(&text_of(&result)).unwrap();
    assert_eq!(listing["sandboxes"].as_array().unwrap().len(), 5);
    let missing = call(&client, "get_sandbox", json!({"sandbox_id": "nosuchbox"})).await;
    assert_eq!(missing.is_error, Some(true));
    assert!(
        text_of(&missing).contains("nosuchbox was not found"),
        "{}",
        text_of(&missing)
    );
    client.cancel().await.ok();
}

#[tokio::test]
async fn the_http_endpoint_applies_the_tokens_allow_list_and_refuses_a_stranger() {
    let app = spawn_api_app().await;
    let client = http_client(&app, RUNNER_TOKEN).await;
    let refused = call(&client, "list_sandboxes", json!({})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("`read`"),
        "{}",
        text_of(&refused)
    );
    client.cancel().await.ok();
    assert_eq!(app.e2b.hooks().calls_of("list").await.unwrap(), 0);

    let stranger = app
        .http
        .post(app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), 401);
    let body: Value = stranger.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
}

/// `steward mcp` spawned as an agent would, pointed at `app` with `token`.
pub async fn stdio_client(app: &TestApp, token: &str) -> RunningService<RoleClient, ClientConfig> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_steward"));
    command
        .arg("mcp")
        .env("STEWARD_URL", &app.address)
        .env("STEWARD_API_TOKEN", token)
        .env("RUST_LOG", "error");
    let transport = rmcp::transport::TokioChildProcess::builder(command)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("steward mcp starts")
        .0;
    ClientConfig::default()
        .serve(transport)
        .await
        .expect("the MCP client connects over stdio")
}

#[tokio::test]
async fn steward_mcp_over_stdio_lists_the_tools_and_reads_the_fleet_through_the_api() {
    let app = spawn_api_app().await;
    let client = stdio_client(&app, AGENT_TOKEN).await;
    let names = tool_names(&client).await;
    assert_eq!(names.len(), SANDBOX_TOOLS.len(), "{names:?}");
    for tool in SANDBOX_TOOLS {
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} missing from {names:?}"
        );
    }
    let result = call(&client, "list_sandboxes", json!({})).await;
    assert_ne!(result.is_error, Some(true), "{}", text_of(&result));
    let listing: Value = serde_json::from_str(&text_of(&result)).unwrap();
    assert_eq!(listing["sandboxes"].as_array().unwrap().len(), 5);
    client.cancel().await.ok();

    // The server, not the stdio process, enforces the allow list.
    let runner = stdio_client(&app, RUNNER_TOKEN).await;
    let refused = call(&runner, "sandbox_logs", json!({"sandbox_id": "x"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("`read`"),
        "{}",
        text_of(&refused)
    );
    runner.cancel().await.ok();
    assert_eq!(app.e2b.hooks().calls_of("logs").await.unwrap(), 0);
}

#[tokio::test]
async fn get_decision_reads_a_case_and_names_the_person_who_decided() {
    let app = spawn_api_app().await;
    app.seed_sandbox(json!({"sandboxID": "mcpcase1", "templateID": "base", "state": "running"}))
        .await;
    let case = crate::api_cases::person_opens_kill_case(&app, "mcpcase1").await;
    // A person opened it: an agent's token without `read_all` is told it does not exist.
    let agent = http_client(&app, AGENT_TOKEN).await;
    let hidden = call(&agent, "get_decision", json!({"case_id": case})).await;
    assert_eq!(hidden.is_error, Some(true));
    assert!(
        text_of(&hidden).contains("was not found"),
        "{}",
        text_of(&hidden)
    );
    agent.cancel().await.ok();
    let client = http_client(&app, AUDITOR_TOKEN).await;
    let pending = call(&client, "get_decision", json!({"case_id": case})).await;
    let body: Value = serde_json::from_str(&text_of(&pending)).unwrap();
    assert_eq!(body["state"], "pending", "{body}");
    crate::api_cases::person_kills(&app, &case).await;
    let decided = call(
        &client,
        "get_decision",
        json!({"case_id": case, "wait_secs": 30}),
    )
    .await;
    let body: Value = serde_json::from_str(&text_of(&decided)).unwrap();
    assert_eq!(body["decision"]["option"], "kill", "{body}");
    assert_eq!(body["decision"]["by"], "U0002");
    client.cancel().await.ok();
}
