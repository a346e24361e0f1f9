//! `steward mcp`: the MCP server on stdin/stdout for a local agent.
//!
//! It is a thin client of a running Steward's HTTP API (`STEWARD_URL`, `STEWARD_API_TOKEN`), so
//! the server enforces the token's allow list, its rate and every policy; nothing is decided
//! here. Stdout carries only the protocol; logs go to stderr.
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use rmcp::ServiceExt;

use crate::mcp::client::ApiClient;
use crate::mcp::tools::StewardTools;

pub async fn run() -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_env().map_err(|e| anyhow::anyhow!(super::sentence(&e)))?;
    let server = StewardTools::new(Arc::new(client))
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client on stdin did not start a session")?;
    server.waiting().await.context("the MCP session failed")?;
    Ok(ExitCode::SUCCESS)
}
