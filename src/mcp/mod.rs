//! Steward as an MCP server (rmcp): the tools an agent sees, over stdio (`steward mcp`) and over
//! streamable HTTP (`/mcp`).
//!
//! The tools ([`tools::StewardTools`]) do no work themselves: each turns its arguments into one
//! [`Op`] and hands it to a [`Backend`]. Over HTTP the backend is the API's own code in this
//! process (`http::api::mcp`), reached with the caller the bearer token named; over stdio it is
//! [`client::ApiClient`], a thin client of the HTTP API with the agent's token. Either way, one
//! code path (the API's) authenticates, checks the allow list and the rate, and enforces policy.
//! This module must not import `http`, `approvals`, `store` or `runs`' engine: it knows the API
//! only as operations and JSON.
use futures::future::BoxFuture;
use serde_json::Value;

pub mod client;
pub mod tools;

/// One thing an agent asks Steward, whatever the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `running`, `paused` or `all`; a template id to filter by.
    ListSandboxes {
        state: Option<String>,
        template: Option<String>,
    },
    GetSandbox {
        sandbox_id: String,
    },
    SandboxLogs {
        sandbox_id: String,
        limit: Option<u32>,
        level: Option<String>,
        search: Option<String>,
    },
    SandboxMetrics {
        sandbox_id: String,
        since: Option<String>,
    },
    /// `wait` like `30s`: until the case moves, at most that long.
    GetCase {
        case_id: String,
        wait: Option<String>,
    },
}

impl Op {
    /// The API request this operation is: method, path and query, and the JSON body.
    pub fn request(
        &self,
    ) -> (
        reqwest::Method,
        String,
        Vec<(&'static str, String)>,
        Option<Value>,
    ) {
        use reqwest::Method;
        let mut query = Vec::new();
        let mut push = |name: &'static str, value: Option<String>| {
            if let Some(value) = value {
                query.push((name, value));
            }
        };
        let path = match self {
            Op::ListSandboxes { state, template } => {
                push("state", state.clone());
                push("template", template.clone());
                "/sandboxes".to_owned()
            }
            Op::GetSandbox { sandbox_id } => format!("/sandboxes/{}", segment(sandbox_id)),
            Op::SandboxLogs {
                sandbox_id,
                limit,
                level,
                search,
            } => {
                push("limit", limit.map(|l| l.to_string()));
                push("level", level.clone());
                push("search", search.clone());
                format!("/sandboxes/{}/logs", segment(sandbox_id))
            }
            Op::SandboxMetrics { sandbox_id, since } => {
                push("since", since.clone());
                format!("/sandboxes/{}/metrics", segment(sandbox_id))
            }
            Op::GetCase { case_id, wait } => {
                push("wait", wait.clone());
                format!("/cases/{}", segment(case_id))
            }
        };
        (Method::GET, path, query, None)
    }
}

/// `text` as one path segment.
fn segment(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// An operation Steward refused or could not do: the API's status, code and sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub field: Option<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} (field `{field}`)", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Where the tools' operations are carried out.
pub trait Backend: Send + Sync + 'static {
    /// Does `op` for the caller of this MCP request; `request` carries what the transport knows
    /// about that request (over HTTP, the authenticated caller).
    fn call(
        &self,
        request: &rmcp::model::Extensions,
        op: Op,
    ) -> BoxFuture<'static, Result<Value, Failure>>;
}
